"""``populora``: the command line (composition root; nothing imports it).

Sub-commands::

    populora train    [--preset cpu-smoke] [--steps N] [--run-dir DIR] [--model NAME_OR_PATH] [...]
    populora train    --resume runs/<name>            # continue from the last checkpoint
    populora baseline [same flags]                    # the compute-matched single-agent AZR baseline
    populora report   runs/<a> [runs/<b> ...]         # PNG plots + summary.md
    populora eval     runs/<name> [--baseline runs/<other>] --benchmarks humaneval,gsm8k [--limit N]
    populora eval     --samples FILE.jsonl --benchmark humaneval [--json]
    populora evolve   --op ties --parents DIR_A DIR_B --out DIR_C [--param density=0.5]

A bad flag or config value exits with status 2 and a message naming the field, before any work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

USAGE = __doc__ or ""
COMMANDS = ("train", "baseline", "report", "eval", "evolve")


def _fail(cmd: str, message: str) -> int:
    print(f"populora {cmd}: error: {message}", file=sys.stderr)
    return 2


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


# ----------------------------------------------------------------------------------- train/baseline


def _train(cmd: str, argv: list[str]) -> int:
    from agents.config import ConfigError, TrainConfig, from_dict, load_preset, validate

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    pre.add_argument("--resume", default=None)
    known, _ = pre.parse_known_args(argv)
    kind = "baseline" if cmd == "baseline" else "population"
    try:
        if known.resume:
            cfg_path = Path(known.resume) / "config.json"
            if not cfg_path.is_file():
                return _fail(cmd, f"--resume: {cfg_path} not found (is {known.resume} a run directory?)")
            saved = json.loads(cfg_path.read_text())
            kind = saved.get("kind", kind)
            default = from_dict(TrainConfig, saved["config"])
        else:
            default = load_preset(known.preset or "cpu-smoke")
    except ConfigError as e:
        return _fail(cmd, f"{_flag(e.field)}: {e.args[0].split(': ', 1)[-1]}")
    cfg = tyro.cli(TrainConfig, default=default, args=argv, prog=f"populora {cmd}",
                   description=(TrainConfig.__doc__ or "") + f" Presets in configs/: see `populora {cmd} --help`.")
    if known.resume:
        cfg = dataclasses.replace(cfg, resume=Path(known.resume))
    if kind == "baseline" and not known.resume:
        from baselines.azr import azr_config

        cfg = azr_config(cfg)
    try:
        validate(cfg, kind)
    except ConfigError as e:
        return _fail(cmd, f"{_flag(e.field)}: {e.args[0].split(': ', 1)[-1]}")
    from agents.run import train

    run_dir = train(cfg, kind)
    print(f"run directory: {run_dir}")
    print(f"  tensorboard --logdir {run_dir}")
    return 0


# ------------------------------------------------------------------------------------------- report


@dataclass
class ReportArgs:
    """Plots and a summary.md comparing runs (solve rate, rewards, ratings, program complexity, coverage,
    response length, entropy, validity reasons, evolution events, eval results)."""

    runs: Annotated[list[Path], tyro.conf.Positional]
    """Run directories to compare."""
    out: Path | None = None
    """Output directory (default: <first run>/report)."""
    smoothing: float = 0.6
    """EMA smoothing weight of the plotted curves (0 = raw)."""


def _report(argv: list[str]) -> int:
    args = tyro.cli(ReportArgs, args=argv, prog="populora report")
    for r in args.runs:
        if not Path(r).is_dir():
            return _fail("report", f"run directory {r} does not exist")
    from agents.report import make_report

    try:
        out = make_report(args.runs, out=args.out, smoothing=args.smoothing)
    except (FileNotFoundError, ValueError) as e:
        return _fail("report", str(e))
    print(f"report written to {out}")
    return 0


# ------------------------------------------------------------------------------------------- evolve


@dataclass
class EvolveArgs:
    """Apply a LoRA weight-space operator to saved PEFT adapters (same rank and modules) and write the child."""

    op: str
    """Operator name (evolution.operators registry), e.g. ties, dare, svd_crossover, svd_mutation."""
    parents: list[Path]
    """Parent adapter directories (PEFT format); one for mutations, two for crossovers."""
    out: Path
    """Output directory of the child adapter (PEFT format)."""
    param: list[str] = field(default_factory=list)
    """Operator parameters as key=value (repeatable), e.g. density=0.5."""
    seed: int = 0
    """Seed of the operator's generator."""


def _evolve(argv: list[str]) -> int:
    args = tyro.cli(EvolveArgs, args=argv, prog="populora evolve")
    from evolution.adapters_io import evolve_dirs, parse_params

    try:
        params = parse_params(args.param)
        out = evolve_dirs(args.op, args.parents, args.out, params, seed=args.seed)
    except (ValueError, KeyError, FileNotFoundError) as e:
        return _fail("evolve", str(e))
    print(f"child adapter written to {out}")
    return 0


# --------------------------------------------------------------------------------------------- eval


def _eval(argv: list[str]) -> int:
    from agents.evaluation.cli import eval_main

    return eval_main(argv)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``populora`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("train", "baseline"):
        return _train(cmd, rest)
    if cmd == "report":
        return _report(rest)
    if cmd == "evolve":
        return _evolve(rest)
    if cmd == "eval":
        return _eval(rest)
    return _fail(cmd, f"unknown command (choose one of: {', '.join(COMMANDS)})")


if __name__ == "__main__":
    sys.exit(main())
