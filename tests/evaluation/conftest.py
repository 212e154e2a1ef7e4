"""Fixtures for the evaluation tests.

* ``data_dir``: the offline benchmark files, ``<repo>/../shared/evaldata`` (or ``$POPULORA_EVALDATA``);
  tests needing it are skipped with a clear reason when it is absent.
* ``evaluator`` (session): a :class:`CodeEvaluator` with one open sandbox (2 workers) and a ground-truth
  cache in a session temp dir (so results never depend on a user's cache).

Tests marked ``slow`` (full HumanEval+/MBPP+ runs, minutes) are skipped unless the marker expression
selects them (``pytest -m slow``) or ``POPULORA_SLOW=1`` is set.
"""

from __future__ import annotations

import os

import pytest

from agents.evaluation.data import resolve_data_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("-m") or "") or os.environ.get("POPULORA_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow` or POPULORA_SLOW=1")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir():
    path = resolve_data_dir()
    if not (path / "HumanEvalPlus-v0.1.10.jsonl.gz").is_file():
        pytest.skip(f"offline evaluation data not found at {path} (set POPULORA_EVALDATA)")
    return path


@pytest.fixture(scope="session")
def evaluator(tmp_path_factory):
    from agents.evaluation.code import CodeEvaluator

    with CodeEvaluator(workers=2, cache_dir=tmp_path_factory.mktemp("gt")) as ev:
        yield ev
