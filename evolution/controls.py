"""Controls: a bitwise copy and the plain midpoint, to compare the real operators against."""

from __future__ import annotations

from evolution.factor_space import check_space, factor_linear
from evolution.gram import sum_to_rank
from evolution.registry import register_operator

__all__ = ["copy_parent", "linear_0_5"]


@register_operator("copy_parent", family="control", arity=1, defaults={})
def copy_parent(parents, modules, generator):
    """Control: the child is a bitwise copy of the parent's raw factors (no refactoring)."""
    return {k: v.clone() for k, v in parents[0].items()}


@register_operator("linear_0_5", family="control", arity=2, defaults={"space": "delta"})
def linear_0_5(parents, modules, generator, *, space: str):
    """Control: the midpoint ``ΔW_c = ½ΔW₁ + ½ΔW₂``.

    * ``space="delta"`` (default): exact, truncated to rank r via the stacked factors.
    * ``space="factor"``: ``A_c = ½(A₁ + A₂)``, ``B_c = ½(B₁ + B₂)`` — lucidrains' ``average`` = PEFT ``linear``
      with weights ``(¼, ¼)``; its ΔW is ``¼(B₁ + B₂)(A₁ + A₂)``, with cross terms.
    """
    space = check_space(space)
    if space == "delta":
        return sum_to_rank(parents, modules, generator, (0.5, 0.5))
    return factor_linear(parents, modules, (0.5, 0.5))
