"""Offline benchmark evaluation: HumanEval, HumanEval+, MBPP+ (code, checked in the sandbox) and GSM8K,
MATH-500, AIME 2024/2025, AMC 2023, Minerva, OlympiadBench (math, checked with math-verify).

Public API:

* :class:`EvalConfig` + :func:`run_eval`: evaluate a run directory (every member, the base model, a baseline):
  greedy pass@1 within per-benchmark budgets (AZR's on a GPU), avg@k over sampled answers (AIME/AMC by
  default) and AZR's aggregate rows; writes ``<run>/eval/results.json``, ``results.md`` and TensorBoard scalars
  ``eval/<benchmark>/<member>``;
* :func:`score_samples`: score an external samples file (human-eval / evalplus JSONL) on one benchmark;
* :class:`CodeEvaluator`: the sandboxed code checker (evalplus semantics), reusable with an open sandbox;
* :func:`extract_math_answer`, :func:`is_equivalent`: math answer extraction and math-verify equivalence;

Data: HumanEval from the ``human-eval`` package; everything else from ``--data-dir`` /
``$POPULORA_EVALDATA`` / the files shipped in ``evaluation/evaldata`` (see its ``SOURCES.md``).
LiveCodeBench has no offline source and is refused.
"""

from evaluation.code import CodeEvaluator, CodeResult
from evaluation.data import (
    CODE_BENCHMARKS,
    MATH_BENCHMARKS,
    BenchmarkUnavailable,
    CodeProblem,
    EvalDataError,
    MathProblem,
    load_code,
    load_math,
)
from evaluation.math_check import extract_math_answer, is_equivalent
from evaluation.runner import EvalConfig, run_eval
from evaluation.samples import score_samples

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
    "extract_math_answer",
    "is_equivalent",
    "load_code",
    "load_math",
    "run_eval",
    "score_samples",
]
