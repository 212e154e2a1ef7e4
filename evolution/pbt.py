"""The PBT replacement step of PopuLoRA, which the training loop calls directly after each step's updates
(docs/method.md §7).

Every ``interval`` steps, per role (teachers are replaced by teacher children, students by student children):

1. rank the role's ``N`` members by their fitness (``config.fitness``, :mod:`evolution.selection`; default the
   conservative rating ``μ − 3σ``; ascending, ties by name);
2. the selection rule (``config.selection``; default ``truncation``, described here) culls
   ``n = min(max(1, round(γN)), ⌊N/2⌋)`` members (``round`` = half up; nothing when ``N < 2``): the lowest
   ranked members of the bottom half that are not *protected newborns* (children of the previous event are exempt
   once — without this a fresh rating ``μ₀ − 3σ₀ = 0`` makes the same slot lose at every event, the "revolving
   slot" hazard); protected members are skipped, never replaced by a member of the top half; a rule's own
   randomness comes from a generator seeded from ``(seed, step, role, "#select")``;
3. for each culled slot draw, from a per-replacement ``torch.Generator`` seeded from ``(seed, step, role, slot)``
   (:func:`event_seed`; the operator itself runs with a fresh generator from the recorded ``seed``, so the child
   can be reproduced offline with ``populora evolve --op … --seed …``): the operator (a family by ``operators``
   then uniformly among that family's default pool, or an operator by name) and its parents — by the rule's own
   draw, or (truncation) uniformly from the top ``max(2, ⌈γN⌉)`` survivors, one for a mutation, two distinct for
   a crossover (ordered so that parent 2 is the fitter one); a crossover needs two survivors in the pool, else only
   one-parent operators are drawn; then, with ``config.lr_explore`` on, the child's learning-rate scale (parent
   1's scale × a factor of ``lr_factors`` drawn uniformly, or log-uniform in ``lr_range``; the trainer's
   optimizer runs the member at ``lr × scale``);
4. write the child into the culled member's slot (``population.load_state``), reset its optimizer
   (``population.reset_optimizer``) and rating (``reset_rating``), and append one JSON line to ``lineage.jsonl``
   (with the fitness, the selection rule and its reason, and the exploration it drew).

Between events :meth:`PBTController.observe` records each member's :class:`~evolution.selection.RoundStat` per
step (its win rate and mean reward; a window-based fitness or the t-test reads them); they are checkpointed.

The controller only talks to small duck-typed interfaces, so tests use fakes:

* ``population.state(name) -> dict[str, Tensor]``, ``population.load_state(name, state)``,
  ``population.reset_optimizer(name)`` (as ``agents.population.LoRAPopulation``);
* ``ratings: Mapping[name, (mu, sigma)]`` and ``reset_rating(name)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from evolution.operators import FAMILIES, Operator, get_operator, list_operators
from evolution.pbt_config import PBTConfig
from evolution.selection import (
    MAX_HISTORY,
    EventRandom,
    RoundStat,
    SelectionContext,
    SelectionPlan,
    get_fitness,
    get_selection,
)

__all__ = ["PBTConfig", "PBTController", "PopulationLike", "event_seed", "round_stats"]


class PopulationLike(Protocol):
    """What the controller needs from the population (``agents.population.LoRAPopulation`` fits)."""

    def state(self, name: str) -> dict[str, torch.Tensor]: ...

    def load_state(self, name: str, state: dict[str, torch.Tensor]) -> None: ...

    def reset_optimizer(self, name: str) -> None: ...


def event_seed(seed: int, step: int, role: str, slot: str) -> int:
    """Stable 63-bit seed of one replacement from (run seed, step, role, slot) (SHA-256, not Python's ``hash``)."""
    digest = hashlib.sha256(f"{seed}\x1f{step}\x1f{role}\x1f{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _json_safe(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_json_safe(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return value


class PBTController:
    """The replacement step; call :meth:`maybe_evolve` after every training step.

    Args:
        config: :class:`PBTConfig`.
        lineage_path: ``lineage.jsonl`` to append one line per replacement to (created with its directory; never
            written through a symbolic link);
            None keeps no file (the records are still returned).
        final_step: the run's last training step; events closer to it than ``config.min_final_age`` are
            skipped (:meth:`due`). None: no event is skipped for age.
        base_lr: role -> the learning rate its members train at (recorded as ``lr = base × lr_scale`` in a
            lineage line's ``explore``); None: not recorded.
    """

    def __init__(self, config: PBTConfig, lineage_path: str | Path | None = None, final_step: int | None = None,
                 base_lr: Mapping[str, float] | None = None):
        self.config = config
        self.lineage_path = None if lineage_path is None else Path(lineage_path)
        self.final_step = final_step
        self.base_lr = dict(base_lr or {})
        config.validate()
        self._candidates = self._operator_candidates()
        self._fitness = get_fitness(config.fitness)
        self._fitness_params = self._fitness.resolve_params(config.fitness_kwargs)
        self._selection = get_selection(config.selection)
        self._selection_params = self._selection.resolve_params(config.selection_kwargs)
        self.history: dict[str, list[RoundStat]] = {}
        self.lr_scale: dict[str, float] = {}
        """Member -> its learning-rate scale (members replaced with ``lr_explore`` on; the trainer reads it)."""
        self.protected: dict[str, list[str]] = {}
        self.n_events = 0
        self.n_replacements = 0
        self.last_step: int | None = None

    # ------------------------------------------------------------------------------------------ config

    def _operator_candidates(self) -> list[tuple[Operator, float]]:
        """Every operator that can be drawn with its probability (sorted by name: a stable order for the RNG)."""
        probs: dict[str, float] = {}
        total = sum(float(p) for p in self.config.operators.values())
        for key, p in self.config.operators.items():
            p = float(p) / total
            if key in FAMILIES:
                ops = [op for op in list_operators(key) if op.default_pool] or list_operators(key)
                for op in ops:
                    probs[op.name] = probs.get(op.name, 0.0) + p / len(ops)
            else:
                probs[key] = probs.get(key, 0.0) + p
        return [(get_operator(name), probs[name]) for name in sorted(probs) if probs[name] > 0]

    # ------------------------------------------------------------------------------------------- event

    @property
    def min_final_age(self) -> int:
        """Fewest steps a child trains before the final step (``config.min_final_age``, default ``interval``)."""
        age = self.config.min_final_age
        return self.config.interval if age is None else age

    def due(self, step: int) -> bool:
        """Whether ``step`` is an evolution step: a positive multiple of ``interval``, not already done, and (with
        a ``final_step``) at least ``min_final_age`` steps before the end, so that a child trains for
        ``final_step - step >= min_final_age`` steps before the final checkpoint."""
        if self.final_step is not None and self.final_step - step < self.min_final_age:
            return False
        return step > 0 and step % self.config.interval == 0 and step != self.last_step

    def maybe_evolve(
        self,
        step: int,
        roles: Mapping[str, Sequence[str]],
        population: PopulationLike,
        ratings: Mapping[str, tuple[float, float]],
        reset_rating: Callable[[str], None],
    ) -> list[dict]:
        """Run the replacement step if ``step`` is due; returns the lineage records written (one per child).

        Args:
            step: the training step just completed (1-based count).
            roles: role -> its members, e.g. ``{"teacher": ["t0", "t1"], "student": [...]}``.
            population: see :class:`PopulationLike`.
            ratings: member -> ``(mu, sigma)``.
            reset_rating: called with a member name after its slot was replaced.
        """
        if not self.due(step):
            return []
        seen: dict[str, str] = {}
        for role, members in roles.items():
            for m in members:
                if m in seen and seen[m] != role:
                    raise ValueError(
                        f"member {m!r} is in roles {seen[m]!r} and {role!r}; PBT evolves within a role"
                    )
                seen[m] = role
        records: list[dict] = []
        for role in sorted(roles):
            records.extend(
                self._evolve_role(step, role, list(roles[role]), population, ratings, reset_rating)
            )
        self.last_step = step
        self.n_events += 1
        self.n_replacements += len(records)
        return records

    def observe(self, step: int, stats: Mapping[str, RoundStat]) -> None:
        """Record each member's round of training step ``step`` (kept per member since its birth, at most
        :data:`~evolution.selection.MAX_HISTORY` rounds; a culled slot's records are dropped)."""
        for member, stat in stats.items():
            kept = self.history.setdefault(member, [])
            kept.append(stat)
            del kept[:-MAX_HISTORY]

    def fitness_of(self, members: Sequence[str], ratings: Mapping[str, tuple[float, float]]) -> dict[str, float]:
        """Member -> the configured fitness of its rating and recorded rounds."""
        missing = [m for m in members if m not in ratings]
        if missing:
            raise KeyError(f"no rating for member(s) {missing}")
        return {m: self._fitness(ratings[m], self.history.get(m, ()), **self._fitness_params) for m in members}

    def select(
        self, step: int, role: str, members: Sequence[str], ratings: Mapping[str, tuple[float, float]]
    ) -> tuple[SelectionPlan, dict[str, float]]:
        """The selection rule's plan for one role at the event of ``step``, and the fitness it ranked (no side
        effects; the rule's randomness comes from a generator seeded from ``(seed, step, role, "#select")``)."""
        n_members = len(members)
        if n_members < 2:
            return SelectionPlan([], []), {}
        fitness = self.fitness_of(members, ratings)
        gamma = self.config.cull_fraction
        n = min(max(1, math.floor(gamma * n_members + 0.5)), n_members // 2)
        protected = set(self.protected.get(role, ())) if self.config.newborn_protection else set()
        gen = torch.Generator().manual_seed(event_seed(self.config.seed, step, role, "#select"))
        ctx = SelectionContext(
            role=role, members=tuple(sorted(members)), fitness=fitness,
            history={m: tuple(self.history.get(m, ())) for m in members}, n_cull=n,
            pool_size=max(2, math.ceil(gamma * n_members)),
            protected=frozenset(protected), rng=EventRandom(gen))
        return self._selection(ctx, **self._selection_params), fitness

    def plan(
        self, role: str, members: Sequence[str], ratings: Mapping[str, tuple[float, float]], step: int = 0
    ) -> tuple[list[str], list[str], list[str]]:
        """``(culled, parent_pool, protected_skipped)`` for one role at an event (no side effects)."""
        if len(members) >= 2:
            missing = [m for m in members if m not in ratings]
            if missing:
                raise KeyError(f"no rating for member(s) {missing} of role {role!r}")
        chosen, _ = self.select(step, role, members, ratings)
        return list(chosen.culled), list(chosen.pool), list(chosen.skipped)

    def parents(self, chosen: SelectionPlan, slot: str, arity: int, fitness: Mapping[str, float],
                 gen: torch.Generator) -> list[str]:
        """The parents of ``slot``: the rule's draw, or ``arity`` distinct members uniformly from the pool;
        a crossover's ordered so that parent 2 is the fitter one."""
        pool = chosen.pool
        if chosen.parents is not None:
            parents = list(chosen.parents(slot, arity, EventRandom(gen)))
            if len(parents) != arity or len(set(parents)) != arity or not set(parents) <= set(pool):
                raise ValueError(f"selection {self.config.selection!r} drew parents {parents} for {slot!r}: "
                                 f"expected {arity} distinct member(s) of the pool {pool}")
        elif arity == 1:
            parents = [pool[int(torch.randint(len(pool), (), generator=gen))]]
        else:
            parents = [pool[i] for i in torch.randperm(len(pool), generator=gen)[:2].tolist()]
        return parents if arity == 1 else sorted(parents, key=lambda m: (fitness[m], m))  # parent 2 = fitter

    def _explore(self, role: str, parents: Sequence[str], gen: torch.Generator) -> dict | None:
        """The child's learning-rate scale drawn from ``gen`` after its parents (``config.lr_explore``; None when
        off): parent 1's scale × a uniform choice of ``lr_factors``, or log-uniform in ``lr_range``."""
        mode = self.config.lr_explore
        if mode == "off":
            return None
        parent = float(self.lr_scale.get(parents[0], 1.0))
        if mode == "perturb":
            factors = tuple(self.config.lr_factors)
            scale = parent * float(factors[int(torch.randint(len(factors), (), generator=gen))])
        else:
            low, high = (math.log(float(x)) for x in self.config.lr_range)
            scale = math.exp(low + (high - low) * float(torch.rand((), generator=gen, dtype=torch.float64)))
        base = self.base_lr.get(role)
        return {"mode": mode, "parent_lr_scale": parent, "lr_scale": scale,
                "lr": None if base is None else float(base) * scale}

    def _evolve_role(self, step, role, members, population, ratings, reset_rating) -> list[dict]:
        chosen, fitness = self.select(step, role, members, ratings)
        if not chosen.culled:
            self.protected[role] = []
            return []
        states: dict[str, dict[str, torch.Tensor]] = {}
        records = []
        for slot in chosen.culled:
            seed = event_seed(self.config.seed, step, role, slot)
            choices = [(op, p) for op, p in self._candidates if op.arity <= len(chosen.pool)]
            if not choices:
                warnings.warn(
                    f"PBT step {step}, role {role!r}: no operator with arity <= {len(chosen.pool)} (parent pool "
                    f"{chosen.pool}) in {dict(self.config.operators)}; slot {slot!r} not replaced",
                    stacklevel=2,
                )
                continue
            # the operator gets a fresh generator from ``seed`` (recorded: ``populora evolve --seed`` with the same
            # parents, operator and params reproduces the child); the choices use a separately derived stream
            gen = torch.Generator().manual_seed(event_seed(self.config.seed, step, role, slot + "#choice"))
            op = _draw(choices, gen)
            parents = self.parents(chosen, slot, op.arity, fitness, gen)
            explore = self._explore(role, parents, gen)
            for p in parents:
                if p not in states:
                    states[p] = population.state(p)
            params = op.resolve_params(self.config.operator_params.get(op.name, {}))
            device = next(iter(states[parents[0]].values())).device
            op_gen = torch.Generator(device=device).manual_seed(seed)
            t0 = time.perf_counter()
            child = op(*(states[p] for p in parents), generator=op_gen, **params)
            seconds = time.perf_counter() - t0
            population.load_state(slot, child)
            population.reset_optimizer(slot)
            reset_rating(slot)
            self.history.pop(slot, None)
            self._set_lr_scale(slot, explore)
            rec = {
                "step": step,
                "role": role,
                "culled": slot,
                "culled_rating": _rating_record(ratings[slot]),
                "parents": parents,
                "parent_ratings": [_rating_record(ratings[p]) for p in parents],
                "operator": op.name,
                "family": op.family,
                "params": _json_safe(params),
                "seed": seed,
                "seconds": round(seconds, 6),
                "protected_skipped": list(chosen.skipped),
                "fitness": {"name": self.config.fitness, "params": _json_safe(self._fitness_params),
                            "culled": fitness[slot], "parents": [fitness[p] for p in parents]},
                "selection": {"name": self.config.selection, "params": _json_safe(self._selection_params),
                              "why": str(chosen.why.get(slot, ""))},
                "explore": explore,
            }
            records.append(rec)
            self._write(rec)
        self.protected[role] = [r["culled"] for r in records]
        return records

    def _set_lr_scale(self, slot: str, explore: dict | None) -> None:
        """The child's learning-rate scale: the drawn one, or (exploration off) none: the configured lr."""
        if explore is None:
            self.lr_scale.pop(slot, None)
        else:
            self.lr_scale[slot] = float(explore["lr_scale"])

    def _write(self, record: dict) -> None:
        if self.lineage_path is None:
            return
        self.lineage_path.parent.mkdir(parents=True, exist_ok=True)
        # never through a symbolic link planted at the path (the run directory's writers hold the same rule)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.lineage_path, flags, 0o666)
        except OSError as e:
            if self.lineage_path.is_symlink():
                raise OSError(f"{self.lineage_path}: is a symbolic link: refusing to append lineage through it "
                              "(remove it)") from e
            raise
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=False) + "\n")
            fh.flush()

    # -------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict:
        """JSON-serialisable state: newborn protection per role, counters, last evolution step, each member's
        recorded rounds and learning-rate scale."""
        return {
            "version": 2,
            "protected": {role: list(names) for role, names in self.protected.items()},
            "history": {m: [[h.step, h.win_rate, h.reward] for h in hs] for m, hs in sorted(self.history.items())},
            "lr_scale": dict(sorted(self.lr_scale.items())),
            "n_events": self.n_events,
            "n_replacements": self.n_replacements,
            "last_step": self.last_step,
            "seed": self.config.seed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the per-event generators are derived, so no RNG state is needed;
        a version-1 state, before rounds were recorded, restores none). The dicts are updated in place (the
        trainer holds :attr:`lr_scale`)."""
        if state.get("version") not in (1, 2):
            raise ValueError(f"unsupported PBT state version {state.get('version')!r}")
        self.protected = {str(role): list(names) for role, names in state["protected"].items()}
        self.history.clear()
        for member, rows in state.get("history", {}).items():
            self.history[str(member)] = [RoundStat(int(a), None if b is None else float(b),
                                                   None if c is None else float(c)) for a, b, c in rows]
        self.lr_scale.clear()
        self.lr_scale.update({str(m): float(v) for m, v in state.get("lr_scale", {}).items()})
        self.n_events = int(state["n_events"])
        self.n_replacements = int(state["n_replacements"])
        self.last_step = None if state["last_step"] is None else int(state["last_step"])


def round_stats(step: int, matches: Sequence[Any], rewards: Mapping[str, Sequence[float]],
                agents_of: Mapping[str, Sequence[str]]) -> dict[str, RoundStat]:
    """Member -> its :class:`~evolution.selection.RoundStat` of one round: ``win_rate`` = (won pairings + ½·drawn
    ones) / its pairings (``matches``: objects with ``teacher``, ``student`` and ``outcome`` =
    ``"teacher"``/``"student"``/``"draw"``), ``reward`` = the mean of its agents' completion rewards."""
    out: dict[str, RoundStat] = {}
    for member, agents in agents_of.items():
        mine = set(agents)
        points = [1.0 if m.outcome == side else 0.5 if m.outcome == "draw" else 0.0
                  for m in matches for side in ("teacher", "student") if getattr(m, side) in mine]
        values = [float(r) for a in agents for r in rewards.get(a, ())]
        out[member] = RoundStat(step, sum(points) / len(points) if points else None,
                                sum(values) / len(values) if values else None)
    return out


def _rating_record(rating: tuple[float, float]) -> dict[str, float]:
    mu, sigma = float(rating[0]), float(rating[1])
    return {"mu": mu, "sigma": sigma, "score": mu - 3.0 * sigma}


def _draw(choices: list[tuple[Operator, float]], gen: torch.Generator) -> Operator:
    total = sum(p for _, p in choices)
    u = float(torch.rand((), generator=gen, dtype=torch.float64)) * total
    acc = 0.0
    for op, p in choices:
        acc += p
        if u < acc:
            return op
    return choices[-1][0]
