"""Test plugin (``--plugins tests/selfplay/nonfinite_plugin.py``): a reward scheme that pays every completion one
configured value (``--env.reward-scheme constant --env.reward-kwargs '{"value": 1e39}'``), and an advantage
estimator that returns NaN on every token (``--trainer.advantage nan_advantage``)."""

from __future__ import annotations

from typing import Any

import torch

from agents.advantages import register_advantage
from populora_env import register_reward_scheme


@register_reward_scheme("constant")
def constant(results: Any, value: Any = 0.0) -> dict[str, list[Any]]:
    return {a: [value] * results.n_completions(a) for a in results.agents}


@register_advantage("nan_advantage")
def nan_advantage(rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: Any, **_kw: Any) -> torch.Tensor:
    return torch.full_like(response_mask, float("nan"), dtype=torch.float32)
