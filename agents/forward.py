"""The forward passes of a policy-gradient update: log-probs and entropies of rollouts' completion tokens.

What the trainer (``agents.trainer``) asks of the model, and nothing of the algorithm: given a batch of
rollouts (:class:`RolloutBatch`, :func:`pack_rollouts`) and the rows of one micro-batch, the log-probs
``log pi(c_t | prompt, c_<t)`` and entropies ``H_t`` of their completion tokens, ``[rows, Tc]``, zero on
padding; which rows share a forward pass (:meth:`PolicyForward.micro_batches`); the same without grad, for the
behaviour and reference policies (:meth:`PolicyForward.logprobs_no_grad`). Each step is one seam:

1. **Layout** (``TrainerConfig.packing``): ``"prefix"`` lays a micro-batch out prefix-shared and unpadded
   (:func:`agents.packing.pack_prefix_shared`: every common prompt prefix once, completions as leaves, trees
   bin-packed into rows, explicit position ids and a tree attention mask), ``"none"`` as one right-padded row
   per rollout. The two give the same log-probs up to float summation order (a causal model's prefix
   activations do not depend on what follows; tests/agents/test_packing.py). Models whose attention takes no
   4D mask (flash-attention kernels) keep the padded layout (:attr:`PolicyForward.packs_prefix`).
   ``_packed_hidden`` / ``_padded_hidden`` return the hidden states that predict the completion tokens.
2. **Attention** (``TrainerConfig.packed_attention``, :meth:`PolicyForward.attention`): over a packed row,
   ``"tree"`` runs :mod:`agents.tree_attention` (each query block over its ancestor columns only; on CUDA the
   within-block mask is a causal bias that the flash kernel takes), ``"flex"`` one ``flex_attention`` call
   with the tree's block mask (compiled on CUDA; no backward on CPU), ``"mask"`` one dense SDPA call with the
   ``L x L`` additive mask; the same values up to float summation order. Only ``"mask"`` builds the mask: the
   others hand the decoder :func:`agents.tree_attention.placeholder_mask`.
3. **Log-probs** (:meth:`PolicyForward.completion_logprobs`): the LM head, log-softmax and entropy run on the
   gathered hidden states only (prompts cost no logits), in chunks of ``logprob_chunk_size`` tokens under
   activation checkpointing, so full-vocabulary logits never exist for the whole batch at once; a micro-batch
   of one chunk skips the checkpoint (its logits exist during its backward pass either way)::

       lp_t = z_t[c_t] - logsumexp(z_t),   H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}

   with ``z_t`` the float32 logits of the position that predicts ``c_t``.
4. **Planning** (:meth:`PolicyForward.micro_batches`): at most ``micro_batch_size`` rollouts per pass; packed,
   rows sorted by prompt so that attempts at one prompt (and prompts with a common beginning) share a pass;
   padded, longest first so that a pass pads little. With ``max_tokens_per_row`` (``TrainerConfig``), a pass
   also holds at most that many token slots: a micro-batch closes before the rollout that would take its
   packed row (every prompt prefix once, plus the completions) or its padded rows past the cap, and its trees
   share one row of at most the cap (``pack_prefix_shared(row_capacity=...)``), so a pass's activations are
   bounded by the cap. A single rollout longer than the cap is a pass of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agents.models import activation_dtype
from agents.packing import pack_prefix_shared, prefix_shared_tokens
from agents.rollout import Rollout
from agents.tree_attention import (
    TREE_ATTENTION,
    placeholder_mask,
    takes_tree_mask,
    tree_attention,
    tree_block_mask,
)

__all__ = ["PolicyForward", "RolloutBatch", "pack_rollouts", "rollout_logprobs", "sampled_logprobs"]


@dataclass
class RolloutBatch:
    """An update's rollouts as token lists and ``[B, Tc]`` completion-aligned tensors (``Tc``: the longest
    completion)."""

    prompts: list[list[int]]
    completions: list[list[int]]
    mask: Tensor  # [B, Tc] float, 1 on completion tokens
    targets: Tensor  # [B, Tc] long, the completion tokens (0 on padding)

    @property
    def size(self) -> int:
        return len(self.prompts)


def pack_rollouts(rollouts: Sequence[Rollout]) -> RolloutBatch:
    """The :class:`RolloutBatch` of ``rollouts``; a rollout with an empty prompt is refused (its first
    completion token would have no context)."""
    prompts, comps = [], []
    for i, r in enumerate(rollouts):
        if len(r.prompt_ids) == 0:
            raise ValueError(f"rollout {i} has an empty prompt: its first token would have no context")
        prompts.append([int(t) for t in r.prompt_ids])
        comps.append([int(t) for t in r.completion_ids])
    Tc = max(1, max(len(c) for c in comps))
    mask = torch.zeros(len(comps), Tc)
    targets = torch.zeros(len(comps), Tc, dtype=torch.long)
    for i, c in enumerate(comps):
        mask[i, : len(c)] = 1.0
        targets[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    return RolloutBatch(prompts, comps, mask, targets)


def sampled_logprobs(rollouts: Sequence[Rollout], batch: RolloutBatch, need: str | None = None
                     ) -> tuple[Tensor | None, list[bool]]:
    """The log-probs the generator sampled the rollouts with (``Rollout.logprobs``), ``[B, Tc]`` like
    ``batch.mask``, and per row whether it carries them aligned with its completion (``None`` for the tensor when
    no row does). ``need``: why every row must carry them (the error's opening); a missing or misaligned list is
    then refused naming the rollout. The one place an update reads the behaviour log-probs (the ratio's
    denominator, the mismatch, the importance correction; ``agents.trainer``)."""
    has = [r.logprobs is not None and len(r.logprobs) == len(r.completion_ids) for r in rollouts]
    if need is not None and not all(has):
        i = has.index(False)
        got = "no logprobs" if rollouts[i].logprobs is None else f"{len(rollouts[i].logprobs)} logprobs"
        raise ValueError(f"{need}: rollout {i} has {got} for {len(rollouts[i].completion_ids)} completion tokens")
    if not any(has):
        return None, has
    out = torch.zeros_like(batch.mask)
    for i, r in enumerate(rollouts):
        if has[i]:
            out[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=out.dtype)
    return out, has


def rollout_logprobs(rollouts: Sequence[Rollout], batch: RolloutBatch) -> Tensor:
    """:func:`sampled_logprobs` of rollouts that must all carry them, ``[B, Tc]``."""
    lp, _has = sampled_logprobs(rollouts, batch, need="the ratio needs the behaviour log-probs")
    return torch.zeros_like(batch.mask) if lp is None else lp


class PolicyForward:
    """The forward passes of updates over ``population``'s model (the active member's LoRA acts; module
    docstring for the steps).

    Args:
        population: an ``agents.population.LoRAPopulation`` (``model``, ``disabled``).
        packing: ``"prefix"`` or ``"none"`` (``TrainerConfig.packing``).
        packed_attention: ``"tree"``, ``"flex"`` or ``"mask"`` (``TrainerConfig.packed_attention``).
        micro_batch_size: most rollouts per pass.
        logprob_chunk_size: completion tokens per LM-head chunk.
        max_tokens_per_row: most token slots per pass (None: no bound; module docstring, step 4).
    """

    def __init__(self, population, packing: str = "prefix", packed_attention: str = "tree",
                 micro_batch_size: int = 8, logprob_chunk_size: int = 1024,
                 max_tokens_per_row: int | None = None) -> None:
        self.population = population
        self.packing = packing
        self.packed_attention = packed_attention
        self.micro_batch_size = micro_batch_size
        self.logprob_chunk_size = logprob_chunk_size
        self.max_tokens_per_row = max_tokens_per_row
        self.forward_tokens = 0
        """Token slots processed by the decoder's forward passes so far (padding included)."""
        self.largest_pass = 0
        """The most token slots one forward pass has held so far (what bounds its activations)."""

    # ------------------------------------------------------------------------------------ the model
    @property
    def causal_lm(self) -> nn.Module:
        model = self.population.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def device(self) -> torch.device:
        return next(self.population.model.parameters()).device

    @property
    def packs_prefix(self) -> bool:
        """True when passes use the prefix-shared layout (``packing == "prefix"`` and an attention
        implementation that takes a 4D additive mask: eager or SDPA)."""
        return self.packing == "prefix" and takes_tree_mask(self.causal_lm)

    @property
    def tree(self) -> bool:
        """Packed passes run :mod:`agents.tree_attention` (``packed_attention`` ``"tree"`` or ``"flex"``)."""
        return self.packs_prefix and self.packed_attention in ("tree", "flex")

    def attention(self):
        """The context the update's passes run in: tree attention for packed rows (checkpointing's
        recomputation in the backward pass runs inside it too), else nothing."""
        return tree_attention(self.causal_lm) if self.tree else nullcontext()

    @contextmanager
    def training(self, gradient_checkpointing: bool) -> Iterator[None]:
        """The model in training mode (decoder activations recomputed in the backward pass with
        ``gradient_checkpointing``; left on once enabled) and :meth:`attention`; the mode restored on exit."""
        model = self.population.model
        was_training = model.training
        if gradient_checkpointing and not _checkpointing_on(self.causal_lm):
            _enable_checkpointing(self.causal_lm)
        model.train()
        try:
            with self.attention():
                yield
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------------------ log-probs
    def logprobs(self, batch: RolloutBatch, rows: Sequence[int], ent_grad: bool = False) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies ``[len(rows), Tc]`` (zero on padding) of the completion tokens of ``rows``
        in one pass (steps 1-3 of the module docstring); ``ent_grad``: the entropies carry a gradient."""
        device = self.device
        rows = list(rows)
        mask = batch.mask[rows].to(device)
        b_idx, t_idx = mask.bool().nonzero(as_tuple=True)
        targets = batch.targets[rows].to(device)[b_idx, t_idx]
        lp = torch.zeros(len(rows), mask.shape[1], device=device)
        ent = torch.zeros(len(rows), mask.shape[1], device=device)
        if b_idx.numel() == 0:
            return lp, ent
        if self.packs_prefix:
            h_sel = self._packed_hidden(batch, rows, b_idx, t_idx)
        else:
            h_sel = self._padded_hidden(batch, rows, b_idx, t_idx)
        lps, ents = self.completion_logprobs(h_sel, targets, ent_grad)
        return lp.index_put((b_idx, t_idx), lps), ent.index_put((b_idx, t_idx), ents)

    def _packed_hidden(self, batch: RolloutBatch, rows: list[int], b_idx: Tensor, t_idx: Tensor) -> Tensor:
        """The prefix-shared layout: the hidden states that predict completion token ``t_idx`` of row
        ``b_idx`` (indices into ``rows``), ``[n, d]``."""
        dtype, device = activation_dtype(self.causal_lm), self.device
        cap = {} if self.max_tokens_per_row is None else {"row_capacity": self.max_tokens_per_row}
        packed = pack_prefix_shared([batch.prompts[i] for i in rows], [batch.completions[i] for i in rows],
                                    dtype=dtype, device=device, **cap)
        if not self.tree:
            hidden = self._hidden(packed.input_ids, packed.attention_mask, packed.position_ids)
        else:  # the blocks (or their flex block mask) carry the tree
            tree = ({"tree_block_mask": tree_block_mask(packed.key_end)} if self.packed_attention == "flex" else
                    {"tree_blocks": packed.blocks, "tree_pad_start": packed.pad_start})
            # inside :meth:`attention` every attention call reads them, so the decoder gets a one-element mask;
            # a caller outside it runs the model's own attention, which needs the dense mask
            inside = getattr(self.causal_lm.config, "_attn_implementation", None) == TREE_ATTENTION
            mask = (placeholder_mask(*packed.input_ids.shape, dtype=dtype, device=device) if inside
                    else packed.attention_mask)
            hidden = self._hidden(packed.input_ids, mask, packed.position_ids, **tree)
        self.forward_tokens += packed.tokens
        self.largest_pass = max(self.largest_pass, packed.tokens)
        return hidden[packed.predictor_index(b_idx, t_idx)]

    def _padded_hidden(self, batch: RolloutBatch, rows: list[int], b_idx: Tensor, t_idx: Tensor) -> Tensor:
        """The padded layout (one right-padded ``prompt + completion`` row per rollout): the hidden states that
        predict completion token ``t_idx`` of row ``b_idx``, ``[n, d]``."""
        device = self.device
        seqs = [batch.prompts[i] + batch.completions[i] for i in rows]
        S = max(len(s) for s in seqs)
        input_ids = torch.zeros(len(rows), S, dtype=torch.long, device=device)
        attn = torch.zeros(len(rows), S, dtype=torch.long, device=device)
        for j, s in enumerate(seqs):
            input_ids[j, : len(s)] = torch.tensor(s, dtype=torch.long, device=device)
            attn[j, : len(s)] = 1
        plen = torch.tensor([len(batch.prompts[i]) for i in rows], device=device)
        pos = plen[b_idx] - 1 + t_idx  # the position whose logits predict completion token t
        hidden = self._hidden(input_ids, attn)
        self.forward_tokens += len(rows) * S
        self.largest_pass = max(self.largest_pass, len(rows) * S)
        return hidden[b_idx, pos]

    def _hidden(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None,
                **kwargs) -> Tensor:
        """The decoder's last hidden states; ``kwargs`` go to the decoder's forward (and from there to every
        attention call: the tree blocks of a packed layout)."""
        lm = self.causal_lm
        backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def completion_logprobs(self, h_sel: Tensor, targets: Tensor, ent_grad: bool) -> tuple[Tensor, Tensor]:
        """``(lp, H)`` ``[n]`` of the tokens ``targets`` ``[n]`` predicted by the hidden states ``h_sel``
        ``[n, d]``, chunk by chunk (module docstring, step 3)."""
        lps, ents = [], []
        n = self.logprob_chunk_size
        # checkpointed chunks keep one chunk's logits alive at a time; with a single chunk there is nothing to
        # bound (its logits exist during the backward pass either way), so it skips the recomputation
        recompute = torch.is_grad_enabled() and h_sel.shape[0] > n
        for k in range(0, h_sel.shape[0], n):
            h, tg = h_sel[k : k + n], targets[k : k + n]
            if recompute:
                a, e = checkpoint(self._chunk_lp_ent, h, tg, ent_grad, use_reentrant=False)
            else:
                a, e = self._chunk_lp_ent(h, tg, ent_grad)
            lps.append(a)
            ents.append(e)
        return torch.cat(lps), torch.cat(ents)

    def _chunk_lp_ent(self, h: Tensor, targets: Tensor, ent_grad: bool) -> tuple[Tensor, Tensor]:
        logits = _logits(self.causal_lm, h)
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        with torch.set_grad_enabled(ent_grad and torch.is_grad_enabled()):
            z = logits if ent_grad else logits.detach()
            ent = (lse if ent_grad else lse.detach()) - (torch.softmax(z, dim=-1) * z).sum(-1)
        return lp, ent

    @torch.no_grad()
    def logprobs_no_grad(self, batch: RolloutBatch, reference: bool,
                         minis: Sequence[Sequence[int]] | None = None) -> Tensor:
        """Log-probs ``[B, Tc]`` of ``batch`` without grad: of the base (``reference``: adapters disabled) or
        the active member; over the whole batch's micro-batches, or over those of each mini-batch in
        ``minis`` (laid out as that mini-batch's steps lay it out; rows outside stay 0)."""
        out = torch.zeros_like(batch.mask)
        micros = ([m for rows in minis for m in self.micro_batches(batch, rows)] if minis is not None
                  else self.micro_batches(batch))
        for rows in micros:
            with self.population.disabled() if reference else nullcontext():
                lp, _ = self.logprobs(batch, rows)
            out[rows] = lp.to(out.device)
        return out

    # ------------------------------------------------------------------------------- planning
    def micro_batches(self, batch: RolloutBatch, rows: Sequence[int] | None = None) -> list[list[int]]:
        """The rows of each pass, at most ``micro_batch_size`` rollouts and ``max_tokens_per_row`` token slots
        each (module docstring, step 4)."""
        rows = list(range(batch.size)) if rows is None else list(rows)
        mb = self.micro_batch_size
        if self.packs_prefix:
            order = sorted(rows, key=lambda i: (batch.prompts[i], i))
        else:
            order = sorted(rows, key=lambda i: -(len(batch.prompts[i]) + len(batch.completions[i])))
        if self.max_tokens_per_row is None:
            return [order[k : k + mb] for k in range(0, len(order), mb)]
        passes: list[list[int]] = []
        for i in order:
            if passes and len(passes[-1]) < mb and self.pass_tokens(batch, [*passes[-1], i]) <= self.max_tokens_per_row:
                passes[-1].append(i)
            else:
                passes.append([i])
        return passes

    def pass_tokens(self, batch: RolloutBatch, rows: Sequence[int]) -> int:
        """Token slots of one pass over ``rows``: packed, every prompt prefix once plus the completions (one row
        under a row cap); padded, rows x the longest ``prompt + completion``."""
        if self.packs_prefix:
            return prefix_shared_tokens([batch.prompts[i] for i in rows]) + sum(len(batch.completions[i]) for i in rows)
        return len(rows) * max(len(batch.prompts[i]) + len(batch.completions[i]) for i in rows)


def _logits(lm: nn.Module, h: Tensor) -> Tensor:
    """Float32 logits of the hidden states ``h``: the LM head, and the few architectures' extra scaling
    (Gemma 2/3 soft-capping, Granite, Cohere)."""
    logits = lm.get_output_embeddings()(h).float()
    cfg = getattr(lm, "config", None)
    softcap = getattr(cfg, "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    scaling = getattr(cfg, "logits_scaling", None)
    if scaling:
        logits = logits / scaling
    scale = getattr(cfg, "logit_scale", None)
    if scale:
        logits = logits * scale
    return logits


def _checkpointing_on(model: nn.Module) -> bool:
    if getattr(type(model), "is_activation_checkpointing", None) is not None:  # transformers >= 5
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _enable_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}  # works with frozen embeddings (no input grads needed)
    if hasattr(type(model), "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
