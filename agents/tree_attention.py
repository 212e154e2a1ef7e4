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
path with the dense mask: the same values. A caller that never needs that fallback passes
:func:`placeholder_mask` as the decoder's 4D mask (one element, broadcast; nothing ``L x L`` is built), and a
call without the blocks then fails instead of attending through it.

**Kernels** (recorded per call in :data:`kernels_used`, so a GPU check can say which ran):

* ``block-mask``: on CPU, a block with ancestors passes its ``[n, seen + n]`` bool mask to SDPA (the CPU
  flash kernel takes it); a block without ancestors is ``is_causal``. This is the CPU path.
* ``block-causal``: on CUDA (or asked for with ``tree_causal_bias=True``), the same blocks, with the
  within-block mask given as :func:`torch.nn.attention.bias.causal_lower_right` (every ancestor key, the
  block's own keys causally, aligned bottom right) instead of a tensor. An explicit mask with grouped-query
  attention rules out CUDA's flash and memory-efficient kernels, so SDPA would silently take its math kernel
  (float32 scores, ``n x (seen + n)`` per head); the causal bias dispatches to flash attention (GQA native,
  no mask tensor, no scores kept), and to the memory-efficient kernel with the keys and values expanded to
  the query heads where flash is ruled out (e.g. float32). On CPU the bias is materialised: the same values
  as ``block-mask``.
* ``flex``: one :func:`torch.nn.attention.flex_attention.flex_attention` call per row batch with a
  ``BlockMask`` built from the packing's ``key_end`` (:func:`tree_block_mask`, no ``L x L`` work): the
  ``128 x 128`` tiles the tree leaves empty are skipped, full tiles take no mask, partial ones evaluate
  ``k <= q < key_end[k]``. Compiled with ``torch.compile`` on CUDA (the fused Triton kernel); eager on CPU,
  where PyTorch runs it without gradients only (no CPU backward), so the trainer refuses it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["MASK_ATTENTIONS", "TREE_ATTENTION", "kernels_used", "placeholder_mask", "takes_tree_mask",
           "tree_attention", "tree_attention_forward", "tree_block_mask"]

FLEX_BLOCK = 128
"""Tile size (queries x keys) of the flex path's ``BlockMask`` (flex_attention's default)."""
kernels_used: Counter[str] = Counter()
"""Attention calls per kernel since the caller last cleared it (module docstring): ``block-mask``,
``block-causal`` (``block-causal-expanded``: a grouped-query call was refused and the heads expanded),
``flex-compiled``, ``flex-eager``, ``dense-mask`` (the SDPA fallback without blocks)."""

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


def placeholder_mask(rows: int, length: int, dtype: torch.dtype, device: torch.device | str | None) -> Tensor:
    """A ``[rows, 1, length, length]`` additive mask of one element broadcast (stride 0): what a decoder that
    wants a 4D mask is given when every attention call runs from the tree blocks (module docstring)."""
    return torch.zeros((), dtype=dtype, device=device).expand(rows, 1, length, length)


def _is_placeholder(mask: Tensor | None) -> bool:
    return isinstance(mask, Tensor) and mask.dim() == 4 and mask.numel() > 1 and all(s == 0 for s in mask.stride())


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
    tree_block_mask=None,
    tree_causal_bias: bool | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, H, L, D]``, ``key``/``value``
    ``[B, H_kv, L, D]``; returns ``([B, L, H, D], None)``. With ``tree_block_mask`` (a flex ``BlockMask``,
    :func:`tree_block_mask`): the flex kernel; with ``tree_blocks``: per query block, the within-block mask as a
    causal bias when ``tree_causal_bias`` (default: on CUDA), else as a bool tensor; with neither: SDPA with
    the mask (refused for a :func:`placeholder_mask`)."""
    if tree_block_mask is not None:
        return _flex_forward(query, key, value, tree_block_mask, scaling), None
    if tree_blocks is None:
        if _is_placeholder(attention_mask):
            raise ValueError("a packed row's attention was called without its tree blocks (tree_blocks=): its "
                             "placeholder mask cannot stand in for the tree mask")
        kernels_used["dense-mask"] += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    B, H, L, _ = query.shape
    causal_bias = query.is_cuda if tree_causal_bias is None else tree_causal_bias
    kernels_used["block-causal" if causal_bias else "block-mask"] += 1
    if causal_bias and key.shape[1] != H and (_EXPAND_KV or not _flash_takes(query, key, value, dropout)):
        # without flash, only the memory-efficient kernel takes the causal bias fused, and it wants every head
        key, value = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (key, value))
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
            elif causal_bias:  # the same visibility as a bias the fused CUDA kernels take (module docstring)
                o = _causal_block(q, k, v, n, seen, dropout, scaling, H)
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


_EXPAND_KV = False
"""Set once a grouped-query causal-bias call was refused by the installed PyTorch: later calls expand the keys and
values to the query heads first (recorded as ``block-causal-expanded``)."""


def _causal_block(q: Tensor, k: Tensor, v: Tensor, n: int, seen: int, dropout: float, scaling: float | None,
                  heads: int) -> Tensor:
    """One block's attention with its mask as a lower-right causal bias; if this PyTorch refuses the bias with
    grouped-query attention, the keys and values are expanded to the query heads (the same values) from then on."""
    global _EXPAND_KV
    gqa = k.shape[1] != heads
    if gqa and not _EXPAND_KV:
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, seen + n),
                                                  dropout_p=dropout, scale=scaling, enable_gqa=True)
        except RuntimeError:
            _EXPAND_KV = True
            kernels_used["block-causal-expanded"] += 1
    if gqa:
        k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, seen + n), dropout_p=dropout,
                                          scale=scaling)


def causal_lower_right(n: int, kv: int):
    """:func:`torch.nn.attention.bias.causal_lower_right` for ``n`` queries over ``kv`` keys."""
    from torch.nn.attention.bias import causal_lower_right as bias

    return bias(n, kv)


def _flash_takes(query: Tensor, key: Tensor, value: Tensor, dropout: float) -> bool:
    """Whether CUDA's flash kernel takes these inputs with grouped-query attention (no mask)."""
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        return bool(can_use_flash_attention(SDPAParams(query, key, value, None, dropout, False, True)))
    except (ImportError, RuntimeError, TypeError):
        return False


