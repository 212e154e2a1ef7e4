"""``populora``: the command line (composition root; nothing imports it).

Sub-commands::

    populora train    [--preset NAME|FILE.json] [--plugins MOD|FILE.py ...] [--steps N] [--run-dir DIR]
                      [--model NAME_OR_PATH] [--dry-run] [...]
    populora train    --resume runs/<name>            # continue from the last checkpoint
    populora train    --arm NAME [...]                 # label the run's arm (populora compare --arm)
    populora baseline [same flags]                    # the compute-matched single-agent AZR baseline
    populora report   runs/<a> [runs/<b> ...]         # PNG plots + summary.md
    populora eval     runs/<name> [--baseline runs/<other>] --benchmarks humaneval,gsm8k [--limit N]
    populora eval     --samples FILE.jsonl --benchmark humaneval [--json]
    populora evolve   --op ties --parents DIR_A DIR_B --out DIR_C [--param density=0.5]
    populora compare  --preset P --seeds N --out DIR [--backend local|ray] [--parallel K]  # arms over seeds
    populora compare  --from RUN_DIR [RUN_DIR ...] --out DIR
    populora list     [schemes|estimators|operators|fitness|selections|matchings|presets|models|benchmarks]
                      [--plugins FILE.py ...]
    populora test-scheme    NAME [--plugins FILE.py ...] [--kwargs JSON]   # every branch, scripted, no model
    populora test-estimator NAME [--plugins FILE.py ...] [--kwargs JSON]
    populora test-selection NAME [--plugins FILE.py ...] [--kwargs JSON] [--fitness NAME]  # scripted population
    populora test-matching  NAME [--plugins FILE.py ...] [--kwargs JSON] [--random-share X]

Any sub-command takes --verbose (every library's log lines and warnings) or --quiet (warnings only).
A bad flag or config value exits with status 2 and one line naming the field, before any work starts
(``populora train: error: --trainer.lr: must be > 0, got -1``; populora_cli.errors).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import tyro

from populora_cli import gpu_memory
from populora_cli.api import ARM_NAME
from populora_cli.errors import config_error as _config_error
from populora_cli.errors import fail as _fail
from populora_cli.errors import interrupted as _interrupted
from populora_cli.logs import DEFAULT, configure, program, summary, take_verbosity
from populora_cli.parsing import ArgumentParser, UsageError, json_dict_rule, parse

if TYPE_CHECKING:
    from selfplay.resume import ResumePoint

# OpenMP threads that sleep instead of spinning when idle (agents.generation.threads): libgomp reads this once,
# when torch loads, so it is set here, before anything imports torch; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

USAGE = __doc__ or ""
_VERBOSITY = DEFAULT
"""The output level of this invocation (``--verbose`` / ``--quiet``; :mod:`populora_cli.logs`)."""
COMMANDS = ("train", "baseline", "report", "eval", "evolve", "compare", "list", "test-scheme", "test-estimator",
            "test-selection", "test-matching")


# ----------------------------------------------------------------------------------- train/baseline

ARMS = {"train": "population", "baseline": "baseline"}


def _take_overrides(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` without ``--override FIELD [FIELD ...]`` (or ``--override=FIELD``), and the fields (``None``: the
    flag was not given)."""
    rest: list[str] = []
    fields: list[str] | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--override" or a.startswith("--override="):
            fields = fields if fields is not None else []
            if a.startswith("--override="):
                fields += [f for f in a.split("=", 1)[1].split(",") if f]
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                fields.append(argv[i])
                i += 1
            continue
        rest.append(a)
        i += 1
    return rest, fields


