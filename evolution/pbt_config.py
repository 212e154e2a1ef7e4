"""The settings of the PBT replacement step, :class:`PBTConfig`: plain data, no torch.

The run configuration (``selfplay.config``) embeds it as its ``pbt`` section and the command line builds
``--pbt.*`` flags from it, so it lives apart from the controller (``evolution.pbt``, which re-exports it) and the
operator registry: parsing a command line imports no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from evolution.families import FAMILIES, OPERATORS
from populora_env.checks import ConfigError, check, check_bool, check_choice, check_int, check_number

__all__ = ["PBTConfig"]


@dataclass
class PBTConfig:
    """PBT replacement step (docs/method.md §7; defaults k = 10, γ = 0.25, crossover/mutation 0.5/0.5)."""

    interval: int = 10
    """Evolve every `interval` training steps (k)."""
    cull_fraction: float = 0.25
    """Fraction γ of each role replaced per event: n = min(max(1, round(γN)), floor(N/2)); in (0, 0.5]."""
    operators: dict[str, float] = field(default_factory=lambda: {"crossover": 0.5, "mutation": 0.5})
    """Operator distribution: families ('mutation', 'crossover', 'control'; uniform within the family's default
    pool) or operator names (e.g. {'dare': 1.0} for a single-operator ablation), with probabilities."""
    operator_params: dict[str, dict[str, float | int | str]] = field(default_factory=dict)
    """Per-operator parameter overrides, e.g. {'dare': {'p': 0.5}}."""
    min_final_age: int | None = None
    """Fewest training steps a child must have had by the run's last step: an event at step s is skipped when
    ``final_step - s < min_final_age`` (so no event at the last step, and no member enters the final checkpoint
    and its evaluation younger than this); None: ``interval``; 0: evolve at every due step. Needs the run's
    ``final_step`` (``PBTController(..., final_step=)``); without it nothing is skipped."""
    newborn_protection: bool = True
    """Exempt the children of an event from culling at the next event."""
    seed: int = 0
    """Seed of the per-replacement generators (combined with step, role and slot)."""
    fitness: str = "mu_minus_3sigma"
    """Registered fitness that ranks a role's members (evolution.selection; `populora list fitness`):
    'mu_minus_3sigma' (TrueSkill's μ − 3σ), 'mu', 'win_rate' or 'mean_reward' (over a window), or a plugin's."""
    fitness_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the fitness, as JSON (e.g. '{"window": 10}')."""
    selection: str = "truncation"
    """Registered selection rule that picks the culled members and their parents (`populora list selections`):
    'truncation' (bottom culled, parents uniform from the top), 'tournament' (PBT's binary tournament),
    'ttest' (PBT's t-test rule), or a plugin's."""
    selection_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the selection rule, as JSON (e.g. '{"elites": 1}')."""
    lr_explore: Literal["off", "perturb", "resample"] = "off"
    """Learning-rate exploration of a child: 'off', 'perturb' (parent 1's lr scale times a factor of lr_factors,
    drawn uniformly) or 'resample' (a scale log-uniform in lr_range); the child's optimizer runs at the
    configured lr times its scale (recorded in lineage.jsonl)."""
    lr_factors: tuple[float, ...] = (0.8, 1.2)
    """The perturbation factors of lr_explore 'perturb'."""
    lr_range: tuple[float, float] = (0.5, 2.0)
    """The (low, high) scale range of lr_explore 'resample', as multiples of the configured lr."""

    def validate(self) -> None:
        """Check every setting; raise :class:`~populora_env.checks.ConfigError` naming the first bad field.

        Operator names and parameters are checked against the registry (:mod:`evolution.operators`, imported
        only when a setting names an operator rather than a family: the registry imports torch, and the plain
        values are checked without it)."""
        check_int("interval", self.interval, 1, 1 << 20)
        check_number("cull_fraction", self.cull_fraction, low=0.0, high=0.5, low_open=True)
        check(isinstance(self.operators, Mapping) and len(self.operators) > 0, "operators",
              f"must name at least one family or operator, got {self.operators!r}")
        for key, p in self.operators.items():
            check_number(f"operators.{key}", p, low=0.0, high=1e12)
        check(sum(self.operators.values()) > 0, "operators", f"probabilities sum to 0: {dict(self.operators)}")
        check(len({key in FAMILIES for key in self.operators}) == 1, "operators",
              f"mixes families and operator names: {sorted(self.operators)}; use one kind")
        check(isinstance(self.operator_params, Mapping), "operator_params",
              f"must be a mapping, got {self.operator_params!r}")
        if self.min_final_age is not None:
            check_int("min_final_age", self.min_final_age, 0, 1 << 20)
        check_bool("newborn_protection", self.newborn_protection)
        check_int("seed", self.seed, 0, (1 << 63) - 1)
        if self.operator_params or any(key not in FAMILIES for key in self.operators):
            self._validate_operators()
        self._validate_selection()

    def _validate_selection(self) -> None:
        """The fitness and selection names and kwargs against their registries (evolution.selection, no torch),
        and the exploration settings."""
        from evolution.selection import get_fitness, get_selection

        for kind, get in (("fitness", get_fitness), ("selection", get_selection)):
            kwargs = getattr(self, f"{kind}_kwargs")
            check(isinstance(kwargs, Mapping), f"{kind}_kwargs", f"must be a JSON object, got {kwargs!r}")
            try:
                get(getattr(self, kind)).resolve_params(kwargs)
            except KeyError as exc:  # UnknownEntryError: the message lists the known names
                raise ConfigError(kind, str(exc)) from None
            except ValueError as exc:
                raise ConfigError(f"{kind}_kwargs", str(exc)) from None
        check_choice("lr_explore", self.lr_explore, ("off", "perturb", "resample"))
        check(len(self.lr_factors) > 0, "lr_factors", "needs at least one factor")
        for i, f in enumerate(self.lr_factors):
            check_number(f"lr_factors[{i}]", f, low=0.0, high=1e3, low_open=True)
        check(len(self.lr_range) == 2, "lr_range", f"must be (low, high), got {self.lr_range!r}")
        for i, f in enumerate(self.lr_range):
            check_number(f"lr_range[{i}]", f, low=0.0, high=1e3, low_open=True)
        check(self.lr_range[0] <= self.lr_range[1], "lr_range", f"low > high: {tuple(self.lr_range)}")

    def _validate_operators(self) -> None:
        if "evolution.registry" not in sys.modules:  # nothing can have registered another operator yet
            self._check_operator_names(OPERATORS)
        from evolution.operators import get_operator, list_operators

        known = [op.name for op in list_operators()]
        self._check_operator_names(known)
        for name, params in self.operator_params.items():
            try:
                get_operator(name).check_params(params)
            except ValueError as exc:  # an unknown parameter, a value of the wrong type or one the operator refuses
                raise ConfigError(f"operator_params.{name}", str(exc)) from None

    def _check_operator_names(self, known: Sequence[str]) -> None:
        for key in self.operators:
            check(key in FAMILIES or key in known, "operators",
                  f"unknown operator {key!r} (families: {', '.join(FAMILIES)}; operators: {', '.join(known)})")
        for name in self.operator_params:
            check(name in known, f"operator_params.{name}", f"unknown operator (known: {', '.join(known)})")
