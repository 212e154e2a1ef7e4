"""Fixtures for the evaluation tests.

* ``data_dir``: the benchmark files shipped with the package (``evaluation/evaldata``), whatever
  ``$POPULORA_EVALDATA`` says, so the tests check what ships; missing files are an error, never a skip.
* ``evaluator`` (session): a :class:`CodeEvaluator` with one open sandbox (2 workers) and a ground-truth
  cache in a session temp dir (so results never depend on a user's cache).

Tests marked ``slow`` (full HumanEval/HumanEval+/MBPP+ canonical runs, ~4 min on 2 cores) are deselected by
the project's ``addopts = -m 'not slow'``; run them with ``pytest -m slow tests/evaluation``.
"""

from __future__ import annotations

import os

import pytest

from evaluation.data import FILES, SHIPPED_DATA_DIR, data_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_dir():
    for key in FILES:  # a missing file raises EvalDataError naming it
        data_file(key, SHIPPED_DATA_DIR)
    return SHIPPED_DATA_DIR


@pytest.fixture(scope="session")
def evaluator(tmp_path_factory):
    from evaluation.code import CodeEvaluator

    with CodeEvaluator(workers=2, cache_dir=tmp_path_factory.mktemp("gt")) as ev:
        yield ev
