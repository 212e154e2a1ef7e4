"""The self-play training loop over the env (population or single-agent baseline).

One step = one env round::

    reset -> teachers generate (one batched call, adapters mixed) -> env.step (validate in the sandbox,
    PFSP matching) -> students generate -> env.step (verify, rewards, rating update)
    -> rollouts per member -> advantages + one update per member -> callbacks (PBT evolution, logging,
    checkpoint)

The agent -> adapter mapping is configuration (like RLlib's policy mapping): in a population every agent
is its own adapter; the AZR baseline maps ``teacher_0`` and ``student_0`` to one adapter. The loop is
resumable: a checkpoint holds adapters, optimizer states, env state (ratings, buffers, RNG), the PBT
controller and the loop's counters and RNG states; sampling seeds are derived from (seed, step, agent,
index), so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.checkpoint import (
    cleanup_partial,
    latest_checkpoint,
    write_checkpoint,
    write_json,
    write_text_atomic,
)
from agents.config import TrainConfig, to_dict
from agents.generation import GenerationRequest, make_generator
from agents.models import load_base
from agents.population import LoRAPopulation
from agents.rollout import Rollout
from agents.trainer import PolicyGradientTrainer
from evolution.pbt import PBTController
from populora_env import parallel_env

log = logging.getLogger(__name__)

SCALAR_AGG = ("loss", "grad_norm", "clip_frac", "entropy")


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed derived deterministically from ``parts`` (ints or strings)."""
    ints = [p if isinstance(p, int) else int.from_bytes(str(p).encode()[:16].ljust(16, b"\0"), "little")
            for p in parts]
    return int(np.random.SeedSequence(ints).generate_state(1)[0] & 0x7FFFFFFF)


def role_of(agent: str) -> str:
    """'teacher' or 'student' from an agent id like ``teacher_3``."""
    return agent.split("_", 1)[0]


@dataclass
class AgentMapping:
    """Which adapter acts for which agent, and which adapters belong to which role."""

    agent_to_member: dict[str, str]
    roles: dict[str, list[str]]  # role -> members (evolution acts within a role)

    @property
    def members(self) -> list[str]:
        seen: dict[str, None] = {}
        for m in self.agent_to_member.values():
            seen[m] = None
        return list(seen)


def population_mapping(num_teachers: int, num_students: int) -> AgentMapping:
    """Every agent is its own adapter."""
    teachers = [f"teacher_{i}" for i in range(num_teachers)]
    students = [f"student_{i}" for i in range(num_students)]
    return AgentMapping({a: a for a in teachers + students}, {"teacher": teachers, "student": students})


@dataclass
class PhaseOutput:
    """Completions of one phase, per agent, aligned with the env's observations."""

    completions: dict[str, list[Any]] = field(default_factory=dict)
    seconds: float = 0.0


