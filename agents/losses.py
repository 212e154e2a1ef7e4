"""Token-level policy-gradient loss: clipped importance ratio, aggregation modes, KL estimators, entropy.

Notation: for a valid completion token t of sequence i, lp = log pi_theta(a_t), lp_old = behaviour log-prob,
rho_t = exp(lp - lp_old), A_t = advantage, m_{i,t} = response mask, H_t = entropy of the full next-token
distribution, delta_t = lp - lp_ref (reference = the frozen base).

Per-token policy-gradient term (PPO clip, DAPO's asymmetric epsilons)::

    l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

Total loss (verl's ``policy_loss = pg_loss - entropy_coeff * entropy_loss (+ kl_coef * kl_loss)``)::

    L = agg(l) - c_ent * agg(H) + beta * agg(KL_est(delta))

with ``agg`` one of the registered aggregation modes (below) and the KL term present only when reference
log-probs are given (KL *as a loss*; KL *in the reward* is applied to the rewards before the advantage, see
``agents.trainer``), plus ``coef * agg(f)`` for every registered extra term ``f`` (:func:`register_loss_term`).
With one optimizer step per batch rho = 1 and clipping is inert (AZR).

Importance correction of the sampler (``is_weights``; ``agents.trainer``'s ``is_correction``). The rollouts
were sampled by the generator mu (e.g. vLLM, in bf16 with its own kernels), not by the trainer's pi_old that
rho is taken against; with ``w_t = pi_old(a_t) / mu(a_t) = exp(lp_old_t - lp_mu_t)`` (detached),
``E_mu[w_t g_t] = E_pi_old[g_t]``, so the surrogate of each token is weighted::

    l_t = -w'_t min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

    TIS (truncated):  w'_t = min(w_t, C)
    MIS (masked):     w'_t = w_t if w_t <= C else 0

TIS bounds the variance a rare token with a large weight adds, at the cost of a bias towards pi_old where
w_t > C; MIS drops such tokens from the gradient instead (they keep their place in the normaliser). Where the
two samplers agree w_t = 1 and both equal the uncorrected loss.

Where ``A_t = 0`` the surrogate is ``l_t = -min(rho_t * 0, clip(rho_t) * 0) = 0`` whatever rho_t, with a zero
gradient; the entropy bonus and the KL penalty are not (they regularise every token). A row whose advantages
are all zero therefore adds exactly nothing to the loss and its gradient only when every other term with a
non-zero coefficient declares the same of itself: :func:`zero_advantage_rows_add_zero`, which the trainer
asks before leaving such rows out of its passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from populora_env.registry import Registry

__all__ = [
    "AggFn",
    "register_loss_agg",
    "unregister_loss_agg",
    "get_loss_agg",
    "list_loss_aggs",
    "agg_loss",
    "kl_penalty",
    "KL_ESTIMATORS",
    "entropy_from_logits",
    "logprobs_from_logits",
    "LossInputs",
    "LossTerm",
    "register_loss_term",
    "unregister_loss_term",
    "list_loss_terms",
    "zero_advantage_rows_add_zero",
    "PolicyLossOutput",
    "policy_loss",
]

# ------------------------------------------------------------------------------------ aggregation modes

AggFn = Callable[[Tensor, Tensor, float, float, float], Tensor]
"""``fn(loss_mat, mask, num_tokens, num_seqs, norm_len) -> scalar``: see :func:`agg_loss`."""

_AGG: Registry[AggFn] = Registry("loss aggregation mode")


def register_loss_agg(name: str) -> Callable[[AggFn], AggFn]:
    """Decorator registering a loss aggregation mode.

    Raises:
        DuplicateEntryError: (a ValueError) ``name`` is already registered.
    """
    return _AGG.decorator(name)


def unregister_loss_agg(name: str) -> AggFn:
    """Remove ``name`` from the registry and return its function (for plugins and tests).

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) ``name`` is not registered.
    """
    return _AGG.remove(name)


def get_loss_agg(name: str) -> AggFn:
    """The aggregation registered under ``name``.

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) unknown name; the message lists the known modes.
    """
    return _AGG.get(name)


def list_loss_aggs() -> list[str]:
    """Names of the registered aggregation modes, sorted."""
    return _AGG.names()


@register_loss_agg("token-mean")
def _token_mean(
    loss_mat: Tensor, mask: Tensor, num_tokens: float, num_seqs: float, norm_len: float
) -> Tensor:
    """sum_{i,t} l_{i,t} m_{i,t} / N_tok (verl default, TRL ``dapo``): every token weighs the same."""
    return (loss_mat * mask).sum() / num_tokens


@register_loss_agg("seq-mean-token-mean")
def _seq_mean_token_mean(
    loss_mat: Tensor, mask: Tensor, num_tokens: float, num_seqs: float, norm_len: float
) -> Tensor:
    """(1/G) sum_i (1/|o_i|) sum_t l_{i,t} m_{i,t} (TRL ``grpo``; length-biased). Empty sequences add 0."""
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / num_seqs


@register_loss_agg("seq-mean-token-sum")
def _seq_mean_token_sum(
    loss_mat: Tensor, mask: Tensor, num_tokens: float, num_seqs: float, norm_len: float
) -> Tensor:
    """(1/G) sum_i sum_t l_{i,t} m_{i,t}."""
    return (loss_mat * mask).sum() / num_seqs


@register_loss_agg("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    loss_mat: Tensor, mask: Tensor, num_tokens: float, num_seqs: float, norm_len: float
) -> Tensor:
    """sum_{i,t} l_{i,t} m_{i,t} / (L * G), L a constant length (Dr. GRPO; TRL ``dr_grpo``)."""
    return (loss_mat * mask).sum() / (norm_len * num_seqs)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_len: float | None = None,
) -> Tensor:
    """Aggregate a per-token matrix ``loss_mat[B, T]`` into a scalar.

    Normalisers default to this call's batch: N_tok = sum(mask), G = B, L = T. For gradient accumulation over
    micro-batches pass the GLOBAL values (tokens / sequences of the whole optimizer batch, and one constant
    L): then the micro-batch losses add up exactly to the full-batch loss for every mode.

    Modes: ``token-mean`` = sum l m / N_tok; ``seq-mean-token-mean`` = (1/G) sum_i mean_t over o_i;
    ``seq-mean-token-sum`` = (1/G) sum_i sum_t; ``seq-mean-token-sum-norm`` = sum l m / (L G).
    """
    m = mask.to(loss_mat.dtype)
    n_tok = float(m.sum().item()) if num_tokens is None else float(num_tokens)
    n_seq = float(m.shape[0]) if num_seqs is None else float(num_seqs)
    length = float(m.shape[-1]) if norm_len is None else float(norm_len)
    return get_loss_agg(mode)(loss_mat, m, max(n_tok, 1.0), max(n_seq, 1.0), max(length, 1.0))


# ------------------------------------------------------------------------------------------ KL estimators


def _k1(delta: Tensor) -> Tensor:
    return delta


def _k2(delta: Tensor) -> Tensor:
    return 0.5 * delta.square()


def _k3(delta: Tensor) -> Tensor:
    return (torch.exp(-delta) - 1 + delta).clamp(min=-10.0, max=10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
"""Per-token KL(pi_theta || pi_ref) estimators of delta = lp - lp_ref (samples from pi_theta):
``k1`` = delta (unbiased, can be negative; verl ``kl``), ``k2`` = delta^2 / 2 (verl ``mse``),
``k3`` = exp(-delta) - 1 + delta >= 0 (unbiased, low variance; verl ``low_var_kl``, clamped to [-10, 10]
as verl does)."""


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate from log-probs of the sampled tokens (see :data:`KL_ESTIMATORS`).

    Raises:
        KeyError: unknown estimator; the message lists the known ones.
    """
    if estimator not in KL_ESTIMATORS:
        raise KeyError(f"unknown KL estimator {estimator!r}; known: {', '.join(sorted(KL_ESTIMATORS))}")
    delta = (logprobs - ref_logprobs).clamp(min=-20.0, max=20.0)
    return KL_ESTIMATORS[estimator](delta)


