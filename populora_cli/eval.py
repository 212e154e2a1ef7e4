"""``populora eval``: benchmark evaluation of a run directory, or scoring of a samples file.

Usage::

    populora eval runs/<name> [--baseline runs/<other>] [--benchmarks humaneval,humaneval+,mbpp+,gsm8k,...]
                  [--limit N] [--data-dir DIR] [--members a,b] [--no-base] [--model NAME_OR_PATH]
                  [--device auto|cpu|cuda] [--budget-profile auto|gpu|cpu] [--max-new-tokens N]
                  [--max-new-tokens-code N] [--max-new-tokens-math N] [--budgets NAME=N,...]
                  [--samples-per-problem K] [--sampled-benchmarks aime24,aime25,amc23]
                  [--sample-temperature T] [--sample-top-p P] [--seed S]
                  [--batch-size N] [--workers N] [--out-dir DIR] [--no-tensorboard] [--step N]
    populora eval --samples FILE.jsonl --benchmark humaneval[,humaneval+] [--json] [--limit N]
                  [--data-dir DIR] [--results FILE.jsonl]

Budgets: AZR's (code 8096, math 16000 new tokens) on a GPU, 512 on CPU, unless overridden; avg@k over K sampled
answers (temperature 0.6, top-p 0.95 by default) on the sampled benchmarks, K = 16 by default on a GPU and off on
CPU; the results add AZR's aggregate rows (code average, math average, overall) and the weakest member against
the baseline on them (see evaluation/runner.py and evaluation/scores.py).

Exit status: 0 on success, 2 for a bad argument / unavailable benchmark / missing file (message on stderr).
With ``--json`` the samples mode prints one ``{"benchmark": ..., "pass@1": ..., "n": ...}`` object per
benchmark and line on stdout (and nothing else on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys

from evaluation.data import BenchmarkUnavailable, EvalDataError, parse_benchmarks
from evaluation.runner import DEFAULT_BENCHMARKS, EvalConfig, check_config, run_eval
from evaluation.samples import score_samples


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="populora eval",
        description="Greedy pass@1 (and avg@k over sampled answers) of every member of a run (and the base "
        "model / a baseline run) on offline code and math benchmarks, with AZR's aggregate rows; or scoring of an "
        "external samples file.",
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
    p.add_argument("--device", default=EvalConfig.device, help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--budget-profile", default=EvalConfig.budget_profile, choices=("auto", "gpu", "cpu"),
                   help="default budgets and K: gpu = AZR's (code 8096, math 16000 new tokens; K 16), cpu = 512/512, "
                   "K 0; auto follows the device")
    p.add_argument("--max-new-tokens", type=int, default=None, help="budget of every benchmark")
    p.add_argument("--max-new-tokens-code", type=int, default=None, help="budget of the code benchmarks")
    p.add_argument("--max-new-tokens-math", type=int, default=None, help="budget of the math benchmarks")
    p.add_argument("--budgets", default=None, help="per-benchmark budgets NAME=N,... (win over the others)")
    p.add_argument("--samples-per-problem", type=int, default=None,
                   help="K sampled answers per problem on the sampled benchmarks, reported as avg@K next to greedy "
                   "pass@1 (default: 16 on the gpu profile, 0 = off on cpu)")
    p.add_argument("--sampled-benchmarks", default=EvalConfig.sampled_benchmarks,
                   help=f"benchmarks that get avg@K (default: {EvalConfig.sampled_benchmarks})")
    p.add_argument("--sample-temperature", type=float, default=EvalConfig.sample_temperature)
    p.add_argument("--sample-top-p", type=float, default=EvalConfig.sample_top_p)
    p.add_argument("--seed", type=int, default=EvalConfig.seed, help="seed of the sampled answers")
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
            device=args.device,
            budget_profile=args.budget_profile,
            max_new_tokens=args.max_new_tokens,
            max_new_tokens_code=args.max_new_tokens_code,
            max_new_tokens_math=args.max_new_tokens_math,
            budgets=args.budgets,
            samples_per_problem=args.samples_per_problem,
            sampled_benchmarks=args.sampled_benchmarks,
            sample_temperature=args.sample_temperature,
            sample_top_p=args.sample_top_p,
            seed=args.seed,
            batch_size=args.batch_size,
            workers=args.workers,
            out_dir=args.out_dir,
            tensorboard=not args.no_tensorboard,
            step=args.step,
        )
        check_config(cfg)  # refuse livecodebench / unknown names / bad values before loading anything
        results = run_eval(cfg)
    except (BenchmarkUnavailable, EvalDataError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
    out = args.out_dir or f"{args.run_dir}/eval"
    print(f"wrote {out}/results.json and {out}/results.md")
    for bench, rec in results["benchmarks"].items():
        mean = rec.get("population_mean")
        base = rec.get("base")
        sampled = rec.get("avg@k")
        avg = f", avg@{sampled['k']} {_num(sampled.get('population_mean'))}" if sampled else ""
        print(f"{bench}: population mean {_num(mean)}, base {_num(base)}{avg}")
    for row, rec in (results.get("aggregates") or {}).items():
        if rec:
            weakest = rec["weakest"]
            gap = rec["vs_baseline"]["weakest"]
            vs = "" if gap is None else f", weakest - baseline {gap:+.3f}"
            print(f"{row} average: population mean {_num(rec.get('population_mean'))}, weakest "
                  f"{_num(weakest and weakest['score'])}{vs}")
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
