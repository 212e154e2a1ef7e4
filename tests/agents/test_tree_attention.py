"""Tree attention over the prefix-shared packed layout (``agents.tree_attention``, ``PackedRows.blocks``,
``TrainerConfig.packed_attention``): the blocks describe exactly the tree mask, the attention equals SDPA
with that mask (values and gradients), and the trainer runs it by default with the mask's gradients."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import agents.tree_attention as ta
from agents.packing import pack_prefix_shared
from agents.trainer import PolicyGradientTrainer, TrainerConfig
from tests.agents.test_packing import assert_close_grads, shared_rollouts
from tests.agents.test_trainer import grads_of


def visibility(packed) -> torch.Tensor:
    """``[R, L, L]`` bool: what the blocks (and padding's self-only rule) let each query column see."""
    R, L = packed.input_ids.shape
    seen = torch.zeros(R, L, L, dtype=torch.bool)
    for r, blocks in enumerate(packed.blocks):
        for s, e, anc in blocks:
            for a, b in anc:
                seen[r, s:e, a:b] = True
            seen[r, s:e, s:e] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        for c in range(packed.pad_start[r], L):
            seen[r, c, c] = True
    return seen


@st.composite
def rollout_sets(draw):
    """Prompts drawn from a few stems (so prefixes are shared at several depths), repeated prompts, empty and
    non-empty completions."""
    tok = st.integers(0, 6)
    stems = draw(st.lists(st.lists(tok, min_size=1, max_size=5), min_size=1, max_size=3))
    prompts, completions = [], []
    for _ in range(draw(st.integers(1, 7))):
        stem = draw(st.sampled_from(stems))
        prompts.append(stem + draw(st.lists(tok, max_size=4)))
        completions.append(draw(st.lists(tok, max_size=4)))
    return prompts, completions


@settings(max_examples=150, deadline=None)
@given(rollout_sets())
def test_blocks_describe_exactly_the_tree_mask(case):
    prompts, completions = case
    packed = pack_prefix_shared(prompts, completions)
    assert torch.equal(visibility(packed), packed.attention_mask[:, 0] == 0)
    for r, blocks in enumerate(packed.blocks):  # blocks tile the real columns in order, then padding
        ends = [0] + [e for _, e, _ in blocks]
        assert [s for s, _, _ in blocks] == ends[:-1] and ends[-1] == packed.pad_start[r]
    for i, p in enumerate(prompts):  # a prompt's ranges hold its tokens at positions 0..len-1
        r = int(packed.row[i])
        cols = [c for a, b in packed.prompt_ranges[i] for c in range(a, b)]
        assert packed.input_ids[r, cols].tolist() == p
        assert packed.position_ids[r, cols].tolist() == list(range(len(p)))
        assert cols[-1] == int(packed.prompt_last[i])


def test_blocks_merge_a_node_with_the_run_that_continues_it():
    """One prompt with two completions: the prompt and its first completion are one causal block; the
    second completion sees the prompt only."""
    packed = pack_prefix_shared([[1, 2, 3], [1, 2, 3]], [[4, 5], [6]])
    assert packed.blocks == [[(0, 5, ()), (5, 6, ((0, 3),))]]


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3)])
def test_tree_attention_equals_sdpa_with_the_tree_mask(heads, kv_heads):
    rollouts = shared_rollouts(n_prompts=5, attempts=2, seed=4)
    long_one = ([7] * 30, [8] * 5)  # a tree longer than the others: rows end in padding
    packed = pack_prefix_shared([r.prompt_ids for r in rollouts] + [long_one[0]],
                                [r.completion_ids for r in rollouts] + [long_one[1]])
    R, L = packed.input_ids.shape
    assert R > 1 and min(packed.pad_start) < L  # several rows, padding covered
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(R, h, L, 8, generator=g, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    dense, _ = ta.tree_attention_forward(module, q, k, v, packed.attention_mask, scaling=0.3)
    tree, _ = ta.tree_attention_forward(module, q, k, v, packed.attention_mask, scaling=0.3,
                                        tree_blocks=packed.blocks, tree_pad_start=packed.pad_start)
    torch.testing.assert_close(tree, dense, atol=1e-5, rtol=1e-5)
    w = torch.randn(dense.shape, generator=g)
    grads_dense = torch.autograd.grad((dense * w).sum(), (q, k, v))
    grads_tree = torch.autograd.grad((tree * w).sum(), (q, k, v))
    for a, b in zip(grads_tree, grads_dense, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    expanded = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    by_hand = F.scaled_dot_product_attention(q, *expanded, attn_mask=packed.attention_mask, scale=0.3)
    torch.testing.assert_close(dense, by_hand.transpose(1, 2), atol=1e-6, rtol=1e-6)  # the fallback is SDPA's


def test_query_blocks_split_the_row_once_with_the_slices_gradient():
    """The packing's blocks tile each row: its queries are split once (one gradient join), with the gradient
    of slicing each block, bit for bit; blocks that do not tile the row are sliced."""
    rollouts = shared_rollouts(n_prompts=4, attempts=2, seed=2)
    packed = pack_prefix_shared([r.prompt_ids for r in rollouts] + [[7] * 30],
                                [r.completion_ids for r in rollouts] + [[8] * 5])
    R, L = packed.input_ids.shape
    g = torch.Generator().manual_seed(1)
    for r in range(R):
        q = torch.randn(1, 3, L, 4, generator=g, requires_grad=True)
        blocks = packed.blocks[r]
        pieces = ta._query_blocks(q, blocks, packed.pad_start[r])
        assert all("Split" in p.grad_fn.name() for p in pieces)
        sliced = [q[:, :, s:e] for s, e, _ in blocks]
        assert all(torch.equal(a, b) for a, b in zip(pieces, sliced, strict=True))
        w = [torch.randn(p.shape, generator=g) for p in pieces]
        split_grad, = torch.autograd.grad(sum((p * x).sum() for p, x in zip(pieces, w, strict=True)), q)
        slice_grad, = torch.autograd.grad(sum((p * x).sum() for p, x in zip(sliced, w, strict=True)), q)
        assert torch.equal(split_grad, slice_grad)
    q = torch.zeros(1, 2, 6, 4, requires_grad=True)
    gap = ta._query_blocks(q, [(0, 2, ()), (3, 6, ())], 6)  # column 2 in no block: sliced
    assert [p.shape[2] for p in gap] == [2, 3] and all("Slice" in p.grad_fn.name() for p in gap)


def test_blocks_that_do_not_cover_the_row_are_refused():
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match="cover 4 of its 6 columns"):
        ta.tree_attention_forward(torch.nn.Module(), q, q, q, None, tree_blocks=[[(0, 4, ())]])


@pytest.mark.parametrize("extra", [{}, {"gradient_checkpointing": True, "micro_batch_size": 4},
                                   {"mini_batch_size": 4, "epochs": 2}], ids=["default", "checkpointing", "mini"])
def test_trainer_runs_tree_attention_with_the_masks_gradient(population, monkeypatch, extra):
    calls = {"tree": 0, "plain": 0}
    real = ta.tree_attention_forward

    def spy(*args, tree_blocks=None, **kwargs):
        calls["plain" if tree_blocks is None else "tree"] += 1
        return real(*args, tree_blocks=tree_blocks, **kwargs)

    monkeypatch.setattr(ta, "tree_attention_forward", spy)
    monkeypatch.setitem(ta.AttentionInterface._global_mapping, ta.TREE_ATTENTION, spy)
    rollouts = shared_rollouts()
    gt, mt = grads_of(population, TrainerConfig(**extra), rollouts, monkeypatch)
    assert calls["tree"] > 0 and calls["plain"] == 0, calls
    calls.update(tree=0, plain=0)
    gm, mm = grads_of(population, TrainerConfig(packed_attention="mask", **extra), rollouts, monkeypatch)
    assert calls == {"tree": 0, "plain": 0}  # "mask": transformers' own SDPA, never this function
    assert_close_grads(gt, gm)
    assert mt["loss"] == pytest.approx(mm["loss"], rel=1e-5, abs=1e-6)


def test_the_models_attention_is_restored_after_an_update(population):
    pop = population(nonzero_std=0.5)
    config = pop.model.base_model.model.config
    before = config._attn_implementation
    PolicyGradientTrainer(pop).update("ma", shared_rollouts())
    assert before in ("sdpa", "eager") and config._attn_implementation == before


def test_packed_attention_is_validated(population):
    from populora_env.checks import ConfigError

    with pytest.raises(ConfigError, match="packed_attention: must be one of tree, mask, flex"):
        TrainerConfig(packed_attention="flash").validate()
    # flex_attention has no backward on CPU: a trainer there refuses it at once, naming the field
    with pytest.raises(ConfigError, match="trainer.packed_attention: 'flex' needs a CUDA device"):
        PolicyGradientTrainer(population(), TrainerConfig(packed_attention="flex"))


# ------------------------------------------------------------------ the GPU kernels (runnable parts on CPU)

GPU_TOL = 1e-5
"""The CUDA variants against the CPU path on CPU, float32: values and gradients within 1e-5 (absolute and
relative; measured up to ~4e-6: float summation order only)."""


@settings(max_examples=150, deadline=None)
@given(rollout_sets())
def test_key_end_is_the_tree_mask_in_one_vector(case):
    """``k <= q < key_end[k]`` is exactly the tree mask (the depth-first layout keeps a subtree contiguous)."""
    prompts, completions = case
    packed = pack_prefix_shared(prompts, completions)
    L = packed.input_ids.shape[1]
    col = torch.arange(L)
    allowed = (col[None, None, :] <= col[None, :, None]) & (col[None, :, None] < packed.key_end[:, None, :])
    assert torch.equal(allowed, packed.attention_mask[:, 0] == 0)


def _attention_case(heads: int, kv_heads: int, seed: int = 0):
    rollouts = shared_rollouts(n_prompts=5, attempts=2, seed=4)
    packed = pack_prefix_shared([r.prompt_ids for r in rollouts] + [[7] * 30],
                                [r.completion_ids for r in rollouts] + [[8] * 5])
    R, L = packed.input_ids.shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(R, h, L, 8, generator=g, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    return packed, (q, k, v), module, g


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3)])
def test_causal_bias_blocks_give_the_tree_masks_values_and_gradients(heads, kv_heads):
    """The blocks' CUDA form (each block's mask as ``causal_lower_right``, keys and values expanded where flash
    cannot take them) equals the CPU form and the dense mask, values and gradients (:data:`GPU_TOL`)."""
    packed, (q, k, v), module, g = _attention_case(heads, kv_heads)
    tree = {"tree_blocks": packed.blocks, "tree_pad_start": packed.pad_start}
    ta.kernels_used.clear()
    cpu, _ = ta.tree_attention_forward(module, q, k, v, None, scaling=0.3, **tree)
    gpu, _ = ta.tree_attention_forward(module, q, k, v, None, scaling=0.3, tree_causal_bias=True, **tree)
    dense, _ = ta.tree_attention_forward(module, q, k, v, packed.attention_mask, scaling=0.3)
    assert ta.kernels_used == {"block-mask": 1, "block-causal": 1, "dense-mask": 1}
    w = torch.randn(dense.shape, generator=g)
    for out in (gpu, cpu):
        torch.testing.assert_close(out, dense, atol=GPU_TOL, rtol=GPU_TOL)
    grads = [torch.autograd.grad((o * w).sum(), (q, k, v)) for o in (gpu, dense)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=GPU_TOL, rtol=GPU_TOL)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3)])
