"""The HF backend's own decode loop (agents.generation.decode) against HF ``generate``, lever by lever."""

from __future__ import annotations

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator, HFOptions

PROMPTS = [
    "Write a function that adds two numbers.",
    "What is 2 + 2?",
    "Reverse a string in Python, please, and explain each step carefully.",
    "hi",
]
LEVERS = ("share_prompts", "tree_prefill", "drop_finished", "fused_decode", "onednn_decode")
OFF = dict.fromkeys(LEVERS, False)
# float tolerance of the log-probs when a lever changes matmul shapes or the weight layout (observed ~3e-6)
LOGPROB_TOL = 1e-4


@pytest.fixture
def pop(population):
    return population(["m0", "m1"], nonzero_std=0.5)


def _loop(pop, tokenizer, **levers) -> HFGenerator:
    """The loop engine with these levers (``fused_decode`` is the generator's own setting, the others
    :class:`HFOptions`); unnamed ones keep their defaults."""
    fused = levers.pop("fused_decode", True)
    return HFGenerator(pop, tokenizer, engine="loop", fused_decode=fused, options=HFOptions(**levers))


def _requests(temperature: float, stop: tuple[str, ...] = ()) -> list[GenerationRequest]:
    """Mixed adapters (and the base), repeated prompts (n=2) and different budgets, so rows finish apart."""
    adapters = ["m0", "m1", None, "m0"]
    return [GenerationRequest(a, p, max_new_tokens=6 + 3 * i, temperature=temperature, top_p=0.9, seed=3 + i,
                              n=2, stop=stop)
            for i, (a, p) in enumerate(zip(adapters, PROMPTS, strict=True))]


def _key(out):
    return [(c.request_index, c.sample_index, c.token_ids, c.finish_reason, c.text) for c in out]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_loop_with_levers_off_is_generate_bit_for_bit(pop, tiny_tokenizer, temperature):
    reqs = _requests(temperature)
    ref = HFGenerator(pop, tiny_tokenizer, engine="generate").generate(reqs)
    out = _loop(pop, tiny_tokenizer, **OFF).generate(reqs)
    assert _key(out) == _key(ref)
    assert [c.logprobs for c in out] == [c.logprobs for c in ref]
    assert {c.finish_reason for c in ref} == {"length"} and len({len(c.token_ids) for c in ref}) == 4


