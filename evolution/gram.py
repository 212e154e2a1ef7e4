"""Gram machinery of the SVD-based operators: precision, stacked factors, exact SVD maps, refactoring.

Every SVD-based operator computes, per module, the exact SVD of a low-rank product from the Gram matrices of its
factors (:func:`evolution.lowrank.gram_core`): for ``P = Σ_i w_i B_i A_i`` the factors are stacked,
``[B₁|…|B_k]`` (``d_out × k·r``) and ``[A₁;…;A_k]`` (``k·r × d_in``), one Gram GEMM per side gives ``GB``/``GA``,
and ``gram_core`` returns ``r×r``-sized maps ``XB, XA`` with ``U = [B₁|…|B_k]·XB``, ``V = [A₁;…;A_k]ᵀ·XA``.
The child is then refactored with ``√S`` on both sides, ``B' = U diag(√S)``, ``A' = diag(√S) Vᵀ``, which is
one output GEMM per side (:func:`emit`). Components that end up dead (zero singular value) get a zero B column
and a fresh PEFT-init A row so they can regrow under training (see :mod:`evolution.lowrank`).

**Gram precision.** ``"auto"`` (default): the Gram matrices are formed in float32 and a module is recomputed
in float64 when its equilibrated conditioning ``λ_min/λ_max`` is below :data:`FP32_GRAM_MIN_RATIO` (always
float64 for float64 parents); ``"float64"``: always float64 (~2.5× the Gram cost). Choose it for a block of
code with ``with gram_precision("float64"): ...`` (a ``contextvars`` setting: it holds in this thread/task and
in the worker threads the operators start, and never leaks to other threads), or pass ``precision=`` to
:func:`svd_maps`. :data:`GRAM_STATS` counts the Grams of the last operator call in each precision.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from evolution.keys import AdapterState, LoraModule, copy_module, module_factors, ordered
from evolution.lowrank import compute_dtype, dead_components, gram_core, lora_a_init
from evolution.parallel import map_modules, workspace

__all__ = [
    "FP32_GRAM_MIN_RATIO",
    "GRAM_PRECISIONS",
    "GRAM_STATS",
    "canonical_signs",
    "gram_matrix",
    "current_gram_precision",
    "emit",
    "gram_precision",
    "is_zero_gram",
    "regrow",
    "reset_gram_stats",
    "single_svd",
    "sum_to_rank",
    "svd_maps",
]

GRAM_PRECISIONS = ("auto", "float64")
_PRECISION: contextvars.ContextVar[str] = contextvars.ContextVar("gram_precision", default="auto")

FP32_GRAM_MIN_RATIO = 1e-2
"""Accept a float32 Gram when the equilibrated ``λ_min/λ_max ≥`` this (κ ≤ 10): measured orthogonality error of
the resulting basis ≤ 1.4e-6 for ``d = 18944`` (Householder QR in float32: ~1e-6)."""
GRAM_STATS = {"float32": 0, "float64": 0}
"""Gram matrices (per module and side) computed in each precision since the last operator call started
(diagnostics for tests and the benchmark)."""
_STATS_LOCK = threading.Lock()


def _check_precision(precision: str) -> str:
    if precision not in GRAM_PRECISIONS:
        raise ValueError(f"gram precision must be one of {GRAM_PRECISIONS}, got {precision!r}")
    return precision


@contextlib.contextmanager
def gram_precision(precision: str) -> Iterator[None]:
    """Use Gram precision ``precision`` (``"auto"`` or ``"float64"``, see the module docstring) inside the block.

    Raises:
        ValueError: an unknown precision.
    """
    token = _PRECISION.set(_check_precision(precision))
    try:
        yield
    finally:
        _PRECISION.reset(token)


def current_gram_precision() -> str:
    """The Gram precision in effect here (``"auto"`` unless inside :func:`gram_precision`)."""
    return _PRECISION.get()


def reset_gram_stats() -> None:
    """Zero :data:`GRAM_STATS` (each operator call starts with this)."""
    with _STATS_LOCK:
        GRAM_STATS.update(float32=0, float64=0)


def gram_matrix(X: Tensor, *, rows: bool, precision: torch.dtype = torch.float64) -> Tensor:
    """Gram matrix of ``X`` formed in ``precision`` and returned as float64: ``X Xᵀ`` for an A (``rows=True``,
    ``[c, d]``), ``Xᵀ X`` for a B (``rows=False``, ``[d, c]``).

    A factor of another dtype is first copied (cast) into a reused per-thread workspace, then multiplied in one
    GEMM.
    """
    if X.dtype != precision:
        X = workspace(X.numel(), precision, X.device).view(X.shape).copy_(X)
    return (X @ X.mT if rows else X.mT @ X).to(torch.float64)


def svd_maps(
    Bs: Sequence[Tensor],
    As: Sequence[Tensor],
    weights: Tensor | None = None,
    *,
    precision: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Exact SVD maps of ``B·diag(w)·A`` for a batch of modules: ``(XB, S, XA, GB, GA)`` (see ``gram_core``).

    ``Bs[j]`` / ``As[j]`` are module ``j``'s (stacked) factors, ``[d_out, c]`` / ``[c, d_in]``, all with one ``c``:
    ``U = B·XB``, ``V = Aᵀ·XA``. ``precision`` (default: :func:`current_gram_precision`): with ``"auto"`` the Gram
    matrices are first formed in float32 and only the modules whose equilibrated conditioning fails the
    :data:`FP32_GRAM_MIN_RATIO` test are redone in float64; with ``"float64"`` (or float64 factors) all are
    float64.
    """
    precision = _check_precision(current_gram_precision() if precision is None else precision)
    try32 = precision == "auto" and Bs[0].dtype != torch.float64
    prec = torch.float32 if try32 else torch.float64
    GB = torch.stack([gram_matrix(B, rows=False, precision=prec) for B in Bs])
    GA = torch.stack([gram_matrix(A, rows=True, precision=prec) for A in As])
    XB, S, XA, ratio_b, ratio_a = gram_core(GB, GA, weights, return_ratio=True)
    n64 = 0 if try32 else len(Bs)
    if try32:
        bad = ((ratio_b < FP32_GRAM_MIN_RATIO) | (ratio_a < FP32_GRAM_MIN_RATIO)).nonzero().flatten().tolist()
        if bad:
            GB[bad] = torch.stack([gram_matrix(Bs[i], rows=False) for i in bad])
            GA[bad] = torch.stack([gram_matrix(As[i], rows=True) for i in bad])
            XB[bad], S[bad], XA[bad] = gram_core(GB[bad], GA[bad], weights)
            n64 = len(bad)
    with _STATS_LOCK:
        GRAM_STATS["float64"] += n64
        GRAM_STATS["float32"] += len(Bs) - n64
    return XB, S, XA, GB, GA


