"""The compute-matched single-agent Absolute Zero Reasoner (AZR) baseline.

One LoRA adapter (``azr``) plays both roles on the same env: it proposes tasks as ``teacher_0`` and solves
them as ``student_0``. What changes against a PopuLoRA run of the same preset:

- **reward**: the ``azr`` scheme: the proposer is paid the *learnability of its own tasks*,
  r = 1 − p̂ if 0 < p̂ < 1 else 0 (``extreme_reward``), −1 for an invalid task, where p̂ is its own solve
  rate over the ``samples_per_task`` attempts; solver rewards are the same (+1 / −0.5 / −1);
- **advantages**: task-relative REINFORCE++ (TRR++): ``reinforce_pp`` whitened separately within each
  (role, task type) scope, as AZR's code does (token-weighted statistics);
- **no evolution**, one adapter, one optimizer.

**Compute matching (per adapter, per role).** Each step the baseline adapter makes exactly one proposer's
budget — ``tasks_per_teacher`` proposals of ``teacher_max_new_tokens`` at most — and exactly one matched
student's budget — ``samples_per_task`` attempts at each of its valid tasks, ``student_max_new_tokens`` at
most — and takes **one** optimizer update per step over both (AZR concatenates its role batches into one
step). A population member of the same preset also takes one update per step, over its own role's batch of
the same size (with ``num_teachers == num_students``, every student solves exactly one teacher's tasks). So
per step, per role, the baseline adapter sees the same number of completions and generation-token budget
as one population member; the population as a whole spends ``num_teachers + num_students`` adapters' worth
(the paper's "per-adapter compute-matched" baseline; the total-compute difference is the portfolio effect
its critics point at).

Difference from AZR kept on purpose: AZR does not train on its 8 learnability rollouts and draws a
separate solver batch from the buffer; here the solver's learnability attempts are its training samples,
exactly as a PopuLoRA student's are, so the two arms differ only in who proposes and who judges.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from agents.trainer import TrainerConfig
from populora_env.config import EnvConfig

MEMBER = "azr"


class RunConfig(Protocol):
    """What the baseline changes in a run configuration (``selfplay.config.TrainConfig`` fits)."""

    env: EnvConfig
    trainer: TrainerConfig
    evolution: bool


C = TypeVar("C", bound=RunConfig)


def azr_mapping() -> dict[str, str]:
    """Agent -> adapter: ``teacher_0`` and ``student_0`` both act with the one ``azr`` adapter."""
    return {"teacher_0": MEMBER, "student_0": MEMBER}


def azr_config(cfg: C) -> C:
    """The baseline's configuration derived from a run configuration (same budgets, AZR's choices)."""
    env = dataclasses.replace(cfg.env, num_teachers=1, num_students=1, reward_scheme="azr")
    trainer = dataclasses.replace(cfg.trainer, advantage="reinforce_pp")
    changes: dict[str, Any] = {"env": env, "trainer": trainer, "evolution": False}
    return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]
