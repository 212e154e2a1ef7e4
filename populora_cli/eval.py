"""``populora eval``: benchmark evaluation of a run directory, or scoring of a samples file.

Usage::

    populora eval runs/<name> [--baseline runs/<other>] [--benchmarks humaneval,humaneval+,mbpp+,gsm8k,...]
                  [--limit N] [--data-dir DIR] [--members a,b] [--no-base] [--model NAME_OR_PATH]
                  [--max-new-tokens N] [--max-new-tokens-math N] [--batch-size N] [--workers N]
                  [--out-dir DIR] [--no-tensorboard] [--step N]
    populora eval --samples FILE.jsonl --benchmark humaneval[,humaneval+] [--json] [--limit N]
                  [--data-dir DIR] [--results FILE.jsonl]

Exit status: 0 on success, 2 for a bad argument / unavailable benchmark / missing file (message on stderr).
With ``--json`` the samples mode prints one ``{"benchmark": ..., "pass@1": ..., "n": ...}`` object per
benchmark and line on stdout (and nothing else on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys

from evaluation.data import BenchmarkUnavailable, EvalDataError, parse_benchmarks
from evaluation.runner import DEFAULT_BENCHMARKS, EvalConfig, run_eval
from evaluation.samples import score_samples


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="populora eval",
        description="Greedy pass@1 of every member of a run (and the base model / a baseline run) on offline "
        "code and math benchmarks, or scoring of an external samples file.",
    )
    p.add_argument("run_dir", nargs="?", help="run directory (runs/<name>) to evaluate")
    p.add_argument("--baseline", help="another run directory evaluated alongside (e.g. the AZR baseline)")
    p.add_argument("--benchmarks", default=None, help=f"comma-separated (default: {DEFAULT_BENCHMARKS})")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    p.add_argument(
        "--data-dir",
        default=None,
        help="directory of the benchmark files (default: $POPULORA_EVALDATA, else the shipped files)",
    )
    p.add_argument("--members", default=None, help="comma-separated subset of the run's members")
    p.add_argument("--no-base", action="store_true", help="do not evaluate the base model")
    p.add_argument("--model", default=None, help="base model override (default: the run's config.json)")
    p.add_argument("--max-new-tokens", type=int, default=EvalConfig.max_new_tokens)
    p.add_argument("--max-new-tokens-math", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=EvalConfig.batch_size)
    p.add_argument("--workers", type=int, default=EvalConfig.workers, help="sandbox workers")
    p.add_argument("--out-dir", default=None, help="output directory (default: <run>/eval)")
    p.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard scalars")
    p.add_argument("--step", type=int, default=None, help="TensorBoard step (default: latest checkpoint)")
    p.add_argument("--samples", default=None, help="score this JSONL samples file instead of a run")
    p.add_argument("--benchmark", default=None, help="benchmark(s) of --samples (comma-separated)")
    p.add_argument("--json", action="store_true", help="--samples: print JSON lines on stdout")
    p.add_argument("--results", default=None, help="--samples: write per-sample outcomes to this JSONL file")
    return p


def _fail(message: str) -> int:
    print(f"populora eval: error: {message}", file=sys.stderr)
    return 2


def eval_main(argv: list[str]) -> int:
    """Entry point of ``populora eval`` (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.samples:
            if args.run_dir:
                return _fail("give either a run directory or --samples, not both")
            if not args.benchmark:
                return _fail("--samples needs --benchmark NAME (e.g. humaneval)")
            benches = parse_benchmarks(args.benchmark)
            if args.limit is not None and args.limit < 1:
                return _fail(f"--limit must be >= 1, got {args.limit}")
            for bench in benches:
                results_path = args.results
                if results_path and len(benches) > 1:
                    results_path = f"{args.results}.{bench}"
                summary = score_samples(
                    args.samples, bench, data_dir=args.data_dir, limit=args.limit, results_path=results_path
                )
                if args.json:
                    print(json.dumps({"benchmark": bench, "pass@1": summary["pass@1"], "n": summary["n"]}))
                else:
                    extra = f", base tests {summary['base_pass@1']:.4f}" if "base_pass@1" in summary else ""
                    print(f"{bench}: pass@1 = {summary['pass@1']:.4f} (n = {summary['n']}{extra})")
            return 0
        if not args.run_dir:
            return _fail(
                "give a run directory (populora eval runs/<name>) or --samples FILE --benchmark NAME"
            )
        if args.benchmark and not args.benchmarks:
            args.benchmarks = args.benchmark
        cfg = EvalConfig(
            run_dir=args.run_dir,
            baseline=args.baseline,
            benchmarks=args.benchmarks or DEFAULT_BENCHMARKS,
            limit=args.limit,
            data_dir=args.data_dir,
            members=args.members,
            include_base=not args.no_base,
            model=args.model,
            max_new_tokens=args.max_new_tokens,
            max_new_tokens_math=args.max_new_tokens_math,
            batch_size=args.batch_size,
            workers=args.workers,
            out_dir=args.out_dir,
            tensorboard=not args.no_tensorboard,
            step=args.step,
        )
        parse_benchmarks(cfg.benchmarks)  # refuse livecodebench / unknown names before loading anything
        results = run_eval(cfg)
    except (BenchmarkUnavailable, EvalDataError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
    out = args.out_dir or f"{args.run_dir}/eval"
    print(f"wrote {out}/results.json and {out}/results.md")
    for bench, rec in results["benchmarks"].items():
        mean = rec.get("population_mean")
        base = rec.get("base")
        print(
            f"{bench}: population mean {'-' if mean is None else f'{mean:.3f}'}, "
            f"base {'-' if base is None else f'{base:.3f}'}"
        )
    return 0
