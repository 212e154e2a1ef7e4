"""Statistics over seeds: point estimates from ``rliable`` and stratified percentile-bootstrap intervals.

Scores are matrices of shape ``(runs, tasks)``: one row per independent run (seed) of an arm, one column per
task (a benchmark, or a single metric). Estimators (the point estimates are rliable's own functions,
``rliable.metrics``):

* **mean** ``aggregate_mean(S) = (1/M) Σ_m (1/N) Σ_n S[n, m]`` (mean over tasks of the per-task mean over runs);
* **IQM** ``aggregate_iqm(S)``: the interquartile mean, the 25 % trimmed mean of all ``N·M`` scores
  (``scipy.stats.trim_mean(S, 0.25, axis=None)``: ``floor(0.25·N·M)`` scores cut at each end; with fewer than
  4 scores nothing is cut and it equals the mean);
* **probability of improvement** ``P(X > Y) = (1/M) Σ_m (1/(N_x N_y)) Σ_i Σ_j [1{X[i,m] > Y[j,m]} +
  ½·1{X[i,m] = Y[j,m]}]`` (Mann-Whitney U / (N_x N_y), averaged over tasks; 0.5 where the two columns are equal);
* **difference** ``stat(X) - stat(Y)`` of an aggregate (the mean by default), the arms' runs independent.

**Intervals** (95 % by default) are percentile intervals of the stratified bootstrap (Agarwal et al. 2021,
"Deep RL at the edge of the statistical precipice", as in ``rliable.library.get_interval_estimates``): each
replicate resamples, *independently within every task column*, N runs with replacement from that column's N
runs (for two arms: each arm resampled on its own), the statistic is computed on the replicate, and the
interval is the (α/2, 1 − α/2) percentiles of the ``reps`` replicates (``numpy.percentile``, linear
interpolation). With one run per arm every replicate is the data and the interval collapses to the point;
with few runs the interval is too narrow (a replicate mean never leaves the range of the runs' values, and
with 3 runs only 10 distinct means exist), so read it with the number of runs.

What is hand-rolled here and why: that resampling (:func:`bootstrap_replicates`), and batched forms of
rliable's three estimators that compute all replicates at once (the point estimates are rliable's; the tests
check the batched forms against rliable's functions replicate by replicate). rliable's own
``get_interval_estimates`` goes through the ``arch`` package, and rliable 1.2.0 (its newest release) works
with neither arch 7 on pandas 3 (arch fails to import) nor arch 8 (which rejects the ``random_state=`` argument
rliable passes). The resampling scheme above is the one rliable asks arch for (stratified by task, percentile
interval), with numpy's ``default_rng(seed)`` as the source of randomness, so the intervals are reproducible
from the seed.

``rliable`` is an optional dependency (the ``stats`` extra, included in the ``test`` extra): importing this
module does not need it; every estimator raises :class:`StatsUnavailable` with the install command when it is
missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_REPS = 2000
"""Bootstrap replicates per interval."""
DEFAULT_CONFIDENCE = 0.95
INSTALL_HINT = "pip install -c constraints.txt '.[stats]' (rliable)"

Statistic = Callable[[np.ndarray], float]
PairStatistic = Callable[[np.ndarray, np.ndarray], float]
BatchStatistic = Callable[[np.ndarray], np.ndarray]
BatchPairStatistic = Callable[[np.ndarray, np.ndarray], np.ndarray]


class StatsUnavailable(ImportError):
    """``rliable`` is not installed; the message says how to install it."""


def _metrics() -> Any:
    try:
        from rliable import metrics
    except ImportError as exc:
        raise StatsUnavailable(f"statistics over seeds need rliable, which is not installed: {INSTALL_HINT}") \
            from exc
    return metrics


def rliable_available() -> bool:
    """Whether the estimators can run (``rliable.metrics`` imports)."""
    try:
        _metrics()
    except StatsUnavailable:
        return False
    return True


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval [low, high] at ``confidence``; ``runs``: runs per arm."""

    point: float
    low: float
    high: float
    runs: tuple[int, ...]
    confidence: float = DEFAULT_CONFIDENCE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = list(self.runs)
        return d


