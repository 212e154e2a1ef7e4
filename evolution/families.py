"""The operator families, the one vocabulary shared by the registry (an operator's ``family``) and the PBT
settings (``PBTConfig.operators`` draws by family or by operator name). Plain data, no torch."""

from __future__ import annotations

__all__ = ["FAMILIES", "OPERATORS"]

FAMILIES = ("mutation", "crossover", "control")
"""Mutations (one parent), crossovers (two) and the controls (``copy_parent``, ``linear_0_5``)."""

OPERATORS: tuple[str, ...] = (
    "adaptive_noise", "component_mask", "copy_parent", "dare", "extrapolate", "layer_crossover", "layer_mutation",
    "linear_0_5", "svd_crossover", "svd_mutation", "task_arithmetic", "ties",
)
"""The operators the registry ships with (:mod:`evolution.operators`). A setting naming another operator while the
registry is not yet imported (no plugin can have added one: a plugin registers through it) is refused from this
list, without importing torch; ``tests/agents/test_registry_names.py`` pins it to the registry."""
