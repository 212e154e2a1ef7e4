"""The one way a setting is checked: :class:`ConfigError` and the ``check_*`` helpers every config's
``validate()`` is built from.

A config section checks its own fields by their bare names (``lr``, ``timeout_s``) and raises
:class:`ConfigError` ``(field, reason)`` for the first bad one; a config that embeds it calls its ``validate()``
and re-raises with :meth:`ConfigError.prefixed` (``trainer.lr``), so the field reaches the command line as a
dotted name and the reason unchanged (``populora train: error: --trainer.lr: must be > 0, got -1``).

This module imports nothing of the project, so every config module (the env's sections, the sandbox's
:class:`~populora_env.sandbox.Limits`, the learner's) can use it without an import cycle.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable
from typing import Any

__all__ = ["ConfigError", "check", "check_bool", "check_choice", "check_int", "check_number", "check_section",
           "renamed", "shown"]

log = logging.getLogger(__name__)
_WARNED: set[str] = set()


class ConfigError(ValueError):
    """A setting is invalid. ``field`` is its dotted name (``trueskill.beta``, ``env.timeout_s``), ``reason``
    what is wrong with its value (``must be > 0, got -1``)."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.reason = message
        super().__init__(f"{field_name}: {message}")

    def prefixed(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` before the field name (``env.`` inside a run config)."""
        return ConfigError(prefix + self.field, self.reason)


def shown(value: Any) -> str:
    """How a number reads in a reason: integral floats without ``.0`` (``-1``, not ``-1.0``: a flag's ``-1``
    is parsed as a float), other values as ``repr``."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def check(condition: bool, field_name: str, message: str) -> None:
    """Raise :class:`ConfigError` for ``field_name`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field_name, message)


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (bools are not ints here)."""
    check(not isinstance(value, bool) and isinstance(value, numbers.Integral), name, f"must be an int, got {value!r}")
    check(value >= minimum, name, f"must be >= {minimum}, got {value}")
    if maximum is not None:
        check(value <= maximum, name, f"must be <= {maximum}, got {value}")
    return int(value)


def check_number(name: str, value: Any, *, low: float, high: float, low_open: bool = False,
                 high_open: bool = False) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, …`` with ``low_open``, ``…, high)`` with
    ``high_open``)."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    check(ok, name, f"must be a finite number, got {value!r}")
    check(value > low if low_open else value >= low, name,
          f"must be {'>' if low_open else '>='} {shown(low)}, got {shown(value)}")
    check(value < high if high_open else value <= high, name,
          f"must be {'<' if high_open else '<='} {shown(high)}, got {shown(value)}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool."""
    check(isinstance(value, bool), name, f"must be a bool, got {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (a registry's names, a ``Literal``'s values)."""
    options = list(choices)
    check(value in options, name, f"must be one of {', '.join(map(str, options))}, got {value!r}")
    return value


def check_section(prefix: str, section: Any, *args: Any) -> None:
    """``section.validate(*args)``, its :class:`ConfigError` re-raised with ``prefix`` before the field name (how
    a config checks the sections it embeds: ``check_section("trainer.", cfg.trainer)``)."""
    try:
        section.validate(*args)
    except ConfigError as exc:
        raise exc.prefixed(prefix) from None


def renamed(old: str, new: str, value: Any) -> Any:
    """``value``, given under the deprecated spelling ``old`` of the setting now spelled ``new``: a config's
    ``__post_init__`` takes the old spelling this way for one release. Warns once per process, in one line naming
    the new spelling (on stderr even where logging is not configured)."""
    if old not in _WARNED:
        _WARNED.add(old)
        log.warning("%s is deprecated and will be removed in the next release: use %s", old, new)
    return value
