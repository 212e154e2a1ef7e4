"""Prefix-shared, unpadded packing of ``[prompt | completion]`` rollouts for one forward pass.

Students' attempts at one task repeat the task's prompt, prompts of one role share their instructions, and
prompts are most of an update's tokens. The trainer's padded layout (one row per rollout, ``prompt +
completion`` right-padded to the micro-batch's longest) forwards every prompt once per attempt, and the
padding too. :func:`pack_prefix_shared` instead builds the radix tree of the prompts (each node a run of
tokens that every prompt below it shares; a prompt ends in some node) and lays out every node once, with each
rollout's completion as a leaf under the node its prompt ends in::

    tree   = [shared instructions | task A's rest | A: c^1 | A: c^2 | task B's rest | B: c^1 ...]
    position  0 .. S-1            | S .. P_A-1    | P_A ..  | P_A ..  | S .. P_B-1    | P_B ..

Trees are bin-packed into rows (first-fit decreasing; the row capacity is the largest tree), so padding
appears only at the end of the few rows that the trees do not fill. A 4D attention mask makes the computation
equal to the padded one: query token q may attend to key token k iff k's node is q's node or one of its
ancestors, and ``pos(k) <= pos(q)``. So every token sees exactly the tokens before it in its own rollout's
``prompt + completion``, never a sibling's. Position ids are explicit, so rotary embeddings see exactly the
positions of the padded layout. Padding tokens attend only to themselves, so no softmax row is empty.

The gradient is the same: in the padded layout a shared prefix's activations are computed once per rollout
and each copy receives its rollout's gradient; here one copy receives the sum of them (the chain rule through
a shared node; a causal model's prefix activations do not depend on what follows). Only float summation order
differs (tests/agents/test_packing.py pins the tolerance).

The mask is additive (0 where allowed, the dtype's most negative finite value elsewhere) in the model's
dtype, shape ``[R, 1, L, L]``: transformers passes a 4D mask through unchanged (``masking_utils``: "If the
mask is already 4D, simply return as-is") to the eager path (adds it to the scores) and to SDPA (an additive
float ``attn_mask``). Flash-attention kernels take no such mask; the trainer keeps the padded layout
(``TrainerConfig.packing = "none"``) for those. The mask is L x L per row: memory grows with the square of a
micro-batch's packed length (4 bytes x 4,000^2 = 64 MB for a float32 row of 4,000 tokens), so it is built
only when read (``PackedRows.attention_mask``): tree attention never reads it.

Because the layout is depth-first, the columns below a node (its subtree) are contiguous, and the mask has a
one-vector form: key column ``k`` is seen by exactly the queries ``k <= q < key_end[k]``, where
``key_end[k]`` is the end of the subtree of ``k``'s node (``k + 1`` for padding): a node's own tokens see it
causally, every descendant sees all of it, and a column past its subtree belongs to no descendant
(``PackedRows.key_end``; block-sparse kernels such as ``flex_attention`` evaluate the mask from it).

Not the generation's KV cache: the update needs the prompt's activations under the adapter being TRAINED and
their gradient; a cache from sampling carries neither.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

__all__ = ["PackedRows", "pack_prefix_shared", "padded_tokens", "prefix_shared_tokens", "prompt_groups"]


@dataclass
class PackedRows:
    """A packed forward pass: inputs for the decoder and where each completion token's predictor sits.

    Attributes:
        input_ids: ``[R, L]`` token ids (0 on padding).
        position_ids: ``[R, L]`` positions (0 on padding).
        attention_mask: ``[R, 1, L, L]`` additive mask (module docstring), in the requested dtype; built on
            first access (a property: the tree layout's attention never reads it).
        row: ``[n]`` the packed row of each input rollout.
        prompt_last: ``[n]`` column of the last prompt token of each rollout's prompt (predicts completion
            token 0).
        completion_start: ``[n]`` column of each rollout's first completion token (completion token t >= 1 is
            predicted by column ``completion_start + t - 1``).
        tokens: ``R * L``, the token slots the forward pass processes (padding included).
        real_tokens: the non-padding tokens among them.
        blocks: per packed row, its query blocks ``(start, end, ancestors)`` in column order, covering the
            row's real tokens: the tokens of columns ``start .. end-1`` see the columns of every
            ``(a, b)`` range in ``ancestors`` and, causally, their own block (column ``q`` sees ``start .. q``).
            The same visibility as ``attention_mask`` in a form that costs no ``L x L`` work
            (``agents.tree_attention``); a row's columns from ``pad_start[r]`` on are padding.
        pad_start: ``[R]`` list, the first padding column of each row (``L`` when the row is full).
        prompt_ranges: per rollout, the column ranges (in its row, in position order) holding its prompt's
            tokens: the key/value columns a decode cache of that prompt gathers (``agents.generation``).
    """

    input_ids: Tensor
    position_ids: Tensor
    row: Tensor
    prompt_last: Tensor
    completion_start: Tensor
    tokens: int
    real_tokens: int
    blocks: list[list[tuple[int, int, tuple[tuple[int, int], ...]]]]
    pad_start: list[int]
    prompt_ranges: list[tuple[tuple[int, int], ...]]
    _mask_of: tuple = field(default=(), repr=False)  # (node_of, parents, dtype, device): the mask's inputs

    @cached_property
    def attention_mask(self) -> Tensor:
        """The additive ``[R, 1, L, L]`` tree mask (module docstring), built on first access."""
        node_of, parents, dtype, device = self._mask_of
        return _tree_mask(node_of, parents, self.position_ids.cpu(), dtype).to(device)

    @cached_property
    def key_end(self) -> Tensor:
        """``[R, L]`` long: key column ``k`` is seen by the query columns ``k <= q < key_end[r, k]`` (module
        docstring): the largest block end among the blocks that see it (its own block's and those whose
        ancestor ranges hold it); ``k + 1`` for a padding column."""
        R, L = self.input_ids.shape
        end = torch.arange(1, L + 1).repeat(R, 1)
        for r, blocks in enumerate(self.blocks):
            for s, e, anc in blocks:
                for a, b in (*anc, (s, e)):
                    end[r, a:b] = end[r, a:b].clamp(min=e)
        return end.to(self.input_ids.device)

    def predictor_index(self, b_idx: Tensor, t_idx: Tensor) -> tuple[Tensor, Tensor]:
        """``(rows, cols)`` of the hidden states that predict completion token ``t_idx`` of rollout ``b_idx``."""
        cols = torch.where(t_idx == 0, self.prompt_last[b_idx], self.completion_start[b_idx] + t_idx - 1)
        return self.row[b_idx], cols


def prompt_groups(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices of equal prompts, grouped; groups in order of first appearance, indices ascending."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    return list(groups.values())


@dataclass
class _Node:
    """A run of prompt tokens shared by every prompt below it (a radix-tree node)."""

    tokens: list[int]
    start: int  # position of tokens[0]
    ends: list[int]  # rollouts whose prompt ends with this node
    children: list[_Node]


def _radix(prompts: Sequence[Sequence[int]], idxs: list[int], depth: int) -> list[_Node]:
    """The radix tree of ``prompts[i][depth:]`` for ``i in idxs`` (all sharing ``[:depth]``), one root per
    distinct next token, in order of first appearance."""
    parts: dict[int, list[int]] = {}
    for i in idxs:
        parts.setdefault(prompts[i][depth], []).append(i)
    nodes = []
    for part in parts.values():
        first = prompts[part[0]]
        end = min(len(prompts[i]) for i in part)
        lcp = depth + 1
        while lcp < end and all(prompts[i][lcp] == first[lcp] for i in part):
            lcp += 1
        ends = [i for i in part if len(prompts[i]) == lcp]
        rest = [i for i in part if len(prompts[i]) > lcp]
        nodes.append(_Node(list(first[depth:lcp]), depth, ends, _radix(prompts, rest, lcp) if rest else []))
    return nodes


def _tree_tokens(node: _Node, completions: Sequence[Sequence[int]]) -> int:
    return (
        len(node.tokens)
        + sum(len(completions[i]) for i in node.ends)
        + sum(_tree_tokens(c, completions) for c in node.children)
    )


def prefix_shared_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Prompt tokens once every common prefix is shared: the size of the prompts' radix tree."""

    def size(n: _Node) -> int:
        return len(n.tokens) + sum(size(c) for c in n.children)

    return sum(size(n) for n in _radix(prompts, list(range(len(prompts))), 0)) if prompts else 0


