"""The Python API: ``train``, ``baseline`` and ``compare`` from a notebook or a script, the same code the
``populora`` command runs (the command parses flags, then calls :func:`run_arm` and :func:`compare_runs`).

::

    from populora_cli import train, baseline, compare

    pop = train("tiny", steps=3, run_dir="runs/pop")          # a preset (name or .json) + settings
    base = baseline("tiny", steps=3, run_dir="runs/base")     # the compute-matched AZR arm of the same preset
    print(pop.history[-1]["valid_rate"], pop.run_dir)        # one row per step, the run directory
    result = compare([pop, base], out="runs/cmp")            # compare.md, compare.json, figures

A configuration is a preset (a shipped name such as ``"tiny"`` or ``"cpu-smoke"``, or a ``.json`` path), a
nested dict with the preset's layout, or a :class:`~selfplay.config.TrainConfig`; keyword settings override it,
one keyword per top-level field and a dict per section (``trainer={"lr": 1e-3}``, ``env={"num_students": 4}``).
The result is checked as a command line is (:meth:`TrainConfig.validate`; :class:`~selfplay.config.ConfigError`
names the dotted field) before any work starts.

Why here, at the top of the layers: ``train`` needs the run layer (``selfplay``), ``baseline`` the baseline
(``baselines``, which sits above it) and ``compare`` the comparison (``evaluation.compare``) and the launcher of
runs over seeds (``populora_cli.compare_command``); only the composition root sees all three. Importing this module
imports nothing heavy: torch loads when a run starts.

The API leaves logging and warnings as the caller set them (the command line quiets third-party output; see
:mod:`populora_cli.logs` to do the same: ``populora_cli.logs.configure(0)``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from selfplay.config import TrainConfig
    from selfplay.resume import ResumePoint

__all__ = ["Comparison", "Run", "baseline", "compare", "resolve_config", "run_arm", "train"]

ARMS = {"train": "population", "baseline": "baseline"}
"""``populora`` sub-command -> the arm it runs."""
ARM_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
"""An arm's own name (``populora train --arm NAME``, ``populora compare --arm NAME=KIND``): it names the run's
directory under ``populora compare``; the arm's kind is still ``population`` or ``baseline``."""


@dataclass(frozen=True)
class Run:
    """A finished run.

    Attributes:
        run_dir: its directory (``config.json``, ``run_summary.json``, ``adapters/``, ``report/``, events).
        arm: ``population`` or ``baseline``.
        config: the configuration it ran with.
        history: one dict per step: ``step``, ``valid_rate``, ``solve_rate``, ``student_format_rate``,
            ``teacher_reward``, ``student_reward``, ``step_seconds`` (None where a step had no value).
        seconds: wall-clock time of the call (set-up, steps, report).
        report: the report directory (``None`` when it was not made).
    """

    run_dir: Path
    arm: str
    config: TrainConfig
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    report: Path | None = None

    @property
    def steps(self) -> int:
        return len(self.history)

    def last(self, key: str) -> tuple[int, float] | None:
        """``(step, value)`` of the last step that has a value for ``key`` (e.g. ``solve_rate``, which a step
        without a valid task lacks), or None."""
        for row in reversed(self.history):
            if row.get(key) is not None:
                return int(row["step"]), float(row[key])
        return None


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`: where it was written, its data (``compare.json``) and the runs that did
    not complete (their seeds are left out of the statistics)."""

    out: Path
    files: list[Path]
    data: dict[str, Any]
    incomplete: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ arguments


def _kind(value: Any) -> str:
    """How an argument of the wrong type is shown: its type and a short repr (``str 'my_plugin.py'``)."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _check_config(func: str, config: Any) -> None:
    """``config`` is a preset name or ``.json`` path, a dict, a TrainConfig or None; :class:`TypeError` naming
    the argument otherwise."""
    from selfplay.config import TrainConfig

    if config is not None and not isinstance(config, str | Path | Mapping | TrainConfig):
        raise TypeError(f"{func}(): config must be a preset name or .json path (str or Path), a dict or a "
                        f"TrainConfig, got {_kind(config)}")
    if isinstance(config, Mapping) and not all(isinstance(k, str) for k in config):
        raise TypeError(f"{func}(): config: a dict's keys must be field names (str), got {_kind(list(config))}")


def _check_paths(func: str, name: str, values: Any, item: tuple[type, ...], what: str) -> None:
    """``values`` is a list (or tuple) of ``item``, not one string: ``plugins='my_plugin.py'`` would be read
    as the plugins ``m``, ``y``, ... — :class:`TypeError` naming the argument and the fix."""
    if isinstance(values, str | bytes | Path):
        raise TypeError(f"{func}(): {name} must be a list of {what}, got {_kind(values)} "
                        f"(write {name}=[{str(values)!r}])")
    if not isinstance(values, Sequence):
        raise TypeError(f"{func}(): {name} must be a list of {what}, got {_kind(values)}")
    for v in values:
        if not isinstance(v, item):
            raise TypeError(f"{func}(): {name} must be a list of {what}, got an item {_kind(v)}")


def _check_flag(func: str, name: str, value: Any) -> None:
    """``value`` is a bool (``report=1`` is refused, as a typo for another argument would be)."""
    if not isinstance(value, bool):
        raise TypeError(f"{func}(): {name} must be True or False, got {_kind(value)}")


def _check_count(func: str, name: str, value: Any, least: int) -> None:
    """``value`` is an int (not a bool) ``>= least``; :class:`TypeError` / :class:`ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{func}(): {name} must be an int, got {_kind(value)}")
    if value < least:
        raise ValueError(f"{func}(): {name} must be >= {least}, got {value}")


