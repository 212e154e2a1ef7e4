"""The trainer's test of one optimizer step: is it safe to take?

A step is taken only when both the (accumulated) loss and the gradient's global L2 norm are finite. A NaN/inf
loss usually yields a NaN gradient, but not always (a non-finite term can be detached, or clipped to a finite
gradient by ``clip_grad_norm_`` when the norm itself overflows to inf and the scale underflows to 0), so both are
checked. A skipped step leaves the member's weights and optimizer state unchanged; the trainer reports it in
``skipped_steps`` and the run loop stops after ``TrainerConfig.max_nonfinite_updates`` fully skipped updates of a
member in a row (:class:`selfplay.finite.NonFiniteGuard`).
"""

from __future__ import annotations

import math

__all__ = ["finite_update"]


def finite_update(loss: float, grad_norm: float) -> bool:
    """Whether an optimizer step with this loss and pre-clip gradient norm may be taken (both finite)."""
    return math.isfinite(loss) and math.isfinite(grad_norm)
