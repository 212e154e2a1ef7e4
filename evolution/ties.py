"""TIES-merging (Yadav et al. 2023): exact k-th largest, magnitude trim, sign election, the ``ties`` operator."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from evolution.factor_space import check_space, check_weights, factor_signed_sqrt
from evolution.gram import regrow
from evolution.keys import copy_module, module_factors, ordered
from evolution.lowrank import compute_dtype, dead_components
from evolution.parallel import module_seeds
from evolution.registry import register_operator

__all__ = ["TIES_TIMINGS", "kth_largest", "magnitude_trim", "ties", "ties_merge", "topr_dense"]


def kth_largest(x: Tensor, k: int) -> Tensor:
    """Exact ``k``-th largest value of ``x`` (flattened), ``1 ≤ k ≤ x.numel()``.

    Same value as ``torch.kthvalue(x, n − k + 1)`` but several times faster on large tensors: a deterministic
    strided sample brackets the answer, one counting pass confirms the bracket, and ``kthvalue`` runs on the few
    candidates inside it (falls back to the full ``kthvalue`` if the bracket misses).
    """
    flat = x.reshape(-1)
    n = flat.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if n <= 1 << 20:
        return torch.kthvalue(flat, n - k + 1).values
    step = max(1, n // (1 << 18))
    sample = flat[::step].clone()
    ns = sample.numel()
    q = 1.0 - k / n  # the answer sits at this quantile
    margin = 8.0 / math.sqrt(ns) + 2.0 / ns
    lo_rank = max(1, min(ns, math.floor((q - margin) * ns)))
    hi_rank = max(1, min(ns, math.ceil((q + margin) * ns)))
    lo = torch.kthvalue(sample, lo_rank).values if q - margin > 0 else None
    hi = torch.kthvalue(sample, hi_rank).values if q + margin < 1 else None
    above_hi = int(torch.count_nonzero(flat > hi)) if hi is not None else 0
    # ns >= 2**18 makes margin < 0.016, so at least one of lo / hi exists. Whatever the bracket, the result is
    # exact: the answer is inside it iff 1 <= need <= #candidates, else the full kthvalue runs.
    if lo is None:
        sel = flat <= hi
    else:
        sel = flat >= lo
        if hi is not None:
            sel.logical_and_(flat <= hi)
    cand = flat[sel]
    need = k - above_hi  # rank of the answer among the candidates, counted from the top
    if not 1 <= need <= cand.numel():
        return torch.kthvalue(flat, n - k + 1).values
    return torch.kthvalue(cand, cand.numel() - need + 1).values


def magnitude_trim(t: Tensor, density: float, *, inplace: bool = False) -> Tensor:
    """TIES step 1: keep the ``k = ⌊density·numel⌋`` largest-magnitude entries of ``t``, zero the rest.

    Exactly ``k`` entries survive, as in PEFT ``merge_utils.magnitude_based_pruning``; among entries whose
    magnitude equals the threshold, the first ones in memory order are kept (``torch.topk``, which PEFT uses,
    leaves that choice unspecified, so the two may differ on such ties only). ``density ≥ 1`` keeps everything,
    a ``k`` of 0 zeroes everything. ``inplace`` overwrites ``t``.
    """
    if not density >= 0.0:  # NaN too
        raise ValueError(f"density must be >= 0, got {density}")
    out = t if inplace else t.clone()
    if density >= 1.0:
        return out
    k = int(density * t.numel())
    if k == 0:
        return out.zero_()
    mag = t.abs()
    thr = kth_largest(mag, k)
    keep = mag > thr
    n_more = k - int(torch.count_nonzero(keep))
    if n_more > 0:  # entries equal to the threshold: the first n_more of them
        ties = (mag == thr).view(-1).nonzero().view(-1)[:n_more]
        keep.view(-1)[ties] = True
    return out.mul_(keep)


def ties_merge(
    taus: Sequence[Tensor],
    weights: Sequence[float],
    density: float,
    majority: str = "total",
    *,
    inplace: bool = False,
) -> Tensor:
    """TIES-merging of dense task tensors (Yadav et al. 2023), PEFT ``merge_utils.ties`` semantics.

    ``τ̂_i = trim(τ_i, density)``; elected sign ``γ = sign(Σ_i τ̂_i)`` (``"total"``) or ``sign(Σ_i sign τ̂_i)``
    (``"frequency"``), ``+`` on ties; ``mask_i = [sign(τ̂_i) = γ]``; result
    ``Σ_i w_i τ̂_i mask_i / max(1, Σ_i mask_i)`` (disjoint mean; weights applied after the election, as PEFT).
    ``inplace`` lets it overwrite the ``taus`` (saves memory on big modules).
    """
    if majority not in ("total", "frequency"):
        raise ValueError(f"majority must be 'total' or 'frequency', got {majority!r}")
    trimmed = [magnitude_trim(t, density, inplace=inplace) for t in taus]
    # Large modules: every fresh tensor of a module's full size costs its page faults (docs/results.md), so the
    # result is built in the storage of the (owned) trimmed tensors and the elected-sign tensor, with one extra
    # float buffer.
    if majority == "total":
        gamma = trimmed[0].clone()
        for t in trimmed[1:]:
            gamma.add_(t)
    else:
        gamma = trimmed[0].sign()
        for t in trimmed[1:]:
            gamma.add_(t.sign())
    gamma = gamma.ge_(0).mul_(2).sub_(1)  # elected sign γ = ±1
    for t in trimmed:
        t.mul_(gamma).clamp_(min=0)  # |τ̂| where sign(τ̂) = γ, else 0
    count = trimmed[0].sign()  # 1 where it agrees (values are >= 0 now), else 0
    for t in trimmed[1:]:
        count.add_(t.sign())
    num = trimmed[0].mul_(float(weights[0]))
    for t, w in zip(trimmed[1:], weights[1:], strict=True):
        num.add_(t, alpha=float(w))
    return num.div_(gamma.mul_(count.clamp_(min=1.0)))  # γ = ±1: dividing by γ·n is multiplying by γ/n


def topr_dense(
    M: Tensor,
    r: int,
    *,
    method: str,
    init: Tensor | None,
    niter: int,
    oversample: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``r`` SVD triplets of a dense ``M``: ``"dense"`` = full ``torch.linalg.svd``; ``"randomized"`` = block
    subspace iteration started from ``init`` (the parents' row spaces) plus ``oversample`` Gaussian columns,
    ``niter`` power iterations, then an exact SVD of the projected ``c×d_in`` matrix."""
    if method == "dense":
        U, S, Vh = torch.linalg.svd(M, full_matrices=False)
        return U[:, :r], S[:r], Vh[:r].mT
    if method != "randomized":
        raise ValueError(f"ties: svd must be 'dense' or 'randomized', got {method!r}")
    d_in = M.shape[1]
    cols = [] if init is None else [init]
    if oversample > 0 or init is None:
        cols.append(
            torch.randn((d_in, max(oversample, r)), generator=generator, dtype=M.dtype, device=M.device)
        )
    omega = torch.cat(cols, dim=1)
    Q = torch.linalg.qr(M @ omega).Q
    for _ in range(niter):
        Q = torch.linalg.qr(M.mT @ Q).Q
        Q = torch.linalg.qr(M @ Q).Q
    Us, S, Vh = torch.linalg.svd(Q.mT @ M, full_matrices=False)
    return Q @ Us[:, :r], S[:r], Vh[:r].mT