def padded_tokens(lengths: Sequence[int]) -> int:
    """Token slots of the padded layout for rollouts of total lengths ``lengths``: rows x longest."""
    return len(lengths) * max(lengths) if lengths else 0


def pack_prefix_shared(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    groups: Sequence[Hashable] | None = None,
    row_capacity: int | None = None,
) -> PackedRows:
    """Pack rollouts ``(prompts[i], completions[i])`` prefix-shared and unpadded (module docstring).

    ``row_capacity``: the rows' capacity in tokens when it exceeds the largest tree (default: the largest tree),
    so that trees whose sum fits share one row (``agents.forward`` plans micro-batches under a row cap so).

    ``groups``: rollouts of different groups never share a node or a row (the generation's prefill packs the
    prompts of several adapters at once: a row runs under one adapter, and equal tokens under different
    adapters have different keys and values). Rows are the groups' rows in order of first appearance.

    Raises:
        ValueError: lengths differ or a prompt is empty (its first completion token would have no predictor).
    """
    _check_rollouts(prompts, completions, groups)
    members: dict[Hashable, list[int]] = {}
    for i in range(len(prompts)):
        members.setdefault(None if groups is None else groups[i], []).append(i)
    trees: list[_Node] = []
    tree_group: list[int] = []
    for g, idxs in enumerate(members.values()):
        for t in _radix(prompts, idxs, 0):
            trees.append(t)
            tree_group.append(g)
    seg_len = [_tree_tokens(t, completions) for t in trees]
    rows, width = _bin_pack(seg_len, tree_group, len(members), row_capacity)
    lay = _Layout(len(rows), width, len(prompts))
    for r, segs in enumerate(rows):
        lay.place_row(r, [trees[s] for s in segs], completions)
    return PackedRows(
        input_ids=lay.ids.to(device),
        position_ids=lay.pos.to(device),
        row=torch.tensor(lay.row_of, dtype=torch.long, device=device),
        prompt_last=torch.tensor(lay.plast, dtype=torch.long, device=device),
        completion_start=torch.tensor(lay.cstart, dtype=torch.long, device=device),
        tokens=lay.ids.shape[0] * width,
        real_tokens=lay.real,
        blocks=lay.blocks,
        pad_start=lay.pad_start,
        prompt_ranges=lay.prompt_ranges,
        _mask_of=(lay.node_of, lay.parents, dtype, device),
    )


