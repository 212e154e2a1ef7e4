"""Factor-space combinations (``space="factor"``) and the checks shared by the combination operators.

In factor space a combination is applied to the A and B factors separately (lucidrains/populora and PEFT
``add_weighted_adapter`` semantics): cheaper than the exact ΔW-space route, but the product
``(Σ_i w_i B_i)(Σ_i w_i A_i)`` contains the cross terms ``w_i w_j B_i A_j`` of the parents' non-identifiable bases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from evolution.keys import AdapterState, LoraModule, ordered
from evolution.lowrank import compute_dtype

__all__ = ["check_space", "check_weights", "factor_linear", "factor_signed_sqrt"]


def check_space(space: str) -> str:
    """``space`` if it is ``"delta"`` or ``"factor"``, else ``ValueError``."""
    if space not in ("delta", "factor"):
        raise ValueError(f"space must be 'delta' or 'factor', got {space!r}")
    return space


def check_weights(weights: Sequence[float], n: int, op: str) -> tuple[float, ...]:
    """``n`` weights as floats, else ``ValueError`` naming the operator ``op``."""
    if len(weights) != n:
        raise ValueError(f"{op}: expected {n} weights, got {len(weights)}")
    return tuple(float(w) for w in weights)


def factor_linear(
    parents: Sequence[AdapterState], modules: Sequence[LoraModule], weights: Sequence[float]
) -> dict[str, Tensor]:
    """``A_c = Σ w_i A_i``, ``B_c = Σ w_i B_i`` (factor space)."""
    ref = parents[0]
    child: dict[str, Tensor] = {}
    for m in modules:
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        for key in (m.a_key, m.b_key):
            acc = parents[0][key].to(cdt) * weights[0]
            for w, par in zip(weights[1:], parents[1:], strict=True):
                acc.add_(par[key].to(cdt), alpha=w)
            child[key] = acc.to(dtype)
    return ordered(child, ref)


def factor_signed_sqrt(
    parents: Sequence[AdapterState],
    modules: Sequence[LoraModule],
    weights: Sequence[float],
    merge: Callable[[Tensor, Tensor], Tensor],
) -> dict[str, Tensor]:
    """PEFT's element-wise combination of factors: A weighted by ``sign(w)√|w|``, B by ``√|w|``, then merged
    (``merge(stack [k, ...], w [k, 1, ...])``)."""
    ref = parents[0]
    child: dict[str, Tensor] = {}
    for m in modules:
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        dev = ref[m.a_key].device
        wa = torch.tensor([math.copysign(math.sqrt(abs(w)), w) for w in weights], dtype=cdt, device=dev)
        wb = torch.tensor([math.sqrt(abs(w)) for w in weights], dtype=cdt, device=dev)
        for key, w in ((m.a_key, wa), (m.b_key, wb)):
            stack = torch.stack([p[key].to(cdt) for p in parents])
            child[key] = merge(stack, w.view(-1, *([1] * (stack.ndim - 1)))).to(dtype)
    return ordered(child, ref)
