"""Mutations (one parent): M1 spectral, M2 layer-selective noise, M3 component masking, M4 adaptive noise.

Randomness: an operator's generator first draws what the docstring says is drawn once per child, then one seed
per module (:func:`evolution.parallel.module_seeds`, in module order); module ``j`` draws from
``torch.Generator().manual_seed(seed_j)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from evolution.gram import single_svd
from evolution.keys import copy_module, ordered
from evolution.lowrank import compute_dtype
from evolution.parallel import map_modules
from evolution.registry import register_operator

__all__ = ["adaptive_noise", "cayley", "component_mask", "layer_mutation", "noise", "svd_mutation"]


def cayley(Kskew: Tensor, eps: float) -> Tensor:
    """Exact rotation ``(I − εK/2)⁻¹ (I + εK/2)`` of a skew-symmetric ``K`` (batched, float64)."""
    eye = torch.eye(Kskew.shape[-1], dtype=Kskew.dtype, device=Kskew.device).expand_as(Kskew)
    half = 0.5 * eps * Kskew
    return torch.linalg.solve(eye - half, eye + half)


def noise(X: Tensor, eps: float, generator: torch.Generator) -> Tensor:
    """``X + ε·std(X)·Z``, ``Z ~ N(0, 1)`` of X's shape drawn (``torch.randn``) from ``generator`` in the compute
    dtype (float32, float64 for float64 ``X``); ``std`` the tensor's unbiased std (0 for a single entry)."""
    cdt = compute_dtype(X.dtype)
    Xc = X.to(cdt)
    std = Xc.std() if Xc.numel() > 1 else torch.zeros((), dtype=cdt, device=X.device)
    Z = torch.randn(X.shape, generator=generator, dtype=cdt, device=X.device)
    return Z.mul_(eps * std).add_(Xc).to(X.dtype)


@register_operator("svd_mutation", family="mutation", arity=1, defaults={"epsilon": 0.1}, default_pool=True)
def svd_mutation(parents, modules, generator, *, epsilon: float):
    """M1 spectral mutation on ΔW's SVD: log-normal singular values and small exact rotations.

    Per module, with ``B·A = U diag(S) Vᵀ`` (exact, :mod:`evolution.lowrank`; ``S`` descending, signs fixed so
    that ``1ᵀuᵢ ≥ 0`` with ``vᵢ`` flipped alongside, :func:`evolution.gram.canonical_signs`)::

        S' = S ⊙ exp(ε z),          z ~ N(0, I_r)
        U' = U R_U,  V' = V R_V,    R = (I − εK/2)⁻¹ (I + εK/2),  K = (G − Gᵀ)/2,  G ~ N(0, 1)^{r×r}
        B' = U' diag(√S'),  A' = diag(√S') V'ᵀ        (so ΔW' = U R_U diag(S') R_Vᵀ Vᵀ)

    The Cayley transform makes ``R`` exactly orthogonal (lucidrains' ``I + ε·skew(G)`` is only first-order
    orthogonal); it equals ``I + εK + O(ε²)``. Rotations act only among live components (``S_i > 0``): ``K_ij``
    is zeroed unless both ``i`` and ``j`` are live, so dead components have no defined singular vectors and stay
    dead (then regrow as fresh LoRA components). With ``epsilon = 0`` the child's ΔW equals the parent's.
    Draws: module ``j``'s generator gives ``z = randn(r)``, then ``G_U = randn(r, r)``, then ``G_V = randn(r, r)``
    (float64), then any regrown A rows.
    """

    def modify(S, live, gens):
        r = S.shape[-1]
        z = torch.stack([torch.randn(r, generator=g, dtype=torch.float64, device=g.device) for g in gens])
        GU, GV = [], []
        for g in gens:
            GU.append(torch.randn((r, r), generator=g, dtype=torch.float64, device=g.device))
            GV.append(torch.randn((r, r), generator=g, dtype=torch.float64, device=g.device))
        GU = torch.stack(GU).to(S.device)
        GV = torch.stack(GV).to(S.device)
        pair = (live.unsqueeze(-1) & live.unsqueeze(-2)).to(torch.float64)
        KU = 0.5 * (GU - GU.mT) * pair
        KV = 0.5 * (GV - GV.mT) * pair
        S2 = S * torch.exp(epsilon * z.to(S.device))
        return S2, cayley(KU, epsilon), cayley(KV, epsilon)

    return single_svd(parents[0], modules, generator, modify)