def _check_rollouts(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                    groups: Sequence[Hashable] | None) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"rollout {i} has an empty prompt: its first token would have no context")
    if groups is not None and len(groups) != len(prompts):
        raise ValueError(f"{len(groups)} groups for {len(prompts)} rollouts")


def _bin_pack(seg_len: Sequence[int], tree_group: Sequence[int], n_groups: int,
              row_capacity: int | None = None) -> tuple[list[list[int]], int]:
    """The trees of each row (indices into ``seg_len``, the trees' token counts) and the rows' width: first-fit
    decreasing within each group, into rows as long as the largest tree or ``row_capacity`` if larger (stable:
    equal lengths keep their order, so the layout is deterministic). The width is the longest row's tokens."""
    capacity = max(seg_len) if seg_len else 1
    if row_capacity is not None:
        capacity = max(capacity, row_capacity)
    rows: list[list[int]] = []  # tree indices per row
    free: list[int] = []
    for g in range(n_groups):
        first = len(rows)
        for s in sorted((s for s in range(len(seg_len)) if tree_group[s] == g), key=lambda s: -seg_len[s]):
            for r in range(first, len(rows)):
                if seg_len[s] <= free[r]:
                    rows[r].append(s)
                    free[r] -= seg_len[s]
                    break
            else:
                rows.append([s])
                free.append(capacity - seg_len[s])
    return rows, max(1, max((capacity - f for f in free), default=1))