def test_flex_block_mask_gives_the_tree_masks_values(heads, kv_heads):
    """flex_attention over :func:`tree_block_mask` (eager on CPU, without gradients: PyTorch has no CPU backward
    for it) equals the dense mask; its tiles are exactly the tree mask's: skipped where the mask is empty,
    full (no mask evaluated) where it is full."""
    packed, qkv, module, _ = _attention_case(heads, kv_heads)
    q, k, v = (x.detach() for x in qkv)  # flex refuses inputs that require grad on CPU
    block = 16
    mask = ta.tree_block_mask(packed.key_end, block=block)
    with torch.no_grad():
        flex, _ = ta.tree_attention_forward(module, q, k, v, None, scaling=0.3, tree_block_mask=mask)
        dense, _ = ta.tree_attention_forward(module, q, k, v, packed.attention_mask, scaling=0.3)
    torch.testing.assert_close(flex, dense, atol=GPU_TOL, rtol=GPU_TOL)
    R, L = packed.input_ids.shape
    T = -(-L // block)
    allowed = F.pad(packed.attention_mask[:, 0] == 0, (0, T * block - L, 0, T * block - L))
    tiles = allowed.view(R, T, block, T, block)
    real = F.pad(torch.ones(L, L, dtype=torch.bool), (0, T * block - L, 0, T * block - L)).view(T, block, T, block)
    some, full = tiles.any(dim=(2, 4)), (tiles | ~real).all(dim=(2, 4)) & real.any(dim=(1, 3))
    for r in range(R):
        for i in range(T):
            n_part, n_full = int(mask.kv_num_blocks[r, 0, i]), int(mask.full_kv_num_blocks[r, 0, i])
            partial = set(mask.kv_indices[r, 0, i, :n_part].tolist())
            whole = set(mask.full_kv_indices[r, 0, i, :n_full].tolist())
            assert partial | whole == set(some[r, i].nonzero().flatten().tolist())
            assert whole <= set(full[r, i].nonzero().flatten().tolist()) and not partial & whole


def test_a_placeholder_mask_never_stands_in_for_the_tree():
    """Without its blocks, a packed row's attention refuses the one-element mask instead of attending through it."""
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match="without its tree blocks"):
        ta.tree_attention_forward(torch.nn.Module(), q, q, q, ta.placeholder_mask(1, 6, torch.float32, "cpu"))


