"""Numbers that reach the trainer are finite in its dtype (``selfplay.finite``, ``agents.nonfinite``): a reward
scheme's non-number or float32-overflowing reward stops the run with exit 2 naming the scheme, before any update;
non-finite updates are skipped and logged, and ``trainer.max_nonfinite_updates`` of them in a row stop the run with
exit 2 naming the member and step, its last checkpoint intact."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from agents.nonfinite import finite_update
from populora_env.rewards import RewardSchemeError, compute_rewards
from selfplay.checkpoint import verify_checkpoint
from selfplay.finite import NonFiniteGuard, NonFiniteTraining, check_rewards
from tests.selfplay.conftest import REPO, TINY, populora

PLUGIN = str(REPO / "tests" / "selfplay" / "nonfinite_plugin.py")


def _train(run: Path, *flags: str):
    return populora("train", *TINY, "--plugins", PLUGIN, "--run-dir", str(run), "--checkpoint-every", "1", *flags,
                    timeout=600)


@pytest.mark.parametrize(("value", "shown"), [("1e39", "1e+39, which is not finite in the trainer's float32"),
                                              ('"0.5"', "returned '0.5' (str) as a reward for")])
def test_a_reward_that_is_no_float32_number_stops_the_run_naming_the_scheme(tmp_path: Path, value: str,
                                                                              shown: str) -> None:
    run = tmp_path / "run"
    p = _train(run, "--steps", "2", "--env.reward-scheme", "constant", "--env.reward-kwargs", f'{{"value": {value}}}')
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("populora train: error: --env.reward-scheme constant: reward scheme ")
    assert shown in last and last.endswith("the run stopped before training on it")
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


def test_consecutive_nonfinite_updates_stop_the_run_with_an_intact_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = _train(run, "--steps", "4", "--trainer.advantage", "nan_advantage", "--trainer.max-nonfinite-updates", "2")
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("populora train: error: member teacher_0 had 2 consecutive updates with a non-finite loss "
                           "or gradient norm (all skipped) up to step 2: the run stopped; its last checkpoint is intact")
    assert "step 1: member teacher_0: non-finite loss or gradient norm" in p.stderr  # logged as it happened
    assert sorted(d.name for d in (run / "checkpoints").iterdir()) == ["step_1"]
    verify_checkpoint(run / "checkpoints" / "step_1")


def test_reward_checks_in_process() -> None:
    def batch(*rewards):
        return {"m": [SimpleNamespace(reward=r, meta={"agent": "student_0"}) for r in rewards]}

    check_rewards(batch(0.5, -1, np.float64(3.0e38), np.float32(1.0)), "s")
    for bad, match in [(True, "True \\(bool\\)"), ("0.5", "'0.5' \\(str\\)"), (1e39, "1e\\+39, which is not finite in the trainer's float32"),
                       (-math.inf, "-inf, which"), (math.nan, "nan, which"), (None, "None \\(NoneType\\)")]:
        with pytest.raises(RewardSchemeError, match=f"reward scheme 's' gave student_0 a reward of {match}"):
            check_rewards(batch(0.0, bad), "s")

    results = SimpleNamespace(agents=["a"], n_completions=lambda a: 2)

    def scheme(_results, **_kw):
        return {"a": [1.0, True]}

    with pytest.raises(RewardSchemeError, match="reward scheme 'scheme' returned True \\(bool\\) as a reward for a"):
        compute_rewards(scheme, results)
    assert compute_rewards(lambda _r: {"a": [1, np.float32(0.5)]}, results) == {"a": [1.0, 0.5]}


def test_guard_counts_consecutive_fully_skipped_updates() -> None:
    assert finite_update(1.0, 2.0) and not finite_update(math.nan, 1.0) and not finite_update(1.0, math.inf)
    g = NonFiniteGuard(2)
    skipped, fine, partly = ({"num_steps": 2.0, "skipped_steps": s} for s in (2.0, 0.0, 1.0))
    assert [e["member"] for e in g.observe(1, {"a": skipped, "b": skipped})] == ["a", "b"]
    assert g.observe(2, {"a": fine, "b": partly}) == []  # a finite step resets the streak
    g.observe(3, {"a": skipped})
    with pytest.raises(NonFiniteTraining, match="member a had 2 consecutive .* up to step 4"):
        g.observe(4, {"a": skipped})