def _without_arm(argv: list[str]) -> list[str]:
    """``argv`` without ``--arm NAME`` / ``--arm=NAME`` (the pre-parser's; not a configuration field)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--arm":
            skip = True
        elif not a.startswith("--arm="):
            out.append(a)
    return out


def _parse_train_config(cmd: str, argv: list[str], default: Any) -> Any:
    """The run's ``TrainConfig``: ``default`` (a preset, or the resumed run's) with the command line's flags."""
    from selfplay.config import TrainConfig, list_presets
    from selfplay.rundir import CONFIG, CONFIG_HISTORY

    presets = ", ".join(list_presets())
    with json_dict_rule():
        return parse(TrainConfig, argv, f"populora {cmd}", default=default,
                     extra_flags=("--preset", "--resume", "--dry-run", "--override", gpu_memory.FLAG),
                     description=(TrainConfig.__doc__ or "") + f" Shipped presets: {presets}. "
                     "--dry-run prints the resolved configuration as JSON and exits; with --gpu-memory-gib N it prints "
                     "the run's GPU memory plan instead and exits 2 when the run does not fit (without --dry-run "
                     "the plan gates the run). With --resume RUN_DIR, "
                     "--override FIELD [FIELD ...] allows the named settings (dotted, e.g. trainer.lr) to differ "
                     f"from the run's {CONFIG}; the change is recorded in RUN_DIR/{CONFIG_HISTORY}. Any sub-command "
                     "takes --verbose (every library's log lines, warnings and loading bars) or --quiet (warnings and "
                     "the run's final lines only).")


def _train(cmd: str, argv: list[str]) -> int:
    from selfplay.config import ConfigError, load_preset, to_dict
    from selfplay.config_changes import SavedRun, plan_resume, read_saved_run
    from selfplay.plugins import PluginError, normalize_plugin
    from selfplay.rundir import CONFIG, RunDirError

    pre = ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    pre.add_argument("--resume", default=None)
    pre.add_argument("--dry-run", action="store_true")
    pre.add_argument("--arm", default=None)
    known, _ = pre.parse_known_args(argv)
    argv, gpu_gib = gpu_memory.take_flag(argv)
    argv, overrides = _take_overrides([a for a in argv if a != "--dry-run"])
    argv = _without_arm(argv)
    if overrides is not None and not known.resume:
        return _fail(cmd, "--override: only with --resume (it names settings of a resumed run allowed to change)")
    if known.arm is not None and (known.resume or not re.fullmatch(ARM_NAME, known.arm)):
        why = "a resumed run keeps its arm" if known.resume else f"must match {ARM_NAME}, got {known.arm!r}"
        return _fail(cmd, f"--arm: {why}")
    arm = known.arm or ARMS[cmd]
    assignment: dict[str, str] | None = None
    saved: SavedRun | None = None
    try:
        if known.resume:  # config.json read once, here; selfplay.resume gets what was read and compared
            saved = read_saved_run(known.resume)
            # the run's plugins are code from its directory: imported only when named on this command line again
            default = dataclasses.replace(saved.config, plugins=())
            if known.preset:  # its values, compared with the run's below: every difference is listed
                default = load_preset(known.preset)
            arm = saved.record.get("arm", arm)
            assignment = saved.assignment
        else:
            default = load_preset(known.preset or "cpu-smoke")
    except ConfigError as e:
        return _config_error(cmd, e)
    except RunDirError as e:
        return _fail(cmd, f"--resume: {e}")
    cfg = _parse_train_config(cmd, argv, default)
    if known.resume:
        cfg = dataclasses.replace(cfg, resume=Path(known.resume))
    cfg = dataclasses.replace(cfg, plugins=tuple(normalize_plugin(p) for p in cfg.plugins))
    unnamed = [p for p in saved.config.plugins if p not in cfg.plugins] if saved is not None else []
    if unnamed:
        return _fail(cmd, f"--resume: {saved.run.entry(CONFIG)} names the plugin(s) {', '.join(unnamed)}; a run's "
                          "plugins are imported only when named on the command line: if you trust them, add "
                          f"--plugins {' '.join(unnamed)}")
    from populora_cli.api import prepare

    plan = None
    try:
        cfg, new_assignment = prepare(cfg, ARMS[cmd])  # the baseline's transform, plugins, the run's name, validate()
        assignment = assignment or new_assignment
        if saved is not None:  # the run's own configuration: a difference is refused (or recorded) before any work
            plan = plan_resume(cfg, overrides or (), saved)
    except PluginError as e:
        return _fail(cmd, f"--plugins: {e}")
    except ConfigError as e:
        return _refused_value(cmd, e, saved, cfg)
    if gpu_gib is not None:  # the GPU memory plan: printed with --dry-run, a gate without
        members = len(set(assignment.values())) if assignment else cfg.env.num_teachers + cfg.env.num_students
        status = gpu_memory.check(cmd, [(arm, cfg, members)], gpu_gib, known.dry_run)
        if status is not None:
            return status
    if known.dry_run:
        print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
        return 0
    from selfplay.checkpoint import CheckpointError
    from selfplay.requirements import check_runtime
    from selfplay.resume import resume_point

    try:  # CUDA, vLLM, the model's weights here; new run or resume, decided and checked once; the lock is held
        check_runtime(cfg)
        with resume_point(cfg, overrides or (), cmd, plan) as point:
            return _train_locked(cmd, cfg, assignment, arm, point)
    except (RunDirError, CheckpointError) as e:  # before the model loads
        return _fail(cmd, str(e))
    except ConfigError as e:
        return _config_error(cmd, e)


