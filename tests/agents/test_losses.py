"""Policy loss pinned on hand-made examples: aggregation modes, clipping with ratio != 1, KL estimators,
entropy, micro-batch consistency."""

from __future__ import annotations

import math

import pytest
import torch

from agents.losses import (
    agg_loss,
    entropy_from_logits,
    get_loss_agg,
    kl_penalty,
    list_loss_aggs,
    logprobs_from_logits,
    policy_loss,
    register_loss_agg,
    register_loss_term,
    unregister_loss_agg,
    unregister_loss_term,
    zero_advantage_rows_add_zero,
)

# rows: tokens (1, 2, 3) and (4); padding holds garbage that must be ignored (it does not sum to 0)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, -30.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 4),  # (1+2+3+4) / 4 tokens
        ("seq-mean-token-mean", (2 + 4) / 2),  # mean of per-sequence means
        ("seq-mean-token-sum", (6 + 4) / 2),  # mean of per-sequence sums
        ("seq-mean-token-sum-norm", 10 / (3 * 2)),  # sum / (L = T = 3, G = 2)
    ],
)
def test_aggregation_modes_hand_computed(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_aggregation_with_explicit_normalisers():
    assert agg_loss(LOSS, MASK, "token-mean", num_tokens=8).item() == pytest.approx(10 / 8)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=5).item() == pytest.approx(10 / 10)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(6 / 4)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batches_with_global_normalisers_sum_to_the_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g)
    lengths = [5, 1, 3, 4, 2, 5]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(5)] for n in lengths])
    full = agg_loss(loss, mask, mode)
    norms = {"num_tokens": mask.sum().item(), "num_seqs": 6, "norm_len": 5}
    parts = sum(agg_loss(loss[i : i + 2], mask[i : i + 2], mode, **norms) for i in range(0, 6, 2))
    torch.testing.assert_close(parts, full)


def test_agg_registry():
    assert set(list_loss_aggs()) >= {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    with pytest.raises(KeyError, match="known: seq-mean-token-mean"):
        get_loss_agg("mean")
    with pytest.raises(ValueError, match="already registered"):
        register_loss_agg("token-mean")(lambda *a: a[0].sum())
    name = "test-only-max"
    register_loss_agg(name)(lambda loss, mask, n_tok, n_seq, length: (loss * mask).max())
    try:
        assert agg_loss(LOSS, MASK, name).item() == 4.0
    finally:
        unregister_loss_agg(name)
    assert name not in list_loss_aggs()
    with pytest.raises(KeyError, match="unknown loss aggregation mode 'test-only-max'"):
        unregister_loss_agg(name)


def test_clipping_active_with_ratio_not_one():
    # ratios 1.5, 0.5, 0.5, 1.5 ; advantages +1, +1, -1, -1 ; eps 0.2
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    out = policy_loss(lp, old, adv, torch.ones(1, 4), clip_eps_low=0.2, clip_eps_high=0.2)
    # l = -min(rho A, clip(rho) A): -1.2 (clipped), -0.5, +0.8 (clipped), +1.5
    per_tok = [-1.2, -0.5, 0.8, 1.5]
    assert out.loss.item() == pytest.approx(sum(per_tok) / 4)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.25)
    assert out.metrics["clip_frac_low"] == pytest.approx(0.25)
    out.loss.backward()
    # d l / d lp = -A rho on unclipped tokens, 0 on clipped ones; token-mean divides by 4
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -0.5, 0.0, 1.5]]) / 4)
    # approx_kl = mean(rho - 1 - log rho)
    r = torch.tensor([1.5, 0.5, 0.5, 1.5])
    assert out.metrics["approx_kl"] == pytest.approx((r - 1 - r.log()).mean().item(), rel=1e-5)


def test_asymmetric_clip_high():
    lp = torch.log(torch.tensor([[1.5]]))
    out = policy_loss(lp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_eps_high=0.28)
    assert out.loss.item() == pytest.approx(-1.28)


def test_ratio_one_is_plain_policy_gradient():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = policy_loss(lp, lp.detach(), adv, mask)
    assert out.loss.item() == pytest.approx(-2.0)
    assert out.metrics["clip_frac"] == 0.0 and out.metrics["approx_kl"] == 0.0 and out.metrics["tokens"] == 2
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -1.0, 0.0]]))  # -A / N_tok, padding 0


