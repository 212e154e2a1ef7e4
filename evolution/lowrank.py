"""Exact SVD of low-rank products ΔW = B·A from the factors, without forming ΔW.

Notation (PEFT): ``A = lora_A.weight`` has shape ``[r, d_in]``, ``B = lora_B.weight`` has shape ``[d_out, r]``
and the module's update is ``ΔW = s·B·A`` with ``s = alpha/r``. Everything here acts on ``B·A`` (``s`` is a
constant the operators never change). Leading batch dimensions are allowed everywhere.

**The factorisation** (docs/method.md §8.1). With thin factorisations ``B = Q_B R_B`` and
``Aᵀ = Q_A R_A`` (``Q`` with orthonormal columns, ``R`` square ``r×r``)::

    B·A = Q_B (R_B R_Aᵀ) Q_Aᵀ,   K = R_B R_Aᵀ = U_K diag(S) V_Kᵀ   (SVD of an r×r matrix)
    ⇒  B·A = U diag(S) Vᵀ   with   U = Q_B U_K,  V = Q_A V_K,

an exact reduced SVD of the rank-≤r product in ``O((d_in + d_out) r² + r³)``; the dense SVD of ΔW costs
``O(d_out d_in min(d_out, d_in))``.

**How Q and R are computed.** The thin QR is taken through the Gram matrix, column-equilibrated:
``BᵀB = D W Λ Wᵀ D`` with ``D = diag(‖b_i‖)`` (eigendecomposition of an ``r×r`` matrix), ``R_B = Λ^{1/2} Wᵀ D``,
``Q_B = B D⁻¹ W Λ^{-1/2}`` — an orthogonal-times-square factorisation, the Gram ("Cholesky-QR") route with an
eigendecomposition instead of a Cholesky factor, so that rank-deficient factors (zero columns, untrained
``B = 0``, two identical parents) need no special case: equilibrated eigen-directions with ``λ ≤ λ_max·1e-12``
are treated as exactly zero. Equilibration makes the result insensitive to columns of very different norms
(harmless for the product). The Gram matrices here are accumulated in float64 from the data, so ``S`` is
accurate to ~1e-10 relative even for factors with condition number 1e5 (Householder QR in float32: ~1e-6), and
``U = B·(D⁻¹ W Λ^{-1/2} U_K)`` is one GEMM of the data with an ``r×r`` matrix. Cost per factor: one ``d×r``
Gram and one ``d×r×r`` GEMM — less work than Householder QR (``geqrf`` + ``orgqr`` + GEMM), and ``Q`` is never
formed. The operators (:mod:`evolution.gram`) first try a float32 Gram and keep it only when the
equilibrated conditioning ``λ_min/λ_max ≥ 0.01`` guarantees Householder-level accuracy (orthogonality error
~1e-6 at ``d = 18944``), else recompute it in float64. A Householder route is kept (``method="householder"``)
as an independent reference for the tests.

**Sums** (the "stacked" generalisation): ``Σ_i w_i B_i A_i = [B_1|…|B_k]·diag(w_1 1_r, …, w_k 1_r)·[A_1;…;A_k]``,
a product with ``c = k·r`` inner columns; the same steps with ``K = R_B Ω R_Aᵀ`` give its exact SVD, and keeping
the top ``r`` triplets gives the best rank-``r`` approximation (Eckart–Young) in ``O((d_in + d_out) c²)``.

**Refactoring** to same-rank LoRA factors uses ``√S`` on both sides: ``B ← U diag(√S)``, ``A ← diag(√S) Vᵀ``.
Dead components (``S_i ≤ S_max·c·eps``, e.g. masked or beyond the product's rank) would get a zero column in B
*and* a zero row in A, and since ``∂L/∂A = s Bᵀ G`` and ``∂L/∂B = s G Aᵀ`` they could never regrow; their B
column is set to 0 and their A row re-initialised with PEFT's default LoRA-A init (kaiming-uniform with
``a=√5``, i.e. ``U(−1/√d_in, 1/√d_in)``) drawn from the caller's generator — LoRA's trainable ``B=0, A random``
state (docs/method.md §8.4.2). ΔW is unchanged by this (the B column is zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "EIG_RTOL",
    "compute_dtype",
    "dead_components",
    "gram_core",
    "lora_a_init",
    "lowrank_svd",
    "lowrank_svd_sum",
    "refactor",
    "truncate",
]

EIG_RTOL = 1e-12
"""Eigenvalues of a float64 Gram matrix below ``EIG_RTOL·λ_max`` are treated as 0 (σ below 1e-6·σ_max)."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the operators compute in: float64 stays float64, everything else (fp32, bf16, fp16) is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dead_components(S: Tensor, width: int | None = None) -> Tensor:
    """Boolean mask of *dead* singular components: ``S_i ≤ S_max · width · eps(dtype)`` (all, if ``S_max = 0``).

    ``width`` is the number of inner columns the SVD was computed from (``r``, or ``k·r`` for a sum); it defaults
    to ``S.shape[-1]``. This is numpy's ``matrix_rank`` tolerance with the small dimension: a component below it
    is numerical noise of the factorisation, not signal.
    """
    width = S.shape[-1] if width is None else width
    tol = S.amax(dim=-1, keepdim=True) * (width * torch.finfo(S.dtype).eps)
    return S <= tol