def is_zero_gram(G: Tensor) -> Tensor:
    """Whether a Gram matrix (``[..., c, c]``) comes from an all-zero factor (exact: sums of squares)."""
    return torch.diagonal(G, dim1=-2, dim2=-1).sum(-1) == 0


def canonical_signs(Bs: Sequence[Tensor], XB: Tensor) -> Tensor:
    """``±1`` per singular component that makes every left singular vector's entry sum non-negative.

    ``U = B·XB`` (``B`` ``[d_out, r]`` per module, ``XB`` ``[m, r, r]``); returns ``D = sign(1ᵀU)`` (``+1`` where
    the sum is 0), ``[m, r]`` float64, at the cost of a column sum of B. An SVD is unique only up to flipping
    ``(uᵢ, vᵢ) → (−uᵢ, −vᵢ)``; an operator whose child depends on the signs (a rotation ``U R``) uses
    ``U D, V D`` so that its result does not depend on the LAPACK build or device.
    """
    colsums = torch.stack([B.sum(0, dtype=torch.float64) for B in Bs]).to(XB.device)  # [m, r]
    s = (colsums.unsqueeze(-2) @ XB).squeeze(-2)
    return torch.where(s < 0, -torch.ones_like(s), torch.ones_like(s))


def regrow(A: Tensor, dead: Tensor, generator: torch.Generator) -> Tensor:
    """Fresh PEFT-init rows of ``A`` (``[r, d_in]``) where ``dead`` (``[r]``); B's columns are already 0.

    The rows are ``lora_a_init((n_dead, d_in))``, ``U(−1/√d_in, 1/√d_in)`` in A's dtype, drawn from ``generator``.
    """
    n_dead = int(dead.sum())
    if n_dead:
        A[dead] = lora_a_init((n_dead, A.shape[-1]), generator=generator, dtype=A.dtype, device=A.device)
    return A


