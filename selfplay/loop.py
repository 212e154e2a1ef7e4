"""The self-play training loop over the env: the single controller of a run.

One step = one env round::

    reset -> teachers generate (one batched call, adapters mixed) -> env.step (validate in the sandbox,
    PFSP matching) -> students generate -> env.step (verify, rewards, rating update)
    -> rollouts per member (joined by completion id) -> one update per member -> PBT evolution

The loop knows agents only through an :class:`~selfplay.mapping.AgentMapping` (which adapter acts for which
agent); whether that is a population or a single-agent baseline is the caller's choice. It talks to its parts
through their interfaces — the generator (``generate``, ``refresh``), the trainer (``update``), the population
(state, save/load), the env (PettingZoo) and the PBT controller — so another backend can fill them.

The loop only plays steps. Checkpoints and resume are :mod:`selfplay.resume`'s (it saves and restores the
loop's parts and continues it with :meth:`SelfPlayLoop.continue_after`); sampling seeds are derived from (seed,
step, phase, agent, index), so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.generation import Completion, GenerationRequest
from agents.generation.limit import dropped
from agents.generation.threads import generation_threads
from evolution.pbt import round_stats
from populora_env.results import CompletionText, RoundOutcome
from selfplay.config import TrainConfig
from selfplay.finite import NonFiniteGuard, check_rewards
from selfplay.mapping import AgentMapping
from selfplay.members import model_device
from selfplay.parts import build_parts
from selfplay.phase_memory import PhaseMemory
from selfplay.rollouts import CompletionId, rollouts_from_round
from selfplay.rundir import LINEAGE
from selfplay.scripted import ScriptedOpponents
from selfplay.seeding import SeedingReport, seed_before_training

log = logging.getLogger(__name__)


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed derived deterministically from ``parts`` (ints or strings)."""
    ints = [p if isinstance(p, int) else int.from_bytes(str(p).encode()[:16].ljust(16, b"\0"), "little")
            for p in parts]
    return int(np.random.SeedSequence(ints).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass
class PlayedRound:
    """One env round as the loop played it: what its updates and its logs read.

    Attributes:
        step: the training step the round belongs to (1-based).
        outcome: the env's finished round.
        completions: the generated completions by id ``(agent, index)``.
        prompts: the observation each completion answered, by the same id.
        times: seconds spent generating (``generation``) and in the sandbox (``sandbox``).
        dropped_prompts: role -> prompts the prompt-length rule dropped (:meth:`SelfPlayLoop._dropped`).
    """

    step: int
    outcome: RoundOutcome
    completions: dict[CompletionId, Completion]
    prompts: dict[CompletionId, str]
    times: dict[str, float]
    dropped_prompts: dict[str, int] = field(default_factory=dict)


@dataclass
class StepRecord:
    """Everything one training step produced, typed (what the run and its logger read).

    Attributes:
        step: the training step just finished (1-based).
        outcome: the env's finished round (records, rewards, ratings, summary).
        completions: the generated completions by id ``(agent, index)``.
        prompts: the observation each completion answered, by the same id.
        mapping: the agent -> member mapping.
        member_metrics: the trainer's metrics of every updated member.
        evolution: the PBT step's lineage records (empty when nothing was replaced).
        times: seconds per phase (``generation``, ``sandbox``, ``update``, ``evolution``, ``step``; the run adds
            ``checkpoint``).
        pipeline: an asynchronous run's per-step counters (:mod:`selfplay.pipeline`; empty in the synchronous
            loop), logged as ``pipeline/<key>``.
        dropped_prompts: role -> prompts the prompt-length rule dropped before generation this step (every role,
            0 included, when ``generation.max_prompt_tokens`` is set; empty otherwise).
        memory: peak GPU bytes per phase (``generation``, ``update``, ``evolution``; the run adds
            ``checkpoint``; :class:`~selfplay.phase_memory.PhaseMemory`); empty off CUDA and in an asynchronous
            run, whose phases overlap.
    """

    step: int
    outcome: RoundOutcome
    completions: dict[CompletionId, Completion]
    prompts: dict[CompletionId, str]
    mapping: AgentMapping
    member_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    evolution: list[dict] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    pipeline: dict[str, float] = field(default_factory=dict)
    dropped_prompts: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)


