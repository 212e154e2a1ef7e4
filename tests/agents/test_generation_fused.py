"""The fused decode step (agents.generation.fused) against HF's forward: the loop's ``fused_decode`` lever."""

from __future__ import annotations

import copy

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator
from agents.generation import fused as fused_mod
from agents.generation.decode import _Forward
from agents.generation.fused import (
    FusedDecoder,
    _Dense,
    _rms,
    _rotate,
    _signed_sin,
    fused_decoder,
    fused_unsupported,
    onednn_available,
)
from agents.models import load_base
from agents.population import LoRAPopulation, randomize_member

PROMPTS = ["Write a function that adds two numbers.", "What is 2 + 2?",
           "Reverse a string in Python, please, and explain each step carefully.", "hi"]
# observed max |d logprob| between the fused step and HF's forward on these models: ~5e-6
LOGPROB_TOL = 1e-4


def _qwen2_population():
    base, tok = load_base("random:qwen2-tiny")  # Qwen2: q/k/v biases, untied head, GQA
    pop = LoRAPopulation(base, ["m0", "m1"], rank=4, alpha=8)
    for name in pop.names:
        randomize_member(pop, name, std=0.5, seed=1)
    return pop, tok


@pytest.fixture(params=["llama", "qwen2"])
def pop_tok(request, population, tiny_tokenizer):
    if request.param == "llama":
        return population(["m0", "m1"], nonzero_std=0.5), tiny_tokenizer
    return _qwen2_population()


def _requests(temperature: float) -> list[GenerationRequest]:
    """Mixed members and the base, prompts of different lengths (left padding), n=2, budgets that differ (rows
    leave the batch at different steps)."""
    return [GenerationRequest(a, p, max_new_tokens=5 + 4 * i, temperature=temperature, top_p=0.9, seed=7 + i, n=2)
            for i, (a, p) in enumerate(zip(["m0", "m1", None, "m0"], PROMPTS, strict=True))]


def _key(out):
    return [(c.request_index, c.sample_index, c.token_ids, c.finish_reason) for c in out]


