"""Tests of ``evaluation.report`` on synthetic runs written with real TensorBoard writers.

Run ``pop-a`` (population, 50 steps) logs almost every tag, with side files; run ``azr-b`` (baseline,
30 steps, written with torch's SummaryWriter in two event files like a resumed run, an old ``config.json``
with ``kind`` instead of ``arm``) logs a subset; run ``evo-c`` (12 steps, 3 teachers and 2 students) has
hand-set ratings, lineage and pair counts whose retention ranks and teacher × student matrices are worked
out by hand below. Every tag is built with ``selfplay.tags`` (the names the training loop writes), so a
renamed tag breaks the loop and the report together, never one silently. Expected numbers are computed here
from the values written, not from the report code.
"""

from __future__ import annotations

import ast
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar.summary import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from evaluation.report import (
    NoEventsError,
    children,
    load_run,
    load_scalars,
    make_report,
    pair_windows,
    smooth,
)
from selfplay import tags

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
            tags.SOLVE_RATE: SOLVE_A[step],
            tags.STUDENT_FORMAT_RATE: 0.5,
            tags.TEACHER_REWARD: 0.5,
            tags.STUDENT_REWARD: 0.1 * (step % 3),
            tags.valid_rate("deduction"): 0.75,
            tags.valid_rate("induction"): 0.5,
            tags.response_length("teacher"): 200 + step,
            tags.response_length("student"): 100 + step,
            tags.entropy("teacher"): 1.0,
            tags.entropy("student"): 1.0 - step / 100,
            tags.STEP_SECONDS: STEP_SECONDS_A[step],
            tags.program("ast_depth"): AST_A[step],
            tags.program("cyclomatic"): 3.0,
            tags.program("loc"): 8.0 + step % 4,
            tags.program("variables"): 4.0,
            tags.program("coverage_programs"): float(step + 74),  # final: 123
            tags.validity("valid"): 6.0,
            tags.validity("syntax_error"): 2.0 if step % 2 else 0.0,
            tags.time("generation"): 1.5,
            tags.time("sandbox"): 0.25,
            tags.time("update"): 0.25,
            tags.REPLACEMENTS: 1.0 if step in (10, 20, 30) else 0.0,
        }
        if step >= 25:
            scalars[tags.validity("timeout")] = 1.0  # a reason that appears late
        for i, m in enumerate(MEMBERS_A):
            mu, sigma = 25.0 + i + step / 10, 8.0 - step / 10
            scalars[tags.member(m, "mu")] = mu
            scalars[tags.member(m, "sigma")] = sigma
            scalars[tags.member(m, "conservative")] = mu - 3 * sigma
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
        )
        writer.add_event(event_pb2.Event(step=step, wall_time=t0 + step, summary=summary))
        # valid rate as a tf.summary-v2-style scalar tensor: the loader must read it as well
        writer.add_event(
            event_pb2.Event(step=step, wall_time=t0 + step, summary=scalar_pb(tags.VALID_RATE, 0.625))
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
    """Baseline: a subset of the tags, in two event files (steps 0-19, then a resume from step 15); its
    config.json predates ``arm`` (``kind``) and the saved mapping."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / "azr-b"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": "azr-b", "kind": "baseline", "model": "tiny"}))
    t0 = time.time()
    for start, stop, solve, offset in ((0, 20, 0.5, 0.0), (15, STEPS_B, 0.25, 1000.0)):
        # the resumed session purges from its checkpoint step on, like agents/logger.py does
        writer = SummaryWriter(log_dir=str(run), filename_suffix=f".part{start}", purge_step=start or None)
        for step in range(start, stop):
            wall = t0 + offset + step
            if step == 18 and start == 0:  # logged only by the crashed session: must be purged
                writer.add_scalar(tags.REPLACEMENTS, 1.0, step, walltime=wall)
                writer.add_scalar(tags.pair("teacher_0", "student_0", "attempts"), 8.0, step, walltime=wall)
            writer.add_scalar(tags.SOLVE_RATE, solve, step, walltime=wall)
            writer.add_scalar(tags.TEACHER_REWARD, -0.5, step, walltime=wall)
            writer.add_scalar(tags.entropy("teacher"), 0.5, step, walltime=wall)  # proposer
            writer.add_scalar(tags.entropy("student"), 0.25, step, walltime=wall)  # solver
            writer.add_scalar(tags.member("azr", "conservative"), float(step), step, walltime=wall)
        writer.close()
    return run


# run C: conservative ratings per step 1..12 (rank 1 = highest; ties share the better rank)
TEACHERS_C = ("teacher_0", "teacher_1", "teacher_2")
STUDENTS_C = ("student_0", "student_1")
RATINGS_C = {
    "teacher_0": [3.0] * 12,
    "teacher_1": [2.0] * 12,
    # steps 1-4: last (culled at 4, rank 3); child 1 (dare): 0, 2.5, 4, 1 at steps 5-8 -> ranks 3, 2, 1, 3;
    # culled again at 8 (rank 3); child 2 (svd_mutation): 5, 5, 5, 1 at steps 9-12 -> ranks 1, 1, 1, 3
    "teacher_2": [1.0] * 4 + [0.0, 2.5, 4.0, 1.0] + [5.0, 5.0, 5.0, 1.0],
    "student_0": [2.0] * 12,
    # culled at 6 (rank 2); child (dare): 3, 1, 2, 2, 2, 2 at steps 7-12 -> ranks 1, 2, 1 (tie), 1, 1, 1
    "student_1": [1.0] * 6 + [3.0, 1.0, 2.0, 2.0, 2.0, 2.0],
}
LINEAGE_C = [
    {"step": 4, "role": "teacher", "culled": "teacher_2", "parents": ["teacher_0"], "operator": "dare"},
    {"step": 6, "role": "student", "culled": "student_1", "parents": ["student_0"], "operator": "dare"},
    {"step": 8, "role": "teacher", "culled": "teacher_2", "parents": ["teacher_1"], "operator": "svd_mutation"},
]


def _pairs_c(step: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(teacher, student) -> (attempts, correct) matched at ``step``."""
    out = {("teacher_0", "student_0"): (4, 1), ("teacher_2", "student_1"): (0, 0)}  # teacher_2: no valid task
    out[("teacher_1", "student_1") if step <= 6 else ("teacher_1", "student_0")] = (4, 3) if step <= 6 else (2, 2)
    return out


def _write_run_c(root: Path) -> Path:
    run = root / "evo-c"
    run.mkdir()
    agents = TEACHERS_C + STUDENTS_C
    mapping = {
        "agent_to_member": {a: a for a in agents},
        "agent_roles": {a: ("teacher" if a.startswith("teacher") else "student") for a in agents},
    }
    (run / "config.json").write_text(json.dumps({"name": "evo-c", "arm": "population", "mapping": mapping}))
    (run / "lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LINEAGE_C))
    writer = EventFileWriter(str(run))
    t0 = time.time()
    for step in range(1, 13):
        scalars = {tags.member(m, "conservative"): RATINGS_C[m][step - 1] for m in agents}
        for (t, s), (n, c) in _pairs_c(step).items():
            scalars[tags.pair(t, s, "attempts")] = float(n)
            scalars[tags.pair(t, s, "correct")] = float(c)
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
        )
        writer.add_event(event_pb2.Event(step=step, wall_time=t0 + step, summary=summary))
    writer.close()
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    root = tmp_path_factory.mktemp("runs")
    run_a, run_b, run_c = _write_run_a(root), _write_run_b(root), _write_run_c(root)
    out = make_report([run_a, run_b, run_c])
    return run_a, run_b, out, (out / "summary.md").read_text()


def _figure(out: Path, key: str) -> dict:
    figures = json.loads((out / "figures.json").read_text())["figures"]
    found = [f for f in figures if f["key"] == key]
    assert len(found) == 1, [f["key"] for f in figures]
    return found[0]


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
    assert [s for s, _ in a[tags.SOLVE_RATE]] == list(range(STEPS_A))
    assert [v for _, v in a[tags.SOLVE_RATE]] == SOLVE_A
    assert a[tags.VALID_RATE] == [(s, 0.625) for s in range(STEPS_A)]  # tensor-style scalar
    b = load_scalars(run_b)
    solve = dict(b[tags.SOLVE_RATE])
    assert sorted(solve) == list(range(STEPS_B))  # one value per step despite the overlap
    assert all(solve[s] == 0.5 for s in range(15)) and all(solve[s] == 0.25 for s in range(15, STEPS_B))
    assert tags.REPLACEMENTS not in b  # purged by the resumed writer's purge_step
    assert tags.pair("teacher_0", "student_0", "attempts") not in b  # pair counts purged alike
    assert load_run(run_b).arm == "baseline"  # old config.json: "kind"


def test_figures_written_and_readable(report: tuple[Path, Path, Path, str]) -> None:
    run_a, _, out, summary = report
    assert out == run_a / "report"
    expected = [
        "solve_rate",
        "teacher_reward",
        "student_reward",
        "pairs",
        "ratings",
        "retention",
        "valid_rate",
        "validity",
        "complexity",
        "coverage",
        "roles",
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
    keys = [f["key"] for f in json.loads((out / "figures.json").read_text())["figures"]]
    assert sorted(keys) == sorted(expected)


def test_solve_rate_figure_is_the_matched_one(report: tuple[Path, Path, Path, str]) -> None:
    _, _, out, summary = report
    fig = _figure(out, "solve_rate")
    matched = fig["panels"][0]
    assert matched["title"].startswith("matched tasks")
    assert {(c["run"], c["tag"], c["points"]) for c in matched["curves"]} == {
        ("pop-a", tags.SOLVE_RATE, STEPS_A),
        ("azr-b", tags.SOLVE_RATE, STEPS_B),
    }
    assert [p["title"] for p in fig["panels"]] == ["matched tasks (fillers excluded)", "well-formatted attempts"]
    section = summary.split("### Student solve rate", 1)[1].split("###", 1)[0]
    assert "matched teachers' tasks" in section and "filler attempts" in section and tags.SOLVE_RATE in section


def test_baseline_roles_are_separate_curves(report: tuple[Path, Path, Path, str]) -> None:
    _, _, out, summary = report
    fig = _figure(out, "roles")
    b_entropy = [p for p in fig["panels"] if p["title"] == "azr-b: entropy (mean per token)"]
    assert len(b_entropy) == 1
    curves = {c["label"]: (c["tag"], c["points"]) for c in b_entropy[0]["curves"]}
    assert curves == {
        "teacher (proposer)": (tags.entropy("teacher"), STEPS_B),
        "student (solver)": (tags.entropy("student"), STEPS_B),
    }
    a_entropy = next(p for p in fig["panels"] if p["title"] == "pop-a: entropy (mean per token)")
    assert sorted(c["label"] for c in a_entropy["curves"]) == ["student", "teacher"]
    assert _row(summary, "entropy teacher")[:2] == ["1 → 1", "0.5 → 0.5"]
    assert _row(summary, "entropy student")[1] == "0.25 → 0.25"


def test_teacher_student_matrix_per_window(report: tuple[Path, Path, Path, str]) -> None:
    run_a, _, out, summary = report
    run_c = run_a.parent / "evo-c"
    windows = pair_windows(load_run(run_c))
    assert [(w.first, w.last) for w in windows] == [(1, 4), (5, 8), (9, 12)]
    w1, w2, w3 = windows
    assert w1.teachers == list(TEACHERS_C) and w1.students == list(STUDENTS_C)
    # rows teachers, columns students; summed over the window's 4 steps
    assert w1.attempts.tolist() == [[16, 0], [0, 16], [0, 0]] and w1.correct.tolist() == [[4, 0], [0, 12], [0, 0]]
    assert w2.attempts.tolist() == [[16, 0], [4, 8], [0, 0]] and w2.correct.tolist() == [[4, 0], [4, 6], [0, 0]]
    assert w3.attempts.tolist() == [[16, 0], [8, 0], [0, 0]] and w3.correct.tolist() == [[4, 0], [8, 0], [0, 0]]
    assert w2.rate[1, 1] == 0.75 and math.isnan(w2.rate[2, 1])  # matched, but no valid task: no rate
    assert w2.matched.tolist() == [[4, 0], [2, 2], [0, 4]]  # steps matched: teacher_1 changed student at 7
    fig = _figure(out, "pairs")
    assert [(p["run"], p["first"], p["last"]) for p in fig["panels"]] == [
        ("evo-c", 1, 4), ("evo-c", 5, 8), ("evo-c", 9, 12)
    ]
    assert fig["panels"][1]["attempts"] == [[16, 0], [4, 8], [0, 0]]
    section = summary.split("## Teacher × student solve rate", 1)[1].split("\n## ", 1)[0]
    assert "**evo-c, steps 5–8**" in section
    assert "| teacher_1 | 1 (4/4) | 0.75 (6/8) |" in section
    assert "| teacher_2 | – | 0/0 |" in section  # matched with student_1, never a valid task
    assert "no `" + tags.pair("<teacher>", "<student>", "attempts") + "` logged by pop-a, azr-b" in summary


def test_evolution_retention_ranks(report: tuple[Path, Path, Path, str]) -> None:
    run_a, _, out, summary = report
    kids = children(load_run(run_a.parent / "evo-c"))
    got = [(c.step, c.role, c.slot, c.operator, c.n_members, c.culled_rank, c.ranks) for c in kids]
    assert got == [
        (4, "teacher", "teacher_2", "dare", 3, 3, {1: 3, 2: 2, 3: 1, 4: 3}),  # ends when re-culled at 8
        (6, "student", "student_1", "dare", 2, 2, {1: 1, 2: 2, 3: 1, 4: 1, 5: 1, 6: 1}),
        (8, "teacher", "teacher_2", "svd_mutation", 3, 3, {1: 1, 2: 1, 3: 1, 4: 3}),
    ]
    header = _row(summary, "run")
    assert header == ["role", "operator", "children", "members", "replaced member's rank at culling",
                      "rank at +1", "rank at +2", "rank at +5", "rank at +10", "rank at +20"]
    rows = [line for line in summary.splitlines() if line.startswith(("| evo-c |", "| pop-a |"))]
    # pop-a: conservative = 1 + i + 0.4 step (i = index in MEMBERS_A), so teacher_1 > teacher_0 and
    # student_1 > student_0 at every step; steps 0-49, so the child born at 30 has no +20
    top, second = "1 (0/1 better)", "2 (0/1 better)"
    assert rows == [
        f"| pop-a | teacher | dare | 1 | 2 | 1 | {top} | {top} | {top} | {top} | {top} |",
        f"| pop-a | student | dare | 1 | 2 | 1 | {top} | {top} | {top} | {top} | {top} |",
        f"| pop-a | teacher | svd_mutation | 1 | 2 | 2 | {second} | {second} | {second} | {second} | n/a |",
        "| evo-c | teacher | dare | 1 | 3 | 3 | 3 (0/1 better) | 2 (1/1 better) | n/a | n/a | n/a |",
        "| evo-c | student | dare | 1 | 2 | 2 | 1 (1/1 better) | 2 (0/1 better) | 1 (1/1 better) | n/a | n/a |",
        "| evo-c | teacher | svd_mutation | 1 | 3 | 3 | 1 (1/1 better) | 1 (1/1 better) | n/a | n/a | n/a |",
    ]
    fig = _figure(out, "retention")
    by_run = {p["run"]: p["curves"] for p in fig["panels"]}
    assert sorted(by_run) == ["evo-c", "pop-a"]  # pop-a has lineage too
    assert [(c["operator"], c["step"], c["culled_rank"], c["points"]) for c in by_run["evo-c"]] == [
        ("dare", 4, 3, 4), ("dare", 6, 2, 6), ("svd_mutation", 8, 3, 4)
    ]


def test_report_spells_no_tag() -> None:
    """Every tag the report reads comes from selfplay.tags: no string literal in its sources starts with a
    tag family (``charts/``, ``population/``...)."""
    import evaluation.report as pkg

    samples = [
        tags.SOLVE_RATE, tags.member("m", "k"), tags.loss("x"), tags.program("x"), tags.validity("x"),
        tags.time("x"), tags.REPLACEMENTS, tags.pair("t", "s", "attempts"), tags.entropy("teacher"),
        tags.tamper("m"),
    ]
    families = {t.split("/", 1)[0] + "/" for t in samples}
    assert len(families) == 9
    offenders = []
    for source in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(node.value.lstrip("`").startswith(f) for f in families):
                    offenders.append(f"{source.name}:{node.lineno}: {node.value!r}")
    assert not offenders, offenders


def test_summary_headline_numbers(report: tuple[Path, Path, Path, str]) -> None:
    _, _, _, summary = report
    header = _row(summary, "metric")
    assert header == ["pop-a", "azr-b", "evo-c"]
    assert _row(summary, "arm") == ["population", "baseline", "population"]
    assert _row(summary, "last step") == [str(STEPS_A - 1), str(STEPS_B - 1), "12"]
    assert _row(summary, "student solve rate on matched tasks")[:2] == ["0.875 / 0.75", "0.25 / 0.25"]
    assert _row(summary, "filler solve rate") == ["n/a", "n/a", "n/a"]
    assert _row(summary, "student format rate")[:2] == ["0.5 / 0.5", "n/a"]
    assert _row(summary, "teacher reward")[:2] == ["0.5 / 0.5", "-0.5 / -0.5"]
    assert _row(summary, "valid rate")[:2] == ["0.625 / 0.625", "n/a"]
    assert _row(summary, "AST depth")[:2] == ["2 → 6", "n/a"]
    assert _row(summary, "coverage: programs")[:2] == ["123", "n/a"]
    assert _row(summary, "coverage: signatures")[:2] == ["n/a", "n/a"]
    # student entropy 1 - step/100: first 5 mean 0.98, last 5 mean 0.53
    assert _row(summary, "entropy student")[:2] == ["0.98 → 0.53", "0.25 → 0.25"]
    assert _row(summary, "wall time per step, median")[:2] == ["2", "n/a"]
    assert _row(summary, "wall time, total")[:2] == ["6m34s", "n/a"]
    assert _row(summary, "evolution events") == ["3 (dare 2, svd_mutation 1)", "0", "3 (dare 2, svd_mutation 1)"]
    assert _row(summary, "members with ratings") == ["4", "1", "5"]
    # baseline's conservative rating = step -> final 29
    assert _row(summary, "best final μ − 3σ")[1] == "29 (azr)"
    # rejections: syntax_error 2 on 25 odd steps = 50, timeout 1 on 25 steps = 25; valid 300; total 375
    assert _row(summary, "top rejection reasons")[0] == "syntax_error 13.3%, timeout 6.7%"


def test_summary_tables_and_notes(report: tuple[Path, Path, Path, str]) -> None:
    _, _, _, summary = report
    assert _row(summary, "dare") == ["2", "0", "2"]
    assert _row(summary, "svd_mutation") == ["1", "0", "1"]
    assert _row(summary, "**total**") == ["3", "0", "3"]
    # eval: humaneval_plus given in full; gsm8k's mean and spread come from the members; aime24 is bare
    assert _row(summary, "humaneval_plus") == ["0.5 [0.25 – 0.75]", "0.375", "0.4375"]
    assert _row(summary, "gsm8k") == ["0.375 [0.25 – 0.5]", "0.125", "n/a"]
    assert _row(summary, "aime24") == ["0.125", "n/a", "n/a"]
    # aggregate over the 3 benchmarks; member aggregates only over benchmarks listing members -> none
    assert _row(summary, "**mean over 3 common")[0] == "0.3333"
    notes = summary.split("## Notes", 1)[1]
    assert re.search(rf"\*\*Policy update.*\*\* skipped: no run logs `{tags.loss('policy_loss')}`", notes)
    assert re.search(
        rf"Program complexity.*: azr-b does not log `{tags.program('ast_depth')}`, `{tags.program('cyclomatic')}`",
        notes,
    )
    assert "pop-a does not log" not in notes
    assert re.search(
        rf"Problem-space coverage.*: no run logs `{tags.program('coverage_signatures')}` \(panel left empty\)",
        notes,
    )
    assert "1 malformed line(s) in lineage.jsonl" in notes
    assert f"no `{tags.validity('<reason>')}` logged by azr-b, evo-c" in notes


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
    """A run with one logged step and no side files still reports; smoothing 0 and PDF output."""
    run = tmp_path / "just-started"
    run.mkdir()
    writer = EventFileWriter(str(run))
    writer.add_event(event_pb2.Event(step=0, wall_time=time.time(), summary=_simple(tags.SOLVE_RATE, 0.5)))
    writer.add_event(event_pb2.Event(step=0, wall_time=time.time(), summary=_simple(tags.validity("valid"), 3.0)))
    writer.close()
    out = make_report([run], out=tmp_path / "rep", smoothing=0.0, formats=("png", "pdf"))
    summary = (out / "summary.md").read_text()
    assert _row(summary, "student solve rate on matched tasks") == ["0.5 / 0.5"]
    assert _row(summary, "valid rate") == ["1 / 1"]  # from the validity counts
    assert (out / "solve_rate.png").is_file() and (out / "solve_rate.pdf").is_file()
    assert (out / "validity.png").is_file()
    assert "**Ratings** skipped" in summary and "no config.json" in summary
    assert "**Teacher × student matrix** skipped" in summary and "**Evolution retention** skipped" in summary
    assert _row(summary, "arm") == ["?"]
    with pytest.raises(ValueError, match="smoothing"):
        make_report([run], smoothing=1.0)


def test_smooth_is_debiased_ema() -> None:
    assert smooth([1.0, 1.0, 1.0], 0.6).tolist() == pytest.approx([1.0, 1.0, 1.0])
    got = smooth([0.0, 1.0, float("nan"), 1.0], 0.5)
    assert got[0] == 0.0 and got[1] == pytest.approx(0.5 / 0.75) and np.isnan(got[2])
    assert got[3] == pytest.approx(0.75 / 0.875)
    assert smooth([3.0, 5.0], 0.0).tolist() == [3.0, 5.0]


def test_no_figure_loses_text(report: tuple[Path, Path, Path, str]) -> None:
    """Every text of every figure lies inside the PNG (the retention title used to be cut at both edges)."""
    _, _, out, _ = report
    figures = json.loads((out / "figures.json").read_text())["figures"]
    assert len(figures) >= 10
    for fig in figures:
        assert fig["text_outside"] == [], (fig["key"], fig["text_outside"])


def test_long_titles_are_wrapped_to_the_figure() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from evaluation.report.plots import fit_titles, texts_outside

    fig = Figure(figsize=(4, 3), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    title = "Evolution retention: rank of each child within its role after birth (k = 0: the member it replaced)"
    fig.suptitle(title)
    ax.set_title("a panel title that is also far too long for a figure four inches wide, by a lot")
    assert texts_outside(fig)  # cut before fitting: the check can fail
    assert fit_titles(fig) is True  # wrapped
    assert texts_outside(fig, drawn=True) == []  # fit_titles leaves it drawn: measured as it stands ...
    assert texts_outside(fig) == []  # ... as after a fresh draw
    assert fig.get_suptitle().replace("\n", " ") == title  # wrapped, not shortened
    assert fit_titles(fig) is False  # fits now: nothing to wrap
    ax.set_ylabel("a y label" * 40)
    assert texts_outside(fig) and texts_outside(fig, drawn=True)  # measured after a change: drawn again


def _counting_draws(fig) -> list[int]:
    """Count the figure's full draws (each laying it out; a PNG's save renders one)."""
    calls = [0]
    draw = fig.draw

    def counted(renderer):
        calls[0] += 1
        return draw(renderer)

    fig.draw = counted
    return calls


@pytest.mark.parametrize("long_title", [False, True])
def test_a_figure_is_laid_out_once_unless_a_title_is_wrapped(tmp_path: Path, long_title: bool) -> None:
    """``Plotter.save`` lays a figure out once (without pixels), measures it as laid out and renders the PNG
    from that layout: two draws in all for a figure whose titles fit, where a save alone lays out a figure
    with a layout engine twice and renders once. A wrapped title costs one layout per try, and the PNG holds the
    wrapped title with no text outside."""
    from evaluation.report.plots import Plotter, texts_outside

    plot = Plotter([], tmp_path, smoothing=0.0, formats=["svg"], dpi=110)
    fig, (ax,) = plot.figure(1, 1, (4, 3))
    ax.plot([0, 1], [0, 1])
    title = "a title far too long for a figure four inches wide " * 2 if long_title else "short"
    fig.suptitle(title)
    draws = _counting_draws(fig)
    plot.save(fig, "one", title, [])
    assert (tmp_path / "one.png").exists() and (tmp_path / "one.svg").exists()
    assert imread(tmp_path / "one.png").shape[:2] == (330, 440)  # 4 x 3 inches at 110 dpi
    assert plot.manifest[-1]["text_outside"] == []
    if long_title:
        assert draws[0] >= 4 and "\n" in fig.get_suptitle()  # layout, wrap(s), then one render per format
        assert fig.get_suptitle().replace("\n", " ") == title.strip()
    else:
        assert draws[0] == 3 and fig.get_suptitle() == title  # one layout, then one render per format
    assert texts_outside(fig) == []  # a fresh draw agrees


def test_the_report_reads_config_changes_without_importing_torch(tmp_path: Path) -> None:
    """``populora report`` on its own: the runs' recorded configuration changes are read by a standard-library
    module, so making a report imports neither torch nor transformers (half of the command's time when it did),
    and the changes still reach the summary."""
    import subprocess
    import sys

    run = _write_run_c(tmp_path)
    (run / "config_history.jsonl").write_text(
        json.dumps({"step": 4, "field": "trainer.lr", "old": 0.001, "new": 0.002, "time": 0.0}) + "\nnot json\n")
    code = ("import sys; from evaluation.report import make_report; out = make_report([sys.argv[1]]); "
            "print(out); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(run)], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, check=True)
    out, imported = done.stdout.strip().splitlines()[-2:]
    assert imported == "[]"
    summary = (Path(out) / "summary.md").read_text()
    assert "## Configuration changes" in summary and "| 4 | `trainer.lr` | `0.001` | `0.002` |" in summary


def test_a_final_value_from_an_earlier_step_says_so(tmp_path: Path) -> None:
    """The solve rate is logged only at steps with a valid matched task: when the last steps had none, the
    headline's "final" is the last logged value, and the row names its step instead of passing it off as the
    last step's."""
    from evaluation.report.loading import RunData
    from evaluation.report.summary import headline

    scalars = {tags.SOLVE_RATE: [(1, 0.5), (2, 0.25)], tags.VALID_RATE: [(1, 0.5), (2, 0.5), (3, 0.0), (4, 0.0)]}
    rows = headline(RunData(tmp_path, "r", {"arm": "population"}, scalars, [], None))
    solve = next(v for k, v in rows.items() if k.startswith("student solve rate on matched tasks"))
    valid = next(v for k, v in rows.items() if k.startswith("valid rate"))
    assert solve == "0.25 / 0.375 (final from step 2: none logged after it)"
    assert valid == "0 / 0.25"  # logged at the last step: no note


def test_a_wrapped_figure_title_stays_above_the_panels(tmp_path: Path) -> None:
    """A figure title too long for the figure is wrapped onto two lines and the panels are laid out below both
    (roles.png's title once overlapped its first panel: measuring it set it again at its default place)."""
    from evaluation.report.plots import Plotter

    plotter = Plotter([], tmp_path, 0.6, [], 100)
    with plotter.mpl.rc_context(plotter.rc):
        fig, axes = plotter.figure(3, 1, (5.0, 8.9))
        for ax in axes:
            ax.plot([1, 2], [0.0, 1.0])
        axes[0].set_title("tiny (population): entropy (mean per token)", fontsize=9)
        fig.suptitle("Per role: teacher vs student (one member playing both: proposer vs solver)  (EMA 0.6)")
        plotter.save(fig, "long_title", "long title", [])
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle
    assert "\n" in title.get_text()  # wrapped
    assert title.get_window_extent(renderer).y0 >= axes[0].get_tightbbox(renderer).y1  # and above the panel
    assert plotter.manifest[-1]["text_outside"] == []
