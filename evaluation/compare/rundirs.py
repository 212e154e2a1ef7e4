"""What a run directory says about itself, for ``populora compare``: its arm, seed, preset, whether it is
complete, its per-step history and its benchmark scores. Standard library only: read from the files a run
leaves (``config.json``, ``run_summary.json``, ``eval/results.json``), never from the training code.

**Complete** means ``run_summary.json`` is readable and its ``steps`` reaches the ``steps`` of the run's
``config.json``: the training loop writes that file once, after the last step and the final adapters, so a
run killed at any earlier point has none (or, after an earlier, shorter session, one with fewer steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

RUN_MARKERS = ("config.json", "run_summary.json", "lineage.jsonl", "seeding.json", "checkpoints", "adapters",
               "report")
"""Entries that mark a directory as holding (part of) a run; the run layer's ``selfplay.rundir.RUN_ENTRIES``."""
EVENTS_PREFIX = "events.out.tfevents."

HISTORY_METRICS = ("valid_rate", "solve_rate", "student_format_rate", "teacher_reward", "student_reward")
"""The ``run_summary.json`` history fields compared (``step_seconds`` is a cost, not a result)."""
METRIC_LABELS = {
    "valid_rate": "teachers' valid rate",
    "solve_rate": "solve rate (matched tasks)",
    "student_format_rate": "students' format rate",
    "teacher_reward": "teacher reward",
    "student_reward": "student reward",
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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def run_markers(path: Path) -> list[str]:
    """The entries of ``path`` that belong to a run (empty if none or if ``path`` is no directory)."""
    if not path.is_dir():
        return []
    names = {p.name for p in path.iterdir()}
    return [n for n in RUN_MARKERS if n in names] + sorted(n for n in names if n.startswith(EVENTS_PREFIX))


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
    for bench, rec in (results.get("benchmarks") or {}).items():
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


def read_run(path: Path, eval_score: str = "population_mean") -> RunInfo:
    """Read ``path`` (see the module docstring); never raises for a damaged file (it goes into ``notes``)."""
    path = Path(path)
    markers = run_markers(path)
    if not markers:
        return RunInfo(path, State.ABSENT)
    cfg_file = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if cfg_file is None:
        info = RunInfo(path, State.UNSTARTED)
        if (path / "config.json").exists():
            info.notes.append(f"{path.name}: config.json is unreadable")
        return info
    info = RunInfo(path, State.UNFINISHED)
    config = cfg_file.get("config") if isinstance(cfg_file, dict) else None
    config = config if isinstance(config, dict) else {}
    info.arm = (cfg_file.get("arm") or cfg_file.get("kind")) if isinstance(cfg_file, dict) else None
    info.seed = config.get("seed")
    info.preset = config.get("preset")
    info.steps_total = config.get("steps")
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    info.reward_scheme = env.get("reward_scheme")
    summary = _read_json(path / "run_summary.json") if (path / "run_summary.json").is_file() else None
    if isinstance(summary, dict):
        info.steps_done = int(summary.get("steps") or 0)
        hist = summary.get("history")
        info.history = [h for h in hist if isinstance(h, dict)] if isinstance(hist, list) else []
        if isinstance(info.steps_total, int) and info.steps_done >= info.steps_total:
            info.state = State.COMPLETE
    elif (path / "run_summary.json").exists():
        info.notes.append(f"{path.name}: run_summary.json is unreadable")
    if (path / "eval" / "results.json").is_file():
        results = _read_json(path / "eval" / "results.json")
        info.eval_scores = _eval_scores(results, eval_score)
        aggregates = results.get("aggregates") if isinstance(results, dict) and results.get("complete") else None
        for row, rec in (aggregates or {}).items():
            v = _score_of(rec, eval_score)
            if v is not None:
                info.eval_scores[f"aggregate/{row}"] = v
        if not info.eval_scores:
            info.notes.append(f"{path.name}: eval/results.json is incomplete or holds no '{eval_score}' score")
    return info


def metric_series(info: RunInfo, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` over the run's history, steps without a value left out."""
    out = []
    for row in info.history:
        v, step = row.get(metric), row.get("step")
        if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(step, int):
            out.append((step, float(v)))
    return out
