"""The numbers of a comparison over seeds (``compare.json``), from the runs' directories.

Per metric of the ``run_summary.json`` history (:data:`~evaluation.compare.rundirs.HISTORY_METRICS`), each
complete run gives two scores:

* ``final``: the mean of the metric over the run's last ``k`` steps that logged it;
* ``gain``: ``final`` minus the mean over its first ``k`` such steps (what the run learned);

with ``k = min(tail, steps // 2)`` (at least 1), so the two windows do not overlap.

Per benchmark of ``populora eval`` (where complete ``eval/results.json`` files exist), a run's score is its
``eval_score`` entry (default: the mean pass@1 over its members; the baseline has one member), and AZR's
aggregate rows (``aggregate/code|math|overall``) are scored the same way; the ``aggregate`` block treats the
benchmarks evaluated by every run as the tasks of one ``(runs, benchmarks)`` matrix per arm.

A metric that took one value at every logged step of every run carries no signal: it is listed under
``no_signal`` (its value and the number of runs) instead of ``metrics`` and ``curves``, with no interval and no
probability of improvement.

For every block, per arm: the mean over seeds and the IQM, each with its 95 % stratified-bootstrap interval;
and for ``treatment`` against ``reference`` (population against baseline by default; ``populora compare --arm``
names others, e.g. two staleness settings of the population): the difference of the means and the probability of
improvement, each with its interval (estimators: :mod:`evaluation.stats`). Learning curves:
per arm and step, the mean over the runs that logged the step, with its interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from evaluation import stats
from evaluation.compare.rundirs import HISTORY_METRICS, RunInfo, metric_series
from selfplay.rundir import CONFIG

TREATMENT, REFERENCE = "population", "baseline"


def _arm_block(scores: dict[str, np.ndarray], runs: dict[str, list[str]], reps: int, seed: int,
               confidence: float, pair: tuple[str, str] = (TREATMENT, REFERENCE)) -> dict[str, Any]:
    """Per arm (mean, IQM, the scores and the runs they came from), then the two-arm estimates if both arms
    have scores."""
    block: dict[str, Any] = {"arms": {}}
    for arm, s in scores.items():
        block["arms"][arm] = {
            "mean": stats.mean(s, reps, seed, confidence).to_dict(),
            "iqm": stats.iqm(s, reps, seed, confidence).to_dict(),
            "scores": s.tolist(),
            "runs": runs[arm],
        }
    treatment, reference = pair
    if treatment in scores and reference in scores:
        x, y = scores[treatment], scores[reference]
        block["difference"] = stats.difference(x, y, reps, seed, confidence).to_dict()
        block["probability_of_improvement"] = stats.probability_of_improvement(x, y, reps, seed,
                                                                              confidence).to_dict()
    return block


def _tail_means(series: list[tuple[int, float]], tail: int) -> tuple[float, float] | None:
    if not series:
        return None
    values = [v for _, v in sorted(series)]
    k = max(1, min(tail, len(values) // 2))  # the first and last windows never overlap (2 steps or more)
    return float(np.mean(values[-k:])), float(np.mean(values[:k]))


def _curve(runs: Sequence[RunInfo], metric: str, reps: int, seed: int, confidence: float) -> dict[str, Any]:
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, v in metric_series(r, metric):
            by_step.setdefault(step, []).append(v)
    curve: dict[str, list[Any]] = {"steps": [], "mean": [], "low": [], "high": [], "runs": []}
    for step in sorted(by_step):
        est = stats.mean(by_step[step], reps, seed, confidence)
        curve["steps"].append(step)
        curve["mean"].append(est.point)
        curve["low"].append(est.low)
        curve["high"].append(est.high)
        curve["runs"].append(len(by_step[step]))
    return curve


def summarize(runs: Sequence[RunInfo], tail: int = 3, reps: int = stats.DEFAULT_REPS, seed: int = 0,
              confidence: float = stats.DEFAULT_CONFIDENCE, eval_score: str = "population_mean",
              launched: Sequence[str] = (), treatment: str = TREATMENT, reference: str = REFERENCE) -> dict[str, Any]:
    """The content of ``compare.json`` (see the module docstring). Only complete runs with a known arm count;
    the others are listed under ``excluded`` with the reason. ``treatment - reference`` is the difference
    reported."""
    pair = (treatment, reference)
    notes: list[str] = []
    used: list[RunInfo] = []
    excluded: dict[str, str] = {}
    for r in runs:
        notes += r.notes
        if not r.complete:
            excluded[str(r.path)] = f"not complete ({r.state.value}, {r.steps_done}/{r.steps_total} steps)"
        elif not r.arm:
            excluded[str(r.path)] = f"{CONFIG} names no arm"
        else:
            used.append(r)
    by_arm: dict[str, list[RunInfo]] = {}
    order = {treatment: 0, reference: 1}
    for r in sorted(used, key=lambda r: (order.get(r.arm or "", 2), r.arm or "",
                                         r.seed if isinstance(r.seed, int) else 0, r.name)):
        by_arm.setdefault(r.arm or "", []).append(r)
    out: dict[str, Any] = {
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "treatment": treatment, "reference": reference,
        "settings": {"tail": tail, "reps": reps, "bootstrap_seed": seed, "confidence": confidence,
                     "eval_score": eval_score},
        "runs": {arm: [{"path": str(r.path), "seed": r.seed, "preset": r.preset, "steps": r.steps_done,
                        "reward_scheme": r.reward_scheme} for r in rs] for arm, rs in by_arm.items()},
        "excluded": excluded, "launched": list(launched), "metrics": {}, "no_signal": {}, "curves": {},
        "eval": None,
    }
    for metric in HISTORY_METRICS:
        final: dict[str, list[float]] = {}
        gain: dict[str, list[float]] = {}
        names: dict[str, list[str]] = {}
        for arm, rs in by_arm.items():
            for r in rs:
                tm = _tail_means(metric_series(r, metric), tail)
                if tm is None:
                    continue
                final.setdefault(arm, []).append(tm[0])
                gain.setdefault(arm, []).append(tm[0] - tm[1])
                names.setdefault(arm, []).append(r.name)
        if not final:
            notes.append(f"no run logged {metric}")
            continue
        constant = _constant(by_arm, metric)
        if constant is not None:  # no interval or P(improvement) for a metric that never moved
            out["no_signal"][metric] = {"value": constant, "runs": sum(len(v) for v in final.values())}
            continue
        out["metrics"][metric] = {
            "final": _arm_block({a: stats.as_matrix(v) for a, v in final.items()}, names, reps, seed, confidence,
                                pair),
            "gain": _arm_block({a: stats.as_matrix(v) for a, v in gain.items()}, names, reps, seed, confidence, pair),
        }
        out["curves"][metric] = {arm: _curve(rs, metric, reps, seed, confidence) for arm, rs in by_arm.items()}
    out["eval"] = _eval_blocks(by_arm, reps, seed, confidence, notes, pair)
    schemes = {arm: sorted({str(r.reward_scheme) for r in rs}) for arm, rs in by_arm.items()}
    if len({tuple(v) for v in schemes.values()}) > 1:
        notes.append("the arms use different reward schemes (" + "; ".join(
            f"{a}: {', '.join(v)}" for a, v in schemes.items()) + "): their rewards are not on one scale")
    out["notes"] = notes
    return out


def _constant(by_arm: dict[str, list[RunInfo]], metric: str) -> float | None:
    """The one value ``metric`` took at every logged step of every run, or None when it varied: such a metric
    carries no signal (a tiny-random run's rewards and rates, say), and its intervals would read as a null
    result."""
    values = {v for rs in by_arm.values() for r in rs for _, v in metric_series(r, metric)}
    return float(next(iter(values))) if len(values) == 1 else None


def _eval_blocks(by_arm: dict[str, list[RunInfo]], reps: int, seed: int, confidence: float,
                 notes: list[str], pair: tuple[str, str] = (TREATMENT, REFERENCE)) -> dict[str, Any] | None:
    evaluated = {arm: [r for r in rs if r.eval_scores] for arm, rs in by_arm.items()}
    evaluated = {arm: rs for arm, rs in evaluated.items() if rs}
    if not evaluated:
        return None
    for arm, rs in by_arm.items():
        missing = [r.name for r in rs if not r.eval_scores]
        if missing:
            notes.append(f"{arm}: no complete eval/results.json in {', '.join(missing)}")
    keys = sorted({k for rs in evaluated.values() for r in rs for k in r.eval_scores})
    result: dict[str, Any] = {"benchmarks": {}, "aggregate": None}
    for key in keys:
        scores: dict[str, np.ndarray] = {}
        names: dict[str, list[str]] = {}
        for arm, rs in evaluated.items():
            have = [r for r in rs if key in r.eval_scores]
            if have:
                scores[arm] = stats.as_matrix([r.eval_scores[key] for r in have])
                names[arm] = [r.name for r in have]
        result["benchmarks"][key] = _arm_block(scores, names, reps, seed, confidence, pair)
    # the aggregate over benchmarks: those every evaluated run has (AZR's aggregate rows left out)
    common = [k for k in keys if not k.startswith("aggregate/")
              and all(k in r.eval_scores for rs in evaluated.values() for r in rs)]
    if common:
        scores = {arm: stats.as_matrix([[r.eval_scores[k] for k in common] for r in rs])
                  for arm, rs in evaluated.items()}
        names = {arm: [r.name for r in rs] for arm, rs in evaluated.items()}
        result["aggregate"] = {"benchmarks": common, **_arm_block(scores, names, reps, seed, confidence, pair)}
    return result
