"""Prefix-shared, unpadded update packing (``agents.packing``, ``TrainerConfig.packing``) and the skipped
forward/backward of zero-advantage steps.

Tolerance of "equal gradients": for every LoRA tensor, max |g_prefix - g_padded| <= 1e-4 * max |g_padded|
(+1e-7), and the losses within 1e-6 (+1e-5 relative); float32 on tiny-random. Measured: ~2e-6 relative
(summation order only)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.packing import pack_prefix_shared, prefix_shared_tokens, prompt_groups
from agents.rollout import Rollout
from agents.trainer import PolicyGradientTrainer, TrainerConfig
from tests.agents.test_trainer import grads_of


def shared_rollouts(n_prompts: int = 3, attempts: int = 3, seed: int = 0, vocab: int = 1000) -> list[Rollout]:
    """Students' shape: ``attempts`` completions per prompt, prompts longer than completions, some prompts
    with a common beginning, shuffled."""
    rng = random.Random(seed)
    out = []
    instructions = [rng.randrange(vocab) for _ in range(5)]
    for g in range(n_prompts):  # the odd groups' prompts start with the same 5 tokens
        p = (instructions if g % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randint(8, 14))]
        for _ in range(attempts):
            c = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            out.append(Rollout(p, c, rng.random(), group=g, scope=("solver", g % 2)))
    rng.shuffle(out)
    return out


# ------------------------------------------------------------------------------------------ the layout


def _visible(packed, i: int, t: int, prompts, completions) -> list[tuple[int, int]]:
    """(token, position) pairs that the hidden state predicting completion token t of rollout i attends to."""
    r, c = packed.predictor_index(torch.tensor([i]), torch.tensor([t]))
    keys = (packed.attention_mask[r[0], 0, c[0]] == 0).nonzero().flatten().tolist()
    return sorted((packed.input_ids[r[0], k].item(), packed.position_ids[r[0], k].item()) for k in keys)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # prompt id: equal ids share a prompt, others may share a prefix
            st.lists(st.integers(0, 50), min_size=0, max_size=5),  # completion
        ),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=4, max_size=4),
)
def test_each_predictor_sees_exactly_its_own_prompt_and_prefix(rows, prompt_pool):
    """Against the padded layout's definition: the state predicting completion token t of rollout i sees
    (token, position) = its prompt at 0..P-1 and its own completion tokens < t at P.., nothing else; and the
    token it predicts from is the right one."""
    prompts = [prompt_pool[k] for k, _ in rows]
    completions = [c for _, c in rows]
    packed = pack_prefix_shared(prompts, completions)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        for t in range(len(c)):
            seq = p + c[:t]
            expected = sorted((tok, pos) for pos, tok in enumerate(seq))
            assert _visible(packed, i, t, prompts, completions) == expected
            r, col = packed.predictor_index(torch.tensor([i]), torch.tensor([t]))
            assert packed.input_ids[r[0], col[0]].item() == seq[-1]
            assert packed.position_ids[r[0], col[0]].item() == len(seq) - 1
    # every distinct prompt prefix appears once (the radix tree), then every completion
    prefixes = {tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)}
    assert prefix_shared_tokens(prompts) == len(prefixes) <= sum(len(p) for p in {tuple(p) for p in prompts})
    assert packed.real_tokens == len(prefixes) + sum(map(len, completions))
    assert packed.tokens >= packed.real_tokens


def test_groups_and_errors():
    assert prompt_groups([[1, 2], [3], [1, 2], [3], [4]]) == [[0, 2], [1, 3], [4]]
    with pytest.raises(ValueError, match="empty prompt"):
        pack_prefix_shared([[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="2 prompts for 1"):
        pack_prefix_shared([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="packing: must be one of prefix, none"):
        TrainerConfig(packing="trie").validate()


# ------------------------------------------------------------------------------------ equal gradients


def assert_close_grads(ga: list[list[torch.Tensor]], gb: list[list[torch.Tensor]]) -> None:
    assert len(ga) == len(gb) and ga
    for step_a, step_b in zip(ga, gb, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            tol = 1e-4 * b.abs().max().item() + 1e-7
            assert (a - b).abs().max().item() <= tol, ((a - b).abs().max().item(), tol)
        assert any(b.abs().max() > 0 for b in step_b)  # a real gradient was compared


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"micro_batch_size": 2},  # prompt groups split across micro-batches
        {"mini_batch_size": 4, "epochs": 2},  # several steps: behaviour log-probs, a ratio != 1
        {"gradient_checkpointing": True, "micro_batch_size": 4},
        {"entropy_coef": 0.01, "kl_mode": "loss", "kl_coef": 0.1, "loss_agg_mode": "seq-mean-token-mean"},
        {"kl_mode": "reward", "kl_coef": 0.05},
    ],
    ids=["default", "micro2", "mini-epochs", "checkpointing", "entropy-kl-loss", "kl-reward"],
)
def test_prefix_packing_gives_the_padded_gradient(population, monkeypatch, extra):
    rollouts = shared_rollouts()
    ga, ma = grads_of(population, TrainerConfig(packing="prefix", **extra), rollouts, monkeypatch)
    gb, mb = grads_of(population, TrainerConfig(packing="none", **extra), rollouts, monkeypatch)
    assert_close_grads(ga, gb)
    assert ("kl" in ma) == ("kl" in mb) == (extra.get("kl_mode", "off") != "off")
    for key in ("loss", "pg_loss", "entropy", "approx_kl", "advantage_mean", "kl"):
        if key in mb:
            assert ma[key] == pytest.approx(mb[key], rel=1e-5, abs=1e-6), key


def test_prefix_packing_processes_at_most_half_the_padded_tokens(population):
    """Students' shape (prompts ~80% of a rollout, 2-4 attempts each): the decoder processes <= 50% of the
    padded layout's token slots, for the same adapters within float noise (10% of one AdamW step of lr)."""
    rng = random.Random(3)
    rollouts = []
    for g in range(4):
        p = [rng.randrange(1000) for _ in range(rng.randint(40, 60))]
        for _ in range(2 + g % 3):
            rollouts.append(Rollout(p, [rng.randrange(1000) for _ in range(rng.randint(3, 15))], rng.random(), g))
    counts, states = {}, {}
    for packing in ("prefix", "none"):
        pop = population(nonzero_std=0.5)
        trainer = PolicyGradientTrainer(pop, TrainerConfig(packing=packing, lr=1e-3))
        trainer.update("ma", rollouts)
        counts[packing], states[packing] = trainer.forward_tokens, pop.state("ma")
    assert counts["prefix"] <= 0.5 * counts["none"], counts
    for k, v in states["none"].items():  # Adam's first step is ~lr * sign(g): noise shows where g ~ 0
        assert (states["prefix"][k] - v).abs().max() <= 0.1 * 1e-3, k


