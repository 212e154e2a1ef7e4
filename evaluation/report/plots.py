"""The report's figures: one PNG (plus any extra format) per diagnostic group, every run in one colour.

Matplotlib is used through ``matplotlib.figure.Figure`` with the Agg canvas only: no pyplot, no display, no
change to the process-wide backend. A figure whose data no run logs is skipped with a note; the
:class:`Plotter` also keeps a manifest of what it drew (panels, curves and their point counts, heatmap
cells), which the report writes as ``figures.json`` so scripts and tests can check a figure's content
without reading pixels.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.report import numerics as nx
from evaluation.report.loading import RunData
from selfplay import tags
from selfplay.rundir import LINEAGE, write_text_atomic

ROLE_LABELS = {"teacher": "teacher", "student": "student"}
BOTH_ROLES_LABELS = {"teacher": "teacher (proposer)", "student": "student (solver)"}


def _suptitle(fig: Any) -> list[Any]:
    """The figure's title as the Text the layout placed, if it has one. Not ``fig.suptitle(fig.get_suptitle())``:
    that sets the title again at its default position, below which the layout has not made room (a wrapped
    title then overlapped the first panel's)."""
    text = getattr(fig, "_suptitle", None)
    return [text] if text is not None and text.get_text() else []


def _titles(fig: Any) -> list[Any]:
    """The figure's title and every axes' centre title (the texts a layout engine does not wrap)."""
    return _suptitle(fig) + [ax.title for ax in fig.axes if ax.get_visible() and ax.get_title()]


def fit_titles(fig: Any, margin: float = 2.0) -> bool:
    """Wrap every title that would stick out of the figure onto more lines until it fits (the constrained
    layout then makes room for the extra lines). A long title is otherwise cut at both edges of the PNG.

    The figure is laid out without rendering pixels (a draw with drawing disabled), its titles measured; one that
    sticks out is wrapped at the width its overflow asks for (its characters scaled by the room it has over its
    measured width, a centred title having ``2 min(c, W - c)`` around its centre ``c``), then by 15 % steps while
    it still does, each try laid out again. The figure is left laid out with its final texts
    (:func:`texts_outside` measures it as it stands with ``drawn=True``). Returns whether a title was wrapped."""
    import textwrap

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    wrapped = False
    for text in _titles(fig):
        original = text.get_text()
        width = max(len(line) for line in original.splitlines())
        while width > 8:
            box = text.get_window_extent(renderer)
            if box.x0 >= -margin and box.x1 <= fig.bbox.width + margin:
                break
            centre = (box.x0 + box.x1) / 2
            room = 2 * min(centre + margin, fig.bbox.width + margin - centre)
            longest = max(len(line) for line in text.get_text().splitlines())
            width = min(int(width * 0.85), int(longest * room / max(box.width, 1.0) * 0.95))
            text.set_text("\n".join(textwrap.fill(line, max(width, 8)) for line in original.splitlines()))
            fig.draw_without_rendering()
            wrapped = True
    return wrapped


def texts_outside(fig: Any, margin: float = 2.0, drawn: bool = False) -> list[str]:
    """What of ``fig`` is drawn beyond its edges (cut in the PNG): each visible axes whose drawn texts (title,
    labels, tick labels, legend) reach out of the figure, named by its title, and each figure-level text or
    legend that does. ``drawn``: the figure was drawn since its last change (e.g. by :func:`fit_titles`), so
    it is measured as it stands (one full draw of a report figure fewer)."""
    if not drawn:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height

    def outside(box: Any) -> bool:
        return box.x0 < -margin or box.x1 > w + margin or box.y0 < -margin or box.y1 > h + margin

    out = []
    for i, ax in enumerate(fig.axes):
        if ax.get_visible() and outside(ax.get_tightbbox(renderer)):
            out.append(ax.get_title() or f"axes {i}")
    for t in [*_suptitle(fig), *fig.texts, *fig.legends]:
        if t.get_visible() and outside(t.get_window_extent(renderer)):
            out.append(getattr(t, "get_text", lambda: "figure legend")())
    return out


class Plotter:
    """Figure writer: Agg canvas, consistent run colours, raw + smoothed curves, a manifest of what was drawn.

    Args:
        runs: the loaded runs (names unique).
        out: output directory.
        smoothing: EMA weight of the smoothed curves (0 = raw only).
        formats: image formats; PNG is always written.
        dpi: image resolution.
    """

    def __init__(
        self, runs: Sequence[RunData], out: Path, smoothing: float, formats: Sequence[str], dpi: int
    ):
        import matplotlib

        self.mpl = matplotlib
        self.runs = runs
        self.out = out
        self.smoothing = smoothing
        self.formats = ["png"] + [f for f in formats if f != "png"]
        self.dpi = dpi
        cmap = matplotlib.colormaps["tab10" if len(runs) <= 10 else "tab20"]
        self.colour = {r.name: cmap(i % cmap.N) for i, r in enumerate(runs)}
        self.rc = {
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "legend.fontsize": 8,
            "legend.frameon": False,
        }
        self.manifest: list[dict[str, Any]] = []

    # -- plumbing -------------------------------------------------------------------------------------

    def figure(self, nrows: int, ncols: int, size: tuple[float, float]) -> tuple[Any, list[Any]]:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=size, layout="constrained", dpi=self.dpi)
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
        return fig, axes

    def save(self, fig: Any, key: str, title: str, panels: list[dict[str, Any]]) -> str:
        fit_titles(fig)  # lays the figure out (no pixels rendered), wrapping any title that sticks out
        overflow = texts_outside(fig, drawn=True)
        # keep that layout: each save then renders it without laying it out twice more (a save lays out a figure
        # that has a layout engine once to measure it and once as it renders); the figure is made at the PNG's
        # dpi, so the layout measured is the one saved
        fig.set_layout_engine(None)
        for fmt in self.formats:  # rendered in memory, then written atomically (never through a link)
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=self.dpi)
            write_text_atomic(self.out / f"{key}.{fmt}", buf.getvalue(), sync=False)
        self.manifest.append({"key": key, "title": title, "file": f"{key}.png", "panels": panels,
                              "text_outside": overflow})
        return f"{key}.png"

    def curve(
        self,
        ax: Any,
        steps: np.ndarray,
        values: np.ndarray,
        colour: Any,
        label: str | None,
        panel: dict[str, Any],
        run: str,
        tag: str,
        ls: str = "-",
    ) -> None:
        """Raw (faint) and smoothed curve of one series; recorded in the panel's manifest entry."""
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
        if self.smoothing > 0 and len(values) > 1:
            ax.plot(steps, values, color=colour, alpha=0.25, lw=0.8, ls=ls)
            ax.plot(steps, nx.smooth(values, self.smoothing), color=colour, lw=1.6, label=label, ls=ls)
        else:
            ax.plot(
                steps, values, color=colour, lw=1.4, label=label, ls=ls, marker="o" if len(values) == 1 else None
            )
        panel["curves"].append({"run": run, "label": label, "tag": tag, "points": int(len(values))})

    def run_legend(self, fig: Any, names: Sequence[str]) -> None:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=self.colour[n], lw=2) for n in names]
        fig.legend(handles, list(names), loc="outside lower center", ncol=min(len(names), 5))

    def _grid(self, n: int, max_cols: int) -> tuple[int, int]:
        ncols = min(max_cols, n)
        return math.ceil(n / ncols), ncols

    def run_panels(self, key: str, title: str, runs: Sequence[RunData], height: float,
                   draw: Callable[[Any, RunData], dict[str, Any]]) -> str:
        """One panel per run (two columns, ``height`` inches a row), each drawn by ``draw(ax, run)``, which returns
        the panel's manifest entry; the figure titled ``title`` and saved as ``key``."""
        nrows, ncols = self._grid(len(runs), 2)
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.2 * ncols, height * nrows + 0.6))
            drawn = [draw(ax, r) for ax, r in zip(axes, runs, strict=False)]
            for ax in axes[len(runs):]:
                ax.set_visible(False)
            fig.suptitle(title)
            return self.save(fig, key, title, drawn)

    # -- figure kinds ------------------------------------------------------------------------------

    def lines(
        self, key: str, title: str, panels: Sequence[tuple[str, str]], ncols: int, notes: list[str]
    ) -> str | None:
        """One panel per (panel title, tag), one curve per run. Skipped when no run logs any tag."""
        present = {tag: [r for r in self.runs if nx.has(r, tag)] for _, tag in panels}
        if not any(present.values()):
            listed = ", ".join(f"`{t}`" for _, t in panels)
            notes.append(f"**{title}** skipped: no run logs {listed}.")
            return None
        nowhere = [f"`{tag}`" for _, tag in panels if not present[tag]]
        if nowhere:
            notes.append(f"{title}: no run logs {', '.join(nowhere)} (panel left empty).")
        for r in self.runs:
            lacking = [f"`{tag}`" for _, tag in panels if present[tag] and r not in present[tag]]
            if lacking:
                notes.append(f"{title}: {r.name} does not log {', '.join(lacking)}.")
        nrows, ncols = self._grid(len(panels), ncols)
        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (4.6 * ncols + 0.6, 3.1 * nrows + 0.7))
            for ax, (ptitle, tag) in zip(axes, panels, strict=False):
                panel: dict[str, Any] = {"title": ptitle, "curves": []}
                drawn.append(panel)
                if len(panels) > 1:
                    ax.set_title(ptitle)
                ax.set_xlabel("step")
                if not present[tag]:
                    ax.text(
                        0.5, 0.5, f"{tag}\nnot logged", ha="center", va="center", transform=ax.transAxes,
                        color="grey",
                    )
                for r in present[tag]:
                    steps, values = nx.series(r, tag)
                    self.curve(ax, steps, values, self.colour[r.name], r.name, panel, r.name, tag)
            for ax in axes[len(panels) :]:
                ax.set_visible(False)
            fig.suptitle(title + (f"  (EMA {self.smoothing:g}; raw faint)" if self.smoothing > 0 else ""))
            self.run_legend(fig, [r.name for r in self.runs if any(r in p for p in present.values())])
            return self.save(fig, key, title, drawn)

    def roles(self, notes: list[str]) -> str | None:
        """Per run, teacher and student curves side by side in each panel: entropy, response length, reward
        (for a member that plays both roles, its proposer and its solver)."""
        metrics = [
            ("entropy (mean per token)", tags.entropy),
            ("response length (tokens)", tags.response_length),
            ("reward", lambda role: tags.TEACHER_REWARD if role == "teacher" else tags.STUDENT_REWARD),
        ]
        runs = [r for r in self.runs if any(nx.has(r, f(role)) for _, f in metrics for role in tags.ROLES)]
        title = "Per role: teacher vs student (one member playing both: proposer vs solver)"
        if not runs:
            notes.append(f"**{title}** skipped: no run logs per-role entropy, length or reward.")
            return None
        for r in runs:
            lacking = [f"`{f(role)}`" for _, f in metrics for role in tags.ROLES if not nx.has(r, f(role))]
            if lacking:
                notes.append(f"Per role: {r.name} does not log {', '.join(lacking)}.")
        colours = {"teacher": "#1f77b4", "student": "#d62728"}
        styles = {"teacher": "-", "student": "--"}
        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(len(metrics), len(runs), (4.4 * len(runs) + 0.6, 2.7 * len(metrics) + 0.8))
            for j, r in enumerate(runs):
                labels = BOTH_ROLES_LABELS if r.single_member_both_roles else ROLE_LABELS
                for i, (mtitle, f) in enumerate(metrics):
                    ax = axes[i * len(runs) + j]
                    panel: dict[str, Any] = {"title": f"{r.name}: {mtitle}", "run": r.name, "curves": []}
                    drawn.append(panel)
                    for role in tags.ROLES:
                        steps, values = nx.series(r, f(role))
                        if len(values):
                            self.curve(
                                ax, steps, values, colours[role], labels[role], panel, r.name, f(role), styles[role]
                            )
                    ax.set_title(f"{r.name} ({r.arm}): {mtitle}" if i == 0 else mtitle, fontsize=9)
                    ax.set_xlabel("step")
                    if panel["curves"]:
                        ax.legend(loc="best")
                    else:
                        ax.text(
                            0.5, 0.5, "\n".join(f(role) for role in tags.ROLES) + "\nnot logged", ha="center",
                            va="center", transform=ax.transAxes, color="grey",
                        )
            fig.suptitle(title + (f"  (EMA {self.smoothing:g}; raw faint)" if self.smoothing > 0 else ""))
            return self.save(fig, "roles", title, drawn)

    def ratings(self, notes: list[str]) -> str | None:
        """μ − 3σ per member, one panel per run; evolution replacements as vertical lines by operator."""
        runs = [r for r in self.runs if nx.members(r)]
        title = "TrueSkill conservative rating μ − 3σ per member (dotted: evolution replacements)"
        if not runs:
            notes.append(
                f"**Ratings** skipped: no run logs `{tags.member('<member>', 'conservative')}` (or mu/sigma)."
            )
            return None
        missing = [r.name for r in self.runs if r not in runs]
        if missing:
            notes.append(f"Ratings: no `{tags.member('<member>', '...')}` ratings logged by {', '.join(missing)}.")
        operators = sorted({op for r in runs for op in nx.evolution_steps(r)})
        op_cmap = self.mpl.colormaps["Dark2"]
        op_colour = {op: op_cmap(i % op_cmap.N) for i, op in enumerate(operators)}
        nrows, ncols = self._grid(len(runs), 2)
        from matplotlib.lines import Line2D

        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.2 * ncols, 3.8 * nrows + 0.6))
            for ax, r in zip(axes, runs, strict=False):
                panel: dict[str, Any] = {"title": r.name, "curves": []}
                drawn.append(panel)
                names = nx.members(r)
                cmap = self.mpl.colormaps["tab10" if len(names) <= 10 else "tab20"]
                for i, m in enumerate(names):
                    steps, values = nx.conservative(r, m)
                    student = nx.role_of(r, m) == "student"
                    ax.plot(steps, values, color=cmap(i % cmap.N), lw=1.2, ls="--" if student else "-", label=m)
                    panel["curves"].append(
                        {"run": r.name, "label": m, "tag": tags.member(m, "conservative"), "points": len(values)}
                    )
                handles, labels = ax.get_legend_handles_labels()
                for op, steps_ in nx.evolution_steps(r).items():
                    ax.vlines(
                        steps_, 0, 1, transform=ax.get_xaxis_transform(), colors=[op_colour[op]], lw=0.8,
                        alpha=0.6, linestyles=":",
                    )
                    handles.append(Line2D([], [], color=op_colour[op], ls=":", lw=1.5))
                    labels.append(f"{op} ({len(steps_)})")
                ax.set_title(f"{r.name} ({r.arm})", color=self.colour[r.name])
                ax.set_xlabel("step")
                ax.set_ylabel("μ − 3σ")
                ax.legend(handles, labels, fontsize=7, ncol=2 if len(labels) > 6 else 1, loc="best")
            for ax in axes[len(runs) :]:
                ax.set_visible(False)
            fig.suptitle(title)
            return self.save(fig, "ratings", title, drawn)

    def pairs(self, windows: dict[str, list[nx.PairWindow]], notes: list[str]) -> str | None:
        """Teacher × student solve rate on matched tasks, one heatmap per run and window of steps; cells
        annotated ``correct/attempts``, grey where the pair made no matched attempt in the window."""
        runs = [r for r in self.runs if windows.get(r.name)]
        title = "Teacher × student solve rate on matched tasks, per window of steps (cells: correct/attempts)"
        # grey without a number: never matched in the window; grey 0/0: matched, no valid task
        pattern = tags.pair("<teacher>", "<student>", "attempts")
        if not runs:
            notes.append(f"**Teacher × student matrix** skipped: no run logs `{pattern}`.")
            return None
        missing = [r.name for r in self.runs if r not in runs]
        if missing:
            notes.append(f"Teacher × student matrix: no `{pattern}` logged by {', '.join(missing)}.")
        ncols = max(len(windows[r.name]) for r in runs)
        cmap = self.mpl.colormaps["viridis"].with_extremes(bad="#d9d9d9")
        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc | {"axes.grid": False}):
            size_t = max(len(w[0].teachers) for w in windows.values() if w)
            size_s = max(len(w[0].students) for w in windows.values() if w)
            cell = 0.55 if size_t * size_s <= 64 else 0.3
            fig, axes = self.figure(
                len(runs), ncols, (max(3.2, cell * size_s + 1.6) * ncols + 1.0, (cell * size_t + 1.3) * len(runs) + 0.8)
            )
            image = None
            for i, r in enumerate(runs):
                for j in range(ncols):
                    ax = axes[i * ncols + j]
                    if j >= len(windows[r.name]):
                        ax.set_visible(False)
                        continue
                    w = windows[r.name][j]
                    image = ax.imshow(w.rate, vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto")
                    ax.set_xticks(range(len(w.students)), w.students, rotation=30, ha="right")
                    ax.set_yticks(range(len(w.teachers)), w.teachers)
                    ax.set_title(f"{r.name}: {w.label}", color=self.colour[r.name], fontsize=9)
                    if j == 0:
                        ax.set_ylabel("teacher")
                    ax.set_xlabel("student")
                    if len(w.teachers) * len(w.students) <= 64:
                        for a in range(len(w.teachers)):
                            for b in range(len(w.students)):
                                if w.matched[a, b] > 0:
                                    rate = w.rate[a, b]
                                    ax.text(
                                        b, a, f"{int(w.correct[a, b])}/{int(w.attempts[a, b])}", ha="center",
                                        va="center", fontsize=7,
                                        color="white" if w.attempts[a, b] > 0 and rate < 0.6 else "black",
                                    )
                    drawn.append({
                        "title": f"{r.name}: {w.label}", "run": r.name, "first": w.first, "last": w.last,
                        "teachers": w.teachers, "students": w.students,
                        "attempts": w.attempts.astype(int).tolist(), "correct": w.correct.astype(int).tolist(),
                        "matched_steps": w.matched.astype(int).tolist(),
                    })
            if image is not None:
                fig.colorbar(image, ax=axes, shrink=0.8, label="solve rate (matched attempts)")
            fig.suptitle(title)
            return self.save(fig, "pairs", title, drawn)

    def retention(self, kids: dict[str, list[nx.Child]], notes: list[str]) -> str | None:
        """Rank within the role of every evolved child after birth (thin lines), by operator (colour), with
        the mean per operator at the tabulated k (thick) and the replaced member's rank at culling at k = 0."""
        runs = [r for r in self.runs if kids.get(r.name)]
        title = "Evolution retention: rank of each child within its role after birth (k = 0: the member it replaced)"
        if not runs:
            notes.append(f"**Evolution retention** skipped: no run has evolution events in `{LINEAGE}`.")
            return None
        operators = sorted({c.operator for r in runs for c in kids[r.name]})
        op_cmap = self.mpl.colormaps["Dark2"]
        op_colour = {op: op_cmap(i % op_cmap.N) for i, op in enumerate(operators)}
        nrows, ncols = self._grid(len(runs), 2)
        from matplotlib.collections import LineCollection
        from matplotlib.lines import Line2D

        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.2 * ncols, 3.8 * nrows + 0.9))
            for ax, r in zip(axes, runs, strict=False):
                panel: dict[str, Any] = {"title": r.name, "run": r.name, "curves": []}
                drawn.append(panel)
                top = 1
                # one artist per operator and kind (lines, dots, crosses), not per child: a long lineage has
                # thousands of children, and matplotlib's cost per artist (autoscaling, the legend's placement)
                # grows with the number already drawn
                lines: dict[str, list[list[tuple[int, int]]]] = {op: [] for op in operators}
                dots: dict[str, list[tuple[int, int]]] = {op: [] for op in operators}
                crosses: dict[str, list[tuple[int, int]]] = {op: [] for op in operators}
                for c in kids[r.name]:
                    ks = sorted(c.ranks)
                    xs = ([0] if c.culled_rank is not None else []) + ks
                    ys = ([c.culled_rank] if c.culled_rank is not None else []) + [c.ranks[k] for k in ks]
                    top = max([top, c.n_members, *ys])
                    lines[c.operator].append(list(zip(xs, ys, strict=True)))
                    if len(xs) < 30:
                        dots[c.operator] += zip(xs, ys, strict=True)
                    if c.culled_rank is not None:
                        crosses[c.operator].append((0, c.culled_rank))
                    panel["curves"].append({
                        "run": r.name, "label": f"{c.slot}@{c.step} ({c.operator})", "operator": c.operator,
                        "role": c.role, "step": c.step, "culled_rank": c.culled_rank, "points": len(ks),
                    })
                for op in operators:
                    colour = op_colour[op]
                    ax.add_collection(LineCollection(lines[op], colors=[colour], linewidths=0.8, alpha=0.45))
                    if dots[op]:
                        ax.plot(*zip(*dots[op], strict=True), color=colour, ls="", marker=".", alpha=0.45)
                    if crosses[op]:
                        ax.scatter(*zip(*crosses[op], strict=True), marker="x", color=colour, s=28, zorder=3)
                ax.autoscale_view()
                for op in operators:
                    mine = [c for c in kids[r.name] if c.operator == op]
                    pts = [(k, float(np.mean(v))) for k in nx.RETENTION_KS
                           if (v := [c.ranks[k] for c in mine if k in c.ranks])]
                    if pts:
                        ax.plot(*zip(*pts, strict=True), color=op_colour[op], lw=2.2, marker="o")
                ax.set_ylim(top + 0.5, 0.5)
                ax.set_yticks(range(1, top + 1))
                k_max = max((k for c in kids[r.name] for k in c.ranks), default=0)
                if k_max > 20:  # long runs: log-like k axis, ticks at the tabulated k
                    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

                    ax.set_xscale("symlog", linthresh=2)
                    ax.xaxis.set_major_locator(FixedLocator([0, *(k for k in nx.RETENTION_KS if k <= k_max)]))
                    ax.xaxis.set_major_formatter(ScalarFormatter())
                    ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xlim(left=-0.3)
                ax.set_title(f"{r.name} ({r.arm})", color=self.colour[r.name])
                ax.set_xlabel("steps after birth k")
                ax.set_ylabel("rank in role by μ − 3σ (1 = best)")
                handles = [Line2D([], [], color=op_colour[op], lw=2, marker="o") for op in operators]
                handles.append(Line2D([], [], color="black", ls="", marker="x"))
                ax.legend(handles, [*operators, "replaced member, at culling"], loc="best", fontsize=7)
            for ax in axes[len(runs) :]:
                ax.set_visible(False)
            fig.suptitle(title)
            return self.save(fig, "retention", title, drawn)

    def validity(self, notes: list[str]) -> str | None:
        """Stacked fractions of proposal outcomes (``valid`` and each rejection reason), one panel per run."""
        data = {r.name: nx.validity(r) for r in self.runs}
        runs = [r for r in self.runs if data[r.name][1]]
        pattern = tags.validity("<reason>")
        if not runs:
            notes.append(f"**Validity reasons** skipped: no run logs `{pattern}`.")
            return None
        missing = [r.name for r in self.runs if r not in runs]
        if missing:
            notes.append(f"Validity reasons: no `{pattern}` logged by {', '.join(missing)}.")
        totals: Counter[str] = Counter()
        for r in runs:
            for reason, counts in data[r.name][1].items():
                totals[reason] += float(counts.sum())
        order = (["valid"] if "valid" in totals else []) + [x for x, _ in totals.most_common() if x != "valid"]
        cmap = self.mpl.colormaps["tab20"]
        palette = [cmap(i) for i in range(cmap.N) if i not in (4, 5)]  # greens reserved for "valid"
        colour = {"valid": "#2ca02c"} | {x: palette[i % len(palette)] for i, x in enumerate(order) if x != "valid"}
        from matplotlib.patches import Patch

        title = "Proposal outcomes: valid and rejection reasons (stacked fractions)"
        nrows, ncols = self._grid(len(runs), 2)
        drawn: list[dict[str, Any]] = []
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.0 * ncols, 3.4 * nrows + 0.9))
            for ax, r in zip(axes, runs, strict=False):
                steps, counts = data[r.name]
                steps_arr = np.asarray(steps, dtype=float)
                nbins = min(len(steps), nx.VALIDITY_BINS)
                edges = np.linspace(steps_arr[0], steps_arr[-1], nbins + 1)
                idx = np.clip(np.digitize(steps_arr, edges[1:-1]), 0, nbins - 1)
                reasons = [x for x in order if x in counts]
                binned = np.zeros((len(reasons), nbins))
                for j, reason in enumerate(reasons):
                    np.add.at(binned[j], idx, counts[reason])
                centre = np.asarray([steps_arr[idx == b].mean() if np.any(idx == b) else np.nan for b in range(nbins)])
                total = binned.sum(axis=0)
                keep = (total > 0) & np.isfinite(centre)
                frac = binned[:, keep] / total[keep]
                if keep.sum() == 1:  # a single bin: stackplot needs two x values, draw one stacked bar
                    bottom = 0.0
                    for j, reason in enumerate(reasons):
                        ax.bar([centre[keep][0]], [frac[j, 0]], bottom=bottom, color=colour[reason])
                        bottom += float(frac[j, 0])
                elif keep.any():
                    ax.stackplot(centre[keep], frac, colors=[colour[x] for x in reasons], lw=0)
                drawn.append({"title": r.name, "run": r.name, "reasons": reasons, "bins": int(keep.sum())})
                ax.set_ylim(0, 1)
                ax.set_title(f"{r.name}", color=self.colour[r.name])
                ax.set_xlabel("step")
                ax.set_ylabel("fraction of proposals")
            for ax in axes[len(runs) :]:
                ax.set_visible(False)
            fig.legend(
                [Patch(color=colour[x]) for x in order], order, loc="outside lower center", ncol=min(len(order), 6)
            )
            fig.suptitle(title)
            return self.save(fig, "validity", title, drawn)

    def timing(self, notes: list[str]) -> str | None:
        """Mean seconds per step by phase (stacked bar per run) and the step time over training."""
        phases = {r.name: nx.time_phases(r) for r in self.runs}
        step_runs = [r for r in self.runs if nx.has(r, tags.STEP_SECONDS)]
        pattern = tags.time("<phase>")
        if not any(phases.values()) and not step_runs:
            notes.append(f"**Time per phase** skipped: no run logs `{pattern}` or `{tags.STEP_SECONDS}`.")
            return None
        missing = [r.name for r in self.runs if not phases[r.name]]
        if missing:
            notes.append(f"Time per phase: no `{pattern}` logged by {', '.join(missing)}.")
        all_phases = [p for p in tags.TIME_PHASES if any(p in ph for ph in phases.values())] + sorted(
            {p for ph in phases.values() for p in ph} - set(tags.TIME_PHASES)
        )
        cmap = self.mpl.colormaps["Set2"]
        panel: dict[str, Any] = {"title": tags.STEP_SECONDS, "curves": []}
        with self.mpl.rc_context(self.rc):
            fig, (ax_bar, ax_line) = self.figure(1, 2, (11.5, 0.45 * len(self.runs) + 3.6))
            names = [r.name for r in self.runs]
            left = np.zeros(len(names))
            for i, p in enumerate(all_phases):
                widths = np.asarray([phases[n].get(p, 0.0) for n in names])
                ax_bar.barh(names, widths, left=left, color=cmap(i % cmap.N), label=p)
                left += widths
            for i, n in enumerate(names):
                if not phases[n]:
                    ax_bar.text(0, i, f" {pattern} not logged", va="center", color="grey")
            ax_bar.invert_yaxis()
            ax_bar.set_xlabel("mean seconds per step")
            ax_bar.set_title("time per phase")
            if all_phases:
                ax_bar.legend(loc="best")
            for r in step_runs:
                steps, values = nx.series(r, tags.STEP_SECONDS)
                self.curve(ax_line, steps, values, self.colour[r.name], r.name, panel, r.name, tags.STEP_SECONDS)
            ax_line.set_title(tags.STEP_SECONDS if step_runs else f"{tags.STEP_SECONDS} not logged")
            ax_line.set_xlabel("step")
            ax_line.set_ylabel("seconds")
            if step_runs:
                ax_line.legend(loc="best")
            fig.suptitle("Wall time")
            bars = {"title": "time per phase", "phases": all_phases, "runs": [n for n in names if phases[n]]}
            return self.save(fig, "time", "Wall time", [bars, panel])

    def evaluation(self, entries: dict[str, dict[str, nx.EvalEntry]], notes: list[str]) -> str | None:
        """Grouped bars per benchmark (one bar per run: population mean), members as dots, whiskers
        weakest..best when members are not listed, base / baseline references as horizontal ticks."""
        runs = [r for r in self.runs if entries.get(r.name)]
        if not runs:
            return None
        benches: list[str] = []
        for r in runs:
            benches += [b for b in entries[r.name] if b not in benches]
        width = 0.8 / len(runs)
        title = "Evaluation: population mean per run (dots: members; whiskers: weakest..best)"
        with self.mpl.rc_context(self.rc):
            fig, (ax,) = self.figure(1, 1, (max(6.0, 1.1 * len(benches) * max(1, len(runs)) ** 0.5 + 2.5), 4.4))
            x = np.arange(len(benches))
            labelled: set[str] = set()
            for i, r in enumerate(runs):
                pos = x - 0.4 + width * (i + 0.5)
                for j, b in enumerate(benches):
                    e = entries[r.name].get(b)
                    if e is None or e.headline is None:
                        continue
                    ax.bar(
                        pos[j], e.headline, width * 0.92, color=self.colour[r.name],
                        label=r.name if r.name not in labelled else None,
                    )
                    labelled.add(r.name)
                    if e.members:
                        vals = list(e.members.values())
                        ax.scatter(np.full(len(vals), pos[j]), vals, s=9, color="black", zorder=3)
                    elif e.weakest is not None and e.best is not None:
                        ax.errorbar(
                            pos[j], e.headline,
                            yerr=[[max(0.0, e.headline - e.weakest)], [max(0.0, e.best - e.headline)]],
                            color="black", capsize=3, lw=1,
                        )
            refs_drawn = set()
            for j, b in enumerate(benches):
                for attr, style in (("base", "-"), ("baseline", "--")):
                    val = next(
                        (
                            getattr(entries[r.name][b], attr)
                            for r in runs
                            if b in entries[r.name] and getattr(entries[r.name][b], attr) is not None
                        ),
                        None,
                    )
                    if val is not None:
                        ax.hlines(
                            val, x[j] - 0.45, x[j] + 0.45, colors="black" if attr == "base" else "dimgrey",
                            linestyles=style, lw=1.4,
                            label=(f"{attr} (from results.json)" if attr not in refs_drawn else None),
                        )
                        refs_drawn.add(attr)
            ax.set_axisbelow(True)
            ax.set_xticks(x, benches, rotation=20 if len(benches) > 5 else 0)
            ax.set_ylabel("score")
            ax.legend(loc="best")
            fig.suptitle(title)
            return self.save(fig, "eval", title, [{"title": "benchmarks", "benchmarks": benches,
                                                   "runs": [r.name for r in runs]}])
