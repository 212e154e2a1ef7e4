"""``populora report``: load the runs, draw the figures, write ``summary.md`` and ``figures.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from evaluation.report import numerics as nx
from evaluation.report import tamper
from evaluation.report.loading import RunData, load_run
from evaluation.report.plots import Plotter
from evaluation.report.summary import summary_markdown, unique_names
from selfplay import tags
from selfplay.rundir import REPORT, RunDir, write_text_atomic

Figure = tuple[str, str | None, str]
"""A figure of the report: its title, the image's file stem (``None`` when nothing was drawn), its caption."""


def make_report(
    runs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    smoothing: float = 0.6,
    *,
    formats: Sequence[str] = ("png",),
    dpi: int = 110,
) -> Path:
    """Write the figures, ``summary.md`` and ``figures.json`` comparing ``runs``; return the output directory.

    Every file is written atomically through a fresh temporary file and a rename, so a link planted at a file's
    name is replaced, never written through; the default output directory must be a real directory inside the run
    (a link there is refused: the report never writes outside the run directory it was not told to).

    Args:
        runs: run directories (``runs/<name>``), at least one.
        out: output directory, created if needed; default ``<first run>/report``.
        smoothing: EMA weight for the smoothed curves, in [0, 1).
        formats: image formats; PNG is always written.
        dpi: image resolution.

    Raises:
        ValueError: no runs, or a smoothing weight outside [0, 1).
        NoEventsError: a run directory is missing or holds no event files (the message names it).
        UnsafeRunFile: a file of a run this project never writes (JSON nested too deep, a link out of the run),
            or a default ``report/`` that is a link.
    """
    if not runs:
        raise ValueError("make_report needs at least one run directory")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    paths = [Path(r) for r in runs]
    data = [load_run(p) for p in paths]
    unique_names(data)
    if out is not None:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        out_dir = RunDir(paths[0]).subdir(REPORT)

    notes: list[str] = [n for r in data for n in r.notes]
    for r in data:
        if not r.scalars:
            notes.append(f"{r.name}: the event files hold no scalars yet (an early or partial run).")
    plot = Plotter(data, out_dir, smoothing, formats, dpi)
    entries = {r.name: nx.eval_entries(r) for r in data}
    kids = {r.name: nx.children(r) for r in data}
    windows = {r.name: nx.pair_windows(r) for r in data}

    figures = _game_figures(plot, data, kids, windows, notes) + _update_figures(plot, data, entries, notes)
    summary = summary_markdown(data, smoothing, entries, kids, windows, figures, notes)
    write_text_atomic(out_dir / "summary.md", summary, sync=False)
    write_text_atomic(out_dir / "figures.json", json.dumps({"figures": plot.manifest}, indent=1) + "\n", sync=False)
    return out_dir