# ------------------------------------------------------------------------------------ zero advantages


def test_zero_advantage_update_skips_passes_and_equals_the_computed_one(population):
    """All rewards equal within each group (group baseline: all advantages 0). AdamW with weight decay and
    moments from an earlier real update still moves the weights: the skipped update gives bitwise the same
    adapter and optimizer state as computing the zero gradient, without a single forward pass."""
    first = shared_rollouts(seed=1)
    flat = [Rollout(r.prompt_ids, r.completion_ids, float(r.group), r.group) for r in shared_rollouts(seed=2)]
    results = {}
    for skip in (True, False):
        pop = population(nonzero_std=0.5)
        cfg = TrainerConfig(advantage="grpo", lr=1e-2, weight_decay=0.1, skip_zero_advantage=skip)
        trainer = PolicyGradientTrainer(pop, cfg)
        trainer.update("ma", first)
        before = pop.state("ma")
        tokens0 = trainer.forward_tokens
        m = trainer.update("ma", flat)
        results[skip] = (pop.state("ma"), pop.optimizer_state_dict("ma"), m, trainer.forward_tokens - tokens0)
        assert any(not torch.equal(before[k], v) for k, v in pop.state("ma").items())  # the step moved it
    (s1, o1, m1, t1), (s0, o0, m0, t0) = results[True], results[False]
    assert t1 == 0 and t0 > 0
    assert m1["zero_advantage_steps"] == 1.0 and m0["zero_advantage_steps"] == 0.0
    assert m1["grad_norm"] == m0["grad_norm"] == 0.0
    assert all(torch.equal(s1[k], s0[k]) for k in s0)
    for pid, st0 in o0["state"].items():
        for key, v in st0.items():
            assert torch.equal(o1["state"][pid][key], v), (pid, key)


