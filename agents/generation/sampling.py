"""Inverse-CDF sampling of one token per row under a nucleus (top-p), with the row's own uniform.

Given probabilities ``p`` [R, V] (already at the row's temperature), nucleus thresholds ``top_p`` [R] and
uniforms ``u`` [R] in [0, 1), each row's token is defined through the *reference* computation
(:func:`sample_rows_sorted`):

* order the vocabulary by descending probability, ties by ascending token id (a stable sort), giving
  ``q_1 >= q_2 >= ... >= q_V``;
* keep position ``j`` iff the mass strictly before it is below ``top_p``: ``sum_{i<j} q_i < top_p`` (position 1
  is always kept), i.e. the smallest prefix whose mass reaches ``top_p``;
* with ``c_j`` the cumulative kept mass and ``T`` the total kept mass, the token is the one at the first
  position with ``c_j > u * T`` (always a token of positive probability).

Rows with ``top_p == 1`` skip the ordering: the same inverse CDF over the vocabulary in id order.

:func:`sample_rows` (the default) computes exactly the same token, bit for bit, while sorting only a few
candidates. Only a prefix of the order matters: if the ``k`` most likely tokens have mass
``M_k >= top_p + margin``, no position after ``k`` can be kept (the mass before it is at least ``M_k``; the
``margin`` = 1e-5 dwarfs the float32 rounding of the cumulative sums, ~1e-7). So per row it takes
``torch.topk`` of ``k`` = 64 (then 1,024, then 8,192 for rows whose top-``k`` mass is short of
``top_p + margin``, then the full stable sort), and accepts the candidates only if no token outside them ties
with the smallest one (else the set of the first ``k`` positions would depend on how ties are broken). The
accepted candidates are put in token-id order and stably sorted, so they are exactly the first ``k`` positions
of the reference order, and the cumulative sums of that prefix are the reference's own (a cumulative sum's
prefix does not depend on what follows). ``tests/agents/test_sampling.py`` checks token-for-token equality on
seeded draws over random logits with ties and edge ``top_p`` values.
"""

from __future__ import annotations

import torch

__all__ = ["SAMPLERS", "sample_rows", "sample_rows_sorted", "top_p_filter"]

_MARGIN = 1e-5
_CANDIDATES = (64, 1024, 8192)


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, keep the smallest set of most likely tokens whose mass reaches ``top_p`` (at least one).

    ``probs`` [R, N] may be the whole vocabulary or, in :func:`sample_rows`, the first positions of the
    reference order. Returns the kept (unnormalised) probabilities in descending order (ties by ascending
    position, a stable sort) and the column indices of that order.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    return _keep(sorted_probs, top_p), order


def _keep(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each position
    keep = before < top_p[:, None]
    keep[:, 0] = True
    return sorted_probs * keep


def _inverse_cdf(kept: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Position of the first ``cdf > u * total`` per row of ``kept`` [R, N] ([R, 1])."""
    cdf = kept.cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)


def sample_rows_sorted(probs: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The reference sampler (module docstring): a full stable sort of the vocabulary for nucleus rows.
    ``probs`` [R, V], ``top_p`` [R], ``u`` [R] -> token ids [R]."""
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    nucleus = top_p < 1.0
    for rows, use_top_p in ((nucleus.nonzero().squeeze(1), True), ((~nucleus).nonzero().squeeze(1), False)):
        if rows.numel() == 0:
            continue  # each row takes the same path whatever else is in the batch
        if use_top_p:
            kept, order = top_p_filter(probs[rows], top_p[rows])
            out[rows] = order.gather(1, _inverse_cdf(kept, u[rows])).squeeze(1)
        else:
            out[rows] = _inverse_cdf(probs[rows], u[rows]).squeeze(1)
    return out


def sample_rows(probs: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Exactly :func:`sample_rows_sorted`'s tokens, sorting only the candidates that can be in the nucleus
    (module docstring). ``probs`` [R, V], ``top_p`` [R], ``u`` [R] -> token ids [R]."""
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    nucleus = top_p < 1.0
    flat = (~nucleus).nonzero().squeeze(1)
    if flat.numel():
        out[flat] = _inverse_cdf(probs[flat], u[flat]).squeeze(1)
    todo = nucleus.nonzero().squeeze(1)
    vocab = probs.shape[-1]
    for k in _CANDIDATES:
        if todo.numel() == 0:
            return out
        if k >= vocab:
            break
        p = probs[todo]
        values, ids = p.topk(k, dim=-1, sorted=False)
        smallest = values.min(dim=-1).values
        # exact iff the candidates hold enough mass and no token outside them ties with the smallest one
        enough = values.sum(-1, dtype=torch.float64) >= (top_p[todo] + _MARGIN).double()
        whole = (p >= smallest[:, None]).sum(-1) == k
        ok = enough & whole
        if ok.any():
            rows = todo[ok]
            ids = ids[ok].sort(dim=-1).values  # token-id order, so the stable sort breaks ties like the reference
            cand = probs[rows].gather(1, ids)
            kept, order = top_p_filter(cand, top_p[rows])
            out[rows] = ids.gather(1, order.gather(1, _inverse_cdf(kept, u[rows]))).squeeze(1)
        todo = todo[~ok]
    if todo.numel():
        out[todo] = sample_rows_sorted(probs[todo], top_p[todo], u[todo])
    return out


SAMPLERS = {"topk": sample_rows, "sort": sample_rows_sorted}
"""``generation.sampler`` values: ``"topk"`` (default, sorts only nucleus candidates) and ``"sort"`` (the full
sort; same tokens, kept for equality tests and ablations)."""
