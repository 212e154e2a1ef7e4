"""No false alarm: ordinary code is never ``tamper`` (issue 52), counted on three corpora.

1. the env's seed programs (``populora_env.seeds.SEED_PROGRAMS``), each run on every one of its inputs, as
   validation runs a program (``ExecJob(plain=True)``);
2. HumanEval+'s and MBPP+'s canonical solutions on their own base and plus test inputs (the shipped evaluation
   data), run exactly as ``populora eval`` computes their ground truth: one job per problem, the solution under
   ``evaluation/_harness.py`` (``CodeEvaluator``'s ground-truth job);
3. a property-based (``hypothesis``) corpus of ordinary programs (``tests/sandbox/tampering.ORDINARY``: classes with
   ``__eq__``/``__repr__``, exceptions raised and caught, recursion, generators, closures, seeded ``random``,
   ``math``, ``itertools``, ``collections``, ``re``, ``json``, ``functools``, ``dataclasses``, ``typing``/``enum``).

It prints, per corpus, the jobs run, how many were ``tamper`` (by class) and how many drew randomness, and
exits 1 if any job was ``tamper``. Run: ``python benchmarks/tamper_false_alarms.py [--limit N] [--examples 300]``
(``--limit``: the first N problems of each benchmark; the full run takes minutes on two workers).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' corpus of ordinary programs

from evaluation.code import MAX_OUTPUT_CHARS, CodeEvaluator  # noqa: E402
from evaluation.data import load_humaneval_plus, load_mbpp_plus  # noqa: E402
from populora_env.sandbox import ExecJob, ExecResult, Limits, Sandbox  # noqa: E402
from populora_env.seeds import SEED_PROGRAMS  # noqa: E402


def _tally(name: str, results: list[ExecResult], labels: list[str]) -> dict:
    marks = Counter(r.tamper for r in results if r.tamper is not None)
    row = {"corpus": name, "jobs": len(results), "tamper": sum(marks.values()), "classes": dict(marks),
           "entropy": sum(r.entropy for r in results), "statuses": dict(Counter(r.status for r in results)),
           "tampering": [(label, r.tamper, (r.error or "")[:200]) for label, r in zip(labels, results, strict=True)
                         if r.tamper is not None][:10]}
    print(json.dumps(row))
    return row


def seed_corpus(sb: Sandbox) -> dict:
    jobs, labels = [], []
    for seed in SEED_PROGRAMS:
        for inp in seed.inputs:
            jobs.append(ExecJob(seed.program, f"f({inp})", plain=True))
            labels.append(f"{seed.name}({inp})")
    return _tally("seed programs", sb.run(jobs), labels)


def evalplus_corpus(sb: Sandbox, name: str, problems: list) -> dict:
    """Each problem's ground-truth job (its canonical solution on every base and plus input), as
    ``populora eval`` runs it."""
    evaluator = CodeEvaluator(sb)
    jobs = [evaluator._gt_job(p, None) for p in problems]  # noqa: SLF001 - the exact job eval runs
    return _tally(name, sb.run(jobs), [p.task_id for p in problems])


def hypothesis_corpus(sb: Sandbox, examples: int) -> dict:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tests.sandbox.tampering import ORDINARY, ordinary_program

    jobs, labels = [], []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None)
    @given(kinds=st.lists(st.sampled_from(sorted(ORDINARY)), min_size=1, max_size=6, unique=True),
           x=st.integers(min_value=0, max_value=30))
    def collect(kinds: list[str], x: int) -> None:
        jobs.append(ExecJob(ordinary_program(kinds), f"f({x})"))
        labels.append(f"{'+'.join(kinds)}({x})")

    collect()
    return _tally(f"hypothesis corpus ({len(ORDINARY)} kinds)", sb.run(jobs), labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N problems of HumanEval+ and MBPP+")
    ap.add_argument("--examples", type=int, default=300, help="programs of the hypothesis corpus (default 300)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    limits = Limits(timeout_s=60.0, memory_mb=4096, max_output_chars=MAX_OUTPUT_CHARS)
    with Sandbox(workers=args.workers, limits=limits) as sb:
        rows = [seed_corpus(sb), hypothesis_corpus(sb, args.examples),
                evalplus_corpus(sb, "HumanEval+ canonical solutions", load_humaneval_plus(limit=args.limit)),
                evalplus_corpus(sb, "MBPP+ canonical solutions", load_mbpp_plus(limit=args.limit))]
    total = sum(r["tamper"] for r in rows)
    print(f"tamper in {total} of {sum(r['jobs'] for r in rows)} jobs")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
