"""Fixtures for the evaluation tests.

* ``data_dir``: the offline benchmark files, ``<repo>/../shared/evaldata`` (or ``$POPULORA_EVALDATA``);
  tests needing it are skipped with a clear reason when it is absent.
* ``evaluator`` (session): a :class:`CodeEvaluator` with one open sandbox (2 workers) and a ground-truth
  cache in a session temp dir (so results never depend on a user's cache).

Tests marked ``slow`` (full HumanEval/HumanEval+/MBPP+ canonical runs, ~4 min on 2 cores) are deselected by
the project's ``addopts = -m 'not slow'``; run them with ``pytest -m slow tests/evaluation``.
"""

from __future__ import annotations

import os

import pytest

from agents.evaluation.data import resolve_data_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