def test_the_tree_layout_never_builds_the_dense_mask(population, monkeypatch):
    """An update under tree attention never builds the ``L x L`` mask (``agents.packing._tree_mask``); the mask
    layout does."""
    import agents.packing as packing

    built = {"n": 0}
    real = packing._tree_mask

    def spy(*args, **kwargs):
        built["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(packing, "_tree_mask", spy)
    PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig(micro_batch_size=4)).update("ma", shared_rollouts())
    assert built["n"] == 0
    PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig(packed_attention="mask")).update(
        "ma", shared_rollouts())
    assert built["n"] > 0


@pytest.mark.parametrize("extra", [{}, {"gradient_checkpointing": True, "micro_batch_size": 4}],
                         ids=["default", "checkpointing"])
def test_the_cuda_tree_attention_gives_the_trainers_gradients(population, monkeypatch, extra):
    """The whole update with every block in its CUDA form (the causal bias, registered as the tree attention)
    gives today's tree attention's gradients and loss (assert_close_grads: 1e-4 of the largest entry)."""
    rollouts = shared_rollouts()
    gt, mt = grads_of(population, TrainerConfig(**extra), rollouts, monkeypatch)
    ta.kernels_used.clear()
    monkeypatch.setitem(ta.AttentionInterface._global_mapping, ta.TREE_ATTENTION,
                        functools.partial(ta.tree_attention_forward, tree_causal_bias=True))
    gc, mc = grads_of(population, TrainerConfig(**extra), rollouts, monkeypatch)
    assert ta.kernels_used["block-causal"] > 0 and ta.kernels_used["block-mask"] == 0
    assert_close_grads(gc, gt)
    assert mc["loss"] == pytest.approx(mt["loss"], rel=1e-5, abs=1e-6)


