"""Did a run learn? First steps vs last steps, per task type, from the run's TensorBoard scalars.

For every run directory and every task type, the mean of the first ``--window`` steps and of the last
``--window`` steps of:

- the teachers' valid rate (``charts/valid_rate/<type>``),
- the students' well-formatted rate and correct rate over all their attempts (``charts/student_format_rate/<type>``,
  ``charts/student_correct_rate/<type>``),

per type, so that a rise is not a drifting task-type mix; plus the overall curves of ``run_summary.json``
(``history``: valid rate, matched solve rate, student format rate, rewards, step seconds). A step where a
type had no proposal (or no attempt) is left out of that type's means, and the count of steps used is shown.

``--check`` also prints the ``cpu-learn`` done-when criteria of issue 13 over the runs given (expected: the
population's seeds, or the baseline's): per type, last > first on the student format rate in every run and on
the valid rate averaged over the runs; some correct student answers.

    .venv/bin/python benchmarks/learning_curves.py runs/cpu-learn-population-s0 runs/cpu-learn-population-s1 --check

``--plot FILE.png`` draws, per task type (columns) and metric (rows), every run's per-step curve.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from evaluation.report import load_scalars  # noqa: E402
from populora_env.config import TASK_TYPES as TYPES  # noqa: E402
from selfplay import tags  # noqa: E402

METRICS = {
    "valid": tags.valid_rate,
    "s_format": tags.student_format_rate,
    "s_correct": tags.student_correct_rate,
}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def first_last(series: list[tuple[int, float]], steps: int, window: int) -> tuple[float, float, int, int]:
    """Means over steps ``1..window`` and ``steps-window+1..steps`` (steps without a value left out)."""
    first = [v for s, v in series if s <= window]
    last = [v for s, v in series if s > steps - window]
    return _mean(first), _mean(last), len(first), len(last)


def run_table(scalars: dict[str, list[tuple[int, float]]], window: int
              ) -> dict[str, dict[str, tuple[float, float, int, int]]]:
    """``{type: {metric: (first, last, n_first, n_last)}}`` of one run's scalars."""
    steps = max((s for series in scalars.values() for s, _ in series), default=0)
    out: dict[str, dict[str, tuple[float, float, int, int]]] = {}
    for task_type in TYPES:
        row = {}
        for name, tag in METRICS.items():
            series = scalars.get(tag(task_type), [])
            if series:
                row[name] = first_last(series, steps, window)
        if row:
            out[task_type] = row
    return out


def _fmt(x: float) -> str:
    return "  -  " if math.isnan(x) else f"{x:.3f}"


def plot(scalars: dict[Path, dict[str, list[tuple[int, float]]]], out: Path) -> None:
    """One panel per (metric, task type): each run's value per step (steps without a value are gaps)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = list(scalars)
    types = [t for t in TYPES if any(scalars[r].get(METRICS["valid"](t)) for r in runs)]
    labels = {"valid": "teachers' valid rate", "s_format": "students' well-formatted rate",
              "s_correct": "students' correct rate"}
    fig = Figure(figsize=(4.2 * len(types), 8.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(METRICS), len(types), squeeze=False, sharex=True, sharey=True)
    for i, (name, tag) in enumerate(METRICS.items()):
        for j, task_type in enumerate(types):
            ax = axes[i][j]
            for run in runs:
                series = scalars[run].get(tag(task_type), [])
                if series:
                    ax.plot([s for s, _ in series], [v for _, v in series], marker="o", label=run.name)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(task_type)
            if j == 0:
                ax.set_ylabel(labels[name])
            if i == len(METRICS) - 1:
                ax.set_xlabel("step")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--plot", type=Path, help="write the per-step curves of every run to this PNG")
    args = ap.parse_args(argv)
    scalars = {run: load_scalars(run) for run in args.runs}
    if args.plot:
        plot(scalars, args.plot)
    tables = {}
    for run in args.runs:
        tables[run] = table = run_table(scalars[run], args.window)
        print(f"\n## {run.name} (first {args.window} steps -> last {args.window} steps; n = steps with a value)")
        print(f"{'type':10} " + " ".join(f"{m:>24}" for m in METRICS))
        for task_type, row in table.items():
            cells = []
            for m in METRICS:
                if m in row:
                    a, b, na, nb = row[m]
                    cells.append(f"{_fmt(a)} -> {_fmt(b)} ({na}/{nb})".rjust(24))
                else:
                    cells.append(" " * 24)
            print(f"{task_type:10} " + " ".join(cells))
        summary = run / "run_summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            hist = data.get("history", [])
            print(f"history ({len(hist)} steps, median step {data.get('median_step_seconds') or math.nan:.1f} s):")
            print(" step  valid  solve  s_fmt  R_teach  R_stud  seconds")
            for h in hist:
                vals = [h.get(k) for k in ("valid_rate", "solve_rate", "student_format_rate", "teacher_reward",
                                            "student_reward", "step_seconds")]
                print(f" {h['step']:4d}  " + "  ".join("  -  " if v is None else f"{v:5.2f}" for v in vals))
    if args.check:
        print("\n## done-when checks")
        ok_all = True
        played = [t for t in TYPES if all(t in tables[r] for r in args.runs)]  # the runs' task types
        for task_type in played:
            fmt = [tables[r][task_type]["s_format"] for r in args.runs if "s_format" in tables[r].get(task_type, {})]
            fmt_ok = len(fmt) == len(args.runs) and all(b > a for a, b, *_ in fmt)
            valid = [tables[r][task_type]["valid"] for r in args.runs if "valid" in tables[r].get(task_type, {})]
            v_first = _mean([a for a, *_ in valid if not math.isnan(a)])
            v_last = _mean([b for _, b, *_ in valid if not math.isnan(b)])
            valid_ok = len(valid) == len(args.runs) and v_last > v_first
            ok_all &= fmt_ok and valid_ok
            print(f"{task_type:10} student format last > first in every run: {fmt_ok}; "
                  f"valid rate averaged over runs {_fmt(v_first)} -> {_fmt(v_last)}: {valid_ok}")
        correct = sum(v for run in args.runs for _, v in scalars[run].get(tags.STUDENT_CORRECT_RATE, []))
        print(f"some correct student answers: {correct > 0}")
        print(f"all criteria met: {ok_all and correct > 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
