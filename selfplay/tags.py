"""TensorBoard tag names of a run: defined here once, written by :mod:`selfplay.logger`, read by the report.

Scalars are logged at ``global_step`` = training step. Families (CleanRL/TRL style):

- ``charts/``: the headline curves (solve rate on matched tasks, rewards, validity, lengths, entropy, step time,
  ``charts/zero_advantage/<role>``: whether a role's advantages were all zero);
- ``population/<agent or member>/``: per-agent ratings, rewards and lengths; per-member update metrics;
- ``losses/``: update metrics averaged over the members updated this step;
- ``programs/``: complexity of the valid programs and coverage of the task distribution;
- ``validity/<reason>``: proposals with that outcome this step (``validity/valid`` for valid ones);
- ``time/<phase>``: seconds per phase of the step;
- ``memory/<phase>``: peak GPU memory (GiB) per phase of the step (CUDA runs only);
- ``evolution/replacements``: members replaced by the PBT step;
- ``pipeline/<key>``: an asynchronous run's per-step counters (``pipeline.max_staleness >= 1``);
- ``generation/dropped_prompts/<role>``: prompts over the length limit dropped before generation this step;
- ``pairs/<teacher>/<student>/{attempts,correct}``: the matched pair's attempts and correct ones this step
  (the teacher × student solve-rate matrix of the report);
- ``tamper/<member>`` and ``tamper/<role>/<class>``: completions whose run tripped a sandbox defence this step,
  per member and per role and defence class (``charts/tamper``: all of them);
- ``rewards/<role>/<term>``: the mean per role of a named term of the reward scheme
  (:class:`populora_env.rewards.SchemeRewards`; only for a scheme that names its terms);
- text: ``samples/<role>`` and ``hyperparameters``.

Every family has a builder (``member(name, key)``) and, where the report discovers names from the logged tags,
a parser (``parse_member(tag) -> (name, key)``), so no other module spells a tag.
"""

from __future__ import annotations

ROLES = ("teacher", "student")
"""The two roles; the single-agent baseline's member plays both (teacher = proposer, student = solver)."""

# ------------------------------------------------------------------------------------------- charts/
SOLVE_RATE = "charts/student_solve_rate"
"""Fraction of correct attempts at the students' matched teachers' tasks (filler attempts excluded)."""
FILLER_SOLVE_RATE = "charts/filler_solve_rate"
"""Fraction of correct attempts at filler tasks drawn from the buffers (only logged when there were any)."""
STUDENT_FORMAT_RATE = "charts/student_format_rate"
"""Fraction of student attempts that were well formatted."""
STUDENT_CORRECT_RATE = "charts/student_correct_rate"
"""Fraction of all student attempts (matched and filler) that were correct."""
TEACHER_REWARD = "charts/teacher_reward"
"""Mean reward over every teacher completion of the step."""
STUDENT_REWARD = "charts/student_reward"
"""Mean reward over every student completion of the step."""
VALID_RATE = "charts/valid_rate"
"""Fraction of proposals that became tasks."""
FRAC_REWARD_ZERO_STD = "charts/frac_reward_zero_std"
"""Mean over updated members of the fraction of groups whose rewards are all equal."""
STEP_SECONDS = "charts/step_seconds"
"""Wall time of the step (generation, sandbox, update, evolution)."""
P_HAT_COUNTS = {"zero": "charts/tasks_p_hat_0", "partial": "charts/tasks_p_hat_partial", "one": "charts/tasks_p_hat_1"}
"""The step's valid tasks attempted by their matched student, by p̂: never solved (p̂ = 0), solved at some
attempts (0 < p̂ < 1: the learnable ones), at every attempt (p̂ = 1); only logged when there was one."""
TAMPER_TOTAL = "charts/tamper"
"""Completions of the step (proposals and attempts, every member) whose run tripped a sandbox defence: the sum of
the :func:`tamper` counts (``run_summary.json``'s ``tamper``, what ``populora compare`` carries)."""


def valid_rate(task_type: str) -> str:
    """Valid fraction of the proposals of one task type."""
    return f"{VALID_RATE}/{task_type}"


def parse_valid_rate(tag: str) -> str | None:
    """The task type of a :func:`valid_rate` tag, else ``None``."""
    return _suffix(tag, f"{VALID_RATE}/")


def student_format_rate(task_type: str) -> str:
    """Well-formatted fraction of the student attempts (matched and filler) at tasks of one type."""
    return f"{STUDENT_FORMAT_RATE}/{task_type}"


def student_correct_rate(task_type: str) -> str:
    """Correct fraction of the student attempts (matched and filler) at tasks of one type."""
    return f"{STUDENT_CORRECT_RATE}/{task_type}"


