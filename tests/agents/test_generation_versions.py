"""The adapter lifecycle contract of the generation engines (``agents/generation/versions.py``), for the HF
backend and the vLLM backend (against the fake engine of ``test_generation_vllm.py``): an engine serves exactly the
version a request names, swaps a new version in atomically between calls (a call in flight finishes with the old
one), and a refused load keeps the old version and says so."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator, make_generator
from agents.generation.versions import AdapterLoadError, AdapterVersionError
from tests.agents.test_generation_vllm import PROMPTS, fake_vllm  # noqa: F401 - the fixture

GREEDY = dict(max_new_tokens=6, temperature=0.0)


def _ask(adapter: str, version: int | None = None, prompt: str = "Name a prime number.") -> GenerationRequest:
    return GenerationRequest(adapter, prompt, version=version, **GREEDY)


def test_hf_serves_the_version_asked_for_and_refuses_another(population, tiny_tokenizer):
    pop = population(["ma", "mb"], nonzero_std=0.5)
    gen = HFGenerator(pop, tiny_tokenizer)
    as_mb = gen.generate([_ask("mb")])[0]
    assert as_mb.version is None  # no version loaded: the live weights, untracked
    with pytest.raises(AdapterVersionError, match="version 3 of 'ma'.*no version loaded"):
        gen.generate([_ask("ma", 3)])
    gen.load_version("ma", 3, pop.state("mb"))  # version 3 of ma: mb's weights
    out = gen.generate([_ask("ma", 3), _ask("ma")])
    assert [c.version for c in out] == [3, 3]
    assert out[0].token_ids == as_mb.token_ids and out[0].logprobs == pytest.approx(as_mb.logprobs, abs=1e-5)
    with pytest.raises(AdapterVersionError, match="version 2 of 'ma'; the engine serves version 3"):
        gen.generate([_ask("ma", 2)])
    with pytest.raises(AdapterVersionError, match="of the base model"):
        gen.generate([GenerationRequest(None, "hi", version=1, **GREEDY)])


@pytest.mark.parametrize("bad", ["shape", "nan", "missing"])
def test_hf_refused_load_keeps_serving_the_old_version(population, tiny_tokenizer, bad, caplog):
    pop = population(["ma", "mb"], nonzero_std=0.5)
    gen = HFGenerator(pop, tiny_tokenizer)
    gen.load_version("ma", 1, pop.state("ma"))
    before, out = pop.state("ma"), gen.generate([_ask("ma", 1)])[0]
    state = pop.state("mb")
    key = next(iter(state))
    if bad == "shape":
        state[key] = torch.zeros(3, 3)
    elif bad == "nan":
        state[key] = state[key].clone().fill_(float("nan"))
    else:
        del state[key]
    with pytest.raises(AdapterLoadError, match="version 2 of adapter 'ma' was not loaded .*keeps serving version 1"):
        gen.load_version("ma", 2, state)
    assert "keeps serving version 1" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in pop.state("ma").items())
    again = gen.generate([_ask("ma", 1)])[0]
    assert again.token_ids == out.token_ids and again.version == 1


def test_hf_swap_waits_for_the_call_in_flight(population, tiny_tokenizer, monkeypatch):
    """A load that arrives while a generate call runs waits for it: the call finishes with the old weights and
    the next one sees the new version."""
    pop = population(["ma", "mb"], nonzero_std=0.5)
    gen = HFGenerator(pop, tiny_tokenizer)
    gen.load_version("ma", 1, pop.state("ma"))
    old = gen.generate([_ask("ma", 1)])[0]
    new_weights = pop.state("mb")
    started, release = threading.Event(), threading.Event()
    real = gen._generate_rows

    def slow(rows):
        started.set()
        assert release.wait(30)
        return real(rows)

    monkeypatch.setattr(gen, "_generate_rows", slow)
    result: dict = {}
    caller = threading.Thread(target=lambda: result.setdefault("out", gen.generate([_ask("ma", 1)])))
    caller.start()
    assert started.wait(30)
    loader = threading.Thread(target=lambda: gen.load_version("ma", 2, new_weights))
    loader.start()
    time.sleep(0.3)
    assert loader.is_alive() and gen.versions.served["ma"] == 1  # the swap waits for the call
    release.set()
    caller.join(30)
    loader.join(30)
    assert not caller.is_alive() and not loader.is_alive()
    assert result["out"][0].token_ids == old.token_ids and result["out"][0].version == 1
    monkeypatch.setattr(gen, "_generate_rows", real)
    assert gen.versions.served["ma"] == 2
    assert gen.generate([_ask("mb")])[0].token_ids == gen.generate([_ask("ma", 2)])[0].token_ids


def test_vllm_load_version_gives_a_new_id_and_keeps_the_old_one_when_refused(fake_vllm, population,  # noqa: F811
                                                                           tiny_tokenizer, monkeypatch):
    pop = population(["ma", "mb"], nonzero_std=0.5)
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", dtype="float32")
    engine = fake_vllm.instances[-1]
    req = [GenerationRequest("ma", PROMPTS[0], version=5, **GREEDY)]
    with pytest.raises(AdapterVersionError, match="version 5 of 'ma'"):
        gen.generate(req)
    gen.load_version("ma", 5, pop.state("mb"))  # the trainer's population is not touched
    assert not all(torch.equal(pop.state("ma")[k], v) for k, v in pop.state("mb").items())
    first = gen.lora_request("ma")
    out = gen.generate(req)[0]
    as_mb = gen.generate([GenerationRequest("mb", PROMPTS[0], **GREEDY)])[0]
    assert out.version == 5 and out.token_ids == as_mb.token_ids
    gen.load_version("ma", 6, pop.state("ma"))
    second = gen.lora_request("ma")
    assert second.lora_int_id != first.lora_int_id and engine.removed[-1] == first.lora_int_id
    assert gen.generate([GenerationRequest("ma", PROMPTS[0], version=6, **GREEDY)])[0].version == 6

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pop, "save", full_disk)
    with pytest.raises(AdapterLoadError, match="version 7 .*No space left.*keeps serving version 6"):
        gen.load_version("ma", 7, pop.state("mb"))
    assert gen.lora_request("ma") is second and engine.removed[-1] == first.lora_int_id
    assert gen.generate([GenerationRequest("ma", PROMPTS[0], version=6, **GREEDY)])[0].version == 6
    gen.close()
