"""``populora test-selection NAME`` and ``populora test-matching NAME``: a PBT selection rule (with a fitness) or
a PFSP matching weighting (a plugin's, with ``--plugins FILE.py``, or a built-in) run on a scripted population,
in seconds and without a model; what it decided, or exit 2 with one line naming the failure.

**Selection** gets one role of six members, ``m0`` … ``m5`` (:data:`POPULATION`): scripted TrueSkill ratings
and eight recorded rounds each (a per-round win rate and mean reward; ``m5`` wins most, ``m0`` least), ``m1`` a
protected newborn of the previous event. The run's own controller (:class:`evolution.pbt.PBTController`) ranks
them by the fitness and asks the rule for its plan at ``--events`` consecutive events (each event's generator
seeded as a run's), then draws the parents of every culled slot for a one-parent and a two-parent operator. It
prints each member's rating, fitness and recorded means, then per event the culled slots, the rule's reason,
the parents and the protected members it skipped.

**Matching** gets one teacher against four students of ratings below, at and above it (:data:`STUDENTS`): it
prints each student's expected win probability ``p``, the weighting's ``f(p)`` and the resulting pairing
probability (with ``--random-share``), then how often :func:`populora_env.matching.pfsp_match` paired each
student over ``--rounds`` seeded rounds.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

import tyro

from populora_cli.plugin_check import PLUGIN_EXITS, PluginBug, _name_after_plugins, _plugin_failure, _where
from selfplay import interrupt

__all__ = [
    "MatchingArgs",
    "POPULATION",
    "STUDENTS",
    "SelectionArgs",
    "matching_report",
    "rule_main",
    "selection_report",
]

POPULATION: dict[str, tuple[tuple[float, float], list[float], list[float]]] = {
    # member: ((mu, sigma), win rate per round, mean reward per round)
    "m0": (
        (18.0, 3.0),
        [0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5, 0.0],
        [-0.6, -0.5, -0.4, -0.6, -0.5, -0.7, -0.3, -0.5],
    ),
    "m1": ((25.0, 25.0 / 3.0), [0.5, 0.5], [0.0, 0.1]),
    "m2": (
        (23.0, 2.5),
        [0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.5, 0.0],
        [-0.1, -0.2, 0.0, -0.1, -0.3, 0.0, -0.1, -0.2],
    ),
    "m3": ((26.0, 2.5), [0.5, 1.0, 0.5, 0.5, 0.0, 1.0, 0.5, 0.5], [0.1, 0.2, 0.0, 0.1, 0.1, 0.3, 0.2, 0.0]),
    "m4": ((28.0, 3.5), [1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5], [0.3, 0.4, 0.2, 0.5, 0.3, 0.4, 0.2, 0.3]),
    "m5": ((31.0, 2.0), [1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0], [0.7, 0.6, 0.8, 0.7, 0.9, 0.6, 0.7, 0.8]),
}
"""The scripted role of ``test-selection`` (``m1`` is the protected newborn, with two rounds)."""

STUDENTS: dict[str, float] = {"s_weak": 15.0, "s_below": 22.0, "s_even": 25.0, "s_strong": 35.0}
"""``test-matching``'s students' μ (σ 25/3 each) against one teacher of μ 25."""


@dataclass
class SelectionArgs:
    """Run a PBT selection rule (and a fitness) on a scripted population of six members, without a model, and
    print what it decided: the culled members, the rule's reason, their parents."""

    name: Annotated[str, tyro.conf.Positional]
    """The selection rule's registered name (a built-in, or what --plugins registers)."""
    plugins: tuple[str, ...] = field(default_factory=tuple)
    """Plugin modules (importable names or .py paths) imported first."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The rule's keyword arguments as JSON ('{"elites": 1}'), checked as a run's --pbt.selection-kwargs are."""
    fitness: str = "mu_minus_3sigma"
    """The fitness that ranks the members (a built-in or a plugin's)."""
    fitness_kwargs: dict[str, Any] = field(default_factory=dict)
    """The fitness's keyword arguments as JSON ('{"window": 4}')."""
    cull_fraction: float = 0.25
    """γ, as --pbt.cull-fraction."""
    events: int = 3
    """Consecutive events (steps 1, 2, ...) to plan; each draws from its own seeded generator."""
    seed: int = 0
    """Seed of the events' generators, as the run's."""


