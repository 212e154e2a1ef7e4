"""Tests of agents/report.py on synthetic runs written with real TensorBoard writers.

Run ``pop-a`` (population, 50 steps) logs almost every tag, with side files; run ``azr-b`` (baseline,
30 steps, written with torch's SummaryWriter in two event files like a resumed run) logs a subset.
Expected headline numbers are computed here from the values written, not from the report code.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar.summary import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from evaluation.report import NoEventsError, ReportConfig, load_scalars, make_report, run_report, smooth

STEPS_A = 50
STEPS_B = 30
MEMBERS_A = ("teacher_0", "teacher_1", "student_0", "student_1")

# run A: solve rate 0.25 for 40 steps, then five 0.625 and five 0.875 -> final 0.875, last-10 mean 0.75
SOLVE_A = [0.25] * 40 + [0.625] * 5 + [0.875] * 5
# AST depth: 2 for the first 5 points (10%), 4 in between, 6 for the last 5 -> "2 → 6"
AST_A = [2.0] * 5 + [4.0] * 40 + [6.0] * 5
STEP_SECONDS_A = [2.0] * 47 + [100.0] * 3  # median 2, total 394 s


def _simple(tag: str, value: float) -> summary_pb2.Summary:
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def _write_run_a(root: Path) -> Path:
    run = root / "pop-a-dir"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": "pop-a", "arm": "population", "model": "tiny"}))
    writer = EventFileWriter(str(run))
    t0 = time.time()
    for step in range(STEPS_A):
        scalars = {
            "charts/student_solve_rate": SOLVE_A[step],
            "charts/teacher_reward": 0.5,
            "charts/student_reward": 0.1 * (step % 3),
            "charts/valid_rate/deduction": 0.75,
            "charts/valid_rate/induction": 0.5,
            "charts/response_length/teacher": 200 + step,
            "charts/response_length/student": 100 + step,
            "charts/entropy/teacher": 1.0,
            "charts/entropy/student": 1.0 - step / 100,
            "charts/step_seconds": STEP_SECONDS_A[step],
            "programs/ast_depth": AST_A[step],
            "programs/cyclomatic": 3.0,
            "programs/loc": 8.0 + step % 4,
            "programs/variables": 4.0,
            "programs/coverage_programs": float(step + 74),  # final: 123
            "validity/valid": 6.0,
            "validity/syntax_error": 2.0 if step % 2 else 0.0,
            "time/generation": 1.5,
            "time/sandbox": 0.25,
            "time/update": 0.25,
            "evolution/replacements": 1.0 if step in (10, 20, 30) else 0.0,
        }
        if step >= 25:
            scalars["validity/timeout"] = 1.0  # a reason that appears late
        for i, m in enumerate(MEMBERS_A):
            mu, sigma = 25.0 + i + step / 10, 8.0 - step / 10
            scalars[f"population/{m}/mu"] = mu
            scalars[f"population/{m}/sigma"] = sigma
            scalars[f"population/{m}/conservative"] = mu - 3 * sigma
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
        )
        writer.add_event(event_pb2.Event(step=step, wall_time=t0 + step, summary=summary))
        # valid rate as a tf.summary-v2-style scalar tensor: the loader must read it as well
        writer.add_event(
            event_pb2.Event(step=step, wall_time=t0 + step, summary=scalar_pb("charts/valid_rate", 0.625))
        )
    writer.close()
    lineage = [
        {"step": 10, "role": "teacher", "culled": "teacher_1", "parents": ["teacher_0"], "operator": "dare"},
        {
            "step": 20,
            "role": "student",
            "culled": "student_1",
            "parents": ["student_0", "student_1"],
            "operator": "dare",
        },
        {
            "step": 30,
            "role": "teacher",
            "culled": "teacher_0",
            "parents": ["teacher_1"],
            "operator": "svd_mutation",
        },
    ]
    text = "".join(json.dumps(r) + "\n" for r in lineage) + '{"step": 40, "role": "stu'  # torn last line
    (run / "lineage.jsonl").write_text(text)
    (run / "eval").mkdir()
    (run / "eval" / "results.json").write_text(
        json.dumps(
            {
                "benchmarks": {
                    "humaneval_plus": {
                        "members": {"teacher_0": 0.5, "teacher_1": 0.25, "student_0": 0.75, "student_1": 0.5},
                        "population_mean": 0.5,
                        "best": 0.75,
                        "weakest": 0.25,
                        "base": 0.375,
                        "baseline": 0.4375,
                    },
                    "gsm8k": {
                        "members": {"teacher_0": 0.25, "teacher_1": 0.5, "student_0": 0.5, "student_1": 0.25},
                        "base": 0.125,
                    },
                    "aime24": {"population_mean": 0.125},  # most keys missing
                }
            }
        )
    )
    return run


def _write_run_b(root: Path) -> Path:
    """Baseline: a subset of the tags, in two event files (steps 0-19, then a resume from step 15)."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / "azr-b"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": "azr-b", "arm": "baseline", "model": "tiny"}))
    t0 = time.time()
    for start, stop, solve, offset in ((0, 20, 0.5, 0.0), (15, STEPS_B, 0.25, 1000.0)):
        # the resumed session purges from its checkpoint step on, like agents/logger.py does
        writer = SummaryWriter(log_dir=str(run), filename_suffix=f".part{start}", purge_step=start or None)
        for step in range(start, stop):
            wall = t0 + offset + step
            if step == 18 and start == 0:  # logged only by the crashed session: must be purged
                writer.add_scalar("evolution/replacements", 1.0, step, walltime=wall)
            writer.add_scalar("charts/student_solve_rate", solve, step, walltime=wall)
            writer.add_scalar("charts/teacher_reward", -0.5, step, walltime=wall)
            writer.add_scalar("charts/entropy/teacher", 0.5, step, walltime=wall)
            writer.add_scalar("charts/entropy/student", 0.5, step, walltime=wall)
            writer.add_scalar("population/azr/conservative", float(step), step, walltime=wall)
        writer.close()
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    root = tmp_path_factory.mktemp("runs")
    run_a, run_b = _write_run_a(root), _write_run_b(root)
    out = make_report([run_a, run_b])
    return run_a, run_b, out, (out / "summary.md").read_text()