class SelfPlayLoop:
    """Compose env, population, generator, trainer and PBT, and play rounds.

    Args:
        cfg: the run configuration (its ``env`` section builds the env as is).
        assignment: env agent -> adapter name; ``None`` = one adapter per env agent (a population).
        run_dir: where the lineage and the seeding record are written.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, assignment: Mapping[str, str] | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.assignment = None if assignment is None else dict(assignment)
        self.nonfinite = NonFiniteGuard(cfg.trainer.max_nonfinite_updates)
        self.memory = PhaseMemory("cpu")  # counts nothing; setup() gives it the run's device
        #: The scripted agents (``cfg.scripted``; :mod:`selfplay.scripted`), ``None`` when there are none.
        self.scripted: ScriptedOpponents | None = None

    # ------------------------------------------------------------------------------------- set-up
    @property
    def device(self) -> str:
        """The torch device this process's model runs on (``cfg.device``; ``auto``: CUDA if available)."""
        return model_device(self.cfg)

    def setup(self) -> None:
        """Build every part (the slow part: model loading) with :func:`selfplay.parts.build_parts`: locally its
        :func:`selfplay.members.build_members`, the builder the Ray actors call too."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        parts = build_parts(self.cfg, self.run_dir, self.assignment, self.run_dir / LINEAGE)
        self.env, self.mapping, self.pbt = parts.env, parts.mapping, parts.pbt
        self.population, self.generator, self.trainer = parts.population, parts.generator, parts.trainer
        if self.pbt is not None and hasattr(self.trainer, "lr_scale"):
            self.trainer.lr_scale = self.pbt.lr_scale  # the children's explored learning rates (pbt.lr_explore)
        self.tokenizer, self.backend = parts.tokenizer, parts.backend
        if self.cfg.scripted.active:
            tokenizer = self.tokenizer
            self.scripted = ScriptedOpponents(
                self.cfg.scripted, self.env.teachers, self.env.students,
                seed_of=lambda step, phase, agent: derive_seed(self.cfg.seed, step, "scripted", phase, agent),
                tokenize=lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        self.memory = PhaseMemory(self.device if self.backend is None else "cpu")  # local CUDA runs only
        self.step = 0
        self._seeded = False
        self.seeding: SeedingReport | None = None  # the base model's seeding stage (env.seed_tasks), if any

    def continue_after(self, step: int) -> None:
        """Continue a run after step ``step``, whose state (population, env, PBT) was just loaded
        (:func:`selfplay.resume.load_checkpoint`): no seeding stage, no seeded reset, the generator re-reads
        every adapter."""
        self.step = step
        self._seeded = True
        self.generator.refresh(self.population.names)

    def close(self) -> None:
        """Release what the run holds besides its files (the env's sandbox; an asynchronous run's worker and
        engine)."""
        self.env.close()

    # ---------------------------------------------------------------------- checkpoint contents
    def env_state(self) -> dict:
        """The env's state at the last step boundary: what a checkpoint of this step holds."""
        return self.env.state_dict()

    def save_extra(self, directory: Path) -> None:
        """Write what a checkpoint holds besides the parts' states into ``directory`` (nothing in the synchronous
        loop; an asynchronous run's adapter versions)."""

    def load_extra(self, directory: Path) -> None:
        """Read back what :meth:`save_extra` wrote (after the parts' states were restored)."""

    # ------------------------------------------------------------------------------- generation
    def _generation_threads(self):
        """The torch threads of this process while it generates (``generation.threads``)."""
        return generation_threads(self.cfg.generation.threads, self.device)

    def _generate(self, obs: Mapping[str, Mapping[str, Any]], infos: Mapping[str, dict], phase: str,
                  step_index: int | None = None, versions: Mapping[str, int] | None = None
                  ) -> tuple[dict[CompletionId, Completion], dict[CompletionId, str], float]:
        """One batched generate call over every active agent's prompts (adapters mixed).

        ``step_index``: the 0-based index of the step the round belongs to (sampling seeds derive from it;
        ``None``: the loop's ``step``, the round of the next step);
        ``versions``: the adapter version each member generates with (an asynchronous run), else ``None``.
        Returns the completions and their prompts keyed by ``(agent, index in the agent's observation)``, and
        the seconds spent generating.
        """
        g = self.cfg.generation
        step_index = self.step if step_index is None else step_index
        max_new = g.teacher_max_new_tokens if phase == "propose" else g.student_max_new_tokens
        requests: list[GenerationRequest] = []
        first_index: list[tuple[str, int]] = []  # (agent, observation index of sample 0) per request
        prompts: dict[CompletionId, str] = {}
        for agent in sorted(obs):
            agent_prompts = list(obs[agent]["prompts"])
            if not agent_prompts or not infos.get(agent, {}).get("active", True):
                continue
            if self.scripted is not None and agent in self.scripted.agents:  # its policy answers, not its adapter
                prompts.update(((agent, k), p) for k, p in enumerate(agent_prompts))
                continue
            # how the env wants each prompt generated: chat template or not, response prefix, stop strings
            specs = [_generation_spec(r) for r in infos.get(agent, {}).get("requests", [])]
            specs += [_generation_spec({})] * (len(agent_prompts) - len(specs))
            i = 0
            while i < len(agent_prompts):  # consecutive identical prompts = n samples of one request
                j = i
                while (j + 1 < len(agent_prompts) and agent_prompts[j + 1] == agent_prompts[i]
                       and specs[j + 1] == specs[i]):
                    j += 1
                chat, prefix, stop = specs[i]
                member = self.mapping.agent_to_member[agent]
                requests.append(GenerationRequest(
                    adapter=member, prompt=agent_prompts[i], max_new_tokens=max_new,
                    temperature=g.temperature, top_p=g.top_p, n=j - i + 1,
                    seed=derive_seed(self.cfg.seed, step_index, phase, agent, i),
                    chat=chat, prefix=prefix, stop=stop, version=None if versions is None else versions[member]))
                first_index.append((agent, i))
                for k in range(i, j + 1):
                    prompts[(agent, k)] = agent_prompts[i]
                i = j + 1
        completions: dict[CompletionId, Completion] = {} if self.scripted is None else \
            self.scripted.completions(self.env, obs, infos, step_index, phase)
        if not requests:
            return completions, prompts, 0.0
        t0 = time.perf_counter()
        with self._generation_threads(), self.memory.phase("generation"):
            generated = self.generator.generate(requests)
        seconds = time.perf_counter() - t0
        for c in generated:
            agent, start = first_index[c.request_index]
            if not 0 <= c.sample_index < requests[c.request_index].n:
                raise RuntimeError(f"generator returned sample {c.sample_index} for a request of "
                                   f"{requests[c.request_index].n}")
            completions[(agent, start + c.sample_index)] = c
        missing = sorted(set(prompts) - set(completions))
        if missing:
            raise RuntimeError(f"generator returned no completion for {missing[:5]}")
        return completions, prompts, seconds

    def _dropped(self, completions: Mapping[CompletionId, Completion], step: int) -> dict[str, int]:
        """Role -> completions of step ``step``'s round that stand for prompts over
        ``generation.max_prompt_tokens`` (never generated; ``agents.generation.limit``), with one log line when
        there are any; empty without a limit."""
        limit = self.cfg.generation.max_prompt_tokens
        if limit is None:
            return {}
        roles = self.mapping.agent_roles
        counts = Counter(roles.get(agent, "?") for (agent, _), c in completions.items() if dropped(c))
        out = {role: counts.get(role, 0) for role in sorted(set(roles.values()) | set(counts))}
        if counts:
            log.warning("step %d: dropped %s prompt(s) longer than %d tokens before generation (scored as format "
                        "errors, not trained on)", step,
                        " and ".join(f"{n} {role}" for role, n in out.items()), limit)
        return out

    @staticmethod
    def _actions(completions: Mapping[CompletionId, Completion], agents: Sequence[str]
                 ) -> dict[str, tuple[str | None, ...]]:
        """Each agent's completion texts in observation order (the env's action format), each a
        :class:`~populora_env.results.CompletionText` carrying its generated token count (what reward schemes
        read as ``num_tokens``); ``None`` for a prompt the length rule dropped: the env scores a non-string as a
        format error whatever the prompt set (an empty text can parse under a pre-filled answer opening)."""
        by_agent: dict[str, dict[int, str | None]] = defaultdict(dict)
        for (agent, index), c in completions.items():
            by_agent[agent][index] = None if dropped(c) else CompletionText(c.text, len(c.token_ids))
        return {a: tuple(by_agent[a][k] for k in sorted(by_agent[a])) for a in agents}

    # ------------------------------------------------------------------------------------ a step
    def play_round(self, step: int, versions: Mapping[str, int] | None = None) -> PlayedRound:
        """Play the round of training step ``step``: reset (seeded on the run's first), teachers generate, the
        env validates and matches, students generate, the env checks and rewards. ``versions``: the adapter
        version each member generates with (an asynchronous run)."""
        env = self.env
        if not self._seeded:
            obs, infos = env.reset(seed=self.cfg.seed)
            self._seeded = True
        else:
            obs, infos = env.reset()
        completions, prompts, gen_s = self._generate(obs, infos, "propose", step - 1, versions)
        t0 = time.perf_counter()
        obs, _r, _te, _tr, infos = env.step(self._actions(completions, env.agents))
        sandbox_s = time.perf_counter() - t0
        solved, solve_prompts, gen2_s = self._generate(obs, infos, "solve", step - 1, versions)
        t0 = time.perf_counter()
        env.step(self._actions(solved, env.agents))
        sandbox_s += time.perf_counter() - t0
        outcome = env.last_outcome
        if outcome is None:
            raise RuntimeError("the env finished a round without an outcome")
        completions.update(solved)
        prompts.update(solve_prompts)
        return PlayedRound(step, outcome, completions, prompts, {"generation": gen_s + gen2_s, "sandbox": sandbox_s},
                           self._dropped(completions, step))

    def _seed_once(self) -> None:
        """A fresh run's seeding stage: the base model fills the buffers first, once (``env.seed_tasks``)."""
        if self.step == 0 and not self._seeded:
            self.seeding = seed_before_training(self.cfg, self.run_dir, self.env, self.generator, self.device)

    def _evolve(self, step: int, outcome: RoundOutcome, reset_rating: Callable[[str], None]) -> list[dict]:
        """The PBT step after step ``step`` (ratings: ``outcome``'s); returns its lineage records."""
        if self.pbt is None:
            return []
        member_ratings = {m: outcome.ratings[self.mapping.agents_of(m)[0]] for m in self.mapping.members}
        agents_of = {m: self.mapping.agents_of(m) for m in self.mapping.members}
        self.pbt.observe(step, round_stats(step, outcome.results.matches, outcome.rewards, agents_of))
        with self.memory.phase("evolution"):
            return self.pbt.maybe_evolve(step, self.mapping.roles, self.population, member_ratings, reset_rating)

    def train_step(self) -> StepRecord:
        """Play one round, update every member and run the PBT step."""
        self._seed_once()
        t_step = time.perf_counter()
        played = self.play_round(self.step + 1)
        outcome = played.outcome

        t0 = time.perf_counter()
        batches = rollouts_from_round(outcome, played.completions, self.mapping)
        check_rewards(batches, self.cfg.env.reward_scheme)  # real and finite in float32, else RewardSchemeError
        if self.scripted is not None:  # the scripted agents' completions are played, never trained on
            batches = self.scripted.learners_only(batches)
        with self.memory.phase("update"):
            member_metrics = self.trainer.update_many({m: batches[m] for m in self.mapping.members if batches.get(m)})
        self.nonfinite.observe(self.step + 1, member_metrics)  # NonFiniteTraining before this step's checkpoint
        self.generator.refresh(list(member_metrics))
        update_s = time.perf_counter() - t0

        self.step += 1
        t0 = time.perf_counter()
        events = self._evolve(self.step, outcome,
                              lambda m: [self.env.reset_rating(a) for a in self.mapping.agents_of(m)])
        if events:
            self.generator.refresh([e["culled"] for e in events])
        record = StepRecord(
            step=self.step, outcome=outcome, completions=played.completions, prompts=played.prompts,
            mapping=self.mapping, member_metrics=member_metrics, evolution=events,
            times={**played.times, "update": update_s, "evolution": time.perf_counter() - t0},
            dropped_prompts=played.dropped_prompts, memory=self.memory.take())
        record.times["step"] = time.perf_counter() - t_step
        return record


def _generation_spec(request: Mapping[str, Any]) -> tuple[bool, str, tuple[str, ...]]:
    """``(chat, prefix, stop)`` of a GenerationRequest from the env's request info (its prompt set's rules)."""
    return (bool(request.get("chat_template", True)), str(request.get("prefix", "")),
            tuple(request.get("stop", ())))


__all__ = ["PlayedRound", "SelfPlayLoop", "StepRecord", "derive_seed"]
