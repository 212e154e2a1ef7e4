"""The report's view of reward-hacking telemetry: each member's completions that tripped a sandbox defence per
step (``tamper/<member>``, a figure), and a line per run in ``summary.md`` when any did (totals per member and per
role and class, the samples saved in ``tamper_samples.jsonl``).

Everything shown comes from the run's own files, read without trusting them: counts from the event files, the
samples through :meth:`selfplay.rundir.RunDir.tamper_samples` (their shape checked; their text is never shown,
run or parsed), and every name a run wrote is shown only through :func:`shown`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from evaluation.report import numerics as nx
from evaluation.report.loading import RunData
from evaluation.report.plots import Plotter
from selfplay import tags
from selfplay.rundir import TAMPER_SAMPLES

_SAFE = re.compile(r"[^A-Za-z0-9_.:+-]")


def shown(name: str, limit: int = 64) -> str:
    """A name read from a run (a member, a defence class) as ``summary.md`` shows it: characters outside
    ``[A-Za-z0-9_.:+-]`` replaced by ``?``, cut at ``limit`` (no Markdown, link or HTML a run could plant)."""
    return _SAFE.sub("?", name[:limit]) + ("…" if len(name) > limit else "")


def member_counts(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Member -> ``(steps, counts)`` of its ``tamper/<member>`` series, sorted by member (only members logged)."""
    names = sorted(m for t in run.scalars if (m := tags.parse_tamper(t)) is not None and nx.has(run, t))
    return {m: nx.series(run, tags.tamper(m)) for m in names}


def class_totals(run: RunData) -> Counter[tuple[str, str]]:
    """``(role, class)`` -> the completions of that role that tripped that defence, over the whole run."""
    out: Counter[tuple[str, str]] = Counter()
    for t in run.scalars:
        if (rc := tags.parse_tamper_class(t)) is not None:
            out[rc] += int(nx.series(run, t)[1].sum())
    return out


def run_line(run: RunData) -> str | None:
    """The run's line of ``summary.md``, ``None`` when no completion of it tampered."""
    per = {m: (steps[values > 0], values[values > 0]) for m, (steps, values) in member_counts(run).items()}
    per = {m: sv for m, sv in per.items() if len(sv[1])}
    if not per:
        return None
    total = int(sum(v.sum() for _, v in per.values()))

    def steps_of(steps: np.ndarray) -> str:
        shown_steps = ", ".join(str(int(s)) for s in steps[:5])
        return shown_steps + (f", … ({len(steps)} steps)" if len(steps) > 5 else "")

    members = "; ".join(f"{shown(m)} {int(v.sum())} (step{'s' if len(s) > 1 else ''} {steps_of(s)})"
                        for m, (s, v) in per.items())
    classes = ", ".join(f"{shown(role)}/{shown(cls)} {n}" for (role, cls), n in sorted(class_totals(run).items()) if n)
    saved = Counter(str(rec["member"]) for rec in run.tamper_samples)
    samples = (f"{sum(saved.values())} sample(s) saved in `{TAMPER_SAMPLES}` ("
               + ", ".join(f"{shown(m)} {n}" for m, n in sorted(saved.items())) + ")") if saved \
        else f"no sample in `{TAMPER_SAMPLES}`"
    return (f"- **{shown(run.name, 120)}**: {total} completion(s) tripped a sandbox defence: {members}; "
            f"classes: {classes or 'not logged'}; {samples}.")


def tamper_section(runs: Sequence[RunData]) -> list[str]:
    """``## Tampering``: one line per run in which a completion tripped a sandbox defence; nothing when none did."""
    lines = [line for r in runs if (line := run_line(r)) is not None]
    if not lines:
        return []
    return ["## Tampering", "",
            "Completions whose run tripped a sandbox defence (reason `tamper`; counted per member as "
            f"`{tags.tamper('<member>')}` and per role and defence class as "
            f"`{tags.tamper_class('<role>', '<class>')}`); the first ones of each member are saved, as data, in "
            f"the run's `{TAMPER_SAMPLES}`.", "", *lines, ""]


def draw(plot: Plotter, notes: list[str]) -> str | None:
    """``tamper.png``: per run one panel, per member the count of its completions that tripped a sandbox defence
    at each step (raw counts, no smoothing). Skipped, with a note, when no run logs ``tamper/<member>``."""
    runs = [r for r in plot.runs if member_counts(r)]
    if not runs:
        notes.append(f"**Tampering** skipped: no run logs `{tags.tamper('<member>')}`.")
        return None
    title = "Tampering: completions per member that tripped a sandbox defence, per step"
    return plot.run_panels("tamper", title, runs, 3.4, lambda ax, r: _panel(plot, ax, r))


def _panel(plot: Plotter, ax: Any, r: RunData) -> dict[str, Any]:
    """One run's panel of :func:`draw`: a curve per member (dashed: students); returns its manifest entry."""
    from matplotlib.ticker import MaxNLocator

    panel: dict[str, Any] = {"title": r.name, "run": r.name, "curves": []}
    series = member_counts(r)
    cmap = plot.mpl.colormaps["tab10" if len(series) <= 10 else "tab20"]
    for i, (m, (steps, values)) in enumerate(series.items()):
        ax.plot(steps, values, color=cmap(i % cmap.N), lw=1.2, marker="o" if len(values) < 30 else None, ms=3,
                ls="--" if nx.role_of(r, m) == "student" else "-", label=m)
        panel["curves"].append({"run": r.name, "label": m, "tag": tags.tamper(m), "points": len(values),
                                "total": float(values.sum())})
    ax.set_title(f"{r.name} ({r.arm})", color=plot.colour[r.name])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("completions (reason tamper)")
    top = max((float(v.max()) for _, v in series.values() if len(v)), default=0.0)
    ax.set_ylim(-0.05 * max(top, 1.0), 1.1 * max(top, 1.0))  # all zero: a 0..1 axis, the zeros visible
    ax.legend(fontsize=7, ncol=2 if len(series) > 6 else 1, loc="best")
    return panel
