"""The fitness and selection registries of the PBT replacement step (:mod:`evolution.pbt`), and the built-ins.

**Fitness** ranks a role's members at an event. A fitness is ``fn(rating, history, **params) -> float``, where
``rating`` is the member's TrueSkill ``(μ, σ)`` and ``history`` the member's :class:`RoundStat` per training step
since it was born (oldest first, at most :data:`MAX_HISTORY`), registered with :func:`register_fitness`:

* ``mu_minus_3sigma`` (default): ``μ − 3σ``, TrueSkill's conservative skill (0 for a fresh rating);
* ``mu``: ``μ``;
* ``win_rate``: the mean over the last ``window`` rounds of the member's per-round win rate (a won pairing 1, a
  draw ½, a lost one 0; rounds without a pairing are left out), ``prior`` when there is none;
* ``mean_reward``: the mean over the last ``window`` rounds of the member's per-round mean reward, ``prior`` when
  there is none.

**Selection** decides which members are culled and who their parents are. A selection rule is
``fn(ctx, **params) -> SelectionPlan`` (:class:`SelectionContext` in, :class:`SelectionPlan` out), registered
with :func:`register_selection`; all its randomness comes from ``ctx.rng`` (:class:`EventRandom`, seeded from the
event: the same seed, step and role give the same plan, across a resume too):

* ``truncation`` (default): cull the ``n`` lowest-fitness members of the bottom half (``n`` and the parent pool
  as :mod:`evolution.pbt` states them), parents uniformly from the top ``max(2, ⌈γN⌉)`` survivors;
* ``tournament``: the PBT paper's binary tournament: each member, in a random order, meets one other member
  drawn uniformly; if the other ranks higher (fitness, ties by name as in every ranking here) the member is
  culled and the other is its parent (a crossover's second parent: the fitter of two survivors drawn
  uniformly);
* ``ttest``: the PBT paper's t-test rule: as ``tournament``, but the member is culled only when the other's
  last ``window`` per-round values of ``metric`` (``reward`` or ``win_rate``) have a higher mean and Welch's
  t-test gives ``p < alpha`` (each needs at least two values).

Every built-in takes ``elites``: the ``elites`` fittest members of the role are never culled. ``tournament`` and
``ttest`` cull at most ``n`` members (the truncation count), skip protected newborns (they neither lose nor are
drawn as a parent's stand-in) and never cull a member another culled slot takes as its parent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from populora_env.registry import Registry, resolve_params

__all__ = [
    "MAX_HISTORY",
    "EventRandom",
    "Fitness",
    "RoundStat",
    "Selection",
    "SelectionContext",
    "SelectionPlan",
    "get_fitness",
    "get_selection",
    "list_fitness",
    "list_selections",
    "register_fitness",
    "register_selection",
    "unregister_fitness",
    "unregister_selection",
]

MAX_HISTORY = 64
"""Most per-round records the controller keeps per member (a ``window`` may not exceed it)."""


@dataclass(frozen=True)
class RoundStat:
    """One member's round: ``step``; ``win_rate`` (won pairings 1, draws ½, lost 0, averaged over the member's
    pairings; None without one); ``reward`` (the mean reward of its completions; None without one)."""

    step: int
    win_rate: float | None
    reward: float | None


class EventRandom:
    """The draws a selection rule may make, all from the event's seeded ``torch.Generator``."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator

    def index(self, n: int) -> int:
        """A uniform index in ``[0, n)``."""
        import torch

        return int(torch.randint(n, (), generator=self.generator))

    def sample(self, n: int, k: int) -> list[int]:
        """``k`` distinct uniform indices in ``[0, n)`` (the first ``k`` of a random permutation)."""
        import torch

        return torch.randperm(n, generator=self.generator)[:k].tolist()

    def uniform(self) -> float:
        """A uniform float in ``[0, 1)`` (float64)."""
        import torch

        return float(torch.rand((), generator=self.generator, dtype=torch.float64))


# ------------------------------------------------------------------------------------------ fitness


