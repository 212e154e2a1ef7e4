"""Reward schemes: one registered function turns a round's results into per-completion rewards.

A scheme is any function ``scheme(results: RoundResults, **kwargs) -> {agent: [float, ...]}`` where each list
is aligned with that agent's completions of the episode (teachers: their proposals; students: their attempts).
Register it under a name and select it with ``parallel_env(reward_scheme="name", reward_kwargs={...})``::

    from populora_env import register_reward_scheme, student_reward

    @register_reward_scheme("my_scheme")
    def my_scheme(results, bonus=0.1):
        rewards = {a: [student_reward(x) for x in results.attempts_of(a)] for a in results.students}
        for t in results.teachers:
            rewards[t] = [bonus if p.valid else -1.0 for p in results.proposals_of(t)]
        return rewards

Built-ins:

- ``populora`` (docs/method.md §4): teacher per task −1 invalid, 0 if the matched student never solves it
  (p̂ = 0), else 1 − p̂ (so p̂ = 1 gives 0); student per attempt +1 correct, −0.5 wrong but well formatted,
  −1 format error.
- ``azr`` (docs/azr.md §6): the proposer's learnability: per valid task 1 − p̂ if 0 < p̂ < 1, else ``extreme_reward``
  (default 0 as in the AZR paper; AZR's code used −0.5); invalid −1; the same student rewards. In the AZR
  baseline the teacher and the student are one adapter, so p̂ is the proposer's own solve rate.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from populora_env.registry import Registry
from populora_env.results import AttemptResult, RoundResults


class RewardScheme(Protocol):
    """A reward scheme: ``(results, **kwargs) -> {agent: per-completion rewards}``."""

    def __call__(self, results: RoundResults, /, **kwargs: Any) -> Mapping[str, Sequence[float]]: ...


_REGISTRY: Registry[RewardScheme] = Registry("reward scheme")


def register_reward_scheme(name: str) -> Callable[[RewardScheme], RewardScheme]:
    """Decorator registering a scheme under ``name``.

    Raises:
        ValueError: ``name`` is not a non-empty string, or (:class:`~populora_env.registry.DuplicateEntryError`)
            it is already registered.
        TypeError: the decorated object is not callable.
    """
    add = _REGISTRY.decorator(name)

    def decorator(fn: RewardScheme) -> RewardScheme:
        if not callable(fn):
            raise TypeError(f"reward scheme {name!r} must be callable")
        return add(fn)

    return decorator


def unregister_reward_scheme(name: str) -> RewardScheme:
    """Remove a registered scheme and return it.

    Raises:
        UnknownEntryError: (a KeyError and a ValueError) ``name`` is not registered.
    """
    return _REGISTRY.remove(name)


def get_reward_scheme(name: str) -> RewardScheme:
    """The scheme registered under ``name``.

    Raises:
        UnknownEntryError: (a ValueError and a KeyError) unknown name; the message lists the known names.
    """
    return _REGISTRY.get(name)


def list_reward_schemes() -> list[str]:
    """Names of the registered schemes, sorted."""
    return _REGISTRY.names()


def student_reward(
    attempt: AttemptResult, correct: float = 1.0, wrong: float = -0.5, format_error: float = -1.0
) -> float:
    """AZR's solver reward: +1 correct, −0.5 wrong but well formatted, −1 format error."""
    if attempt.correct:
        return correct
    return wrong if attempt.format_ok else format_error


@register_reward_scheme("populora")
def populora_rewards(results: RoundResults) -> dict[str, list[float]]:
    """PopuLoRA: teachers are paid by their matched student's failure rate, if the student solves it at all."""
    rewards: dict[str, list[float]] = {}
    for teacher in results.teachers:
        values = []
        for p in results.proposals_of(teacher):
            if not p.valid:
                values.append(-1.0)
                continue
            p_hat = results.solve_rate(p.task_id)
            values.append(0.0 if not p_hat else 1.0 - p_hat)
        rewards[teacher] = values
    for student in results.students:
        rewards[student] = [student_reward(a) for a in results.attempts_of(student)]
    return rewards


@register_reward_scheme("azr")
def azr_rewards(results: RoundResults, extreme_reward: float = 0.0) -> dict[str, list[float]]:
    """AZR: learnability 1 − p̂ for 0 < p̂ < 1, ``extreme_reward`` for p̂ ∈ {0, 1}, −1 for invalid proposals."""
    rewards: dict[str, list[float]] = {}
    for teacher in results.teachers:
        values = []
        for p in results.proposals_of(teacher):
            if not p.valid:
                values.append(-1.0)
                continue
            p_hat = results.solve_rate(p.task_id) or 0.0
            values.append(1.0 - p_hat if 0.0 < p_hat < 1.0 else float(extreme_reward))
        rewards[teacher] = values
    for student in results.students:
        rewards[student] = [student_reward(a) for a in results.attempts_of(student)]
    return rewards


