"""What the trainer learns from: one completion with its reward and its grouping keys."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Rollout:
    """One trained-on completion.

    Attributes:
        prompt_ids: prompt token ids (chat template applied), exactly as generated from.
        completion_ids: generated token ids.
        reward: scalar reward of the completion (placed on its last token by the estimators).
        group: baseline group (e.g. the task/prompt id: GRPO/RLOO/REINFORCE++-baseline centre within it).
        scope: normalisation scope: whitening (REINFORCE++ family) is done separately within each scope,
            e.g. ``(role, task_type)`` for AZR's task-relative REINFORCE++. ``None`` = one scope for the batch.
        logprobs: behaviour log-probs from the generator, aligned with ``completion_ids`` (optional).
        meta: free-form data for logging (role, task type, agent...).
        version: the version of the member's adapter that generated it (an asynchronous run;
            ``agents.trainer``: a rollout older than the weights being trained is scored against ``logprobs``);
            ``None``: not tracked (the synchronous loop, whose rollouts are always on-policy).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    group: Hashable = None
    scope: Hashable = None
    logprobs: list[float] | None = None
    meta: dict = field(default_factory=dict)
    version: int | None = None