@dataclass(frozen=True)
class Fitness:
    """A registered fitness: ``fit(rating, history, **params) -> float``; ``defaults``: every parameter."""

    name: str
    defaults: Mapping[str, Any]
    fn: Callable[..., float] = field(repr=False)

    @property
    def summary(self) -> str:
        """First line of the implementation's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``params`` (:func:`resolve_params`); a ``window`` must be in 1..MAX_HISTORY."""
        out = resolve_params("fitness", self.name, self.defaults, params)
        window = out.get("window")
        if isinstance(window, int) and not 1 <= window <= MAX_HISTORY:
            raise ValueError(f"fitness {self.name!r}: window={window} must be in 1..{MAX_HISTORY}")
        return out

    def __call__(self, rating: tuple[float, float], history: Sequence[RoundStat], **params: Any) -> float:
        """The member's fitness (a finite float, else ValueError naming the fitness)."""
        value = float(
            self.fn((float(rating[0]), float(rating[1])), tuple(history), **self.resolve_params(params))
        )
        if not math.isfinite(value):
            raise ValueError(f"fitness {self.name!r} returned {value!r} (must be finite)")
        return value


_FITNESS: Registry[Fitness] = Registry("fitness")


def register_fitness(
    name: str, *, defaults: Mapping[str, Any] | None = None
) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(rating, history, **params) -> float`` as the fitness ``name``."""

    def deco(fn: Callable[..., float]) -> Callable[..., float]:
        _FITNESS.add(name, Fitness(name, MappingProxyType(dict(defaults or {})), fn))
        return fn

    return deco


def unregister_fitness(name: str) -> Fitness:
    """Remove the fitness ``name`` and return it (plugins and tests)."""
    return _FITNESS.remove(name)


def get_fitness(name: str) -> Fitness:
    """The fitness registered as ``name`` (UnknownEntryError listing the known ones)."""
    return _FITNESS.get(name)


def list_fitness() -> list[Fitness]:
    """Registered fitness functions sorted by name."""
    return [f for _, f in _FITNESS.items()]


def _window_mean(values: Sequence[float | None], window: int, prior: float) -> float:
    recent = [v for v in values[-window:] if v is not None]
    return sum(recent) / len(recent) if recent else prior


@register_fitness("mu_minus_3sigma")
def mu_minus_3sigma(rating: tuple[float, float], history: Sequence[RoundStat]) -> float:
    """μ − 3σ: TrueSkill's conservative skill (0 for a fresh rating); the default."""
    return float(rating[0]) - 3.0 * float(rating[1])


@register_fitness("mu")
def mu(rating: tuple[float, float], history: Sequence[RoundStat]) -> float:
    """μ: TrueSkill's mean skill, its uncertainty ignored."""
    return float(rating[0])


@register_fitness("win_rate", defaults={"window": 5, "prior": 0.5})
def win_rate(rating: tuple[float, float], history: Sequence[RoundStat], window: int, prior: float) -> float:
    """Mean per-round win rate over the last `window` rounds (won 1, draw 1/2); `prior` without a pairing."""
    return _window_mean([h.win_rate for h in history], window, prior)


@register_fitness("mean_reward", defaults={"window": 5, "prior": 0.0})
def mean_reward(
    rating: tuple[float, float], history: Sequence[RoundStat], window: int, prior: float
) -> float:
    """Mean per-round reward over the last `window` rounds; `prior` without a completion."""
    return _window_mean([h.reward for h in history], window, prior)


# ------------------------------------------------------------------------------------------ selection


@dataclass(frozen=True)
class SelectionContext:
    """What a selection rule sees at an event, for one role.

    Attributes:
        role: the role (``"teacher"`` or ``"student"``).
        members: the role's members, sorted by name.
        fitness: member -> fitness (the configured fitness function's value).
        history: member -> its :class:`RoundStat` records since birth (oldest first).
        n_cull: the truncation count ``n = min(max(1, round(γN)), ⌊N/2⌋)``.
        pool_size: the truncation parent pool's size ``max(2, ⌈γN⌉)`` (capped by the survivors).
        protected: newborns of the previous event (exempt from culling once).
        rng: the event's :class:`EventRandom` (the only source of randomness).
    """

    role: str
    members: tuple[str, ...]
    fitness: Mapping[str, float]
    history: Mapping[str, tuple[RoundStat, ...]]
    n_cull: int
    pool_size: int
    protected: frozenset[str]
    rng: EventRandom

    def ranked(self, descending: bool = False) -> list[str]:
        """Members by fitness, ascending (ties by name), or descending (ties by name)."""
        if descending:
            return sorted(self.members, key=lambda m: (-self.fitness[m], m))
        return sorted(self.members, key=lambda m: (self.fitness[m], m))

    def elites(self, count: int) -> set[str]:
        """The ``count`` fittest members."""
        return set(self.ranked(descending=True)[: max(0, count)])


