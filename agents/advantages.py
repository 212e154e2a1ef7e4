"""Advantage estimators for outcome-reward policy gradients, behind a registry.

Every estimator has the signature::

    fn(rewards, response_mask, group_ids, *, scope_ids=None, token_rewards=None, **kw) -> Tensor[B, T]

* ``rewards``: ``Tensor[B]``, one scalar per completion, conceptually placed on its last valid token;
* ``response_mask``: ``Tensor[B, T]`` (bool or 0/1), 1 on the valid completion tokens (right padding);
* ``group_ids``: ``B`` hashables, the baseline group of each completion (e.g. its prompt/task id);
* ``scope_ids``: ``B`` hashables or ``None``: the normalisation scope of the whitening estimators
  (REINFORCE++ family); ``None`` means one scope for the whole batch. Group estimators ignore it;
* ``token_rewards``: optional ``Tensor[B, T]`` of extra per-token rewards (e.g. ``-beta * k1`` when the KL
  penalty is put in the reward). The whitening estimators add them to the returns (reward-to-go); the group
  estimators use the sequence score ``s_i = r_i + sum_t token_rewards[i, t]`` (verl's convention).

The result is zero on padding positions. Notation below: ``s_i`` = score of completion ``i`` (its reward),
``g`` = its group with ``n_g`` members, ``mu_g`` = group mean, ``sigma_g`` = unbiased group std
(``torch.std``), ``eps = 1e-6``; ``m_{i,t}`` = response mask. Formulas follow verl/OpenRLHF
(docs/anchors.md §2.1).

Register a new estimator with ``@register_advantage("name")``; fetch one with ``get_advantage(name)``. The
settings a run passes to an estimator (``--trainer.advantage-kwargs``) are its *named* keyword parameters other
than the five above (:func:`estimator_params`): a ``**kw`` catch-all receives what the trainer passes and
accepts no setting of its own, so a misspelt key is refused before the run starts instead of being ignored.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from agents.rollout import Rollout
from populora_env.registry import Registry

__all__ = [
    "AdvantageFn",
    "register_advantage",
    "unregister_advantage",
    "get_advantage",
    "list_advantages",
    "estimator_params",
    "TRAINER_ARGS",
    "masked_whiten",
    "group_by_prompt",
    "group_by_role_task",
    "group_by_member",
]

GROUP_EPS = 1e-6
WHITEN_EPS = 1e-8


class AdvantageFn(Protocol):
    """The estimator signature (see the module docstring)."""

    def __call__(
        self,
        rewards: Tensor,
        response_mask: Tensor,
        group_ids: Sequence[Hashable],
        **kw: Any,
    ) -> Tensor: ...


_REGISTRY: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an advantage estimator under ``name``.

    Raises:
        DuplicateEntryError: (a ValueError) ``name`` is already registered (names are never silently replaced).
    """
    return _REGISTRY.decorator(name)


