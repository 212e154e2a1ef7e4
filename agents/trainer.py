"""Policy-gradient updates of one population member (a LoRA adapter) from its rollouts.

One call ``PolicyGradientTrainer(population, config).update(member, rollouts)``:

1. packs every rollout's ``[prompt | completion]`` tokens and the completion tokens' mask; forward passes lay
   them out prefix-shared and unpadded (``packing="prefix"``, ``agents.packing``: every common prompt prefix
   of a micro-batch once, a tree attention mask) or as right-padded rows (``packing="none"``), with the same
   gradient up to float summation order;
2. computes the advantages over the WHOLE batch with the configured estimator (``agents.advantages``;
   baseline groups = ``Rollout.group``, whitening scopes = ``Rollout.scope``), after the optional KL-in-reward
   term ``-beta * KL_est(lp_behaviour - lp_ref)`` per token;
3. for each epoch and each mini-batch (default: the whole batch, i.e. one optimizer step per epoch) sums the
   gradients of micro-batches, each loss normalised with the mini-batch's GLOBAL token / sequence counts
   (so the accumulated gradient equals the full mini-batch gradient for every aggregation mode), clips the
   gradient norm over the member's parameters, and takes one AdamW step with the member's own optimizer.

The loss is ``agents.losses.policy_loss``: l_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t),
aggregated, minus ``entropy_coef`` * entropy, plus ``kl_coef`` * KL (KL-as-loss mode).

Behaviour log-probs (the rho denominator): with one optimizer step per batch (``epochs == 1`` and one
mini-batch) the policy being trained IS the policy that sampled (on-policy), so the trainer uses the detached
log-probs of the same forward pass: rho == 1, clipping inert, exactly AZR's update. With several steps it
needs the log-probs of the policy before the first step: the first mini-batch's come from its own first
forward pass (detached: nothing has stepped yet, so rho == 1 there exactly), every other mini-batch's from a
no-grad pass before the first step, laid out as that mini-batch's steps lay it out (the same micro-batches);
with the KL-in-reward term, which needs them for the advantages, all of them come from that no-grad pass. ``use_behaviour_logprobs=True``
uses ``Rollout.logprobs`` (the generator's, e.g. vLLM's) instead, which also corrects generator/trainer
numerical mismatch.

Log-probs are taken at the completion positions only: the decoder's hidden states are gathered at the
positions that predict completion tokens, then the LM head, log-softmax and entropy run over chunks of
``logprob_chunk_size`` tokens under activation checkpointing, so full-vocabulary logits never exist for the
whole batch at once (prompts cost no logits at all); a micro-batch of one chunk skips the checkpoint (and its
recomputation of the LM head), since its logits exist during its backward pass either way.

With no entropy or KL term in the loss, a rollout whose advantages are all zero adds exactly zero to the loss
and to its gradient (``l_t = -min(rho_t * 0, clip(rho_t) * 0) = 0``): it is left out of the passes, while each
mini-batch's loss keeps the token / sequence counts of all its rows, so the gradient is the same up to float
summation order; a mini-batch of only such rollouts takes no pass and AdamW steps on zero gradients, as it
would have after computing them (weight decay and the moments still move the weights)
(``skip_zero_advantage``).

Only the member's parameters require grad (``population.activate``) and only its optimizer steps, so every
other member stays bitwise unchanged.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agents.advantages import get_advantage
from agents.losses import kl_penalty, policy_loss
from agents.models import activation_dtype
from agents.nonfinite import finite_update
from agents.packing import pack_prefix_shared
from agents.rollout import Rollout
from agents.trainer_config import KL_MODES, LORA_IMPLS, PACKED_ATTENTIONS, PACKINGS, TrainerConfig
from agents.tree_attention import takes_tree_mask, tree_attention
from agents.weighting import role_loss_weights

__all__ = ["TrainerConfig", "PolicyGradientTrainer", "KL_MODES", "LORA_IMPLS", "PACKINGS", "PACKED_ATTENTIONS"]

@dataclass
class _Batch:
    """A packed batch: per-row prompt/completion token lists and [B, Tc] completion-aligned tensors."""

    prompts: list[list[int]]
    completions: list[list[int]]
    mask: Tensor  # [B, Tc] float
    targets: Tensor  # [B, Tc] long (0 on padding)

    @property
    def size(self) -> int:
        return len(self.prompts)


@dataclass
class _Targets:
    """What every optimizer step of one update trains towards (step 2), fixed for the whole batch."""

    adv: Tensor  # [B, Tc] advantages, zero on padding
    old_lp: Tensor | None  # [B, Tc] behaviour log-probs; None: each forward's own, detached (on-policy)
    old_pending: set[int]  # rows of old_lp that their first grad forward fills (the first mini-batch's)
    ref_lp: Tensor | None  # [B, Tc] log-probs of the base (adapters disabled); None with kl_mode == "off"
    role_w: Tensor | None  # [B, Tc] per-token loss weights of a mixed-role batch; None: plain aggregation
    role_rows: dict[str, Tensor]  # role -> [B] float indicator of its rows (empty without meta roles)
    norm_len: float  # the constant L of seq-mean-token-sum-norm
    live: set[int] | None  # rows with a non-zero advantage, which take passes (skip_zero_advantage); None: all


@dataclass
class _Tally:
    """Running sums over the micro-batches and optimizer steps of one update, for its metrics."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # metric * tokens
    tokens: float = 0.0  # completion tokens of every micro-batch of every step
    role_ent: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # role -> sum of H_t
    role_tok: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # role -> its tokens
    losses: list[float] = field(default_factory=list)  # per optimizer step
    pg_losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0  # optimizer steps skipped as non-finite
    zero_steps: int = 0  # optimizer steps on exact zero gradients (all-zero advantages, no passes)
    zero_rows: int = 0  # rows left out of an optimizer step's passes (all-zero advantages), summed over steps


