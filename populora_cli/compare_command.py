"""``populora compare``: the population against the single-agent baseline over seeds.

Usage::

    populora compare --preset P --seeds N --out DIR [--arms population,baseline] [--baseline-preset P2]
                     [--arm NAME=KIND[ FLAGS] --arm ...] [--first-seed S] [--backend local|ray] [--parallel K] [--ray-address ADDR]
                     [--tail T] [--reps R] [--bootstrap-seed B] [--eval-score population_mean|best|weakest]
                     [-- EXTRA TRAIN FLAGS]
    populora compare --from RUN_DIR [RUN_DIR ...] --out DIR [statistics flags]

Every arm x seed run lives in ``DIR/<arm>-s<seed>/``, an ordinary run directory (``populora report`` and
``populora eval`` work on it), started as its own process of the ordinary command line::

    populora train|baseline --preset P --seed S --run-dir DIR/<arm>-s<seed> --no-progress [EXTRA]
    populora train|baseline --resume DIR/<arm>-s<seed> --no-progress                # an unfinished run

A run is **complete** when its ``run_summary.json`` holds all the steps of its ``config.json`` (the loop writes
that file once, after the last step and the final adapters); complete runs are skipped, so a second call
launches nothing, and a call after a killed one resumes every unfinished run from its last checkpoint. A
directory holding run files but no ``config.json`` (killed during set-up, before anything was trained) is moved
to ``DIR/.unstarted/`` and started again. The runs' output goes to ``DIR/logs/<arm>-s<seed>.log``.

Cores: ``--parallel K`` runs at once, each with ``T = cores // K`` threads (at least 1): ``--threads`` and
``--generation.threads`` become ``T`` where the preset leaves them at 0 (torch's default: every core) or above
``T``, and ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` are ``T``. Each run is started so that it dies with this
command (``PR_SET_PDEATHSIG``): killing ``populora compare`` kills its runs, never leaves one writing.

``--backend ray``: one Ray task per run, on the cluster at ``--ray-address`` (or ``$RAY_ADDRESS``), else on a
private one-machine instance; ``cores`` is the smallest node's CPU count, the task asks for ``num_cpus`` = the
larger of the run's two thread counts and ``num_gpus = 1`` for a run on ``cuda`` or with vLLM generation, and
Ray runs as many at once as the nodes hold. The task starts the same command line on its node (same
interpreter path, working directory and ``PYTHONPATH`` as here: a cluster's nodes share the checkout).
Presets whose runs themselves use ``--backend ray`` are refused (not implemented).

**Arms with their own flags** (``--arm NAME=KIND[ FLAGS]``, repeated; instead of ``--arms``): an arm named ``NAME``
runs ``populora train`` (``KIND`` = ``population``) or ``populora baseline`` (``baseline``) with ``FLAGS`` (one
quoted string) after the preset, e.g. two staleness settings of the population::

    populora compare --preset cpu-learn --seeds 3 --out DIR \
        --arm "async=population --pipeline.max-staleness 1" --arm sync=population

Its runs are ``DIR/NAME-s<seed>/`` (``config.json``'s ``arm`` is ``NAME``, its ``arm_kind`` the kind), and the
difference reported is the first arm minus the second.

Then ``DIR/compare.md``, ``DIR/compare.json`` and figures (``evaluation.compare``). ``--from`` skips launching
and compares the given run directories (complete ones; the others are listed as excluded).

Exit status: 2 for a bad argument, preset or existing directory (before any run starts), 1 if a run failed
(the comparison of the complete runs is still written), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from populora_cli.errors import fail
from populora_cli.parsing import ArgumentParser

ARMS = {"population": "train", "baseline": "baseline"}
"""Arm -> the ``populora`` sub-command that runs it."""


class CompareError(Exception):
    """A bad argument or state found before any run starts (exit 2)."""


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its name (the runs' directories ``<name>-s<seed>``, ``config.json``'s ``arm``), its
    kind (``population`` or ``baseline``: the sub-command that runs it) and the flags its runs add."""

    name: str
    kind: str
    flags: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        """Whether the runs carry ``--arm NAME`` (a name other than the kind)."""
        return self.name != self.kind


