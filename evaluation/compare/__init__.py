"""Comparing the arms over seeds (``populora compare``): reading run directories
(:mod:`~evaluation.compare.rundirs`), the statistics (:mod:`~evaluation.compare.summary`, estimators in
:mod:`evaluation.stats`) and ``compare.md`` / ``compare.json`` / figures (:mod:`~evaluation.compare.write`).
Launching the runs is the command line's job (``populora_cli/compare_command.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evaluation.compare.rundirs import HISTORY_METRICS, RunInfo, State, read_run
from evaluation.compare.summary import summarize
from evaluation.compare.write import write_outputs

__all__ = ["HISTORY_METRICS", "RunInfo", "State", "compare_runs", "read_run", "summarize", "write_outputs"]


def compare_runs(run_dirs: Sequence[Path], out: Path, tail: int = 3, reps: int = 2000, seed: int = 0,
                 confidence: float = 0.95, eval_score: str = "population_mean",
                 launched: Sequence[str] = (), treatment: str = "population", reference: str = "baseline"
                 ) -> list[Path]:
    """Read ``run_dirs``, compute the comparison (``treatment - reference``) and write it into ``out``; returns
    the files written."""
    runs = [read_run(Path(d), eval_score) for d in run_dirs]
    result = summarize(runs, tail=tail, reps=reps, seed=seed, confidence=confidence, eval_score=eval_score,
                       launched=launched, treatment=treatment, reference=reference)
    return write_outputs(result, Path(out))