class _Layout:
    """The packed rows being filled: token ids, positions and node of every column, the nodes' parents, each
    rollout's row and predictor columns, the query blocks (:class:`PackedRows`)."""

    def __init__(self, n_rows: int, width: int, n: int) -> None:
        R = max(1, n_rows)
        self.ids = torch.zeros(R, width, dtype=torch.long)
        self.pos = torch.zeros(R, width, dtype=torch.long)
        self.node_of = torch.full((R, width), -1, dtype=torch.long)  # -1: padding
        self.parents: list[int] = []  # node id -> parent node id (-1 for a root)
        self.row_of = [0] * n
        self.plast = [0] * n
        self.cstart = [0] * n
        self.real = 0
        self.blocks: list[list[tuple[int, int, tuple[tuple[int, int], ...]]]] = [[] for _ in range(R)]
        self.pad_start = [width] * R
        self.prompt_ranges: list[tuple[tuple[int, int], ...]] = [()] * n

    def _add_block(self, r: int, start: int, end: int, anc: tuple[tuple[int, int], ...]) -> None:
        """Append a query block; a block that continues the previous one below it (its ancestors are the
        previous block's plus the previous block itself) merges into it: one causal run, same visibility."""
        if end <= start:
            return
        if self.blocks[r]:
            s0, e0, a0 = self.blocks[r][-1]
            if e0 == start and anc == (*a0, (s0, e0)):
                self.blocks[r][-1] = (s0, end, a0)
                return
        self.blocks[r].append((start, end, anc))

    def _new_node(self, parent: int) -> int:
        self.parents.append(parent)
        return len(self.parents) - 1

    def _put(self, r: int, col: int, tokens: Sequence[int], start: int, node: int) -> None:
        k = len(tokens)
        self.ids[r, col : col + k] = torch.tensor(list(tokens), dtype=torch.long)
        self.pos[r, col : col + k] = torch.arange(start, start + k)
        self.node_of[r, col : col + k] = node

    def place_row(self, r: int, trees: Sequence[_Node], completions: Sequence[Sequence[int]]) -> None:
        """Lay ``trees`` out in row ``r``, depth-first; every token's column is fixed here, the order is free
        (the mask decides what sees what)."""
        col = 0
        stack: list[tuple[_Node, int, tuple[tuple[int, int], ...]]] = [(t, -1, ()) for t in reversed(trees)]
        while stack:
            node, parent, anc = stack.pop()
            nid = self._new_node(parent)
            k = len(node.tokens)
            self._put(r, col, node.tokens, node.start, nid)
            self._add_block(r, col, col + k, anc)
            path = (*anc, (col, col + k))  # what a token below this node sees above it
            last, P = col + k - 1, node.start + k
            col += k
            for i in node.ends:  # each completion: a leaf under the node its prompt ends in
                c = completions[i]
                self.row_of[i], self.plast[i], self.cstart[i] = r, last, col
                self.prompt_ranges[i] = path
                if c:
                    self._put(r, col, c, P, self._new_node(nid))
                    self._add_block(r, col, col + len(c), path)
                col += len(c)
            stack.extend((child, nid, path) for child in reversed(node.children))
        self.real += col
        self.pad_start[r] = col


def _tree_mask(node_of: Tensor, parents: Sequence[int], pos: Tensor, dtype: torch.dtype) -> Tensor:
    """The additive ``[R, 1, L, L]`` mask: query q sees key k iff k's node is q's or an ancestor of it and
    ``pos(k) <= pos(q)``; a padding column sees only itself."""
    L = node_of.shape[1]
    N = len(parents)  # ancestor-or-self relation between nodes, plus one row/column for padding (related to nothing)
    anc = torch.zeros(N + 1, N + 1, dtype=torch.bool)
    for v in range(N):
        u = v
        while u != -1:
            anc[v, u] = True
            u = parents[u]
    nodes = torch.where(node_of < 0, N, node_of)
    allowed = anc[nodes[:, :, None], nodes[:, None, :]] & (pos[:, None, :] <= pos[:, :, None])
    allowed |= torch.eye(L, dtype=torch.bool).unsqueeze(0) & (node_of < 0).unsqueeze(-1)  # padding: itself
    mask = torch.zeros(node_of.shape[0], 1, L, L, dtype=dtype)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    return mask