# -------------------------------------------------------------------------------- log-probs and entropy


def logprobs_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] in float32: ``logits[..., V]``, ``targets[...]`` -> ``[...]``."""
    z = logits.float()
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the full next-token distribution, H = logsumexp(z) - sum_v softmax(z)_v z_v, float32."""
    z = logits.float()
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)


# ------------------------------------------------------------------------------------- extra loss terms


@dataclass(frozen=True)
class LossInputs:
    """What an extra loss term reads, each ``[B, T]`` like the response mask: ``logprobs`` (with grad),
    ``old_logprobs`` and ``advantages`` (detached), ``mask`` (valid completion tokens), ``ref_logprobs`` (the
    base's, detached; None unless the KL is a loss term: the trainer's ``kl_mode == "loss"``)."""

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logprobs: Tensor | None


@dataclass(frozen=True)
class LossTerm:
    """A term ``coef * agg(w * fn(inputs))`` that :func:`policy_loss` adds to every loss it computes.

    Attributes:
        fn: ``LossInputs -> [B, T]`` per-token values.
        coef: its coefficient (negative for a bonus).
        vanishes_at_zero_advantage: ``fn`` is 0, with a zero gradient, on every token whose advantage is 0
            (e.g. ``A_t * g(lp_t)``). Undeclared (the default), a row whose advantages are all zero keeps its
            forward/backward pass: :func:`zero_advantage_rows_add_zero`.
    """

    fn: Callable[[LossInputs], Tensor]
    coef: float
    vanishes_at_zero_advantage: bool = False


