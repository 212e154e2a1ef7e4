"""The operator families, the one vocabulary shared by the registry (an operator's ``family``) and the PBT
settings (``PBTConfig.operators`` draws by family or by operator name). Plain data, no torch."""

from __future__ import annotations

__all__ = ["FAMILIES"]

FAMILIES = ("mutation", "crossover", "control")
"""Mutations (one parent), crossovers (two) and the controls (``copy_parent``, ``linear_0_5``)."""
