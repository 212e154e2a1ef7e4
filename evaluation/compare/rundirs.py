"""What a run directory says about itself, for ``populora compare``: its arm, seed, preset, whether it is
complete, its per-step history and its benchmark scores. Standard library only: read from the files a run
leaves (``config.json``, ``run_summary.json``, ``eval/results.json``) through the run layer's one reader
(:class:`selfplay.rundir.RunDir`), never from the training code. A damaged file is a note; one this project never
writes (nested beyond the bound, a link out of the directory) is refused, naming it.

**Complete** means ``run_summary.json`` is readable and its ``steps`` reaches the ``steps`` of the run's
``config.json``: the training loop writes that file once, after the last step and the final adapters, so a
run killed at any earlier point has none (or, after an earlier, shorter session, one with fewer steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from selfplay.rundir import CONFIG, EVAL, EVAL_RESULTS, SUMMARY, RunDir, RunFileError, UnsafeRunFile

HISTORY_METRICS = ("valid_rate", "solve_rate", "student_format_rate", "teacher_reward", "student_reward", "tamper")
"""The ``run_summary.json`` history fields compared (``step_seconds`` is a cost, not a result; ``tamper``, the
step's completions that tripped a sandbox defence, is logged by runs since the telemetry: older runs have none)."""
METRIC_LABELS = {
    "valid_rate": "teachers' valid rate",
    "solve_rate": "solve rate (matched tasks)",
    "student_format_rate": "students' format rate",
    "teacher_reward": "teacher reward",
    "student_reward": "student reward",
    "tamper": "tampering completions per step",
}
EVAL_SCORES = ("population_mean", "best", "weakest")
"""Which number of a run's ``eval/results.json`` record stands for the run: the mean over its members (the
baseline has one), its best or its weakest member."""


class State(StrEnum):
    """Where a run directory stands."""

    ABSENT = "absent"        # no directory, or one without any run entry: a new run starts there
    UNSTARTED = "unstarted"  # run entries but no config.json: killed during set-up, nothing to resume
    UNFINISHED = "unfinished"  # config.json but no complete run_summary.json: continue with --resume
    COMPLETE = "complete"


@dataclass
class RunInfo:
    """One run directory as ``populora compare`` sees it.

    Attributes:
        path: the directory.
        state: see :class:`State`.
        arm: ``config.json``'s ``arm`` (``population`` / ``baseline``), else None.
        seed, preset, steps_total: from ``config.json``'s ``config``.
        steps_done: ``run_summary.json``'s ``steps`` (0 without it).
        history: ``run_summary.json``'s per-step rows (empty without it).
        eval_scores: benchmark (and ``aggregate/<row>``) -> score of a *complete* ``eval/results.json``.
        reward_scheme: the run's ``env.reward_scheme``.
        notes: what could not be read.
    """

    path: Path
    state: State
    arm: str | None = None
    seed: int | None = None
    preset: str | None = None
    steps_total: int | None = None
    steps_done: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_scores: dict[str, float] = field(default_factory=dict)
    reward_scheme: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        return self.state is State.COMPLETE


def _eval_scores(results: Any, score: str) -> dict[str, float]:
    out: dict[str, float] = {}
    if not isinstance(results, dict) or not results.get("complete", False):
        return out
    benchmarks = results.get("benchmarks")
    for bench, rec in (benchmarks if isinstance(benchmarks, dict) else {}).items():
        v = _score_of(rec, score)
        if v is not None:
            out[bench] = v
    return out


def _score_of(rec: Any, score: str) -> float | None:
    if not isinstance(rec, dict):
        return None
    v = rec.get(score)
    if isinstance(v, dict):
        v = v.get("score")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _read(run: RunDir, read: Any, what: str, notes: list[str]) -> Any:
    """``read()``, or ``None`` with a note naming ``what`` when it is damaged; :class:`UnsafeRunFile` passes."""
    try:
        return read()
    except UnsafeRunFile:
        raise
    except RunFileError:
        notes.append(f"{run.name}: {what} is unreadable")
        return None


def read_run(path: Path, eval_score: str = "population_mean") -> RunInfo:
    """Read ``path`` (see the module docstring); a damaged file goes into ``notes``.

    Raises:
        UnsafeRunFile: a file this project never writes (naming it).
    """
    run = RunDir(path)
    if not run.entries():
        return RunInfo(run.path, State.ABSENT)
    notes: list[str] = []
    cfg_file = _read(run, run.config, CONFIG, notes)
    if cfg_file is None:
        return RunInfo(run.path, State.UNSTARTED, notes=notes)
    info = RunInfo(run.path, State.UNFINISHED, notes=notes)
    config = cfg_file.get("config") if isinstance(cfg_file.get("config"), dict) else {}
    arm = cfg_file.get("arm") or cfg_file.get("kind")
    info.arm = arm if isinstance(arm, str) else None
    info.seed = config.get("seed")
    info.preset = config.get("preset")
    info.steps_total = config.get("steps")
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    info.reward_scheme = env.get("reward_scheme")
    summary = _read(run, run.summary, SUMMARY, notes)
    if summary is not None:
        steps = summary.get("steps")
        info.steps_done = steps if isinstance(steps, int) and not isinstance(steps, bool) else 0
        info.history = run.history()
        if isinstance(info.steps_total, int) and info.steps_done >= info.steps_total:
            info.state = State.COMPLETE
    results = _read(run, run.eval_results, f"{EVAL}/{EVAL_RESULTS}", notes)
    if results is not None:
        info.eval_scores = _eval_scores(results, eval_score)
        aggregates = results.get("aggregates") if results.get("complete") else None
        for row, rec in (aggregates if isinstance(aggregates, dict) else {}).items():
            v = _score_of(rec, eval_score)
            if v is not None:
                info.eval_scores[f"aggregate/{row}"] = v
        if not info.eval_scores:
            info.notes.append(f"{run.name}: {EVAL}/{EVAL_RESULTS} is incomplete or holds no '{eval_score}' score")
    return info


def metric_series(info: RunInfo, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` over the run's history, steps without a value left out."""
    out = []
    for row in info.history:
        v, step = row.get(metric), row.get("step")
        if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(step, int):
            out.append((step, float(v)))
    return out