def test_kl_estimators_values():
    lp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(2.0)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 - 1 + d)  # e^{-d} - 1 + d
    with pytest.raises(KeyError, match="k1, k2, k3"):
        kl_penalty(lp, ref, "k4")


def test_k3_kl_loss_term_and_entropy_bonus():
    lp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    ent = torch.tensor([[2.0, 4.0]])
    adv = torch.zeros(1, 2)
    out = policy_loss(
        lp, lp.detach(), adv, torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01
    )
    k3 = (0.5 - 1 + math.log(2.0) + 0.0) / 2
    assert out.metrics["kl"] == pytest.approx(k3)
    assert out.metrics["entropy"] == pytest.approx(3.0)
    assert out.loss.item() == pytest.approx(0.1 * k3 - 0.01 * 3.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp.detach(), adv, torch.ones(1, 2), kl_coef=0.1)


def test_shape_and_eps_errors():
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="clip_eps_low"):
        policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), clip_eps_low=1.0
        )


def test_logprobs_and_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e9, -1e9]])
    assert entropy_from_logits(logits)[0].item() == pytest.approx(math.log(4))
    # p = (3/4, 1/4): H = -(3/4 log 3/4 + 1/4 log 1/4)
    assert entropy_from_logits(logits)[1].item() == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    )
    lp = logprobs_from_logits(logits, torch.tensor([2, 0]))
    torch.testing.assert_close(lp, torch.tensor([math.log(0.25), math.log(0.75)]))


def test_normalisers_are_floored_at_one():
    """max(N_tok, 1), max(G, 1), max(L, 1): one valid token is divided by 1, an empty batch gives 0."""
    one = torch.tensor([[5.0, 7.0]])
    m = torch.tensor([[1.0, 0.0]])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert agg_loss(one, m, mode).item() == 5.0, mode
    assert agg_loss(one, m, "seq-mean-token-sum-norm").item() == 5.0 / 2  # L = T = 2, G = 1
    assert agg_loss(one, m, "seq-mean-token-sum-norm", norm_len=0.5).item() == 5.0  # L floored at 1
    assert agg_loss(one, m, "token-mean", num_tokens=0.25).item() == 5.0  # N_tok floored at 1
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert agg_loss(one, torch.zeros(1, 2), mode).item() == 0.0, mode


def test_kl_estimators_clamp_delta_and_k3():
    """δ = lp − lp_ref is clamped to [−20, 20]; k3 = e^{−δ} − 1 + δ is clamped to [−10, 10] (verl)."""
    lp = torch.tensor([25.0, -25.0, -3.0, 3.0], dtype=torch.float64)
    ref = torch.zeros(4, dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), torch.tensor([20.0, -20.0, -3.0, 3.0], dtype=torch.float64))
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), torch.tensor([200.0, 200.0, 4.5, 4.5], dtype=torch.float64))
    k3 = torch.tensor([min(10.0, math.exp(-d) - 1 + d) for d in (20.0, -20.0, -3.0, 3.0)], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), k3)
    assert k3.tolist()[1:3] == [10.0, 10.0]  # e^{20} and e^{3} − 4 = 16.1 are both clamped