ParentDraw = Callable[[str, int, EventRandom], list[str]]


@dataclass(frozen=True)
class SelectionPlan:
    """A rule's decision: ``culled`` slots (in order), the survivors' ``pool``, the protected newborns it
    ``skipped``, ``why`` (slot -> one line naming the rule's reason, recorded in lineage.jsonl) and
    ``parents(slot, arity, rng) -> names`` (None: ``arity`` distinct members drawn uniformly from ``pool``)."""

    culled: list[str]
    pool: list[str]
    skipped: list[str] = field(default_factory=list)
    why: Mapping[str, str] = field(default_factory=dict)
    parents: ParentDraw | None = None


@dataclass(frozen=True)
class Selection:
    """A registered selection rule: ``rule(ctx, **params) -> SelectionPlan``; ``defaults``: every parameter."""

    name: str
    defaults: Mapping[str, Any]
    fn: Callable[..., SelectionPlan] = field(repr=False)

    @property
    def summary(self) -> str:
        """First line of the implementation's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``params`` (:func:`resolve_params`)."""
        return resolve_params("selection", self.name, self.defaults, params)

    def __call__(self, ctx: SelectionContext, **params: Any) -> SelectionPlan:
        """The rule's plan, checked: culled slots are distinct members, the pool is non-empty survivors."""
        plan = self.fn(ctx, **self.resolve_params(params))
        if not isinstance(plan, SelectionPlan):
            raise TypeError(
                f"selection {self.name!r} returned {type(plan).__name__}, expected a SelectionPlan"
            )
        culled = set(plan.culled)
        bad = [m for m in [*plan.culled, *plan.pool] if m not in ctx.members]
        if (
            bad
            or len(culled) != len(plan.culled)
            or culled & set(plan.pool)
            or (plan.culled and not plan.pool)
        ):
            raise ValueError(
                f"selection {self.name!r} returned an inconsistent plan (culled {plan.culled}, "
                f"pool {plan.pool}, members {list(ctx.members)}): culled slots must be distinct "
                "members, and the pool non-empty members that are not culled"
            )
        return plan


_SELECTIONS: Registry[Selection] = Registry("selection rule")