class PolicyGradientTrainer:
    """Updates population members with the clipped policy-gradient loss (module docstring for the steps).

    Args:
        population: an ``agents.population.LoRAPopulation`` (``model``, ``activate``, ``parameters``,
            ``optimizer``, ``disabled``; ``single`` with ``lora_impl="fused"``).
        config: the hyperparameters; ``TrainerConfig()`` by default.
    """

    def __init__(self, population, config: TrainerConfig | None = None) -> None:
        self.population = population
        self.config = config if config is not None else TrainerConfig()
        self.config.validate()  # registries looked up now: estimators registered after the config was made count
        self._advantage = get_advantage(self.config.advantage)
        self.forward_tokens = 0
        """Token slots processed by the decoder's forward passes so far (padding included)."""

    # ------------------------------------------------------------------------------------ model access
    @property
    def _causal_lm(self) -> nn.Module:
        model = self.population.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def _device(self) -> torch.device:
        return next(self.population.model.parameters()).device

    def _hidden(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None,
                **kwargs) -> Tensor:
        """The decoder's last hidden states; ``kwargs`` go to the decoder's forward (and from there to every
        attention call: the tree blocks of a packed layout)."""
        lm = self._causal_lm
        backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    @property
    def _tree(self) -> bool:
        """Packed forwards run :mod:`agents.tree_attention` (``packed_attention == "tree"``)."""
        return self.packs_prefix and self.config.packed_attention == "tree"

    @property
    def packs_prefix(self) -> bool:
        """True when forward passes use the prefix-shared layout (``packing == "prefix"`` and an attention
        implementation that takes a 4D additive mask: eager or SDPA)."""
        return self.config.packing == "prefix" and takes_tree_mask(self._causal_lm)

    def _logits(self, h: Tensor) -> Tensor:
        lm = self._causal_lm
        logits = lm.get_output_embeddings()(h).float()
        cfg = getattr(lm, "config", None)
        # the few architectures whose logits are not lm_head(h): Gemma 2/3 soft-capping, Granite, Cohere
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

    def _chunk_lp_ent(self, h: Tensor, targets: Tensor, ent_grad: bool) -> tuple[Tensor, Tensor]:
        logits = self._logits(h)
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        with torch.set_grad_enabled(ent_grad and torch.is_grad_enabled()):
            z = logits if ent_grad else logits.detach()
            ent = (lse if ent_grad else lse.detach()) - (torch.softmax(z, dim=-1) * z).sum(-1)
        return lp, ent

    def _forward(self, batch: _Batch, rows: Sequence[int], ent_grad: bool = False) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies ``[len(rows), Tc]`` (zero on padding) of the completion tokens.

        The decoder runs on the padded layout (``packing="none"``) or the prefix-shared one (``"prefix"``,
        ``agents.packing``); either way the hidden states that predict completion tokens are gathered and the
        LM head runs on them only. ``self.forward_tokens`` counts the token slots the decoder processed."""
        device = self._device
        rows = list(rows)
        mask = batch.mask[rows].to(device)
        Tc = mask.shape[1]
        b_idx, t_idx = mask.bool().nonzero(as_tuple=True)
        targets = batch.targets[rows].to(device)[b_idx, t_idx]
        lp = torch.zeros(len(rows), Tc, device=device)
        ent = torch.zeros(len(rows), Tc, device=device)
        if b_idx.numel() == 0:
            return lp, ent
        if self.packs_prefix:
            packed = pack_prefix_shared(
                [batch.prompts[i] for i in rows],
                [batch.completions[i] for i in rows],
                dtype=self._dtype,
                device=device,
            )
            tree = {"tree_blocks": packed.blocks, "tree_pad_start": packed.pad_start} if self._tree else {}
            hidden = self._hidden(packed.input_ids, packed.attention_mask, packed.position_ids, **tree)
            h_sel = hidden[packed.predictor_index(b_idx, t_idx)]
            self.forward_tokens += packed.tokens
        else:
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
            h_sel = hidden[b_idx, pos]
            self.forward_tokens += len(rows) * S
        lps, ents = [], []
        n = self.config.logprob_chunk_size
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
        lp = lp.index_put((b_idx, t_idx), torch.cat(lps))
        ent = ent.index_put((b_idx, t_idx), torch.cat(ents))
        return lp, ent

    @property
    def _dtype(self) -> torch.dtype:
        return activation_dtype(self._causal_lm)

    def _micro_batches(self, batch: _Batch, rows: Sequence[int] | None = None) -> list[list[int]]:
        """The rows of each forward/backward pass, at most ``micro_batch_size`` rollouts each.

        Padded layout: rows sorted by total length, longest first, so micro-batches pad little. Prefix-shared
        layout: rows sorted by prompt (lexicographically), so attempts at one prompt, and prompts with a common
        beginning, land in the same forward pass and share it."""
        rows = list(range(batch.size)) if rows is None else list(rows)
        mb = self.config.micro_batch_size
        if self.packs_prefix:
            order = sorted(rows, key=lambda i: (batch.prompts[i], i))
        else:
            order = _length_order(batch, rows)
        return [order[k : k + mb] for k in range(0, len(order), mb)]

    @torch.no_grad()
    def _logprobs_no_grad(self, batch: _Batch, reference: bool, minis: Sequence[Sequence[int]] | None = None
                          ) -> Tensor:
        """Log-probs of ``batch`` without grad: of the base (``reference``) or the active member; over the
        whole batch's micro-batches, or over those of each mini-batch in ``minis`` (rows outside stay 0)."""
        out = torch.zeros_like(batch.mask)
        micros = [m for rows in minis for m in self._micro_batches(batch, rows)] if minis is not None else (
            self._micro_batches(batch))
        for rows in micros:
            if reference:
                with self.population.disabled():
                    lp, _ = self._forward(batch, rows)
            else:
                lp, _ = self._forward(batch, rows)
            out[rows] = lp.to(out.device)
        return out

    # ------------------------------------------------------------------------------------------ update
    def update_many(self, batches: Mapping[str, Sequence[Rollout]]) -> dict[str, dict[str, float]]:
        """``update(member, rollouts)`` for every member of ``batches``, in order; returns metrics per member."""
        return {member: self.update(member, rollouts) for member, rollouts in batches.items()}

    def update(self, member: str, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One policy-gradient update of ``member`` from ``rollouts``.

        Returns float metrics: ``loss`` (total loss, mean over optimizer steps), ``pg_loss``, ``grad_norm``
        (pre-clip L2 norm over the member's parameters, mean over steps), ``clip_frac``, ``approx_kl``
        (to the behaviour policy), ``entropy``, ``kl`` (to the base, when kl_mode != "off"; token-weighted
        means over every micro-batch of every step), ``reward_mean``, ``reward_std`` (population std over the
        batch), ``frac_reward_zero_std`` (fraction of baseline groups with >= 2 rollouts whose rewards are all
        equal; NaN if there is no such group), ``advantage_mean``, ``advantage_abs_mean`` (over valid tokens),
        ``response_length``, ``tokens`` (completion tokens trained on), ``num_rollouts``, ``num_steps``,
        ``skipped_steps``, ``zero_advantage_steps`` (optimizer steps without passes), ``zero_advantage_rows``
        (rows left out of a step's passes, summed over steps; ``TrainerConfig.skip_zero_advantage``), ``lr``,
        ``seconds``; ``skipped`` = 1.0 when nothing was trained (no rollouts or no completion token), else 0.0.

        Per role, when rollouts carry ``meta["role"]`` (the single-agent baseline trains its proposer and
        solver completions in one batch): ``reward_mean/<role>``, ``response_length/<role>``,
        ``tokens/<role>`` over that role's rollouts, and ``entropy/<role>`` = sum of H_t over the role's
        completion tokens / their count, accumulated over every micro-batch of every step like ``entropy``
        (same forward pass, no extra one). ``entropy`` is the token-weighted mean of the ``entropy/<role>``.
        """
        t0 = time.perf_counter()
        cfg = self.config
        if member not in self.population:
            raise KeyError(f"no member named {member!r}; members: {self.population.names}")
        rollouts = list(rollouts)
        base = {"num_rollouts": float(len(rollouts)), "tokens": 0.0, "num_steps": 0.0, "skipped": 1.0}
        if not rollouts:
            return base | {"seconds": time.perf_counter() - t0}
        batch = self._pack(rollouts)
        rewards = torch.tensor([float(r.reward) for r in rollouts], dtype=torch.float32)
        groups: list[Hashable] = [r.group for r in rollouts]
        reward_metrics = _reward_metrics(rewards, groups) | _role_metrics(rollouts, rewards, batch.mask)
        n_tokens = float(batch.mask.sum().item())
        if n_tokens == 0:
            return base | reward_metrics | {"seconds": time.perf_counter() - t0}

        model = self.population.model
        was_training = model.training
        if cfg.gradient_checkpointing and not _checkpointing_on(self._causal_lm):
            _enable_checkpointing(self._causal_lm)
        model.train()
        # tree attention for the whole update: checkpointing's recomputation in backward runs it too
        attention = tree_attention(self._causal_lm) if self._tree else nullcontext()
        try:
            with self.population.activate(member), attention, (
                    self.population.single(member) if cfg.lora_impl == "fused" else nullcontext()):
                metrics = self._update(member, rollouts, batch, rewards, groups)
        finally:
            model.train(was_training)
        return base | reward_metrics | metrics | {"skipped": 0.0, "seconds": time.perf_counter() - t0}

    def _pack(self, rollouts: Sequence[Rollout]) -> _Batch:
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
        return _Batch(prompts, comps, mask, targets)

    def _behaviour_logprobs(self, rollouts: Sequence[Rollout], batch: _Batch) -> Tensor:
        out = torch.zeros_like(batch.mask)
        for i, r in enumerate(rollouts):
            if r.logprobs is None:
                raise ValueError(f"use_behaviour_logprobs=True but rollout {i} has no logprobs")
            if len(r.logprobs) != len(r.completion_ids):
                raise ValueError(
                    f"rollout {i}: {len(r.logprobs)} logprobs for {len(r.completion_ids)} completion tokens"
                )
            out[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=out.dtype)
        return out

    def _update(
        self, member: str, rollouts: list[Rollout], batch: _Batch, rewards: Tensor, groups: list[Hashable]
    ) -> dict[str, float]:
        """Steps 2 and 3 of the module docstring on a packed batch (step 1, ``_pack``), ``member`` active.

        2. ``_targets``: the advantages and the fixed (behaviour, reference) log-probs of the whole batch;
        3. ``_optimizer_step`` for each epoch and each mini-batch (``_backward`` for each of its micro-batches);

        then ``_metrics`` from the running sums of those steps."""
        cfg = self.config
        mini = cfg.mini_batch_size or batch.size
        n_steps = cfg.epochs * math.ceil(batch.size / mini)
        targets = self._targets(rollouts, batch, rewards, groups, n_steps, mini)
        params = self.population.parameters(member)
        opt = self.population.optimizer(member, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
        tally = _Tally()
        for _epoch in range(cfg.epochs):
            for start in range(0, batch.size, mini):
                rows = list(range(start, min(batch.size, start + mini)))
                self._optimizer_step(batch, rows, targets, params, opt, tally)
        return self._metrics(batch, targets.adv, tally, n_steps)

    @property
    def _skips_zero_advantage(self) -> bool:
        """True when all-zero advantages mean an exactly zero gradient (``skip_zero_advantage`` and no entropy
        or KL term in the loss), so a mini-batch of them skips its passes."""
        cfg = self.config
        return cfg.skip_zero_advantage and cfg.kl_mode == "off" and cfg.entropy_coef == 0.0

    # ------------------------------------------------------------------ step 2: advantages, fixed log-probs
    def _targets(
        self,
        rollouts: list[Rollout],
        batch: _Batch,
        rewards: Tensor,
        groups: list[Hashable],
        n_steps: int,
        mini: int,
    ) -> _Targets:
        """Step 2: what every optimizer step of the update trains towards, computed once for the batch.

        When the zero-advantage skip applies, the advantages come first (there is no KL-in-reward term
        then): if they are all zero, no optimizer step needs a forward pass, so the behaviour log-probs of a
        multi-step update are not computed either. Otherwise the advantages follow the fixed log-probs,
        after the KL-in-reward term when there is one."""
        cfg = self.config
        adv: Tensor | None = None
        live: set[int] | None = None
        if self._skips_zero_advantage:
            adv = self._advantages(rollouts, batch, rewards, groups, token_rewards=None)
            live = _live_rows(adv)
        zero_gradient = live is not None and not live
        old_lp, pending, ref_lp = self._fixed_logprobs(rollouts, batch, n_steps, mini, zero_gradient, live)
        if adv is None:
            token_rewards = self._kl_token_rewards(batch, old_lp, ref_lp)
            adv = self._advantages(rollouts, batch, rewards, groups, token_rewards=token_rewards)
        role_w = role_loss_weights(_roles(rollouts), batch.mask, cfg.role_weighting, cfg.loss_agg_mode, mini)
        norm_len = float(cfg.norm_len or batch.mask.shape[1])
        return _Targets(adv, old_lp, pending, ref_lp, role_w, _role_rows(rollouts), norm_len, live)

    def _advantages(
        self,
        rollouts: list[Rollout],
        batch: _Batch,
        rewards: Tensor,
        groups: list[Hashable],
        token_rewards: Tensor | None,
    ) -> Tensor:
        """The configured estimator over the whole batch (baseline groups ``Rollout.group``, whitening scopes
        ``Rollout.scope``), ``[B, Tc]`` float32, zero on padding."""
        scopes = [r.scope for r in rollouts]
        adv = self._advantage(
            rewards,
            batch.mask,
            groups,
            scope_ids=None if all(s is None for s in scopes) else scopes,
            token_rewards=token_rewards,
            **self.config.advantage_kwargs,
        ).detach()
        return adv.to(torch.float32) * batch.mask

    def _fixed_logprobs(
        self, rollouts: list[Rollout], batch: _Batch, n_steps: int, mini: int, zero_gradient: bool,
        live: set[int] | None = None,
    ) -> tuple[Tensor | None, set[int], Tensor | None]:
        """``(old_lp, pending, ref_lp)``: the behaviour log-probs ``[B, Tc]`` (the ratio denominator; None:
        on-policy, each forward's own detached log-probs), the rows of ``old_lp`` left for the first mini-batch's
        own forward to fill (module docstring), and the reference (base) log-probs (None with
        ``kl_mode == "off"``). ``live``: the rows the optimizer steps forward (``skip_zero_advantage``; None:
        all); the no-grad pass covers only those (the others' log-probs stay 0, never read)."""
        cfg = self.config
        old_lp: Tensor | None = None
        pending: set[int] = set()
        if cfg.use_behaviour_logprobs:
            old_lp = self._behaviour_logprobs(rollouts, batch)
        elif cfg.kl_mode == "reward" and not zero_gradient:  # the advantages need every row's now
            old_lp = self._logprobs_no_grad(batch, reference=False)
        elif n_steps > 1 and not zero_gradient:
            minis = [[i for i in range(s, min(batch.size, s + mini)) if live is None or i in live]
                     for s in range(0, batch.size, mini)]
            pending = set(minis[0])
            old_lp = self._logprobs_no_grad(batch, reference=False, minis=[m for m in minis[1:] if m])
        ref_lp = self._logprobs_no_grad(batch, reference=True) if cfg.kl_mode != "off" else None
        return old_lp, pending, ref_lp

    def _kl_token_rewards(self, batch: _Batch, old_lp: Tensor | None, ref_lp: Tensor | None) -> Tensor | None:
        """The KL-in-reward term ``-beta * KL_est(lp_behaviour - lp_ref)`` per token (``kl_mode == "reward"``),
        else None."""
        cfg = self.config
        if cfg.kl_mode != "reward":
            return None
        assert old_lp is not None and ref_lp is not None
        return -cfg.kl_coef * kl_penalty(old_lp, ref_lp, cfg.resolved_kl_estimator) * batch.mask

    # ------------------------------------------------------------------------ step 3: optimizer steps
    def _optimizer_step(
        self,
        batch: _Batch,
        rows: list[int],
        targets: _Targets,
        params: list[nn.Parameter],
        opt: torch.optim.Optimizer,
        tally: _Tally,
    ) -> None:
        """Step 3 for the mini-batch ``rows``: the summed gradients of its micro-batches (each loss normalised
        with the mini-batch's token / sequence counts; exact zeros without passes when its advantages are all
        zero and nothing else is in the loss), the gradient norm clipped, one AdamW step unless the loss or
        the norm is non-finite (``skip_nonfinite_grad``)."""
        cfg = self.config
        norms = {
            "num_tokens": float(batch.mask[rows].sum().item()),
            "num_seqs": float(len(rows)),
            "norm_len": targets.norm_len,
        }
        opt.zero_grad(set_to_none=True)
        step_loss = step_pg = 0.0
        live = rows if targets.live is None else [i for i in rows if i in targets.live]  # others add exact zeros
        tally.zero_rows += len(rows) - len(live)
        zero_step = not live
        if zero_step:  # what backward would have accumulated: exact zeros
            tally.zero_steps += 1
            for p in params:
                p.grad = torch.zeros_like(p)
        for micro in self._micro_batches(batch, live) if live else []:
            loss, pg_loss = self._backward(batch, micro, targets, norms, tally)
            step_loss += loss
            step_pg += pg_loss
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        gn = float(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
        tally.grad_norms.append(gn)
        if finite_update(step_loss, gn) or not cfg.skip_nonfinite_grad:
            opt.step()
        else:
            tally.skipped += 1
        opt.zero_grad(set_to_none=True)
        tally.losses.append(step_loss)
        tally.pg_losses.append(step_pg)

    def _backward(
        self, batch: _Batch, rows: list[int], targets: _Targets, norms: dict[str, float], tally: _Tally
    ) -> tuple[float, float]:
        """One micro-batch of step 3: forward, ``policy_loss``, backward (the gradient accumulates on the
        member's parameters); tallies its token-weighted metrics and returns ``(loss, pg_loss)``."""
        cfg = self.config
        device = self._device
        kl_loss = cfg.kl_mode == "loss"
        lp, ent = self._forward(batch, rows, ent_grad=cfg.entropy_coef != 0.0)
        fresh = [j for j, i in enumerate(rows) if i in targets.old_pending]
        if fresh:  # the first forward of the first mini-batch: its log-probs ARE the pre-step policy's
            assert targets.old_lp is not None
            now = [rows[j] for j in fresh]
            targets.old_lp[now] = lp.detach()[fresh].to(targets.old_lp.device)
            targets.old_pending.difference_update(now)
        m = batch.mask[rows].to(device)
        ref_lp = None if targets.ref_lp is None else targets.ref_lp[rows].to(device)
        out = policy_loss(
            lp,
            lp.detach() if targets.old_lp is None else targets.old_lp[rows].to(device),
            targets.adv[rows].to(device),
            m,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            loss_agg_mode=cfg.loss_agg_mode,
            entropy=ent,
            entropy_coef=cfg.entropy_coef,
            ref_logprobs=ref_lp if kl_loss else None,
            kl_coef=cfg.kl_coef if kl_loss else 0.0,
            kl_estimator=cfg.resolved_kl_estimator,
            token_weights=None if targets.role_w is None else targets.role_w[rows].to(device),
            **norms,
        )
        out.loss.backward()
        t = out.metrics["tokens"]
        tally.tokens += t
        for key in ("clip_frac", "approx_kl", "entropy", "kl"):
            if key in out.metrics:
                tally.sums[key] += out.metrics[key] * t
        for role, sel in targets.role_rows.items():
            rm = m * sel[rows].to(device).unsqueeze(-1)
            tally.role_ent[role] += float((ent.detach() * rm).sum().item())
            tally.role_tok[role] += float(rm.sum().item())
        if cfg.kl_mode == "reward":
            assert ref_lp is not None
            kl_tok = kl_penalty(lp.detach(), ref_lp, cfg.resolved_kl_estimator)
            tally.sums["kl"] += float((kl_tok * m).sum().item())
        return float(out.loss.detach().item()), float(out.pg_loss.item())

    def _metrics(self, batch: _Batch, adv: Tensor, tally: _Tally, n_steps: int) -> dict[str, float]:
        """The update's metrics (``update``'s docstring) from its advantages and running sums."""
        valid = batch.mask.bool()
        metrics = {
            "loss": _mean(tally.losses),
            "pg_loss": _mean(tally.pg_losses),
            "grad_norm": _mean(tally.grad_norms),
            "advantage_mean": float(adv[valid].mean().item()),
            "advantage_abs_mean": float(adv[valid].abs().mean().item()),
            "response_length": float(batch.mask.sum(-1).mean().item()),
            "tokens": float(batch.mask.sum().item()),
            "num_steps": float(n_steps),
            "skipped_steps": float(tally.skipped),
            "zero_advantage_steps": float(tally.zero_steps),
            "zero_advantage_rows": float(tally.zero_rows),
            "lr": float(self.config.lr),
        }
        for key, total in tally.sums.items():
            metrics[key] = total / max(tally.tokens, 1.0)
        for role, n in tally.role_tok.items():
            if n > 0:
                metrics[f"entropy/{role}"] = tally.role_ent[role] / n
        return metrics


def _checkpointing_on(model: nn.Module) -> bool:
    flag = getattr(
        type(model), "is_activation_checkpointing", None
    )  # transformers >= 5 (no deprecation warning)
    if flag is not None:
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _enable_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}  # works with frozen embeddings (no input grads needed)
    if hasattr(type(model), "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _length_order(batch: _Batch, rows: Sequence[int] | None = None) -> list[int]:
    """Rows sorted by total length (longest first) so micro-batches pad little."""
    rows = range(batch.size) if rows is None else rows
    return sorted(rows, key=lambda i: -(len(batch.prompts[i]) + len(batch.completions[i])))


def _live_rows(adv: Tensor) -> set[int]:
    """Indices of the rows of ``adv`` ``[B, Tc]`` with a non-zero advantage on some token."""
    return {int(i) for i in (adv != 0).any(dim=1).nonzero().flatten()}


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


def _roles(rollouts: Sequence[Rollout]) -> list[str | None]:
    return [r.meta.get("role") if isinstance(r.meta, Mapping) else None for r in rollouts]


def _role_rows(rollouts: Sequence[Rollout]) -> dict[str, Tensor]:
    """Role -> ``[B]`` float indicator of the rows whose ``meta["role"]`` is that role."""
    roles = _roles(rollouts)
    return {
        str(role): torch.tensor([x == role for x in roles], dtype=torch.float32)
        for role in sorted({x for x in roles if x is not None}, key=str)
    }


def _role_metrics(rollouts: Sequence[Rollout], rewards: Tensor, mask: Tensor) -> dict[str, float]:
    """``reward_mean/<role>`` (mean reward of the role's rollouts), ``response_length/<role>`` (mean
    completion tokens per rollout) and ``tokens/<role>`` (their sum)."""
    out: dict[str, float] = {}
    lengths = mask.sum(-1)
    for role, sel in _role_rows(rollouts).items():
        rows = sel.bool()
        out[f"reward_mean/{role}"] = float(rewards[rows].mean().item())
        out[f"response_length/{role}"] = float(lengths[rows].mean().item())
        out[f"tokens/{role}"] = float(lengths[rows].sum().item())
    return out


def _reward_metrics(rewards: Tensor, groups: Sequence[Hashable]) -> dict[str, float]:
    by_group: dict[Hashable, list[float]] = defaultdict(list)
    for r, g in zip(rewards.tolist(), groups, strict=True):
        by_group[g].append(r)
    multi = [v for v in by_group.values() if len(v) >= 2]
    zero = sum(1 for v in multi if max(v) == min(v))
    return {
        "reward_mean": float(rewards.mean().item()),
        "reward_std": float(rewards.std(unbiased=False).item()),
        "frac_reward_zero_std": zero / len(multi) if multi else math.nan,
        "num_groups": float(len(by_group)),
    }
