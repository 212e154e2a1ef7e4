"""TensorBoard logging of a training step, read from the typed :class:`~selfplay.loop.StepRecord`.

Tag names come from :mod:`selfplay.tags` (the report reads the same constants). Rates are computed from the
round's records (:class:`populora_env.RoundResults`), roles from the agent mapping, rewards from the round's
per-completion rewards. Everything per role is measured on that role's completions only, so the single-agent
baseline's proposer (teacher) and solver (student) stay apart: rewards and lengths from the records, entropy
from the trainer's per-role metric ``entropy/<role>``.

Everything is a scalar at ``global_step`` = step, including the teacher × student pair counts, so a resumed
run's writer (``purge_step``) drops the replayed steps of every diagnostic alike.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from populora_env.results import RoundResults
from selfplay import tags
from selfplay.loop import StepRecord
from selfplay.tamper import tampering

log = logging.getLogger(__name__)


def _mean(xs: Iterable[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(vals)) if vals else None


def hparams_markdown(cfg_dict: Mapping[str, Any]) -> str:
    """A ``|param|value|`` markdown table of a (flattened) config."""

    def flat(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
        out = []
        for k, v in d.items():
            if isinstance(v, Mapping):
                out += flat(v, prefix + k + ".")
            else:
                out.append((prefix + k, v))
        return out

    rows = "\n".join(f"|{k}|{v}|" for k, v in flat(cfg_dict))
    return "|param|value|\n|-|-|\n" + rows


def step_scalars(record: StepRecord) -> dict[str, float]:
    """Every scalar tag of one step, by family."""
    results = record.outcome.results
    out = _reward_scalars(record)
    out.update(_student_scalars(results))
    out.update(_teacher_scalars(results))
    out.update(_rating_scalars(record.outcome.ratings))
    out.update(_program_scalars(record.outcome.summary.get("metrics") or {}))
    out.update(_update_scalars(record.member_metrics))
    out.update(tamper_scalars(record))
    for name, by_role in (record.outcome.summary.get("reward_terms") or {}).items():
        for role, value in by_role.items():
            out[tags.reward_term(role, name)] = float(value)
    for phase, seconds in record.times.items():
        out[tags.STEP_SECONDS if phase == "step" else tags.time(phase)] = float(seconds)
    out[tags.REPLACEMENTS] = float(len(record.evolution))
    for key, value in record.pipeline.items():
        out[tags.pipeline(key)] = float(value)
    for role, n in record.dropped_prompts.items():
        out[tags.dropped_prompts(role)] = float(n)
    for phase, n in record.memory.items():
        out[tags.memory(phase)] = n / 2**30
    return out


def _reward_scalars(record: StepRecord) -> dict[str, float]:
    """Rewards and response lengths: per agent, and per role (means over the role's completions)."""
    out: dict[str, float] = {}
    roles = record.mapping.agent_roles
    agent_rewards: dict[str, list[float]] = defaultdict(list)
    agent_lengths: dict[str, list[int]] = defaultdict(list)
    for (agent, index), c in record.completions.items():
        agent_lengths[agent].append(len(c.token_ids))
        agent_rewards[agent].append(record.outcome.reward(agent, index))
    for agent in agent_rewards:
        out[tags.member(agent, "reward")] = float(np.mean(agent_rewards[agent]))
        out[tags.member(agent, "response_length")] = float(np.mean(agent_lengths[agent]))
    for role, reward_tag in (("teacher", tags.TEACHER_REWARD), ("student", tags.STUDENT_REWARD)):
        rewards = [r for a, rs in agent_rewards.items() if roles.get(a) == role for r in rs]
        lengths = [n for a, ns in agent_lengths.items() if roles.get(a) == role for n in ns]
        if rewards:
            out[reward_tag] = float(np.mean(rewards))
            out[tags.response_length(role)] = float(np.mean(lengths))
    return out


def _student_scalars(results: RoundResults) -> dict[str, float]:
    """Students: solve rate on matched tasks (filler apart), format and correct rates (also per task type), and
    the teacher x student matrix (each matched pair's attempts at the teacher's tasks and correct ones)."""
    out: dict[str, float] = {}
    matched = [a for a in results.attempts if a.matched]
    filler = [a for a in results.attempts if not a.matched]
    if matched:
        out[tags.SOLVE_RATE] = sum(a.correct for a in matched) / len(matched)
    if filler:
        out[tags.FILLER_SOLVE_RATE] = sum(a.correct for a in filler) / len(filler)
    if results.attempts:
        out[tags.STUDENT_FORMAT_RATE] = sum(a.format_ok for a in results.attempts) / len(results.attempts)
        out[tags.STUDENT_CORRECT_RATE] = sum(a.correct for a in results.attempts) / len(results.attempts)
        attempts_by_type: dict[str, list] = defaultdict(list)
        for a in results.attempts:
            attempts_by_type[a.task_type].append(a)
        for task_type, attempts in attempts_by_type.items():  # per type: a drifting type mix is told apart
            out[tags.student_format_rate(task_type)] = sum(a.format_ok for a in attempts) / len(attempts)
            out[tags.student_correct_rate(task_type)] = sum(a.correct for a in attempts) / len(attempts)
    p_hats = [p for p in (results.solve_rate(x.task_id) for x in results.proposals if x.valid) if p is not None]
    if p_hats:
        counts = {"zero": sum(p == 0.0 for p in p_hats), "one": sum(p == 1.0 for p in p_hats)}
        counts["partial"] = len(p_hats) - counts["zero"] - counts["one"]
        out.update({tags.P_HAT_COUNTS[k]: float(n) for k, n in counts.items()})
    for match in results.matches:
        out[tags.pair(match.teacher, match.student, "attempts")] = float(match.n_attempts)
        out[tags.pair(match.teacher, match.student, "correct")] = float(match.n_correct)
    return out


def _teacher_scalars(results: RoundResults) -> dict[str, float]:
    """Teachers: validity, overall, per task type and per rejection reason."""
    out: dict[str, float] = {}
    if not results.proposals:
        return out
    out[tags.VALID_RATE] = sum(p.valid for p in results.proposals) / len(results.proposals)
    by_type: dict[str, list[bool]] = defaultdict(list)
    reasons: dict[str, int] = defaultdict(int)
    for p in results.proposals:
        by_type[p.task_type].append(p.valid)
        reasons["valid" if p.valid else (p.reason or "invalid")] += 1
    for task_type, vs in by_type.items():
        out[tags.valid_rate(task_type)] = sum(vs) / len(vs)
    for reason, n in reasons.items():
        out[tags.validity(reason)] = float(n)
    return out


def tamper_scalars(record: StepRecord) -> dict[str, float]:
    """Tampering (:func:`selfplay.tamper.tampering`): per member its completions that tripped a sandbox defence (every
    member, 0 included), per role and defence class those that did (only classes that occurred), and their total."""
    found = tampering(record)
    per_member = Counter(t.member for t in found)
    out = {tags.tamper(m): float(per_member.get(m, 0)) for m in (*record.mapping.members, *per_member)}
    for (role, cls), n in Counter((t.role, t.cls) for t in found).items():
        out[tags.tamper_class(role, cls)] = float(n)
    out[tags.TAMPER_TOTAL] = float(len(found))
    return out


def _rating_scalars(ratings: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Each agent's rating: mu, sigma and the conservative mu - 3 sigma."""
    out: dict[str, float] = {}
    for agent, (mu, sigma) in ratings.items():
        out[tags.member(agent, "mu")] = float(mu)
        out[tags.member(agent, "sigma")] = float(sigma)
        out[tags.member(agent, "conservative")] = float(mu) - 3.0 * float(sigma)
    return out


def _program_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The round's program complexity (means, only over rounds that produced valid programs) and coverage."""
    out: dict[str, float] = {}
    if metrics.get("n_programs"):
        for key in tags.PROGRAM_KEYS:
            if metrics.get(f"{key}_mean") is not None:
                out[tags.program(key)] = float(metrics[f"{key}_mean"])
    for key in tags.COVERAGE_KEYS:
        if metrics.get(key) is not None:
            out[tags.program(key)] = float(metrics[key])
    return out


def _update_scalars(members: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The updates: each member's trainer metrics, the losses and the zero-std fraction averaged over members,
    and per role the members' entropy over that role's tokens only (trainer metric ``entropy/<role>``)."""
    out: dict[str, float] = {}
    for m, mm in members.items():
        for key in (*tags.MEMBER_KEYS, tags.SYNC, *tags.MISMATCH_KEYS, *tags.IS_KEYS, *tags.PIPELINE_MEMBER_KEYS):
            if mm.get(key) is not None:
                out[tags.member(m, key)] = float(mm[key])
    for tag, key in tags.LOSS_KEYS.items():
        v = _mean(mm.get(key) for mm in members.values())
        if v is not None:
            out[tags.loss(tag)] = v
    v = _mean(mm.get("frac_reward_zero_std") for mm in members.values())
    if v is not None:
        out[tags.FRAC_REWARD_ZERO_STD] = v
    for role in tags.ROLES:
        v = _mean(mm.get(f"entropy/{role}") for mm in members.values())
        if v is not None:
            out[tags.entropy(role)] = v
    out.update(zero_advantage_scalars(members))
    return out


def zero_advantage_scalars(members: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per role with rows in the step's updates: 1.0 when the largest |advantage| over them (the trainer's
    ``advantage_abs_max/<role>``, every updated member) is 0, else 0.0."""
    out: dict[str, float] = {}
    for role in tags.ROLES:
        values = [float(mm[f"advantage_abs_max/{role}"]) for mm in members.values()
                  if mm.get(f"advantage_abs_max/{role}") is not None]
        if values:
            out[tags.zero_advantage(role)] = float(max(values) == 0.0)
    return out


def samples_markdown(record: StepRecord, role: str, limit: int) -> str | None:
    """A few prompt / completion / reward samples of one role as markdown."""
    parts = []
    for (agent, index), c in sorted(record.completions.items()):
        if record.mapping.agent_roles.get(agent) != role:
            continue
        reward = record.outcome.reward(agent, index)
        parts.append(f"**{agent}** #{index} reward={reward}\n\n```\n{c.text[:2000]}\n```")
        if len(parts) >= limit:
            break
    return "\n\n".join(parts) if parts else None


def tensorboard_writer(run_dir: Any, purge_step: int | None = None) -> SummaryWriter:
    """A TensorBoard writer of the run directory whose event file's name ends in a random token: the name
    TensorBoard gives (``events.out.tfevents.<time>.<host>.<pid>.<n>``) can be guessed, and the writer opens it
    following symbolic links, so a link planted under that name would be written through. TensorBoard reads
    every ``events.out.tfevents*`` file, whatever its suffix."""
    return SummaryWriter(str(run_dir), purge_step=purge_step, filename_suffix=f".{secrets.token_hex(8)}")


class TensorBoardLogger:
    """Writes each step's scalars and samples under the run directory."""

    def __init__(self, run_dir: str, purge_step: int | None = None):
        self.writer = tensorboard_writer(run_dir, purge_step)
        self.zero_advantage_warned: set[str] = set()
        """Roles already warned about all-zero advantages (once per run's process)."""

    def log_hparams(self, cfg_dict: Mapping[str, Any]) -> None:
        self.writer.add_text(tags.HYPERPARAMETERS, hparams_markdown(cfg_dict), 0)

    def log_step(self, record: StepRecord) -> dict[str, float]:
        """Write (and return) the step's scalars."""
        scalars = step_scalars(record)
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, record.step)
        self.writer.flush()
        self._warn_zero_advantage(record.step, scalars)
        return scalars

    def _warn_zero_advantage(self, step: int, scalars: Mapping[str, float]) -> None:
        """One warning per role, the first step whose advantages of that role are all zero."""
        for role in tags.ROLES:
            if scalars.get(tags.zero_advantage(role)) == 1.0 and role not in self.zero_advantage_warned:
                self.zero_advantage_warned.add(role)
                log.warning("step %d: every %s advantage is zero, so the %ss learn nothing from it (their "
                            "rewards were equal within each group: a tiny-random run, for one, writes no valid task); "
                            "TensorBoard %s tracks it per step (warned once per run)", step, role, role,
                            tags.zero_advantage(role))

    def log_samples(self, record: StepRecord, limit: int) -> None:
        """Write up to ``limit`` completions per role as text."""
        for role in ("teacher", "student"):
            md = samples_markdown(record, role, limit) if limit else None
            if md:
                self.writer.add_text(tags.samples(role), md, record.step)
        self.writer.flush()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()