@register_operator(
    "layer_mutation",
    family="mutation",
    arity=1,
    defaults={"epsilon": 0.1, "fraction": 0.33},
    default_pool=True,
)
def layer_mutation(parents, modules, generator, *, epsilon: float, fraction: float):
    """M2 layer-selective Gaussian noise on the factors of a random subset of modules.

    Choose ``n = max(1, ⌊f·L⌋)`` of the ``L`` modules uniformly without replacement (the first ``n`` entries of
    ``randperm(L)``, the operator's first draw); on those only::

        A' = A + ε·std(A)·Z_A,   B' = B + ε·std(B)·Z_B,   Z ~ N(0, 1) entrywise (module's generator, A then B)

    (``std`` = the tensor's own unbiased std, so the noise is relative to each factor's scale; :func:`noise`).
    The chosen modules' seeds are drawn after the permutation, one per chosen module in module order. Other
    modules are bitwise copies. Acts on the factors (ΔW changes by ``ε(std(B) Z_B A + std(A) B Z_A) + O(ε²)``).
    A factor with zero std (an untrained ``B = 0``) gets no noise, and noise on A alone leaves ΔW = 0 there.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"layer_mutation: fraction must be in [0, 1], got {fraction}")
    parent = parents[0]
    n = max(1, math.floor(fraction * len(modules)))
    chosen = set(torch.randperm(len(modules), generator=generator, device=generator.device)[:n].tolist())
    picked = [m for i, m in enumerate(modules) if i in chosen]
    child: dict[str, Tensor] = {}
    for i, m in enumerate(modules):
        if i not in chosen:
            copy_module(child, parent, m)
    if picked:
        child.update(_noise_modules(parent, picked, generator, epsilon))
    return ordered(child, parent)


def _noise_modules(parent, modules, generator, epsilon) -> dict[str, Tensor]:
    device = parent[modules[0].a_key].device

    def work(chunk, gens):
        out = {}
        for m, g in zip(chunk, gens, strict=True):
            out[m.a_key] = noise(parent[m.a_key], epsilon, g)
            out[m.b_key] = noise(parent[m.b_key], epsilon, g)
        return out

    return map_modules(modules, generator, device, work)


@register_operator("component_mask", family="mutation", arity=1, defaults={"rho": 0.3}, default_pool=True)
def component_mask(parents, modules, generator, *, rho: float):
    """M3 component masking: zero ``⌈ρ·r⌉`` uniformly chosen singular components of each module's ΔW.

    ``B·A = U diag(S) Vᵀ`` (``S`` descending); ``S'_i = 0`` for a random index set of size ``⌈ρr⌉``, else
    ``S'_i = S_i``. The set is drawn among all ``r`` indices per module: ``r`` float64 uniform scores
    (``rand(r)``, the module's generator), and the indices of the ``⌈ρr⌉`` smallest scores are masked. Refactor
    ``B' = U diag(√S')``, ``A' = diag(√S') Vᵀ``. The masked components come back as dead LoRA components
    (B column 0, fresh A row drawn next from the module's generator) — nominal rank kept, effective rank lower,
    and able to regrow.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"component_mask: rho must be in [0, 1], got {rho}")

    def modify(S, live, gens):
        r = S.shape[-1]
        n_mask = min(r, math.ceil(rho * r))
        scores = torch.stack([torch.rand(r, generator=g, dtype=torch.float64, device=g.device) for g in gens])
        idx = scores.to(S.device).argsort(dim=-1)[:, :n_mask]
        keep = torch.ones_like(S).scatter_(-1, idx, 0.0)
        return S * keep, None, None

    return single_svd(parents[0], modules, generator, modify)


@register_operator(
    "adaptive_noise", family="mutation", arity=1, defaults={"epsilon": 0.15}, default_pool=True
)
def adaptive_noise(parents, modules, generator, *, epsilon: float):
    """M4 full-tensor adaptive Gaussian noise: M2 on every module.

    ``A' = A + ε·std(A)·Z_A``, ``B' = B + ε·std(B)·Z_B`` for every module (noise relative to each tensor's own
    std, :func:`noise`; a zero-std tensor gets none; ``Z`` from the module's generator, A then B). Acts on the
    factors.
    """
    return ordered(_noise_modules(parents[0], modules, generator, epsilon), parents[0])
