"""Suite-wide layout for parallel workers (pytest-xdist, ``-n`` in ``pyproject.toml``'s ``addopts``).

* **Groups.** ``--dist loadgroup`` sends every test of one group to one worker, in a row; the groups are told
  by path (:func:`group_of`, :func:`pytest_xdist_make_scheduler`). The Ray tests form the group ``ray`` (one Ray
  cluster per session, started by ``tests/ray/conftest.py`` on the worker that runs them and stopped after the
  group's last test), so two clusters never share the cores. A module that defines a module-scoped fixture is
  one group, so the fixture is built once, not once per worker that runs one of its tests.
* **Runs built once for all workers.** :func:`built_once` builds a directory (a finished tiny run, say) the first
  time any worker asks for it and hands the same directory to every other worker, under a file lock in the
  run's shared base temp directory; without xdist it is an ordinary session-scoped build. Tests only read
  what it returns (they copy it first to change it).

Every test stays safe in a worker: files go to ``tmp_path``, no port is fixed, nothing is written to a shared
global directory but the converted-model cache (built under its own file lock, ``agents/models.py``).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"tests/ray/": "ray"}
"""Test paths whose tests one worker runs, in a row: the Ray tests (one cluster per session)."""


def group_of(nodeid: str) -> str:
    """The scheduling unit of a test: its group (:data:`GROUPS`); else its module when the module builds a
    module-scoped fixture (a finished run, a sandbox pool: split over two workers, each would build its own);
    else the test alone."""
    group = next((g for prefix, g in GROUPS.items() if nodeid.startswith(prefix)), None)
    if group is not None:
        return group
    module = nodeid.partition("::")[0]
    return module if _has_module_fixture(module) else nodeid


@functools.cache
def _has_module_fixture(module: str) -> bool:
    """Whether the test file ``module`` (a path relative to the repository) defines a module-scoped fixture."""
    path = ROOT / module
    return path.suffix == ".py" and path.is_file() and 'scope="module"' in path.read_text(encoding="utf-8")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a Python without pytest-xdist (a bare GPU image)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's ``loadgroup`` schedule, its groups told by path: xdist marks a group by appending ``@group`` to
    the node id, which pytest >= 9 node ids no longer take, so ``xdist_group`` marks would be ignored."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return PathGroups(config, log)


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