ZERO_ADVANTAGE_PREFIX = "charts/zero_advantage/"


def zero_advantage(role: str) -> str:
    """1 when every advantage of one role's rows in the step's updates is zero (its learners got no signal: the
    rewards of each group were equal, or the scheme paid nothing), else 0; logged at every step with an update of
    that role (the trainer's ``advantage_abs_max/<role>``, so the baseline's proposer and solver stay apart). The
    run warns once, the first time it is 1."""
    return f"{ZERO_ADVANTAGE_PREFIX}{role}"


def response_length(role: str) -> str:
    """Mean completion length in tokens of one role (``teacher``/``student``)."""
    return f"charts/response_length/{role}"


def entropy(role: str) -> str:
    """Token entropy of one role: per member, the mean of H_t over that role's completion tokens in its update
    (the trainer's ``entropy/<role>``, so a member playing both roles is split), averaged over the members."""
    return f"charts/entropy/{role}"


# --------------------------------------------------------------------------------------- population/
RATING_KEYS = ("mu", "sigma", "conservative")
AGENT_KEYS = ("reward", "response_length")
MEMBER_KEYS = ("loss", "entropy", "grad_norm")
MISMATCH_ABS_MEAN = "mismatch_abs_mean"
"""Member key: mean |log pi_trainer - log pi_generator| over the completion tokens of the member's update (the
trainer's log-probs before its first optimizer step against the log-probs the generator sampled with;
``agents.trainer``)."""
MISMATCH_ABS_MAX = "mismatch_abs_max"
"""Member key: the largest |log pi_trainer - log pi_generator| over those tokens."""
MISMATCH_KL = "mismatch_kl"
"""Member key: mean over those tokens of exp(d) - 1 - d, d = log pi_trainer - log pi_generator: the k3 estimate
of KL(generator || trainer) from the generator's samples (prime-rl's name)."""
MISMATCH_KEYS = (MISMATCH_ABS_MEAN, MISMATCH_ABS_MAX, MISMATCH_KL)
"""The rollout/trainer mismatch, logged per member as ``population/<member>/<key>`` at every update whose
rollouts carry the generator's log-probs (always with the HF and vLLM engines)."""
IS_KEYS = ("is_weight_mean", "is_capped_frac")
"""Member keys of ``trainer.is_correction`` (tis/mis): the mean importance weight pi_old/mu over the update's
tokens and the fraction above ``trainer.is_cap`` (truncated or masked)."""
SYNC = "sync"
"""Member key of the trainer-vs-engine log-prob gap: mean |log pi_trainer - log pi_engine| over the completion
tokens of a few of the member's rollouts, scored with the weights that should have generated them (logged by
``--backend ray`` every step for every updated member; float rounding is ~1e-6, a stale engine far more)."""


STALENESS = "staleness"
"""Member key of an asynchronous run: the mean over the member's rollouts of the updates between the adapter
version that generated each one and the version its update trained (0: on-policy; at most
``pipeline.max_staleness``)."""
STALENESS_MAX = "staleness_max"
"""Member key of an asynchronous run: the largest staleness among the member's rollouts of the step."""
PIPELINE_MEMBER_KEYS = (STALENESS, STALENESS_MAX)
"""Member keys an asynchronous run adds (the trainer's metrics of the same names)."""


MEMBER_PREFIX = "population/"


def member(name: str, key: str) -> str:
    """``population/<agent or member>/<key>``: ``mu``, ``sigma``, ``conservative`` (μ − 3σ), ``reward``,
    ``response_length`` per agent; ``loss``, ``entropy``, ``grad_norm`` per member."""
    return f"{MEMBER_PREFIX}{name}/{key}"


def parse_member(tag: str) -> tuple[str, str] | None:
    """``(name, key)`` of a :func:`member` tag, else ``None``."""
    rest = _suffix(tag, MEMBER_PREFIX)
    if rest is None:
        return None
    name, sep, key = rest.partition("/")
    return (name, key) if sep and name and key else None


# ------------------------------------------------------------------------------------------- losses/
LOSS_KEYS = {"policy_loss": "loss", "grad_norm": "grad_norm", "clip_frac": "clip_frac", "entropy": "entropy"}
"""``losses/<tag>`` -> the trainer metric it averages."""


def loss(tag: str) -> str:
    """``losses/<tag>`` (``policy_loss``, ``grad_norm``, ``clip_frac``, ``entropy``)."""
    return f"losses/{tag}"


# ----------------------------------------------------------------------------------------- programs/
PROGRAM_KEYS = ("ast_depth", "cyclomatic", "loc", "variables")
COVERAGE_KEYS = ("coverage_programs", "coverage_signatures")