def parse_arm(spec: str) -> Arm:
    """An :class:`Arm` from ``NAME=KIND[ FLAGS]`` (``--arm``); :class:`CompareError` naming what is wrong."""
    from populora_cli.api import ARM_NAME

    name, sep, rest = spec.partition("=")
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise CompareError(f"--arm: {exc} in {spec!r}") from None
    if not sep or not words or not re.fullmatch(ARM_NAME, name) or words[0] not in ARMS:
        raise CompareError(f"--arm: expected NAME=KIND[ FLAGS] with NAME matching {ARM_NAME} and KIND one of "
                           f"{', '.join(ARMS)}, got {spec!r} (e.g. --arm 'async=population --pipeline.max-staleness 1')")
    if any(w in ("--arm", "--run-dir", "--seed", "--preset", "--resume") or w.startswith(("--arm=", "--run-dir="))
           for w in words[1:]):
        raise CompareError(f"--arm: an arm's flags may not set the arm, run directory, seed, preset or resume "
                           f"(compare sets them), got {spec!r}")
    return Arm(name, words[0], tuple(words[1:]))


def _parser() -> argparse.ArgumentParser:
    from evaluation.compare.rundirs import EVAL_SCORES

    p = ArgumentParser(
        prog="populora compare",
        description="Launch (or resume) every arm x seed run of a preset into DIR/<arm>-s<seed>/ and compare the "
        "arms over seeds: mean and IQM per arm with 95 % bootstrap intervals, the difference population - "
        "baseline and the probability of improvement, learning curves (DIR/compare.md, compare.json, PNGs). "
        "Flags after '--' go to every new run's train/baseline command.")
    p.add_argument("--preset", help="preset of the runs (shipped name or .json file)")
    p.add_argument("--baseline-preset", help="preset of the baseline arm (default: --preset), e.g. azr-baseline")
    p.add_argument("--seeds", type=int, help="seeds per arm: first-seed .. first-seed + N - 1")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--arms", default=None, help="comma-separated subset of population,baseline (default: both)")
    p.add_argument("--arm", action="append", default=None, metavar="NAME=KIND[ FLAGS]",
                   help="an arm with its own flags (repeat; instead of --arms), e.g. --arm 'async=population "
                   "--pipeline.max-staleness 1' --arm sync=population: the difference is the first minus the second")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: runs as processes of this command; ray: one Ray task per run")
    p.add_argument("--parallel", type=int, default=1, help="runs at once per machine (each gets cores/K threads)")
    p.add_argument("--ray-address", default=None, help="Ray cluster to use (default: $RAY_ADDRESS, else a private "
                   "instance on this machine)")
    p.add_argument("--out", required=True, help="directory of the runs and of the comparison")
    p.add_argument("--from", dest="from_dirs", nargs="+", default=None, metavar="RUN_DIR",
                   help="compare these existing run directories; launch nothing")
    p.add_argument("--tail", type=int, default=3, help="steps averaged for a run's final value (and gain)")
    p.add_argument("--reps", type=int, default=2000, help="bootstrap replicates per interval")
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--eval-score", choices=EVAL_SCORES, default="population_mean",
                   help="which number of a run's eval/results.json stands for the run")
    p.add_argument("--gpu-memory-gib", default=None, metavar="N",
                   help="check each arm's GPU memory plan on an N GiB GPU before launching (exit 2 if one does not "
                   "fit); with --dry-run print the plans and launch nothing")
    p.add_argument("--dry-run", action="store_true",
                   help="resolve the arms' configurations (and plans, with --gpu-memory-gib), print them, launch nothing")
    return p


# ------------------------------------------------------------------------------------------ the plan


@dataclass
class Job:
    """One arm x seed run and the command that launches or resumes it."""

    arm: str
    seed: int
    run_dir: Path
    argv: list[str] = field(default_factory=list)
    resume: bool = False
    num_cpus: int = 1
    num_gpus: int = 0

    @property
    def name(self) -> str:
        return self.run_dir.name


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "populora_cli.main", *args]


def resolve(arm: Arm | str, preset: str, seed: int, extra: list[str]) -> dict[str, Any]:
    """The resolved configuration of an arm's run (``populora train|baseline ... --dry-run``, in a subprocess:
    the same code path as the runs). Raises :class:`CompareError` with the command's own message if refused."""
    arm = arm if isinstance(arm, Arm) else Arm(arm, arm)
    command = ARMS[arm.kind]
    p = subprocess.run(_cli(command, "--preset", preset, "--seed", str(seed), *arm.flags, *extra, "--dry-run"),
                       capture_output=True, text=True, env=_child_env(1), timeout=600)
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        line = lines[-1] if lines else f"exit status {p.returncode}"
        own = f"populora {command}: error: "  # the arm's command wrote the line with populora_cli.errors.fail
        if line.startswith(own):  # the same line as compare's own: --field: reason, then the arm
            raise CompareError(f"{line.removeprefix(own)} (the {arm.name} arm's configuration is refused)")
        raise CompareError(f"the {arm.name} arm's configuration is refused: {line}")
    return json.loads(p.stdout)


