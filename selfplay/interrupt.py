"""Ctrl-C told apart from a ``KeyboardInterrupt`` that plugin code raises itself.

``populora`` (:func:`populora_cli.main.main`) calls :func:`install`: the interpreter's SIGINT handler is replaced
by one that notes the signal, then raises ``KeyboardInterrupt`` as the default handler does, so the command
unwinds as before (``finally`` blocks, a checkpoint's clean-up of its temporary directory, the run lock) and
ends with one line and exit status 130 (:data:`EXIT_INTERRUPTED`, 128 + SIGINT, the shells' convention). Where
plugin code runs (a plugin's import, ``populora test-scheme`` / ``test-estimator``), a ``KeyboardInterrupt``
or ``sys.exit`` is the plugin's failure (exit 2), unless a real SIGINT arrived: :func:`reraise_if_interrupted`.
Here, below the command line, so that :mod:`selfplay.plugins` can ask too.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""Exit status of a command stopped by Ctrl-C (130)."""

_received = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> Any:
    """Note SIGINT before raising ``KeyboardInterrupt`` (the main thread only: signal handlers live there); a
    SIGINT the caller ignores (a background job of a non-interactive shell) stays ignored. Returns the handler
    it replaced (for :func:`restore`; ``None`` when it replaced none)."""
    global _received
    _received = False
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        return None
    signal.signal(signal.SIGINT, _on_sigint)
    return previous


def restore(previous: Any) -> None:
    """Put back the handler :func:`install` replaced (``populora_cli.main.main`` called in a host process)."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, previous)


def received() -> bool:
    """Whether a SIGINT arrived since :func:`install`."""
    return _received


def reraise_if_interrupted(exc: BaseException) -> None:
    """Re-raise ``exc`` when it is the ``KeyboardInterrupt`` of a real Ctrl-C; return otherwise (the caller
    reports it as a failure of the code it ran)."""
    if isinstance(exc, KeyboardInterrupt) and _received:
        raise exc
