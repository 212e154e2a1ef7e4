"""The env's settings: one dataclass, one source of truth for their defaults and their validation.

:class:`EnvConfig` holds every setting of :class:`populora_env.env.PopuLoRAParallelEnv` that is plain data, with
the env's own defaults. The env is built from it (``PopuLoRAParallelEnv(config)`` or
``parallel_env(**overrides)``), and a training run embeds it unchanged as its ``env`` section, so a preset, a
command-line flag (``--env.samples-per-task 4``) and a Python caller all name the same fields.

:meth:`EnvConfig.validate` checks every value, nested ones included (the TrueSkill parameters, the reward
scheme's keyword arguments against its signature, finite and bounded time/memory limits, an upper bound on
the number of agents), and raises :class:`ConfigError` naming the field before any work starts. It is built
from the ``check_*`` helpers of :mod:`populora_env.checks` (re-exported here), as every config's is.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from populora_env import defaults
from populora_env.checks import (
    ConfigError,
    check,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_section,
)
from populora_env.matching import TrueSkillConfig
from populora_env.tasks import TaskType

TASK_TYPES: tuple[str, ...] = tuple(t.value for t in TaskType)

#: Upper bounds that no sensible run reaches; they turn a typo (``num_students=10**6``) into an error at once
#: instead of minutes of set-up.
MAX_AGENTS = 1024
MAX_PER_ROUND = 4096
MAX_TIMEOUT_S = 600.0
MAX_MEMORY_MB = 1 << 20
MAX_WORKERS = 1024
MAX_CHARS = 1 << 20

#: Classifications of a student answer whose payload cannot be parsed (EnvConfig.unparseable_answer).
UNPARSEABLE_ANSWER = ("format", "wrong")
#: Validation profiles of proposals (EnvConfig.validation; populora_env.validation).
VALIDATION_PROFILES = defaults.VALIDATION_PROFILES
#: Which hand-written seed tasks start the buffers (EnvConfig.hand_seeds; populora_env.seeds).
HAND_SEEDS = ("all", "identity")


@dataclass
class EnvConfig:
    """Settings of the teacher–student game (the env's own defaults; presets override what they need)."""

    num_teachers: int = 4
    """Teacher agents ``teacher_0..``."""
    num_students: int = 4
    """Student agents ``student_0..``."""
    tasks_per_teacher: int = 3
    """Proposals each teacher makes per round (task types assigned in turn); also the filler target per
    student."""
    samples_per_task: int = 8
    """Attempts each matched student makes at every valid task (they estimate the solve rate p̂)."""
    task_types: tuple[str, ...] = TASK_TYPES
    """Task types in play: deduction (predict the output), abduction (find an input), induction (write f)."""
    reward_scheme: str = "populora"
    """Registered reward scheme: 'populora' (cross-evaluation), 'azr' (learnability), or a plugin's."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the reward scheme, as JSON on the command line (e.g. '{"extreme_reward": -0.5}');
    checked against the scheme's signature."""
    references_k: int = 3
    """Reference tasks from the buffer shown in each deduction/abduction proposer prompt (AZR: 6)."""
    induction_inputs: int = defaults.INDUCTION_INPUTS
    """Inputs an induction proposal must give, half shown to the student and half hidden (AZR: 10)."""
    seed_tasks: int = 0
    """Seeding stage before the first training step: the base model (adapters off) proposes until every
    task-type buffer in play holds this many valid tasks, the hand-written seeds included (AZR: 256; deduction
    and abduction share one pool of programs, induction is seeded last from it). 0: the shipped hand-written
    seeds only."""
    seed_max_proposals: int = 0
    """Most proposals the base model may make per task type while seeding (0: 8 × seed_tasks). If a buffer is
    still short then, the run warns, names the type and its rejection reasons, and trains with what it has."""
    hand_seeds: str = "all"
    """Hand-written seed tasks the buffers start with: 'all' (the 23 shipped programs) or 'identity' (AZR's
    identity triplet only, ``f(a) = a`` with 'Hello world': with ``seed_tasks`` > 0 the base model proposes the
    rest of the seed set from it, as AZR's seeding does)."""
    buffer_cap: int = 4096
    """Maximum tasks per task-type buffer (FIFO, the newest kept)."""
    student_fill: bool = True
    """Top students up with buffer tasks (newest first) to tasks_per_teacher tasks when their matched teachers
    produced fewer valid ones; filler attempts never count towards p̂."""
    reject_duplicates: bool = defaults.REJECT_DUPLICATES
    """A proposal whose (type, program, input) is already buffered is invalid ('duplicate'; AZR accepts it)."""
    require_think: bool = defaults.REQUIRE_THINK
    """A well-formatted completion needs <think>…</think> before <answer>…</answer>."""
    lenient_answer_close: bool = defaults.LENIENT_ANSWER_CLOSE
    """Accept a completion whose final </answer> is missing (the answer then runs to the end of the text). A
    documented leniency for small models that close the answer's code fence and stop (docs/prompts.md); AZR
    requires the closing tag."""
    unparseable_answer: str = "format"
    """How a student's answer is classified when its tags are well formed but its payload cannot be parsed
    (deduction: not a Python expression; abduction: not an argument list; induction: the fenced block is not
    Python): 'format' (a format error, reason 'format', −1 under the built-in schemes) or 'wrong' (well
    formatted but wrong, reason 'parse_error', −0.5: AZR's classification, whose parser falls back to the whole
    answer text and counts a failed evaluation as a wrong answer; docs/azr.md §13.3). Missing tags, and an
    induction answer without any fenced block, are format errors either way (as in AZR)."""
    validation: str = defaults.VALIDATION_PROFILE
    """Proposal validation profile (populora_env.validation): 'strict' (literal inputs and outputs, helper
    functions and classes allowed next to ``def f``, this project's ban list, induction message optional) or
    'azr' (AZR's rules: exactly one top-level ``def`` — a single differently named one is renamed to ``f`` —
    inputs are Python expressions evaluated in the sandbox and kept as the ``repr`` of their values, AZR's ban
    list, induction message required). Both keep the sandbox, the two-run determinism check and the size
    limits."""
    prompts: str = "chat"
    """Registered prompt set (populora_env.prompts.list_prompt_sets()): the prompt texts, whether the chat
    template applies, the response prefix per prompt kind and the stop strings ('chat', 'r1', 'azr', 'small')."""
    max_program_chars: int = defaults.MAX_PROGRAM_CHARS
    """Longest program a proposal may contain ('too_long')."""
    max_input_chars: int = defaults.MAX_INPUT_CHARS
    """Longest input a proposal may contain ('too_long')."""
    max_message_chars: int = defaults.MAX_MESSAGE_CHARS
    """Longest induction message ('too_long')."""
    max_output_chars: int = defaults.MAX_OUTPUT_CHARS
    """Longest repr of a program's output; longer outputs are rejected ('output_too_large'), never cut."""
    timeout_s: float = 2.0
    """Sandbox wall-clock limit per program execution, seconds (applied to every job)."""
    memory_mb: int = 512
    """Sandbox memory limit per execution, MiB (the env's own sandbox)."""
    sandbox_workers: int = 2
    """Warm workers of the env's own sandbox."""
    trueskill: TrueSkillConfig = field(default_factory=TrueSkillConfig)
    """TrueSkill parameters of the ratings used for matching and evolution."""
    matching: str = "variance"
    """Registered PFSP weighting of a teacher's choice of student by the expected student-win probability p
    (populora_env.matching; `populora list matchings`): 'variance' p(1 − p), 'hard' (1 − p)², 'linear' 1 − p,
    'uniform', or a plugin's."""
    matching_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the matching weighting, as JSON."""
    matching_random: float = 0.0
    """Share ε of uniform random pairing mixed into the weighting's probabilities: (1 − ε)·f/Σf + ε/n."""

    def sandbox_limits(self) -> Any:
        """The :class:`~populora_env.sandbox.Limits` of the env's sandbox: ``timeout_s`` and ``memory_mb``, the
        sandbox's own defaults for the rest (the env's own sandbox and Ray's sandbox actors alike)."""
        from populora_env.sandbox import Limits

        return Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb)

    def validate(self, reward_scheme: Any = None, prompt_set: Any = None) -> None:
        """Check every setting; raise :class:`ConfigError` naming the first bad one.

        ``reward_scheme`` / ``prompt_set``: the objects actually used when the caller passed its own (a callable
        scheme, a :class:`~populora_env.prompts.PromptTemplates`) instead of registered names.
        """
        check_int("num_teachers", self.num_teachers, 1, MAX_AGENTS)
        check_int("num_students", self.num_students, 1, MAX_AGENTS)
        check(self.num_teachers + self.num_students <= MAX_AGENTS, "num_students",
              f"num_teachers + num_students must be <= {MAX_AGENTS}, got {self.num_teachers + self.num_students}")
        check_int("tasks_per_teacher", self.tasks_per_teacher, 1, MAX_PER_ROUND)
        check_int("samples_per_task", self.samples_per_task, 1, MAX_PER_ROUND)
        check(isinstance(self.task_types, tuple | list) and len(self.task_types) > 0, "task_types",
              f"must be a non-empty list of {TASK_TYPES}, got {self.task_types!r}")
        seen: set[str] = set()
        for t in self.task_types:
            name = t.value if isinstance(t, TaskType) else t
            check(name in TASK_TYPES, "task_types", f"unknown task type {t!r} (known: {', '.join(TASK_TYPES)})")
            check(name not in seen, "task_types", f"{name!r} appears twice")
            seen.add(name)
        check_int("references_k", self.references_k, 0, 64)
        check_int("induction_inputs", self.induction_inputs, 2, 64)
        check_int("buffer_cap", self.buffer_cap, 1, 1 << 24)
        check_int("seed_tasks", self.seed_tasks, 0, 1 << 20)
        check_int("seed_max_proposals", self.seed_max_proposals, 0, 1 << 24)
        check(self.seed_tasks <= self.buffer_cap, "seed_tasks",
              f"must be <= buffer_cap ({self.buffer_cap}), got {self.seed_tasks}")
        for name in ("student_fill", "reject_duplicates", "require_think", "lenient_answer_close"):
            check_bool(name, getattr(self, name))
        check_choice("hand_seeds", self.hand_seeds, HAND_SEEDS)
        check_choice("validation", self.validation, VALIDATION_PROFILES)
        check_choice("unparseable_answer", self.unparseable_answer, UNPARSEABLE_ANSWER)
        check_int("max_program_chars", self.max_program_chars, 16, MAX_CHARS)
        check_int("max_input_chars", self.max_input_chars, 1, MAX_CHARS)
        check_int("max_message_chars", self.max_message_chars, 0, MAX_CHARS)
        check_int("max_output_chars", self.max_output_chars, 1, MAX_CHARS)
        check_number("timeout_s", self.timeout_s, low=0.0, high=MAX_TIMEOUT_S, low_open=True)
        check_int("memory_mb", self.memory_mb, 16, MAX_MEMORY_MB)
        check_int("sandbox_workers", self.sandbox_workers, 1, MAX_WORKERS)
        check(isinstance(self.trueskill, TrueSkillConfig), "trueskill",
              f"must be a TrueSkillConfig, got {self.trueskill!r}")
        check_section("trueskill.", self.trueskill)
        self._validate_matching()
        self._validate_prompts(prompt_set)
        self._validate_reward(reward_scheme)

    def _validate_matching(self) -> None:
        """The PFSP weighting's name and kwargs against its registry, and the random share in [0, 1]."""
        from populora_env.matching import get_matching

        check(isinstance(self.matching_kwargs, Mapping), "matching_kwargs",
              f"must be a JSON object, got {self.matching_kwargs!r}")
        try:
            get_matching(self.matching).resolve_params(self.matching_kwargs)
        except KeyError as exc:  # UnknownEntryError: the message lists the known weightings
            raise ConfigError("matching", str(exc)) from None
        except ValueError as exc:
            raise ConfigError("matching_kwargs", str(exc)) from None
        check_number("matching_random", self.matching_random, low=0.0, high=1.0)

    def _validate_prompts(self, prompt_set: Any) -> None:
        from populora_env.prompts import get_prompt_set

        if prompt_set is None:
            check(isinstance(self.prompts, str), "prompts", f"must be a prompt-set name, got {self.prompts!r}")
            try:
                prompt_set = get_prompt_set(self.prompts)
            except KeyError as exc:
                raise ConfigError("prompts", str(exc)) from None
        try:
            prompt_set.validate()
        except ValueError as exc:
            raise ConfigError("prompts", str(exc)) from None

    def _validate_reward(self, scheme: Any) -> None:
        from populora_env.rewards import get_reward_scheme

        if scheme is None:
            check(isinstance(self.reward_scheme, str), "reward_scheme",
                  f"must be a registered name, got {self.reward_scheme!r}")
            try:
                scheme = get_reward_scheme(self.reward_scheme)
            except KeyError as exc:
                raise ConfigError("reward_scheme", str(exc)) from None
        check(isinstance(self.reward_kwargs, Mapping), "reward_kwargs",
              f"must be a mapping, got {self.reward_kwargs!r}")
        check(all(isinstance(k, str) for k in self.reward_kwargs), "reward_kwargs", "keys must be strings")
        try:
            signature = inspect.signature(scheme)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
            return
        try:
            signature.bind(None, **self.reward_kwargs)
        except TypeError as exc:
            params = [p for p in list(signature.parameters)[1:]]
            raise ConfigError(
                "reward_kwargs",
                f"{exc} (scheme {getattr(scheme, '__name__', scheme)!r} takes: {', '.join(params) or 'nothing'})",
            ) from None


def seed_proposal_budget(cfg: EnvConfig) -> int:
    """Most proposals per task type of the seeding stage (``seed_max_proposals``, default 8 × ``seed_tasks``)."""
    return cfg.seed_max_proposals or 8 * cfg.seed_tasks


def env_config(config: EnvConfig | None = None, **overrides: Any) -> EnvConfig:
    """``config`` (default :class:`EnvConfig`) with ``overrides`` applied; unknown names raise
    :class:`ConfigError` listing the known ones. ``trueskill`` may be a dict of its fields. Not validated."""
    base = config if config is not None else EnvConfig()
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(unknown[0], f"unknown env setting (known: {', '.join(sorted(names))})")
    if isinstance(overrides.get("trueskill"), Mapping):
        try:
            overrides["trueskill"] = TrueSkillConfig(**dict(overrides["trueskill"]))
        except TypeError as exc:
            raise ConfigError("trueskill", str(exc)) from None
    if "task_types" in overrides and isinstance(overrides["task_types"], list):
        overrides["task_types"] = tuple(overrides["task_types"])
    if overrides.get("reward_kwargs") is None and "reward_kwargs" in overrides:
        overrides["reward_kwargs"] = {}
    return dataclasses.replace(base, **overrides)
