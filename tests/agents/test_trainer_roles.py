"""Per-role trainer settings (``trainer.teacher.*``, ``trainer.student.*``;
docs/swapping.md, "Per-role trainer settings"): a population member trains with its role's learning rate and
estimator; the baseline's mixed batch takes each row's advantage from its role's estimator and its loss term from
its role's settings, and per-role values equal to the shared ones give the shared update's gradients."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from agents.advantages import get_advantage, register_advantage, unregister_advantage
from agents.rollout import Rollout
from agents.trainer import PolicyGradientTrainer
from agents.trainer_config import RoleSettings, TrainerConfig
from populora_env.checks import ConfigError
from tests.agents.test_trainer import GradCapture, assert_same_grad

CALLS: list[tuple[str, list[float]]] = []


def _recording(name: str, base: str):
    def estimator(
        rewards, response_mask, group_ids, *, scope_ids=None, token_rewards=None, mode: str = "plain"
    ):
        CALLS.append((name, [round(float(r), 6) for r in rewards]))
        return get_advantage(base)(
            rewards, response_mask, group_ids, scope_ids=scope_ids, token_rewards=token_rewards
        )

    return estimator


@pytest.fixture(autouse=True)
def _estimators():
    register_advantage("test_only_teacher_adv")(_recording("teacher", "grpo"))
    register_advantage("test_only_student_adv")(_recording("student", "rloo"))
    CALLS.clear()
    yield
    unregister_advantage("test_only_teacher_adv")
    unregister_advantage("test_only_student_adv")


def _rollouts(role: str, n: int, seed: int) -> list[Rollout]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = [rng.randrange(1000) for _ in range(rng.randint(1, 5))]
        c = [rng.randrange(1000) for _ in range(rng.randint(1, 6))]
        out.append(
            Rollout(
                p,
                c,
                round(rng.random(), 3),
                group=(role, i % 2),
                scope=(role, "deduction"),
                meta={"role": role},
            )
        )
    return out


ROLES = TrainerConfig(
    teacher=RoleSettings(advantage="test_only_teacher_adv", lr=1e-3),
    student=RoleSettings(advantage="test_only_student_adv", lr=2e-5),
)


def test_each_population_member_trains_with_its_role_s_lr_and_estimator(population) -> None:
    pop = population(nonzero_std=0.5)
    trainer = PolicyGradientTrainer(pop, ROLES)
    teacher, student = _rollouts("teacher", 4, 0), _rollouts("student", 6, 1)
    metrics = trainer.update_many({"ma": teacher, "mb": student})
    assert metrics["ma"]["lr"] == 1e-3 and metrics["mb"]["lr"] == 2e-5
    assert pop.optimizer_state_dict("ma")["param_groups"][0]["lr"] == 1e-3
    assert pop.optimizer_state_dict("mb")["param_groups"][0]["lr"] == 2e-5
    assert CALLS == [("teacher", [r.reward for r in teacher]), ("student", [r.reward for r in student])]
    assert trainer.config.lr == 1e-5  # the shared value stays what it was


def test_a_mixed_batch_takes_each_row_s_advantage_from_its_role_s_estimator(population, monkeypatch) -> None:
    """The baseline's batch (proposer and solver rows of one adapter): each role's rows go through its own
    estimator alone, and the advantages are exactly what that estimator gives them."""
    pop = population(nonzero_std=0.5)
    trainer = PolicyGradientTrainer(
        pop, dataclasses.replace(ROLES, teacher=RoleSettings(advantage="test_only_teacher_adv"))
    )
    rows = _rollouts("teacher", 3, 2) + _rollouts("student", 5, 3)
    seen = {}
    real = trainer._advantages

    def spy(*args, **kwargs):
        seen["adv"] = real(*args, **kwargs)
        return seen["adv"]

    monkeypatch.setattr(trainer, "_advantages", spy)
    trainer.update("ma", rows)
    assert sorted(CALLS) == [
        ("student", [r.reward for r in rows[3:]]),
        ("teacher", [r.reward for r in rows[:3]]),
    ]
    for role, base, part in (("teacher", "grpo", rows[:3]), ("student", "rloo", rows[3:])):
        mask = torch.zeros(len(part), seen["adv"].shape[1])
        for i, r in enumerate(part):
            mask[i, : len(r.completion_ids)] = 1
        want = (
            get_advantage(base)(
                torch.tensor([r.reward for r in part]),
                mask,
                [r.group for r in part],
                scope_ids=[r.scope for r in part],
                token_rewards=None,
            )
            * mask
        )
        idx = [i for i, r in enumerate(rows) if r.meta["role"] == role]
        assert torch.allclose(seen["adv"][idx], want.float(), atol=1e-6), role


@pytest.mark.parametrize("weighting", ["balanced", "tokens"])
def test_per_role_values_equal_to_the_shared_ones_give_the_shared_gradients(
    population, monkeypatch, weighting: str
) -> None:
    """The per-role loss path (each role's rows through ``policy_loss`` with its settings) is the shared loss
    when the settings agree: the same gradients within float rounding, under both role weightings."""
    rows = _rollouts("teacher", 3, 4) + _rollouts("student", 5, 5)
    base = TrainerConfig(role_weighting=weighting, entropy_coef=0.01, micro_batch_size=3, mini_batch_size=4)
    same = dataclasses.replace(base, teacher=RoleSettings(clip_eps_low=0.2, loss_agg_mode="token-mean"))
    grads = []
    for cfg in (base, same):
        pop = population(nonzero_std=0.5)
        cap = GradCapture(pop.parameters("ma"))
        monkeypatch.setattr(pop, "optimizer", lambda name, cap=cap, **kw: cap)
        PolicyGradientTrainer(pop, cfg).update("ma", rows)
        grads.append(cap.grads)
    assert len(grads[0]) == len(grads[1]) == 2
    for step_a, step_b in zip(*grads, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            assert_same_grad(a, b)


def test_a_role_s_own_loss_setting_reaches_the_mixed_batch_s_gradient(population, monkeypatch) -> None:
    """A teacher-only entropy bonus in a mixed batch is not lost on the way: the gradient moves."""
    rows = _rollouts("teacher", 3, 6) + _rollouts("student", 3, 7)
    grads = {}
    for name, cfg in (
        ("shared", TrainerConfig()),
        ("teacher_bonus", TrainerConfig(teacher=RoleSettings(entropy_coef=0.5))),
    ):
        pop = population(nonzero_std=0.5)
        cap = GradCapture(pop.parameters("ma"))
        monkeypatch.setattr(pop, "optimizer", lambda name, cap=cap, **kw: cap)
        PolicyGradientTrainer(pop, cfg).update("ma", rows)
        grads[name] = cap.grads[0]
    moved = sum(float((a - b).norm()) for a, b in zip(grads["shared"], grads["teacher_bonus"], strict=True))
    assert moved > 1e-6


def test_estimator_kwargs_take_the_json_type_the_estimator_declares() -> None:
    ok = TrainerConfig(advantage="test_only_teacher_adv", advantage_kwargs={"mode": "median"})
    ok.validate()
    with pytest.raises(
        ConfigError,
        match=r"advantage_kwargs.mode: must be str \(the estimator's parameter\), "
        r"got 1",
    ):
        TrainerConfig(advantage="test_only_teacher_adv", advantage_kwargs={"mode": 1}).validate()
    with pytest.raises(ConfigError, match=r"advantage_kwargs.eps: must be float"):
        TrainerConfig(advantage="grpo", advantage_kwargs={"eps": "small"}).validate()
    with pytest.raises(ConfigError, match=r"^student.advantage_kwargs.mode: must be str"):
        TrainerConfig(
            student=RoleSettings(advantage="test_only_student_adv", advantage_kwargs={"mode": 2.0})
        ).validate()
    with pytest.raises(ConfigError, match=r"^teacher.lr: must be <= 1"):
        TrainerConfig(teacher=RoleSettings(lr=2.0)).validate()


def test_a_role_that_changes_the_estimator_drops_the_shared_kwargs() -> None:
    cfg = TrainerConfig(
        advantage="grpo",
        advantage_kwargs={"eps": 1e-4},
        student=RoleSettings(advantage="rloo"),
        teacher=RoleSettings(lr=1e-4),
    )
    cfg.validate()
    record = cfg.role_record()
    assert record["student"]["advantage"] == "rloo" and record["student"]["advantage_kwargs"] == {}
    assert record["teacher"]["advantage_kwargs"] == {"eps": 1e-4} and record["teacher"]["lr"] == 1e-4
    assert record["student"]["lr"] == 1e-5 and cfg.for_role("student").teacher == RoleSettings()