def test_logprobs_and_entropy_over_the_last_dim_of_3d_logits():
    """[B, T, V] logits (the trainer's shape): softmax, logsumexp and the gather run over V only."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3), generator=g)
    logp = torch.log_softmax(logits, dim=-1)
    want_lp = logp.gather(-1, targets[..., None])[..., 0].float()
    want_h = -(logp.exp() * logp).sum(-1).float()
    torch.testing.assert_close(logprobs_from_logits(logits, targets), want_lp)
    torch.testing.assert_close(entropy_from_logits(logits), want_h)


def test_clip_fraction_metrics_count_only_the_clipped_side():
    """clip_frac_low = share of tokens with ρ < 1 − ε_low and A < 0; clip_frac_high: ρ > 1 + ε_high and A > 0."""
    ratios = [0.5, 0.9, 0.5, 0.5, 2.0, 1.1, 2.0, 2.0]
    advs = [-1.0, -1.0, 0.0, 0.5, 1.0, 1.0, 0.0, -0.5]
    # low: only token 0 (token 1 is inside [0.8, 1.3]; 2 has A = 0; 3 has A > 0)
    # high: only token 4 (5 is inside; 6 has A = 0; 7 has A < 0)
    lp = torch.log(torch.tensor([ratios]))
    out = policy_loss(lp, torch.zeros(1, 8), torch.tensor([advs]), torch.ones(1, 8), clip_eps_low=0.2,
                      clip_eps_high=0.3)
    assert out.metrics["clip_frac_low"] == 1 / 8 and out.metrics["clip_frac_high"] == 1 / 8
    # on the boundary (ρ = 1 exactly, ε = 0) nothing is "below" or "above"
    z = torch.zeros(1, 2)
    out = policy_loss(z, z, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), clip_eps_low=0.0, clip_eps_high=0.0)
    assert out.metrics["clip_frac_low"] == 0.0 and out.metrics["clip_frac_high"] == 0.0


def test_metrics_ignore_padding_and_handle_tiny_batches():
    lp = torch.tensor([[math.log(2.0), math.log(0.5), 50.0]])  # last entry is padding (garbage)
    old = torch.zeros(1, 3)
    m = torch.tensor([[1.0, 1.0, 0.0]])
    out = policy_loss(lp, old, torch.ones(1, 3), m)
    assert out.metrics["ratio_max"] == pytest.approx(2.0) and out.metrics["ratio_mean"] == pytest.approx(1.25)
    assert out.metrics["approx_kl"] == pytest.approx(((1 - math.log(2)) + (-0.5 + math.log(2))) / 2)
    assert out.metrics["tokens"] == 2.0
    single = policy_loss(lp[:, :1], old[:, :1], torch.ones(1, 1), torch.ones(1, 1))
    assert single.metrics["ratio_max"] == pytest.approx(2.0) and single.metrics["ratio_mean"] == pytest.approx(2.0)
    empty = policy_loss(lp, old, torch.ones(1, 3), torch.zeros(1, 3))
    assert math.isnan(empty.metrics["ratio_max"])
    assert empty.metrics["ratio_mean"] == 0.0 and empty.metrics["approx_kl"] == 0.0 and empty.metrics["tokens"] == 0.0


def test_log_ratio_is_clamped_to_20():
    out = policy_loss(torch.tensor([[25.0, -25.0]]), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(20.0))
    low = policy_loss(torch.tensor([[-25.0]]), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    assert low.metrics["ratio_mean"] == pytest.approx(math.exp(-20.0), rel=1e-5)


def test_default_clip_range_is_0_2_on_both_sides():
    lp = torch.log(torch.tensor([[1.5, 0.5]]))
    out = policy_loss(lp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert out.loss.item() == pytest.approx((-1.2 + 0.8) / 2)  # clipped at 1.2 and at 0.8


def test_zero_clip_epsilons_are_accepted():
    z = torch.zeros(1, 2)
    out = policy_loss(z, z, torch.ones(1, 2), torch.ones(1, 2), clip_eps_low=0.0, clip_eps_high=0.0)
    assert out.loss.item() == -1.0
    for bad in ({"clip_eps_low": -0.1}, {"clip_eps_high": -0.1}):
        with pytest.raises(ValueError, match="clip_eps"):
            policy_loss(z, z, torch.ones(1, 2), torch.ones(1, 2), **bad)


def test_entropy_and_kl_coefficients_of_one():
    """L = pg − c_ent·agg(H) + β·agg(KL) also for c_ent = β = 1."""
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    ent = torch.tensor([[2.0, 4.0]])
    out = policy_loss(lp, lp, torch.zeros(1, 2), torch.ones(1, 2), entropy=ent, entropy_coef=1.0,
                      ref_logprobs=ref, kl_coef=1.0)
    k3 = (0.5 - 1 + math.log(2.0)) / 2
    assert out.loss.item() == pytest.approx(k3 - 3.0)


def test_an_extra_loss_term_is_added_aggregated_and_reported():
    """``register_loss_term``: L += coef * agg(w * f) in the call's aggregation mode, metric = masked mean of f."""
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    kw = {"loss_agg_mode": "seq-mean-token-mean"}
    plain = policy_loss(lp, lp.detach(), adv, MASK, **kw)
    register_loss_term("_lp_square", 0.5)(lambda x: x.logprobs.square())
    try:
        out = policy_loss(lp, lp.detach(), adv, MASK, **kw)
    finally:
        unregister_loss_term("_lp_square")
    # per-sequence means of lp^2: (1 + 4 + 9) / 3 and 0.25; their mean; times 0.5
    assert out.loss.item() == pytest.approx(plain.loss.item() + 0.5 * ((14 / 3 + 0.25) / 2))
    assert out.metrics["_lp_square"] == pytest.approx((14 + 0.25) / 4)
    assert out.pg_loss.item() == plain.pg_loss.item()
    with pytest.raises(ValueError, match="taken by a metric"):
        register_loss_term("entropy", 0.1)


