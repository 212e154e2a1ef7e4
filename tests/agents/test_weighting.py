"""Role-balanced loss weights (agents.weighting) and their use by policy_loss."""

from __future__ import annotations

import pytest
import torch

from agents.losses import policy_loss
from agents.weighting import role_loss_weights


def _mask(lengths: list[int], T: int) -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])


def role_shares(roles: list[str], mask: torch.Tensor, weights: torch.Tensor | None) -> dict[str, float]:
    """Each role's share of the policy gradient: with every advantage 1 and every log-prob the same parameter
    theta, dL/dtheta splits into one sum per role; the share is that sum over the whole."""
    theta = torch.zeros((), requires_grad=True)
    grads = {}
    for role in sorted(set(roles)):
        lp = theta.expand_as(mask).clone()
        adv = torch.tensor([[1.0 if r == role else 0.0] for r in roles]).expand_as(mask)
        out = policy_loss(lp, lp.detach(), adv, mask, token_weights=weights)
        (g,) = torch.autograd.grad(out.loss, theta)
        grads[role] = float(g)
    total = sum(grads.values())
    return {r: g / total for r, g in grads.items()}


ROLES = ["teacher"] * 2 + ["student"] * 6
LENGTHS = [5, 3, 1, 2, 2, 4, 1, 0]  # 8 teacher tokens, 10 student tokens, an empty attempt
MASK = _mask(LENGTHS, 5)


def test_balanced_gives_each_role_half_of_the_gradient() -> None:
    w = role_loss_weights(ROLES, MASK, "balanced", "token-mean")
    assert role_shares(ROLES, MASK, w) == pytest.approx({"teacher": 0.5, "student": 0.5}, abs=1e-6)
    tokens = role_shares(ROLES, MASK, None)
    assert tokens == pytest.approx({"teacher": 8 / 18, "student": 10 / 18}, abs=1e-6)  # 'tokens': token share


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_seq_mean_modes_average_each_roles_own_aggregate(agg: str) -> None:
    from agents.losses import agg_loss

    w = role_loss_weights(ROLES, MASK, "balanced", agg)
    loss = torch.randn(MASK.shape)
    own = [agg_loss(loss[rows], MASK[rows], agg, norm_len=5) for rows in (slice(0, 2), slice(2, 8))]
    torch.testing.assert_close(agg_loss(w * loss, MASK, agg, norm_len=5), 0.5 * (own[0] + own[1]))


def test_token_mean_weights_are_n_over_r_n_role() -> None:
    w = role_loss_weights(ROLES, MASK, "balanced", "token-mean")
    assert w is not None and w.shape == MASK.shape
    assert torch.allclose(w[0], torch.full((5,), 18 / (2 * 8))) and torch.allclose(w[3], torch.full((5,), 18 / 20))
    # the balanced loss equals the mean of the two roles' own token means, for any per-token loss
    loss = torch.randn(MASK.shape)
    t, s = MASK.clone(), MASK.clone()
    t[2:] = 0
    s[:2] = 0
    by_role = 0.5 * ((loss * t).sum() / t.sum() + (loss * s).sum() / s.sum())
    torch.testing.assert_close((w * loss * MASK).sum() / MASK.sum(), by_role)


def test_one_role_or_tokens_gives_no_weights() -> None:
    assert role_loss_weights(["student"] * 8, MASK, "balanced") is None
    assert role_loss_weights(ROLES, MASK, "tokens") is None


def test_mini_batches_are_balanced_each_over_the_roles_they_hold() -> None:
    w = role_loss_weights(ROLES, MASK, "balanced", "token-mean", mini_batch_size=4)
    assert w is not None
    # rows 0-3: teacher 8 tokens, student 3 tokens, 11 in all; rows 4-7: students only -> weight 1
    assert torch.allclose(w[0, 0], torch.tensor(11 / 16)) and torch.allclose(w[2, 0], torch.tensor(11 / 6))
    assert torch.equal(w[4:], torch.ones(4, 5))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="role_weighting must be one of balanced, tokens"):
        role_loss_weights(ROLES, MASK, "equal")
    with pytest.raises(ValueError, match="7 roles for a batch of 8 rows"):
        role_loss_weights(ROLES[:7], MASK, "balanced")
    with pytest.raises(ValueError, match="not 'my-agg'"):
        role_loss_weights(ROLES, MASK, "balanced", "my-agg")
    with pytest.raises(ValueError, match="token_weights must be"):
        policy_loss(MASK, MASK, MASK, MASK, token_weights=torch.ones(2, 2))


def _update_gradient(pop, rollouts, weighting: str, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    """The member's gradient of one trainer update (captured where the trainer clips it), parameters restored."""
    from agents.trainer import PolicyGradientTrainer, TrainerConfig

    before = pop.state("ma")
    grads: list[torch.Tensor] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, max_norm, *a, **k):
        params = list(params)
        grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
        return clip(params, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    cfg = TrainerConfig(advantage="reinforce_pp", role_weighting=weighting, micro_batch_size=3, lr=1e-3,
                        max_grad_norm=None)
    PolicyGradientTrainer(pop, cfg).update("ma", rollouts)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    pop.load_state("ma", before)
    (g,) = grads
    return g


def test_the_trainer_update_is_the_mean_of_each_roles_own_update(population, monkeypatch) -> None:
    """Through the real trainer on tiny-random: the balanced gradient of a mixed batch is half the gradient of
    the proposer rows trained alone plus half that of the solver rows alone (each a token mean over its own
    role; whitening is per role, so the advantages are the same alone or mixed); 'tokens' weighs them by their
    token counts instead."""
    from tests.agents.test_trainer_role_metrics import mixed_rollouts

    pop = population(nonzero_std=0.5)
    rollouts = mixed_rollouts()
    teacher = [r for r in rollouts if r.meta["role"] == "teacher"]
    student = [r for r in rollouts if r.meta["role"] == "student"]
    n_t = sum(len(r.completion_ids) for r in teacher)
    n_s = sum(len(r.completion_ids) for r in student)
    g_t = _update_gradient(pop, teacher, "balanced", monkeypatch)
    g_s = _update_gradient(pop, student, "balanced", monkeypatch)
    balanced = _update_gradient(pop, rollouts, "balanced", monkeypatch)
    tokens = _update_gradient(pop, rollouts, "tokens", monkeypatch)
    torch.testing.assert_close(balanced, 0.5 * g_t + 0.5 * g_s, rtol=1e-4, atol=2e-6)
    torch.testing.assert_close(tokens, (n_t * g_t + n_s * g_s) / (n_t + n_s), rtol=1e-4, atol=2e-6)
    assert n_t != n_s and not torch.allclose(balanced, tokens, rtol=1e-3)
