"""Advantage estimators pinned against hand-computed tensors (masks, unequal lengths, groups of one,
all-equal rewards, scopes)."""

from __future__ import annotations

import math

import pytest
import torch

from agents.advantages import (
    GROUP_EPS,
    _returns,
    estimator_params,
    get_advantage,
    group_by_member,
    group_by_prompt,
    group_by_role_task,
    list_advantages,
    masked_whiten,
    register_advantage,
    unregister_advantage,
)
from agents.rollout import Rollout
from agents.trainer_config import TrainerConfig
from populora_env.checks import ConfigError

EPS = 1e-6


def mask_from_lengths(lengths: list[int], T: int) -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])


def tiled(values: list[float], lengths: list[int], T: int) -> torch.Tensor:
    return torch.tensor(
        [[v if t < n else 0.0 for t in range(T)] for v, n in zip(values, lengths, strict=True)]
    )


# Group estimators share one batch: group "a" = (1, 0, 2) (mean 1, unbiased std 1), "b" = a single
# completion with reward 0.5, "c" = (3, 3) all equal. Unequal lengths incl. an empty completion (row 6).
REWARDS = torch.tensor([1.0, 0.0, 2.0, 0.5, 3.0, 3.0, 2.0])
GROUPS = ["a", "a", "a", "b", "c", "c", "a2"]
LENGTHS = [2, 4, 1, 3, 4, 2, 0]
T = 4
MASK = mask_from_lengths(LENGTHS, T)


def test_registry_lists_builtins_and_rejects_duplicates():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(list_advantages())
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda *a, **k: None)
    with pytest.raises(KeyError, match="known: .*grpo.*reinforce_pp"):
        get_advantage("nope")


def test_registering_a_new_estimator_makes_it_available():
    name = "test_only_constant_one"

    @register_advantage(name)
    def const(rewards, response_mask, group_ids, **kw):
        return response_mask.float()

    try:
        assert name in list_advantages()
        assert torch.equal(get_advantage(name)(REWARDS, MASK, GROUPS), MASK)
    finally:
        assert unregister_advantage(name) is const
    assert name not in list_advantages()
    with pytest.raises(KeyError, match="unknown advantage estimator 'test_only_constant_one'; known: "):
        unregister_advantage(name)


def test_estimator_settings_are_the_named_keyword_parameters():
    """An estimator's settings are its named keyword parameters other than what the trainer passes; the
    built-ins' ``**_`` catch-all takes none, so a misspelt key is refused, naming it and the accepted ones."""
    assert estimator_params(get_advantage("grpo")) == {"eps": GROUP_EPS}
    assert estimator_params(get_advantage("reinforce_pp")) == {"gamma": 1.0}
    for name in ("dr_grpo", "rloo", "reinforce_pp_baseline"):
        assert estimator_params(get_advantage(name)) == {}
    TrainerConfig(advantage="grpo", advantage_kwargs={"eps": 1e-4}).validate()
    with pytest.raises(ConfigError) as err:
        TrainerConfig(advantage="grpo", advantage_kwargs={"epsilon": 1e-4}).validate()
    assert err.value.field == "advantage_kwargs"
    assert err.value.reason == "estimator 'grpo' takes no keyword argument 'epsilon' (it takes: eps)"
    with pytest.raises(ConfigError, match="'scope_ids' .* takes: gamma"):  # the trainer's own argument
        TrainerConfig(advantage="reinforce_pp", advantage_kwargs={"scope_ids": 1.0}).validate()

    @register_advantage("test_only_tempered")
    def tempered(rewards, response_mask, group_ids, *, temperature: float = 1.0, **kw):
        return response_mask.float() / temperature

    try:
        TrainerConfig(advantage="test_only_tempered", advantage_kwargs={"temperature": 2.0}).validate()
        with pytest.raises(ConfigError, match="'temp' .* takes: temperature"):
            TrainerConfig(advantage="test_only_tempered", advantage_kwargs={"temp": 2.0}).validate()
    finally:
        unregister_advantage("test_only_tempered")