def test_the_loss_declares_whether_zero_advantage_rows_add_zero():
    """Only the clipped surrogate, and extra terms that say so, vanish where A = 0."""
    assert zero_advantage_rows_add_zero()
    assert not zero_advantage_rows_add_zero(entropy_coef=0.001)
    assert not zero_advantage_rows_add_zero(kl_coef=0.1)
    register_loss_term("_idle", 0.0)(lambda x: x.logprobs)
    register_loss_term("_declared", 1.0, vanishes_at_zero_advantage=True)(lambda x: x.advantages * x.logprobs)
    try:
        assert zero_advantage_rows_add_zero()  # a term of coefficient 0 adds nothing; a declared one vanishes
        register_loss_term("_undeclared", 1e-3)(lambda x: x.logprobs)
        assert not zero_advantage_rows_add_zero()
    finally:
        for name in ("_idle", "_declared", "_undeclared"):
            unregister_loss_term(name)
    # what it declares holds: zero advantages, no entropy or KL -> the loss and its gradient are exactly zero
    lp = torch.randn(2, 3, requires_grad=True)
    out = policy_loss(lp, lp.detach() + 0.3, torch.zeros(2, 3), MASK, entropy=torch.rand(2, 3))
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.count_nonzero(lp.grad) == 0


def test_importance_weights_scale_each_tokens_surrogate():
    """``is_weights`` (TIS / MIS, module docstring): the surrogate of token t is multiplied by w'_t, the entropy
    bonus is not, the gradient follows, and weights of one leave the loss bit for bit as without them."""
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(2, 4, generator=g, requires_grad=True)
    old = lp.detach() + 0.1 * torch.randn(2, 4, generator=g)
    adv = torch.randn(2, 4, generator=g)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    w = torch.tensor([[0.5, 2.0, 1.0, 7.0], [0.0, 1.5, 3.0, 3.0]])
    ent = torch.rand(2, 4, generator=g)
    plain = policy_loss(lp, old, adv, mask, entropy=ent, entropy_coef=0.1)
    ones = policy_loss(lp, old, adv, mask, entropy=ent, entropy_coef=0.1, is_weights=torch.ones(2, 4))
    assert torch.equal(plain.loss, ones.loss) and torch.equal(plain.pg_loss, ones.pg_loss)
    weighted = policy_loss(lp, old, adv, mask, entropy=ent, entropy_coef=0.1, is_weights=w)
    rho = torch.exp(lp.detach() - old)
    surrogate = torch.maximum(-adv * rho, -adv * rho.clamp(0.8, 1.2))
    want = (w * surrogate * mask).sum() / mask.sum()
    torch.testing.assert_close(weighted.pg_loss, want)
    torch.testing.assert_close(weighted.loss - weighted.pg_loss, plain.loss - plain.pg_loss)  # the bonus: unweighted
    grad_w, = torch.autograd.grad(weighted.loss, lp)  # the entropy here carries no gradient: the surrogate's
    grad_1, = torch.autograd.grad(plain.loss, lp)
    torch.testing.assert_close(grad_w, w * grad_1 * mask)
    with pytest.raises(ValueError, match="is_weights must be"):
        policy_loss(lp, old, adv, mask, is_weights=torch.ones(3))
