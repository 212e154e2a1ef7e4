"""The one error line of every ``populora`` sub-command, and its exit status 2.

``populora CMD: error: MESSAGE`` on stderr; a bad setting (:class:`~populora_env.checks.ConfigError`, from a
flag, a preset or a run's ``config.json``) reads ``populora CMD: error: --dotted.field-name: reason``, the flag
that sets it (``populora train: error: --trainer.lr: must be > 0, got -1``).
"""

from __future__ import annotations

import sys
from typing import Any

EXIT_USAGE = 2
"""Exit status of a bad argument, setting or state found before any work starts."""


def flag(field_name: str) -> str:
    """The command-line flag of a dotted config field (``trainer.max_grad_norm`` -> ``--trainer.max-grad-norm``)."""
    return "--" + field_name.replace("_", "-")


def fail(cmd: str, message: str) -> int:
    """Print ``populora CMD: error: MESSAGE`` on stderr; return the exit status 2."""
    print(f"populora {cmd}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def config_error(cmd: str, exc: Any) -> int:
    """:func:`fail` with a :class:`~populora_env.checks.ConfigError`: the field as its flag, then the reason."""
    return fail(cmd, f"{flag(exc.field)}: {exc.reason}")


def interrupted(cmd: str, hint: str = "") -> int:
    """Print ``populora CMD: interrupted[; HINT]`` on stderr (Ctrl-C); return the exit status 130."""
    from selfplay.interrupt import EXIT_INTERRUPTED

    print(f"populora {cmd}: interrupted{'; ' + hint if hint else ''}", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