def test_grpo_hand_computed():
    adv = get_advantage("grpo")(REWARDS, MASK, GROUPS)
    # a: (r - 1) / (1 + eps); b: size one -> mu 0, sigma 1 -> 0.5 / (1 + eps); c: all equal -> 0;
    # a2: size one -> 2 / (1 + eps) but its completion is empty -> no token.
    per_seq = [0.0, -1 / (1 + EPS), 1 / (1 + EPS), 0.5 / (1 + EPS), 0.0, 0.0, 2 / (1 + EPS)]
    torch.testing.assert_close(adv, tiled(per_seq, LENGTHS, T))
    assert adv[6].abs().sum() == 0


def test_grpo_unbiased_std():
    # group (0, 1): mean 0.5, unbiased std sqrt(0.5) (the biased std would be 0.5)
    adv = get_advantage("grpo")(torch.tensor([0.0, 1.0]), torch.ones(2, 1), ["g", "g"])
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.5 / (s + EPS)], [0.5 / (s + EPS)]]))


def test_dr_grpo_hand_computed():
    adv = get_advantage("dr_grpo")(REWARDS, MASK, GROUPS)
    per_seq = [0.0, -1.0, 1.0, 0.5, 0.0, 0.0, 2.0]
    torch.testing.assert_close(adv, tiled(per_seq, LENGTHS, T))


def test_rloo_hand_computed():
    adv = get_advantage("rloo")(REWARDS, MASK, GROUPS)
    # a: 1 - (0+2)/2 = 0; 0 - (1+2)/2 = -1.5; 2 - (1+0)/2 = 1.5; groups of one -> 0; all equal -> 0
    per_seq = [0.0, -1.5, 1.5, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, tiled(per_seq, LENGTHS, T))
    # identity n/(n-1) (s_i - mu)
    ga = torch.tensor([1.0, 0.0, 2.0])
    torch.testing.assert_close(adv[[0, 1, 2], 0], 3 / 2 * (ga - ga.mean()))


def test_reinforce_pp_global_whitening_token_weighted():
    rewards = torch.tensor([1.0, 0.0, 2.0])
    lengths = [1, 2, 3]
    mask = mask_from_lengths(lengths, 3)
    adv = get_advantage("reinforce_pp")(rewards, mask, ["x", "y", "z"])
    # valid tokens: 1 | 0 0 | 2 2 2 -> N = 6, mean = 7/6,
    # var (Bessel) = [(1-7/6)^2 + 2 (7/6)^2 + 3 (5/6)^2] / 5 = (1 + 98 + 75) / 36 / 5 = 29/30
    mean, var = 7 / 6, 29 / 30
    per_seq = [(r - mean) / math.sqrt(var + 1e-8) for r in (1.0, 0.0, 2.0)]
    torch.testing.assert_close(adv, tiled(per_seq, lengths, 3))
    # whitened over valid tokens: zero mean, unit (Bessel) variance
    v = adv[mask.bool()]
    assert abs(v.mean().item()) < 1e-6 and abs(v.var().item() - 1) < 1e-5