def as_matrix(scores: Sequence[float] | Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """``scores`` as a float ``(runs, tasks)`` matrix (a 1-D sequence is one task); raises ValueError for an
    empty matrix or a non-finite score."""
    a = np.asarray(scores, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"scores must be a non-empty (runs, tasks) matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("scores must be finite")
    return a


def bootstrap_replicates(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` stratified bootstrap replicates of ``scores`` (shape ``(reps, runs, tasks)``): in each
    replicate and each task column, ``runs`` rows drawn with replacement from that column, independently of
    the other columns."""
    n, m = scores.shape
    idx = rng.integers(0, n, size=(reps, n, m))
    return scores[idx, np.arange(m)[None, None, :]]


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def interval(scores: Any, statistic: Statistic, reps: int = DEFAULT_REPS, seed: int = 0,
             confidence: float = DEFAULT_CONFIDENCE, batched: BatchStatistic | None = None) -> Estimate:
    """``statistic(scores)`` with its stratified percentile-bootstrap interval (see the module docstring).
    ``batched``, if given, computes the statistic of a whole ``(reps, runs, tasks)`` stack of replicates at once
    (it must equal ``statistic`` on each; the tests check the shipped ones against rliable's functions)."""
    s = as_matrix(scores)
    rng = np.random.default_rng(seed)
    stack = bootstrap_replicates(s, reps, rng)
    boot = batched(stack) if batched else np.array([statistic(r) for r in stack])
    low, high = _interval(boot, confidence)
    return Estimate(float(statistic(s)), low, high, (s.shape[0],), confidence)


def pair_interval(x: Any, y: Any, statistic: PairStatistic, reps: int = DEFAULT_REPS, seed: int = 0,
                  confidence: float = DEFAULT_CONFIDENCE, batched: BatchPairStatistic | None = None) -> Estimate:
    """``statistic(x, y)`` with its interval; each replicate resamples ``x`` and ``y`` independently (each
    stratified by task). ``x`` and ``y`` need the same tasks (columns), not the same number of runs."""
    a, b = as_matrix(x), as_matrix(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two arms have different tasks: {a.shape[1]} vs {b.shape[1]} columns")
    rng = np.random.default_rng(seed)
    ra = bootstrap_replicates(a, reps, rng)
    rb = bootstrap_replicates(b, reps, rng)
    boot = batched(ra, rb) if batched else np.array([statistic(p, q) for p, q in zip(ra, rb, strict=True)])
    low, high = _interval(boot, confidence)
    return Estimate(float(statistic(a, b)), low, high, (a.shape[0], b.shape[0]), confidence)


# Batched forms of rliable's estimators over a stack of replicates (speed only: 2000 replicates of the
# probability of improvement through scipy's Mann-Whitney test take seconds per comparison).


def batched_mean(stack: np.ndarray) -> np.ndarray:
    """``aggregate_mean`` of each replicate: the mean over runs and tasks (all columns have ``runs`` rows)."""
    return stack.mean(axis=(1, 2))


def batched_iqm(stack: np.ndarray) -> np.ndarray:
    """``aggregate_iqm`` of each replicate: ``scipy.stats.trim_mean`` of its flattened scores."""
    import scipy.stats

    return scipy.stats.trim_mean(stack.reshape(stack.shape[0], -1), 0.25, axis=1)


def batched_probability_of_improvement(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """``probability_of_improvement`` of each replicate pair: per task, the fraction of (x run, y run) pairs with
    x > y plus half the ties (= U / (N_x N_y)), averaged over tasks."""
    gt = (sx[:, :, None, :] > sy[:, None, :, :]).mean(axis=(1, 2))
    eq = (sx[:, :, None, :] == sy[:, None, :, :]).mean(axis=(1, 2))
    return (gt + 0.5 * eq).mean(axis=1)


def mean(scores: Any, reps: int = DEFAULT_REPS, seed: int = 0,
         confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """rliable's ``aggregate_mean`` with its interval."""
    return interval(scores, _metrics().aggregate_mean, reps, seed, confidence, batched_mean)


def iqm(scores: Any, reps: int = DEFAULT_REPS, seed: int = 0,
        confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """rliable's ``aggregate_iqm`` (25 % trimmed mean of all scores) with its interval."""
    return interval(scores, _metrics().aggregate_iqm, reps, seed, confidence, batched_iqm)


def difference(x: Any, y: Any, reps: int = DEFAULT_REPS, seed: int = 0,
               confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """``aggregate_mean(x) - aggregate_mean(y)`` with its interval (arms resampled independently)."""
    agg = _metrics().aggregate_mean
    return pair_interval(x, y, lambda a, b: float(agg(a) - agg(b)), reps, seed, confidence,
                         lambda sa, sb: batched_mean(sa) - batched_mean(sb))


def probability_of_improvement(x: Any, y: Any, reps: int = DEFAULT_REPS, seed: int = 0,
                               confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """rliable's ``probability_of_improvement`` P(X > Y) with its interval."""
    poi = _metrics().probability_of_improvement
    return pair_interval(x, y, lambda a, b: float(poi(a, b)), reps, seed, confidence,
                         batched_probability_of_improvement)
