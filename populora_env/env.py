"""The teacher–student coding game as a PettingZoo ``ParallelEnv``.

One episode is one round of two steps (docs/design.md, "One episode = one round"):

``reset()``
    Every teacher gets ``tasks_per_teacher`` proposer prompts (task types in turn over ``task_types``);
    students are inactive (no prompts).
``step(1)``
    Teachers' completions are validated in the sandbox (one batch), valid tasks enter the buffers, PFSP pairs
    every teacher with a student, and each student gets its matched teachers' valid tasks (plus, with
    ``student_fill``, buffer tasks newest first up to ``tasks_per_teacher``), each prompt repeated
    ``samples_per_task`` times. Rewards are 0.
``step(2)``
    Students' completions are checked in the sandbox (one batch); the reward scheme gives per-completion
    rewards to everyone; TrueSkill ratings are updated once per pair; all agents terminate.

Contract (what a training loop may rely on):

- ``obs[a]``: a dict (space ``Dict(prompts=Sequence(Text), phase=Discrete(3))``): ``obs[a]["prompts"]``, a
  tuple of prompt strings, one per completion expected from ``a`` in this phase (``()`` when inactive), and
  ``obs[a]["phase"]``, the phase's index in :data:`PHASES` (an ``np.int64``). ``action[a]``: a tuple/list of
  completion strings aligned with ``obs[a]["prompts"]``; missing entries, an agent missing from the dict,
  non-string entries and garbage are format errors; extras and inactive agents' actions are ignored. Nothing an
  agent sends raises.
- ``infos[a]`` always has ``"phase"`` (``"propose"``/``"solve"``/``"done"``), ``"active"``, ``"round_index"``
  and ``"requests"`` (aligned with ``obs[a]["prompts"]``: ``task_type``, ``task_id``, ``group``; how to generate it:
  ``prefix`` (the response prefix the completion continues: the env checks ``prefix + completion``),
  ``chat_template`` (apply the tokenizer's chat template, then the prefix after the assistant opening; when
  false, the observation already ends with the prefix) and ``stop`` (strings that end generation); see
  :mod:`populora_env.prompts`; teachers' induction
  requests also carry ``program``/``n_inputs``; students' carry ``teacher`` (``None`` for filler), ``source``
  (``"match"``/``"fill"``) and ``sample``). ``group`` is unique per teacher prompt and shared by the samples of
  one task of one student.
- After step 1: teachers' ``"proposals"`` (per completion: ``format_ok``, ``valid``, ``reason``, ``detail``,
  ``task_id``, ``task_type``) and ``"matched_student"``; students' ``"matched_teachers"``.
- After step 2 (all terminated, ``agents == []``): ``"completion_rewards"`` and ``"completion_info"`` aligned with
  the agent's completions of the episode (teachers: step 1, students: step 2) and ``"round"``, a summary shared
  by all agents (pairs with ``p_ts``/``p_hat``/``outcome``, ratings, proposal and attempt counts by reason and
  type, program metrics and coverage, buffer sizes, mean reward per role). ``rewards[a]`` is the mean of
  ``a``'s completion rewards (0.0 if none); rewards after step 1 are 0.0.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from gymnasium.spaces import Dict, Discrete, Text
from gymnasium.spaces import Sequence as SequenceSpace
from pettingzoo import ParallelEnv

from populora_env.buffer import TaskBuffers
from populora_env.checking import AnswerChecker, AttemptOutcome, CheckConfig
from populora_env.config import MAX_PER_ROUND, ConfigError, EnvConfig, check_int, env_config
from populora_env.matching import Pairing, Ratings, match_outcome, pfsp_match
from populora_env.metrics import CoverageTracker, round_summary
from populora_env.prompts import PROMPT_KINDS, PromptTemplates, get_prompt_set, prompt_kind
from populora_env.results import (
    AttemptResult,
    MatchResult,
    ProposalResult,
    RoundOutcome,
    RoundResults,
    num_tokens_of,
)
from populora_env.rewards import RewardScheme, SchemeRewards, compute_rewards, get_reward_scheme, term_means
from populora_env.seeds import seed_tasks
from populora_env.tasks import Task, TaskType
from populora_env.validation import (
    ProposalOutcome,
    ProposalRequest,
    ProposalValidator,
    Reason,
    ValidationConfig,
)

STATE_VERSION = 1

#: The phases of a round, in order; an observation's ``phase`` is an index into this tuple (``infos[a]["phase"]``
#: names it).
PHASES = ("propose", "solve", "done")

#: ``max_length`` of the action space's ``Text``: what ``action_space(a).sample()`` draws up to. The env reads
#: completions of any length (a longer one is processed, never refused for its length).
ACTION_MAX_CHARS = 16384


def agent_names(num_teachers: int, num_students: int) -> tuple[list[str], list[str]]:
    """The env's agent ids: ``teacher_0..`` and ``student_0..``."""
    return [f"teacher_{i}" for i in range(num_teachers)], [f"student_{i}" for i in range(num_students)]


