"""The operator registry: :class:`Operator` records, ``register_operator`` / ``get_operator`` / ``list_operators``.

The built-in operators register themselves when :mod:`evolution.operators` is imported (import that module, not
this one, to get them). A new operator is a function ``fn(parents, modules, generator, **params) -> child``
registered with :func:`register_operator`; ``modules`` is the validated list of
:class:`~evolution.keys.LoraModule` of parent 1, and the calling convention of :class:`Operator` checks the
parents, the generator and the parameters before ``fn`` runs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from evolution.families import FAMILIES
from evolution.gram import gram_precision as use_precision
from evolution.gram import reset_gram_stats
from evolution.keys import AdapterState, check_parents
from populora_env.registry import Registry, UnknownEntryError

__all__ = [
    "FAMILIES",
    "Operator",
    "UnknownOperatorError",
    "get_operator",
    "list_operators",
    "register_operator",
    "unregister_operator",
]


class UnknownOperatorError(UnknownEntryError):
    """An operator name that is not registered (a :class:`~populora_env.registry.UnknownEntryError`: both a
    ``KeyError`` and a ``ValueError``; the message lists the known operators)."""


@dataclass(frozen=True)
class Operator:
    """A registered operator: call it as ``op(*parents, generator=g, **params) -> child state``.

    Attributes:
        name: registry name.
        family: ``"mutation"``, ``"crossover"`` or ``"control"``.
        arity: number of parents (1 or 2).
        defaults: every accepted parameter with its default value.
        default_pool: whether the PBT controller draws it when a *family* is chosen.
        fn: the implementation, ``fn(parents, modules, generator, **params)``.
    """

    name: str
    family: str
    arity: int
    defaults: Mapping[str, Any]
    default_pool: bool
    fn: Callable[..., dict[str, Tensor]] = field(repr=False)

    @property
    def summary(self) -> str:
        """First line of the implementation's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``params`` (coerced to the default's type); unknown names raise ValueError."""
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            accepted = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items()) or "none"
            raise ValueError(
                f"operator {self.name!r} got unknown parameter(s) {unknown}; accepted: {accepted}"
            )
        out = dict(self.defaults)
        for key, value in params.items():
            out[key] = _coerce(self.name, key, value, self.defaults[key])
        return out

    def check_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`resolve_params`, then the operator's own checks of the values, before any parent is read: the
        operator runs once on a small synthetic set of parents (:func:`_probe_parents`; its own generator, the
        global RNG state restored), and a ``ValueError`` it raises there (ties ``density=-1``, dare ``p=1``,
        svd_crossover ``mode=bogus``) is raised here, naming the operator and the values. Any other error is
        left to the real call, on the real parents."""
        resolved = self.resolve_params(params)
        probe = _probe_parents(self.arity)
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                self.fn(probe, check_parents(probe), torch.Generator().manual_seed(0), **resolved)
        except ValueError as exc:
            given = ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) or "its default parameters"
            raise ValueError(f"operator {self.name!r} refuses {given}: {exc}") from None
        except Exception:  # noqa: BLE001, S110 - not a refused value (e.g. shapes only real parents have)
            pass
        return resolved

    def __call__(
        self,
        *parents: AdapterState,
        generator: torch.Generator,
        gram_precision: str | None = None,
        **params: Any,
    ) -> dict[str, Tensor]:
        """The child of ``parents``: all randomness from ``generator``; ``params`` override :attr:`defaults`;
        ``gram_precision`` (``"auto"``/``"float64"``) overrides the context's for this call
        (:func:`evolution.gram.gram_precision`)."""
        if len(parents) != self.arity:
            raise ValueError(f"operator {self.name!r} takes {self.arity} parent(s), got {len(parents)}")
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"operator {self.name!r} needs generator=torch.Generator (all randomness comes from it), "
                f"got {type(generator).__name__}"
            )
        resolved = self.resolve_params(params)
        modules = check_parents(parents)
        device = parents[0][modules[0].a_key].device
        if torch.device(generator.device).type != device.type:
            raise ValueError(f"generator is on {generator.device} but the parents are on {device}")
        reset_gram_stats()
        precision = contextlib.nullcontext() if gram_precision is None else use_precision(gram_precision)
        with precision, torch.no_grad():
            return self.fn(parents, modules, generator, **resolved)


