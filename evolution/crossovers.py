"""Crossovers (two parents): X1 DARE, X2 layer crossover, X3 SVD-subspace crossover, X4 extrapolation, task
arithmetic.

For crossovers **parent 2 is the fitter parent** where it matters (``extrapolate``). ``space="delta"`` (default)
combines ΔW exactly and truncates to rank r via the stacked factors (:func:`evolution.gram.sum_to_rank`);
``space="factor"`` combines the factors (:mod:`evolution.factor_space`). Randomness: what is drawn once per
child comes first from the operator's generator, then one seed per module (:mod:`evolution.parallel`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from evolution.factor_space import check_space, check_weights, factor_linear, factor_signed_sqrt
from evolution.gram import emit, is_zero_gram, sum_to_rank, svd_maps
from evolution.keys import copy_module, module_factors, ordered
from evolution.lowrank import compute_dtype, dead_components
from evolution.parallel import map_modules
from evolution.registry import register_operator

__all__ = [
    "dare",
    "dare_drop",
    "dare_mask_pair",
    "extrapolate",
    "layer_crossover",
    "svd_crossover",
    "task_arithmetic",
]


def dare_drop(x: Tensor, p: float, generator: torch.Generator) -> Tensor:
    """DARE's drop-and-rescale ``D(x) = x ⊙ M / (1 − p)`` with ``M_ij ~ Bernoulli(1 − p)`` i.i.d.

    ``M_ij = [u_ij ≥ p]`` for ``u ~ U[0, 1)`` (float32, one draw per entry in ``x``'s memory order) from
    ``generator``, so ``E[D(x)] = x``; survivors are exactly ``x/(1 − p)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"drop probability p must be in [0, 1), got {p}")
    if p == 0.0:
        return x.clone()
    u = torch.empty(x.shape, dtype=torch.float32, device=x.device).uniform_(generator=generator)
    if x.dtype == torch.float32:
        return u.ge_(p).mul_(x).div_(1.0 - p)
    return (x * (u >= p)).div_(1.0 - p)