_TERMS: Registry[LossTerm] = Registry("loss term")
_OWN_METRICS = ("clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max", "entropy",
                "kl", "tokens")


def register_loss_term(
    name: str, coef: float, *, vanishes_at_zero_advantage: bool = False
) -> Callable[[Callable[[LossInputs], Tensor]], Callable[[LossInputs], Tensor]]:
    """Decorator adding ``coef * agg(fn(inputs))`` to every :func:`policy_loss` from now on (a plugin's
    regulariser); its token-weighted mean is reported as metric ``name``.

    Raises:
        DuplicateEntryError: (a ValueError) ``name`` is already registered.
        ValueError: ``name`` is one of :func:`policy_loss`'s own metrics.
    """
    if name in _OWN_METRICS:
        raise ValueError(f"loss term name {name!r} is taken by a metric of policy_loss ({', '.join(_OWN_METRICS)})")

    def add(fn: Callable[[LossInputs], Tensor]) -> Callable[[LossInputs], Tensor]:
        _TERMS.add(name, LossTerm(fn, float(coef), vanishes_at_zero_advantage))
        return fn

    return add


def unregister_loss_term(name: str) -> LossTerm:
    """Remove the extra term ``name`` and return it.

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) ``name`` is not registered.
    """
    return _TERMS.remove(name)


def list_loss_terms() -> list[str]:
    """Names of the registered extra terms, sorted."""
    return _TERMS.names()


def zero_advantage_rows_add_zero(entropy_coef: float = 0.0, kl_coef: float = 0.0) -> bool:
    """Whether a row whose advantages are all zero adds exactly zero to :func:`policy_loss` (with these
    coefficients) and to its gradient: true when the clipped surrogate (zero at ``A = 0``, module docstring)
    is the only term with a non-zero coefficient that does not vanish there. The entropy bonus and the KL
    penalty never do; an extra term does when it declares ``vanishes_at_zero_advantage``."""
    if entropy_coef != 0.0 or kl_coef != 0.0:
        return False
    return all(term.vanishes_at_zero_advantage for _, term in _TERMS.items() if term.coef != 0.0)


# ------------------------------------------------------------------------------------------- the loss


@dataclass
class PolicyLossOutput:
    """Result of :func:`policy_loss`.

    Attributes:
        loss: the scalar to back-propagate (pg - c_ent * entropy + beta * kl + the extra terms).
        pg_loss: the aggregated clipped surrogate alone.
        metrics: floats, each a masked mean over this call's valid tokens: ``clip_frac`` (fraction of tokens
            where the clipped branch is active: -clip(rho)A > -rho A), ``clip_frac_low`` / ``clip_frac_high``
            (rho below 1 - eps_low with A < 0 / above 1 + eps_high with A > 0), ``approx_kl`` (k3 estimate of
            KL(pi_old || pi_theta) from the behaviour samples: mean of rho - 1 - log rho, >= 0), ``ratio_mean``, ``ratio_max``,
            ``entropy`` (if entropy was given), ``kl`` (k-estimate to the reference, if given), one per extra
            term (its name), and ``tokens`` (the number of valid tokens the means are over, for weighting
            across micro-batches).
    """

    loss: Tensor
    pg_loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _masked_mean(x: Tensor, m: Tensor) -> float:
    n = m.sum()
    return float(((x * m).sum() / n).item()) if n.item() > 0 else 0.0


def _check_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                  clip_eps_low: float, clip_eps_high: float, token_weights: Tensor | None,
                  is_weights: Tensor | None = None) -> None:
    """Refuse tensors of different shapes and clip ranges outside ``0 <= eps_low < 1``, ``eps_high >= 0``."""
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            "logprobs, old_logprobs, advantages and response_mask must have one shape, got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(advantages.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    if clip_eps_low < 0 or clip_eps_high < 0 or clip_eps_low >= 1:
        raise ValueError(
            f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {clip_eps_low}, {clip_eps_high}"
        )
    for name, w in (("token_weights", token_weights), ("is_weights", is_weights)):
        if w is not None and w.shape != response_mask.shape:
            raise ValueError(f"{name} must be {tuple(response_mask.shape)}, got {tuple(w.shape)}")