def _custom_objects(overrides: dict[str, Any]) -> tuple[RewardScheme | None, PromptTemplates | None]:
    """A callable ``reward_scheme`` and a :class:`PromptTemplates` ``prompts`` passed as overrides, which the
    config records by name (``overrides`` is updated in place: the callable's ``__name__`` and ``"custom"``)."""
    scheme = overrides.get("reward_scheme")
    scheme = scheme if scheme is not None and not isinstance(scheme, str) else None
    if scheme is not None:
        if not callable(scheme):
            raise ConfigError("reward_scheme", f"must be a registered name or a callable, got {scheme!r}")
        overrides["reward_scheme"] = getattr(scheme, "__name__", "custom")
    prompts = overrides.get("prompts")
    prompts = prompts if prompts is not None and not isinstance(prompts, str) else None
    if prompts is not None:
        if not isinstance(prompts, PromptTemplates):
            raise ConfigError("prompts", f"must be a prompt-set name or a PromptTemplates, got "
                              f"{type(prompts).__name__}")
        overrides["prompts"] = "custom"
    return scheme, prompts


class PromptText(Text):
    """``Text`` that contains any ``str`` of an allowed length: a prompt quotes model-written programs and
    literals, which may hold any Unicode character (``sample()`` still draws from ``charset``)."""

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a ``str`` of ``min_length`` to ``max_length`` characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def _action_space() -> SequenceSpace:
    """``Sequence(Text(...))``: one completion per prompt (printable characters up to :data:`ACTION_MAX_CHARS`)."""
    return SequenceSpace(Text(max_length=ACTION_MAX_CHARS, min_length=0, charset=string.printable), stack=False)


class _LazySandbox:
    """Starts the env's own sandbox only when a batch actually has jobs."""

    def __init__(self, env: PopuLoRAParallelEnv) -> None:
        self._env = env

    def run(self, jobs: Sequence[Any]) -> list[Any]:
        return self._env.sandbox.run(list(jobs))


