"""TensorBoard tag names of a run: defined here once, written by :mod:`selfplay.logger`, read by the report.

Scalars are logged at ``global_step`` = training step. Families (CleanRL/TRL style):

- ``charts/``: the headline curves (solve rate on matched tasks, rewards, validity, lengths, entropy, step time);
- ``population/<agent or member>/``: per-agent ratings, rewards and lengths; per-member update metrics;
- ``losses/``: update metrics averaged over the members updated this step;
- ``programs/``: complexity of the valid programs and coverage of the task distribution;
- ``validity/<reason>``: proposals with that outcome this step (``validity/valid`` for valid ones);
- ``time/<phase>``: seconds per phase of the step;
- ``evolution/replacements``: members replaced by the PBT step;
- text: ``samples/<role>`` and ``hyperparameters``.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------------- charts/
SOLVE_RATE = "charts/student_solve_rate"
"""Fraction of correct attempts at the students' matched teachers' tasks (filler attempts excluded)."""
FILLER_SOLVE_RATE = "charts/filler_solve_rate"
"""Fraction of correct attempts at filler tasks drawn from the buffers (only logged when there were any)."""
STUDENT_FORMAT_RATE = "charts/student_format_rate"
"""Fraction of student attempts that were well formatted."""
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


def valid_rate(task_type: str) -> str:
    """Valid fraction of the proposals of one task type."""
    return f"{VALID_RATE}/{task_type}"


def response_length(role: str) -> str:
    """Mean completion length in tokens of one role (``teacher``/``student``)."""
    return f"charts/response_length/{role}"


def entropy(role: str) -> str:
    """Mean token entropy of the updates of one role's members."""
    return f"charts/entropy/{role}"


# --------------------------------------------------------------------------------------- population/
RATING_KEYS = ("mu", "sigma", "conservative")
AGENT_KEYS = ("reward", "response_length")
MEMBER_KEYS = ("loss", "entropy", "grad_norm")


def member(name: str, key: str) -> str:
    """``population/<agent or member>/<key>``: ``mu``, ``sigma``, ``conservative`` (μ − 3σ), ``reward``,
    ``response_length`` per agent; ``loss``, ``entropy``, ``grad_norm`` per member."""
    return f"population/{name}/{key}"


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
TIME_PHASES = ("generation", "sandbox", "update", "evolution", "checkpoint")
REPLACEMENTS = "evolution/replacements"
HYPERPARAMETERS = "hyperparameters"


def validity(reason: str) -> str:
    """Proposals with outcome ``reason`` (``valid`` or a rejection reason code) this step."""
    return f"{VALIDITY_PREFIX}{reason}"


def time(phase: str) -> str:
    """Seconds spent in ``phase`` this step."""
    return f"{TIME_PREFIX}{phase}"


def samples(role: str) -> str:
    """Text tag of prompt/completion samples of one role."""
    return f"samples/{role}"