def program(key: str) -> str:
    """``programs/<key>``: a complexity mean or a coverage count."""
    return f"programs/{key}"


# -------------------------------------------------------------------------------------- the others
VALIDITY_PREFIX = "validity/"
TIME_PREFIX = "time/"
PAIRS_PREFIX = "pairs/"
PAIR_KEYS = ("attempts", "correct")
TIME_PHASES = ("generation", "sandbox", "update", "evolution", "checkpoint")
REPLACEMENTS = "evolution/replacements"
PIPELINE_PREFIX = "pipeline/"
DISCARDED = "discarded_rollouts"
"""Pipeline key: rollouts of this step's round that no update used, because PBT replaced their member after they
were generated (``selfplay.pipeline``)."""
PIPELINE_KEYS = (DISCARDED,)
DROPPED_PROMPTS = "generation/dropped_prompts"
MEMORY_PREFIX = "memory/"


def memory(phase: str) -> str:
    """Peak GPU memory (GiB) the run's tensors held during ``phase`` of this step (CUDA runs only)."""
    return f"{MEMORY_PREFIX}{phase}"


def dropped_prompts(role: str) -> str:
    """Prompts of ``role`` over ``generation.max_prompt_tokens`` dropped before generation this step (logged every
    step when the limit is set)."""
    return f"{DROPPED_PROMPTS}/{role}"


HYPERPARAMETERS = "hyperparameters"


def validity(reason: str) -> str:
    """Proposals with outcome ``reason`` (``valid`` or a rejection reason code) this step."""
    return f"{VALIDITY_PREFIX}{reason}"


def parse_validity(tag: str) -> str | None:
    """The reason of a :func:`validity` tag, else ``None``."""
    return _suffix(tag, VALIDITY_PREFIX)


def time(phase: str) -> str:
    """Seconds spent in ``phase`` this step."""
    return f"{TIME_PREFIX}{phase}"


def parse_time(tag: str) -> str | None:
    """The phase of a :func:`time` tag, else ``None``."""
    return _suffix(tag, TIME_PREFIX)


def pair(teacher: str, student: str, key: str) -> str:
    """``pairs/<teacher>/<student>/<key>``: the pair's matched ``attempts`` (the student's attempts at the
    teacher's valid tasks) or ``correct`` ones this step; logged for every pair matched this step (0 attempts
    when the teacher had no valid task)."""
    return f"{PAIRS_PREFIX}{teacher}/{student}/{key}"


def parse_pair(tag: str) -> tuple[str, str, str] | None:
    """``(teacher, student, key)`` of a :func:`pair` tag, else ``None``."""
    rest = _suffix(tag, PAIRS_PREFIX)
    parts = rest.split("/") if rest is not None else []
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and parts[2] in PAIR_KEYS else None


TAMPER_PREFIX = "tamper/"


def tamper(member: str) -> str:
    """``tamper/<member>``: the member's completions this step (its proposals and attempts, both roles of a member
    that plays two) whose run tripped a sandbox defence (result field ``tamper`` set); logged every step for every
    member, 0 included."""
    return f"{TAMPER_PREFIX}{member}"


def tamper_class(role: str, cls: str) -> str:
    """``tamper/<role>/<class>``: the role's completions this step that tripped the defence of class ``cls``
    (``introspection``, ``signal``, ...); logged at the steps where there were some."""
    return f"{TAMPER_PREFIX}{role}/{cls}"


def parse_tamper(tag: str) -> str | None:
    """The member of a :func:`tamper` tag, else ``None`` (a member's name holds no ``/``)."""
    rest = _suffix(tag, TAMPER_PREFIX)
    return rest if rest is not None and "/" not in rest else None


def parse_tamper_class(tag: str) -> tuple[str, str] | None:
    """``(role, class)`` of a :func:`tamper_class` tag, else ``None``."""
    rest = _suffix(tag, TAMPER_PREFIX)
    role, sep, cls = (rest or "").partition("/")
    return (role, cls) if sep and role in ROLES and cls and "/" not in cls else None


def pipeline(key: str) -> str:
    """``pipeline/<key>``: an asynchronous run's per-step counter (:data:`PIPELINE_KEYS`)."""
    return f"{PIPELINE_PREFIX}{key}"


def samples(role: str) -> str:
    """Text tag of prompt/completion samples of one role."""
    return f"samples/{role}"


def _suffix(tag: str, prefix: str) -> str | None:
    return tag[len(prefix):] if tag.startswith(prefix) and len(tag) > len(prefix) else None


REWARD_TERM_PREFIX = "rewards/"


def reward_term(role: str, name: str) -> str:
    """The mean over a role's completions of the reward scheme's term ``name`` this step."""
    return f"{REWARD_TERM_PREFIX}{role}/{name}"