def _threads(cfg: dict[str, Any], threads: int) -> tuple[int, int]:
    """(torch threads, generation threads) of a run given ``threads`` per run: the preset's own where it sets
    them within ``threads``, else ``threads``."""
    own = int(cfg.get("threads") or 0)
    gen = int((cfg.get("generation") or {}).get("threads") or 0)
    return (own if 0 < own <= threads else threads), (gen if 0 < gen <= threads else threads)


def _thread_flags(cfg: dict[str, Any], threads: int) -> list[str]:
    own, gen = _threads(cfg, threads)
    flags = []
    if own != int(cfg.get("threads") or 0):
        flags += ["--threads", str(own)]
    if gen != int((cfg.get("generation") or {}).get("threads") or 0):
        flags += ["--generation.threads", str(gen)]
    return flags


def _gpus(cfg: dict[str, Any]) -> int:
    return 1 if cfg.get("device") == "cuda" or (cfg.get("generation") or {}).get("engine") == "vllm" else 0


def _preset_stem(preset: Any) -> str:
    return Path(str(preset)).stem


def plan(out: Path, arms: list[Arm] | list[str], presets: dict[str, str], seeds: list[int], extra: list[str],
         config_of: Any, threads: int) -> tuple[list[Job], list[str]]:
    """The jobs to run (new or resumed) and the names of the complete runs skipped. Checks every existing
    directory against what it should hold (arm, seed, preset) first: :class:`CompareError` if one differs.
    ``config_of(arm)``: the arm's resolved configuration (asked only for arms with a run to launch)."""
    from evaluation.compare.rundirs import State, read_run

    jobs: list[Job] = []
    skipped: list[str] = []
    for arm in [a if isinstance(a, Arm) else Arm(a, a) for a in arms]:
        for seed in seeds:
            run_dir = out / f"{arm.name}-s{seed}"
            info = read_run(run_dir)
            if info.state in (State.UNFINISHED, State.COMPLETE):
                want = {"arm": arm.name, "seed": seed, "preset": _preset_stem(presets[arm.name])}
                have = {"arm": info.arm, "seed": info.seed, "preset": _preset_stem(info.preset)}
                bad = [f"{k} {have[k]!r} (expected {want[k]!r})" for k in want if have[k] != want[k]]
                if bad:
                    raise CompareError(f"{run_dir} holds another run: {', '.join(bad)}; choose another --out")
            if info.state is State.COMPLETE:
                skipped.append(run_dir.name)
                continue
            cfg = config_of(arm.name)
            flags = ["--no-progress", *_thread_flags(cfg, threads)]
            command = ARMS[arm.kind]
            if info.state is State.UNFINISHED:
                argv = _cli(command, "--resume", str(run_dir), *flags)
            else:
                label = ["--arm", arm.name] if arm.labelled else []
                argv = _cli(command, "--preset", presets[arm.name], "--seed", str(seed), "--run-dir", str(run_dir),
                            *label, *flags, *arm.flags, *extra)
            jobs.append(Job(arm.name, seed, run_dir, argv, info.state is State.UNFINISHED,
                            max(_threads(cfg, threads)), _gpus(cfg)))
    return jobs, skipped


def set_aside_unstarted(out: Path, jobs: list[Job]) -> list[str]:
    """Move the directories of runs killed during set-up (run files, no ``config.json``) to ``out/.unstarted/``,
    so the run starts again there; returns what was moved."""
    from evaluation.compare.rundirs import State, read_run

    moved = []
    for job in jobs:
        if read_run(job.run_dir).state is State.UNSTARTED:
            dest = out / ".unstarted" / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(job.run_dir), str(dest))
            moved.append(f"{job.run_dir} -> {dest}")
    return moved


# ------------------------------------------------------------------------------------------ launching


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl: do not run orphaned
        os._exit(1)