def tree_block_mask(key_end: Tensor, block: int = FLEX_BLOCK):
    """The flex ``BlockMask`` of packed rows from their ``key_end`` ``[R, L]`` (``agents.packing``: key ``k`` is
    seen by the queries ``k <= q < key_end[k]``), built tile by tile without any ``L x L`` tensor.

    For the query tile ``i`` (columns ``c_i .. d_i - 1``) and the key tile ``j``: some pair is visible iff
    ``j <= i`` and ``max_{k in j} key_end[k] > c_i``; every pair is iff ``j < i`` and
    ``min_{k in j} key_end[k] >= d_i``. Full tiles run without the mask; partial ones evaluate the mask;
    the rest are skipped. Columns past ``L`` (the last tile's remainder) are seen by nobody."""
    from torch.nn.attention.flex_attention import BlockMask

    R, L = key_end.shape
    T = -(-L // block)
    cols = torch.arange(T * block, device=key_end.device)
    ke = torch.where(cols < L, F.pad(key_end, (0, T * block - L)), cols).to(torch.int32)  # [R, T * block]
    tiles = ke.view(R, T, block)
    kmax, kmin = tiles.amax(-1), tiles.amin(-1)  # [R, T] over each key tile
    i = torch.arange(T, device=key_end.device)
    first = (i * block).view(1, T, 1)
    end = ((i + 1) * block).clamp(max=L).view(1, T, 1)
    lower = i.view(T, 1) >= i.view(1, T)  # j <= i
    some = lower & (kmax.view(R, 1, T) > first)
    full = (i.view(T, 1) > i.view(1, T)) & (kmin.view(R, 1, T) >= end)
    partial = some & ~full

    def listed(blocks: Tensor) -> tuple[Tensor, Tensor]:
        counts = blocks.sum(-1).to(torch.int32)
        order = torch.sort((~blocks).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return counts.unsqueeze(1), order.unsqueeze(1)  # [R, 1, T], [R, 1, T, T]

    def mask_mod(b, h, q, k):
        return (k <= q) & (q < ke[b, k])

    (kv_num, kv_idx), (full_num, full_idx) = listed(partial), listed(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(L, L))


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex_forward(query: Tensor, key: Tensor, value: Tensor, block_mask, scaling: float | None) -> Tensor:
    """Attention of packed rows under their flex ``BlockMask``: ``[B, L, H, D]``."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = query.is_cuda
    kernels_used["flex-compiled" if compiled else "flex-eager"] += 1
    fn = _compiled_flex() if compiled else flex_attention
    out = fn(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous()


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
