"""Suite-wide layout for parallel workers (pytest-xdist, ``-n`` in ``pyproject.toml``'s ``addopts``).

* **Groups.** ``--dist loadgroup`` sends every test of one ``xdist_group`` to one worker, in a row. The Ray
  tests form the group ``ray`` (one Ray cluster per session, started by ``tests/ray/conftest.py`` on the worker
  that runs them and stopped after the group's last test), so two clusters never share the cores.
* **Runs built once for all workers.** :func:`built_once` builds a directory (a finished tiny run, say) the first
  time any worker asks for it and hands the same directory to every other worker, under a file lock in the
  run's shared base temp directory; without xdist it is an ordinary session-scoped build. Tests only read
  what it returns (they copy it first to change it).

Every test stays safe in a worker: files go to ``tmp_path``, no port is fixed, nothing is written to a shared
global directory but the converted-model cache (built under its own file lock, ``agents/models.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

RAY_DIR = Path(__file__).resolve().parent / "ray"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Ray tests (``tests/ray``, or marked ``ray``) go to one worker as the group ``ray``."""
    for item in items:
        if item.get_closest_marker("ray") is not None or RAY_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.xdist_group("ray"))


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``<root>/<name>``, made by ``build(<root>/<name>)`` once per test run, whichever xdist worker asks first.

    Under xdist ``<root>`` is the base temp directory the workers share, and a file lock makes the other
    workers wait for the first one's build; a build that failed (no ``.built`` marker) is tried again by the
    next worker that asks, so its error shows in that worker's test too. Without xdist ``<root>`` is a fresh
    session temp directory.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        target = tmp_path_factory.mktemp(name, numbered=True) / name
        target.mkdir()
        build(target)
        return target
    root = tmp_path_factory.getbasetemp().parent / "built-once"
    root.mkdir(exist_ok=True)
    target, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            done.touch()
    return target
