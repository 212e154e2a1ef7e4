"""Policy-gradient updates of one population member (a LoRA adapter) from its rollouts.

``PolicyGradientTrainer(population, config).update(member, rollouts)`` runs four short steps: **gather** the
``[prompt | completion]`` tokens, mask, rewards and baseline groups (``update``); **advantages** over the whole
batch (``_targets``, ``agents.advantages``), after the optional KL-in-reward term ``-beta * KL_est(lp_behaviour -
lp_ref)`` per token; **loss per mini-batch** (``_optimizer_step``, ``_backward``), each micro-batch's loss
normalised with the mini-batch's global token / sequence counts, so the accumulated gradient equals the full
mini-batch gradient; **step**: the gradient norm clipped, one AdamW step of the member's own optimizer.

The loss (``agents.losses.policy_loss``), per completion token t with ``rho_t = exp(lp_t - lp_old_t)``::

    l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)   aggregated,
          - entropy_coef * entropy + kl_coef * KL                          (KL-as-loss mode)

On-policy (one optimizer step per batch) ``lp_old`` is the detached ``lp`` of the same pass: ``rho == 1``.

Rollout/trainer mismatch, over the completion tokens that carry the generator's log-probs ``lp_mu``, with
``delta_t = lp_old_t - lp_mu_t``: ``mismatch_abs_mean`` = mean |delta_t|, ``mismatch_abs_max`` = max |delta_t|,
``mismatch_kl`` = mean (exp(delta_t) - 1 - delta_t) (the k3 estimate of KL(mu || pi_old), >= 0, 0 iff equal).
``is_correction`` ``"tis"`` / ``"mis"`` weighs each token's surrogate by ``w_t = exp(delta_t)`` truncated /
masked at ``is_cap``.

A stale batch (``update(..., version=v)``, rollouts of version ``v - s``): with ``is_correction = "none"``
``lp_old = lp_mu`` and ``rho_t = pi_theta(y_t) / pi_{v-s}(y_t)``, clipped as in PPO; with ``"tis"`` / ``"mis"``
the ratio is against ``pi_v`` and the weight is ``w_t = pi_v(y_t) / pi_{v-s}(y_t)`` (AReaL's decoupled
objective). Staleness 0 is bit for bit the synchronous update.

A row whose advantages are all zero adds exactly zero to the clipped surrogate and its gradient
(``-min(rho_t * 0, clip(rho_t) * 0) = 0``), so it is skipped when the loss declares it
(``agents.losses.zero_advantage_rows_add_zero``); the mini-batch keeps all rows' counts.

Where the behaviour log-probs come from with several optimizer steps, how the mismatch is measured per layout,
and the rest of the update's design: docs/design.md "The trainer's update".
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

from agents.advantages import get_advantage
from agents.forward import PolicyForward, RolloutBatch, pack_rollouts, sampled_logprobs
from agents.losses import (
    kl_penalty,
    list_loss_terms,
    policy_loss,
    zero_advantage_rows_add_zero,
)
from agents.nonfinite import finite_update
from agents.rollout import Rollout
from agents.trainer_config import (
    IS_CORRECTIONS,
    KL_MODES,
    LORA_IMPLS,
    PACKED_ATTENTIONS,
    PACKINGS,
    TrainerConfig,
)
from agents.weighting import role_loss_weights
from populora_env.checks import ConfigError

__all__ = ["TrainerConfig", "PolicyGradientTrainer", "IS_CORRECTIONS", "KL_MODES", "LORA_IMPLS", "PACKINGS",
           "PACKED_ATTENTIONS"]

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
    behaviour: bool = False  # old_lp is the generator's rollout_lp (use_behaviour_logprobs, or a stale batch)
    rollout_lp: Tensor | None = None  # [B, Tc] the generator's log-probs (None: no rollout carries them)
    has_rollout_lp: list[bool] = field(default_factory=list)  # per row: its log-probs are there and aligned
    measured: set[int] = field(default_factory=set)  # rows whose mismatch is tallied (each once per update)
    role_norms: dict = field(default_factory=dict)  # a mixed batch's role -> (tokens, rows) in the current step

    def old_logprobs(self, rows: list[int], lp: Tensor) -> Tensor:
        """The behaviour log-probs of ``rows`` for a forward that gave ``lp``: its own, detached, when on-policy;
        those of ``old_lp`` otherwise, after filling the pending rows among ``rows`` with ``lp`` (the first
        forward of the first mini-batch: its log-probs ARE the pre-step policy's)."""
        if self.old_lp is None:
            return lp.detach()
        fresh = [j for j, i in enumerate(rows) if i in self.old_pending]
        if fresh:
            now = [rows[j] for j in fresh]
            self.old_lp[now] = lp.detach()[fresh].to(self.old_lp.device)
            self.old_pending.difference_update(now)
        return self.old_lp[rows].to(lp.device)


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
    mismatch: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # |delta| and k3 sums, max, n
    zero_steps: int = 0  # optimizer steps on exact zero gradients (all-zero advantages, no passes)
    zero_rows: int = 0  # rows left out of an optimizer step's passes (all-zero advantages), summed over steps

    def add(self, metrics: Mapping[str, float], ent: Tensor, m: Tensor, rows: list[int],
            role_rows: Mapping[str, Tensor]) -> None:
        """A micro-batch's ``policy_loss`` metrics (token-weighted) and its entropies ``ent`` per role, over its
        completion tokens ``m`` ``[len(rows), Tc]``."""
        t = metrics["tokens"]
        self.tokens += t
        for key in ("clip_frac", "approx_kl", "entropy", "kl", *list_loss_terms()):
            if key in metrics:
                self.sums[key] += metrics[key] * t
        for role, sel in role_rows.items():
            rm = m * sel[rows].to(m.device).unsqueeze(-1)
            self.role_ent[role] += float((ent.detach() * rm).sum().item())
            self.role_tok[role] += float(rm.sum().item())

    def add_mismatch(self, delta: Tensor, m: Tensor) -> None:
        """``delta`` = the trainer's minus the generator's log-probs ``[rows, Tc]`` over the tokens ``m``."""
        n = float(m.sum().item())
        if n == 0:
            return
        d = delta.detach().double() * m
        self.mismatch["abs"] += float(d.abs().sum().item())
        self.mismatch["k3"] += float(((torch.expm1(d) - d) * m).sum().item())
        self.mismatch["max"] = max(self.mismatch["max"], float(d.abs().max().item()))
        self.mismatch["tokens"] += n


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
        #: The settings of the update under way: the shared ones, or its batch's role's (``TrainerConfig.for_role``).
        self._cfg = self.config
        #: A mixed batch's per-role settings (the baseline's proposer and solver rows) while it is updated, when
        #: a role sets its own (``None``: every row trains with ``_cfg``); ``_row_roles``: each row's role.
        self._mixed: dict[str | None, TrainerConfig] | None = None
        self._row_roles: list[str | None] = []
        self.lr_scale: Mapping[str, float] = {}
        """Member -> a factor on ``config.lr`` (PBT's ``lr_explore`` gives a child one; the run shares the
        controller's dict): the member's AdamW runs at ``lr × scale``."""
        cfg = self.config
        self.forward = PolicyForward(population, packing=cfg.packing, packed_attention=cfg.packed_attention,
                                     micro_batch_size=cfg.micro_batch_size, logprob_chunk_size=cfg.logprob_chunk_size,
                                     max_tokens_per_row=cfg.max_tokens_per_row)
        """The update's forward passes (``agents.forward``)."""
        if cfg.packed_attention == "flex" and self.forward.packs_prefix and self.forward.device.type != "cuda":
            raise ConfigError("trainer.packed_attention", "'flex' needs a CUDA device (PyTorch's flex_attention has "
                              f"no backward on {self.forward.device.type}); use 'tree' there")

    @property
    def forward_tokens(self) -> int:
        """Token slots processed by the decoder's forward passes so far (padding included)."""
        return self.forward.forward_tokens

    # ------------------------------------------------------------------------------------------ update
    def update_many(self, batches: Mapping[str, Sequence[Rollout]],
                    versions: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
        """``update(member, rollouts, version)`` for every member of ``batches``, in order (``versions``: each
        member's current version, for stale batches; module docstring); returns metrics per member."""
        versions = versions or {}
        return {member: self.update(member, rollouts, versions[member]) if member in versions
                else self.update(member, rollouts) for member, rollouts in batches.items()}

    def update(self, member: str, rollouts: Sequence[Rollout], version: int | None = None) -> dict[str, float]:
        """One policy-gradient update of ``member`` from ``rollouts``; ``version``: the member's current version
        (``None``: versions are not tracked, the batch is on-policy), against which each rollout's
        ``Rollout.version`` gives its staleness (module docstring: a stale batch is corrected towards the
        log-probs it was sampled with).

        Returns float metrics: ``loss`` (total loss, mean over optimizer steps), ``pg_loss``, ``grad_norm``
        (pre-clip L2 norm over the member's parameters, mean over steps), ``clip_frac``, ``approx_kl``
        (to the behaviour policy), ``entropy``, ``kl`` (to the base, when kl_mode != "off"; token-weighted
        means over every micro-batch of every step; likewise each registered extra loss term, by its name),
        ``reward_mean``, ``reward_std`` (population std over the
        batch), ``frac_reward_zero_std`` (fraction of baseline groups with >= 2 rollouts whose rewards are all
        equal; NaN if there is no such group), ``advantage_mean``, ``advantage_abs_mean`` (over valid tokens),
        ``response_length``, ``tokens`` (completion tokens trained on), ``num_rollouts``, ``num_steps``,
        ``skipped_steps``, ``zero_advantage_steps`` (optimizer steps without passes), ``zero_advantage_rows``
        (rows left out of a step's passes, summed over steps; ``TrainerConfig.skip_zero_advantage``), ``lr``,
        ``seconds``; ``skipped`` = 1.0 when nothing was trained (no rollouts or no completion token), else 0.0;
        with ``version``: ``staleness`` and ``staleness_max`` (updates between the version that generated each
        rollout and ``version``).

        Per role, when rollouts carry ``meta["role"]`` (the single-agent baseline trains its proposer and
        solver completions in one batch): ``reward_mean/<role>``, ``response_length/<role>``,
        ``tokens/<role>`` over that role's rollouts, and ``entropy/<role>`` = sum of H_t over the role's
        completion tokens / their count, accumulated over every micro-batch of every step like ``entropy``
        (same forward pass, no extra one). ``entropy`` is the token-weighted mean of the ``entropy/<role>``.
        ``advantage_abs_max/<role>``: max |A| over the role's completion tokens (0: no signal for that role).
        """
        t0 = time.perf_counter()
        cfg = self.config
        if member not in self.population:
            raise KeyError(f"no member named {member!r}; members: {self.population.names}")
        rollouts = list(rollouts)
        staleness = _staleness(rollouts, version)
        base = {"num_rollouts": float(len(rollouts)), "tokens": 0.0, "num_steps": 0.0, "skipped": 1.0}
        if staleness:
            base |= {"staleness": sum(staleness) / len(staleness), "staleness_max": float(max(staleness))}
        if not rollouts:
            return base | {"seconds": time.perf_counter() - t0}
        batch = pack_rollouts(rollouts)
        rewards = torch.tensor([float(r.reward) for r in rollouts], dtype=torch.float32)
        groups: list[Hashable] = [r.group for r in rollouts]
        reward_metrics = _reward_metrics(rewards, groups) | _role_metrics(rollouts, rewards, batch.mask)
        if float(batch.mask.sum().item()) == 0:
            return base | reward_metrics | {"seconds": time.perf_counter() - t0}
        try:
            self._set_roles(rollouts)
            with self.forward.training(cfg.gradient_checkpointing), self.population.activate(member), (
                    self.population.single(member) if cfg.lora_impl == "fused" else nullcontext()):
                metrics = self._update(member, rollouts, batch, rewards, groups, stale=any(staleness))
        finally:
            self._cfg, self._mixed, self._row_roles = self.config, None, []
        return base | reward_metrics | metrics | {"skipped": 0.0, "seconds": time.perf_counter() - t0}

    def _set_roles(self, rollouts: Sequence[Rollout]) -> None:
        """The settings of this update (``TrainerConfig.for_role``): a batch of one role (a population member's)
        trains with that role's; a batch of several (the baseline's) with the shared ones, each row's advantage
        and loss term with its role's when a role sets its own (``_mixed``)."""
        self._row_roles = _roles(rollouts)
        roles = set(self._row_roles)
        if len(roles) == 1:
            self._cfg = self.config.for_role(next(iter(roles)))
        elif self.config.per_role:
            self._mixed = {role: self.config.for_role(role) for role in roles}

    def _row_configs(self) -> list[TrainerConfig]:
        """The settings of every role of the batch (just ``_cfg`` unless it is mixed)."""
        return [self._cfg] if self._mixed is None else list(self._mixed.values())

    def _update(
        self, member: str, rollouts: list[Rollout], batch: RolloutBatch, rewards: Tensor, groups: list[Hashable],
        stale: bool = False,
    ) -> dict[str, float]:
        """Steps 2 to 4 of the module docstring on a gathered batch, ``member`` active (``stale``: some rollout was
        generated by an older version of it, whose log-probs the rollouts carry: module docstring).

        2. ``_targets``: the advantages and the fixed (behaviour, reference) log-probs of the whole batch;
        3. and 4. ``_optimizer_step`` for each epoch and each mini-batch (``_backward`` for each of its
           micro-batches, then one AdamW step);

        then ``_metrics`` from the running sums of those steps."""
        cfg = self._cfg
        mini = cfg.mini_batch_size or batch.size
        n_steps = cfg.epochs * math.ceil(batch.size / mini)
        targets = self._targets(rollouts, batch, rewards, groups, n_steps, mini, stale)
        params = self.population.parameters(member)
        lr = cfg.lr * self.lr_scale[member] if member in self.lr_scale else cfg.lr  # PBT's lr exploration
        opt = self.population.optimizer(member, lr=lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
        tally = _Tally()
        for _epoch in range(cfg.epochs):
            for start in range(0, batch.size, mini):
                rows = list(range(start, min(batch.size, start + mini)))
                self._optimizer_step(batch, rows, targets, params, opt, tally)
        metrics = self._metrics(batch, targets.adv, tally, n_steps, lr)
        return metrics | _role_advantages(rollouts, targets.adv, batch.mask)

    @property
    def _loss_coefs(self) -> dict[str, float]:
        """The coefficients of ``policy_loss``'s terms besides the surrogate: the entropy bonus, and the KL
        penalty when the KL is a loss term (``kl_mode == "loss"``)."""
        return _coefs(self._cfg)

    @property
    def _skips_zero_advantage(self) -> bool:
        """True when rows whose advantages are all zero take no pass: ``skip_zero_advantage``, the loss declares
        that they add exactly zero (``zero_advantage_rows_add_zero``, module docstring), and no KL to the base
        is computed (``kl_mode == "off"``: in the reward, the advantages need every row's log-probs before they
        exist; as a loss, it is measured on every row even at ``kl_coef = 0``)."""
        cfg = self._cfg
        return cfg.skip_zero_advantage and cfg.kl_mode == "off" and all(
            zero_advantage_rows_add_zero(**_coefs(c)) for c in self._row_configs())

    # ------------------------------------------------------------------ step 2: advantages, fixed log-probs
    def _targets(self, rollouts: list[Rollout], batch: RolloutBatch, rewards: Tensor, groups: list[Hashable],
                 n_steps: int, mini: int, stale: bool = False) -> _Targets:
        """Step 2: what every optimizer step of the update trains towards, computed once for the batch.

        When the zero-advantage skip applies, the advantages come first (there is no KL-in-reward term
        then): if they are all zero, no optimizer step needs a forward pass, so the behaviour log-probs of a
        multi-step update are not computed either. Otherwise the advantages follow the fixed log-probs,
        after the KL-in-reward term when there is one."""
        cfg = self._cfg
        adv: Tensor | None = None
        live: set[int] | None = None
        if self._skips_zero_advantage:
            adv = self._advantages(rollouts, batch, rewards, groups, token_rewards=None)
            live = _live_rows(adv)
        zero_gradient = live is not None and not live
        corrected = any(c.is_correction != "none" for c in self._row_configs())
        behaviour = cfg.use_behaviour_logprobs or (stale and not corrected)  # module docstring
        rollout_lp, has = sampled_logprobs(rollouts, batch, need=(
            "use_behaviour_logprobs=True needs the generator's log-probs" if cfg.use_behaviour_logprobs
            else "is_correction needs the generator's log-probs" if corrected
            else "a stale batch's ratio needs the log-probs it was sampled with" if stale else None))
        old_lp, pending, ref_lp = self._fixed_logprobs(batch, n_steps, mini, zero_gradient, live,
                                                       rollout_lp if behaviour else None)
        if adv is None:
            token_rewards = self._kl_token_rewards(batch, old_lp, ref_lp)
            adv = self._advantages(rollouts, batch, rewards, groups, token_rewards=token_rewards)
        role_w = None if self._mixed is not None else role_loss_weights(  # a mixed batch: _backward_by_role
            _roles(rollouts), batch.mask, cfg.role_weighting, cfg.loss_agg_mode, mini)
        norm_len = float(cfg.norm_len or batch.mask.shape[1])
        return _Targets(adv, old_lp, pending, ref_lp, role_w, _role_rows(rollouts), norm_len, live, behaviour,
                        rollout_lp, has)

    def _advantages(self, rollouts: list[Rollout], batch: RolloutBatch, rewards: Tensor, groups: list[Hashable],
                    token_rewards: Tensor | None) -> Tensor:
        """The configured estimator over the whole batch (baseline groups ``Rollout.group``, whitening scopes
        ``Rollout.scope``), ``[B, Tc]`` float32, zero on padding."""
        scopes = [r.scope for r in rollouts]
        if self._mixed is None:
            estimator = self._advantage if self._cfg is self.config else get_advantage(self._cfg.advantage)
            adv = estimator(rewards, batch.mask, groups, scope_ids=None if all(s is None for s in scopes) else scopes,
                            token_rewards=token_rewards, **self._cfg.advantage_kwargs).detach()
            return adv.to(torch.float32) * batch.mask
        adv = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
        for role, cfg in self._mixed.items():  # each role's rows: its estimator over them alone
            idx = [i for i, r in enumerate(self._row_roles) if r == role]
            sub = [scopes[i] for i in idx]
            part = get_advantage(cfg.advantage)(
                rewards[idx], batch.mask[idx], [groups[i] for i in idx],
                scope_ids=None if all(s is None for s in sub) else sub,
                token_rewards=None if token_rewards is None else token_rewards[idx], **cfg.advantage_kwargs)
            adv[idx] = part.detach().to(torch.float32)
        return adv * batch.mask

    def _fixed_logprobs(
        self, batch: RolloutBatch, n_steps: int, mini: int, zero_gradient: bool, live: set[int] | None = None,
        behaviour_lp: Tensor | None = None,
    ) -> tuple[Tensor | None, set[int], Tensor | None]:
        """``(old_lp, pending, ref_lp)``: the behaviour log-probs ``[B, Tc]`` (the ratio denominator; None:
        on-policy, each forward's own detached log-probs), the rows of ``old_lp`` left for the first mini-batch's
        own forward to fill (module docstring), and the reference (base) log-probs (None with
        ``kl_mode == "off"``). ``live``: the rows the optimizer steps forward (``skip_zero_advantage``; None:
        all); the no-grad pass covers only those (the others' log-probs stay 0, never read). ``behaviour_lp``:
        the generator's log-probs when they are the ratio's denominator (``use_behaviour_logprobs``, or a stale
        batch without an importance correction: module docstring)."""
        cfg = self._cfg
        old_lp: Tensor | None = None
        pending: set[int] = set()
        if behaviour_lp is not None:
            old_lp = behaviour_lp
        elif cfg.kl_mode == "reward" and not zero_gradient:  # the advantages need every row's now
            old_lp = self.forward.logprobs_no_grad(batch, reference=False)
        elif n_steps > 1 and not zero_gradient:
            minis = [[i for i in range(s, min(batch.size, s + mini)) if live is None or i in live]
                     for s in range(0, batch.size, mini)]
            pending = set(minis[0])
            old_lp = self.forward.logprobs_no_grad(batch, reference=False, minis=[m for m in minis[1:] if m])
        ref_lp = self.forward.logprobs_no_grad(batch, reference=True) if cfg.kl_mode != "off" else None
        return old_lp, pending, ref_lp

    def _kl_token_rewards(self, batch: RolloutBatch, old_lp: Tensor | None, ref_lp: Tensor | None) -> Tensor | None:
        """The KL-in-reward term ``-beta * KL_est(lp_behaviour - lp_ref)`` per token (``kl_mode == "reward"``),
        else None."""
        cfg = self._cfg
        if cfg.kl_mode != "reward":
            return None
        assert old_lp is not None and ref_lp is not None
        coef: float | Tensor = cfg.kl_coef
        if self._mixed is not None:  # each row's role's coefficient
            coef = torch.tensor([self._mixed[r].kl_coef for r in self._row_roles], dtype=old_lp.dtype,
                                device=old_lp.device).unsqueeze(-1)
        return -coef * kl_penalty(old_lp, ref_lp, cfg.resolved_kl_estimator) * batch.mask

    # ------------------------------------------------------------------- steps 3 and 4: loss, optimizer step
    def _optimizer_step(self, batch: RolloutBatch, rows: list[int], targets: _Targets, params: list[nn.Parameter],
                        opt: torch.optim.Optimizer, tally: _Tally) -> None:
        """Steps 3 and 4 for the mini-batch ``rows``: the summed gradients of its micro-batches (each loss
        normalised with the mini-batch's token / sequence counts; exact zeros without passes when its advantages
        are all zero and the loss declares such rows inert), the gradient norm clipped, one AdamW step unless
        the loss or the norm is non-finite (``skip_nonfinite_grad``)."""
        cfg = self._cfg
        norms = {"num_tokens": float(batch.mask[rows].sum().item()), "num_seqs": float(len(rows)),
                 "norm_len": targets.norm_len}
        if self._mixed is not None:  # each role's own counts in this mini-batch (_backward_by_role)
            targets.role_norms = {role: (float(batch.mask[[i for i in rows if self._row_roles[i] == role]].sum()),
                                         float(sum(self._row_roles[i] == role for i in rows)))
                                  for role in self._mixed}
        opt.zero_grad(set_to_none=True)
        step_loss = step_pg = 0.0
        live = rows if targets.live is None else [i for i in rows if i in targets.live]  # others add exact zeros
        tally.zero_rows += len(rows) - len(live)
        zero_step = not live
        if zero_step:  # what backward would have accumulated: exact zeros
            tally.zero_steps += 1
            for p in params:
                p.grad = torch.zeros_like(p)
        for micro in self.forward.micro_batches(batch, live) if live else []:
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
        self, batch: RolloutBatch, rows: list[int], targets: _Targets, norms: dict[str, float], tally: _Tally
    ) -> tuple[float, float]:
        """One micro-batch of step 3: forward, ``policy_loss``, backward (the gradient accumulates on the
        member's parameters); tallies its token-weighted metrics and returns ``(loss, pg_loss)``."""
        if self._mixed is not None:
            return self._backward_by_role(batch, rows, targets, norms, tally)
        cfg = self._cfg
        lp, ent = self.forward.logprobs(batch, rows, ent_grad=cfg.entropy_coef != 0.0)
        device = lp.device
        m = batch.mask[rows].to(device)
        ref_lp = None if targets.ref_lp is None else targets.ref_lp[rows].to(device)
        old = targets.old_logprobs(rows, lp)
        is_weights = self._mismatch(rows, lp, old, m, targets, tally)
        out = policy_loss(
            lp,
            old,
            targets.adv[rows].to(device),
            m,
            clip_eps_low=cfg.clip_eps_low,
            clip_eps_high=cfg.clip_eps_high,
            loss_agg_mode=cfg.loss_agg_mode,
            entropy=ent,
            ref_logprobs=ref_lp if cfg.kl_mode == "loss" else None,
            kl_estimator=cfg.resolved_kl_estimator,
            token_weights=None if targets.role_w is None else targets.role_w[rows].to(device),
            is_weights=is_weights,
            **self._loss_coefs,
            **norms,
        )
        out.loss.backward()
        tally.add(out.metrics, ent, m, rows, targets.role_rows)
        if cfg.kl_mode == "reward":
            assert ref_lp is not None
            kl_tok = kl_penalty(lp.detach(), ref_lp, cfg.resolved_kl_estimator)
            tally.sums["kl"] += float((kl_tok * m).sum().item())
        return float(out.loss.detach().item()), float(out.pg_loss.item())

    def _backward_by_role(
        self, batch: RolloutBatch, rows: list[int], targets: _Targets, norms: dict[str, float], tally: _Tally
    ) -> tuple[float, float]:
        """``_backward`` of a mixed batch whose roles set their own settings: one forward, then each role's rows
        through ``policy_loss`` with its role's clip range, aggregation, entropy and KL coefficients and importance
        correction. ``role_weighting = "balanced"``: each role's term is normalised by the role's own counts in
        the mini-batch and weighted 1/R over the R roles present, L = (1/R) sum_r agg_r(l) (``agents.weighting``'s
        balance, each role with its own aggregation); ``"tokens"``: every term by the mini-batch's counts
        (one aggregation, checked by the baseline's config), so the terms add up to one token mean."""
        configs = self._mixed
        assert configs is not None
        lp, ent = self.forward.logprobs(batch, rows, ent_grad=any(c.entropy_coef != 0.0 for c in configs.values()))
        device = lp.device
        m = batch.mask[rows].to(device)
        ref_lp = None if targets.ref_lp is None else targets.ref_lp[rows].to(device)
        old = targets.old_logprobs(rows, lp)
        is_weights = self._mismatch(rows, lp, old, m, targets, tally)
        balanced = self._cfg.role_weighting == "balanced"
        present = [r for r, (n_tok, _) in targets.role_norms.items() if n_tok > 0]
        total: Tensor | None = None
        loss = pg = 0.0
        for role, cfg in configs.items():
            j = [k for k, i in enumerate(rows) if self._row_roles[i] == role]
            if not j or role not in present:
                continue
            n_tok, n_seq = targets.role_norms[role]
            own = {"num_tokens": n_tok, "num_seqs": n_seq, "norm_len": norms["norm_len"]} if balanced else norms
            out = policy_loss(
                lp[j], old[j], targets.adv[rows][j].to(device), m[j], clip_eps_low=cfg.clip_eps_low,
                clip_eps_high=cfg.clip_eps_high, loss_agg_mode=cfg.loss_agg_mode, entropy=ent[j],
                ref_logprobs=ref_lp[j] if cfg.kl_mode == "loss" and ref_lp is not None else None,
                kl_estimator=cfg.resolved_kl_estimator, is_weights=None if is_weights is None else is_weights[j],
                **_coefs(cfg), **own)
            scale = 1.0 / len(present) if balanced else 1.0
            total = out.loss * scale if total is None else total + out.loss * scale
            loss += float(out.loss.detach().item()) * scale
            pg += float(out.pg_loss.item()) * scale
            tally.add(out.metrics, ent[j], m[j], [rows[k] for k in j], targets.role_rows)
        if total is not None:
            total.backward()
        return loss, pg

    def _mismatch(self, rows: list[int], lp: Tensor, old: Tensor, m: Tensor, targets: _Targets, tally: _Tally
                  ) -> Tensor | None:
        """Tally the rollout/trainer mismatch of ``rows`` not measured yet (module docstring) and return the
        importance weights of ``is_correction`` ``[rows, Tc]`` (None with ``"none"``; ``agents.losses``).

        The trainer's pre-step log-probs are ``old`` (its own behaviour log-probs), or when ``old`` is the
        generator's (``targets.behaviour``: ``use_behaviour_logprobs``, a stale batch) this forward's own before
        any step."""
        cfg = self._cfg
        if targets.rollout_lp is None:
            return None
        mu = targets.rollout_lp[rows].to(lp.device)
        pre = None if targets.behaviour and tally.grad_norms else (lp.detach() if targets.behaviour else old)
        if pre is not None:
            new = torch.tensor([i not in targets.measured and targets.has_rollout_lp[i] for i in rows],
                               dtype=m.dtype, device=m.device)
            tally.add_mismatch(pre - mu, m * new.unsqueeze(-1))
            targets.measured.update(i for i in rows if targets.has_rollout_lp[i])
        if self._mixed is not None:
            return self._role_is_weights(rows, old - mu, m, tally)
        if cfg.is_correction == "none":
            return None
        w = torch.exp((old - mu).clamp(min=-20.0, max=20.0))
        capped = w > cfg.is_cap
        tally.sums["is_weight_mean"] += float((w * m).sum().item())
        tally.sums["is_capped_frac"] += float((capped.to(m.dtype) * m).sum().item())
        if cfg.is_correction == "tis":
            return w.clamp(max=cfg.is_cap)
        return torch.where(capped, torch.zeros_like(w), w)

    def _role_is_weights(self, rows: list[int], delta: Tensor, m: Tensor, tally: _Tally) -> Tensor | None:
        """A mixed batch's importance weights ``[rows, Tc]``: each row's by its role's ``is_correction`` and
        ``is_cap`` (1 for a role without correction); ``None`` when no role corrects."""
        assert self._mixed is not None
        if all(c.is_correction == "none" for c in self._mixed.values()):
            return None
        w = torch.exp(delta.clamp(min=-20.0, max=20.0))
        out = torch.ones_like(w)
        for k, i in enumerate(rows):
            cfg = self._mixed[self._row_roles[i]]
            if cfg.is_correction == "none":
                continue
            capped = w[k] > cfg.is_cap
            tally.sums["is_weight_mean"] += float((w[k] * m[k]).sum().item())
            tally.sums["is_capped_frac"] += float((capped.to(m.dtype) * m[k]).sum().item())
            out[k] = w[k].clamp(max=cfg.is_cap) if cfg.is_correction == "tis" else torch.where(
                capped, torch.zeros_like(w[k]), w[k])
        return out

    def _metrics(self, batch: RolloutBatch, adv: Tensor, tally: _Tally, n_steps: int, lr: float
                 ) -> dict[str, float]:
        """The update's metrics (``update``'s docstring) from its advantages and running sums; ``lr``: the
        member's learning rate."""
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
            "lr": float(lr),
        }
        for key, total in tally.sums.items():
            metrics[key] = total / max(tally.tokens, 1.0)
        if tally.mismatch["tokens"] > 0:
            n = tally.mismatch["tokens"]
            metrics |= {"mismatch_abs_mean": tally.mismatch["abs"] / n, "mismatch_abs_max": tally.mismatch["max"],
                        "mismatch_kl": tally.mismatch["k3"] / n}
        for role, n in tally.role_tok.items():
            if n > 0:
                metrics[f"entropy/{role}"] = tally.role_ent[role] / n
        return metrics


def _coefs(cfg: TrainerConfig) -> dict[str, float]:
    """The coefficients of ``policy_loss``'s terms besides the surrogate: the entropy bonus, and the KL penalty
    when the KL is a loss term (``kl_mode == "loss"``)."""
    return {"entropy_coef": cfg.entropy_coef, "kl_coef": cfg.kl_coef if cfg.kl_mode == "loss" else 0.0}


def _staleness(rollouts: Sequence[Rollout], version: int | None) -> list[int]:
    """Each versioned rollout's staleness ``version - Rollout.version`` (empty without ``version`` or without
    versioned rollouts); a rollout newer than ``version`` is refused."""
    if version is None:
        return []
    out = []
    for i, r in enumerate(rollouts):
        if r.version is None:
            continue
        if r.version > version:
            raise ValueError(f"rollout {i} was generated by version {r.version} of the member, newer than the "
                             f"version {version} being trained")
        out.append(version - r.version)
    return out


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


def _role_advantages(rollouts: Sequence[Rollout], adv: Tensor, mask: Tensor) -> dict[str, float]:
    """``advantage_abs_max/<role>``: the largest |advantage| over the completion tokens of the role's rows
    (0 when they have none): 0 means the role got no learning signal in this update."""
    out: dict[str, float] = {}
    valid = mask.bool()
    for role, sel in _role_rows(rollouts).items():
        rows = sel.bool().to(adv.device)
        values = adv[rows][valid[rows].to(adv.device)]
        out[f"advantage_abs_max/{role}"] = float(values.abs().max().item()) if values.numel() else 0.0
    return out


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