class SelfPlayLoop:
    """Compose env, population, generator, trainer and PBT, and run ``cfg.steps`` rounds.

    Args:
        cfg: the run configuration.
        kind: ``"population"`` or ``"baseline"`` (recorded in config.json; the report groups by it).
        mapping: agent -> adapter mapping.
        run_dir: where everything is written.
        evolve: run the PBT callback.
        callbacks: extra ``fn(loop, step, stats)`` called at the end of every step.
    """

    def __init__(self, cfg: TrainConfig, kind: str, mapping: AgentMapping, run_dir: Path, evolve: bool,
                 callbacks: Sequence[Callable[[SelfPlayLoop, int, dict], None]] = ()):
        self.cfg, self.kind, self.mapping, self.run_dir = cfg, kind, mapping, Path(run_dir)
        self.evolve = evolve
        self.callbacks = list(callbacks)
        self.member_agents: dict[str, list[str]] = defaultdict(list)
        for a, m in mapping.agent_to_member.items():
            self.member_agents[m].append(a)

    # ------------------------------------------------------------------------------------- set-up
    def _device(self) -> str:
        if self.cfg.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.cfg.device

    def setup(self) -> None:
        """Build every component (the slow part: model loading)."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        dtype = getattr(torch, cfg.dtype)
        base, self.tokenizer = load_base(cfg.model, dtype=dtype)
        base.to(self._device())
        self.population = LoRAPopulation(base, self.mapping.members, rank=cfg.rank, alpha=cfg.alpha,
                                         target_modules=cfg.target_modules, seed=cfg.seed)
        g = cfg.generation
        gen_kw: dict[str, Any] = {"batch_size": g.batch_size} if g.backend == "hf" else {
            "model_path": cfg.model, "gpu_memory_utilization": g.vllm_gpu_memory_utilization,
            "max_model_len": g.vllm_max_model_len}
        self.generator = make_generator(g.backend, self.population, self.tokenizer, **gen_kw)
        self.trainer = PolicyGradientTrainer(self.population, cfg.trainer)
        e = cfg.env
        self.env = parallel_env(
            num_teachers=len([a for a in self.mapping.agent_to_member if role_of(a) == "teacher"]),
            num_students=len([a for a in self.mapping.agent_to_member if role_of(a) == "student"]),
            tasks_per_teacher=e.tasks_per_teacher, samples_per_task=e.samples_per_task,
            task_types=tuple(e.task_types), reward_scheme=e.reward_scheme, references_k=e.references_k,
            require_think=e.require_think, timeout_s=e.timeout_s, memory_mb=e.memory_mb,
            sandbox_workers=e.sandbox_workers, seed=cfg.seed)
        pbt_cfg = dataclasses.replace(cfg.pbt, seed=cfg.seed + cfg.pbt.seed)  # one seed drives the run
        self.pbt = PBTController(pbt_cfg, self.run_dir / "lineage.jsonl") if self.evolve else None
        self.step = 0
        self.totals: dict[str, float] = defaultdict(float)

    # -------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Atomic checkpoint of everything needed to continue exactly."""

        def write(d: Path) -> None:
            self.population.save_all(d / "population")
            write_json(d / "env_state.json", self.env.state_dict())
            if self.pbt is not None:
                write_json(d / "pbt_state.json", self.pbt.state_dict())
            write_json(d / "loop_state.json", {
                "step": self.step, "totals": dict(self.totals),
                "python_rng": repr(random.getstate()),
                "numpy_rng": _np_state_to_json(np.random.get_state()),
            })
            torch.save({"torch_rng": torch.get_rng_state()}, d / "torch_rng.pt")

        return write_checkpoint(self.run_dir, self.step, write, keep=self.cfg.keep_checkpoints)

    def load_checkpoint(self) -> bool:
        """Restore from the newest complete checkpoint; False if there is none."""
        cleanup_partial(self.run_dir)
        found = latest_checkpoint(self.run_dir)
        if found is None:
            return False
        step, d = found
        self.population.load_all(d / "population")
        self.env.load_state_dict(json.loads((d / "env_state.json").read_text()))
        if self.pbt is not None and (d / "pbt_state.json").is_file():
            self.pbt.load_state_dict(json.loads((d / "pbt_state.json").read_text()))
        st = json.loads((d / "loop_state.json").read_text())
        self.step = int(st["step"])
        self.totals = defaultdict(float, st.get("totals", {}))
        random.setstate(_eval_py_rng(st["python_rng"]))
        np.random.set_state(_np_state_from_json(st["numpy_rng"]))
        torch.set_rng_state(torch.load(d / "torch_rng.pt")["torch_rng"])
        self._truncate_lineage(step)
        self.generator.refresh(self.population.names)
        log.info("resumed %s from checkpoint step %d", self.run_dir, step)
        return True

    def _truncate_lineage(self, step: int) -> None:
        """Drop lineage lines written after checkpoint ``step`` by a run that was killed later."""
        path = self.run_dir / "lineage.jsonl"
        if not path.is_file():
            return
        keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        write_text_atomic(path, "".join(ln + "\n" for ln in keep))

    # ------------------------------------------------------------------------------- generation
    def _generate(self, obs: Mapping[str, Sequence[str]], infos: Mapping[str, dict], phase: str) -> PhaseOutput:
        """One batched generate call over every active agent's prompts (adapters mixed)."""
        g = self.cfg.generation
        max_new = g.teacher_max_new_tokens if phase == "propose" else g.student_max_new_tokens
        requests: list[GenerationRequest] = []
        owners: list[tuple[str, int]] = []  # (agent, number of samples)
        for agent in sorted(obs):
            prompts = list(obs[agent])
            if not prompts or not infos.get(agent, {}).get("active", True):
                continue
            i = 0
            while i < len(prompts):  # consecutive identical prompts = n samples of one request
                j = i
                while j + 1 < len(prompts) and prompts[j + 1] == prompts[i]:
                    j += 1
                n = j - i + 1
                requests.append(GenerationRequest(
                    adapter=self.mapping.agent_to_member[agent], prompt=prompts[i], max_new_tokens=max_new,
                    temperature=g.temperature, top_p=g.top_p, n=n,
                    seed=derive_seed(self.cfg.seed, self.step, phase, agent, i)))
                owners.append((agent, n))
                i = j + 1
        out = PhaseOutput(completions={a: [] for a in obs})
        if not requests:
            return out
        t0 = time.perf_counter()
        threads = torch.get_num_threads()
        if g.threads > 0 and self._device() == "cpu":
            torch.set_num_threads(g.threads)
        try:
            comps = self.generator.generate(requests)
        finally:
            torch.set_num_threads(threads)
        out.seconds = time.perf_counter() - t0
        by_req: dict[int, list[Any]] = defaultdict(list)
        for c in comps:
            by_req[c.request_index].append(c)
        for ri, (agent, n) in enumerate(owners):
            got = sorted(by_req[ri], key=lambda c: c.sample_index)
            if len(got) != n:
                raise RuntimeError(f"generator returned {len(got)} samples for request {ri}, expected {n}")
            out.completions[agent].extend(got)
        return out

    # ------------------------------------------------------------------------------------ a step
    def train_step(self) -> dict[str, Any]:
        """Play one round, update every member, run the callbacks. Returns the step's statistics."""
        cfg, env = self.cfg, self.env
        stats: dict[str, Any] = {"time": {}}
        t_step = time.perf_counter()
        if self.step == 0 and not getattr(self, "_seeded", False):
            obs, infos = env.reset(seed=cfg.seed)
            self._seeded = True
        else:
            obs, infos = env.reset()
        teacher_infos = infos
        prop = self._generate(obs, infos, "propose")
        actions = {a: tuple(c.text for c in prop.completions.get(a, [])) for a in env.agents}
        t0 = time.perf_counter()
        obs, _r, _te, _tr, infos = env.step(actions)
        sandbox_s = time.perf_counter() - t0
        solve = self._generate(obs, infos, "solve")
        student_infos = infos
        actions = {a: tuple(c.text for c in solve.completions.get(a, [])) for a in env.agents}
        t0 = time.perf_counter()
        _obs, rewards, _te, _tr, infos = env.step(actions)
        sandbox_s += time.perf_counter() - t0
        stats["time"]["generation"] = prop.seconds + solve.seconds
        stats["time"]["sandbox"] = sandbox_s

        # rollouts per member ------------------------------------------------------------------
        batches: dict[str, list[Rollout]] = defaultdict(list)
        per_agent: dict[str, dict[str, Any]] = {}
        for agent, comps in list(prop.completions.items()) + list(solve.completions.items()):
            if not comps:
                continue
            phase_infos = teacher_infos if role_of(agent) == "teacher" else student_infos
            reqs = phase_infos[agent].get("requests", [])
            crew = infos[agent].get("completion_rewards", [])
            if len(crew) != len(comps):
                raise RuntimeError(f"{agent}: {len(crew)} rewards for {len(comps)} completions")
            member = self.mapping.agent_to_member[agent]
            role = role_of(agent)
            for k, (c, r) in enumerate(zip(comps, crew, strict=True)):
                req = reqs[k] if k < len(reqs) else {}
                ttype = req.get("task_type", "any")
                batches[member].append(Rollout(
                    prompt_ids=list(c.prompt_token_ids), completion_ids=list(c.token_ids), reward=float(r),
                    group=(agent, req.get("group", f"{agent}:{k}")), scope=(role, ttype),
                    logprobs=list(c.logprobs), meta={"role": role, "task_type": ttype, "agent": agent}))
            per_agent[agent] = {"reward": float(np.mean(crew)) if crew else 0.0,
                                "response_length": float(np.mean([len(c.token_ids) for c in comps]))}
        stats["agents"] = per_agent

        t0 = time.perf_counter()
        member_metrics: dict[str, dict[str, float]] = {}
        for member in self.mapping.members:
            if batches.get(member):
                member_metrics[member] = self.trainer.update(member, batches[member])
        self.generator.refresh([m for m in member_metrics])
        stats["time"]["update"] = time.perf_counter() - t0
        stats["members"] = member_metrics
        stats["member_roles"] = {m: sorted({role_of(a) for a in self.member_agents[m]}) for m in member_metrics}

        self.step += 1
        t0 = time.perf_counter()
        events: list[dict] = []
        if self.pbt is not None:
            ratings = self.env.ratings
            member_ratings = {m: _rating_tuple(ratings[self.member_agents[m][0]]) for m in self.mapping.members}
            events = self.pbt.maybe_evolve(
                self.step, self.mapping.roles, self.population, member_ratings,
                lambda m: [self.env.reset_rating(a) for a in self.member_agents[m]])
            if events:
                self.generator.refresh([e["culled"] for e in events])
        stats["time"]["evolution"] = time.perf_counter() - t0
        stats["evolution"] = events
        stats["round"] = infos[next(iter(infos))].get("round", {}) if infos else {}
        stats["infos"] = infos
        stats["prompts"] = {"propose": (teacher_infos, prop), "solve": (student_infos, solve)}
        stats["time"]["step"] = time.perf_counter() - t_step
        for cb in self.callbacks:
            cb(self, self.step, stats)
        return stats


def _rating_tuple(r: Any) -> tuple[float, float]:
    if isinstance(r, (tuple, list)):
        return float(r[0]), float(r[1])
    return float(r.mu), float(r.sigma)


def _np_state_to_json(state: tuple) -> list:
    name, keys, pos, has_gauss, cached = state
    return [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _np_state_from_json(s: list) -> tuple:
    return (s[0], np.array(s[1], dtype=np.uint32), s[2], s[3], s[4])


def _eval_py_rng(text: str) -> tuple:
    import ast

    return ast.literal_eval(text)  # our own repr of random.getstate(): a tuple of ints


__all__ = ["SelfPlayLoop", "population_mapping", "AgentMapping", "derive_seed", "role_of", "to_dict"]
