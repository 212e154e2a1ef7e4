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


# ------------------------------------------------------------------ independent float64 references of the operators
# Each follows the operator's docstring: the same documented draws (one seed per module from the operator's
# generator, ``torch.randint(0, 2**62, (L,))``; module j draws from ``Generator().manual_seed(seed_j)``), the math
# redone densely in float64 (``torch.linalg.svd`` of B·A, not the operators' Gram route).


def module_generators(generator: torch.Generator, n: int) -> list[torch.Generator]:
    """The per-module generators an operator derives from ``generator`` (its next draw)."""
    return [gen(s) for s in torch.randint(0, 2**62, (n,), generator=generator).tolist()]


def canonical_svd(A: torch.Tensor, B: torch.Tensor):
    """Dense float64 SVD of B·A, top r = rank(A) triplets, signs with 1ᵀuᵢ ≥ 0 (vᵢ flipped alongside)."""
    r = A.shape[0]
    U, S, Vh = torch.linalg.svd(B.double() @ A.double(), full_matrices=False)
    U, S, V = U[:, :r], S[:r], Vh[:r].mT
    sums = U.sum(0)
    live = S > 1e-10 * S[0]
    assert float(sums[live].abs().min()) > 1e-3, "a sign tie would make the reference ambiguous"
    sign = torch.where(sums < 0, -1.0, 1.0).to(torch.float64)
    return U * sign, S, V * sign


def cayley_rotation(G: torch.Tensor, eps: float, live: torch.Tensor | None = None) -> torch.Tensor:
    """``(I − εK/2)⁻¹ (I + εK/2)`` with ``K = (G − Gᵀ)/2`` restricted to the live components (float64)."""
    K = 0.5 * (G - G.mT)
    if live is not None:
        K = K * (live[:, None] & live[None, :])
    eye = torch.eye(G.shape[-1], dtype=torch.float64)
    return torch.linalg.solve(eye - 0.5 * eps * K, eye + 0.5 * eps * K)


def svd_mutation_reference(parent, seed: int, eps: float) -> dict[str, torch.Tensor]:
    """M1 child factors: ``B' = U R_U diag(√S')``, ``A' = diag(√S') (V R_V)ᵀ``, ``S' = S·exp(εz)``; module j
    draws z (r), G_U (r×r), G_V (r×r), float64. Rotations only among live components (S > 0); a dead one keeps
    a zero B column and gets a fresh PEFT-init A row, drawn next from the module's generator."""
    mods = lora_modules(parent)
    out = {}
    for m, g in zip(mods, module_generators(gen(seed), len(mods)), strict=True):
        U, S, V = canonical_svd(parent[m.a_key], parent[m.b_key])
        r, d_in = S.shape[0], parent[m.a_key].shape[1]
        live = S > 1e-10 * S[0]
        z = torch.randn(r, generator=g, dtype=torch.float64)
        R_U = cayley_rotation(torch.randn(r, r, generator=g, dtype=torch.float64), eps, live)
        R_V = cayley_rotation(torch.randn(r, r, generator=g, dtype=torch.float64), eps, live)
        root = torch.where(live, (S * torch.exp(eps * z)).sqrt(), 0.0)
        out[m.b_key] = (U @ R_U) * root
        out[m.a_key] = root[:, None] * (V @ R_V).mT
        n_dead = int((~live).sum())
        if n_dead:
            bound = 1 / d_in**0.5
            out[m.a_key][~live] = torch.empty(n_dead, d_in).uniform_(-bound, bound, generator=g).double()
    return out


def noise_reference(parent, modules, gens, eps: float) -> dict[str, torch.Tensor]:
    """M2/M4 on ``modules``: ``X + ε·std(X)·Z`` (unbiased std, 0 for one entry), Z = randn of X's shape (float32
    draw), A then B."""
    out = {}
    for m, g in zip(modules, gens, strict=True):
        for key in (m.a_key, m.b_key):
            X = parent[key].double()
            Z = torch.randn(parent[key].shape, generator=g, dtype=torch.float32).double()
            std = X.std() if X.numel() > 1 else 0.0  # undefined for one entry: no noise
            out[key] = X + eps * std * Z
    return out
