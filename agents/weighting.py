"""Per-row loss weights that balance the roles of a mixed batch (the single-agent baseline's update).

The single-agent AZR baseline trains its proposer and solver completions in one batch. With the plain token
mean every token weighs the same, so a role's share of the update is its share of the tokens (16 proposals
against 128 attempts: the proposer gets ~10-20 %), while AZR trains equal role batches and a population
member gets all of its own update. ``role_weighting = "balanced"`` makes the loss of one optimizer step the
mean over the roles present of each role's own aggregate:

    L = (1/R) sum_r agg_r(l),   agg_r = the configured aggregation over the rows of role r only,

with R the number of roles that have rows in the step's (mini-)batch. It is written as weights computed
before any forward pass, so that the trainer's reduction stays ``agg(w * l)`` (``agents.losses.policy_loss``'s
``token_weights``). For ``token-mean`` (agg = sum l m / N over the N valid tokens of the mini-batch) a token of
role r gets

    w = N / (R * N_r)        =>   sum_t w l m / N = (1/R) sum_r (1/N_r) sum_{t in r} l,

N_r = the role's valid tokens in the mini-batch; for the ``seq-mean-*`` modes (normaliser G = sequences)
a row of role r gets ``w = G / (R * G_r)``, G_r = the role's rows. A batch of one role gets no weights
(``None``: exactly the token mean), so a population member's update is unchanged; ``"tokens"`` never
weights (every token of the batch weighs the same, the behaviour before balancing). Rows without a role
(``None``) form a role of their own. The entropy bonus and a KL loss are weighted alike (the whole per-token
loss is ``w * l``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from agents.registry_names import ROLE_WEIGHTINGS

__all__ = ["ROLE_WEIGHTINGS", "role_loss_weights"]


def role_loss_weights(
    roles: Sequence[Hashable | None],
    mask: Tensor,
    mode: str,
    loss_agg_mode: str = "token-mean",
    mini_batch_size: int | None = None,
) -> Tensor | None:
    """``[B, T]`` float32 loss weights of the rows of a batch (module docstring for the math), or ``None``
    when nothing is weighted (``mode == "tokens"`` or a single role in the batch).

    Args:
        roles: each row's role (e.g. ``Rollout.meta["role"]``), aligned with ``mask``.
        mask: ``[B, T]`` valid completion tokens.
        mode: one of :data:`ROLE_WEIGHTINGS`.
        loss_agg_mode: the trainer's aggregation: ``token-mean`` weights by token counts, the ``seq-mean-*``
            modes by row counts.
        mini_batch_size: rows per optimizer step (consecutive rows, as the trainer cuts them); ``None``: the
            whole batch is one step. Each step is balanced over the roles it holds.

    Raises:
        ValueError: unknown ``mode``, ``roles`` not aligned with ``mask``, or ``balanced`` with an aggregation
            that is neither ``token-mean`` nor a ``seq-mean-*`` mode.
    """
    if mode not in ROLE_WEIGHTINGS:
        raise ValueError(f"role_weighting must be one of {', '.join(ROLE_WEIGHTINGS)} (got {mode!r})")
    B = mask.shape[0]
    if len(roles) != B:
        raise ValueError(f"{len(roles)} roles for a batch of {B} rows")
    if mode == "tokens" or len(set(roles)) <= 1:
        return None
    if loss_agg_mode == "token-mean":
        by_rows = False
    elif loss_agg_mode.startswith("seq-mean"):
        by_rows = True
    else:
        raise ValueError(
            f"role_weighting 'balanced' is defined for token-mean and the seq-mean-* aggregations, not "
            f"{loss_agg_mode!r}; use role_weighting 'tokens'"
        )
    m = mask.to(torch.float32)
    row_size = torch.ones(B) if by_rows else m.sum(-1).cpu()
    weights = torch.ones(B, dtype=torch.float32)
    step = mini_batch_size or B
    for start in range(0, B, step):
        rows = range(start, min(B, start + step))
        counts: dict[Hashable | None, float] = {}
        for i in rows:
            counts[roles[i]] = counts.get(roles[i], 0.0) + float(row_size[i])
        present = {r: n for r, n in counts.items() if n > 0}
        total = sum(present.values())
        for i in rows:
            n_role = present.get(roles[i], 0.0)
            if n_role > 0:  # a role without tokens in this step contributes nothing whatever its weight
                weights[i] = total / (len(present) * n_role)
    return weights[:, None].expand(B, mask.shape[1]).contiguous().to(mask.device)