def run_local(jobs: list[Job], parallel: int, logs: Path, env: dict[str, str]) -> dict[str, int]:
    """Run the jobs as child processes, ``parallel`` at once; returns each job's exit status. Interrupted
    (Ctrl-C, SIGTERM), it kills the running children before it returns."""
    pending = list(jobs)
    running: dict[str, tuple[subprocess.Popen, Any]] = {}
    status: dict[str, int] = {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                log = (logs / f"{job.name}.log").open("a", encoding="utf-8")
                log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(job.argv)}\n")
                log.flush()
                proc = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=_die_with_parent if sys.platform == "linux" else None)
                running[job.name] = (proc, log)
                print(f"  started {job.name} (pid {proc.pid}{', resuming' if job.resume else ''})", flush=True)
            time.sleep(0.2)
            for name, (proc, log) in list(running.items()):
                rc = proc.poll()
                if rc is not None:
                    log.close()
                    del running[name]
                    status[name] = rc
                    print(f"  {name} exited with status {rc}", flush=True)
    finally:
        for proc, log in running.values():
            proc.kill()
            proc.wait()
            log.close()
    return status


def run_ray(jobs: list[Job], logs: Path, env: dict[str, str], address: str | None) -> dict[str, int]:
    """Run each job as one Ray task with the job's CPUs and GPUs; returns each job's exit status."""
    import ray

    def run_task(argv: list[str], env: dict[str, str], log_path: str, cwd: str) -> int:
        import ctypes
        import os
        import signal
        import subprocess
        import time

        def die_with_parent() -> None:
            parent = os.getppid()
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} (ray task) {' '.join(argv)}\n")
            log.flush()
            return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                  preexec_fn=die_with_parent).returncode

    task = ray.remote(run_task)
    refs: dict[Any, Job] = {}
    status: dict[str, int] = {}
    try:
        for job in jobs:
            ref = task.options(num_cpus=job.num_cpus, num_gpus=job.num_gpus, max_retries=0).remote(
                job.argv, env, str((logs / f"{job.name}.log").resolve()), os.getcwd())
            refs[ref] = job
            print(f"  submitted {job.name} (num_cpus={job.num_cpus}, num_gpus={job.num_gpus}"
                  f"{', resuming' if job.resume else ''})", flush=True)
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            job = refs[done[0]]
            try:
                status[job.name] = int(ray.get(done[0]))
            except ray.exceptions.RayError as exc:
                print(f"  {job.name}: the Ray task failed: {type(exc).__name__}", flush=True)
                status[job.name] = 1
            print(f"  {job.name} exited with status {status[job.name]}", flush=True)
    finally:
        for ref, job in refs.items():
            if job.name not in status:
                ray.cancel(ref, force=True)
    return status