TIES_TIMINGS: dict[str, float] = {}
"""Seconds of the last ``ties`` call: ``dense`` (ΔW products), ``merge`` (trim/elect/merge), ``svd`` (truncation)."""


@register_operator(
    "ties",
    family="crossover",
    arity=2,
    defaults={
        "density": 0.5,
        "weights": (1.0, 1.0),
        "majority": "total",
        "space": "delta",
        "svd": "randomized",
        "niter": 1,
        "oversample": 16,
    },
)
def ties(
    parents,
    modules,
    generator,
    *,
    density: float,
    weights: tuple[float, ...],
    majority: str,
    space: str,
    svd: str,
    niter: int,
    oversample: int,
):
    """TIES-merging (trim, elect sign, disjoint merge; Yadav et al. 2023) of the parents' ΔW, back to rank r.

    * ``space="delta"`` (default): per module, the dense ``τ_i = B_i A_i`` (one module at a time, never the whole
      adapter), ``M = ties_merge(τ, weights, density)`` (PEFT ``merge_utils.ties`` semantics; defaults density 0.5
      [D], weights (1, 1) = disjoint mean), then the top-``r`` SVD of ``M`` refactored with √S. TIES is defined
      entrywise on ΔW, so the dense matrix is unavoidable; the truncation is either ``svd="dense"`` (exact full
      SVD, the slow one at 7B module sizes) or ``svd="randomized"`` (default: subspace iteration started from the
      parents' row spaces ``[A₁ᵀ|A₂ᵀ]`` + ``oversample`` Gaussian columns, ``niter`` = 1 power iteration, then an
      exact SVD of the ``c×d_in`` projection; docs/results.md has both times). Measured on such a
      module, the randomized residual ``‖M − M_r‖`` equals the optimal (dense) one to 1e-7 relative and ``M_r``
      is within 3e-5 of the dense truncation (niter 0: 7e-6 / 4e-3); the tests and the benchmark check it.
      Either way this is the slow operator (minutes per 7B child): exempt from the speed target.
    * ``space="factor"``: PEFT ``add_weighted_adapter(combination_type="ties")`` semantics on the factors:
      ``ties_merge`` of the A's (weighted ``sign(w)√|w|``) and of the B's (weighted ``√|w|``) separately, with
      cross terms in the product; no SVD.
    """
    space = check_space(space)
    weights = check_weights(weights, len(parents), "ties")
    ref = parents[0]
    if space == "factor":
        return factor_signed_sqrt(
            parents,
            modules,
            weights,
            lambda stack, w: ties_merge(list(stack), w.reshape(-1).tolist(), density, majority),
        )
    # big dense modules: one at a time with torch's intra-op threads (these GEMMs and elementwise passes do
    # parallelise), each module with its own generator as in ``map_modules``
    seeds = module_seeds(generator, len(modules))
    t_dense = t_merge = t_svd = 0.0
    child: dict[str, Tensor] = {}
    for m, seed in zip(modules, seeds, strict=True):
        gen = torch.Generator(device=generator.device).manual_seed(seed)
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        facs = [module_factors(p, m, cdt) for p in parents]
        r = facs[0][0].shape[0]
        if all(bool((A == 0).all()) or bool((B == 0).all()) for A, B in facs):
            copy_module(child, ref, m)
            continue
        t0 = time.perf_counter()
        taus = [B @ A for A, B in facs]
        t1 = time.perf_counter()
        M = ties_merge(taus, weights, density, majority, inplace=True)
        del taus
        t2 = time.perf_counter()
        init = torch.cat([A.mT for A, _ in facs], dim=1)
        U, S, V = topr_dense(M, r, method=svd, init=init, niter=niter, oversample=oversample, generator=gen)
        del M
        t3 = time.perf_counter()
        t_dense, t_merge, t_svd = t_dense + t1 - t0, t_merge + t2 - t1, t_svd + t3 - t2
        dead = dead_components(S, width=r) | (S <= 0)
        root = torch.where(dead, torch.zeros_like(S), S.clamp(min=0).sqrt())
        B = U * root
        A = (V * root).mT.contiguous()
        if bool(dead.any()):
            regrow(A, dead, gen)
        child[m.a_key], child[m.b_key] = A.to(dtype), B.to(dtype)
    TIES_TIMINGS.clear()
    TIES_TIMINGS.update(dense=t_dense, merge=t_merge, svd=t_svd)
    return ordered(child, ref)