@dataclass
class MatchingArgs:
    """Run a PFSP matching weighting on one teacher and four scripted students, without a model, and print the
    weights, the pairing probabilities and how often each student was paired."""

    name: Annotated[str, tyro.conf.Positional]
    """The weighting's registered name (a built-in, or what --plugins registers)."""
    plugins: tuple[str, ...] = field(default_factory=tuple)
    """Plugin modules (importable names or .py paths) imported first."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The weighting's keyword arguments as JSON, checked as a run's --env.matching-kwargs are."""
    random_share: float = 0.0
    """Share of uniform random pairing mixed in, as --env.matching-random."""
    rounds: int = 2000
    """Seeded rounds whose pairings are counted."""
    seed: int = 0
    """Seed of the rounds' generator."""


def _scripted_controller(args: SelectionArgs) -> Any:
    """The run's PBT controller with the scripted history and newborn, for ``args``'s rule and fitness."""
    from evolution.pbt import PBTController
    from evolution.pbt_config import PBTConfig
    from evolution.selection import RoundStat

    cfg = PBTConfig(
        interval=1,
        cull_fraction=args.cull_fraction,
        fitness=args.fitness,
        fitness_kwargs=dict(args.fitness_kwargs),
        selection=args.name,
        selection_kwargs=dict(args.kwargs),
        seed=args.seed,
    )
    ctrl = PBTController(cfg)
    for member, (_rating, wins, rewards) in POPULATION.items():
        ctrl.history[member] = [
            RoundStat(i + 1, w, r) for i, (w, r) in enumerate(zip(wins, rewards, strict=True))
        ]
    ctrl.protected["member"] = ["m1"]
    return ctrl


def selection_report(args: SelectionArgs) -> str:
    """The printed report of ``test-selection`` (module docstring); :class:`PluginBug` naming the step at which
    the rule or the fitness failed."""
    import torch

    from evolution.pbt import event_seed

    ratings = {m: rating for m, (rating, _w, _r) in POPULATION.items()}
    ctrl = _scripted_controller(args)
    members = list(POPULATION)
    try:
        fitness = ctrl.fitness_of(members, ratings)
    except PLUGIN_EXITS as exc:  # the plugin's own exception, sys.exit or KeyboardInterrupt, reported as it is
        interrupt.reraise_if_interrupted(exc)
        raise PluginBug(f"fitness {args.fitness!r}: {_plugin_failure(exc)}{_where(exc)}") from exc
    lines = [
        f"selection {args.name!r}{' with ' + json.dumps(args.kwargs) if args.kwargs else ''}, fitness "
        f"{args.fitness!r}{' with ' + json.dumps(args.fitness_kwargs) if args.fitness_kwargs else ''}: a "
        "scripted role of six members (m1 a protected newborn; no model)",
        f"    {'member':<7} {'mu':>6} {'sigma':>6} {'fitness':>9} {'win rate':>9} {'reward':>7} rounds",
    ]
    for m, ((mu, sigma), wins, rewards) in POPULATION.items():
        lines.append(
            f"    {m:<7} {mu:6.2f} {sigma:6.2f} {fitness[m]:9.4f} {sum(wins) / len(wins):9.3f} "
            f"{sum(rewards) / len(rewards):+7.3f} {len(wins):>6}"
        )
    for step in range(1, args.events + 1):
        try:
            plan, _ = ctrl.select(step, "member", members, ratings)
            drawn = {}
            for slot in plan.culled:
                gen = torch.Generator().manual_seed(event_seed(args.seed, step, "member", slot + "#choice"))
                drawn[slot] = [
                    ctrl.parents(plan, slot, arity, fitness, gen) if arity <= len(plan.pool) else None
                    for arity in (1, 2)
                ]
        except PLUGIN_EXITS as exc:  # the plugin's own exception, sys.exit or KeyboardInterrupt
            interrupt.reraise_if_interrupted(exc)
            raise PluginBug(f"event {step}: {_plugin_failure(exc)}{_where(exc)}") from exc
        lines.append(
            f"  event {step}: culled {', '.join(plan.culled) or 'none'}; parent pool "
            f"{', '.join(plan.pool) or '-'}; protected skipped {', '.join(plan.skipped) or 'none'}"
        )
        for slot, (one, two) in drawn.items():
            lines.append(
                f"    {slot}: {plan.why.get(slot, '') or '(no reason given)'}; mutation parent "
                f"{one[0]}; crossover parents {' + '.join(two) if two else '(pool too small)'}"
            )
    return "\n".join(lines)