def lora_a_init(
    shape: Sequence[int],
    *,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """PEFT's default ``lora_A`` init for a ``[..., rows, d_in]`` block: ``kaiming_uniform_(a=√5)``.

    For a weight of shape ``[out, in]`` this is ``U(−b, b)`` with ``b = gain·√(3/fan_in)``,
    ``gain = √(2/(1+a²)) = √(1/3)``, ``fan_in = d_in``, i.e. ``b = 1/√d_in``. Drawn from ``generator`` only.
    """
    d_in = shape[-1]
    bound = 1.0 / math.sqrt(d_in)
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    return out.uniform_(-bound, bound, generator=generator)


# ----------------------------------------------------------------------------------------------- core


def _gram64(X: Tensor, *, rows: bool) -> Tensor:
    """Float64 Gram matrix of ``X``: ``X Xᵀ`` over the last dim if ``rows`` else ``Xᵀ X`` over the second last."""
    X64 = X.to(torch.float64)
    return X64 @ X64.mT if rows else X64.mT @ X64


def _equilibrated_eigh(G: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``G = D W Λ Wᵀ D`` with ``D = diag(√G_ii)`` (columns scaled to unit norm; zero columns get ``D⁻¹ = 0``).

    Returns ``(root, inv, W, d, dinv, ratio)``: ``root = Λ^{1/2}`` and ``inv = Λ^{-1/2}`` (both 0 where
    ``λ ≤ EIG_RTOL·λ_max``), ``W``, ``d = diag(D)``, ``dinv = D⁻¹`` and ``ratio`` = smallest non-zero-column eigenvalue / largest
    (the equilibrated conditioning, ``1/κ²``). Column scaling makes the thresholds and the conditioning test
    insensitive to factors whose columns differ in scale (harmless for the product), and rounding errors of a
    Gram matrix are relative to the columns' own norms, so this is the condition number that matters.
    """
    diag = torch.diagonal(G, dim1=-2, dim2=-1).clamp(min=0)
    nz = diag > 0
    d = diag.sqrt()
    dinv = torch.where(nz, 1.0 / torch.where(nz, d, torch.ones_like(d)), torch.zeros_like(d))
    Gt = dinv.unsqueeze(-1) * G * dinv.unsqueeze(-2)
    lam, W = torch.linalg.eigh(Gt)  # ascending
    keep = (lam > lam.amax(dim=-1, keepdim=True).clamp(min=0) * EIG_RTOL) & (lam > 0)
    root = torch.where(keep, lam.clamp(min=0).sqrt(), torch.zeros_like(lam))
    inv = torch.where(keep, 1.0 / torch.where(keep, root, torch.ones_like(root)), torch.zeros_like(lam))
    n_zero = (~nz).sum(-1, keepdim=True)
    smallest = lam.gather(-1, n_zero.clamp(max=lam.shape[-1] - 1)).squeeze(-1)
    ratio = torch.where(
        n_zero.squeeze(-1) < lam.shape[-1],
        smallest / lam[..., -1].clamp(min=1e-300),
        torch.ones_like(smallest),
    )
    return root, inv, W, d, dinv, ratio


def gram_core(
    GB: Tensor, GA: Tensor, weights: Tensor | None = None, *, return_ratio: bool = False
) -> tuple[Tensor, ...]:
    """SVD of ``P = B Ω A`` from the Gram matrices ``GB = BᵀB`` and ``GA = A Aᵀ`` (``[..., c, c]``, float64).

    Returns ``(XB, S, XA)`` (float64) such that ``U = B @ XB`` and ``V = Aᵀ @ XA`` are the left/right singular
    vectors of ``P = B·diag(weights)·A`` and ``S`` its singular values (descending). With the column-equilibrated
    eigendecomposition ``GB = D_B W_B Λ_B W_Bᵀ D_B``, the thin factorisation is ``B = Q_B R_B``,
    ``R_B = Λ_B^{1/2} W_Bᵀ D_B``, ``Q_B = B D_B⁻¹ W_B Λ_B^{-1/2}`` (likewise for A), and
    ``K = R_B Ω R_Aᵀ = U_K diag(S) V_Kᵀ``, ``XB = D_B⁻¹ W_B Λ_B^{-1/2} U_K``, ``XA = D_A⁻¹ W_A Λ_A^{-1/2} V_K``
    (pseudo-inverses: equilibrated eigenvalues below :data:`EIG_RTOL`·λ_max count as 0). ``weights``
    (``[..., c]``) defaults to ones. Batched over leading dims. With ``return_ratio`` also returns the
    equilibrated ``λ_min/λ_max`` of each side (``1/κ²``), used to decide whether a float32 Gram was accurate.
    """
    rb, ib, WB, db, dbinv, ratio_b = _equilibrated_eigh(GB)
    ra, ia, WA, da, dainv, ratio_a = _equilibrated_eigh(GA)
    RB = (rb.unsqueeze(-1) * WB.mT) * db.unsqueeze(-2)  # R_B = Λ_B^{1/2} W_Bᵀ D_B
    RAt = da.unsqueeze(-1) * (WA * ra.unsqueeze(-2))  # R_Aᵀ = D_A W_A Λ_A^{1/2}
    if weights is not None:
        RAt = weights.to(RAt.dtype).unsqueeze(-1) * RAt
    K = RB @ RAt
    UK, S, VKh = torch.linalg.svd(K)
    XB = dbinv.unsqueeze(-1) * (WB @ (ib.unsqueeze(-1) * UK))
    XA = dainv.unsqueeze(-1) * (WA @ (ia.unsqueeze(-1) * VKh.mT))
    if return_ratio:
        return XB, S, XA, ratio_b, ratio_a
    return XB, S, XA


def _householder_svd(A: Tensor, B: Tensor, weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    cdt = compute_dtype(A.dtype)
    QB, RB = torch.linalg.qr(B.to(cdt))
    QA, RA = torch.linalg.qr(A.to(cdt).mT)
    RAt = RA.mT
    if weights is not None:
        RAt = weights.to(cdt).unsqueeze(-1) * RAt
    UK, S, VKh = torch.linalg.svd(RB @ RAt)
    return QB @ UK, S, QA @ VKh.mT


def _check_factors(A: Tensor, B: Tensor) -> None:
    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(f"factors must be at least 2-D, got A {tuple(A.shape)} and B {tuple(B.shape)}")
    if A.shape[-2] != B.shape[-1]:
        raise ValueError(
            f"rank mismatch: A (lora_A, [r, d_in]) has {A.shape[-2]} rows but B (lora_B, [d_out, r]) has "
            f"{B.shape[-1]} columns"
        )


def lowrank_svd(
    A: Tensor, B: Tensor, *, method: Literal["gram", "householder"] = "gram"
) -> tuple[Tensor, Tensor, Tensor]:
    """Exact reduced SVD of ``B·A`` from the factors: ``B·A = U·diag(S)·Vᵀ``, ΔW never formed.

    Args:
        A: ``lora_A`` ``[..., r, d_in]``.
        B: ``lora_B`` ``[..., d_out, r]``.
        method: ``"gram"`` (default; float64 Gram + eigendecomposition as the thin QR, see the module docstring)
            or ``"householder"`` (``torch.linalg.qr`` of ``B`` and ``Aᵀ``; a reference).

    Returns:
        ``U [..., d_out, r]``, ``S [..., r]`` (descending, ≥ 0), ``V [..., d_in, r]`` in :func:`compute_dtype`.
        Columns of ``U``/``V`` belonging to zero singular values are unspecified (zero or an orthonormal
        completion); they carry no weight in ``U diag(S) Vᵀ``.
    """
    _check_factors(A, B)
    cdt = compute_dtype(A.dtype)
    if method == "householder":
        return _householder_svd(A, B, None)
    if method != "gram":
        raise ValueError(f"unknown method {method!r}; expected 'gram' or 'householder'")
    XB, S, XA = gram_core(_gram64(B, rows=False), _gram64(A, rows=True))
    return B.to(cdt) @ XB.to(cdt), S.to(cdt), A.to(cdt).mT @ XA.to(cdt)


def lowrank_svd_sum(
    As: Sequence[Tensor],
    Bs: Sequence[Tensor],
    weights: Sequence[float] | None = None,
    *,
    method: Literal["gram", "householder"] = "gram",
) -> tuple[Tensor, Tensor, Tensor]:
    """Exact SVD of ``Σ_i w_i B_i A_i`` with ``k·r`` components, via the stacked factors.

    ``Σ_i w_i B_i A_i = [B_1|…|B_k] · diag(w_1 1_r, …, w_k 1_r) · [A_1; …; A_k]``; the weights go into the small
    core matrix (``K = R_B Ω R_Aᵀ``), so negative weights are fine. :func:`truncate` to ``r`` afterwards gives the
    best rank-``r`` approximation (Eckart–Young). Ranks may differ between terms. Returns ``(U, S, V)`` with
    ``Σ r_i`` columns, descending ``S``.
    """
    if len(As) != len(Bs) or not As:
        raise ValueError(f"need the same non-zero number of A and B factors, got {len(As)} and {len(Bs)}")
    for A, B in zip(As, Bs, strict=True):
        _check_factors(A, B)
    weights = [1.0] * len(As) if weights is None else list(weights)
    if len(weights) != len(As):
        raise ValueError(f"{len(weights)} weights for {len(As)} terms")
    cdt = compute_dtype(As[0].dtype)
    Bcat = torch.cat([B.to(cdt) for B in Bs], dim=-1)
    Acat = torch.cat([A.to(cdt) for A in As], dim=-2)
    omega = torch.cat(
        [
            torch.full((A.shape[-2],), float(w), dtype=torch.float64, device=A.device)
            for A, w in zip(As, weights, strict=True)
        ]
    )
    if method == "householder":
        return _householder_svd(Acat, Bcat, omega)
    if method != "gram":
        raise ValueError(f"unknown method {method!r}; expected 'gram' or 'householder'")
    XB, S, XA = gram_core(_gram64(Bcat, rows=False), _gram64(Acat, rows=True), omega)
    return Bcat @ XB.to(cdt), S.to(cdt), Acat.mT @ XA.to(cdt)


def truncate(U: Tensor, S: Tensor, V: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
    """Keep the top-``rank`` triplets (``S`` must be descending, as returned here). Pads with zero components
    when fewer than ``rank`` exist, so the result always has exactly ``rank`` columns."""
    have = S.shape[-1]
    if rank <= have:
        return U[..., :rank], S[..., :rank], V[..., :rank]
    pad = rank - have
    return (
        torch.nn.functional.pad(U, (0, pad)),
        torch.nn.functional.pad(S, (0, pad)),
        torch.nn.functional.pad(V, (0, pad)),
    )


def refactor(
    U: Tensor,
    S: Tensor,
    V: Tensor,
    rank: int | None = None,
    *,
    generator: torch.Generator | None = None,
    width: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Same-rank LoRA factors from an SVD: ``B = U diag(√S)``, ``A = diag(√S) Vᵀ`` (top ``rank`` triplets).

    Dead components (:func:`dead_components` with ``width``, default the number of given triplets) get a zero
    B column and, when ``generator`` is given, a fresh A row from :func:`lora_a_init` (PEFT's default A init) so
    they can regrow under training; without a generator their A row is left at zero. ``B·A`` equals the
    rank-``rank`` truncation of ``U diag(S) Vᵀ`` either way.

    Returns:
        ``(A [..., rank, d_in], B [..., d_out, rank])`` in the dtype of ``U``.
    """
    width = S.shape[-1] if width is None else width
    rank = S.shape[-1] if rank is None else rank
    dead = dead_components(S, width)
    U, S, V = truncate(U, S, V, rank)
    if rank <= dead.shape[-1]:
        dead = dead[..., :rank]
    else:
        dead = torch.nn.functional.pad(dead, (0, rank - dead.shape[-1]), value=True)
    root = torch.where(dead, torch.zeros_like(S), S.clamp(min=0).sqrt())
    B = U * root.unsqueeze(-2)
    A = (V * root.unsqueeze(-2)).mT.contiguous()
    if generator is not None and bool(dead.any()):
        fresh = lora_a_init(A.shape, generator=generator, dtype=A.dtype, device=A.device)
        A = torch.where(dead.unsqueeze(-1), fresh, A)
    return A, B