def _refused_value(cmd: str, exc: Any, saved: Any, cfg: Any) -> int:
    """The line of a refused setting: ``--field: reason``; on resume, when the value is the one the run's
    ``config.json`` holds (not a flag of this command line), the line names that file (a crafted or foreign
    ``config.json``: ``--resume: runs/x/config.json: --trainer.advantage: unknown ...``)."""
    from selfplay.config import to_dict
    from selfplay.rundir import CONFIG

    missing = object()

    def value(config: Any) -> Any:
        node: Any = to_dict(config)
        for part in exc.field.split("."):
            node = node.get(part, missing) if isinstance(node, dict) else missing
        return node

    if saved is not None and value(saved.config) is not missing and value(saved.config) == value(cfg):
        return _fail(cmd, f"--resume: {saved.run.entry(CONFIG)}: {exc.field}: {exc.reason}")
    return _config_error(cmd, exc)


def _train_locked(cmd: str, cfg: Any, assignment: dict[str, str] | None, arm: str, point: ResumePoint
                  ) -> int:
    from populora_cli.api import run_arm
    from populora_env.rewards import RewardSchemeError
    from selfplay.checkpoint import CheckpointError
    from selfplay.config import ConfigError
    from selfplay.distributed.cluster import ClusterError
    from selfplay.finite import NonFiniteTraining
    from selfplay.rundir import CONFIG, RunDirError, os_error_line

    target = point.run_dir
    try:
        run = run_arm(point, cfg, arm, assignment, report=False, kind=ARMS[cmd])
    except ConfigError as e:
        return _config_error(cmd, e)
    except RewardSchemeError as e:
        return _fail(cmd, f"--env.reward-scheme {cfg.env.reward_scheme}: {e}; the run stopped before training on it")
    except (RunDirError, CheckpointError, ClusterError, NonFiniteTraining) as e:
        return _fail(cmd, str(e))
    except OSError as e:  # a full disk, a folder that became unwritable, ...: one line, no traceback
        logging.getLogger(__name__).debug("the run stopped", exc_info=True)
        again = f"; continue it with --resume {target}" if (target / CONFIG).is_file() else ""
        return _fail(cmd, f"{os_error_line(e)}{again}")
    from evaluation.report import make_report

    try:
        report = make_report([run.run_dir])
    except OSError as e:
        return _fail(cmd, f"the run finished in {run.run_dir}, but its report could not be written: "
                          f"{os_error_line(e)}")
    print(summary(dataclasses.replace(run, report=report), _VERBOSITY))
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
    args = parse(ReportArgs, argv, "populora report")
    if not args.runs:
        return _fail("report", "RUNS: required (give one or more run directories)")
    for r in args.runs:
        if not Path(r).is_dir():
            return _fail("report", f"RUNS: run directory {r} does not exist")
    from evaluation.report import make_report
    from populora_cli.outputs import overlap
    from selfplay.rundir import REPORT, RunDirError, check_output_dir, os_error_line

    clash = args.out is not None and overlap(args.out, args.runs, out_flag="--out", input_flag="RUNS", own=(REPORT,))
    if clash:
        return _fail("report", clash)
    try:  # a run on a read-only file system: one line before any work (the default out is inside the run)
        check_output_dir(args.out or Path(args.runs[0]) / REPORT, "the report", "--out")
    except RunDirError as e:
        return _fail("report", str(e))
    try:
        out = make_report(args.runs, out=args.out, smoothing=args.smoothing)
    except (FileNotFoundError, ValueError, RunDirError) as e:
        return _fail("report", f"RUNS: {e}")
    except OSError as e:  # the file system changed under the report (full, unmounted, made read-only)
        return _fail("report", f"cannot write the report: {os_error_line(e)}")
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
    args = parse(EvolveArgs, argv, "populora evolve")
    from evolution.adapters_io import PROVENANCE_NAME, EvolveError, evolve_dirs, parse_params
    from populora_cli.outputs import overlap
    from selfplay.rundir import os_error_line

    clash = overlap(args.out, args.parents, out_flag="--out", input_flag="--parents")
    if clash:  # the child's files would replace a parent's
        return _fail("evolve", clash)
    try:
        params = parse_params(args.param)
    except ValueError as e:
        return _fail("evolve", f"--param: {e}")
    try:
        out = evolve_dirs(args.op, args.parents, args.out, params, seed=args.seed)
    except EvolveError as e:
        return _fail("evolve", f"--{e.argument}: {e}")
    except FileNotFoundError as e:
        return _fail("evolve", f"--parents: {e}")
    except OSError as e:  # writing the child: a full disk, --out under a file, ...
        return _fail("evolve", f"cannot write --out {args.out}: {os_error_line(e)}")
    print(f"child adapter written to {out} (how it was made: {out / PROVENANCE_NAME})")
    print(f"  score it: {program()} eval --adapters {out} --benchmarks humaneval,gsm8k --limit 10")
    return 0