def _row(summary: str, label_start: str) -> list[str]:
    """Cells (after the metric name) of the first summary table row whose metric starts with label_start."""
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(label_start):
            return cells[1:]
    raise AssertionError(f"no row starting with {label_start!r} in summary.md")


def test_load_scalars_reads_both_writers_and_resolves_resume(report: tuple[Path, Path, Path, str]) -> None:
    run_a, run_b, _, _ = report
    a = load_scalars(run_a)
    assert [s for s, _ in a["charts/student_solve_rate"]] == list(range(STEPS_A))
    assert [v for _, v in a["charts/student_solve_rate"]] == SOLVE_A
    assert a["charts/valid_rate"] == [(s, 0.625) for s in range(STEPS_A)]  # tensor-style scalar
    b = load_scalars(run_b)
    solve = dict(b["charts/student_solve_rate"])
    assert sorted(solve) == list(range(STEPS_B))  # one value per step despite the overlap
    assert all(solve[s] == 0.5 for s in range(15)) and all(solve[s] == 0.25 for s in range(15, STEPS_B))
    assert "evolution/replacements" not in b  # purged by the resumed writer's purge_step


def test_figures_written_and_readable(report: tuple[Path, Path, Path, str]) -> None:
    run_a, _, out, summary = report
    assert out == run_a / "report"
    expected = [
        "solve_rate",
        "teacher_reward",
        "student_reward",
        "ratings",
        "valid_rate",
        "validity",
        "complexity",
        "coverage",
        "response_length",
        "entropy",
        "time",
        "eval",
    ]
    for key in expected:
        path = out / f"{key}.png"
        assert path.is_file(), key
        img = imread(path)
        assert img.ndim == 3 and img.shape[0] >= 300 and img.shape[1] >= 500, (key, img.shape)
        assert float(np.std(img[..., :3])) > 0.01, f"{key}.png is blank"
        assert f"({key}.png)" in summary
    assert not (out / "losses.png").exists()  # no run logs losses/*


def test_summary_headline_numbers(report: tuple[Path, Path, Path, str]) -> None:
    _, _, _, summary = report
    header = _row(summary, "metric")
    assert header == ["pop-a", "azr-b"]
    assert _row(summary, "kind") == ["population", "baseline"]
    assert _row(summary, "last step") == [str(STEPS_A - 1), str(STEPS_B - 1)]
    assert _row(summary, "student solve rate") == ["0.875 / 0.75", "0.25 / 0.25"]
    assert _row(summary, "teacher reward") == ["0.5 / 0.5", "-0.5 / -0.5"]
    assert _row(summary, "valid rate") == ["0.625 / 0.625", "n/a"]
    assert _row(summary, "AST depth") == ["2 → 6", "n/a"]
    assert _row(summary, "coverage: programs") == ["123", "n/a"]
    assert _row(summary, "coverage: signatures") == ["n/a", "n/a"]
    # student entropy 1 - step/100: first 5 mean 0.98, last 5 mean 0.53
    assert _row(summary, "entropy student") == ["0.98 → 0.53", "0.5 → 0.5"]
    assert _row(summary, "wall time per step, median") == ["2", "n/a"]
    assert _row(summary, "wall time, total") == ["6m34s", "n/a"]
    assert _row(summary, "evolution events") == ["3 (dare 2, svd_mutation 1)", "0"]
    assert _row(summary, "members with ratings") == ["4", "1"]
    # baseline's conservative rating = step -> final 29
    assert _row(summary, "best final μ − 3σ")[1] == "29 (azr)"
    # rejections: syntax_error 2 on 25 odd steps = 50, timeout 1 on 25 steps = 25; valid 300; total 375
    assert _row(summary, "top rejection reasons")[0] == "syntax_error 13.3%, timeout 6.7%"


