"""evaluation.stats: the estimators and their bootstrap intervals on fixed inputs, against values computed by
hand (the exact bootstrap distribution of small samples is enumerable)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation import stats


def test_mean_and_iqm_points_by_hand() -> None:
    assert stats.mean([1.0, 2.0, 3.0, 6.0], reps=10).point == pytest.approx(3.0)
    # 8 scores: trim_mean cuts floor(0.25 * 8) = 2 at each end -> mean(2, 3, 10, 11)
    assert stats.iqm([0, 1, 2, 3, 10, 11, 12, 100], reps=10).point == pytest.approx(6.5)
    # 3 scores: nothing cut, the IQM is the mean
    assert stats.iqm([0.0, 3.0, 9.0], reps=10).point == pytest.approx(4.0)
    # two tasks: mean over tasks of the per-task means
    assert stats.mean([[1.0, 10.0], [3.0, 30.0]], reps=10).point == pytest.approx((2.0 + 20.0) / 2)


def test_probability_of_improvement_by_hand() -> None:
    # x > y in 1 + 2 + 3 = 6 of 9 pairs, one tie (4 = 4) counts 1/2: 6.5 / 9
    est = stats.probability_of_improvement([2, 4, 6], [1, 3, 4], reps=50)
    assert est.point == pytest.approx(6.5 / 9)
    assert est.runs == (3, 3)
    # averaged over tasks: task 0 as above, task 1 x always below y (0), equal columns give 1/2
    x = [[2, 0, 5], [4, 0, 5], [6, 0, 5]]
    y = [[1, 1, 5], [3, 2, 5], [4, 3, 5]]
    assert stats.probability_of_improvement(x, y, reps=50).point == pytest.approx((6.5 / 9 + 0 + 0.5) / 3)


def test_mean_interval_matches_the_exact_bootstrap_distribution() -> None:
    # resampling 3 runs of [0, 0, 3]: the mean is k (k = number of 3s drawn, Binomial(3, 1/3)), P(k=0) = 8/27,
    # P(k<=2) = 26/27 = 0.963 < 0.975: the 2.5 % quantile is 0 and the 97.5 % quantile is 3
    est = stats.mean([0.0, 0.0, 3.0], reps=4000, seed=1)
    assert (est.point, est.low, est.high) == (1.0, 0.0, 3.0)
    # an 80 % interval: P(k=0) = 0.296 > 0.10 and P(k<=1) = 20/27 = 0.741 < 0.90 <= P(k<=2): [0, 2]
    est = stats.mean([0.0, 0.0, 3.0], reps=4000, seed=1, confidence=0.80)
    assert (est.low, est.high) == (0.0, 2.0)


def test_difference_interval_by_hand() -> None:
    # x is constant 1; mean(y*) of [0, 0, 3] is k as above: the difference 1 - k is in {1, 0, -1, -2}
    est = stats.difference([1.0, 1.0, 1.0], [0.0, 0.0, 3.0], reps=4000, seed=2)
    assert (est.point, est.low, est.high) == (0.0, -2.0, 1.0)
    assert est.runs == (3, 3)


def test_one_run_collapses_the_interval() -> None:
    est = stats.mean([0.7], reps=100)
    assert (est.point, est.low, est.high) == (0.7, 0.7, 0.7)


def test_resampling_is_stratified_by_task() -> None:
    # two runs, two tasks, run 0 scores 0 on both, run 1 scores 1 on both. Resampling whole runs would give
    # replicate means in {0, 0.5, 1}; resampling each task's column on its own also gives 0.25 and 0.75.
    s = np.array([[0.0, 0.0], [1.0, 1.0]])
    reps = stats.bootstrap_replicates(s, 2000, np.random.default_rng(0))
    assert reps.shape == (2000, 2, 2)
    means = set(np.round(reps.mean(axis=(1, 2)), 2).tolist())
    assert means == {0.0, 0.25, 0.5, 0.75, 1.0}


def test_seeded_intervals_are_reproducible_and_pinned() -> None:
    x = [0.31, 0.42, 0.27, 0.55, 0.38]
    a = stats.mean(x, reps=1000, seed=7)
    b = stats.mean(x, reps=1000, seed=7)
    assert a == b
    assert a.point == pytest.approx(0.386)
    assert a.low <= a.point <= a.high
    # pinned: the seed-7 replicates of this implementation (numpy default_rng)
    assert (round(a.low, 6), round(a.high, 6)) == PINNED_MEAN
    c = stats.mean(x, reps=1000, seed=8)
    assert (c.low, c.high) != (a.low, a.high)


PINNED_MEAN = (0.308, 0.476)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        stats.mean([], reps=10)
    with pytest.raises(ValueError, match="finite"):
        stats.mean([1.0, float("nan")], reps=10)
    with pytest.raises(ValueError, match="different tasks"):
        stats.difference([[1.0, 2.0]], [[1.0]], reps=10)


def test_missing_rliable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "rliable", None)
    monkeypatch.setitem(sys.modules, "rliable.metrics", None)
    assert not stats.rliable_available()
    with pytest.raises(stats.StatsUnavailable, match=r"\.\[stats\]"):
        stats.mean([1.0, 2.0], reps=10)


def test_batched_estimators_equal_rliables_replicate_by_replicate() -> None:
    from rliable import metrics

    rng = np.random.default_rng(3)
    # scores on a coarse grid so that ties occur (the 1/2 of the probability of improvement)
    x = rng.integers(0, 5, size=(5, 3)).astype(float)
    y = rng.integers(0, 5, size=(4, 3)).astype(float)
    sx = stats.bootstrap_replicates(x, 200, rng)
    sy = stats.bootstrap_replicates(y, 200, rng)
    np.testing.assert_allclose(stats.batched_mean(sx), [metrics.aggregate_mean(r) for r in sx])
    np.testing.assert_allclose(stats.batched_iqm(sx), [metrics.aggregate_iqm(r) for r in sx])
    np.testing.assert_allclose(stats.batched_probability_of_improvement(sx, sy),
                               [metrics.probability_of_improvement(a, b) for a, b in zip(sx, sy, strict=True)])
    # identical columns: rliable's special case (0.5) is what the pair count gives
    same = stats.bootstrap_replicates(x, 20, rng)
    np.testing.assert_allclose(stats.batched_probability_of_improvement(same, same), 0.5)