def emit(
    Bs: Sequence[Tensor],
    As: Sequence[Tensor],
    YB: Tensor,
    YA: Tensor,
    dead: Tensor,
    generator: torch.Generator,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """``B' = Σ_i B_i YB_i``, ``A' = Σ_i YA_iᵀ A_i`` (``YB``/``YA`` stacked ``[k·r, r]``), regrow dead, cast."""
    cdt = Bs[0].dtype
    YB = YB.to(cdt)
    YA = YA.to(cdt)
    r = As[0].shape[0]
    B = Bs[0] @ YB[:r]
    A = YA[:r].mT @ As[0]
    for i in range(1, len(Bs)):
        B.addmm_(Bs[i], YB[i * r : (i + 1) * r])
        A.addmm_(YA[i * r : (i + 1) * r].mT, As[i])
    if bool(dead.any()):
        B[:, dead] = 0
        regrow(A, dead, generator)
    return A.to(dtype), B.to(dtype)


def sum_to_rank(
    parents: Sequence[AdapterState],
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    weights: Sequence[float],
    drop_p: float | None = None,
) -> dict[str, Tensor]:
    """Child with ``ΔW_c`` = best rank-r approximation of ``Σ_i w_i B_i A_i`` per module (stacked factors, exact).

    With ``drop_p`` (DARE, two parents) every factor is first multiplied by a keep-mask: per module, one float32
    ``u ~ U[0, 1)`` of B's shape then one of A's shape from the module's generator, each giving parent 1's and
    parent 2's masks through ``dare_mask_pair`` (the ``1/(1−p)`` rescale is left to the weights). Dead components
    regrow from the module's generator afterwards. Modules whose ΔW is zero in every parent are copied from
    parent 1.
    """
    ref = parents[0]
    dtype = ref[modules[0].a_key].dtype
    device = ref[modules[0].a_key].device
    cdt = compute_dtype(dtype)
    k = len(parents)

    def work(chunk: Sequence[LoraModule], gens: list[torch.Generator]) -> dict[str, Tensor]:
        # each module's factors side by side, [B₁|…|B_k] (d_out × k·r) and [A₁;…;A_k] (k·r × d_in), in a reused
        # per-thread arena: one Gram GEMM and one output GEMM per side instead of k² and k
        r = ref[chunk[0].a_key].shape[0]
        need = sum(k * r * (ref[m.b_key].shape[0] + ref[m.a_key].shape[1]) for m in chunk)
        arena = workspace(need, cdt, device, tag="stack")
        offset = 0
        cats: list[tuple[Tensor, Tensor]] = []
        for m, g in zip(chunk, gens, strict=True):
            d_out, d_in = ref[m.b_key].shape[0], ref[m.a_key].shape[1]
            Bcat = arena[offset : offset + d_out * k * r].view(d_out, k * r)
            offset += d_out * k * r
            Acat = arena[offset : offset + k * r * d_in].view(k * r, d_in)
            offset += k * r * d_in
            facs = [module_factors(p, m, cdt) for p in parents]
            if drop_p is None:
                for i, (A, B) in enumerate(facs):
                    Bcat[:, i * r : (i + 1) * r].copy_(B)
                    Acat[i * r : (i + 1) * r].copy_(A)
            else:  # one uniform per factor entry gives both parents' masks (dare_mask_pair); B first, then A
                for f, cat in ((1, Bcat), (0, Acat)):
                    x1, x2 = facs[0][f], facs[1][f]
                    u = workspace(x1.numel(), torch.float32, device, tag="u").view(x1.shape)
                    tmp = workspace(x1.numel(), cdt, device, tag="tmp").view(x1.shape)
                    d1, d2 = (cat[:, :r], cat[:, r:]) if f == 1 else (cat[:r], cat[r:])
                    u.uniform_(generator=g)
                    # float masks, same values as dare_mask_pair: m₁ = [u ≥ p], m₂ = [u ≥ p²] − m₁ + [u ≥ 2p − p²]
                    torch.ge(u, drop_p, out=d1)
                    torch.ge(u, drop_p * drop_p, out=d2)
                    torch.ge(u, 2.0 * drop_p - drop_p * drop_p, out=tmp)
                    d2.sub_(d1).add_(tmp).mul_(x2)
                    d1.mul_(x1)
            cats.append((Bcat, Acat))
        omega = torch.tensor(weights, dtype=torch.float64, device=device).repeat_interleave(r)
        XB, S, XA, GB, GA = svd_maps([Bc for Bc, _ in cats], [Ac for _, Ac in cats], omega)
        zero = torch.ones(GB.shape[0], dtype=torch.bool, device=GB.device)
        for i in range(k):
            blk = slice(i * r, (i + 1) * r)
            zero &= is_zero_gram(GB[:, blk, blk]) | is_zero_gram(GA[:, blk, blk])
        S_r = S[:, :r]
        dead = dead_components(S_r, width=k * r) | (S_r <= 0)
        root = torch.where(dead, torch.zeros_like(S_r), S_r.clamp(min=0).sqrt())
        YB = XB[:, :, :r] * root.unsqueeze(-2)
        YA = XA[:, :, :r] * root.unsqueeze(-2)
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                copy_module(child, ref, m)
                continue
            Bc, Ac = cats[j]
            child[m.a_key], child[m.b_key] = emit([Bc], [Ac], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return ordered(map_modules(modules, generator, device, work, lambda m: ref[m.a_key].shape[0]), ref)


def single_svd(
    parent: AdapterState,
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    modify: Callable[[Tensor, Tensor, list[torch.Generator]], tuple[Tensor, Tensor | None, Tensor | None]],
) -> dict[str, Tensor]:
    """Per module: exact SVD ``B·A = U diag(S) Vᵀ`` with canonical signs, then
    ``(S', R_U, R_V) = modify(S, live, generators)`` and the child ``B' = U R_U diag(√S')``,
    ``A' = diag(√S') (V R_V)ᵀ`` (``R`` None = identity).

    ``S`` is descending and the signs are fixed by :func:`canonical_signs` (``1ᵀuᵢ ≥ 0``, ``vᵢ`` flipped with
    ``uᵢ``), so ``U``, ``V`` are unique for distinct singular values. ``modify`` gets a chunk's ``S [m, r]``, the
    live mask (``S`` numerically > 0) and the modules' generators; it must draw module ``j``'s randomness from
    ``generators[j]`` only. Dead components of ``S'`` regrow (from the module's generator, after ``modify``'s
    draws); modules with ``ΔW = 0`` are copied.
    """
    dtype = parent[modules[0].a_key].dtype
    device = parent[modules[0].a_key].device
    cdt = compute_dtype(dtype)

    def work(chunk: Sequence[LoraModule], gens: list[torch.Generator]) -> dict[str, Tensor]:
        facs = [module_factors(parent, m, cdt) for m in chunk]
        XB, S, XA, GB, GA = svd_maps([B for _, B in facs], [A for A, _ in facs])
        signs = canonical_signs([B for _, B in facs], XB).unsqueeze(-2)
        XB, XA = XB * signs, XA * signs
        r = S.shape[-1]
        zero = is_zero_gram(GB) | is_zero_gram(GA)
        live = ~(dead_components(S, width=r) | (S <= 0))
        S2, RU, RV = modify(S, live, gens)
        if RU is not None:
            XB = XB @ RU
        if RV is not None:
            XA = XA @ RV
        dead = dead_components(S2, width=r) | (S2 <= 0)
        root = torch.where(dead, torch.zeros_like(S2), S2.clamp(min=0).sqrt())
        YB = XB * root.unsqueeze(-2)
        YA = XA * root.unsqueeze(-2)
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                copy_module(child, parent, m)
                continue
            A, B = facs[j]
            child[m.a_key], child[m.b_key] = emit([B], [A], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return ordered(map_modules(modules, generator, device, work, lambda m: parent[m.a_key].shape[0]), parent)