PROBE_RANK = 4
PROBE_SHAPES = ((8, 8), (8, 12))
"""The synthetic parents of :meth:`Operator.check_params`: rank 4, two modules of ``(d_out, d_in)`` 8×8, 8×12."""


def _probe_parents(arity: int) -> tuple[AdapterState, ...]:
    """``arity`` distinct small LoRA states (PEFT key names, float32, fixed seeds) to run an operator on."""
    g = torch.Generator().manual_seed(0)
    parents = []
    for _ in range(arity):
        state = {}
        for i, (d_out, d_in) in enumerate(PROBE_SHAPES):
            prefix = f"base_model.model.model.layers.{i}.self_attn.q_proj"
            state[f"{prefix}.lora_A.weight"] = torch.randn(PROBE_RANK, d_in, generator=g) / d_in**0.5
            state[f"{prefix}.lora_B.weight"] = torch.randn(d_out, PROBE_RANK, generator=g) * 0.1
        parents.append(state)
    return tuple(parents)


def _finite(op: str, key: str, value: float) -> float:
    """``value`` when finite; ``ValueError`` otherwise (no operator's parameter is meaningful at NaN or ±inf)."""
    if not math.isfinite(value):
        raise ValueError(f"operator {op!r}: parameter {key}={value!r} is not a finite number")
    return value


def _coerce(op: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (:func:`_coerce_number`), and finite where it is a real number."""
    value = _coerce_number(op, key, value, default)
    if isinstance(value, float):
        return _finite(op, key, value)
    if isinstance(value, tuple):
        return tuple(_finite(op, key, v) if isinstance(v, float) else v for v in value)
    return value


def _coerce_number(op: str, key: str, value: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, tuple):
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(float(v) for v in items)
        if default is None and isinstance(value, str):
            return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"operator {op!r}: parameter {key}={value!r} is not a valid {type(default).__name__}"
        ) from None
    return value


_REGISTRY: Registry[Operator] = Registry("operator", error=UnknownOperatorError)


def register_operator(
    name: str,
    *,
    family: str,
    arity: int,
    defaults: Mapping[str, Any] | None = None,
    default_pool: bool = False,
) -> Callable[[Callable[..., dict[str, Tensor]]], Callable[..., dict[str, Tensor]]]:
    """Decorator registering ``fn(parents, modules, generator, **params) -> child`` under ``name``.

    Raises:
        ValueError: family/arity are invalid, or (:class:`~populora_env.registry.DuplicateEntryError`) ``name``
            is already registered.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if arity not in (1, 2):
        raise ValueError(f"arity must be 1 or 2, got {arity}")

    def deco(fn: Callable[..., dict[str, Tensor]]) -> Callable[..., dict[str, Tensor]]:
        params = MappingProxyType(dict(defaults or {}))
        _REGISTRY.add(name, Operator(name, family, arity, params, default_pool, fn))
        return fn

    return deco


def unregister_operator(name: str) -> Operator:
    """Remove ``name`` from the registry and return its :class:`Operator` (for plugins and tests).

    Raises:
        UnknownOperatorError: ``name`` is not registered.
    """
    return _REGISTRY.remove(name)


def get_operator(name: str) -> Operator:
    """The operator registered as ``name``.

    Raises:
        UnknownOperatorError: (a KeyError and a ValueError) unknown name; the message lists the known operators.
    """
    return _REGISTRY.get(name)


def list_operators(family: str | None = None) -> list[Operator]:
    """Registered operators sorted by name, optionally only one family."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return [op for _, op in _REGISTRY.items() if family is None or op.family == family]