def _game_figures(
    plot: Plotter,
    data: list[RunData],
    kids: dict[str, list[nx.Child]],
    windows: dict[str, list[nx.PairWindow]],
    notes: list[str],
) -> list[Figure]:
    """The game's figures, in the summary's order: solve rates, rewards, pairs, ratings, evolution, validity."""
    solve_panels = [("matched tasks (fillers excluded)", tags.SOLVE_RATE)]
    if any(nx.has(r, tags.FILLER_SOLVE_RATE) for r in data):
        solve_panels.append(("filler tasks", tags.FILLER_SOLVE_RATE))
    solve_panels.append(("well-formatted attempts", tags.STUDENT_FORMAT_RATE))
    return [
        (
            "Student solve rate",
            plot.lines("solve_rate", "Student solve rate on matched tasks", solve_panels, 3, notes),
            "Correct fraction of the students' attempts at their matched teachers' tasks (the p̂ that rewards and "
            f"ratings use; `{tags.SOLVE_RATE}`); filler attempts at buffered tasks are excluded and shown apart "
            "when a run has any.",
        ),
        (
            "Teacher reward",
            plot.lines("teacher_reward", "Teacher reward", [("teacher reward", tags.TEACHER_REWARD)], 1, notes),
            "",
        ),
        (
            "Student reward",
            plot.lines("student_reward", "Student reward", [("student reward", tags.STUDENT_REWARD)], 1, notes),
            "",
        ),
        (
            "Teacher × student solve rate",
            plot.pairs(windows, notes),
            f"Per window of steps (the run's steps in {nx.PAIR_WINDOWS} equal parts), the solve rate of each "
            "matched pair: correct / attempts of the student (column) at the teacher's (row) tasks; grey: not "
            "matched or no valid task in the window.",
        ),
        ("Ratings", plot.ratings(notes), ""),
        (
            "Evolution retention",
            plot.retention(kids, notes),
            "Thin lines: each child's rank within its role (μ − 3σ, 1 = best) k steps after its birth; crosses at "
            "k = 0: the rank of the member it replaced, when culled; thick: mean per operator at "
            f"k ∈ {{{', '.join(str(k) for k in nx.RETENTION_KS[:4])}, …}}.",
        ),
        (
            "Valid rate",
            plot.lines(
                "valid_rate",
                "Proposal valid rate",
                [("all task types", tags.VALID_RATE)] + [(tt, tags.valid_rate(tt)) for tt in nx.task_types(data)],
                4,
                notes,
            ),
            "",
        ),
        ("Validity reasons", plot.validity(notes), ""),
        (
            "Tampering",
            tamper.draw(plot, notes),
            f"Per member, its completions (proposals and attempts) whose run tripped a sandbox defence at each step "
            f"(reason `tamper`, `{tags.tamper('<member>')}`; dashed: students); 0 everywhere: no attempt on the "
            "verifier's machinery was seen.",
        ),
    ]


def _update_figures(
    plot: Plotter, data: list[RunData], entries: dict[str, dict[str, nx.EvalEntry]], notes: list[str]
) -> list[Figure]:
    """The programs' and the updates' figures, in the summary's order, then time per phase and evaluation."""
    return [
        (
            "Program complexity",
            plot.lines(
                "complexity",
                "Program complexity (valid teacher programs)",
                [(label, tags.program(key)) for key, label in
                 (("ast_depth", "AST depth"), ("cyclomatic", "cyclomatic complexity"), ("loc", "lines of code"),
                  ("variables", "variables"))],
                2,
                notes,
            ),
            "",
        ),
        (
            "Coverage",
            plot.lines(
                "coverage",
                "Problem-space coverage (cumulative distinct)",
                [("programs", tags.program("coverage_programs")), ("signatures", tags.program("coverage_signatures"))],
                2,
                notes,
            ),
            "",
        ),
        (
            "Per role",
            plot.roles(notes),
            "Entropy, response length and reward of each role measured on that role's completions only; for the "
            "single-agent baseline the teacher curve is its proposer and the student curve its solver.",
        ),
        (
            "Response length",
            plot.lines(
                "response_length",
                "Response length (tokens)",
                [(role, tags.response_length(role)) for role in tags.ROLES],
                2,
                notes,
            ),
            "",
        ),
        (
            "Entropy",
            plot.lines(
                "entropy",
                "Policy entropy (mean per token of the role's completions)",
                [(role, tags.entropy(role)) for role in tags.ROLES],
                2,
                notes,
            ),
            "",
        ),
        (
            "Losses",
            plot.lines(
                "losses",
                "Policy update (means over members)",
                [
                    ("policy loss", tags.loss("policy_loss")),
                    ("grad norm", tags.loss("grad_norm")),
                    ("clip fraction", tags.loss("clip_frac")),
                    ("entropy (loss)", tags.loss("entropy")),
                    ("fraction of zero-std reward groups", tags.FRAC_REWARD_ZERO_STD),
                ],
                3,
                notes,
            ),
            "",
        ),
        ("Time per phase", plot.timing(notes), ""),
        ("Evaluation", plot.evaluation(entries, notes), ""),
    ]
