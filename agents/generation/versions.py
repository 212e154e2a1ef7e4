"""The adapter lifecycle of a generation engine: which version of each member it serves, and how a new one
replaces the old.

An asynchronous run (``pipeline.max_staleness >= 1``, :mod:`selfplay.pipeline`) generates a round with each
member's adapter as it was some updates ago, while the trainer already holds newer weights. The engine must
therefore serve exactly the version a request asks for, never a newer or a half-written one. The contract,
kept by :class:`AdapterVersions` for every backend:

* **versions are labels given by the caller**: ``load(name, version, state)`` makes ``state`` the weights the
  engine serves as ``version`` of member ``name``; a request that names a version
  (:attr:`~agents.generation.base.GenerationRequest.version`) is refused unless the engine serves that version
  of its adapter (:class:`AdapterVersionError`), and its completions carry the version
  (:attr:`~agents.generation.base.Completion.version`);
* **atomic swap**: the new weights are checked (keys, shapes, finite values) before anything is replaced, and
  the swap happens between generate calls, never during one: a call that is running finishes with the
  version it started with (``in_use``/``swap``: the swap waits until no call uses the engine; a backend that
  can hold two versions at once, vLLM with one LoRA id per version, registers the new one at once and retires
  the old one when the last call using it ends);
* **a failed load keeps the old version** and says so: :class:`AdapterLoadError` names the member, the version
  that was refused and why, and the version still served (also logged as a warning).

A request without a version (the synchronous loop, evaluation) is served with whatever the engine holds, as
before; its completions carry the version only when one was loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

__all__ = ["AdapterLoadError", "AdapterVersionError", "AdapterVersions", "check_state"]

log = logging.getLogger(__name__)


class AdapterLoadError(RuntimeError):
    """A new version of an adapter could not be loaded; the engine keeps serving the version it had."""


class AdapterVersionError(LookupError):
    """A request asked for a version of an adapter that the engine does not serve."""


def check_state(state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``state`` cannot replace an adapter shaped like ``reference`` (missing or unexpected keys, another
    shape, a value that is not finite), or ``None`` when it can."""
    missing = sorted(set(reference) - set(state))
    unexpected = sorted(set(state) - set(reference))
    if missing or unexpected:
        return f"{len(missing)} missing key(s) {missing[:2]}, {len(unexpected)} unexpected key(s) {unexpected[:2]}"
    for key, ref in reference.items():
        value = state[key]
        if not isinstance(value, torch.Tensor):
            return f"{key} is a {type(value).__name__}, not a tensor"
        if tuple(value.shape) != tuple(ref.shape):
            return f"{key} has shape {tuple(value.shape)}, expected {tuple(ref.shape)}"
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"{key} holds a value that is not finite"
    return None


class AdapterVersions:
    """Which version of each member an engine serves, and the engine's calls in flight (module docstring).

    Backends hold one and call :meth:`check` on each request, :meth:`in_use` around each generate call and
    :meth:`swap` around each replacement of an adapter's weights.
    """

    def __init__(self) -> None:
        self.served: dict[str, int] = {}
        self._cond = threading.Condition()
        self._calls = 0

    def version(self, name: str | None) -> int | None:
        """The version of ``name`` the engine serves (``None``: none was loaded, or the base)."""
        return None if name is None else self.served.get(name)

    def check(self, index: int, adapter: str | None, version: int | None) -> None:
        """Refuse request ``index`` when it asks for a version of ``adapter`` the engine does not serve."""
        if version is None:
            return
        if adapter is None:
            raise AdapterVersionError(f"request {index} asks for version {version} of the base model, which has none")
        have = self.served.get(adapter)
        if have != version:
            held = "no version loaded" if have is None else f"version {have}"
            raise AdapterVersionError(f"request {index} asks for version {version} of {adapter!r}; the engine serves "
                                      f"{held} (load it with load_version first)")

    def completion_version(self, adapter: str | None, asked: int | None) -> int | None:
        """The version a completion of a request was generated with: the one asked for, else the one served."""
        return asked if asked is not None else self.version(adapter)

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """The block is a generate call: swaps wait until it ends."""
        with self._cond:
            self._calls += 1
        try:
            yield
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @contextmanager
    def swap(self, name: str, version: int, problem: str | None) -> Iterator[None]:
        """Replace ``name``'s weights in the block, once no generate call is in flight, and record ``version``.

        ``problem``: why the new weights cannot be used (:func:`check_state`); then nothing is replaced and
        :class:`AdapterLoadError` is raised, naming the version still served. An error inside the block is
        reported the same way (the block must leave the old weights intact when it fails)."""
        old = self.served.get(name)
        if problem is not None:
            raise self._refused(name, version, old, problem)
        with self._cond:
            self._cond.wait_for(lambda: self._calls == 0)
            try:
                yield
            except Exception as exc:  # noqa: BLE001 - any failure of the copy is reported as a refused load
                raise self._refused(name, version, old, f"{type(exc).__name__}: {exc}") from exc
            self.served[name] = version

    def record(self, name: str, version: int) -> None:
        """Record that ``version`` of ``name`` is served (a backend that swapped without :meth:`swap`)."""
        with self._cond:
            self.served[name] = version

    @staticmethod
    def _refused(name: str, version: int, old: int | None, why: str) -> AdapterLoadError:
        kept = "no version of it (nothing was loaded before)" if old is None else f"version {old}"
        err = AdapterLoadError(f"version {version} of adapter {name!r} was not loaded ({why}); the engine keeps "
                               f"serving {kept}")
        log.warning("%s", err)
        return err

