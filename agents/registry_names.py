"""The names agents/' registries ship with, in a module without torch.

The estimators, loss aggregation modes, KL estimators and role weightings live beside their torch code, so
looking a name up there imports torch (seconds). A run's config is checked before any work: a name outside the
shipped ones, while the registry's module is not yet imported, is refused from these tuples at once — no plugin
can have added a name then, because a plugin registers through that module. Any other name is looked up in the
registry itself (:meth:`agents.trainer_config.TrainerConfig.validate`). ``tests/agents/test_registry_names.py``
pins each tuple to its registry.
"""

from __future__ import annotations

__all__ = ["ADVANTAGES", "KL_ESTIMATORS", "LOSS_AGGS", "ROLE_WEIGHTINGS"]

ADVANTAGES: tuple[str, ...] = ("dr_grpo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo")
"""The advantage estimators of :mod:`agents.advantages`."""
LOSS_AGGS: tuple[str, ...] = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean")
"""The loss aggregation modes of :mod:`agents.losses`."""
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
"""The KL estimators of :mod:`agents.losses` (a fixed set)."""
ROLE_WEIGHTINGS: tuple[str, ...] = ("balanced", "tokens")
"""``balanced``: each role's term a mean over its own rows, the terms averaged; ``tokens``: one token mean
(:mod:`agents.weighting`)."""
