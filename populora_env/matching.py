"""TrueSkill ratings and PFSP pairing of teachers with students (docs/method.md §6).

- Ratings come from the ``trueskill`` library (μ0 25, σ0 25/3, β 25/6, τ 25/300, draw probability 0.1).
- Expected student-win probability: ``p_ts = Φ((μ_s − μ_t) / √(2β² + σ_s² + σ_t²))`` (the library has no
  win-probability function).
- PFSP: teachers are visited in random order; each samples a student from the not-yet-assigned pool with
  probability ∝ ``f(p_ts)`` floored at 1e-6 (uniform if every weight vanishes); the pool refills when it is
  empty. With as many teachers as students this is a weighted random perfect matching. ``f`` is a registered
  weighting (:func:`register_matching`, ``EnvConfig.matching``): ``variance`` ``p(1 − p)`` (default, AlphaStar's
  ``f_var``), ``hard`` ``(1 − p)²`` (students expected to lose: the hardest pairings for them), ``linear``
  ``1 − p``, ``uniform`` ``1``, or a plugin's. With ``EnvConfig.matching_random`` = ε > 0 the probabilities are
  mixed with uniform pairing, ``(1 − ε)·f/Σf + ε/|pool|`` (ε = 0 leaves them untouched).
- Outcome of a pair: ``p̂`` (the student's solve rate over the teacher's valid tasks this round) ``> p_ts`` →
  student wins, ``<`` → teacher wins, ``=`` → draw; no valid task → student wins. One ``rate_1vs1`` per pair per
  round.
- Ranking uses the conservative skill ``μ − 3σ`` (0 for a fresh rating).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import trueskill

from populora_env.checks import check_number
from populora_env.registry import Registry, resolve_params

PFSP_FLOOR = 1e-6


@dataclass(frozen=True)
class TrueSkillConfig:
    """TrueSkill environment parameters (the library's defaults)."""

    mu: float = 25.0
    sigma: float = 25.0 / 3.0
    beta: float = 25.0 / 6.0
    tau: float = 25.0 / 300.0
    draw_probability: float = 0.1

    def validate(self) -> None:
        """Check every parameter; raise :class:`~populora_env.checks.ConfigError` naming the first bad one."""
        check_number("mu", self.mu, low=-1e6, high=1e6)
        check_number("sigma", self.sigma, low=0.0, high=1e6, low_open=True)
        check_number("beta", self.beta, low=0.0, high=1e6, low_open=True)
        check_number("tau", self.tau, low=0.0, high=1e6)
        check_number("draw_probability", self.draw_probability, low=0.0, high=1.0, high_open=True)


def normal_cdf(x: float) -> float:
    """Φ, the standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def pfsp_weight(p: float) -> float:
    """AlphaStar's ``f_var``: ``p(1 − p)``, floored at :data:`PFSP_FLOOR`."""
    w = p * (1.0 - p)
    return w if w > PFSP_FLOOR else PFSP_FLOOR


@dataclass(frozen=True)
class Matching:
    """A registered PFSP weighting: ``weigh(p, **params) -> float`` (``p``: the expected student-win
    probability of a teacher-student pair); ``defaults``: every parameter."""

    name: str
    defaults: Mapping[str, Any]
    fn: Callable[..., float] = field(repr=False)

    @property
    def summary(self) -> str:
        """First line of the implementation's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``params`` (:func:`~populora_env.registry.resolve_params`)."""
        return resolve_params("matching", self.name, self.defaults, params)

    def weight(self, p: float, **params: Any) -> float:
        """``f(p)`` floored at :data:`PFSP_FLOOR`; ValueError naming the weighting if it is not a finite real."""
        w = self.fn(p, **params)
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ValueError(
                f"matching {self.name!r} returned {w!r} for p = {p!r} (must be a finite real >= 0)"
            )
        w = float(w)
        return w if w > PFSP_FLOOR else PFSP_FLOOR


_MATCHINGS: Registry[Matching] = Registry("matching")


def register_matching(
    name: str, *, defaults: Mapping[str, Any] | None = None
) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(p, **params) -> weight`` as the PFSP weighting ``name``."""

    def deco(fn: Callable[..., float]) -> Callable[..., float]:
        _MATCHINGS.add(name, Matching(name, MappingProxyType(dict(defaults or {})), fn))
        return fn

    return deco


def unregister_matching(name: str) -> Matching:
    """Remove the weighting ``name`` and return it (plugins and tests)."""
    return _MATCHINGS.remove(name)


def get_matching(name: str) -> Matching:
    """The weighting registered as ``name`` (UnknownEntryError listing the known ones)."""
    return _MATCHINGS.get(name)


def list_matchings() -> list[Matching]:
    """Registered weightings sorted by name."""
    return [m for _, m in _MATCHINGS.items()]


@register_matching("variance")
def variance(p: float) -> float:
    """p(1 - p): AlphaStar's f_var, pairings near even odds; the default."""
    return p * (1.0 - p)


@register_matching("hard")
def hard(p: float) -> float:
    """(1 - p)^2: AlphaStar's f_hard, pairings the student is expected to lose."""
    return (1.0 - p) ** 2


@register_matching("linear")
def linear(p: float) -> float:
    """1 - p: linear in the student's expected loss."""
    return 1.0 - p


@register_matching("uniform")
def uniform(p: float) -> float:
    """1: uniform random pairing (ratings ignored)."""
    return 1.0


def match_outcome(p_hat: float | None, p_ts: float) -> str:
    """``"student"``, ``"teacher"`` or ``"draw"``: who won the pair this round (``p_hat`` ``None`` = no valid
    task, a student win)."""
    if p_hat is None:
        return "student"
    if p_hat > p_ts:
        return "student"
    if p_hat < p_ts:
        return "teacher"
    return "draw"


class Ratings:
    """One TrueSkill rating per agent."""

    def __init__(self, agents: Sequence[str], config: TrueSkillConfig | None = None) -> None:
        self.config = config or TrueSkillConfig()
        self.config.validate()
        c = self.config
        self.env = trueskill.TrueSkill(
            mu=c.mu, sigma=c.sigma, beta=c.beta, tau=c.tau, draw_probability=c.draw_probability
        )
        self._ratings: dict[str, trueskill.Rating] = {a: self.env.create_rating() for a in agents}

    def __contains__(self, agent: object) -> bool:
        return agent in self._ratings

    def __getitem__(self, agent: str) -> trueskill.Rating:
        return self._ratings[agent]

    @property
    def agents(self) -> list[str]:
        """Rated agents."""
        return list(self._ratings)

    def mu(self, agent: str) -> float:
        """Mean skill."""
        return float(self._ratings[agent].mu)

    def sigma(self, agent: str) -> float:
        """Skill uncertainty."""
        return float(self._ratings[agent].sigma)

    def conservative(self, agent: str) -> float:
        """``μ − 3σ`` (TrueSkill's lower confidence bound; 0 for a fresh rating)."""
        return self.mu(agent) - 3.0 * self.sigma(agent)

    def p_student_wins(self, student: str, teacher: str) -> float:
        """``Φ((μ_s − μ_t) / √(2β² + σ_s² + σ_t²))``."""
        s, t = self._ratings[student], self._ratings[teacher]
        denom = math.sqrt(2.0 * self.config.beta**2 + s.sigma**2 + t.sigma**2)
        return normal_cdf((s.mu - t.mu) / denom)

    def record(self, teacher: str, student: str, outcome: str) -> None:
        """Apply one ``rate_1vs1`` for a pair's outcome (``"student"``, ``"teacher"`` or ``"draw"``)."""
        if outcome not in ("student", "teacher", "draw"):
            raise ValueError(f"unknown outcome {outcome!r}")
        t, s = self._ratings[teacher], self._ratings[student]
        if outcome == "teacher":
            t, s = trueskill.rate_1vs1(t, s, env=self.env)
        elif outcome == "student":
            s, t = trueskill.rate_1vs1(s, t, env=self.env)
        else:
            s, t = trueskill.rate_1vs1(s, t, drawn=True, env=self.env)
        self._ratings[teacher], self._ratings[student] = t, s

    def reset(self, agent: str) -> None:
        """Give ``agent`` a fresh rating (e.g. when evolution replaced its adapter)."""
        if agent not in self._ratings:
            raise KeyError(f"unknown agent {agent!r}")
        self._ratings[agent] = self.env.create_rating()

    def summary(self) -> dict[str, dict[str, float]]:
        """``{agent: {"mu", "sigma", "conservative"}}``."""
        return {
            a: {"mu": self.mu(a), "sigma": self.sigma(a), "conservative": self.conservative(a)}
            for a in self._ratings
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable ratings and configuration."""
        return {
            "config": asdict(self.config),
            "ratings": {a: [float(r.mu), float(r.sigma)] for a, r in self._ratings.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ratings saved by :meth:`state_dict` (agents must match)."""
        saved = state["ratings"]
        if set(saved) != set(self._ratings):
            raise ValueError(f"rated agents differ: saved {sorted(saved)}, env {sorted(self._ratings)}")
        for agent, (mu, sigma) in saved.items():
            self._ratings[agent] = self.env.create_rating(mu=float(mu), sigma=float(sigma))


@dataclass(frozen=True)
class Pairing:
    """A teacher matched with a student, with the expected student-win probability at matching time."""

    teacher: str
    student: str
    p_ts: float


def pfsp_match(
    teachers: Sequence[str],
    students: Sequence[str],
    ratings: Ratings,
    rng: np.random.Generator,
    matching: str = "variance",
    params: Mapping[str, Any] | None = None,
    random_share: float = 0.0,
) -> list[Pairing]:
    """PFSP pairing (see the module docstring) with the weighting ``matching`` (its ``params``) mixed with a
    ``random_share`` of uniform pairing. Returns one pairing per teacher, in ``teachers`` order."""
    if not students:
        raise ValueError("pfsp_match needs at least one student")
    weighting = get_matching(matching)
    kwargs = weighting.resolve_params(params or {})
    chosen: dict[str, Pairing] = {}
    pool: list[str] = []
    for t_index in rng.permutation(len(teachers)):
        teacher = teachers[int(t_index)]
        if not pool:
            pool = list(students)
        probs = np.array([ratings.p_student_wins(s, teacher) for s in pool], dtype=np.float64)
        weights = np.array([weighting.weight(float(p), **kwargs) for p in probs], dtype=np.float64)
        total = float(weights.sum())
        if not math.isfinite(total) or total <= 0.0:
            weights = np.ones(len(pool))
            total = float(len(pool))
        shares = weights / total
        if random_share > 0.0:
            shares = (1.0 - random_share) * shares + random_share / len(pool)
        k = int(rng.choice(len(pool), p=shares))
        student = pool.pop(k)
        chosen[teacher] = Pairing(teacher, student, float(probs[k]))
    return [chosen[t] for t in teachers]