# --------------------------------------------------------------------------------------------- eval


def _eval(argv: list[str]) -> int:
    from populora_cli.eval import eval_main

    return eval_main(argv)


# --------------------------------------------------------------------------------------------- main

_RESUME_HINT = {
    "train": "the last checkpoint is kept: continue with populora train --resume RUN_DIR",
    "baseline": "the last checkpoint is kept: continue with populora baseline --resume RUN_DIR",
    "eval": "the answers scored so far are kept: run the same command again to resume",
    "compare": "run the same command again to resume the runs",
}
"""What a Ctrl-C'd command keeps, and how to go on (its line after ``interrupted; ``)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``populora`` console script. A command line that cannot be parsed is one line on
    stderr and exit 2; Ctrl-C is one line and exit 130 (:mod:`selfplay.interrupt`); output cut off by a
    closed pipe (``populora train --help | head``) ends quietly."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = next((a for a in argv if a not in ("--verbose", "--quiet")), "")
    from selfplay import interrupt

    previous = interrupt.install()
    try:
        try:
            return _dispatch(argv)
        except UsageError as e:
            return _fail(cmd, str(e))
        except KeyboardInterrupt:  # Ctrl-C: one line, 130; what was being written is atomic or cleaned up
            return _interrupted(cmd, _RESUME_HINT.get(cmd, ""))
        finally:
            interrupt.restore(previous)
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: nothing more can be shown, and no traceback should be
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush at exit fails quietly too
        return 128 + 13  # as if killed by SIGPIPE, the shells' convention


def _dispatch(argv: list[str]) -> int:
    global _VERBOSITY
    argv, _VERBOSITY = take_verbosity(argv)
    configure(_VERBOSITY)
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
    if cmd == "compare":
        from populora_cli.compare_command import compare_main

        return compare_main(rest)
    if cmd == "list":
        from populora_cli.listing import list_main

        return list_main(rest)
    if cmd in ("test-scheme", "test-estimator"):
        from populora_cli.plugin_check import check_main

        return check_main(cmd, rest)
    if cmd in ("test-selection", "test-matching"):
        from populora_cli.rule_check import rule_main

        return rule_main(cmd, rest)
    close = difflib.get_close_matches(cmd, COMMANDS, n=1)
    return _fail(cmd, f"unknown command (choose one of: {', '.join(COMMANDS)})"
                      + (f"; did you mean {close[0]}?" if close else ""))


if __name__ == "__main__":
    sys.exit(main())