def register_selection(
    name: str, *, defaults: Mapping[str, Any] | None = None
) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(ctx: SelectionContext, **params) -> SelectionPlan`` as the rule ``name``."""

    def deco(fn: Callable[..., SelectionPlan]) -> Callable[..., SelectionPlan]:
        _SELECTIONS.add(name, Selection(name, MappingProxyType(dict(defaults or {})), fn))
        return fn

    return deco


def unregister_selection(name: str) -> Selection:
    """Remove the selection rule ``name`` and return it (plugins and tests)."""
    return _SELECTIONS.remove(name)


def get_selection(name: str) -> Selection:
    """The selection rule registered as ``name`` (UnknownEntryError listing the known ones)."""
    return _SELECTIONS.get(name)


def list_selections() -> list[Selection]:
    """Registered selection rules sorted by name."""
    return [s for _, s in _SELECTIONS.items()]


@register_selection("truncation", defaults={"elites": 0})
def truncation(ctx: SelectionContext, elites: int) -> SelectionPlan:
    """Cull the n lowest-fitness members of the bottom half; parents uniform from the top; the default."""
    ranked = ctx.ranked()
    keep = ctx.elites(elites)
    culled: list[str] = []
    skipped: list[str] = []
    for m in ranked[: len(ranked) // 2]:
        if len(culled) == ctx.n_cull:
            break
        if m not in keep:
            (skipped if m in ctx.protected else culled).append(m)
    survivors = [m for m in ctx.ranked(descending=True) if m not in culled]
    pool = survivors[: min(len(survivors), ctx.pool_size)]
    why = {m: f"bottom {ranked.index(m) + 1} of {len(ranked)} by fitness" for m in culled}
    return SelectionPlan(culled, pool, skipped, why)


def _pairwise(ctx: SelectionContext, elites: int, beats: Callable[[str, str], str | None]) -> SelectionPlan:
    """The tournament skeleton: members in a random order each meet a uniformly drawn other member;
    ``beats(other, member)`` returns the reason the other wins (the member is culled, the other is its
    parent) or None."""
    keep = ctx.elites(elites)
    culled: list[str] = []
    skipped: list[str] = []
    donor: dict[str, str] = {}
    why: dict[str, str] = {}
    members = list(ctx.members)
    for i in ctx.rng.sample(len(members), len(members)):
        m = members[i]
        others = [o for o in members if o != m]
        other = others[ctx.rng.index(len(others))]
        if len(culled) == ctx.n_cull or m in keep or m in donor.values() or other in culled:
            continue
        reason = beats(other, m)
        if reason is None:
            continue
        if m in ctx.protected:
            skipped.append(m)
            continue
        culled.append(m)
        donor[m] = other
        why[m] = reason
    pool = [m for m in ctx.ranked(descending=True) if m not in culled]

    def parents(slot: str, arity: int, rng: EventRandom) -> list[str]:
        first = donor[slot]
        if arity == 1:
            return [first]
        rest = [m for m in pool if m != first]
        a, b = (rest[k] for k in (rng.index(len(rest)), rng.index(len(rest))))
        return [first, a if (ctx.fitness[a], a) >= (ctx.fitness[b], b) else b]

    return SelectionPlan(culled, pool, skipped, why, parents if culled else None)


@register_selection("tournament", defaults={"elites": 0})
def tournament(ctx: SelectionContext, elites: int) -> SelectionPlan:
    """PBT's binary tournament: each member meets a random other; a fitter other (ties by name) replaces it."""

    def beats(other: str, m: str) -> str | None:
        fo, fm = ctx.fitness[other], ctx.fitness[m]
        if (fo, other) <= (fm, m):
            return None
        return f"lost a binary tournament to {other} (fitness {fm:.4g} {'<' if fo > fm else '= (tie: by name)'} {fo:.4g})"

    return _pairwise(ctx, elites, beats)


@register_selection("ttest", defaults={"elites": 0, "alpha": 0.05, "metric": "reward", "window": 5})
def ttest(ctx: SelectionContext, elites: int, alpha: float, metric: str, window: int) -> SelectionPlan:
    """PBT's t-test rule: a random other replaces a member when Welch's t-test says it is better (p < alpha)."""
    if metric not in ("reward", "win_rate"):
        raise ValueError(f"selection 'ttest': metric={metric!r} must be 'reward' or 'win_rate'")
    if not 1 <= window <= MAX_HISTORY:
        raise ValueError(f"selection 'ttest': window={window} must be in 1..{MAX_HISTORY}")

    def values(m: str) -> list[float]:
        return [v for v in (getattr(h, metric) for h in ctx.history.get(m, ())[-window:]) if v is not None]

    def beats(other: str, m: str) -> str | None:
        a, b = values(other), values(m)
        if len(a) < 2 or len(b) < 2 or sum(a) / len(a) <= sum(b) / len(b):
            return None
        p = welch_p(a, b)
        return (
            f"{other}'s {metric} is higher by Welch's t-test (p = {p:.3g} < {alpha})" if p < alpha else None
        )

    return _pairwise(ctx, elites, beats)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test of equal means (what ``scipy.stats.ttest_ind(a, b, equal_var=False)``
    gives; no scipy needed): ``t = (ā − b̄) / √(s_a²/n_a + s_b²/n_b)`` with the Welch–Satterthwaite degrees of
    freedom ``ν``, and ``p = I_{ν/(ν+t²)}(ν/2, ½)`` (the regularized incomplete beta function). 1.0 when both
    samples are constant and equal, 0.0 when both are constant and differ."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    if se2 == 0.0:
        return 1.0 if ma == mb else 0.0
    t = (ma - mb) / math.sqrt(se2)
    nu = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return _betainc(nu / 2.0, 0.5, nu / (nu + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, by its continued fraction (modified Lentz),
    evaluated on the side of ``x`` where it converges fast (``I_x(a, b) = 1 − I_{1−x}(b, a)``)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a
