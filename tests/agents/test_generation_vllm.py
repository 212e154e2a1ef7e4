"""Tests of the vLLM backend (agents.generation.vllm).

Without vLLM (this CPU environment) the engine-independent logic runs against a FAKE engine installed as the
``vllm`` modules: it loads the adapter directories the backend writes into its own PEFT model and caches them
by ``lora_int_id`` exactly like vLLM (a known id with a new path keeps the cached weights), so the tests
check the saved files, adapter versioning and request/output plumbing. They do NOT validate vLLM itself:
``tests/agents/test_vllm_engine.py`` (``pytest -m vllm`` in the vLLM venv) does that on a real engine (vLLM's
CPU build here, the CUDA one wherever it is installed; ``benchmarks/gpu_check.py`` runs it on a GPU machine).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator, make_generator
from agents.generation.hf import row_seed
from agents.generation.vllm import CPU_KV_CACHE_BYTES

PROMPTS = ["Write a function that adds two numbers.", "What is 2 + 2?", "hi", "List three primes."]


# ---------------------------------------------------------------------- a fake vLLM


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str
    load_inplace: bool = False


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list = field(default_factory=list)
    skip_special_tokens: bool = True


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeEngineArgs:
    logprobs_mode: str = "raw_logprobs"
    kv_cache_memory_bytes: int | None = None
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = None


class FakeLLM:
    """Greedy-only stand-in for ``vllm.LLM`` serving LoRAs from PEFT directories, cached by int id."""

    instances: list = []

    def __init__(self, base=None, tokenizer=None, **kwargs):
        self.kwargs = kwargs
        self.base, self.tokenizer = base, tokenizer
        self.cache: dict[int, object] = {}  # lora_int_id -> PeftModel with the adapter as loaded then
        self.removed: list[int] = []
        self.calls: list = []
        self.llm_engine = self
        FakeLLM.instances.append(self)

    def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return self.cache.pop(lora_id, None) is not None

    def get_tokenizer(self):
        return self.tokenizer

    def _model(self, lora):
        from peft import PeftModel

        if lora is None:
            return self.base
        if lora.lora_int_id not in self.cache:  # like vLLM: a known id is never reloaded
            self.cache[lora.lora_int_id] = PeftModel.from_pretrained(copy.deepcopy(self.base), lora.lora_path)
        return self.cache[lora.lora_int_id]

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.calls.append((prompts, params, lora_request))
        outs = []
        for prompt, sp, lora in zip(prompts, params, lora_request, strict=True):
            assert sp.temperature == 0, "the fake engine is greedy only"
            model = self._model(lora)
            ids = list(prompt["prompt_token_ids"])
            toks, lps, finish = [], [], "length"
            with torch.no_grad():
                for _ in range(sp.max_tokens):
                    logits = model(input_ids=torch.tensor([ids + toks])).logits[0, -1].float()
                    t = int(logits.argmax())
                    toks.append(t)
                    lps.append({t: FakeLogprob(float(torch.log_softmax(logits, -1)[t]))})
                    if t in sp.stop_token_ids:
                        finish = "stop"
                        break
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            sample = types.SimpleNamespace(token_ids=toks, logprobs=lps, text=text, finish_reason=finish)
            outs.append(types.SimpleNamespace(outputs=[sample], prompt_token_ids=ids))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch, tiny_base):
    base, tok = tiny_base
    FakeLLM.instances = []
    llm_cls = type(
        "BoundFakeLLM", (FakeLLM,), {"__init__": lambda self, **kw: FakeLLM.__init__(self, base, tok, **kw)}
    )
    mods = {
        "vllm": types.SimpleNamespace(LLM=llm_cls, SamplingParams=FakeSamplingParams),
        "vllm.lora": types.SimpleNamespace(),
        "vllm.lora.request": types.SimpleNamespace(LoRARequest=FakeLoRARequest),
        "vllm.inputs": types.SimpleNamespace(
            TokensPrompt=lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
        ),
        "vllm.engine": types.SimpleNamespace(),
        "vllm.engine.arg_utils": types.SimpleNamespace(EngineArgs=FakeEngineArgs),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    FakeEngineArgs.__dataclass_fields__  # noqa: B018 - a real dataclass, as _engine_accepts expects
    return FakeLLM


# ---------------------------------------------------------------------- tests


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_gives_install_hint(population, tiny_tokenizer):
    with pytest.raises(ImportError, match=r"pip install '\.\[vllm\]'"):
        make_generator("vllm", population(["ma"]), tiny_tokenizer, model_path="tiny-random")


def test_engine_configuration(fake_vllm, population, tiny_tokenizer, tiny_base_path):
    pop = population(["ma", "mb", "mc"], rank=4)
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", max_model_len=512,
                         dtype=torch.bfloat16)
    kw = fake_vllm.instances[-1].kwargs
    assert kw["model"] == tiny_base_path and kw["enable_lora"] is True
    # one slot per member + the zero adapter that serves the base; rank 4 -> the smallest allowed, 8
    assert kw["max_loras"] == 4 and kw["max_cpu_loras"] >= 4 and kw["max_lora_rank"] == 8
    assert kw["dtype"] == "bfloat16" and kw["logprobs_mode"] == "raw_logprobs" and kw["max_model_len"] == 512
    # adapters are written in the engine dtype, as PEFT directories
    gen.refresh(["ma"])
    path = gen.lora_request("ma").lora_path
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(f"{path}/adapter_model.safetensors").values()} == {torch.bfloat16}
    assert json.loads(open(f"{path}/adapter_config.json").read())["r"] == 4
    assert kw["enforce_eager"] is False  # no vllm.platforms here: not the CPU platform
    assert "kv_cache_memory_bytes" not in kw  # on a GPU vLLM sizes the KV cache from gpu_memory_utilization
    assert "enable_chunked_prefill" not in kw and "max_num_batched_tokens" not in kw  # vLLM's own on a GPU
    # the base is served by a zero adapter: the member's keys and A factors, every B exactly 0
    base_path = gen.lora_request(None).lora_path
    member, zero = (load_file(f"{d}/adapter_model.safetensors") for d in (path, base_path))
    assert member.keys() == zero.keys() and any("lora_B" in k for k in zero)
    for key, value in zero.items():
        assert value.count_nonzero() == 0 if "lora_B" in key else torch.equal(value, member[key])
    gen.close()
    assert not __import__("os").path.exists(base_path)


def test_cpu_platform_runs_eagerly(fake_vllm, monkeypatch, population, tiny_tokenizer):
    platform = types.SimpleNamespace(is_cpu=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    make_generator("vllm", population(["ma"]), tiny_tokenizer, model_path="tiny-random").close()
    assert fake_vllm.instances[-1].kwargs["enforce_eager"] is True
    assert fake_vllm.instances[-1].kwargs["dtype"] == "float32"  # default: the population's dtype
    # an explicit KV cache: on CPU gpu_memory_utilization would reserve that share of host memory
    assert fake_vllm.instances[-1].kwargs["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    make_generator("vllm", population(["ma"]), tiny_tokenizer, model_path="tiny-random",
                   enforce_eager=False, kv_cache_memory_bytes=1 << 20).close()
    kw = fake_vllm.instances[-1].kwargs
    assert kw["enforce_eager"] is False and kw["kv_cache_memory_bytes"] == 1 << 20


def test_cpu_platform_never_chunks_a_prefill(fake_vllm, monkeypatch, population, tiny_tokenizer, tiny_base_path):
    """Every request is seeded, and vLLM's CPU platform cannot rewind a seeded request's generator after a chunked
    prefill (tests/agents/test_vllm_engine.py shows the crash on the real engine): chunked prefill off, with a
    batch budget of at least the model length (vLLM refuses a smaller one then); a caller's values stay."""
    platform = types.SimpleNamespace(is_cpu=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    model_len = json.loads((Path(tiny_base_path) / "config.json").read_text())["max_position_embeddings"]
    budgets = {}
    for max_model_len in (None, 512, 3 * 4096):
        make_generator("vllm", population(["ma"]), tiny_tokenizer, model_path="tiny-random",
                       max_model_len=max_model_len).close()
        kw = fake_vllm.instances[-1].kwargs
        assert kw["enable_chunked_prefill"] is False
        budgets[max_model_len] = kw["max_num_batched_tokens"]
    assert budgets == {None: max(4096, model_len), 512: 4096, 3 * 4096: 3 * 4096}
    make_generator("vllm", population(["ma"]), tiny_tokenizer, model_path="tiny-random",
                   enable_chunked_prefill=True, max_num_batched_tokens=256).close()
    kw = fake_vllm.instances[-1].kwargs
    assert kw["enable_chunked_prefill"] is True and kw["max_num_batched_tokens"] == 256


def test_mixed_batch_matches_hf_backend(fake_vllm, population, tiny_tokenizer):
    pop = population(["ma", "mb", "mc"], nonzero_std=0.5)
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", dtype="float32")
    requests = [
        GenerationRequest(a, p, max_new_tokens=8, temperature=0, seed=5)
        for a, p in zip(["ma", "mb", None, "mc"], PROMPTS, strict=True)
    ]
    out = gen.generate(requests)
    ref = HFGenerator(pop, tiny_tokenizer).generate(requests)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert [c.prompt_token_ids for c in out] == [c.prompt_token_ids for c in ref]
    for a, b in zip(out, ref, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert (a.request_index, a.sample_index, a.adapter, a.text) == (
            b.request_index,
            b.sample_index,
            b.adapter,
            b.text,
        )
    prompts, params, loras = fake_vllm.instances[-1].calls[-1]
    assert len(prompts) == 4  # one engine call for the mixed batch
    # the base row carries the zero adapter, never lora_request=None (see agents.generation.vllm)
    assert [lr.lora_name for lr in loras] == ["ma@v1", "mb@v1", "_base@zero", "mc@v1"]
    assert all(sp.logprobs == 0 and sp.seed == row_seed(5, 0) for sp in params)
    gen.close()


def test_refresh_uses_a_fresh_id_per_version(fake_vllm, population, tiny_tokenizer):
    pop = population(["ma", "mb"], nonzero_std=0.5)
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", dtype="float32")
    engine = fake_vllm.instances[-1]
    req = [GenerationRequest("ma", PROMPTS[0], max_new_tokens=6, temperature=0)]
    before = gen.generate(req)[0].token_ids
    first = gen.lora_request("ma")
    pop.load_state("ma", pop.state("mb"))  # an "update" of ma
    assert gen.generate(req)[0].token_ids == before  # stale until refreshed: the engine caches by id
    gen.refresh(["ma"])
    second = gen.lora_request("ma")
    assert second.lora_int_id != first.lora_int_id and second.lora_path != first.lora_path
    assert engine.removed == [first.lora_int_id]
    assert not __import__("os").path.exists(first.lora_path)  # the old version's files are gone
    after = gen.generate(req)[0].token_ids
    as_mb = gen.generate([GenerationRequest("mb", PROMPTS[0], max_new_tokens=6, temperature=0)])[0].token_ids
    assert after == as_mb != before
    # a member that left the population is dropped from the engine on the next refresh
    mb_id = gen.lora_request("mb").lora_int_id
    pop.remove("mb")
    gen.refresh()
    assert mb_id in engine.removed
    with pytest.raises(KeyError, match="not a member"):
        gen.refresh(["mb"])
    root = gen.adapter_dir
    gen.close()
    assert not root.exists()


def test_samples_are_separate_seeded_requests(fake_vllm, population, tiny_tokenizer):
    pop = population(["ma"])
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", dtype="float32")
    out = gen.generate([GenerationRequest("ma", PROMPTS[2], max_new_tokens=2, temperature=0, seed=9, n=3)])
    assert [(c.request_index, c.sample_index) for c in out] == [(0, 0), (0, 1), (0, 2)]
    _, params, _ = fake_vllm.instances[-1].calls[-1]
    assert [sp.seed for sp in params] == [row_seed(9, k) for k in range(3)] and all(
        sp.n == 1 for sp in params
    )
    with pytest.raises(KeyError, match="not a member"):
        gen.generate([GenerationRequest("zz", "hi")])
    gen.close()


def test_adapter_directory_is_checked_for_room_before_the_engine_starts(fake_vllm, monkeypatch, population,
                                                                         tiny_tokenizer, tmp_path):
    """``adapter_dir`` given: its free space is checked before the engine is built (no write, no engine on
    failure, one line naming both sizes); default: ``/dev/shm`` when it has the room, else ``fallback_dir`` (a
    run's ``vllm-adapters/``); the backend's own directory is deleted by ``close``."""
    import agents.generation.vllm as vg

    pop = population(["ma", "mb"], rank=4)
    needed = 4 * vg.adapter_bytes(pop, torch.float32)  # every member, the zero adapter, one new version
    free = {"bytes": needed - 1}
    monkeypatch.setattr(vg, "_free", lambda path: free["bytes"])
    explicit = tmp_path / "fast"
    with pytest.raises(vg.AdapterSpaceError, match=r"--generation.vllm-adapter-dir .*fast has 0 MiB free; vLLM's "
                                                   r"adapters need 0 MiB"):
        make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", adapter_dir=explicit)
    assert fake_vllm.instances == [] and not explicit.exists()
    # /dev/shm without the room: the run directory's folder, checked too
    monkeypatch.setattr(vg, "SHM", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    with pytest.raises(vg.AdapterSpaceError, match="run directory's adapter folder"):
        make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", fallback_dir=tmp_path / "run" / "va")
    room = {tmp_path / "shm": needed - 1}
    monkeypatch.setattr(vg, "_free", lambda path: room.get(path, needed))
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", fallback_dir=tmp_path / "run" / "va")
    assert gen.adapter_dir.parent == tmp_path / "run" / "va"
    gen.refresh(["ma"])
    [written] = (gen.adapter_dir / "ma").glob("v1-*")  # <member>/v<version>-<lora id>
    assert (written / "adapter_model.safetensors").is_file()
    gen.close()
    assert not gen.adapter_dir.exists()
    room[tmp_path / "shm"] = needed  # /dev/shm with the room: the first choice
    gen = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", fallback_dir=tmp_path / "run" / "va")
    assert gen.adapter_dir.parent == tmp_path / "shm"
    gen.close()
    kept = make_generator("vllm", pop, tiny_tokenizer, model_path="tiny-random", adapter_dir=explicit)
    kept.refresh(["mb"])
    kept.close()
    assert explicit.is_dir()  # a directory the user gave is theirs: emptied of versions, not removed
