"""The shipped names of agents/' and evolution's registries, held without torch (``agents.registry_names``,
``evolution.families.OPERATORS``), are exactly what the registries hold; a name outside them is refused before
torch loads, and a name a plugin registered is still accepted (the lookup then goes to the registry)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agents import registry_names
from agents.trainer_config import TrainerConfig
from evolution.families import OPERATORS
from evolution.pbt_config import PBTConfig
from populora_env.checks import ConfigError

_REGISTRIES = """
import json
from agents.advantages import list_advantages
from agents.losses import KL_ESTIMATORS, list_loss_aggs
from evolution.operators import list_operators
print(json.dumps({"advantages": list_advantages(), "loss_aggs": list_loss_aggs(), "kl": sorted(KL_ESTIMATORS),
                  "operators": [op.name for op in list_operators()]}))
"""


def test_the_shipped_names_are_the_registries_names() -> None:
    """Read in a fresh interpreter: this one may hold names other tests registered."""
    out = subprocess.run([sys.executable, "-c", _REGISTRIES], capture_output=True, text=True, timeout=120, check=True)
    names = json.loads(out.stdout.strip().splitlines()[-1])
    assert names["advantages"] == sorted(registry_names.ADVANTAGES)
    assert names["loss_aggs"] == sorted(registry_names.LOSS_AGGS)
    assert names["kl"] == list(registry_names.KL_ESTIMATORS)
    assert names["operators"] == sorted(OPERATORS)


def test_a_registered_name_is_accepted_once_its_registry_is_loaded() -> None:
    from agents.advantages import register_advantage, unregister_advantage
    from evolution.operators import register_operator, unregister_operator

    register_advantage("plugin_estimator")(lambda rewards, groups: rewards)
    register_operator("plugin_op", family="control", arity=1)(lambda parent, **kw: parent)
    try:
        TrainerConfig(advantage="plugin_estimator").validate()
        PBTConfig(operators={"plugin_op": 1.0}).validate()
    finally:
        unregister_advantage("plugin_estimator")
        unregister_operator("plugin_op")
    with pytest.raises(ConfigError, match="unknown advantage estimator 'plugin_estimator'"):
        TrainerConfig(advantage="plugin_estimator").validate()