def dare_mask_pair(u: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """Two independent ``Bernoulli(1 − p)`` keep-masks from ONE uniform ``u ~ U[0, 1)``.

    ``m₁ = [u ≥ p]``; given ``m₁``, the residual ``(u − p)/(1 − p)`` (kept) or ``u/p`` (dropped) is again
    ``U[0, 1)`` and independent of ``m₁``, and ``m₂ = [residual ≥ p]`` simplifies to
    ``m₂ = [u ≥ 2p − p²] ∨ [p² ≤ u < p]``: ``P(m₂) = 1 − p`` and ``P(m₁ ∧ m₂) = (1 − p)²``. Exact up to the
    float32 grid of ``u`` (2⁻²⁴), it halves the random numbers DARE draws (the RNG is a serial kernel).
    """
    m1 = u >= p
    m2 = (u >= 2.0 * p - p * p).logical_or_((u >= p * p).logical_and_(u < p))
    return m1, m2



@register_operator(
    "dare", family="crossover", arity=2, defaults={"p": 0.7, "space": "delta"}, default_pool=True
)
def dare(parents, modules, generator, *, p: float, space: str):
    """X1 DARE crossover: drop-and-rescale each parent, then average.

    ``D(X) = X ⊙ M / (1 − p)``, ``M ~ Bernoulli(1 − p)`` i.i.d. (:func:`dare_drop`), independent masks for every
    factor of every parent.

    * ``space="delta"`` (default): ``ΔW_c = ½(D(B₁)D(A₁) + D(B₂)D(A₂))`` exactly, truncated to rank r via the
      stacked factors. Independent masks on A and B keep ``E[D(B)D(A)] = BA``, so ``E[ΔW_c]`` (before truncation)
      is ``½(ΔW₁ + ΔW₂)``. The ``1/(1 − p)`` of both factors is folded into the weights (``½/(1 − p)²``).
    * ``space="factor"``: ``A_c = ½(D(A₁) + D(A₂))``, ``B_c = ½(D(B₁) + D(B₂))`` (lucidrains' X1; its ΔW has the
      cross terms ``D(B_i)D(A_j)``).

    Randomness (reproducible): module ``j`` has its own generator (seeded from the operator's generator, see
    :func:`evolution.parallel.map_modules`) and draws one float32 uniform of B's shape, then one of A's shape;
    each yields the two parents' independent masks via :func:`dare_mask_pair` (half the random numbers of one
    draw per mask entry).
    """
    space = check_space(space)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dare: p must be in [0, 1), got {p}")
    if space == "delta":
        if p == 0.0:
            return sum_to_rank(parents, modules, generator, (0.5, 0.5))
        w = 0.5 / (1.0 - p) ** 2
        return sum_to_rank(parents, modules, generator, (w, w), drop_p=p)
    ref = parents[0]
    device = ref[modules[0].a_key].device

    def work(chunk, gens):
        out = {}
        for m, g in zip(chunk, gens, strict=True):
            cdt = compute_dtype(ref[m.a_key].dtype)
            for key in (m.b_key, m.a_key):  # same draws as the delta space: B's uniform, then A's
                u = torch.empty(ref[key].shape, dtype=torch.float32, device=device).uniform_(generator=g)
                m1, m2 = dare_mask_pair(u, p)
                x1, x2 = parents[0][key].to(cdt), parents[1][key].to(cdt)
                acc = (x1 * m1).add_(x2 * m2).div_(2.0 * (1.0 - p))
                out[key] = acc.to(ref[key].dtype)
        return out

    return ordered(map_modules(modules, generator, device, work), ref)


@register_operator("layer_crossover", family="crossover", arity=2, defaults={}, default_pool=True)
def layer_crossover(parents, modules, generator):
    """X2 module-wise crossover: ``(A_m, B_m) ← parent π_m``'s raw factors, ``π_m ~ U{1, 2}`` per module.

    Exact: each child module's ΔW equals one parent's, bitwise. One draw of ``L`` bits (``randint``).
    """
    pick = torch.randint(0, 2, (len(modules),), generator=generator, device=generator.device).tolist()
    child: dict[str, Tensor] = {}
    for m, i in zip(modules, pick, strict=True):
        copy_module(child, parents[i], m)
    return ordered(child, parents[0])


@register_operator(
    "svd_crossover", family="crossover", arity=2, defaults={"mode": "index"}, default_pool=True
)
def svd_crossover(parents, modules, generator, *, mode: str):
    """X3 SVD-subspace crossover: leading singular triplets from parent 1, the rest from parent 2.

    Per module, with ``B_p A_p = U_p diag(S_p) V_pᵀ`` (exact) and a split ``k ~ U{1, …, r−1}`` (``U{0, 1}`` when
    ``r = 1``: the child takes one parent's only component; drawn from the module's generator)::

        ΔW_c = Σ_{i≤k} S₁ᵢ u₁ᵢ v₁ᵢᵀ + Σ_{i>k} S₂ⱼ₍ᵢ₎ u₂ⱼ₍ᵢ₎ v₂ⱼ₍ᵢ₎ᵀ,
        j(i) = i ("index", default: parent 2's triplets k+1..r)  or  i − k ("top": parent 2's top r − k)

    refactored component-wise with √S (``B_c[:, i] = √S u``, ``A_c[i] = √S vᵀ``). Components with ``S = 0`` regrow.
    """
    if mode not in ("index", "top"):
        raise ValueError(f"svd_crossover: mode must be 'index' or 'top', got {mode!r}")
    ref = parents[0]
    dtype = ref[modules[0].a_key].dtype
    device = ref[modules[0].a_key].device
    cdt = compute_dtype(dtype)

    def work(chunk, gens):
        facs = [[module_factors(p, m, cdt) for p in parents] for m in chunk]
        # [2m, r, r], order (module, parent)
        XB, S, XA, GB, GA = svd_maps([B for f in facs for _, B in f], [A for f in facs for A, _ in f])
        nm, r = len(chunk), S.shape[-1]
        XB, XA, S = XB.view(nm, 2, r, r), XA.view(nm, 2, r, r), S.view(nm, 2, r)
        zero = (is_zero_gram(GB) | is_zero_gram(GA)).view(nm, 2).all(-1)
        lo, hi = (1, r) if r > 1 else (0, 2)
        k = torch.tensor(
            [int(torch.randint(lo, hi, (), generator=g, device=g.device)) for g in gens], device=S.device
        )
        idx = torch.arange(r, device=S.device).expand(nm, r)
        from1 = idx < k.unsqueeze(-1)
        src2 = idx if mode == "index" else (idx - k.unsqueeze(-1)).clamp(min=0)
        Sc = torch.where(from1, S[:, 0], S[:, 1].gather(-1, src2))
        dead = dead_components(Sc, width=r) | (Sc <= 0)
        root = torch.where(dead, torch.zeros_like(Sc), Sc.clamp(min=0).sqrt())
        g2 = src2.unsqueeze(-2).expand(nm, r, r)
        cols1 = (from1 & ~dead).to(torch.float64) * root
        cols2 = (~from1 & ~dead).to(torch.float64) * root
        YB = torch.cat(
            [XB[:, 0] * cols1.unsqueeze(-2), XB[:, 1].gather(-1, g2) * cols2.unsqueeze(-2)], dim=-2
        )
        YA = torch.cat(
            [XA[:, 0] * cols1.unsqueeze(-2), XA[:, 1].gather(-1, g2) * cols2.unsqueeze(-2)], dim=-2
        )
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                copy_module(child, ref, m)
                continue
            (A1, B1), (A2, B2) = facs[j]
            child[m.a_key], child[m.b_key] = emit([B1, B2], [A1, A2], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return ordered(map_modules(modules, generator, device, work, lambda m: ref[m.a_key].shape[0]), ref)


@register_operator(
    "extrapolate",
    family="crossover",
    arity=2,
    defaults={"eta_min": 1.0, "eta_max": 1.5, "eta": None, "space": "delta"},
    default_pool=True,
)
def extrapolate(
    parents, modules, generator, *, eta_min: float, eta_max: float, eta: float | None, space: str
):
    """X4 extrapolative combination: a step from parent 1 through the fitter parent 2 and beyond.

    ``η ~ U[η_min, η_max]`` once per child (the operator's first draw), or the fixed ``eta``;

    * ``space="delta"`` (default): ``ΔW_c = (1 − η)ΔW₁ + ηΔW₂`` exactly, truncated to rank r (stacked factors);
    * ``space="factor"``: ``A_c = A₁ + η(A₂ − A₁)``, ``B_c = B₁ + η(B₂ − B₁)`` (lucidrains' X4, with cross terms).
    """
    space = check_space(space)
    if eta is None:
        if eta_max < eta_min:
            raise ValueError(f"extrapolate: eta_max ({eta_max}) < eta_min ({eta_min})")
        u = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)
        eta = float(eta_min + (eta_max - eta_min) * u)
    eta = float(eta)
    if space == "delta":
        return sum_to_rank(parents, modules, generator, (1.0 - eta, eta))
    return factor_linear(parents, modules, (1.0 - eta, eta))



@register_operator(
    "task_arithmetic", family="crossover", arity=2, defaults={"weights": (1.0, 1.0), "space": "delta"}
)
def task_arithmetic(parents, modules, generator, *, weights: tuple[float, ...], space: str):
    """Task arithmetic (Ilharco et al. 2023): ``ΔW_c = Σ_i w_i ΔW_i``, truncated to rank r.

    Default weights ``(1, 1)`` [D] (PEFT's ``task_arithmetic``, λ folded into the weights).

    * ``space="delta"`` (default): exact sum via the stacked factors, best rank-r approximation.
    * ``space="factor"``: PEFT ``add_weighted_adapter(combination_type="task_arithmetic")`` semantics:
      ``A_c = Σ sign(w_i)√|w_i| A_i``, ``B_c = Σ √|w_i| B_i`` (with cross terms ``√|w_i w_j| B_i A_j``).
    """
    space = check_space(space)
    weights = check_weights(weights, len(parents), "task_arithmetic")
    if space == "delta":
        return sum_to_rank(parents, modules, generator, weights)
    return factor_signed_sqrt(parents, modules, weights, lambda stack, w: (stack * w).sum(0))