def test_fused_decode_matches_hf_forward(pop_tok):
    pop, tok = pop_tok
    reqs = _requests(0.0)
    ref = HFGenerator(pop, tok, fused_decode=False).generate(reqs)
    out = HFGenerator(pop, tok, fused_decode=True).generate(reqs)
    assert _key(out) == _key(ref)
    worst = max(abs(x - y) for a, b in zip(out, ref, strict=True)
                for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert 0 <= worst <= LOGPROB_TOL


ONEDNN = [False, pytest.param(True, marks=pytest.mark.skipif(not onednn_available(),
                                                             reason="this torch build has no oneDNN linear"))]


@pytest.mark.parametrize("onednn", ONEDNN)
def test_fused_logits_equal_hf_logits_step_by_step(pop_tok, onednn):
    """One decode step on a left-padded cache, mixed members per row: the fused logits (with and without the
    oneDNN layouts) against HF's forward of the same token on a copy of the same cache."""
    from transformers.cache_utils import DynamicCache

    from agents.generation.decode import _padded, _RowsLayer

    pop, tok = pop_tok
    model = pop.model.base_model.model
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    ids, mask, pos = _padded(prompts, tok.pad_token_id)
    adapters = ["m0", "m1", None, "m0"]
    width, rows = ids.shape[1], len(prompts)

    def prefilled() -> DynamicCache:
        cache = DynamicCache(config=model.config)
        with pop.mixed(adapters), torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        out = DynamicCache(config=model.config)
        out.layers = [_RowsLayer(torch.cat([la.keys, la.keys.new_zeros((*la.keys.shape[:2], 4, la.keys.shape[-1]))], 2),
                                 torch.cat([la.values, la.values.new_zeros((*la.values.shape[:2], 4, la.values.shape[-1]))], 2),
                                 width) for la in cache.layers]
        return out

    token = torch.tensor([[11], [12], [13], [14]])
    step_mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
    step_pos = torch.tensor([[len(p)] for p in prompts])
    hf, fast = _Forward(pop), _Forward(pop)
    fast.use_fused(onednn)
    assert hf.fused is None and fast.fused is not None and fast.fused.onednn == onednn
    cache_a, cache_b = prefilled(), prefilled()
    with pop.mixed(adapters), torch.no_grad():
        want = hf(token, step_mask, step_pos, cache_a)
        fast.bind()
        got = fast(token, step_mask, step_pos, cache_b)
    assert got.shape == want.shape == (rows, model.config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.equal(want[0], want[1])  # the rows' members really differ


def test_fused_decode_serves_the_decode_steps_and_drops_rows(population, tiny_tokenizer, monkeypatch):
    pop = population(["m0", "m1"], nonzero_std=0.5)
    batches: list[int] = []
    plain = FusedDecoder.step

    def step(self, ids, *args):
        batches.append(ids.shape[0])
        return plain(self, ids, *args)

    monkeypatch.setattr(FusedDecoder, "step", step)
    hf_decode: list[int] = []
    hook = pop.model.base_model.model.register_forward_pre_hook(
        lambda m, a, k: hf_decode.append(k["input_ids"].shape[1]) if k["input_ids"].shape[1] == 1 else None,
        with_kwargs=True)
    HFGenerator(pop, tiny_tokenizer).generate(_requests(0.0))  # budgets 5, 9, 13, 17
    hook.remove()
    assert hf_decode == []  # no decode step ran HF's forward
    assert batches[0] == 8 and batches[-1] == 2 and batches == sorted(batches, reverse=True)
    assert len(batches) == 17 - 1


def test_sampled_fused_decode_is_reproducible(population, tiny_tokenizer):
    pop = population(["m0", "m1"], nonzero_std=0.5)
    first = HFGenerator(pop, tiny_tokenizer).generate(_requests(0.8))
    again = HFGenerator(pop, tiny_tokenizer).generate(_requests(0.8))
    assert _key(first) == _key(again) and [c.logprobs for c in first] == [c.logprobs for c in again]


def test_decoder_is_kept_per_model_and_rebuilt_when_base_weights_change(population):
    pop = population(["m0"])
    model = pop.model.base_model.model
    first = fused_decoder(model)
    assert fused_decoder(model) is first
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.base_layer.weight.mul_(2.0)  # an in-place change of a base weight
    second = fused_decoder(model)
    assert second is not first
    torch.testing.assert_close(second.layers[0].dense["down"].t, model.model.layers[0].mlp.down_proj.base_layer.weight.t())


def test_decoder_is_kept_per_onednn_setting(population):
    model = population(["m0"]).model.base_model.model
    plain = fused_decoder(model, onednn=False)
    assert plain.onednn is False and all(layer.dense["gu"].packed is None for layer in plain.layers)
    assert fused_decoder(model, onednn=False) is plain
    if onednn_available():
        packed = fused_decoder(model, onednn=True)
        assert packed.onednn and packed.head.packed is not None and packed.layers[0].dense["gu"].packed is not None
        assert packed.layers[0].dense["qkv"].packed is None  # only gate/up and the LM head use oneDNN
        assert fused_decoder(model, onednn=True) is packed and fused_decoder(model, onednn=False) is plain
    else:
        with pytest.raises(ValueError, match="no oneDNN"):
            FusedDecoder(model, onednn=True)


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_projection_matches_mkl_at_every_row_count(bias):
    """``_Dense`` with oneDNN's packed weight: the same product as MKL's within float tolerance from 2 rows on;
    one row takes MKL's kernel (bit for bit)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 200, bias=bias)
    plain, packed = _Dense([lin]), _Dense([lin], onednn=True)
    assert plain.packed is None and packed.packed is not None
    for rows in (1, 2, 3, 6, 8, 16, 33):
        h = torch.randn(rows, 48)
        want = lin(h).detach()
        got = packed(h)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(plain(h), want, rtol=1e-5, atol=1e-5)
        if rows == 1:
            assert torch.equal(got, plain(h))


def test_norm_is_hf_rmsnorm(population):
    norm = population(["m0"]).model.base_model.model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(7, norm.weight.shape[0]) * 3
    torch.testing.assert_close(_rms(norm, x), norm(x).detach(), rtol=1e-6, atol=1e-6)


def test_rotation_is_hf_rotary_bit_for_bit():
    """``_rotate`` with the signed sine is transformers' ``q cos + rotate_half(q) sin``, bit for bit."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = torch.randn(5, 1, 9, 64), torch.randn(5, 1, 3, 64)
    angle = torch.randn(5, 1, 1, 32)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    want_q, want_k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[:, 0], sin[:, 0])
    both = _rotate(torch.cat([q, k], dim=2), cos, _signed_sin(sin))
    assert torch.equal(both[:, :, :9].transpose(1, 2), want_q) and torch.equal(both[:, :, 9:].transpose(1, 2), want_k)


def test_active_adapter_outside_mixed_is_refused(population):
    pop = population(["m0"], nonzero_std=0.5)
    decoder = FusedDecoder(pop.model.base_model.model)
    pop.model.set_adapter("m0")
    with pytest.raises(RuntimeError, match="inside LoRAPopulation.mixed"):
        decoder.bind()
    with pop.mixed([None, None]):  # adapters disabled: base only, nothing to bind
        decoder.bind()
        assert all(v is None for layer in decoder.layers for v in layer.lora.values())


def test_unsupported_models_keep_hf_forward_bit_for_bit(population, tiny_tokenizer):
    pop = population(["m0", "m1"], nonzero_std=0.5)
    model = pop.model.base_model.model
    assert fused_unsupported(model) is None
    model.config.hidden_act = "gelu"  # not covered: the loop must fall back to HF's forward
    for layer in model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU(approximate="tanh")
    assert "activation 'gelu'" in fused_unsupported(model)
    reqs = _requests(0.8)
    fallback = HFGenerator(pop, tiny_tokenizer).generate(reqs)
    plain = HFGenerator(pop, tiny_tokenizer, fused_decode=False).generate(reqs)
    assert _key(fallback) == _key(plain) and [c.logprobs for c in fallback] == [c.logprobs for c in plain]
    with pytest.raises(ValueError, match="activation 'gelu'"):
        FusedDecoder(model)
    half = copy.deepcopy(pop.model.base_model.model).to(torch.bfloat16)
    half.config.hidden_act = "silu"
    assert "dtype bfloat16" in fused_unsupported(half)
    bad = copy.copy(model.config)
    bad.model_type = "gpt2"
    assert "architecture 'gpt2'" in fused_unsupported(type("M", (), {"config": bad})())
    assert fused_mod.__doc__ and "softmax" in fused_mod.__doc__


def test_fused_steps_read_keys_stored_transposed_and_dropping_rows_keeps_the_layout(population, tiny_tokenizer,
                                                                                   monkeypatch):
    """The fused path's decode cache keeps keys as a transposed view (positions contiguous, for the scores'
    batched GEMM), also after rows are dropped; HF's decode keeps contiguous keys."""
    pop = population(["m0", "m1"], nonzero_std=0.5)
    layouts: list[tuple[bool, int]] = []
    plain = FusedDecoder.step

    def step(self, ids, pos, mask, layers):
        layouts.append((all(la.keys.stride(-2) == 1 for la in layers), ids.shape[0]))
        return plain(self, ids, pos, mask, layers)

    monkeypatch.setattr(FusedDecoder, "step", step)
    HFGenerator(pop, tiny_tokenizer).generate(_requests(0.0))
    assert layouts and all(t for t, _ in layouts) and {n for _, n in layouts} >= {8, 2}  # rows were dropped
    from agents.generation.decode import _cache_buffers, _RowsLayer

    like = torch.zeros(3, 2, 5, 4)
    k, v = _cache_buffers(like, 3, 9, fused=False)
    assert k.shape == v.shape == (3, 2, 9, 4) and k.is_contiguous() and v.is_contiguous()
    k, v = _cache_buffers(like, 3, 9, fused=True)
    assert k.shape == v.shape == (3, 2, 9, 4) and k.stride(-2) == 1 and v.is_contiguous()
    k.copy_(torch.randn(3, 2, 9, 4))
    layer = _RowsLayer(k, v, 5)
    kept = layer.keys[[0, 2]].clone()
    layer.select(torch.tensor([0, 2]))
    assert layer.keys.stride(-2) == 1 and torch.equal(layer.keys, kept)


@pytest.mark.parametrize("onednn", ONEDNN)
def test_fused_logits_do_not_depend_on_the_key_layout(pop_tok, onednn):
    """A decode step over keys stored transposed gives the logits of contiguous keys.

    The same sums, but the GEMM kernel for a transposed operand may add them in another order, so the logits agree
    to float32 rounding, not bit for bit: up to 7e-6 measured on logits of order 1 (two CPUs, torch 2.13); 5e-5
    leaves room for other kernels while a wrong layout (keys read at the wrong positions) moves logits by O(1).
    """
    from agents.generation.decode import _cache_buffers, _padded, _RowsLayer

    pop, tok = pop_tok
    model = pop.model.base_model.model
    cfg = model.config
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    _, mask, _ = _padded(prompts, tok.pad_token_id)
    rows, width, d = len(prompts), mask.shape[1], cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(0)
    filled = [(torch.randn(rows, cfg.num_key_value_heads, width, d, generator=gen),
               torch.randn(rows, cfg.num_key_value_heads, width, d, generator=gen))
              for _ in range(cfg.num_hidden_layers)]

    def cache(fused: bool) -> list:
        layers = []
        for k0, v0 in filled:
            k, v = _cache_buffers(k0, rows, width + 2, fused)
            k[..., :width, :], v[..., :width, :] = k0, v0
            layers.append(_RowsLayer(k, v, width))
        return layers

    dec = fused_decoder(model, onednn=onednn)
    ids, pos = torch.tensor([11, 12, 13, 14]), torch.tensor([len(p) for p in prompts])
    step_mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
    with pop.mixed(["m0", "m1", None, "m0"]):
        dec.bind()
        plain = dec.step(ids, pos, step_mask, cache(False))
        transposed = dec.step(ids, pos, step_mask, cache(True))
    torch.testing.assert_close(transposed, plain, rtol=1e-5, atol=5e-5)
