"""Attention over a prefix-shared packed row that skips the pairs its tree mask forbids.

:func:`agents.packing.pack_prefix_shared` lays a micro-batch out as trees (shared prompt prefixes once,
completions as leaves) and gives an additive ``L x L`` mask: token ``q`` may see key ``k`` iff ``k``'s node
is ``q``'s node or one of its ancestors and ``pos(k) <= pos(q)``. A dense kernel fed that mask still
computes every one of the ``L^2`` scores; on the main job's micro-batches only ~21 % of them are allowed.

Here each row is cut into the packing's query blocks ``(s, e, A)`` (``PackedRows.blocks``): the tokens of
columns ``s .. e-1`` see the ancestor columns ``A`` (a few contiguous ranges) and, causally, their own block.
For a query column ``q`` of a block, with ``K_A``, ``V_A`` the keys and values gathered at ``A``::

    o_q = softmax( scale * q_q [K_A ; K_{s..q}]^T ) [V_A ; V_{s..q}]

which is the dense masked attention's row ``q`` exactly: the forbidden keys carry the dtype's most negative
value there, whose exponent underflows to 0 after the max is subtracted, so they add nothing to either sum.
Only the order of the float sums differs. Padding columns (from ``pad_start``) see only themselves in the
mask, so their output is their own value vector; it is copied, not computed. The scores cost
``sum_b (e_b - s_b) * (|A_b| + e_b - s_b)`` instead of ``L^2``; the gradient flows through the gathers and
``torch.nn.functional.scaled_dot_product_attention`` as autograd defines them.

Use: register once (importing this module does), run the decoder inside :func:`tree_attention` and pass the
blocks as ``tree_blocks=`` / ``tree_pad_start=`` keyword arguments of the decoder's forward (transformers
hands a forward's extra keyword arguments to every attention call). An attention call without them (another
caller of the model, an architecture that does not pass keyword arguments down) runs transformers' SDPA
path with the dense mask: the same values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["MASK_ATTENTIONS", "TREE_ATTENTION", "takes_tree_mask", "tree_attention", "tree_attention_forward"]

TREE_ATTENTION = "populora_tree"
"""The name this attention function is registered under in transformers' ``AttentionInterface``."""
MASK_ATTENTIONS = ("eager", "sdpa")
"""transformers' attention implementations that take a 4D additive mask (flash-attention kernels do not);
:func:`tree_attention` switches these."""

Block = tuple[int, int, tuple[tuple[int, int], ...]]


class _Pieces:
    """One row of keys or values cut once at every block and range boundary, so that each block gathers its
    columns by concatenating pieces (autograd then sums the gradients piece by piece and joins them once,
    instead of building a full-row zero gradient per gather)."""

    def __init__(self, x: Tensor, bounds: Sequence[int]) -> None:
        self.bounds = list(bounds)
        self.index = {b: i for i, b in enumerate(self.bounds)}
        self.parts = x.split([b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False)], dim=2)

    def gather(self, ranges: Sequence[tuple[int, int]]) -> Tensor:
        parts = [p for a, b in ranges for p in self.parts[self.index[a] : self.index[b]]]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _query_blocks(query: Tensor, blocks: Sequence[Block], pad_start: int) -> list[Tensor]:
    """Each block's queries ``[1, H, e - s, D]`` of one row. The packing's blocks tile the row's columns
    ``0 .. pad_start`` in order, so the row is split once (autograd joins the blocks' gradients by one
    concatenation, where a slice per block builds a zero-filled full-row gradient for each); blocks that do not
    tile it are sliced one by one."""
    ends = [0, *(e for _, e, _ in blocks)]
    if all(s == ends[i] for i, (s, _, _) in enumerate(blocks)) and ends[-1] == pad_start:
        rest = query.shape[2] - pad_start
        pieces = query.split([e - s for s, e, _ in blocks] + ([rest] if rest else []), dim=2)
        return list(pieces[: len(blocks)])
    return [query[:, :, s:e] for s, e, _ in blocks]


@lru_cache(maxsize=64)
def _lower_right(n: int, seen: int, device: torch.device) -> Tensor:
    """The bool mask ``[n, seen + n]`` of a block's queries over its ancestors' ``seen`` keys (all visible) and
    its own ``n`` keys (causally): the same for every layer of a forward and every forward of a layout, so it
    is built once (a read-only input of the attention; ~5 % of a tree prefill's time when built per layer).
    64 kept: more than one forward's blocks, a few MB at the main job's sizes."""
    return torch.ones(n, seen + n, dtype=torch.bool, device=device).tril(seen)


def tree_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tree_blocks: Sequence[Sequence[Block]] | None = None,
    tree_pad_start: Sequence[int] | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, H, L, D]``, ``key``/``value``
    ``[B, H_kv, L, D]``; returns ``([B, L, H, D], None)``. Without ``tree_blocks``: SDPA with the mask."""
    if tree_blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    B, H, L, _ = query.shape
    gqa = {"enable_gqa": True} if key.shape[1] != H else {}
    if len(tree_blocks) != B:
        raise ValueError(f"{len(tree_blocks)} rows of tree blocks for a batch of {B}")
    pad_start = list(tree_pad_start) if tree_pad_start is not None else [L] * B
    rows = []
    for r, blocks in enumerate(tree_blocks):
        cuts = {0, L, pad_start[r]}
        for s, e, anc in blocks:
            cuts.update((s, e))
            for a, b in anc:
                cuts.update((a, b))
        bounds = sorted(cuts)
        keys, values = _Pieces(key[r : r + 1], bounds), _Pieces(value[r : r + 1], bounds)
        queries = _query_blocks(query[r : r + 1], blocks, pad_start[r])
        parts = []
        for (s, e, anc), q in zip(blocks, queries, strict=True):
            k, v = keys.gather((*anc, (s, e))), values.gather((*anc, (s, e)))
            n = e - s
            seen = k.shape[2] - n
            if seen == 0:
                o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, **gqa)
            else:  # every ancestor key, then the block's own keys causally (bottom-right aligned)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=_lower_right(n, seen, query.device),
                                                   dropout_p=dropout, scale=scaling, **gqa)
            parts.append(o)
        if pad_start[r] < L:  # a padding token sees itself only: its output is its value vector
            pv = values.gather([(pad_start[r], L)])
            parts.append(pv.repeat_interleave(H // pv.shape[1], dim=1))
        covered = sum(p.shape[2] for p in parts)
        if covered != L:
            raise ValueError(f"tree blocks of row {r} cover {covered} of its {L} columns")
        rows.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    out = torch.cat(rows, dim=0) if B > 1 else rows[0]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_ATTENTION, tree_attention_forward)


def takes_tree_mask(model: nn.Module) -> bool:
    """Whether ``model``'s attention can run a packed tree layout: its implementation takes a 4D additive mask
    (:data:`MASK_ATTENTIONS`, or none set) or is this module's (inside :func:`tree_attention`)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in (None, *MASK_ATTENTIONS, TREE_ATTENTION)


@contextmanager
def tree_attention(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s attention layers call :func:`tree_attention_forward` (every config in
    the model whose implementation is SDPA or eager switches; restored on exit)."""
    configs = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) in MASK_ATTENTIONS:
            configs[id(cfg)] = cfg
    old = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = TREE_ATTENTION
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = old[k]