class PopuLoRAParallelEnv(ParallelEnv):
    """PopuLoRA's asymmetric self-play game: teachers propose Python tasks, students solve them.

    Settings are the fields of :class:`populora_env.config.EnvConfig` (one source of truth for their meaning,
    defaults and validation), given as a config, as keyword overrides, or both::

        PopuLoRAParallelEnv(num_teachers=2, samples_per_task=4)
        PopuLoRAParallelEnv(EnvConfig(num_teachers=2), reward_scheme="azr")

    ``num_teachers``/``num_students`` (agents), ``tasks_per_teacher``, ``samples_per_task``, ``task_types``,
    ``reward_scheme`` + ``reward_kwargs``, ``references_k``, ``induction_inputs``, ``buffer_cap``,
    ``student_fill``, ``reject_duplicates``, ``require_think``, ``lenient_answer_close``, ``unparseable_answer``,
    ``prompts`` (a prompt-set name), ``seed_tasks``/``seed_max_proposals`` (read by the training loop's seeding
    stage, which uses :meth:`seed_prompts` and :meth:`add_seed_proposals`), the length
    limits, ``timeout_s``/``memory_mb``/``sandbox_workers`` (the sandbox) and ``trueskill`` (a
    :class:`TrueSkillConfig` or a dict of its fields). Besides registered names, ``reward_scheme`` may be a
    callable and ``prompts`` a :class:`PromptTemplates`. Every value is validated here, before any work; a bad
    one raises :class:`populora_env.config.ConfigError` (a ``ValueError``) naming the setting.

    Args:
        config: the settings (default: :class:`EnvConfig`'s defaults).
        sandbox: a shared :class:`populora_env.sandbox.Sandbox` (or anything with its ``run(jobs)`` contract; the
            env does not close it). ``None``: the env starts its own on first use and closes it in :meth:`close`.
        limits: :class:`populora_env.sandbox.Limits` (or a dict of its fields) of the env's own sandbox, instead
            of ``timeout_s``/``memory_mb``.
        seed: seed of the env's RNG (also settable with ``reset(seed=...)``).
        render_mode: ``None`` or ``"ansi"``.
        **overrides: settings replacing those of ``config``.
    """

    metadata = {"name": "populora_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        config: EnvConfig | None = None,
        *,
        sandbox: Any = None,
        limits: Any = None,
        seed: int | None = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        if config is not None and not isinstance(config, EnvConfig):
            raise ValueError(f"config must be an EnvConfig, got {type(config).__name__}")
        custom_scheme, custom_prompts = _custom_objects(overrides)
        explicit_limits = {k for k in ("timeout_s", "memory_mb") if overrides.get(k) is not None}
        overrides = {k: v for k, v in overrides.items() if not (k in ("timeout_s", "memory_mb") and v is None)}
        cfg = env_config(config, **overrides)
        cfg.validate(reward_scheme=custom_scheme, prompt_set=custom_prompts)
        #: The settings, read where they are used (never copied onto the env).
        self.config = cfg
        self._scheme: RewardScheme = custom_scheme or get_reward_scheme(cfg.reward_scheme)
        #: The prompt set in use, adapted to the validation profile and the time limit.
        self.prompts: PromptTemplates = (custom_prompts or get_prompt_set(cfg.prompts)).for_env(cfg.validation,
                                                                                                   cfg.timeout_s)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        if seed is not None:
            check_int("seed", seed, 0)
        if sandbox is not None and not callable(getattr(sandbox, "run", None)):
            raise ValueError("sandbox must be a populora_env.sandbox.Sandbox (an object with run(jobs))")
        self._limits = self._make_limits(sandbox, limits, cfg, explicit_limits)
        self._shared_sandbox = sandbox
        self._own_sandbox: Any = None
        self._lazy_sandbox = _LazySandbox(self)

        self.teachers, self.students = agent_names(cfg.num_teachers, cfg.num_students)
        self.possible_agents = self.teachers + self.students
        self.agents: list[str] = []
        self._validator = ProposalValidator(self._validation_config())
        self._checker = AnswerChecker(self._check_config())

        self._rng = np.random.default_rng(seed)
        self._round = -1
        self._phase = "idle"
        self._ratings = Ratings(self.possible_agents, cfg.trueskill)
        self._buffers = TaskBuffers(cfg.buffer_cap, seed_tasks(cfg.induction_inputs, cfg.hand_seeds))
        self._coverage = CoverageTracker()
        self._seed_count = 0  # seeding-stage proposals issued (task ids base-<n>)
        self._seed_requests: dict[str, ProposalRequest] = {}

        self._teacher_requests: dict[str, list[ProposalRequest]] = {}
        self._proposal_outcomes: dict[str, list[ProposalOutcome]] = {}
        self._proposal_texts: dict[str, list[tuple[str, int | None]]] = {}  # (completion text, token count)
        self._buffers_before: Mapping[str, tuple[Task, ...]] = MappingProxyType({})
        self._pairings: list[Pairing] = []
        self._student_tasks: dict[str, list[tuple[Task, str | None]]] = {}  # (task, matched teacher or None)
        self._current_tasks: dict[str, Task] = {}
        #: The last finished round (results, rewards, ratings, summary); ``None`` before the first one.
        self.last_outcome: RoundOutcome | None = None
        self._observation_spaces = {a: self._observation_space() for a in self.possible_agents}
        self._action_spaces = {a: _action_space() for a in self.possible_agents}

    # ------------------------------------------------------------------ construction helpers

    @staticmethod
    def _make_limits(sandbox: Any, limits: Any, cfg: EnvConfig, explicit: set[str]) -> Any:
        """Limits of the env's own sandbox (``None`` with a shared one, whose limits are its own business)."""
        if sandbox is not None:
            if limits is not None or "memory_mb" in explicit:
                raise ValueError("limits / memory_mb configure the env's own sandbox; do not pass them with sandbox=")
            return None
        from populora_env.sandbox import Limits

        if limits is not None:
            if explicit:
                raise ValueError("pass either limits= or timeout_s/memory_mb, not both")
            if isinstance(limits, Limits):
                return limits
            if isinstance(limits, Mapping):
                try:
                    return Limits(**dict(limits))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"limits: {exc}") from None
            raise ValueError(f"limits must be a Limits or a dict, got {limits!r}")
        return cfg.sandbox_limits()

    def _validation_config(self) -> ValidationConfig:
        cfg, prompts = self.config, self.prompts
        return ValidationConfig(
            max_program_chars=cfg.max_program_chars,
            max_input_chars=cfg.max_input_chars,
            max_message_chars=cfg.max_message_chars,
            max_output_chars=cfg.max_output_chars,
            induction_inputs=cfg.induction_inputs,
            reject_duplicates=cfg.reject_duplicates,
            require_think=cfg.require_think,
            response_prefix=prompts.response_prefix,
            response_prefixes=prompts.prefixes("propose"),
            lenient_answer_close=cfg.lenient_answer_close,
            timeout_s=cfg.timeout_s,
            profile=cfg.validation,
        )

    def _check_config(self) -> CheckConfig:
        cfg, prompts = self.config, self.prompts
        return CheckConfig(
            require_think=cfg.require_think,
            response_prefix=prompts.response_prefix,
            response_prefixes=prompts.prefixes("solve"),
            lenient_answer_close=cfg.lenient_answer_close,
            max_program_chars=cfg.max_program_chars,
            timeout_s=cfg.timeout_s,
            unparseable_is_format_error=cfg.unparseable_answer == "format",
        )

    def _observation_bound(self) -> int:
        """An upper bound of prompt lengths (for the ``Text`` observation space)."""
        p, cfg = self.prompts, self.config
        templates = max(
            len(p.propose_deduction), len(p.propose_abduction), len(p.propose_induction),
            len(p.solve_deduction), len(p.solve_abduction), len(p.solve_induction),
        ) + len(p.wrapper) + len(p.banned) + max(len(p.prefix(kind)) for kind in PROMPT_KINDS)
        io = cfg.max_input_chars + cfg.max_output_chars
        references = cfg.references_k * (cfg.max_program_chars + io + len(p.reference) + 16)
        induction = cfg.induction_inputs * (io + len(p.pair) + 16) + cfg.max_message_chars
        content = max(references, induction, cfg.max_program_chars + io)
        return 2 * (templates + content) + 1024

    def _observation_space(self) -> Dict:
        """``Dict(prompts=Sequence(PromptText), phase=Discrete(3))``: see :meth:`observation_space`."""
        text = PromptText(max_length=self._observation_bound(), min_length=0, charset=string.printable)
        return Dict({"prompts": SequenceSpace(text, stack=False), "phase": Discrete(len(PHASES))})

    @staticmethod
    def _observation(phase: str, prompts: Sequence[str] = ()) -> dict[str, Any]:
        """One agent's observation: its prompts and the index of ``phase`` in :data:`PHASES`."""
        return {"prompts": tuple(prompts), "phase": np.int64(PHASES.index(phase))}

    # ------------------------------------------------------------------ PettingZoo API

    def observation_space(self, agent: str) -> Dict:
        """``Dict(prompts=Sequence(Text(...)), phase=Discrete(3))`` (the same object on every call): ``prompts``
        holds one prompt per expected completion (``()`` when inactive), ``phase`` is the index of the phase in
        :data:`PHASES` (an ``np.int64``)."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> SequenceSpace:
        """``Sequence(Text(...))``: one completion per prompt (the same object on every call)."""
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """Start a round: teachers get their proposer prompts. Ratings and buffers persist across rounds;
        ``seed`` re-seeds the env's RNG."""
        if seed is not None:
            self._rng = np.random.default_rng(check_int("seed", seed, 0))
        self._round += 1
        self._phase = "propose"
        self.agents = self.possible_agents[:]
        self._proposal_outcomes = {}
        self._proposal_texts = {}
        self._pairings = []
        self._student_tasks = {}
        self._current_tasks = {}

        observations: dict[str, dict[str, Any]] = {}
        infos: dict[str, dict[str, Any]] = {}
        task_types = self.task_types
        for t_index, teacher in enumerate(self.teachers):
            requests: list[ProposalRequest] = []
            prompts: list[str] = []
            info_requests: list[dict[str, Any]] = []
            for k in range(self.config.tasks_per_teacher):
                task_type = task_types[(self._round + t_index + k) % len(task_types)]
                request, prompt, request_info = self._proposal_request(
                    ProposalRequest(teacher, k, task_type, f"r{self._round}-{teacher}-{k}", self._round),
                    f"r{self._round}/{teacher}/{k}",
                )
                requests.append(request)
                prompts.append(prompt)
                info_requests.append(request_info)
            self._teacher_requests[teacher] = requests
            observations[teacher] = self._observation("propose", prompts)
            infos[teacher] = self._base_info("propose", True, info_requests)
        for student in self.students:
            observations[student] = self._observation("propose")
            infos[student] = self._base_info("propose", False, [])
        return observations, infos

    def _proposal_request(self, request: ProposalRequest, group: str) -> tuple[ProposalRequest, str, dict[str, Any]]:
        """The proposer prompt of ``request`` built from the buffers (K references drawn for deduction/abduction,
        one program from deduction ∪ abduction for induction, which then becomes ``request.source``), and its
        request info."""
        task_type = request.task_type
        info: dict[str, Any] = {
            "task_type": task_type.value,
            "task_id": request.task_id,
            "group": group,
            **self._generation_info("propose", task_type),
        }
        if task_type is TaskType.INDUCTION:
            source = self._buffers.program_source(self._rng)
            n_inputs = self.config.induction_inputs
            prompt = self.prompts.proposal(task_type, program=source.program, n_inputs=n_inputs)
            info["program"] = source.program
            info["source_task_id"] = source.task_id
            info["n_inputs"] = n_inputs
            request = dataclasses.replace(request, source=source)
        else:
            refs = self._buffers[task_type].sample_references(self.config.references_k, self._rng)
            prompt = self.prompts.proposal(task_type, references=refs)
            info["reference_task_ids"] = [r.task_id for r in refs]
        return request, prompt, info

    # ------------------------------------------------------------------ seeding from a model (outside rounds)

    def seed_prompts(self, task_type: TaskType | str, k: int) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """``k`` proposer prompts of ``task_type`` for the seeding stage before training (docs/azr.md §7), built
        from the current buffers exactly as a round's prompts are, with their request infos (the format of
        ``infos[teacher]["requests"]``, task ids ``base-<n>``). Only the env's RNG moves; no round starts.

        Answer them with :meth:`add_seed_proposals`. Raises ``RuntimeError`` during a round.
        """
        self._require_between_rounds("seed_prompts")
        task_type = TaskType.parse(task_type)
        k = check_int("k", k, 0, MAX_PER_ROUND)
        prompts: list[str] = []
        infos: list[dict[str, Any]] = []
        for _ in range(k):
            n = self._seed_count
            self._seed_count += 1
            request, prompt, info = self._proposal_request(
                ProposalRequest("base", n, task_type, f"base-{n}", -1), f"seed/{n}"
            )
            self._seed_requests[request.task_id] = request
            prompts.append(prompt)
            infos.append(info)
        return tuple(prompts), infos

    def add_seed_proposals(self, requests: Sequence[Mapping[str, Any]], completions: Sequence[object]
                           ) -> list[dict[str, Any]]:
        """Validate completions answering :meth:`seed_prompts` requests (one batched sandbox call, the same
        validator as a round's, duplicates always rejected since a seed set is de-duplicated) and add the valid
        tasks to the buffers. A valid deduction/abduction program goes into **both** the deduction and the
        abduction buffer when both types are in play (AZR's seed pool serves both). Ratings, rounds and rewards
        are untouched.

        Returns one record per completion: ``format_ok``, ``valid``, ``reason``, ``detail``, ``task_id``,
        ``task_type`` and ``added`` (the task types whose buffer took it).

        Raises:
            ValueError: a request that :meth:`seed_prompts` did not issue (or that was already answered), or
                ``completions`` not aligned with ``requests``.
            RuntimeError: during a round.
        """
        self._require_between_rounds("add_seed_proposals")
        if len(requests) != len(completions):
            raise ValueError(f"{len(completions)} completions for {len(requests)} seed requests")
        pending: list[ProposalRequest] = []
        for info in requests:
            task_id = info.get("task_id") if isinstance(info, Mapping) else None
            request = self._seed_requests.pop(str(task_id), None)
            if request is None:
                raise ValueError(f"unknown seed request {task_id!r}: answer requests issued by seed_prompts, once")
            pending.append(request)
        validator = ProposalValidator(dataclasses.replace(self._validator.config, reject_duplicates=True))
        outcomes = validator.validate(pending, list(completions), self._lazy_sandbox, self._buffers)
        records = []
        shared = {TaskType.DEDUCTION, TaskType.ABDUCTION}
        for outcome in outcomes:
            added: list[str] = []
            task = outcome.task
            if task is not None:
                if self._buffers.add(task):
                    added.append(task.task_type.value)
                if task.task_type in shared:
                    for other in sorted(shared - {task.task_type}):
                        if other in self.task_types and task.task_type in self.task_types:
                            copy = dataclasses.replace(task, task_id=f"{task.task_id}-{other.value}", task_type=other)
                            if self._buffers.add(copy):
                                added.append(other.value)
            records.append(dict(_proposal_info(outcome), added=added))
        return records

    def _require_between_rounds(self, what: str) -> None:
        if self._phase not in ("idle", "done"):
            raise RuntimeError(f"{what}() is for the seeding stage between rounds, not during one (phase "
                               f"{self._phase!r})")

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Advance the round: proposals → matching and solver prompts; answers → rewards and ratings."""
        if self._phase == "propose":
            return self._step_propose(actions)
        if self._phase == "solve":
            return self._step_solve(actions)
        raise RuntimeError("the episode is over (or never started): call reset() before step()")

    def render(self) -> str | None:
        """``"ansi"``: a text summary of the round so far; ``None`` without a render mode."""
        if self.render_mode != "ansi":
            return None
        lines = [f"PopuLoRA round {self._round} — phase {self._phase}"]
        if self._proposal_outcomes:
            for teacher, outcomes in self._proposal_outcomes.items():
                marks = " ".join(
                    f"{o.request.task_type.value[:3]}:{'ok' if o.valid else o.reason}" for o in outcomes
                )
                lines.append(f"  {teacher}: {marks}")
        for pairing in self._pairings:
            lines.append(f"  {pairing.teacher} -> {pairing.student} (p_ts={pairing.p_ts:.3f})")
        if self._phase == "done" and self.last_outcome is not None:
            for pair in self.last_outcome.summary["pairs"]:
                p_hat = "n/a" if pair["p_hat"] is None else f"{pair['p_hat']:.3f}"
                lines.append(f"  {pair['teacher']} vs {pair['student']}: p̂={p_hat} winner={pair['outcome']}")
        for agent in self.possible_agents:
            lines.append(
                f"  {agent:<12} mu={self._ratings.mu(agent):6.2f} sigma={self._ratings.sigma(agent):5.2f}"
                f" mu-3sigma={self._ratings.conservative(agent):6.2f}"
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Close the env's own sandbox (a shared one is left open)."""
        if self._own_sandbox is not None:
            self._own_sandbox.close()
            self._own_sandbox = None

    # ------------------------------------------------------------------ public extras

    @property
    def sandbox(self) -> Any:
        """The sandbox in use (the env's own one is started on first access)."""
        if self._shared_sandbox is not None:
            return self._shared_sandbox
        if self._own_sandbox is None:
            from populora_env.sandbox import Sandbox

            self._own_sandbox = Sandbox(workers=self.config.sandbox_workers, limits=self._limits)
        return self._own_sandbox

    @property
    def task_types(self) -> tuple[TaskType, ...]:
        """The task types in play (``config.task_types`` as :class:`TaskType` values, in order)."""
        return tuple(TaskType.parse(t) for t in self.config.task_types)

    @property
    def ratings(self) -> Ratings:
        """TrueSkill ratings; ``env.ratings[agent]`` is a ``trueskill.Rating`` (``.mu``, ``.sigma``)."""
        return self._ratings

    def conservative_skill(self, agent: str) -> float:
        """``μ − 3σ`` of ``agent`` (ranking for evolution)."""
        return self._ratings.conservative(agent)

    def reset_rating(self, agent: str) -> None:
        """Fresh rating for ``agent`` (its adapter was replaced)."""
        self._ratings.reset(agent)

    @property
    def buffers(self) -> TaskBuffers:
        """The task buffers (shared by the population)."""
        return self._buffers

    @property
    def current_round(self) -> int:
        """Index of the current (or last) round; -1 before the first reset."""
        return self._round

    @property
    def phase(self) -> str:
        """``"idle"``, ``"propose"``, ``"solve"`` or ``"done"``."""
        return self._phase

    @property
    def current_tasks(self) -> Mapping[str, Task]:
        """Ground truth of the tasks assigned to students this round (task id → task), for analysis and tests."""
        return MappingProxyType(self._current_tasks)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state between rounds: ratings, buffers, RNG, round counter, coverage.

        The progress of an unfinished round is not saved: after :meth:`load_state_dict`, call ``reset()``.
        """
        return {
            "version": STATE_VERSION,
            "agents": list(self.possible_agents),
            "round": self._round,
            "rng": _jsonable(self._rng.bit_generator.state),
            "ratings": self._ratings.state_dict(),
            "buffers": self._buffers.state_dict(),
            "coverage": self._coverage.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (same agents); the env then waits for ``reset()``."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported env state version {state.get('version')!r}")
        if list(state["agents"]) != self.possible_agents:
            raise ValueError(f"state is for agents {state['agents']}, this env has {self.possible_agents}")
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self._rng = rng
        self._round = int(state["round"])
        self._ratings.load_state_dict(state["ratings"])
        self._buffers.load_state_dict(state["buffers"])
        self._coverage.load_state_dict(state["coverage"])
        self._phase = "idle"
        self.agents = []

    # ------------------------------------------------------------------ the two steps

    def _generation_info(self, role: str, task_type: TaskType) -> dict[str, Any]:
        """How a request is generated (the prompt set's rules): the response prefix the completion continues,
        whether the chat template applies, and the stop strings."""
        return {
            "prefix": self.prompts.prefix(prompt_kind(role, task_type)),
            "chat_template": self.prompts.chat_template,
            "stop": list(self.prompts.stop),
        }

    def _base_info(self, phase: str, active: bool, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return {"phase": phase, "active": active, "requests": requests, "round_index": self._round}

    def _completions(self, actions: Any, agent: str, n: int) -> list[object]:
        raw = actions.get(agent) if isinstance(actions, Mapping) else None
        if isinstance(raw, str):
            items: list[object] = [raw]
        elif isinstance(raw, list | tuple):
            items = list(raw)
        else:
            items = []
        items = items[:n]
        return items + [""] * (n - len(items))

    def _step_propose(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        requests: list[ProposalRequest] = []
        completions: list[object] = []
        for teacher in self.teachers:
            reqs = self._teacher_requests[teacher]
            requests.extend(reqs)
            given = self._completions(actions, teacher, len(reqs))
            completions.extend(_plain(c) for c in given)
            self._proposal_texts[teacher] = [_text_and_tokens(c) for c in given]
        self._buffers_before = MappingProxyType({t.value: self._buffers[t].tasks for t in TaskType})
        outcomes = self._validator.validate(requests, completions, self._lazy_sandbox, self._buffers)
        by_teacher: dict[str, list[ProposalOutcome]] = {t: [] for t in self.teachers}
        for outcome in outcomes:
            by_teacher[outcome.request.agent].append(outcome)
            if outcome.task is not None:
                self._buffers.add(outcome.task)
        self._proposal_outcomes = by_teacher

        cfg = self.config
        self._pairings = pfsp_match(self.teachers, self.students, self._ratings, self._rng, cfg.matching,
                                    cfg.matching_kwargs, cfg.matching_random)
        matched: dict[str, list[str]] = {s: [] for s in self.students}
        for pairing in self._pairings:
            matched[pairing.student].append(pairing.teacher)

        samples, tasks_per_teacher = self.config.samples_per_task, self.config.tasks_per_teacher
        observations: dict[str, dict[str, Any]] = {}
        infos: dict[str, dict[str, Any]] = {}
        for s_index, student in enumerate(self.students):
            assigned: list[tuple[Task, str | None]] = []
            for teacher in matched[student]:  # teachers in index order
                for outcome in by_teacher[teacher]:
                    if outcome.task is not None:
                        assigned.append((outcome.task, teacher))
            if self.config.student_fill and len(assigned) < tasks_per_teacher:
                assigned.extend((t, None) for t in self._filler(s_index, assigned))
            self._student_tasks[student] = assigned
            prompts: list[str] = []
            info_requests: list[dict[str, Any]] = []
            for task, teacher in assigned:
                self._current_tasks[task.task_id] = task
                prompt = self.prompts.solver(task)
                for j in range(samples):
                    prompts.append(prompt)
                    info_requests.append(
                        {
                            "task_type": task.task_type.value,
                            "task_id": task.task_id,
                            "group": f"r{self._round}/{student}/{task.task_id}",
                            "teacher": teacher,
                            "source": "match" if teacher is not None else "fill",
                            "sample": j,
                            **self._generation_info("solve", task.task_type),
                        }
                    )
            observations[student] = self._observation("solve", prompts)
            infos[student] = self._base_info("solve", bool(prompts), info_requests)
            infos[student]["matched_teachers"] = list(matched[student])
        for teacher in self.teachers:
            observations[teacher] = self._observation("solve")
            infos[teacher] = self._base_info("solve", False, [])
            infos[teacher]["proposals"] = [_proposal_info(o) for o in by_teacher[teacher]]
            infos[teacher]["matched_student"] = next(p.student for p in self._pairings if p.teacher == teacher)
        self._phase = "solve"
        rewards = dict.fromkeys(self.possible_agents, 0.0)
        flags = dict.fromkeys(self.possible_agents, False)
        ordered_obs = {a: observations[a] for a in self.possible_agents}
        ordered_infos = {a: infos[a] for a in self.possible_agents}
        return ordered_obs, rewards, flags, dict(flags), ordered_infos

    def _filler(self, s_index: int, assigned: list[tuple[Task, str | None]]) -> list[Task]:
        """Buffer tasks (newest first) topping a student up to ``tasks_per_teacher`` tasks."""
        taken = {t.task_id for t, _ in assigned}
        out: list[Task] = []
        task_types = self.task_types
        for j in range(self.config.tasks_per_teacher - len(assigned)):
            for shift in range(len(task_types)):
                task_type = task_types[(self._round + s_index + j + shift) % len(task_types)]
                picked = self._buffers[task_type].newest_first(1, self._rng, exclude=taken)
                if picked:
                    out.append(picked[0])
                    taken.add(picked[0].task_id)
                    break
        return out

    def _step_solve(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        attempts, verdicts = self._check_answers(actions)
        self._void_broken_tasks(attempts)
        proposals = [
            ProposalResult(
                agent=o.request.agent, index=o.request.index, task_type=o.request.task_type.value,
                task_id=o.request.task_id, format_ok=o.format_ok, valid=o.valid,
                reason=None if o.reason is None else o.reason.value, tamper=o.tamper,
                task=o.task, completion=text, num_tokens=tokens,
            )
            for teacher in self.teachers
            for o, (text, tokens) in zip(self._proposal_outcomes[teacher], self._proposal_texts[teacher], strict=True)
        ]
        ratings_before = MappingProxyType({a: (self._ratings.mu(a), self._ratings.sigma(a))
                                           for a in self.possible_agents})
        matches = self._settle_matches(attempts)
        results = RoundResults(
            round=self._round, teachers=tuple(self.teachers), students=tuple(self.students),
            proposals=tuple(proposals), attempts=tuple(attempts), matches=tuple(matches),
            ratings_before=ratings_before, buffers=self._buffers_before,
        )
        completion_rewards = compute_rewards(self._scheme, results, self.config.reward_kwargs)
        summary = self._summary(results, completion_rewards)
        self.last_outcome = RoundOutcome(
            results=results,
            rewards={a: tuple(float(r) for r in completion_rewards[a]) for a in self.possible_agents},
            ratings={a: (self._ratings.mu(a), self._ratings.sigma(a)) for a in self.possible_agents},
            summary=summary,
        )

        infos: dict[str, dict[str, Any]] = {}
        for teacher in self.teachers:
            details = [
                dict(_proposal_info(o), p_hat=results.solve_rate(o.request.task_id) if o.valid else None)
                for o in self._proposal_outcomes[teacher]
            ]
            infos[teacher] = self._done_info(completion_rewards[teacher], details, summary)
        by_student: dict[str, list[dict[str, Any]]] = {s: [] for s in self.students}
        for attempt, verdict in zip(attempts, verdicts, strict=True):
            by_student[attempt.agent].append(_attempt_info(attempt, verdict))
        for student in self.students:
            infos[student] = self._done_info(completion_rewards[student], by_student[student], summary)
        rewards = {a: float(sum(v) / len(v)) if (v := completion_rewards[a]) else 0.0 for a in self.possible_agents}
        observations = {a: self._observation("done") for a in self.possible_agents}
        terminations = dict.fromkeys(self.possible_agents, True)
        truncations = dict.fromkeys(self.possible_agents, False)
        ordered_infos = {a: infos[a] for a in self.possible_agents}
        self._phase = "done"
        self.agents = []
        return observations, rewards, terminations, truncations, ordered_infos

    def _void_broken_tasks(self, attempts: Sequence[AttemptResult]) -> None:
        """Abduction tasks whose program, run on a student's input, tripped a sandbox defence (``tamper``) or gave
        two different answers or drew randomness (``nondeterministic``) are not what plain CPython runs as a
        function of its input: each leaves the buffers, and if it was proposed this round its proposal counts as
        invalid with that reason (``tamper`` first), as validation would have ruled had it run that input. Its
        attempts stay not correct and are left out of the match's p̂. (An induction attempt with either reason is
        the student's own program: the task stays.)"""
        broken: dict[str, AttemptResult] = {}
        for a in attempts:
            if a.task_type == TaskType.ABDUCTION.value and a.reason in (Reason.TAMPER.value,
                                                                          Reason.NONDETERMINISTIC.value):
                if a.task_id not in broken or a.reason == Reason.TAMPER.value:
                    broken[a.task_id] = a
        for task_id in sorted(broken):
            self._buffers.remove(task_id)
        if not broken:
            return
        details = {Reason.TAMPER: "the program tripped a sandbox defence on a student's input",
                   Reason.NONDETERMINISTIC: "the program answered a student's input differently in two runs"}
        for teacher in self.teachers:
            outcomes = []
            for o in self._proposal_outcomes[teacher]:
                why = broken.get(o.task.task_id) if o.task is not None else None
                if why is not None:
                    reason = Reason(why.reason)
                    o = dataclasses.replace(o, valid=False, reason=reason, task=None, signature=None,
                                            detail=details[reason], tamper=why.tamper)
                outcomes.append(o)
            self._proposal_outcomes[teacher] = outcomes

    def _check_answers(self, actions: Mapping[str, Any]) -> tuple[list[AttemptResult], list[AttemptOutcome]]:
        """Every student's completions against its assigned tasks (one sandbox batch), as attempt records."""
        tasks: list[Task] = []
        completions: list[object] = []
        owners: list[tuple[str, int, str | None, int | None]] = []
        for student in self.students:
            expected = [
                (task, teacher) for task, teacher in self._student_tasks[student]
                for _ in range(self.config.samples_per_task)
            ]
            given = self._completions(actions, student, len(expected))
            for index, ((task, teacher), completion) in enumerate(zip(expected, given, strict=True)):
                tasks.append(task)
                completions.append(_plain(completion))
                owners.append((student, index, teacher, num_tokens_of(completion)))
        verdicts = self._checker.check(tasks, completions, self._lazy_sandbox)
        attempts = []
        for (student, index, teacher, tokens), task, completion, v in zip(owners, tasks, completions, verdicts,
                                                                           strict=True):
            answer, program = self._checker.answer_parts(task, completion)
            attempts.append(AttemptResult(
                agent=student, index=index, task_id=task.task_id, task_type=task.task_type.value, teacher=teacher,
                format_ok=v.format_ok, correct=v.correct, reason=None if v.reason is None else v.reason.value,
                tamper=v.tamper, task=task, completion=completion if isinstance(completion, str) else "",
                answer=answer, program=program, num_tokens=tokens,
            ))
        return attempts, list(verdicts)

    def _done_info(self, rewards: list[float], details: list[dict[str, Any]], summary: dict[str, Any]) -> dict:
        info = self._base_info("done", False, [])
        info["completion_rewards"] = list(rewards)
        info["completion_info"] = details
        info["round"] = summary
        return info

    def _settle_matches(self, attempts: list[AttemptResult]) -> list[MatchResult]:
        """p̂ and outcome of every pair, and the rating update (one ``rate_1vs1`` per pair)."""
        matches: list[MatchResult] = []
        for pairing in self._pairings:
            valid_ids = {o.task.task_id for o in self._proposal_outcomes[pairing.teacher] if o.task is not None}
            mine = [a for a in attempts if a.agent == pairing.student and a.teacher == pairing.teacher
                    and a.task_id in valid_ids]
            n_correct = sum(a.correct for a in mine)
            p_hat = (n_correct / len(mine)) if (valid_ids and mine) else None
            outcome = match_outcome(p_hat, pairing.p_ts)
            self._ratings.record(pairing.teacher, pairing.student, outcome)
            matches.append(
                MatchResult(
                    teacher=pairing.teacher, student=pairing.student, p_ts=pairing.p_ts, p_hat=p_hat,
                    n_valid=len(valid_ids), n_attempts=len(mine), n_correct=n_correct, outcome=outcome,
                )
            )
        return matches

    def _summary(self, results: RoundResults, completion_rewards: SchemeRewards) -> dict[str, Any]:
        """The ``infos[a]["round"]`` summary (:func:`populora_env.metrics.round_summary`, and ``reward_terms``,
        each named term's mean per role, when the scheme named terms; shared by every agent's info: treat as
        read-only)."""
        valid = [o for t in self.teachers for o in self._proposal_outcomes[t] if o.valid and o.task is not None]
        programs = [o.task.program for o in valid if o.task is not None and o.task.task_type is not TaskType.INDUCTION]
        summary = round_summary(
            results, completion_rewards,
            reward_scheme=self.config.reward_scheme,
            task_types=[t.value for t in self.task_types],
            programs=programs,
            signatures=[o.signature for o in valid if o.signature],
            coverage=self._coverage,
            ratings=self._ratings.summary(),
            buffer_sizes=self._buffers.sizes(),
        )
        if completion_rewards.terms:
            summary["reward_terms"] = term_means(completion_rewards, self.teachers, self.students)
        return summary


def _plain(entry: object) -> object:
    """An action entry as the validator and the checker read it: a ``str`` subclass (a
    :class:`~populora_env.results.CompletionText`) becomes its plain text; anything else is left as it is."""
    return str.__str__(entry) if isinstance(entry, str) else entry


def _text_and_tokens(entry: object) -> tuple[str, int | None]:
    """An action entry's text (``""`` if it is no string) and the token count it carries (``None`` if none)."""
    return (str.__str__(entry) if isinstance(entry, str) else ""), num_tokens_of(entry)


def _proposal_info(outcome: ProposalOutcome) -> dict[str, Any]:
    return {
        "format_ok": outcome.format_ok,
        "valid": outcome.valid,
        "reason": None if outcome.reason is None else outcome.reason.value,
        "detail": outcome.detail,
        "task_id": outcome.request.task_id,
        "task_type": outcome.request.task_type.value,
        "tamper": outcome.tamper,
    }


def _attempt_info(attempt: AttemptResult, verdict: AttemptOutcome) -> dict[str, Any]:
    return {
        "format_ok": attempt.format_ok,
        "correct": attempt.correct,
        "reason": attempt.reason,
        "detail": verdict.detail,
        "task_id": attempt.task_id,
        "task_type": attempt.task_type,
        "teacher": attempt.teacher,
        "source": "match" if attempt.teacher is not None else "fill",
        "tamper": attempt.tamper,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    return value


def parallel_env(config: EnvConfig | None = None, **kwargs: Any) -> PopuLoRAParallelEnv:
    """Create the parallel env (see :class:`PopuLoRAParallelEnv` for the arguments)."""
    return PopuLoRAParallelEnv(config, **kwargs)


#: The raw (unwrapped) environment class, PettingZoo naming.
raw_env = PopuLoRAParallelEnv


def env(config: EnvConfig | None = None, **kwargs: Any) -> Any:
    """The AEC version (``pettingzoo.utils.parallel_to_aec`` of :func:`parallel_env`)."""
    from pettingzoo.utils.conversions import parallel_to_aec

    return parallel_to_aec(parallel_env(config, **kwargs))

