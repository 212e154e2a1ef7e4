"""Prefix-shared, unpadded packing of ``[prompt | completion]`` rollouts for one forward pass.

Students' attempts at one task repeat the task's prompt, and prompts are most of an update's tokens. The
trainer's padded layout (one row per rollout, ``prompt + completion`` right-padded to the micro-batch's
longest) forwards every prompt once per attempt and forwards the padding too. :func:`pack_prefix_shared`
instead lays out each UNIQUE prompt once, followed by all its completions, as one *segment*::

    segment = [p_1 .. p_P | c^1_1 .. c^1_{n_1} | c^2_1 .. c^2_{n_2} | ...]
    position  0 .. P-1    | P .. P+n_1-1       | P .. P+n_2-1       | ...

and bin-packs the segments into rows (first-fit decreasing; the row capacity is the longest segment), so
padding appears only at the end of the few rows that the segments do not fill. A 4D attention mask makes the
computation equal to the padded one: query token q may attend to key token k iff both lie in the same segment,
``pos(k) <= pos(q)``, and k is a prompt token or a token of q's own completion (``branch(k) in {0,
branch(q)}``). So a prompt token sees its prompt's causal prefix only (completions start at position P), and a
completion token sees the whole prompt and its own earlier tokens, never a sibling completion. Position ids
are explicit (each completion continues at the prompt's length), so rotary embeddings see exactly the
positions of the padded layout. Padding tokens form singleton segments (each attends only to itself), so no
softmax row is empty.

The gradient is the same: in the padded layout the prompt's activations are computed once per attempt and
each copy receives its attempt's gradient; here one copy receives the sum of them (the chain rule through a
shared node). Only float summation order differs (tests/agents/test_packing.py pins the tolerance).

The mask is additive (0 where allowed, the dtype's most negative finite value elsewhere) in the model's
dtype, shape ``[R, 1, L, L]``: transformers passes a 4D mask through unchanged (``masking_utils``: "If the
mask is already 4D, simply return as-is") to the eager path (adds it to the scores) and to SDPA (an additive
float ``attn_mask``). Flash-attention kernels take no such mask; the trainer keeps the padded layout
(``TrainerConfig.packing = "none"``) for those.

Not the generation's KV cache: the update needs the prompt's activations under the adapter being TRAINED and
their gradient; a cache from sampling carries neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedRows", "pack_prefix_shared", "padded_tokens", "prompt_groups"]


@dataclass
class PackedRows:
    """A packed forward pass: inputs for the decoder and where each completion token's predictor sits.

    Attributes:
        input_ids: ``[R, L]`` token ids (0 on padding).
        position_ids: ``[R, L]`` positions (0 on padding).
        attention_mask: ``[R, 1, L, L]`` additive mask (module docstring), in the requested dtype.
        row: ``[n]`` the packed row of each input rollout.
        prompt_last: ``[n]`` column of the last prompt token of each rollout's prompt (predicts completion
            token 0).
        completion_start: ``[n]`` column of each rollout's first completion token (completion token t >= 1 is
            predicted by column ``completion_start + t - 1``).
        tokens: ``R * L``, the token slots the forward pass processes (padding included).
        real_tokens: the non-padding tokens among them.
    """

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor
    row: Tensor
    prompt_last: Tensor
    completion_start: Tensor
    tokens: int
    real_tokens: int

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


def padded_tokens(lengths: Sequence[int]) -> int:
    """Token slots of the padded layout for rollouts of total lengths ``lengths``: rows x longest."""
    return len(lengths) * max(lengths) if lengths else 0


def pack_prefix_shared(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> PackedRows:
    """Pack rollouts ``(prompts[i], completions[i])`` prefix-shared and unpadded (module docstring).

    Raises:
        ValueError: lengths differ or a prompt is empty (its first completion token would have no predictor).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    n = len(prompts)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"rollout {i} has an empty prompt: its first token would have no context")
    groups = prompt_groups(prompts)
    seg_len = [len(prompts[g[0]]) + sum(len(completions[i]) for i in g) for g in groups]
    capacity = max(seg_len) if seg_len else 1

    # first-fit decreasing (stable: equal lengths keep their order, so the layout is deterministic)
    rows: list[list[int]] = []  # segment indices per row
    free: list[int] = []
    for s in sorted(range(len(groups)), key=lambda s: -seg_len[s]):
        for r, room in enumerate(free):
            if seg_len[s] <= room:
                rows[r].append(s)
                free[r] -= seg_len[s]
                break
        else:
            rows.append([s])
            free.append(capacity - seg_len[s])
    R = max(1, len(rows))
    L = max(1, max((capacity - f for f in free), default=1))

    ids = torch.zeros(R, L, dtype=torch.long)
    pos = torch.zeros(R, L, dtype=torch.long)
    seg = -1 - torch.arange(R * L, dtype=torch.long).view(R, L)  # padding: a singleton segment per slot
    branch = torch.zeros(R, L, dtype=torch.long)
    row_of = [0] * n
    plast = [0] * n
    cstart = [0] * n
    real = 0
    for r, segs in enumerate(rows):
        col = 0
        for s in segs:
            g = groups[s]
            p = prompts[g[0]]
            P = len(p)
            ids[r, col : col + P] = torch.tensor(list(p), dtype=torch.long)
            pos[r, col : col + P] = torch.arange(P)
            seg[r, col : col + seg_len[s]] = s
            last = col + P - 1
            col += P
            for k, i in enumerate(g, start=1):
                c = completions[i]
                row_of[i], plast[i], cstart[i] = r, last, col
                if c:
                    ids[r, col : col + len(c)] = torch.tensor(list(c), dtype=torch.long)
                    pos[r, col : col + len(c)] = torch.arange(P, P + len(c))
                    branch[r, col : col + len(c)] = k
                col += len(c)
            real += seg_len[s]

    allowed = (
        (seg[:, :, None] == seg[:, None, :])
        & (pos[:, None, :] <= pos[:, :, None])
        & ((branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None]))
    )
    mask = torch.zeros(R, 1, L, L, dtype=dtype)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    return PackedRows(
        input_ids=ids.to(device),
        position_ids=pos.to(device),
        attention_mask=mask.to(device),
        row=torch.tensor(row_of, dtype=torch.long, device=device),
        prompt_last=torch.tensor(plast, dtype=torch.long, device=device),
        completion_start=torch.tensor(cstart, dtype=torch.long, device=device),
        tokens=R * L,
        real_tokens=real,
    )
