"""Numbers derived from a loaded run: series, smoothing, headline statistics, validity and timing
breakdowns, evaluation entries, the teacher × student solve-rate matrix per window of steps and the
retention of evolved children.

Every tag is built or recognised through :mod:`selfplay.tags` (the names the training loop writes).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluation.report.loading import RunData
from selfplay import tags

# headline windows
LAST_N = 10  # "last-10 mean"
EDGE_FRACTION = 0.1  # "first 10% vs last 10%" of the logged points
OSC_EMA = 0.9  # EMA weight of the solve-rate oscillation diagnostic (docs/method.md §10)
OSC_WINDOW = 50  # sign changes are reported per this many steps
VALIDITY_BINS = 100  # the validity stack is drawn over at most this many step bins
PAIR_WINDOWS = 3  # the teacher x student matrix is drawn for the first, middle and last third of the steps
RETENTION_KS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Steps after birth at which a child's rank is tabulated (those a run reached)."""


def smooth(values: Sequence[float] | np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average with ``weight`` on the past.

    s_n = w s_{n-1} + (1 - w) x_n with s_0 = 0, reported as s_n / (1 - w^n) (n = finite points so far).
    Non-finite values are passed through as NaN and do not enter the average. ``weight`` 0 returns the
    values unchanged.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out = np.full(len(values), np.nan)
    last, n = 0.0, 0
    for i, v in enumerate(values):
        v = float(v)
        if not math.isfinite(v):
            continue
        last = last * weight + (1.0 - weight) * v
        n += 1
        out[i] = last / (1.0 - weight**n)
    return out


def series(run: RunData, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """Finite points of ``tag`` as (steps, values); empty arrays when not logged."""
    points = [(s, v) for s, v in run.scalars.get(tag, ()) if math.isfinite(v)]
    if not points:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    steps, values = zip(*points, strict=True)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)


def has(run: RunData, tag: str) -> bool:
    return len(series(run, tag)[1]) > 0


def final_and_last_mean(values: np.ndarray, n: int = LAST_N) -> tuple[float, float] | None:
    """The last value and the mean of the last ``n`` values."""
    if len(values) == 0:
        return None
    return float(values[-1]), float(np.mean(values[-n:]))


def first_last(values: np.ndarray, fraction: float = EDGE_FRACTION) -> tuple[float, float] | None:
    """Means of the first and the last ``fraction`` of the points (at least one point each)."""
    if len(values) == 0:
        return None
    k = max(1, math.ceil(fraction * len(values)))
    return float(np.mean(values[:k])), float(np.mean(values[-k:]))


def oscillation(steps: np.ndarray, values: np.ndarray) -> tuple[float, float] | None:
    """Solve-rate oscillation (docs/method.md §10): sign changes of the first difference of the EMA(0.9)
    per ``OSC_WINDOW`` steps, and the EMA's amplitude (max - min)."""
    if len(values) < 3:
        return None
    ema = smooth(values, OSC_EMA)
    diff = np.diff(ema)
    signs = np.sign(diff[np.abs(diff) > 1e-12])
    changes = int(np.sum(signs[1:] != signs[:-1])) if len(signs) > 1 else 0
    span = max(1, int(steps[-1] - steps[0]))
    return changes * OSC_WINDOW / span, float(np.max(ema) - np.min(ema))


def fmt(x: float | None) -> str:
    """A number for a table cell (4 significant digits, thousands separators from 10⁴, ``n/a``)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def pair_str(v: tuple[float, float] | None, sep: str) -> str:
    return "n/a" if v is None else f"{fmt(v[0])}{sep}{fmt(v[1])}"


# ------------------------------------------------------------------------------------------- families


def task_types(runs: Sequence[RunData]) -> list[str]:
    """Task types with a per-type valid rate in any run."""
    return sorted({tt for r in runs for t in r.scalars if (tt := tags.parse_valid_rate(t)) is not None})


def members(run: RunData) -> list[str]:
    """Agents that log a rating (``conservative``, or ``mu`` and ``sigma``)."""
    names = set()
    for tag in run.scalars:
        parsed = tags.parse_member(tag)
        if parsed is not None and parsed[1] in ("conservative", "mu"):
            names.add(parsed[0])
    return sorted(names)


def conservative(run: RunData, member: str) -> tuple[np.ndarray, np.ndarray]:
    """μ − 3σ of a member: logged ``conservative``, else computed from ``mu`` and ``sigma``."""
    steps, values = series(run, tags.member(member, "conservative"))
    if len(values):
        return steps, values
    mu = dict(zip(*series(run, tags.member(member, "mu")), strict=True))
    sigma = dict(zip(*series(run, tags.member(member, "sigma")), strict=True))
    common = sorted(set(mu) & set(sigma))
    return np.asarray(common, dtype=np.int64), np.asarray([mu[s] - 3 * sigma[s] for s in common], dtype=float)


def role_of(run: RunData, name: str) -> str | None:
    """The role of an agent: the saved mapping, else the lineage, else a ``teacher``/``student`` name prefix."""
    roles = run.agent_roles
    if name in roles:
        return roles[name]
    for rec in run.lineage:
        if rec.get("culled") == name and rec.get("role") in tags.ROLES:
            return str(rec["role"])
    return next((role for role in tags.ROLES if name.lower().startswith(role)), None)


def evolution_steps(run: RunData) -> dict[str, list[int]]:
    """Steps of evolution replacements by operator: lineage.jsonl, else ``evolution/replacements`` > 0."""
    by_op: dict[str, list[int]] = {}
    if run.lineage:
        for rec in run.lineage:
            step = rec.get("step")
            if isinstance(step, int | float):
                by_op.setdefault(str(rec.get("operator", "unknown")), []).append(int(step))
        return by_op
    steps, values = series(run, tags.REPLACEMENTS)
    hits = [int(s) for s, v in zip(steps, values, strict=True) if v > 0]
    return {"replacement": hits} if hits else {}


def operator_counts(run: RunData) -> tuple[Counter[str], str]:
    """Replacement counts by operator and where they came from (``lineage`` / ``scalars`` / ``none``)."""
    if run.lineage:
        return Counter(str(r.get("operator", "unknown")) for r in run.lineage), "lineage"
    _, values = series(run, tags.REPLACEMENTS)
    if len(values) and values.sum() > 0:
        return Counter({"(operator unknown)": int(round(values.sum()))}), "scalars"
    return Counter(), "none"


def validity(run: RunData) -> tuple[list[int], dict[str, np.ndarray]]:
    """Union of steps and count per reason (0 where a reason was not logged at a step)."""
    reasons = sorted(
        reason for t in run.scalars if (reason := tags.parse_validity(t)) is not None and has(run, t)
    )
    if not reasons:
        return [], {}
    per = {r: dict(run.scalars[tags.validity(r)]) for r in reasons}
    steps = sorted(set().union(*per.values()))
    counts = {}
    for r in reasons:
        arr = np.asarray([per[r].get(s, 0.0) for s in steps], dtype=float)
        counts[r] = np.where(np.isfinite(arr), arr, 0.0)
    return steps, counts


def time_phases(run: RunData) -> dict[str, float]:
    """Mean seconds per training step of each ``time/<phase>`` (total / number of timed steps, so a
    phase logged only at the steps where it runs, e.g. evolution, is not overstated)."""
    phases_logged = [p for t in run.scalars if (p := tags.parse_time(t)) is not None and has(run, t)]
    if not phases_logged:
        return {}
    steps: set[int] = set()
    for p in phases_logged:
        steps.update(series(run, tags.time(p))[0].tolist())
    n = max(1, len(steps))
    phases = [p for p in tags.TIME_PHASES if p in phases_logged] + sorted(
        p for p in phases_logged if p not in tags.TIME_PHASES
    )
    return {p: float(series(run, tags.time(p))[1].sum()) / n for p in phases}


# --------------------------------------------------------------------------- teacher x student matrix


@dataclass
class PairWindow:
    """Matched attempts and correct ones per (teacher, student) summed over a window of steps.

    ``rate[i, j]`` = correct / attempts of teacher i's tasks by student j over the window (NaN where the
    pair made no matched attempt in it); ``matched[i, j]`` = steps of the window in which the pair was matched.
    """

    first: int
    last: int
    teachers: list[str]
    students: list[str]
    attempts: np.ndarray  # [T, S]
    correct: np.ndarray  # [T, S]
    matched: np.ndarray  # [T, S]

    @property
    def rate(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.attempts > 0, self.correct / np.maximum(self.attempts, 1), np.nan)

    @property
    def label(self) -> str:
        return f"step {self.first}" if self.first == self.last else f"steps {self.first}–{self.last}"


def pair_windows(run: RunData, n_windows: int = PAIR_WINDOWS) -> list[PairWindow]:
    """The teacher × student matrix over ``n_windows`` consecutive windows of the logged steps (equal numbers
    of steps, the first windows one longer; fewer windows when fewer steps were logged); ``[]`` when the run
    logs no ``pairs/`` tags."""
    counts: dict[tuple[str, str, str], dict[int, float]] = {}
    for tag, points in run.scalars.items():
        parsed = tags.parse_pair(tag)
        if parsed is not None:
            counts[parsed] = {s: v for s, v in points if math.isfinite(v)}
    if not counts:
        return []
    teachers = sorted({t for t, _, _ in counts})
    students = sorted({s for _, s, _ in counts})
    steps = sorted({s for pts in counts.values() for s in pts})
    out = []
    for chunk in np.array_split(np.asarray(steps), min(n_windows, len(steps))):
        window = set(chunk.tolist())
        att = np.zeros((len(teachers), len(students)))
        cor = np.zeros_like(att)
        matched = np.zeros_like(att)
        for (t, s, key), pts in counts.items():
            logged = [v for step, v in pts.items() if step in window]
            (att if key == "attempts" else cor)[teachers.index(t), students.index(s)] += sum(logged)
            if key == "attempts":
                matched[teachers.index(t), students.index(s)] += len(logged)
        out.append(PairWindow(int(chunk[0]), int(chunk[-1]), teachers, students, att, cor, matched))
    return out


# -------------------------------------------------------------------------------- evolution retention


@dataclass
class Child:
    """One evolved child and how its rank within its role went after birth.

    Ranks are by the conservative rating μ − 3σ among the role's members at a step (1 = best; ties share the
    better rank). The child takes the culled member's slot (same name), so its rank at ``step + k`` is the
    slot's rank there, as long as the slot was not replaced again (a later culling of that slot at step s'
    ends the child's record after s', whose logged rating is still the child's).

    Attributes:
        step: the evolution step (the child exists from the next round on).
        role: the role evolved.
        slot: the culled member's name, now the child's.
        operator: the operator that made it.
        n_members: members of the role ranked at ``step``.
        culled_rank: the culled member's rank at ``step`` (the rating PBT culled it by).
        ranks: steps after birth k -> the child's rank at ``step + k`` (every logged step while it lives).
    """

    step: int
    role: str
    slot: str
    operator: str
    n_members: int
    culled_rank: int | None
    ranks: dict[int, int] = field(default_factory=dict)


def _rank(scores: Mapping[str, float], name: str) -> int:
    return 1 + sum(1 for m, v in scores.items() if m != name and v > scores[name])


def children(run: RunData) -> list[Child]:
    """Every child of ``lineage.jsonl`` with its rank trajectory (:class:`Child`); records without a role or
    culled member are skipped (the reader already skipped those without a step in ``0..steps``).

    Linear in the lineage and the logged ratings: a child's ranks are read at the role's logged steps between
    its birth and the slot's next replacement (found by bisection), and children of the same slot born at the
    same step share one trajectory, so the slot's logged steps are walked once per replacement."""
    role_members: dict[str, list[str]] = {}
    for name in members(run):
        role = role_of(run, name)
        if role is not None:
            role_members.setdefault(role, []).append(name)
    ratings = {name: dict(zip(*conservative(run, name), strict=True)) for name in members(run)}
    role_steps = {role: sorted({s for m in names for s in ratings[m]}) for role, names in role_members.items()}
    replaced_at: dict[str, list[int]] = {}
    for rec in run.lineage:
        if rec.get("culled") is not None:
            replaced_at.setdefault(str(rec["culled"]), []).append(int(rec["step"]))
    for steps in replaced_at.values():
        steps.sort()
    last_step = max((s for pts in ratings.values() for s in pts), default=-1)

    def scores_at(role: str, step: int) -> dict[str, float]:
        return {m: ratings[m][step] for m in role_members.get(role, []) if step in ratings[m]}

    trajectories: dict[tuple[str, str, int], dict[int, int]] = {}
    out = []
    for rec in run.lineage:
        step, role, slot = rec.get("step"), rec.get("role"), rec.get("culled")
        if role is None or slot is None:
            continue
        step, role, slot = int(step), str(role), str(slot)
        at_birth = scores_at(role, step)
        culled_rank = _rank(at_birth, slot) if slot in at_birth else None
        child = Child(step, role, slot, str(rec.get("operator", "unknown")), len(at_birth), culled_rank)
        key = (role, slot, step)
        if key not in trajectories:
            later = replaced_at.get(slot, [])
            nxt = bisect.bisect_right(later, step)
            end = later[nxt] if nxt < len(later) else last_step
            steps = role_steps.get(role, [])
            ranks: dict[int, int] = {}
            for t in steps[bisect.bisect_right(steps, step):bisect.bisect_right(steps, end)]:
                scores = scores_at(role, t)
                if slot in scores:
                    ranks[t - step] = _rank(scores, slot)
            trajectories[key] = ranks
        child.ranks = dict(trajectories[key])
        out.append(child)
    return out


