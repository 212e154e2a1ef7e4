"""Small adapter states and dense references for the evolution tests."""

from __future__ import annotations

import torch

from evolution.operators import lora_modules

SHAPES = {"self_attn.q_proj": (12, 10), "self_attn.k_proj": (6, 10), "mlp.down_proj": (10, 14)}


def make_state(
    seed: int, *, layers: int = 2, rank: int = 4, dtype: torch.dtype = torch.float32, shapes=SHAPES
) -> dict[str, torch.Tensor]:
    """A PEFT-named adapter state with random (trained-looking) factors."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for layer in range(layers):
        for name, (d_out, d_in) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{name}"
            state[f"{prefix}.lora_A.weight"] = (torch.randn(rank, d_in, generator=g) / d_in**0.5).to(dtype)
            state[f"{prefix}.lora_B.weight"] = (torch.randn(d_out, rank, generator=g) * 0.1).to(dtype)
    return state


def deltas(state) -> dict[str, torch.Tensor]:
    """Module name -> dense float64 B·A."""
    return {m.name: state[m.b_key].double() @ state[m.a_key].double() for m in lora_modules(state)}


def top_r(M: torch.Tensor, r: int) -> torch.Tensor:
    """Best rank-r approximation (dense SVD, float64)."""
    U, S, Vh = torch.linalg.svd(M.double(), full_matrices=False)
    return (U[:, :r] * S[:r]) @ Vh[:r]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of a w.r.t. b."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny_llama():
    """A 2-layer, hidden-64, vocab-128 Llama with seeded random weights (no tokenizer needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    return LlamaForCausalLM(cfg)
