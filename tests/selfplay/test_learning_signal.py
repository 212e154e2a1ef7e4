"""Every member gets a learning signal: no shipped preset leaves a role with all-zero advantages by construction.

The whitening scopes of task-relative REINFORCE++ (``selfplay.rollouts.whitening_scopes``) fall back to one
scope per role when a (role, task type) scope would hold a single completion, whose whitened advantage is 0
whatever its reward. A real step of every shipped preset, in both arms (population and baseline), with
scripted completions whose rewards differ (``tests/selfplay/scripted.py``) on ``tiny-random``, must give every
learning member a non-zero gradient and every role of every learning member's batch a non-zero advantage (a
preset's scripted opponents, ``selfplay.scripted``, play and are never trained).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from agents.advantages import get_advantage
from baselines.azr import azr_config, azr_mapping
from selfplay.config import list_presets, load_preset
from selfplay.rollouts import ANY_TYPE, whitening_scopes
from tests.selfplay.scripted import ScriptedLoop, cpu_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _advantages(rollouts, trainer_cfg) -> torch.Tensor:
    """Per-token advantages of one member's batch, computed as the trainer computes them."""
    lengths = [len(r.completion_ids) for r in rollouts]
    mask = torch.zeros(len(rollouts), max(lengths))
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    rewards = torch.tensor([r.reward for r in rollouts])
    adv = get_advantage(trainer_cfg.advantage)(rewards, mask, [r.group for r in rollouts],
                                               scope_ids=[r.scope for r in rollouts],
                                               **trainer_cfg.advantage_kwargs)
    return adv * mask


# ------------------------------------------------------------------------------------ the scoping rule


def test_scopes_are_per_role_and_type_when_every_type_has_two() -> None:
    keys = [("teacher", "deduction")] * 3 + [("teacher", "induction")] * 2 + [("student", "abduction")] * 4
    assert whitening_scopes(keys) == keys


def test_a_role_with_a_singleton_type_is_one_scope_and_roles_stay_apart() -> None:
    keys = [("teacher", "deduction"), ("teacher", "abduction"), ("student", "deduction"), ("student", "deduction"),
            ("student", "induction"), ("student", "induction")]
    assert whitening_scopes(keys) == [("teacher", ANY_TYPE)] * 2 + keys[2:]


def test_singleton_scopes_would_zero_the_advantage_and_the_fallback_does_not() -> None:
    """The defect being fixed: two proposals of two types with rewards -1 and 1."""
    rewards = torch.tensor([-1.0, 1.0])
    mask = torch.ones(2, 5)
    estimator = get_advantage("reinforce_pp")
    per_type = estimator(rewards, mask, [0, 1], scope_ids=[("teacher", "deduction"), ("teacher", "abduction")])
    assert torch.count_nonzero(per_type) == 0
    scopes = whitening_scopes([("teacher", "deduction"), ("teacher", "abduction")])
    fixed = estimator(rewards, mask, [0, 1], scope_ids=scopes)
    assert (fixed[0] < 0).all() and (fixed[1] > 0).all()


# ------------------------------------------------------------------------ one real step of each preset


def _preset_cases() -> list:
    """Every shipped preset; the GPU presets' cases (their budgets at full size on tiny-random: minutes of CPU
    each, most of this file's time) go to the ``e2e`` tier, which CI runs after the default suite (issue 45)."""
    return [pytest.param(name, marks=pytest.mark.e2e) if load_preset(name).device.startswith("cuda") else name
            for name in list_presets()]


@pytest.mark.parametrize("arm", ["population", "baseline"])
@pytest.mark.parametrize("preset", _preset_cases())
def test_every_member_and_role_gets_a_gradient(preset: str, arm: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = cpu_config(load_preset(preset), tmp_path / "run")
    assignment = None
    if arm == "baseline":
        cfg, assignment = azr_config(cfg), azr_mapping()
    loop = ScriptedLoop(cfg, tmp_path / "run", assignment)
    loop.setup()
    try:
        record = loop.train_step()
    finally:
        loop.env.close()
    results = record.outcome.results
    assert any(p.valid for p in results.proposals), "the script should make valid proposals"
    assert not all(p.valid for p in results.proposals), "the script should make invalid proposals"
    scripted = loop.scripted.agents if loop.scripted is not None else ()  # played by a script, never trained
    learners = sorted(m for m in loop.mapping.members if m not in scripted)
    assert learners, "every preset trains at least one member"
    assert sorted(record.member_metrics) == learners, "every learning member must be updated"
    for member, batch in loop.batches.items():
        metrics = record.member_metrics[member]
        assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0, (preset, arm, member, metrics)
        adv = _advantages(batch, cfg.trainer)
        roles = {r.meta["role"] for r in batch}
        for role in roles:
            rows = [i for i, r in enumerate(batch) if r.meta["role"] == role]
            assert len({batch[i].reward for i in rows}) > 1, (preset, arm, member, role, "rewards should differ")
            assert adv[rows].abs().sum() > 0, (preset, arm, member, role, [batch[i].scope for i in rows])


# ------------------------------------------------------------------ what the learning curves are read from


def test_student_rates_are_logged_per_task_type() -> None:
    """Per-type student format and correct rates (matched and filler attempts), so a rise is told apart from
    a drift of the task-type mix."""
    from agents.generation import Completion
    from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundOutcome, RoundResults
    from selfplay import tags
    from selfplay.logger import step_scalars
    from selfplay.loop import StepRecord
    from selfplay.mapping import AgentMapping

    proposals = (ProposalResult("teacher_0", 0, "deduction", "a", True, True, None),)
    attempts = (
        AttemptResult("student_0", 0, "a", "deduction", "teacher_0", True, True, None),
        AttemptResult("student_0", 1, "a", "deduction", "teacher_0", False, False, "format"),
        AttemptResult("student_0", 2, "z", "abduction", None, True, False, "wrong"),
        AttemptResult("student_0", 3, "z", "abduction", None, True, True, None),
        AttemptResult("student_0", 4, "y", "abduction", None, True, True, None),
    )
    results = RoundResults(1, ("teacher_0",), ("student_0",), proposals, attempts,
                           (MatchResult("teacher_0", "student_0", 0.5, 0.5, 1, 2, 1, "draw"),))
    outcome = RoundOutcome(results, {"teacher_0": (0.5,), "student_0": (1.0, -1.0, -0.5, 1.0, 1.0)},
                           {"teacher_0": (25.0, 8.0), "student_0": (25.0, 8.0)}, {"metrics": {}})
    completions = {(a.agent, a.index): Completion(0, 0, None, "x", [1], [2], [0.0]) for a in attempts}
    completions[("teacher_0", 0)] = Completion(0, 0, None, "x", [1], [2], [0.0])
    record = StepRecord(1, outcome, completions, {}, AgentMapping.build(("teacher_0",), ("student_0",)), {})
    out = step_scalars(record)
    assert out[tags.student_format_rate("deduction")] == 0.5 and out[tags.student_correct_rate("deduction")] == 0.5
    assert out[tags.student_format_rate("abduction")] == 1.0
    assert out[tags.student_correct_rate("abduction")] == pytest.approx(2 / 3)
    assert out[tags.STUDENT_CORRECT_RATE] == 3 / 5 and out[tags.SOLVE_RATE] == 0.5
    assert tags.student_format_rate("induction") not in out