# ------------------------------------------------------------------------------------------- evaluation


def num(x: Any) -> float | None:
    """A score: a number, or a mapping with ``score`` / ``value`` / ``mean``."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Mapping):
        for key in ("score", "value", "mean"):
            if key in x:
                return num(x[key])
    return None


@dataclass
class EvalEntry:
    """One benchmark of ``eval/results.json``."""

    headline: float | None  # population mean (or mean of members, or best)
    weakest: float | None
    best: float | None
    members: dict[str, float]
    base: float | None
    baseline: float | None


def eval_entries(run: RunData) -> dict[str, EvalEntry]:
    """Benchmark -> :class:`EvalEntry`; missing keys are filled from the members where possible."""
    if not run.eval_results:
        return {}
    out = {}
    for bench, rec in run.eval_results["benchmarks"].items():
        if not isinstance(rec, Mapping):
            continue
        members_raw = rec.get("members")
        scores = {}
        if isinstance(members_raw, Mapping):
            scores = {str(m): v for m, s in members_raw.items() if (v := num(s)) is not None}
        weakest, best = num(rec.get("weakest")), num(rec.get("best"))
        if scores:
            weakest = min(scores.values()) if weakest is None else weakest
            best = max(scores.values()) if best is None else best
        headline = num(rec.get("population_mean"))
        if headline is None and scores:
            headline = float(np.mean(list(scores.values())))
        if headline is None:
            headline = best
        out[str(bench)] = EvalEntry(headline, weakest, best, scores, num(rec.get("base")), num(rec.get("baseline")))
    return out