def test_reinforce_pp_scopes_and_degenerate_scopes():
    rewards = torch.tensor([1.0, 0.0, 2.0, 5.0, 4.0])
    lengths = [1, 2, 3, 1, 2]
    scopes = [("solver", "ded"), ("solver", "ded"), ("solver", "abd"), ("proposer", "ind"), ("p", "x")]
    mask = mask_from_lengths(lengths, 3)
    adv = get_advantage("reinforce_pp")(rewards, mask, [0] * 5, scope_ids=scopes)
    # scope (solver, ded): tokens 1 | 0 0 -> mean 1/3, var = ((2/3)^2 + 2 (1/3)^2)/2 = 1/3
    s = math.sqrt(1 / 3 + 1e-8)
    # scope (solver, abd): 3 equal tokens -> centred 0 -> 0 / sqrt(0 + 1e-8) = 0
    # scope (proposer, ind): one token -> centred only -> 0
    # scope (p, x): 2 equal tokens -> 0
    per_seq = [(2 / 3) / s, (-1 / 3) / s, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, tiled(per_seq, lengths, 3))
    # scope None == one scope for the batch
    adv_all = get_advantage("reinforce_pp")(rewards, mask, [0] * 5, scope_ids=None)
    adv_one = get_advantage("reinforce_pp")(rewards, mask, [0] * 5, scope_ids=["s"] * 5)
    torch.testing.assert_close(adv_all, adv_one)


def test_reinforce_pp_baseline_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 2.0, 5.0, 7.0])
    groups = ["a", "a", "b", "b", "c"]
    lengths = [1, 2, 1, 2, 2]
    mask = mask_from_lengths(lengths, 2)
    adv = get_advantage("reinforce_pp_baseline")(rewards, mask, groups)
    # centred: a -> (0.5, -0.5), b -> (-1.5, 1.5), c (size one, mu = 0) -> 7
    # tokens: 0.5 | -0.5 -0.5 | -1.5 | 1.5 1.5 | 7 7  -> N = 8, sum = 15, mean = 15/8
    toks = [0.5, -0.5, -0.5, -1.5, 1.5, 1.5, 7.0, 7.0]
    mean = 15 / 8
    var = sum((x - mean) ** 2 for x in toks) / 7
    per_seq = [(c - mean) / math.sqrt(var + 1e-8) for c in (0.5, -0.5, -1.5, 1.5, 7.0)]
    torch.testing.assert_close(adv, tiled(per_seq, lengths, 2))


def test_reinforce_pp_baseline_all_equal_rewards_gives_zero():
    adv = get_advantage("reinforce_pp_baseline")(
        torch.tensor([1.0, 1.0, 1.0]), mask_from_lengths([3, 1, 2], 3), ["g", "g", "g"]
    )
    assert torch.equal(adv, torch.zeros(3, 3))


def test_reinforce_pp_all_equal_rewards_gives_zero():
    adv = get_advantage("reinforce_pp")(torch.tensor([-1.0, -1.0]), mask_from_lengths([3, 1], 3), [0, 1])
    assert torch.equal(adv, torch.zeros(2, 3))


def test_returns_with_token_rewards_and_gamma():
    mask = mask_from_lengths([3, 2], 4)
    tok = torch.tensor([[-0.1, -0.2, -0.3, -9.0], [0.5, 0.25, 9.0, 9.0]])  # padding entries ignored
    G = _returns(torch.tensor([1.0, 2.0]), mask, tok, gamma=1.0)
    # row 0: r_t = (-0.1, -0.2, 0.7) -> G = (0.4, 0.5, 0.7); row 1: r_t = (0.5, 2.25) -> G = (2.75, 2.25)
    torch.testing.assert_close(G, torch.tensor([[0.4, 0.5, 0.7, 0.0], [2.75, 2.25, 0.0, 0.0]]))
    G = _returns(torch.tensor([1.0, 2.0]), mask, None, gamma=0.5)
    torch.testing.assert_close(G, torch.tensor([[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]]))