def matching_report(args: MatchingArgs) -> str:
    """The printed report of ``test-matching`` (module docstring); :class:`PluginBug` if the weighting fails."""
    import numpy as np

    from populora_env.config import EnvConfig
    from populora_env.matching import Ratings, get_matching, pfsp_match

    EnvConfig(
        matching=args.name, matching_kwargs=dict(args.kwargs), matching_random=args.random_share
    ).validate()
    weighting = get_matching(args.name)
    params = weighting.resolve_params(args.kwargs)
    ratings = Ratings(["teacher_0", *STUDENTS])
    ratings.load_state_dict(
        {"ratings": {"teacher_0": [25.0, 25.0 / 3.0], **{s: [mu, 25.0 / 3.0] for s, mu in STUDENTS.items()}}}
    )
    students = list(STUDENTS)
    try:
        probs = [ratings.p_student_wins(s, "teacher_0") for s in students]
        weights = [weighting.weight(p, **params) for p in probs]
        rng = np.random.default_rng(args.seed)
        counts = Counter(
            pfsp_match(["teacher_0"], students, ratings, rng, args.name, params, args.random_share)[0].student
            for _ in range(args.rounds)
        )
    except PLUGIN_EXITS as exc:  # the plugin's own exception, sys.exit or KeyboardInterrupt, reported as it is
        interrupt.reraise_if_interrupted(exc)
        raise PluginBug(f"{_plugin_failure(exc)}{_where(exc)}") from exc
    total = sum(weights)
    shares = [(1.0 - args.random_share) * w / total + args.random_share / len(students) for w in weights]
    lines = [
        f"matching {args.name!r}{' with ' + json.dumps(args.kwargs) if args.kwargs else ''}, random share "
        f"{args.random_share}: teacher_0 (mu 25) choosing among four students (sigma 25/3; no model)",
        f"    {'student':<9} {'mu':>5} {'p':>6} {'f(p)':>9} {'share':>6}  paired in {args.rounds} rounds",
    ]
    for s, p, w, share in zip(students, probs, weights, shares, strict=True):
        lines.append(f"    {s:<9} {STUDENTS[s]:5.1f} {p:6.3f} {w:9.4g} {share:6.3f}  {counts.get(s, 0)}")
    return "\n".join(lines)


def rule_main(cmd: str, argv: list[str]) -> int:
    """Entry of ``populora test-selection`` / ``populora test-matching``; returns the exit status."""
    from populora_cli.errors import fail
    from populora_cli.parsing import json_dict_rule, parse
    from populora_env.checks import ConfigError
    from selfplay.plugins import PluginError, load_plugins, normalize_plugin

    with json_dict_rule():
        args = parse(
            SelectionArgs if cmd == "test-selection" else MatchingArgs,
            _name_after_plugins(argv),
            f"populora {cmd}",
        )
    try:
        load_plugins(normalize_plugin(p) for p in args.plugins)
    except PluginError as e:
        return fail(cmd, f"--plugins: {e}")
    try:
        if isinstance(args, SelectionArgs):
            if not 1 <= args.events <= 100:
                return fail(cmd, f"--events: must be in 1..100, got {args.events}")
            print(selection_report(args))
        else:
            if not 1 <= args.rounds <= 1_000_000:
                return fail(cmd, f"--rounds: must be in 1..1000000, got {args.rounds}")
            print(matching_report(args))
    except ConfigError as e:  # the names or their keyword arguments
        return fail(cmd, f"{_flag_of(cmd, e.field)}: {e.reason}")
    except PluginBug as e:
        return fail(cmd, f"{args.name}: {e}")
    return 0


def _flag_of(cmd: str, field_name: str) -> str:
    """The tester's flag for a config field named in a ConfigError."""
    flags = {
        "selection": "NAME",
        "selection_kwargs": "--kwargs",
        "fitness": "--fitness",
        "fitness_kwargs": "--fitness-kwargs",
        "cull_fraction": "--cull-fraction",
        "seed": "--seed",
        "matching": "NAME",
        "matching_kwargs": "--kwargs",
        "matching_random": "--random-share",
    }
    return flags.get(field_name, f"--{field_name.replace('_', '-')}")