def _ray_init(address: str | None) -> int:
    """Connect to (or start) the cluster; returns the smallest node's CPU count."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(num_cpus=_cores(), include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    cpus = [int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
    return max(1, min(cpus)) if cpus else 1


# ------------------------------------------------------------------------------------------ main


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _plans(arms: list[Arm], config_of, gpu_gib: str | None, dry_run: bool) -> int | None:
    """``--dry-run`` / ``--gpu-memory-gib``: each arm's resolved configuration or GPU memory plan
    (:mod:`populora_cli.gpu_memory`; a baseline arm trains one adapter); an exit status, or None when the runs
    may be launched."""
    if gpu_gib is None:  # --dry-run alone: the resolved configurations
        for arm in arms:
            print(f"[{arm.name}] " + json.dumps(config_of(arm.name), indent=2, sort_keys=True))
        return 0
    from populora_cli import gpu_memory
    from selfplay.config import TrainConfig, from_dict

    plans = []
    for arm in arms:
        cfg = from_dict(TrainConfig, config_of(arm.name))
        members = 1 if arm.kind == "baseline" else cfg.env.num_teachers + cfg.env.num_students
        plans.append((arm.name, cfg, members))
    return gpu_memory.check("compare", plans, gpu_gib, dry_run)


def _machine_check(arms: list[Arm], config_of) -> None:
    """Each arm's run can run on this machine (:func:`selfplay.requirements.check_runtime`: CUDA, vLLM, the
    model's weights); :class:`CompareError` with the first arm's problem, before any run starts."""
    from selfplay.config import ConfigError, TrainConfig, from_dict
    from selfplay.requirements import check_runtime

    for arm in arms:
        try:
            check_runtime(from_dict(TrainConfig, config_of(arm.name)))
        except ConfigError as e:
            raise CompareError(f"--{e.field.replace('_', '-')}: {e.reason} (the {arm.name} arm)") from e


def compare_main(argv: list[str]) -> int:
    """Entry of ``populora compare`` (see the module docstring); returns the exit status."""
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    args = _parser().parse_args(argv)
    from evaluation import stats

    if not stats.rliable_available():
        return fail("compare", f"statistics over seeds need rliable, which is not installed: {stats.INSTALL_HINT}")
    out = Path(args.out)
    refused = _refused_numbers(args, out)
    if refused:
        return fail("compare", refused)
    from selfplay.rundir import RunDirError, check_output_dir

    try:  # a folder on a read-only file system: one line before any work
        check_output_dir(out, "the comparison", "--out")
    except RunDirError as e:
        return fail("compare", str(e))
    common = {"tail": args.tail, "reps": args.reps, "seed": args.bootstrap_seed, "eval_score": args.eval_score}
    if args.from_dirs is not None:
        return _compare_existing(args, out, extra)
    try:
        arms = _arms(args)
    except CompareError as e:
        return fail("compare", str(e))
    pair = (arms[0].name, arms[1].name) if args.arm is not None and len(arms) >= 2 else ("population", "baseline")
    common |= {"treatment": pair[0], "reference": pair[1]}
    if args.backend == "ray":
        from selfplay.distributed.config import RAY_INSTALL_HINT, ray_installed

        if not ray_installed():
            return fail("compare", f"--backend: ray needs Ray: {RAY_INSTALL_HINT}")
    elif args.ray_address:
        return fail("compare", "--ray-address: needs --backend ray")
    return _launch_and_compare(args, out, extra, arms, common)


def _refused_numbers(args: argparse.Namespace, out: Path) -> str | None:
    """The first numeric flag or ``--out`` that cannot be used, as the one line that names it; None when all can."""
    if args.tail < 1:
        return f"--tail: must be >= 1, got {args.tail}"
    if args.reps < 1:
        return f"--reps: must be >= 1, got {args.reps}"
    if out.exists() and not out.is_dir():
        return f"--out: {out} exists and is not a directory"
    if args.from_dirs is not None:
        return None
    if not args.preset:
        return "--preset: required (or --from RUN_DIR ...)"
    if args.seeds is None or args.seeds < 1:
        return "--seeds: required, N >= 1"
    if args.first_seed < 0:
        return f"--first-seed: must be >= 0, got {args.first_seed}"
    if args.parallel < 1:
        return f"--parallel: must be >= 1, got {args.parallel}"
    return None


def _compare_existing(args: argparse.Namespace, out: Path, extra: list[str]) -> int:
    """``--from``: compare finished runs, launching none."""
    from selfplay.rundir import RunDirError

    if args.preset or args.seeds is not None or extra:
        return fail("compare", "--from: compares existing runs; it takes no --preset, --seeds or train flags")
    missing = [d for d in args.from_dirs if not Path(d).is_dir()]
    if missing:
        return fail("compare", f"--from: {', '.join(missing)} is not a directory")
    from populora_cli.outputs import overlap

    clash = overlap(out, args.from_dirs, out_flag="--out", input_flag="--from", may_contain=True)
    if clash:  # compare --preset's layout holds its runs in --out: --from may name them
        return fail("compare", clash)
    from populora_cli.api import compare

    try:
        result = compare(args.from_dirs, out, tail=args.tail, reps=args.reps, bootstrap_seed=args.bootstrap_seed,
                         eval_score=args.eval_score)
    except RunDirError as e:  # a file of a run this project never writes (a link out of it, nested too deep)
        return fail("compare", str(e))
    print(f"comparison written to {out / 'compare.md'} ({len(result.files)} files)")
    return 0


def _arms(args: argparse.Namespace) -> list[Arm]:
    """The arms of ``--arm NAME=KIND...`` or ``--arms a,b``; raises :class:`CompareError` naming the flag."""
    if args.arm is not None:
        if args.arms is not None:
            raise CompareError("--arm: give either --arms or --arm (--arm names each arm with its kind)")
        arms = [parse_arm(spec) for spec in args.arm]
        if len({a.name for a in arms}) != len(arms):
            raise CompareError(f"--arm: two arms share a name ({', '.join(a.name for a in arms)})")
        return arms
    names = [a.strip() for a in (args.arms or "population,baseline").split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if not names or unknown or len(set(names)) != len(names):
        raise CompareError(f"--arms: choose from {', '.join(ARMS)} (got {args.arms!r})")
    return [Arm(a, a) for a in names]


def _launch_and_compare(args: argparse.Namespace, out: Path, extra: list[str], arms: list[Arm],
                        common: dict[str, Any]) -> int:
    """Check every arm's configuration, launch the unfinished runs (resuming the interrupted ones), compare."""
    from selfplay.rundir import RunDirError

    presets = {a.name: args.baseline_preset or args.preset if a.kind == "baseline" else args.preset for a in arms}
    by_name = {a.name: a for a in arms}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    configs: dict[str, dict[str, Any]] = {}

    def config_of(arm: str) -> dict[str, Any]:
        if arm not in configs:
            cfg = resolve(by_name[arm], presets[arm], seeds[0], extra)
            if cfg.get("backend") == "ray":
                raise CompareError(f"the {arm} arm's preset runs with --backend ray: populora compare launches "
                                   "local-backend runs only (not implemented for Ray-backend runs)")
            configs[arm] = cfg
        return configs[arm]

    try:  # every check before the cluster is joined and before any run starts
        if args.gpu_memory_gib is not None or args.dry_run:
            status = _plans(arms, config_of, args.gpu_memory_gib, args.dry_run)
            if status is not None:
                return status
        _machine_check(arms, config_of)
        jobs, _ = plan(out, arms, presets, seeds, extra, config_of, 1)
    except (CompareError, RunDirError) as e:
        return fail("compare", str(e))
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        cores = _ray_init(args.ray_address) if args.backend == "ray" and jobs else _cores()
    except Exception as e:  # noqa: BLE001 - any failure to join or start the cluster is one line, exit 2
        return fail("compare", f"--backend ray: cannot start or reach the Ray cluster: {type(e).__name__}: {e}")
    threads = max(1, cores // args.parallel)
    jobs, skipped = plan(out, arms, presets, seeds, extra, config_of, threads)
    logs = _announce(out, jobs, skipped, threads, args)
    status: dict[str, int] = {}
    try:
        if jobs and args.backend == "ray":
            status = run_ray(jobs, logs, _child_env(threads), args.ray_address)
        elif jobs:
            status = run_local(jobs, args.parallel, logs, _child_env(threads))
    except KeyboardInterrupt:  # the runs were stopped (run_local / run_ray kill them on the way out)
        print(f"populora compare: interrupted; run the same command again to resume the runs in {out}",
              file=sys.stderr)
        return 130
    finally:
        if args.backend == "ray" and jobs:
            import ray

            ray.shutdown()
    return _compare_launched(out, [out / f"{arm.name}-s{seed}" for arm in arms for seed in seeds], jobs, status,
                             logs, common)


def _announce(out: Path, jobs: list[Job], skipped: list[str], threads: int, args: argparse.Namespace) -> Path:
    """Create ``out/logs``, set aside runs killed during set-up and print what will run; returns the logs dir."""
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    for line in set_aside_unstarted(out, jobs):
        print(f"set aside a run killed during set-up: {line}")
    for name in skipped:
        print(f"  {name}: complete, skipped")
    for job in jobs:
        print(f"  {job.name}: {'unfinished, resuming' if job.resume else 'new run'}")
    print(f"{len(jobs)} run(s) to launch, {len(skipped)} complete; {threads} thread(s) per run, "
          f"{args.parallel if args.backend == 'local' else 'Ray-scheduled'} at once; logs in {logs}", flush=True)
    return logs


def _compare_launched(out: Path, run_dirs: list[Path], jobs: list[Job], status: dict[str, int], logs: Path,
                      common: dict[str, Any]) -> int:
    """Write the comparison of ``run_dirs``; exit 1 naming each run that did not complete."""
    from evaluation.compare import compare_runs
    from evaluation.compare.rundirs import read_run
    from selfplay.rundir import RunDirError

    try:
        failed = [d.name for d in run_dirs if not read_run(d).complete]
        files = compare_runs(run_dirs, out, launched=[j.name for j in jobs], **common)
    except RunDirError as e:
        return fail("compare", str(e))
    print(f"comparison written to {out / 'compare.md'} ({len(files)} files)")
    if failed:
        for name in failed:
            print(f"populora compare: {name} did not complete (status {status.get(name, '?')}; see "
                  f"{logs / (name + '.log')}); run the same command again to resume it", file=sys.stderr)
        return 1
    return 0