@pytest.mark.parametrize("lever", [*LEVERS, "all"])
def test_each_lever_keeps_greedy_tokens_and_logits_within_tolerance(pop, tiny_tokenizer, lever):
    reqs = _requests(0.0)
    ref = HFGenerator(pop, tiny_tokenizer, engine="generate").generate(reqs)
    kwargs = dict.fromkeys(LEVERS, True) if lever == "all" else OFF | {lever: True}
    if lever == "onednn_decode":  # a setting of the fused step: on its own it changes nothing
        kwargs["fused_decode"] = True
    out = _loop(pop, tiny_tokenizer, **kwargs).generate(reqs)
    assert _key(out) == _key(ref)
    for a, b in zip(out, ref, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= LOGPROB_TOL


def test_sampling_is_seeded_and_reproducible(pop, tiny_tokenizer):
    reqs = _requests(0.8)
    first = HFGenerator(pop, tiny_tokenizer, engine="loop").generate(reqs)
    again = HFGenerator(pop, tiny_tokenizer, engine="loop").generate(reqs)
    assert _key(first) == _key(again) and [c.logprobs for c in first] == [c.logprobs for c in again]
    # the n samples of one prompt share its prefill but draw from their own generators
    assert len({tuple(c.token_ids) for c in first if c.request_index == 0}) == 2
    # and on these prompts the sampled tokens are those of today's path (no near-tie flipped)
    ref = HFGenerator(pop, tiny_tokenizer, engine="generate").generate(reqs)
    assert _key(first) == _key(ref)


def test_stop_strings_end_rows_as_with_generate(pop, tiny_tokenizer):
    probe = HFGenerator(pop, tiny_tokenizer, engine="generate").generate(_requests(0.0))
    stop = probe[2].text[2:5]  # a string that row 2 produces after a few tokens
    assert stop.strip()
    reqs = _requests(0.0, stop=(stop,))
    ref = HFGenerator(pop, tiny_tokenizer, engine="generate").generate(reqs)
    out = HFGenerator(pop, tiny_tokenizer, engine="loop").generate(reqs)
    assert _key(out) == _key(ref)
    assert any(c.extra.get("stop") == stop for c in out)


class _Shapes:
    """Batch shapes of every forward of the HF model: ``(rows, positions)``."""

    def __init__(self, pop) -> None:
        self.shapes: list[tuple[int, int]] = []
        model = pop.model.base_model.model
        self.hook = model.register_forward_pre_hook(
            lambda m, a, k: self.shapes.append(tuple(k["input_ids"].shape)), with_kwargs=True)

    def prefill(self):
        return [s for s in self.shapes if s[1] > 1]

    def decode(self):
        return [s[0] for s in self.shapes if s[1] == 1]


def test_levers_change_the_work_done(pop, tiny_tokenizer):
    reqs = _requests(0.0)  # 4 prompts x 2 samples, budgets 6, 9, 12, 15
    shapes = _Shapes(pop)
    _loop(pop, tiny_tokenizer, **OFF).generate(reqs)
    assert len(shapes.prefill()) == 1 and shapes.prefill()[0][0] == 8  # one padded batch of every row
    assert set(shapes.decode()) == {8}  # every row until the last finishes
    shapes.shapes.clear()
    _loop(pop, tiny_tokenizer, **OFF | {"share_prompts": True}).generate(reqs)
    assert [s[0] for s in shapes.prefill()] == [4]  # once per unique prompt
    (_, padded_width), = shapes.prefill()
    shapes.shapes.clear()
    _loop(pop, tiny_tokenizer, **OFF | {"tree_prefill": True}).generate(reqs)
    # one packed row per adapter (m0's two prompts share their chat template's opening: one tree)
    ((rows, width),) = shapes.prefill()
    assert rows == 3 and rows * width < 4 * padded_width
    shapes.shapes.clear()
    HFGenerator(pop, tiny_tokenizer, engine="loop", fused_decode=False).generate(reqs)
    assert [s[0] for s in shapes.prefill()] == [3]  # the defaults: the adapters' prompt trees, one row each
    decode = shapes.decode()
    assert decode[0] == 8 and decode[-1] == 2 and decode == sorted(decode, reverse=True)  # finished rows leave
    shapes.hook.remove()


def test_bad_engine_is_refused(pop, tiny_tokenizer):
    with pytest.raises(ValueError, match="engine must be one of"):
        HFGenerator(pop, tiny_tokenizer, engine="fast")


def test_peft_lora_impl_falls_back_to_generate(pop, tiny_tokenizer):
    assert HFGenerator(pop, tiny_tokenizer, lora_impl="peft", engine="loop").engine == "generate"
    assert HFGenerator(pop, tiny_tokenizer).engine == "loop"  # the default
    gen = HFGenerator(pop, tiny_tokenizer, engine="loop")
    assert gen.engine == "loop" and gen.fused_decode and gen.options == HFOptions()


@pytest.mark.slow
def test_smollm2_greedy_tokens_identical_on_a_short_prompt_set():
    """The real model: greedy tokens of the loop (all levers) equal ``generate``'s on a few chat prompts; the
    log-probs agree within ``LOGPROB_TOL``."""
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    base, tok = load_base("smollm2-135m")
    pop = LoRAPopulation(base, ["m0", "m1"], rank=8, alpha=16)
    for name in pop.names:
        randomize_member(pop, name, std=0.05, seed=1)
    reqs = [GenerationRequest(a, p, max_new_tokens=24, temperature=0.0, n=2 if i % 2 else 1)
            for i, (a, p) in enumerate(zip(["m0", "m1", None, "m1"], PROMPTS, strict=True))]
    ref = HFGenerator(pop, tok, engine="generate").generate(reqs)
    out = HFGenerator(pop, tok, engine="loop").generate(reqs)
    assert _key(out) == _key(ref)
    for a, b in zip(out, ref, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= LOGPROB_TOL


def test_tree_prefill_fills_each_rows_cache_as_its_own_prompt_does(pop, tiny_tokenizer):
    """The packed tree prefill against one padded batch of the same rows: the first logits, and every layer's
    keys and values at each row's real (non-padding) positions, agree within float noise."""
    from agents.generation.decode import _Forward, _prefill, _Row

    gen = HFGenerator(pop, tiny_tokenizer)
    prompts = [gen.encode_prompt(r) for r in _requests(0.0)]
    rows = [_Row(0, 0, a, prompts[i % 4], 4, 0.0, 1.0, 0) for i, a in enumerate(["m0", "m1", None, "m0", "m0"])]
    fwd, width, capacity = _Forward(pop), max(map(len, prompts)), max(map(len, prompts)) + 4
    with torch.no_grad():
        ref = _prefill(fwd, pop, rows, tiny_tokenizer.pad_token_id, capacity, HFOptions(tree_prefill=False))
        out = _prefill(fwd, pop, rows, tiny_tokenizer.pad_token_id, capacity, HFOptions(tree_prefill=True))
    torch.testing.assert_close(out[0], ref[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(out[2], ref[2])  # the same left-padded prompt mask
    for a, b in zip(out[1], ref[1], strict=True):
        for r, row in enumerate(rows):
            real = slice(width - len(row.prompt_ids), width)
            torch.testing.assert_close(a._k[r, :, real], b._k[r, :, real], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a._v[r, :, real], b._v[r, :, real], atol=1e-4, rtol=1e-4)


def test_tree_prefill_keeps_the_padded_batch_for_other_attention_kernels(pop, tiny_tokenizer, monkeypatch):
    """An attention implementation other than SDPA or eager (flash-attention's take no 4D mask) gets the padded
    prefill: one row per unique prompt, not one per adapter."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    monkeypatch.setitem(AttentionInterface._global_mapping, "test_kernel", sdpa_attention_forward)
    monkeypatch.setattr(pop.model.base_model.model.config, "_attn_implementation", "test_kernel")
    shapes = _Shapes(pop)
    HFGenerator(pop, tiny_tokenizer, engine="loop", fused_decode=False).generate(_requests(0.0))
    assert [s[0] for s in shapes.prefill()] == [4]
    shapes.hook.remove()
