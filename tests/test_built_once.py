"""``tests/conftest.py``: what the parallel workers share is built once, and the Ray tests are one scheduling unit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.conftest import built_once, group_of


class _Factory:
    """The part of ``pytest.TempPathFactory`` that :func:`built_once` uses, for one (fake) worker."""

    def __init__(self, root: Path, worker: str) -> None:
        self.base = root / worker
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str, numbered: bool = True) -> Path:
        path = self.base / f"{name}{len(list(self.base.iterdir()))}"
        path.mkdir()
        return path


def test_workers_share_one_build_and_a_failed_build_is_tried_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    builds: list[str] = []

    def build(target: Path) -> None:
        builds.append(threading.current_thread().name)
        (target / "run.txt").write_text("done")

    got: dict[str, Path] = {}
    workers = [threading.Thread(target=lambda w=w: got.update({w: built_once(_Factory(tmp_path, w), "run", build)}),
                                name=w) for w in ("gw0", "gw1", "gw2")]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(builds) == 1 and len(set(got.values())) == 1
    assert (got["gw1"] / "run.txt").read_text() == "done"

    def broken(target: Path) -> None:
        (target / "half").write_text("x")
        raise AssertionError("the run failed")

    with pytest.raises(AssertionError, match="the run failed"):
        built_once(_Factory(tmp_path, "gw0"), "other", broken)
    again = built_once(_Factory(tmp_path, "gw1"), "other", build)  # tried again, from a clean directory
    assert sorted(p.name for p in again.iterdir()) == ["run.txt"]


def test_without_xdist_each_session_builds_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _Factory(tmp_path, "session")
    a = built_once(factory, "run", lambda t: (t / "f").write_text("a"))
    b = built_once(factory, "run", lambda t: (t / "f").write_text("b"))
    assert a != b and (a / "f").read_text() == "a" and (b / "f").read_text() == "b"


def test_the_ray_tests_are_one_unit_and_the_others_one_each() -> None:
    assert group_of("tests/ray/test_units.py::test_fit_demands") == "ray"
    assert group_of("tests/ray/test_backend.py::test_sync_metric_tells_a_stale_engine") == "ray"
    assert group_of("tests/env/test_game.py::test_x[1]") == "tests/env/test_game.py::test_x[1]"