def unregister_advantage(name: str) -> AdvantageFn:
    """Remove ``name`` from the registry and return its estimator (for plugins and tests).

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) ``name`` is not registered.
    """
    return _REGISTRY.remove(name)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under ``name``.

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) unknown name; the message lists the known names.
    """
    return _REGISTRY.get(name)


def list_advantages() -> list[str]:
    """Names of the registered estimators, sorted."""
    return _REGISTRY.names()


TRAINER_ARGS = ("rewards", "response_mask", "group_ids", "scope_ids", "token_rewards")
"""The arguments the trainer passes to every estimator (the module docstring's signature)."""


def estimator_params(fn: Callable[..., Any]) -> dict[str, Any]:
    """The settings ``fn`` takes, in order: its named keyword parameters other than :data:`TRAINER_ARGS`,
    each with its default (``inspect.Parameter.empty`` if it has none)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no setting can be checked, none is accepted
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in params if p.kind in kinds and p.name not in TRAINER_ARGS}


# --------------------------------------------------------------------------------------------- helpers


def _check(rewards: Tensor, response_mask: Tensor, ids: Sequence[Hashable] | None, what: str) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"response_mask must be [B, T] with B = {rewards.shape[0]}, got {tuple(response_mask.shape)}"
        )
    if ids is not None and len(ids) != rewards.shape[0]:
        raise ValueError(f"{what} has {len(ids)} entries for a batch of {rewards.shape[0]}")


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.float()


def _index_groups(ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(ids):
        groups[g].append(i)
    return groups


def _scores(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """Sequence scores s_i = r_i + sum_t token_rewards[i, t] * m_{i,t}."""
    s = _float(rewards).clone()
    if token_rewards is not None:
        s = s + (token_rewards * response_mask.to(token_rewards.dtype)).sum(-1).to(s.dtype)
    return s


def _group_stats(scores: Tensor, group_ids: Sequence[Hashable]) -> tuple[Tensor, Tensor, Tensor]:
    """Per-completion (group mean, unbiased group std, group size); a group of one gets mean 0, std 1."""
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    size = torch.ones_like(scores)
    for idx in _index_groups(group_ids).values():
        if len(idx) == 1:
            continue  # verl convention: mu = 0, sigma = 1
        ix = torch.tensor(idx, device=scores.device)
        s = scores[ix]
        mean[ix] = s.mean()
        std[ix] = s.std()  # unbiased (Bessel), as torch.std
        size[ix] = float(len(idx))
    return mean, std, size


def _broadcast(per_seq: Tensor, response_mask: Tensor) -> Tensor:
    return per_seq[:, None] * response_mask.to(per_seq.dtype)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = WHITEN_EPS) -> Tensor:
    """Whiten ``values`` over the valid (``mask``) entries; zero elsewhere.

    With N = sum(mask), mean = sum(x m) / N and the Bessel-corrected variance
    var = sum((x - mean)^2 m) / (N - 1), the result is (x - mean) / sqrt(var + eps) on valid entries (verl's
    ``masked_whiten``). With N <= 1 the variance is undefined: the values are only centred (x - mean), which
    is 0 for a single token (verl raises instead). With N = 0 the result is all zeros.
    """
    m = mask.to(values.dtype)
    n = m.sum()
    if n.item() == 0:
        return torch.zeros_like(values)
    mean = (values * m).sum() / n
    centred = (values - mean) * m
    if n.item() <= 1:
        return centred
    var = (centred.pow(2)).sum() / (n - 1)
    return centred * torch.rsqrt(var + eps)


def _scoped_whiten(values: Tensor, mask: Tensor, scope_ids: Sequence[Hashable] | None) -> Tensor:
    if scope_ids is None:
        return masked_whiten(values, mask)
    out = torch.zeros_like(values)
    for idx in _index_groups(scope_ids).values():
        ix = torch.tensor(idx, device=values.device)
        out[ix] = masked_whiten(values[ix], mask[ix])
    return out


def _returns(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None, gamma: float) -> Tensor:
    """Discounted reward-to-go G_t = r_t + gamma G_{t+1} of token rewards r_t: the scalar reward on the last
    valid token plus ``token_rewards`` (if any), masked. With gamma = 1 and no token rewards, G_t = r on
    every valid token."""
    m = response_mask.to(_float(rewards).dtype)
    B, T = m.shape
    r = torch.zeros_like(m)
    lengths = m.sum(-1).long()
    has = lengths > 0
    # last valid token of each row (first nonzero of the reversed mask)
    last = T - 1 - torch.flip(m, dims=[1]).argmax(dim=1)
    rows = torch.arange(B, device=m.device)[has]
    r[rows, last[has]] = _float(rewards)[has].to(r.dtype)
    if token_rewards is not None:
        r = r + token_rewards.to(r.dtype) * m
    if gamma == 1.0:
        out = torch.flip(torch.cumsum(torch.flip(r, dims=[1]), dim=1), dims=[1])
    else:
        out = torch.zeros_like(r)
        running = torch.zeros(B, dtype=r.dtype, device=r.device)
        for t in range(T - 1, -1, -1):
            running = r[:, t] + gamma * running
            out[:, t] = running
    return out * m


# ------------------------------------------------------------------------------------------ estimators


@register_advantage("grpo")
def grpo(
    rewards: Tensor,
    response_mask: Tensor,
    group_ids: Sequence[Hashable],
    *,
    eps: float = GROUP_EPS,
    token_rewards: Tensor | None = None,
    **_: Any,
) -> Tensor:
    """GRPO (verl ``grpo``): A_{i,t} = (s_i - mu_g) / (sigma_g + eps) * m_{i,t}.

    sigma_g is the unbiased std (``torch.std``), eps = 1e-6. A group of size 1 gets mu = 0, sigma = 1 as in
    verl, i.e. A = s_i / (1 + eps). A group whose rewards are all equal gets A = 0. ``scope_ids`` is ignored.
    """
    _check(rewards, response_mask, group_ids, "group_ids")
    s = _scores(rewards, response_mask, token_rewards)
    mean, std, _ = _group_stats(s, group_ids)
    return _broadcast((s - mean) / (std + eps), response_mask)


@register_advantage("dr_grpo")
def dr_grpo(
    rewards: Tensor,
    response_mask: Tensor,
    group_ids: Sequence[Hashable],
    *,
    token_rewards: Tensor | None = None,
    **_: Any,
) -> Tensor:
    """Dr. GRPO (Liu et al. 2025; verl ``grpo`` with ``norm_adv_by_std_in_grpo=False``):
    A_{i,t} = (s_i - mu_g) * m_{i,t}, no division by the std.

    A group of size 1 gets mu = 0 as in verl (A = s_i). Pair it with the ``seq-mean-token-sum-norm`` loss
    aggregation (constant normaliser L * G) to get the full Dr. GRPO objective. ``scope_ids`` is ignored.
    """
    _check(rewards, response_mask, group_ids, "group_ids")
    s = _scores(rewards, response_mask, token_rewards)
    mean, _, _ = _group_stats(s, group_ids)
    return _broadcast(s - mean, response_mask)


@register_advantage("rloo")
def rloo(
    rewards: Tensor,
    response_mask: Tensor,
    group_ids: Sequence[Hashable],
    *,
    token_rewards: Tensor | None = None,
    **_: Any,
) -> Tensor:
    """RLOO (leave-one-out baseline): A_{i,t} = (s_i - (1/(n_g - 1)) sum_{j in g, j != i} s_j) * m_{i,t}
    = n_g/(n_g - 1) * (s_i - mu_g) * m_{i,t}.

    A group of size 1 has no other member to form a baseline: its advantage is 0 (no learning signal;
    verl instead leaves the raw score s_i). ``scope_ids`` is ignored.
    """
    _check(rewards, response_mask, group_ids, "group_ids")
    s = _scores(rewards, response_mask, token_rewards)
    adv = torch.zeros_like(s)
    for idx in _index_groups(group_ids).values():
        n = len(idx)
        if n == 1:
            continue
        ix = torch.tensor(idx, device=s.device)
        g = s[ix]
        adv[ix] = g - (g.sum() - g) / (n - 1)
    return _broadcast(adv, response_mask)


@register_advantage("reinforce_pp")
def reinforce_pp(
    rewards: Tensor,
    response_mask: Tensor,
    group_ids: Sequence[Hashable] | None = None,
    *,
    scope_ids: Sequence[Hashable] | None = None,
    token_rewards: Tensor | None = None,
    gamma: float = 1.0,
    **_: Any,
) -> Tensor:
    """REINFORCE++ (verl ``reinforce_plus_plus``): returns, then token-masked whitening.

    Token rewards: the scalar r_i on the last valid token (plus ``token_rewards``, e.g. -beta*KL_t, if given).
    Returns G_{i,t} = sum_{t' >= t} gamma^{t'-t} r_{i,t'}; with gamma = 1 and no token rewards G_{i,t} = r_i on
    every valid token. Then A = (G - mean) / sqrt(var + 1e-8), mean and Bessel-corrected var over ALL valid
    tokens of the batch (token-weighted: longer responses count more), or separately within each scope of
    ``scope_ids`` (AZR's task-relative REINFORCE++ uses scope = (role, task type)). A scope with <= 1 valid
    token is only centred (its single token gets 0). ``group_ids`` is ignored.
    """
    _check(rewards, response_mask, scope_ids, "scope_ids")
    G = _returns(rewards, response_mask, token_rewards, gamma)
    return _scoped_whiten(G, response_mask, scope_ids)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: Tensor,
    response_mask: Tensor,
    group_ids: Sequence[Hashable],
    *,
    scope_ids: Sequence[Hashable] | None = None,
    token_rewards: Tensor | None = None,
    **_: Any,
) -> Tensor:
    """REINFORCE++-baseline (verl ``reinforce_plus_plus_baseline``): group centring, then whitening.

    A~_{i,t} = (s_i - mu_g) * m_{i,t}, then
    A = masked_whiten(A~) over all valid tokens of the batch, or within each scope of ``scope_ids``, exactly
    as in ``reinforce_pp`` (Bessel-corrected var, 1e-8 inside the sqrt; a scope with <= 1 valid token is
    only centred).

    Groups of one (veRL's semantics): a completion alone in its group is not centred — it keeps its raw score,
    A~ = s_i (mu = 0, not mu = s_i, which would zero it) — and only the whitening of its scope gives it a
    baseline. So a batch of singletons (the proposer's proposals, one sample per prompt) gets exactly
    ``reinforce_pp``'s advantages, and a solver's ``samples_per_task`` attempts at one task are centred on
    their own mean before whitening (a task solved 8/8 gets 0, not a positive advantage). Hand-computed in
    ``tests/agents/test_advantages.py``.
    """
    _check(rewards, response_mask, group_ids, "group_ids")
    _check(rewards, response_mask, scope_ids, "scope_ids")
    s = _scores(rewards, response_mask, token_rewards)
    mean, _, _ = _group_stats(s, group_ids)
    return _scoped_whiten(_broadcast(s - mean, response_mask), response_mask, scope_ids)


# ------------------------------------------------------------------------------------------ grouping


def group_by_prompt(rollouts: Sequence[Rollout]) -> list[Hashable]:
    """One group per distinct prompt (its token ids): GRPO/RLOO groups of samples of the same prompt."""
    return [tuple(r.prompt_ids) for r in rollouts]


def group_by_role_task(rollouts: Sequence[Rollout]) -> list[Hashable]:
    """Key ``(meta["role"], meta["task_type"])``: AZR's task-relative REINFORCE++ scopes.

    Raises:
        KeyError: a rollout lacks ``meta["role"]`` or ``meta["task_type"]``.
    """
    out: list[Hashable] = []
    for i, r in enumerate(rollouts):
        try:
            out.append((r.meta["role"], r.meta["task_type"]))
        except KeyError as e:
            raise KeyError(f"rollout {i} has no meta[{e.args[0]!r}] (needed by group_by_role_task)") from None
    return out


def group_by_member(rollouts: Sequence[Rollout]) -> list[Hashable]:
    """Key ``meta["member"]`` (falling back to ``meta["agent"]``): one group/scope per population member.

    Raises:
        KeyError: a rollout has neither key.
    """
    out: list[Hashable] = []
    for i, r in enumerate(rollouts):
        if "member" in r.meta:
            out.append(r.meta["member"])
        elif "agent" in r.meta:
            out.append(r.meta["agent"])
        else:
            raise KeyError(f"rollout {i} has no meta['member'] nor meta['agent'] (needed by group_by_member)")
    return out