def test_zero_advantage_mini_batch_is_skipped_alone(population):
    """Mini-batches of 3 rows sorted so that the first holds one all-equal-reward group: that step takes no
    forward pass, the other steps do, and the result equals the computed one."""
    rollouts = shared_rollouts(seed=4)
    rollouts.sort(key=lambda r: r.group)
    rollouts = [Rollout(r.prompt_ids, r.completion_ids, 0.5 if r.group == 0 else r.reward, r.group)
                for r in rollouts]
    states = {}
    for skip in (True, False):
        pop = population(nonzero_std=0.5)
        cfg = TrainerConfig(advantage="grpo", lr=1e-2, mini_batch_size=3, skip_zero_advantage=skip)
        m = PolicyGradientTrainer(pop, cfg).update("ma", rollouts)
        states[skip] = (pop.state("ma"), m)
    assert states[True][1]["zero_advantage_steps"] == 1.0 and states[True][1]["num_steps"] == 3.0
    for k, v in states[False][0].items():
        assert (states[True][0][k] - v).abs().max() <= 1e-6, k


# ------------------------------------------------------------------------------------------ the row cap


def test_row_capacity_puts_trees_that_fit_in_one_row():
    prompts, completions = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [[10], [11, 12], [13]]
    assert pack_prefix_shared(prompts, completions).input_ids.shape[0] == 3  # capacity: the largest tree (5)
    one = pack_prefix_shared(prompts, completions, row_capacity=16)
    assert one.input_ids.shape == (1, 13) and one.pad_start == [13]


@pytest.mark.parametrize("packing", ["prefix", "none"])
@pytest.mark.parametrize("cap", [24, 40])
def test_row_cap_bounds_every_pass_and_keeps_the_gradient(population, monkeypatch, packing, cap):
    """``max_tokens_per_row``: every forward pass holds at most the cap's token slots (a rollout longer than the
    cap alone), more passes are taken, and the gradient is the uncapped one (accumulation over micro-batches
    normalised with the whole batch's counts)."""
    from agents.forward import pack_rollouts

    rollouts = shared_rollouts(n_prompts=4, attempts=3, seed=6)
    batch = pack_rollouts(rollouts)
    capped = PolicyGradientTrainer(population(), TrainerConfig(packing=packing, max_tokens_per_row=cap)).forward
    passes = capped.micro_batches(batch)
    longest = max(len(p) + len(c) for p, c in zip(batch.prompts, batch.completions, strict=True))
    assert sorted(i for m in passes for i in m) == list(range(batch.size))
    assert all(capped.pass_tokens(batch, m) <= cap or len(m) == 1 for m in passes)
    assert len(passes) > len(PolicyGradientTrainer(population(), TrainerConfig(packing=packing)).forward
                             .micro_batches(batch))
    ga, ma = grads_of(population, TrainerConfig(packing=packing), rollouts, monkeypatch)
    gb, mb = grads_of(population, TrainerConfig(packing=packing, max_tokens_per_row=cap), rollouts, monkeypatch)
    assert_close_grads(gb, ga)
    assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-5, abs=1e-6)
    trainer = PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig(packing=packing, max_tokens_per_row=cap))
    trainer.update("ma", rollouts)
    assert 0 < trainer.forward.largest_pass <= max(cap, longest)


def test_row_cap_is_validated():
    from populora_env.checks import ConfigError

    with pytest.raises(ConfigError, match="max_tokens_per_row"):
        TrainerConfig(max_tokens_per_row=0).validate()