def test_returns_discount_full_length_rows():
    """G_t = Σ_{t' ≥ t} γ^{t'−t} r_t' on rows that fill the whole width (no padding to hide the last token)."""
    mask = torch.ones(2, 4)
    tok = torch.tensor([[0.1, 0.0, -0.2, 0.0], [0.0, 0.3, 0.0, 0.4]], dtype=torch.float64)
    gamma = 0.5
    G = _returns(torch.tensor([1.0, -2.0], dtype=torch.float64), mask.double(), tok, gamma=gamma)
    r = tok.clone()
    r[:, -1] += torch.tensor([1.0, -2.0], dtype=torch.float64)
    want = torch.tensor(
        [[sum(gamma ** (u - t) * float(r[i, u]) for u in range(t, 4)) for t in range(4)] for i in range(2)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(G, want, rtol=1e-12, atol=1e-12)
    # reinforce_pp whitens exactly these returns
    adv = get_advantage("reinforce_pp")(torch.tensor([1.0, -2.0], dtype=torch.float64), mask.double(), None,
                                        token_rewards=tok, gamma=gamma)
    v = want.flatten()
    torch.testing.assert_close(adv, (want - v.mean()) / torch.sqrt(v.var() + 1e-8), rtol=1e-12, atol=1e-12)


def test_grpo_eps_is_added_to_the_std():
    """eps = 1e-6 is added to σ (not to σ², not subtracted): visible on a group whose σ is ~1e-6."""
    rewards = torch.tensor([0.0, 2e-6], dtype=torch.float64)
    adv = get_advantage("grpo")(rewards, torch.ones(2, 1, dtype=torch.float64), ["g", "g"])
    sigma = math.sqrt(2) * 1e-6  # unbiased std of (0, 2e-6)
    want = torch.tensor([[-1e-6 / (sigma + 1e-6)], [1e-6 / (sigma + 1e-6)]], dtype=torch.float64)
    torch.testing.assert_close(adv, want, rtol=1e-12, atol=0.0)


def test_whitening_eps_is_inside_the_sqrt():
    """masked_whiten: (x − mean)/√(var + 1e-8), visible when var ~ 1e-8; two tokens are whitened, not only
    centred (N ≤ 1 is the degenerate case)."""
    d = 1e-4
    x = torch.tensor([[0.0], [d]], dtype=torch.float64)
    out = masked_whiten(x, torch.ones(2, 1, dtype=torch.float64))
    var = d * d / 2  # Bessel, N = 2
    want = torch.tensor([[-d / 2], [d / 2]], dtype=torch.float64) / math.sqrt(var + 1e-8)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=0.0)


def test_group_scores_add_rewards_and_token_rewards():
    """s_i = r_i + Σ_t token_rewards (both parts matter) for every group estimator."""
    mask = mask_from_lengths([2, 1, 2], 2).double()
    tok = torch.tensor([[-0.5, -0.25], [0.125, 99.0], [0.0, 0.5]], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    s = torch.tensor([1.0 - 0.75, 0.125, 2.5], dtype=torch.float64)
    mean, std = s.mean(), s.std()
    want_seq = {
        "grpo": (s - mean) / (std + 1e-6),
        "dr_grpo": s - mean,
        "rloo": s - (s.sum() - s) / 2,
    }
    for name, per_seq in want_seq.items():
        adv = get_advantage(name)(rewards, mask, ["g"] * 3, token_rewards=tok)
        torch.testing.assert_close(adv, per_seq[:, None] * mask, rtol=1e-12, atol=1e-12, msg=name)


def test_group_estimators_use_token_rewards_in_the_score():
    mask = mask_from_lengths([2, 1], 2)
    tok = torch.tensor([[-0.5, -0.5], [-0.25, 99.0]])
    # scores: 1 - 1 = 0 and 1 - 0.25 = 0.75 -> dr_grpo: mean 0.375 -> (-0.375, 0.375)
    adv = get_advantage("dr_grpo")(torch.tensor([1.0, 1.0]), mask, ["g", "g"], token_rewards=tok)
    torch.testing.assert_close(adv, torch.tensor([[-0.375, -0.375], [0.375, 0.0]]))


def test_masked_whiten_edge_cases():
    assert torch.equal(masked_whiten(torch.ones(2, 2), torch.zeros(2, 2)), torch.zeros(2, 2))
    one = masked_whiten(torch.tensor([[3.0, 5.0]]), torch.tensor([[1.0, 0.0]]))
    assert torch.equal(one, torch.zeros(1, 2))


def test_bool_mask_and_integer_rewards_accepted():
    adv_b = get_advantage("grpo")(torch.tensor([1, 0]), torch.tensor([[True, False], [True, True]]), [1, 1])
    adv_f = get_advantage("grpo")(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), [1, 1])
    torch.testing.assert_close(adv_b, adv_f)


def test_shape_errors():
    with pytest.raises(ValueError, match="group_ids"):
        get_advantage("grpo")(torch.zeros(3), torch.ones(3, 2), [1, 2])
    with pytest.raises(ValueError, match="response_mask"):
        get_advantage("grpo")(torch.zeros(3), torch.ones(2, 2), [1, 2, 3])
    with pytest.raises(ValueError, match="scope_ids"):
        get_advantage("reinforce_pp")(torch.zeros(3), torch.ones(3, 2), None, scope_ids=[1])


def test_grouping_helpers():
    rs = [
        Rollout([1, 2], [3], 1.0, meta={"role": "solver", "task_type": "deduction", "member": "s0"}),
        Rollout([1, 2], [4], 0.0, meta={"role": "solver", "task_type": "abduction", "agent": "s1"}),
        Rollout([5], [4], 0.0, meta={"role": "proposer", "task_type": "deduction", "member": "t0"}),
    ]
    p = group_by_prompt(rs)
    assert p[0] == p[1] != p[2]
    assert group_by_role_task(rs) == [
        ("solver", "deduction"),
        ("solver", "abduction"),
        ("proposer", "deduction"),
    ]
    assert group_by_member(rs) == ["s0", "s1", "t0"]
    with pytest.raises(KeyError, match="task_type"):
        group_by_role_task([Rollout([1], [2], 0.0, meta={"role": "solver"})])
    with pytest.raises(KeyError, match="member"):
        group_by_member([Rollout([1], [2], 0.0)])


def test_reinforce_pp_baseline_groups_of_one_keep_their_raw_reward_before_whitening():
    """veRL semantics on a baseline-shaped batch: proposals are groups of one (their raw reward is the centred
    score), attempts are groups of two (centred on their task's mean); each role is its own whitening scope."""
    rewards = torch.tensor([0.5, -1.0, 0.25, 1.0, -0.5, 1.0, 1.0])
    groups = ["p0", "p1", "p2", "t0", "t0", "t1", "t1"]
    scopes = ["teacher"] * 3 + ["student"] * 4
    lengths = [1, 2, 1, 1, 1, 2, 1]
    mask = mask_from_lengths(lengths, 2)
    adv = get_advantage("reinforce_pp_baseline")(rewards, mask, groups, scope_ids=scopes)
    # teacher scope: raw rewards 0.5 | -1 -1 | 0.25 over 4 tokens
    t_toks = [0.5, -1.0, -1.0, 0.25]
    t_mean = sum(t_toks) / 4
    t_std = math.sqrt(sum((x - t_mean) ** 2 for x in t_toks) / 3 + 1e-8)
    # student scope: t0 = (1, -0.5) centred on 0.25 -> (0.75, -0.75); t1 = (1, 1) -> (0, 0); tokens 0.75 | -0.75
    # | 0 0 | 0 (mean 0)
    s_toks = [0.75, -0.75, 0.0, 0.0, 0.0]
    s_std = math.sqrt(sum(x * x for x in s_toks) / 4 + 1e-8)
    expected = [(r - t_mean) / t_std for r in (0.5, -1.0, 0.25)] + [c / s_std for c in (0.75, -0.75, 0.0, 0.0)]
    torch.testing.assert_close(adv, tiled(expected, lengths, 2))
    # the same teacher rows through reinforce_pp (no centring): identical, groups of one are not centred
    alone = get_advantage("reinforce_pp")(rewards[:3], mask[:3], scope_ids=scopes[:3])
    torch.testing.assert_close(adv[:3], alone)
