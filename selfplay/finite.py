"""Numbers that reach the trainer are finite in its dtype, and a run that stops learning says so.

Two checks on the way from the env to the optimizer:

- :func:`check_rewards`, where the loop joins the env's rewards with its completions: every reward is a real
  number (not a bool, not a string; the env already refuses those from a reward scheme) and finite after the cast
  to the trainer's float32 (``1e39`` is finite in float64 and ``inf`` in float32; it would make every update's
  gradient NaN). A reward that fails is a bug of the reward scheme: :class:`RewardSchemeError` names the
  scheme, the agent and the value, and the run stops before the update.
- :class:`NonFiniteGuard`, after every update: a member whose update was skipped entirely (every optimizer step
  had a non-finite loss or gradient norm, see :func:`agents.nonfinite.finite_update`) is logged, and after
  ``trainer.max_nonfinite_updates`` consecutive such updates :class:`NonFiniteTraining` stops the run, naming
  the member and the step. It is raised inside the step, before that step's checkpoint, so the newest
  checkpoint on disk is one written before the first skipped update of the streak or during it, never after
  the run stopped learning; its weights are those of the last finite update (skipped updates change nothing).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from populora_env.rewards import RewardSchemeError

__all__ = ["NonFiniteGuard", "NonFiniteTraining", "RewardSchemeError", "check_rewards"]

log = logging.getLogger(__name__)


class NonFiniteTraining(RuntimeError):
    """A member's updates were non-finite too many times in a row; the message names it and the step."""

    def __init__(self, member: str, step: int, count: int) -> None:
        self.member, self.step, self.count = member, step, count
        super().__init__(
            f"member {member} had {count} consecutive updates with a non-finite loss or gradient norm (all "
            f"skipped) up to step {step}: the run stopped; its last checkpoint is intact (raise "
            f"--trainer.max-nonfinite-updates to tolerate more, or lower --trainer.lr / check the reward scheme)")


def check_rewards(batches: Mapping[str, Sequence[Any]], scheme: str) -> None:
    """Every rollout's ``reward`` is a real number, finite in float32; :class:`RewardSchemeError` otherwise."""
    for member, rollouts in batches.items():
        for r in rollouts:
            v = r.reward
            agent = r.meta.get("agent", member) if isinstance(getattr(r, "meta", None), dict) else member
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise RewardSchemeError(f"reward scheme {scheme!r} gave {agent} a reward of {v!r} "
                                        f"({type(v).__name__}): rewards must be real numbers")
            with np.errstate(over="ignore"):
                as_float32 = float(np.float32(v))
            if not math.isfinite(as_float32):
                raise RewardSchemeError(f"reward scheme {scheme!r} gave {agent} a reward of {v!r}, which is "
                                        f"not finite in the trainer's float32 (|r| <= 3.4e38)")


class NonFiniteGuard:
    """Counts each member's consecutive fully skipped updates (trainer metrics ``skipped_steps == num_steps``)."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.streak: dict[str, int] = {}

    def observe(self, step: int, member_metrics: Mapping[str, Mapping[str, float]]) -> list[dict]:
        """Update the streaks with one step's metrics; returns an event per skipped member (also logged).

        Raises:
            NonFiniteTraining: a member reached ``limit`` consecutive skipped updates.
        """
        events = []
        for member, m in member_metrics.items():
            steps, skipped = m.get("num_steps", 0.0), m.get("skipped_steps", 0.0)
            if steps > 0 and skipped >= steps:
                n = self.streak.get(member, 0) + 1
                self.streak[member] = n
                events.append({"step": step, "member": member, "consecutive": n,
                               "loss": m.get("loss"), "grad_norm": m.get("grad_norm")})
                log.warning("step %d: member %s: non-finite loss or gradient norm (loss %s, grad norm %s), update "
                            "skipped (%d/%d in a row)", step, member, m.get("loss"), m.get("grad_norm"), n,
                            self.limit)
                if n >= self.limit:
                    raise NonFiniteTraining(member, step, n)
            elif steps > 0:
                self.streak[member] = 0
        return events