class SchemeRewards(dict):
    """A scheme's answer that also names the terms its rewards add up from, so a run logs each term: a dict
    ``{agent: [reward, ...]}`` (what any scheme returns) with ``terms = {name: {agent: [value, ...]}}``, each
    list aligned with the agent's completions like its rewards (an agent a term does not touch may be left out).
    The env reports each term's mean per role in its round summary (``summary["reward_terms"]``) and a run logs
    it as ``rewards/<role>/<name>``. A plain dict is as valid: it has no terms."""

    def __init__(self, rewards: Mapping[str, Sequence[float]],
                 terms: Mapping[str, Mapping[str, Sequence[float]]] | None = None) -> None:
        super().__init__(rewards)
        self.terms: dict[str, dict[str, list[float]]] = {
            str(name): {a: list(v) for a, v in dict(term).items()} for name, term in dict(terms or {}).items()}


class RewardSchemeError(ValueError):
    """A reward scheme returned something that is not one real, finite reward per completion (a bug in the
    scheme, not in the model's output); the message names the scheme."""


def _name(scheme: Any) -> str:
    return str(getattr(scheme, "name", None) or getattr(scheme, "__name__", None) or type(scheme).__name__)


def _checked(scheme: Any, agent: str, values: Sequence[Any], expected: int, what: str) -> list[float]:
    """``values`` as floats, one per completion, each real and finite; :class:`RewardSchemeError` otherwise."""
    values = list(values)
    if len(values) != expected:
        raise RewardSchemeError(
            f"reward scheme returned {len(values)} {what} for {agent}, which has {expected} completions"
        )
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Real)]
    if bad:
        raise RewardSchemeError(f"reward scheme {_name(scheme)!r} returned {bad[0]!r} ({type(bad[0]).__name__}) "
                                f"as a reward for {agent}: rewards must be real numbers")
    floats = [float(v) for v in values]
    if not all(math.isfinite(v) for v in floats):
        raise RewardSchemeError(f"reward scheme {_name(scheme)!r} returned a non-finite reward for {agent}: "
                                f"{floats}")
    return floats


def compute_rewards(
    scheme: RewardScheme, results: RoundResults, kwargs: Mapping[str, Any] | None = None
) -> SchemeRewards:
    """Run ``scheme`` and check its answer: one finite float per completion for every agent (and, for the
    terms of a :class:`SchemeRewards`, per completion of every agent a term names).

    Raises:
        RewardSchemeError: (a ValueError) the scheme returned an unknown agent, a list of the wrong length, a
            value that is not a real number (a bool, a string) or a non-finite one (a bug in the scheme: it must
            fail loudly, not train on garbage), or called ``sys.exit`` (a scheme's exit is its failure, never
            the run's end with the scheme's status).
    """
    try:
        raw = scheme(results, **dict(kwargs or {}))
    except SystemExit as exc:
        raise RewardSchemeError(f"reward scheme {_name(scheme)!r} called sys.exit({exc.code!r})") from exc
    if not isinstance(raw, Mapping):
        raise RewardSchemeError(f"reward scheme returned {type(raw).__name__}, expected a mapping agent -> list")
    terms = getattr(raw, "terms", None) if isinstance(raw, SchemeRewards) else {}
    for named in (raw, *terms.values()):
        unknown = set(named) - set(results.agents)
        if unknown:
            raise RewardSchemeError(f"reward scheme returned rewards for unknown agents {sorted(unknown)}")
    out = {a: _checked(scheme, a, raw.get(a, []), results.n_completions(a), "rewards") for a in results.agents}
    checked = {name: {a: _checked(scheme, a, v, results.n_completions(a), f"values of term {name!r}")
                      for a, v in term.items()} for name, term in terms.items()}
    return SchemeRewards(out, checked)


def term_means(rewards: SchemeRewards, teachers: Sequence[str], students: Sequence[str]
               ) -> dict[str, dict[str, float]]:
    """Each term's mean per role over the completions it names: ``{name: {"teacher": m, "student": m}}`` (a
    role without a value left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, term in rewards.terms.items():
        for role, agents in (("teacher", teachers), ("student", students)):
            values = [v for a in agents for v in term.get(a, [])]
            if values:
                out.setdefault(name, {})[role] = sum(values) / len(values)
    return out