def test_flex_attention_gives_the_models_log_probs(population):
    """The decoder with flex attention over the tree's block mask (no gradients: CPU) gives the log-probs of tree
    attention (:data:`GPU_TOL`), a row cap splitting the batch into several passes."""
    from agents.forward import PolicyForward, pack_rollouts

    pop = population(nonzero_std=0.5)
    batch = pack_rollouts(shared_rollouts(n_prompts=4, attempts=3, seed=5))
    out = {}
    for attention in ("tree", "flex"):
        fwd = PolicyForward(pop, packed_attention=attention, micro_batch_size=4, max_tokens_per_row=48)
        ta.kernels_used.clear()
        with fwd.attention():
            out[attention] = fwd.logprobs_no_grad(batch, reference=False)
        assert ta.kernels_used["flex-eager" if attention == "flex" else "block-mask"] > 0
    torch.testing.assert_close(out["flex"], out["tree"], atol=GPU_TOL, rtol=GPU_TOL)
    assert out["tree"].abs().sum() > 0


def test_a_refused_grouped_query_causal_bias_expands_the_heads(monkeypatch):
    """Where the installed PyTorch refuses the causal bias with grouped-query attention, the blocks expand the keys
    and values to the query heads (the same values) and say so in ``kernels_used``."""
    from torch.nn.attention.bias import CausalBias

    real = F.scaled_dot_product_attention

    def picky(q, k, v, attn_mask=None, **kwargs):
        if isinstance(attn_mask, CausalBias):  # patched out of F, the bias is dispatched by hand
            if kwargs.get("enable_gqa"):
                raise RuntimeError("no grouped-query attention with this bias here")
            return CausalBias._dispatch(q, k, v, attn_mask, **kwargs)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(ta, "_EXPAND_KV", False)
    monkeypatch.setattr(ta, "_flash_takes", lambda *args: True)  # as on CUDA with flash: GQA tried first
    packed, (q, k, v), module, _ = _attention_case(4, 2)
    tree = {"tree_blocks": packed.blocks, "tree_pad_start": packed.pad_start}
    want, _ = ta.tree_attention_forward(module, q, k, v, None, scaling=0.3, **tree)
    monkeypatch.setattr(ta.F, "scaled_dot_product_attention", picky)
    ta.kernels_used.clear()
    got, _ = ta.tree_attention_forward(module, q, k, v, None, scaling=0.3, tree_causal_bias=True, **tree)
    torch.testing.assert_close(got, want, atol=GPU_TOL, rtol=GPU_TOL)
    assert ta.kernels_used["block-causal-expanded"] == 1 and ta._EXPAND_KV