# ------------------------------------------------------------------------------------------ configuration


def _merge(cls: type, base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a config of dataclass ``cls`` as a dict) with ``changes``: a section (a nested dataclass) given
    as a dict changes only the fields it names; any other value, dict-valued settings included
    (``reward_kwargs``, ``operators``), replaces the field's."""
    import typing

    hints = typing.get_type_hints(cls)
    out = dict(base)
    for key, value in changes.items():
        section = hints.get(key)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(section) and isinstance(out.get(key), dict):
            out[key] = _merge(section, out[key], value)
        else:
            out[key] = value
    return out


def resolve_config(config: TrainConfig | str | Path | Mapping[str, Any] | None = None,
                   **settings: Any) -> TrainConfig:
    """The :class:`TrainConfig` of ``config`` (a preset name or ``.json`` path, a nested dict, a TrainConfig;
    ``None``: the ``cpu-smoke`` preset) with ``settings`` applied, not yet validated. Unknown fields and values
    of the wrong type raise :class:`~selfplay.config.ConfigError` naming the dotted field; a ``config`` of none
    of those types raises :class:`TypeError` naming it."""
    from selfplay.config import TrainConfig, from_dict, load_preset, to_dict

    _check_config("resolve_config", config)
    if config is None or isinstance(config, str | Path):
        base = load_preset(str(config or "cpu-smoke"))
    elif isinstance(config, TrainConfig):
        base = config
    else:
        base = from_dict(TrainConfig, {k: v for k, v in dict(config).items() if not k.startswith("_")})
    data = _merge(TrainConfig, to_dict(base), settings)
    return from_dict(TrainConfig, data)


def prepare(cfg: TrainConfig, arm: str) -> tuple[TrainConfig, dict[str, str] | None]:
    """``cfg`` ready to run as ``arm``: for a new run, the baseline's transform (and its agent assignment) and
    the default run name ``<preset>-<arm>-s<seed>`` (a resumed run, ``cfg.resume`` set, has both in its
    directory already); the plugins imported (:class:`~selfplay.plugins.PluginError`); every value checked
    (:class:`~selfplay.config.ConfigError`). Returns ``(config, assignment)``."""
    from selfplay.plugins import load_plugins, normalize_plugin

    assignment = None
    if arm == "baseline" and cfg.resume is None:
        from baselines.azr import azr_config, azr_mapping

        cfg, assignment = azr_config(cfg), azr_mapping()
    cfg = dataclasses.replace(cfg, plugins=tuple(normalize_plugin(p) for p in cfg.plugins))
    load_plugins(cfg.plugins)
    if cfg.name is None and cfg.run_dir is None and cfg.resume is None:
        cfg = dataclasses.replace(cfg, name=f"{Path(cfg.preset).stem}-{arm}-s{cfg.seed}")
    cfg.validate()
    return cfg, assignment


# ------------------------------------------------------------------------------------------ running


def run_arm(point: ResumePoint, cfg: TrainConfig, arm: str, assignment: Mapping[str, str] | None = None,
            report: bool = True, kind: str | None = None) -> Run:
    """Run ``cfg`` from ``point`` (inside its :func:`selfplay.resume.resume_point` block): the Ray cluster's
    pre-flight check for ``backend="ray"``, the steps, the final adapters, then the report. The errors of each
    part propagate (the command line turns them into its one line). ``arm`` is recorded in ``config.json``;
    ``kind`` (``population`` / ``baseline``) too when the arm has a name of its own (``populora train --arm``)."""
    from selfplay.config import TrainConfig

    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"run_arm(): cfg must be a TrainConfig (resolve_config, then prepare), got {_kind(cfg)}")
    if not isinstance(arm, str):
        raise TypeError(f"run_arm(): arm must be a str, got {_kind(arm)}")
    _check_flag("run_arm", "report", report)
    t0 = time.perf_counter()
    if cfg.backend == "ray":  # the cluster can hold the run (resources, run directory on every node)
        from selfplay.distributed.cluster import member_count, preflight, sandbox_limits

        preflight(cfg.ray, member_count(cfg, assignment), point.run_dir, dataclasses.asdict(sandbox_limits(cfg)))
    from selfplay.run import train_from

    meta = {"arm": arm} if kind in (None, arm) else {"arm": arm, "arm_kind": kind}
    run_dir = train_from(point, cfg, dict(assignment) if assignment else None, meta=meta)
    report_dir = None
    if report:
        from evaluation.report import make_report

        report_dir = make_report([run_dir])
    return Run(run_dir, arm, cfg, _history(run_dir), time.perf_counter() - t0, report_dir)