def _ratio_metrics(ratio: Tensor, log_ratio: Tensor, adv: Tensor, pg1: Tensor, pg2: Tensor, m: Tensor,
                   clip_eps_low: float, clip_eps_high: float) -> dict[str, float]:
    """The clipping and ratio metrics of :class:`PolicyLossOutput`."""
    with torch.no_grad():
        lr_d = log_ratio.detach()
        return {
            "clip_frac": _masked_mean((pg2 > pg1).to(m.dtype), m),
            "clip_frac_low": _masked_mean(((ratio < 1.0 - clip_eps_low) & (adv < 0)).to(m.dtype), m),
            "clip_frac_high": _masked_mean(((ratio > 1.0 + clip_eps_high) & (adv > 0)).to(m.dtype), m),
            "approx_kl": _masked_mean(torch.expm1(lr_d) - lr_d, m),
            "ratio_mean": _masked_mean(ratio.detach(), m),
            "ratio_max": float(ratio.detach()[m > 0].max().item()) if m.sum().item() > 0 else math.nan,
            "tokens": float(m.sum().item()),
        }


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_len: float | None = None,
    token_weights: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """Clipped token-level policy-gradient loss (module docstring for the math).

    Args:
        logprobs: ``[B, T]`` log pi_theta of the completion tokens (with grad).
        old_logprobs: ``[B, T]`` behaviour log-probs (detached here).
        advantages: ``[B, T]`` (detached here).
        response_mask: ``[B, T]`` valid completion tokens.
        clip_eps_low, clip_eps_high: the ratio is clipped to [1 - eps_low, 1 + eps_high].
        loss_agg_mode: a registered aggregation mode (:func:`agg_loss`).
        entropy: ``[B, T]`` per-token entropy; measured always, subtracted with ``entropy_coef`` (needs grad
            only if ``entropy_coef != 0``).
        ref_logprobs: ``[B, T]`` reference log-probs: adds ``kl_coef * agg(KL_est(lp - lp_ref))`` (KL as a loss).
        kl_estimator: ``k1``/``k2``/``k3`` (:data:`KL_ESTIMATORS`).
        num_tokens, num_seqs, norm_len: global normalisers for gradient accumulation (:func:`agg_loss`).
        token_weights: ``[B, T]`` loss weights w (e.g. ``agents.weighting.role_loss_weights``): every per-token
            loss matrix (surrogate, entropy, KL, extra terms) is aggregated as ``agg(w * l)``; the metrics stay
            unweighted means. None: w = 1.
        is_weights: ``[B, T]`` TIS / MIS weights w'_t (module docstring) of the surrogate's terms only; None: 1.
    """
    _check_inputs(logprobs, old_logprobs, advantages, response_mask, clip_eps_low, clip_eps_high, token_weights,
                  is_weights)
    m = response_mask.to(logprobs.dtype)
    w = None if token_weights is None else token_weights.detach().to(logprobs.dtype)

    def weighted(mat: Tensor) -> Tensor:
        return mat if w is None else mat * w

    adv = advantages.detach().to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs.detach()).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg_mat = torch.maximum(pg1, pg2) if is_weights is None else torch.maximum(pg1, pg2) * is_weights.detach()
    norms = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_len": norm_len}
    pg_loss = agg_loss(weighted(pg_mat), m, loss_agg_mode, **norms)
    loss = pg_loss
    metrics = _ratio_metrics(ratio, log_ratio, adv, pg1, pg2, m, clip_eps_low, clip_eps_high)
    if entropy is not None:
        if entropy.shape != m.shape:
            raise ValueError(f"entropy must be {tuple(m.shape)}, got {tuple(entropy.shape)}")
        metrics["entropy"] = _masked_mean(entropy.detach(), m)
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * agg_loss(weighted(entropy), m, loss_agg_mode, **norms)
    elif entropy_coef != 0.0:
        raise ValueError("entropy_coef != 0 needs the per-token entropy")
    if ref_logprobs is not None:
        kl_mat = kl_penalty(logprobs, ref_logprobs.detach(), kl_estimator)
        metrics["kl"] = _masked_mean(kl_mat.detach(), m)
        if kl_coef != 0.0:
            loss = loss + kl_coef * agg_loss(weighted(kl_mat), m, loss_agg_mode, **norms)
    elif kl_coef != 0.0:
        raise ValueError("kl_coef != 0 needs ref_logprobs")
    inputs = LossInputs(logprobs, old_logprobs.detach(), adv, m, None if ref_logprobs is None else ref_logprobs.detach())
    for name, term in _TERMS.items():
        mat = term.fn(inputs)
        metrics[name] = _masked_mean(mat.detach(), m)
        if term.coef != 0.0:
            loss = loss + term.coef * agg_loss(weighted(mat), m, loss_agg_mode, **norms)
    return PolicyLossOutput(loss=loss, pg_loss=pg_loss.detach(), metrics=metrics)
