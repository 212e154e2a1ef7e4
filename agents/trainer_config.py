"""The trainer's settings, :class:`TrainerConfig`: plain data, no torch.

The run configuration (``selfplay.config``) embeds it as its ``trainer`` section and the command line reads it
to build ``--trainer.*`` flags, so it lives apart from the trainer (``agents.trainer``, which re-exports it):
parsing ``populora train --help`` or a bad flag imports no torch. The registries it names (estimators, loss
aggregation modes) are looked up when :meth:`TrainerConfig.validate` runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agents.registry_names import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, ROLE_WEIGHTINGS
from populora_env.checks import ConfigError, check, check_bool, check_choice, check_int, check_number, shown

__all__ = ["TrainerConfig", "RoleSettings", "ROLE_SETTINGS", "IS_CORRECTIONS", "KL_MODES", "LORA_IMPLS", "PACKINGS", "PACKED_ATTENTIONS"]

KL_MODES = ("off", "reward", "loss")
PACKINGS = ("prefix", "none")
PACKED_ATTENTIONS = ("tree", "mask", "flex")
LORA_IMPLS = ("fused", "peft")
IS_CORRECTIONS = ("none", "tis", "mis")


@dataclass
class RoleSettings:
    """One role's own values of the trainer settings a researcher tunes per role; each ``None`` (the default; an
    empty ``advantage_kwargs``) takes the shared value of the ``trainer`` section (``--trainer.teacher.lr 1e-4``
    sets the teachers' alone)."""

    advantage: str | None = None
    """Advantage estimator of this role's rows (shared: trainer.advantage)."""
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    """Its keyword arguments, JSON; empty: trainer.advantage-kwargs when the role's estimator is the shared one,
    none otherwise."""
    lr: float | None = None
    """AdamW learning rate of this role's members (population runs only: the baseline has one adapter)."""
    clip_eps_low: float | None = None
    """Ratio clipped below at 1 - clip_eps_low for this role's rows."""
    clip_eps_high: float | None = None
    """Ratio clipped above at 1 + clip_eps_high for this role's rows."""
    loss_agg_mode: str | None = None
    """Loss aggregation of this role's rows."""
    entropy_coef: float | None = None
    """Entropy bonus coefficient of this role's rows."""
    kl_coef: float | None = None
    """KL coefficient of this role's rows (the KL's mode, trainer.kl-mode, is shared)."""
    is_correction: Literal["none", "tis", "mis"] | None = None
    """Importance correction of this role's rows."""
    is_cap: float | None = None
    """The cap of this role's importance correction."""

    def overrides(self) -> dict[str, Any]:
        """The settings this role sets (name -> value; the ``None`` ones and empty kwargs left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and getattr(self, f.name) != {}}


ROLE_SETTINGS = tuple(f.name for f in dataclasses.fields(RoleSettings))
"""The trainer settings a role can set for itself (``trainer.teacher.<name>``, ``trainer.student.<name>``)."""


@dataclass
class TrainerConfig:
    """Hyperparameters of a policy-gradient update (one member, one batch of rollouts)."""

    advantage: str = "reinforce_pp_baseline"
    """Advantage estimator (``agents.advantages.list_advantages()``): grpo, dr_grpo, rloo, reinforce_pp,
    reinforce_pp_baseline. With singleton groups (one sample per prompt) reinforce_pp_baseline equals
    reinforce_pp, so the default serves students (n samples per task) and teachers alike."""
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the estimator, JSON (e.g. ``{"eps": 1e-4}`` for grpo, ``{"gamma": 0.99}``):
    each value of the JSON type the estimator's parameter declares (a number for ``float``, a string for
    ``str``, ...; any JSON value for an unannotated one)."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation (``agents.losses.list_loss_aggs()``): token-mean, seq-mean-token-mean,
    seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO, divides by the constant ``norm_len`` * G)."""
    norm_len: int | None = None
    """The constant L of ``seq-mean-token-sum-norm`` (e.g. max_new_tokens); None: longest completion of the
    batch."""
    clip_eps_low: float = 0.2
    """Ratio clipped below at 1 - clip_eps_low."""
    clip_eps_high: float = 0.2
    """Ratio clipped above at 1 + clip_eps_high (DAPO uses 0.28)."""
    lr: float = 1e-5
    """AdamW learning rate (LoRA: about 10x a full fine-tuning LR)."""
    weight_decay: float = 0.01
    """AdamW weight decay (veRL default)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float | None = 1.0
    """Clip the member's gradient to this global L2 norm; None: no clipping (the norm is still reported)."""
    micro_batch_size: int = 8
    """Rollouts per forward/backward pass (gradients are accumulated); bounds activation memory."""
    mini_batch_size: int | None = None
    """Rollouts per optimizer step; None: the whole batch (one step per epoch)."""
    epochs: int = 1
    """Passes over the batch. More than one step per batch makes the update off-policy (ratio != 1)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient c_ent (loss -= c_ent * agg(H)); AZR used 0.001. Entropy is always measured."""
    kl_mode: Literal["off", "reward", "loss"] = "off"
    """KL to the frozen base (adapters disabled): "off" (no reference pass), "reward" (-kl_coef * KL_est
    added to the token rewards before the advantage) or "loss" (kl_coef * agg(KL_est) added to the loss)."""
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    """k1, k2 or k3 (``agents.losses.KL_ESTIMATORS``); None: k1 in the reward, k3 as a loss."""
    kl_coef: float = 0.0
    """KL coefficient beta (0 with kl_mode != "off" measures the KL without penalising it)."""
    use_behaviour_logprobs: bool = False
    """Use ``Rollout.logprobs`` as the ratio denominator (error if missing) instead of the trainer's own."""
    gradient_checkpointing: bool = False
    """Recompute decoder activations in the backward pass (less memory, ~30% more compute)."""
    logprob_chunk_size: int = 1024
    """Completion tokens per LM-head chunk (bounds the size of the full-vocabulary logits)."""
    role_weighting: Literal["balanced", "tokens"] = "balanced"
    """How the roles of a mixed batch (the single-agent baseline's proposer and solver rows) share an update:
    "balanced" (the loss is the mean over the roles of each role's own token mean; ``agents.weighting``) or
    "tokens" (one token mean over everything: a role's share is its share of the tokens). A batch of one role
    (every population member) is the same under both."""
    skip_nonfinite_grad: bool = True
    """Skip the optimizer step (and report it) when the loss or the gradient norm is NaN/inf."""
    max_nonfinite_updates: int = 3
    """Stop the run (exit 2, naming the member and step; the last checkpoint stays intact) after this many
    consecutive updates of one member whose every optimizer step was skipped as non-finite."""
    packing: Literal["prefix", "none"] = "prefix"
    """Layout of the update's forward passes. "prefix": every common prompt prefix of a micro-batch once (a
    radix tree of the prompts), each completion after its prompt, trees bin-packed into rows without padding,
    with a tree attention mask and explicit position ids (``agents.packing``; same gradient up to float
    summation order). "none": one right-padded row per rollout (the layout before packing; for equality
    tests and ablations). Models whose attention takes no 4D mask (flash-attention kernels) use "none"
    whatever this says."""
    packed_attention: Literal["tree", "mask", "flex"] = "tree"
    """How the prefix-shared layout's attention runs. "tree": per query block over its ancestor columns only
    (``agents.tree_attention``: the pairs the tree mask forbids are never computed; on CUDA each block runs
    the flash kernel with a lower-right causal bias); "flex": PyTorch's flex_attention with the tree's block
    mask, compiled (CUDA only: it has no CPU backward); "mask": one dense SDPA call with the L x L additive mask
    (the computation before tree attention; for equality tests and ablations). The same values up to float
    summation order (docs/vllm.md, "Attention of packed rows", says which and why)."""
    max_tokens_per_row: int | None = None
    """Most token slots one forward pass of the update holds (the packed row: every shared prompt prefix once
    plus the completions; padded: rows x the longest): micro-batches close before a rollout that would exceed
    it, so the activations of a pass are bounded by it (``agents.forward``; a single longer rollout is a pass
    of its own). None: only ``micro_batch_size`` bounds a pass (the CPU presets)."""
    is_correction: Literal["none", "tis", "mis"] = "none"
    """Importance correction for the gap between the generator's sampling log-probs (``Rollout.logprobs``) and
    the trainer's: each token's surrogate is weighted by ``w_t = pi_old(a_t) / mu(a_t)``, "tis" truncated at
    ``is_cap`` (min(w_t, C)), "mis" masked above it (w_t if w_t <= C else 0); "none": unweighted (on CPU the HF
    generator and the trainer agree to float rounding). Math: ``agents.losses.policy_loss``."""
    is_cap: float = 2.0
    """The cap C of ``is_correction`` (TIS's truncation, MIS's mask threshold); >= 1."""
    lora_impl: Literal["fused", "peft"] = "fused"
    """How the member's LoRA modules run in the update. "fused": ``base(x) + s (x A^T) B^T`` with the low-rank
    product added by one ``addmm`` (:meth:`agents.population.LoRAPopulation.single`: two full-size passes per
    module and their backward fewer); "peft": PEFT's forward (writes ``(x A^T) B^T``, scales it, adds it). The
    same values up to float rounding."""
    skip_zero_advantage: bool = True
    """When the loss has no term but the policy gradient (entropy_coef == 0, kl_mode == "off"), a rollout whose
    advantages are all zero adds exactly zero to the loss and its gradient (l_t = -min(rho A, clip(rho) A) = 0
    for A = 0, whatever rho): leave it out of the forward/backward passes (and of the no-grad behaviour pass),
    normalising each mini-batch's loss with ALL its rows' token / sequence counts as before, so the gradient is
    the one computed with it, up to float summation order. A mini-batch with no other rollout takes no pass:
    the optimizer steps on zero gradients (AdamW still decays the weights and advances its moments, as it did
    after computing those zeros). Metrics that come from the forward (entropy, clip_frac, approx_kl) are over
    the rollouts the passes covered (absent when none); ``zero_advantage_rows`` counts those left out. In the
    main job about a third of the update's token slots belong to such rollouts (a whitening scope whose
    rewards are all equal: e.g. both of a teacher's proposals of one type invalid)."""

    teacher: RoleSettings = field(default_factory=RoleSettings)
    """The teachers' own settings (each None: the shared value above); the baseline's proposer rows."""
    student: RoleSettings = field(default_factory=RoleSettings)
    """The students' own settings (each None: the shared value above); the baseline's solver rows."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]

    def for_role(self, role: str | None) -> TrainerConfig:
        """The settings ``role`` (``"teacher"`` / ``"student"``) trains with: the shared ones with the role's own
        in their place (an estimator the role changes drops the shared kwargs, which were the shared
        estimator's). ``self`` for another role or when the role sets nothing."""
        settings = getattr(self, role, None) if role in ("teacher", "student") else None
        changes = settings.overrides() if isinstance(settings, RoleSettings) else {}
        if not changes:
            return self
        if "advantage" in changes and "advantage_kwargs" not in changes and changes["advantage"] != self.advantage:
            changes["advantage_kwargs"] = {}
        return dataclasses.replace(self, **changes, teacher=RoleSettings(), student=RoleSettings())

    @property
    def per_role(self) -> bool:
        """Whether a role sets a value of its own."""
        return bool(self.teacher.overrides() or self.student.overrides())

    def role_record(self) -> dict[str, dict[str, Any]]:
        """What each role trains with, for config.json: ``{"teacher": {name: value}, "student": {...}}`` over
        :data:`ROLE_SETTINGS`."""
        return {role: {name: getattr(self.for_role(role), name) for name in ROLE_SETTINGS}
                for role in ("teacher", "student")}

    def validate(self) -> None:
        """Check every hyperparameter; raise :class:`~populora_env.checks.ConfigError` naming the first bad field.

        The plain values first, then the names looked up in registries (the estimator, its keyword arguments
        against its signature, the aggregation mode, the KL estimator, the role weighting): those registries
        live beside their torch code, so a bad plain value is reported without importing torch. The lookups
        happen now, so that estimators and modes registered after the config was made (plugins) are accepted.
        """
        check(isinstance(self.advantage_kwargs, Mapping), "advantage_kwargs",
              f"must be a mapping, got {self.advantage_kwargs!r}")
        if self.norm_len is not None:
            check_int("norm_len", self.norm_len, 1)
        check_number("clip_eps_low", self.clip_eps_low, low=0.0, high=1.0, high_open=True)
        check_number("clip_eps_high", self.clip_eps_high, low=0.0, high=1e6)
        check_number("lr", self.lr, low=0.0, high=1.0, low_open=True)
        check_number("weight_decay", self.weight_decay, low=0.0, high=1e6)
        check(isinstance(self.betas, tuple) and len(self.betas) == 2, "betas", f"must be two numbers, got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_number(f"betas[{i}]", beta, low=0.0, high=1.0, high_open=True)
        if self.max_grad_norm is not None:
            check_number("max_grad_norm", self.max_grad_norm, low=0.0, high=1e12, low_open=True)
        check_int("micro_batch_size", self.micro_batch_size, 1, 1 << 20)
        if self.mini_batch_size is not None:
            check_int("mini_batch_size", self.mini_batch_size, 1, 1 << 20)
        check_int("epochs", self.epochs, 1, 1 << 16)
        check_number("entropy_coef", self.entropy_coef, low=-1e6, high=1e6)
        check_choice("kl_mode", self.kl_mode, KL_MODES)
        check_number("kl_coef", self.kl_coef, low=0.0, high=1e6)
        check(self.kl_mode != "off" or self.kl_coef == 0, "kl_coef",
              f"{shown(self.kl_coef)} has no effect with kl_mode 'off'; set kl_mode")
        for name in ("use_behaviour_logprobs", "gradient_checkpointing", "skip_nonfinite_grad", "skip_zero_advantage"):
            check_bool(name, getattr(self, name))
        check_int("logprob_chunk_size", self.logprob_chunk_size, 1, 1 << 24)
        check_int("max_nonfinite_updates", self.max_nonfinite_updates, 1, 1 << 20)
        check_choice("packing", self.packing, PACKINGS)
        check_choice("packed_attention", self.packed_attention, PACKED_ATTENTIONS)
        check_choice("lora_impl", self.lora_impl, LORA_IMPLS)
        if self.max_tokens_per_row is not None:
            check_int("max_tokens_per_row", self.max_tokens_per_row, 16, 1 << 24)
        check_choice("is_correction", self.is_correction, IS_CORRECTIONS)
        check_number("is_cap", self.is_cap, low=1.0, high=1e6)
        check(self.is_correction == "none" or not self.use_behaviour_logprobs, "is_correction",
              f"{self.is_correction!r} weighs the ratio with the trainer's own log-probs as its denominator; "
              "use_behaviour_logprobs puts the generator's there: set one of them")
        self._validate_names()
        self._validate_roles()

    def _validate_roles(self) -> None:
        """Each role's settings, checked as the config that role trains with (an error names the role's
        field: ``teacher.lr``)."""
        for role in ("teacher", "student"):
            settings = getattr(self, role)
            check(isinstance(settings, RoleSettings), role, f"must be the role's settings, got {settings!r}")
            if settings.overrides():
                try:
                    self.for_role(role).validate()
                except ConfigError as exc:
                    raise ConfigError(f"{role}.{exc.field}", exc.reason) from None

    def _validate_names(self) -> None:
        """The settings checked against the registries of :mod:`agents.advantages` and :mod:`agents.losses`
        (imported here, not at module level: they import torch), after the fixed sets and the refusals that need
        no torch (:mod:`agents.registry_names`)."""
        if self.kl_estimator is not None:
            check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        check_choice("role_weighting", self.role_weighting, ROLE_WEIGHTINGS)
        if "agents.advantages" not in sys.modules:  # nothing can have registered another estimator yet
            _known("advantage", self.advantage, ADVANTAGES, "advantage estimator")
        if "agents.losses" not in sys.modules:
            _known("loss_agg_mode", self.loss_agg_mode, LOSS_AGGS, "loss aggregation mode")
        from agents.advantages import estimator_params, get_advantage, list_advantages
        from agents.losses import list_loss_aggs

        _known("advantage", self.advantage, list_advantages(), "advantage estimator")
        estimator = get_advantage(self.advantage)
        accepted = estimator_params(estimator)
        for key, value in self.advantage_kwargs.items():
            check(key in accepted, "advantage_kwargs",
                  f"estimator {self.advantage!r} takes no keyword argument {key!r} (it takes: "
                  f"{', '.join(accepted) or 'none'})")
            _check_kwarg(f"advantage_kwargs.{key}", value, _declared(estimator, key))
        _known("loss_agg_mode", self.loss_agg_mode, list_loss_aggs(), "loss aggregation mode")

    @property
    def resolved_kl_estimator(self) -> str:
        """The KL estimator in use: ``kl_estimator``, or k1 (reward) / k3 (loss) by default."""
        if self.kl_estimator is not None:
            return self.kl_estimator
        return "k1" if self.kl_mode == "reward" else "k3"


_JSON_TYPES: dict[Any, tuple[type, ...]] = {float: (int, float), int: (int,), str: (str,), bool: (bool,),
                                            list: (list,), dict: (dict,)}


def _declared(fn: Any, name: str) -> Any:
    """The annotation of ``fn``'s parameter ``name`` (resolved when it is a string), ``Any`` when none."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: the value is not type-checked
        hints = {}
    if name in hints:
        return hints[name]
    try:
        annotation = inspect.signature(fn).parameters[name].annotation
    except (KeyError, TypeError, ValueError):
        return Any
    return Any if annotation is inspect.Parameter.empty or isinstance(annotation, str) else annotation


def _check_kwarg(path: str, value: Any, declared: Any) -> None:
    """An estimator keyword argument of the JSON type its parameter declares (``float``: a finite number,
    ``int``, ``str``, ``bool``, ``list``, ``dict``, ``X | None``; any JSON value for another annotation or none)."""
    union = typing.get_origin(declared) in (typing.Union, types.UnionType)
    options = typing.get_args(declared) if union else (declared,)
    if value is None and type(None) in options:
        return
    allowed = [_JSON_TYPES.get(typing.get_origin(o) or o) for o in options if o is not type(None)]
    if any(a is None for a in allowed) or not allowed:
        return
    ok = any(isinstance(value, a) and not (isinstance(value, bool) and bool not in a) for a in allowed if a)
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    check(ok, path, f"must be {names} (the estimator's parameter), got {value!r}")
    if isinstance(value, float | int) and not isinstance(value, bool):
        check_number(path, value, low=-1e12, high=1e12)


def _known(field_name: str, name: str, known: Sequence[str], what: str) -> None:
    check(name in known, field_name, f"unknown {what} {name!r} (known: {', '.join(known)})")