def _history(run_dir: Path) -> list[dict[str, Any]]:
    from evaluation.compare.rundirs import read_run

    return read_run(run_dir).history


def _start(arm: str, config: Any, plugins: Sequence[str], report: bool, settings: dict[str, Any]) -> Run:
    from selfplay.resume import resume_point

    func = "baseline" if arm == "baseline" else "train"
    _check_config(func, config)
    _check_paths(func, "plugins", plugins, (str, Path), "module names or .py paths")
    _check_flag(func, "report", report)
    plugins = [str(p) for p in plugins]
    if plugins:
        settings = {**settings, "plugins": tuple(plugins)}
    cfg, assignment = prepare(resolve_config(config, **settings), arm)
    from selfplay.requirements import check_runtime

    check_runtime(cfg)  # CUDA, vLLM, the model's weights: ConfigError before any work
    with resume_point(cfg, (), func) as point:
        return run_arm(point, cfg, arm, assignment, report)


def train(config: TrainConfig | str | Path | Mapping[str, Any] | None = None, *, plugins: Sequence[str] = (),
          report: bool = True, **settings: Any) -> Run:
    """Run a population (``populora train``): ``config`` and ``settings`` as in :func:`resolve_config`;
    ``plugins``: modules or ``.py`` files imported first; ``report``: write ``report/`` at the end. Returns the
    finished :class:`Run`. A directory that already holds a run is refused (:class:`~selfplay.rundir.RunDirError`)."""
    return _start("population", config, plugins, report, settings)


def baseline(config: TrainConfig | str | Path | Mapping[str, Any] | None = None, *, plugins: Sequence[str] = (),
             report: bool = True, **settings: Any) -> Run:
    """Run the compute-matched single-agent AZR baseline of a configuration (``populora baseline``; see
    :mod:`baselines.azr`); arguments as :func:`train`."""
    return _start("baseline", config, plugins, report, settings)


def compare(runs: Sequence[Run | str | Path], out: str | Path, *, tail: int = 3, reps: int = 2000,
            bootstrap_seed: int = 0, eval_score: str = "population_mean") -> Comparison:
    """Compare finished runs of the two arms over seeds (``populora compare --from``): per arm the mean and IQM
    with 95 % bootstrap intervals, the difference population - baseline, the probability of improvement and the
    learning curves, written to ``out`` (``compare.md``, ``compare.json``, figures). Runs that are not complete
    are listed in ``incomplete`` and left out. Launching the runs over seeds is the command line's
    ``populora compare --preset P --seeds N`` (each run its own process, resumable). An ``out`` that is or lies
    inside one of the runs is refused (``ValueError``) before anything is written."""
    import json

    from evaluation.compare import compare_runs
    from evaluation.compare.rundirs import EVAL_SCORES, read_run

    _check_paths("compare", "runs", runs, (Run, str, Path), "Run results or run directories")
    if not isinstance(out, str | Path):
        raise TypeError(f"compare(): out must be a directory (str or Path), got {_kind(out)}")
    _check_count("compare", "tail", tail, 1)
    _check_count("compare", "reps", reps, 1)
    _check_count("compare", "bootstrap_seed", bootstrap_seed, 0)
    if eval_score not in EVAL_SCORES:
        raise ValueError(f"compare(): eval_score must be one of {', '.join(EVAL_SCORES)}, got {eval_score!r}")
    dirs = [Path(r.run_dir if isinstance(r, Run) else r) for r in runs]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise FileNotFoundError(f"not a run directory: {', '.join(missing)}")
    from populora_cli.outputs import overlap

    clash = overlap(out, dirs, out_flag="out", input_flag="run", may_contain=True)  # may hold its runs
    if clash:
        raise ValueError(clash)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = compare_runs(dirs, out, tail=tail, reps=reps, seed=bootstrap_seed, eval_score=eval_score)
    incomplete = [d.name for d in dirs if not read_run(d).complete]
    data = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    return Comparison(out, [Path(f) for f in files], data, incomplete)