def test_summary_tables_and_notes(report: tuple[Path, Path, Path, str]) -> None:
    _, _, _, summary = report
    assert _row(summary, "dare") == ["2", "0"]
    assert _row(summary, "svd_mutation") == ["1", "0"]
    assert _row(summary, "**total**") == ["3", "0"]
    # eval: humaneval_plus given in full; gsm8k's mean and spread come from the members; aime24 is bare
    assert _row(summary, "humaneval_plus") == ["0.5 [0.25 – 0.75]", "0.375", "0.4375"]
    assert _row(summary, "gsm8k") == ["0.375 [0.25 – 0.5]", "0.125", "n/a"]
    assert _row(summary, "aime24") == ["0.125", "n/a", "n/a"]
    # aggregate over the 3 benchmarks; member aggregates only over benchmarks listing members -> none
    assert _row(summary, "**mean over 3 common")[0] == "0.3333"
    notes = summary.split("## Notes", 1)[1]
    assert re.search(r"\*\*Policy update.*\*\* skipped: no run logs `losses/policy_loss`", notes)
    assert re.search(
        r"Program complexity.*: azr-b does not log `programs/ast_depth`, `programs/cyclomatic`", notes
    )
    assert "pop-a does not log" not in notes
    assert re.search(
        r"Problem-space coverage.*: no run logs `programs/coverage_signatures` \(panel left empty\)", notes
    )
    assert "1 malformed line(s) in lineage.jsonl" in notes
    assert "no `validity/<reason>` logged by azr-b" in notes


def test_run_without_events_is_a_clear_error(tmp_path: Path, report: tuple[Path, Path, Path, str]) -> None:
    run_a = report[0]
    empty = tmp_path / "early-run"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(NoEventsError, match=r"no TensorBoard event files .*early-run"):
        make_report([run_a, empty], out=tmp_path / "out")
    nested = tmp_path / "nested-run"
    (nested / "tb").mkdir(parents=True)
    (nested / "tb" / "events.out.tfevents.1.host").write_bytes(b"")
    with pytest.raises(NoEventsError, match=r"nested-run.*subdirectories"):
        load_scalars(nested)
    with pytest.raises(NoEventsError, match="does not exist"):
        load_scalars(tmp_path / "missing")


def test_early_run_with_few_points_and_config(tmp_path: Path) -> None:
    """A run with one logged step and no side files still reports; smoothing 0 and PDF output via the config."""
    run = tmp_path / "just-started"
    run.mkdir()
    writer = EventFileWriter(str(run))
    writer.add_event(
        event_pb2.Event(step=0, wall_time=time.time(), summary=_simple("charts/student_solve_rate", 0.5))
    )
    writer.add_event(event_pb2.Event(step=0, wall_time=time.time(), summary=_simple("validity/valid", 3.0)))
    writer.close()
    out = run_report(ReportConfig(runs=[run], out=tmp_path / "rep", smoothing=0.0, formats=("png", "pdf")))
    summary = (out / "summary.md").read_text()
    assert _row(summary, "student solve rate") == ["0.5 / 0.5"]
    assert _row(summary, "valid rate") == ["1 / 1"]  # from the validity counts
    assert (out / "solve_rate.png").is_file() and (out / "solve_rate.pdf").is_file()
    assert (out / "validity.png").is_file()
    assert "**Ratings** skipped" in summary and "no config.json" in summary
    with pytest.raises(ValueError, match="smoothing"):
        make_report([run], smoothing=1.0)


def test_smooth_is_debiased_ema() -> None:
    assert smooth([1.0, 1.0, 1.0], 0.6).tolist() == pytest.approx([1.0, 1.0, 1.0])
    got = smooth([0.0, 1.0, float("nan"), 1.0], 0.5)
    assert got[0] == 0.0 and got[1] == pytest.approx(0.5 / 0.75) and np.isnan(got[2])
    assert got[3] == pytest.approx(0.75 / 0.875)
    assert smooth([3.0, 5.0], 0.0).tolist() == [3.0, 5.0]
