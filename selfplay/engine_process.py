"""The generating side of a local asynchronous run in a process of its own (``pipeline.layout = "process"``).

:class:`EngineProcess` starts a child process (``spawn``: a fresh interpreter, no copy of the parent's torch state)
that builds the members' generator with :func:`selfplay.members.actor_members` — the builder every process holding
members uses, after the run's plugins — on its own copy of the base, with ``generation.threads`` torch threads.
The driver talks to it through the loop's generator interface:

* ``generate(requests)``: the completions, as the in-process generator would return them (the same rows, adapters
  and threads give the same samples);
* ``load_version(name, version, state)``: serve ``state`` as that version of ``name`` (the lifecycle contract of
  :mod:`agents.generation.versions`; a refused load raises :class:`~agents.generation.versions.AdapterLoadError`
  here, the old version still served there);
* ``close()``: stop the process.

Requests, completions and adapter states travel pickled over one pipe, one call at a time. The child dies with
its parent (``PR_SET_PDEATHSIG`` on Linux; otherwise at the pipe's end when the parent is gone), so a killed run
leaves no engine behind.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from agents.generation.base import Completion, GenerationRequest

__all__ = ["EngineProcess"]

log = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (best effort elsewhere)."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a :class:`RuntimeError` carrying its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not pickle is sent as text
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}")


def _serve(conn: Any, cfg_dict: Mapping[str, Any], members: Sequence[str], threads: int) -> None:
    """The child's loop: build the generator, then answer ``(call, args)`` messages until ``close`` or EOF."""
    _die_with_parent()
    try:
        from selfplay.members import actor_members

        _cfg, parts = actor_members(cfg_dict, members, threads, generator=True)
        generator = parts.generator
        conn.send(("ok", os.getpid()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", _portable(exc)))
        return
    while True:
        try:
            call, args = conn.recv()
        except (EOFError, OSError):
            return
        if call == "close":
            conn.send(("ok", None))
            return
        try:
            value = getattr(generator, call)(*args)
            conn.send(("ok", value))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", _portable(exc)))


class EngineProcess:
    """The members' generator in a child process (module docstring).

    Args:
        cfg_dict: the run configuration as a dict (``selfplay.config.to_dict``).
        members: the members it serves, in the run's order.
        threads: the child's torch threads (``generation.threads``; at least 1).
    """

    def __init__(self, cfg_dict: Mapping[str, Any], members: Sequence[str], threads: int) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, dict(cfg_dict), list(members), max(1, int(threads))),
                                 name="populora-engine", daemon=True)
        self._proc.start()
        child.close()
        self.members = list(members)
        self.pid: int | None = None
        self._started = False

    def _receive(self) -> Any:
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            raise RuntimeError(f"the generation engine process (pid {self._proc.pid}) died (exit code "
                               f"{self._proc.exitcode})") from None
        if status == "error":
            raise value
        return value

    def wait_started(self) -> None:
        """Block until the child has built its generator (raises what building raised)."""
        if not self._started:
            self.pid = self._receive()
            self._started = True
            log.info("generation engine process %d serves %s", self.pid, ", ".join(self.members))

    def _call(self, call: str, *args: Any) -> Any:
        self.wait_started()
        try:
            self._conn.send((call, args))
        except OSError:
            pass  # the child is gone: _receive says how it ended
        return self._receive()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """The child generator's ``generate(requests)``."""
        return self._call("generate", list(requests))

    def load_version(self, name: str, version: int, state: dict) -> None:
        """The child generator's ``load_version(name, version, state)``."""
        self._call("load_version", name, version, dict(state))

    def refresh(self, names: Sequence[str] | None = None) -> None:
        """No-op: the engine serves the versions given to :meth:`load_version`, never the trainer's live weights."""

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close", ()))
                self._conn.poll(10) and self._conn.recv()
            except (OSError, EOFError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._conn.close()
