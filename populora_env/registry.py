"""One name → entry registry, shared by every plugin point of the project.

Seven kinds of things are chosen by name in a preset or on the command line and can be extended by a user's plugin:
reward schemes (:mod:`populora_env.rewards`), advantage estimators (``agents.advantages``), loss aggregation
modes (``agents.losses``), weight-space operators (``evolution.operators``), PBT fitness and selection rules
(``evolution.selection``) and PFSP weightings (:mod:`populora_env.matching`). Each keeps a :class:`Registry`
and exposes thin ``register_*`` / ``unregister_*`` / ``get_*`` / ``list_*`` functions over it, so they share
one behaviour:

* names are non-empty strings; registering a taken name raises :class:`DuplicateEntryError` (a ``ValueError``)
  — an entry is never silently replaced (unregister it first);
* looking up or unregistering an unknown name raises :class:`UnknownEntryError`, whose message names the kind
  and lists the known entries. It is both a ``KeyError`` and a ``ValueError``, so callers written against
  either (a missing key, a bad value) keep working;
* listing returns the names sorted.

This module is at the bottom of the import graph (no torch, no project imports).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["DuplicateEntryError", "Registry", "UnknownEntryError", "resolve_params"]

T = TypeVar("T")


class UnknownEntryError(KeyError, ValueError):
    """A name that is not registered. ``kind``, ``name`` and ``known`` (sorted names) are attributes."""

    def __init__(self, kind: str, name: object, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = list(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none registered)'}")

    def __str__(self) -> str:  # KeyError would show the message quoted, as a repr
        return str(self.args[0])


class DuplicateEntryError(ValueError):
    """A name that is already registered."""


class Registry(Generic[T]):
    """Named entries of one kind (e.g. ``Registry("reward scheme")``).

    Args:
        kind: what an entry is, used in error messages (``"advantage estimator"``).
        error: the :class:`UnknownEntryError` subclass raised for unknown names (a registry may keep its own,
            e.g. ``UnknownOperatorError``, as long as it derives from :class:`UnknownEntryError`).
    """

    def __init__(self, kind: str, *, error: type[UnknownEntryError] = UnknownEntryError) -> None:
        if not issubclass(error, UnknownEntryError):
            raise TypeError(f"error must derive from UnknownEntryError, got {error.__name__}")
        self.kind = kind
        self.error = error
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name`` and return it.

        Raises:
            ValueError: ``name`` is not a non-empty string.
            DuplicateEntryError: ``name`` is already registered.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty str, got {name!r}")
        if name in self._entries:
            raise DuplicateEntryError(
                f"{self.kind} {name!r} is already registered ({self._entries[name]!r}); unregister it first"
            )
        self._entries[name] = entry
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator(name)``: register the decorated object; the name is checked at once."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty str, got {name!r}")

        def deco(entry: T) -> T:
            return self.add(name, entry)

        return deco

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its entry (:class:`UnknownEntryError` if it is not registered)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def get(self, name: str) -> T:
        """The entry registered under ``name`` (:class:`UnknownEntryError` listing the known names if none)."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise self.error(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs sorted by name."""
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def resolve_params(
    kind: str, name: str, defaults: Mapping[str, Any], params: Mapping[str, Any]
) -> dict[str, Any]:
    """``defaults`` overridden by ``params`` (a registered entry's keyword arguments): each value must have its
    default's JSON type (an int is accepted for a float and becomes one; a ``None`` default takes anything);
    ValueError naming the entry and what it accepts on an unknown name or a wrong type."""
    unknown = sorted(set(params) - set(defaults))
    accepted = ", ".join(f"{k}={v!r}" for k, v in defaults.items()) or "none"
    if unknown:
        raise ValueError(f"{kind} {name!r} got unknown parameter(s) {unknown}; accepted: {accepted}")
    out = dict(defaults)
    for key, value in params.items():
        default = defaults[key]
        ok = (
            default is None
            or isinstance(value, type(default))
            or (isinstance(default, float) and isinstance(value, int))
        )
        if (default is not None and isinstance(value, bool) is not isinstance(default, bool)) or not ok:
            raise ValueError(
                f"{kind} {name!r}: parameter {key}={value!r} is not a valid {type(default).__name__}"
                f"; accepted: {accepted}"
            )
        out[key] = float(value) if isinstance(default, float) else value
    return out
