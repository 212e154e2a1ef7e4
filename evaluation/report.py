"""Reports comparing training runs: PNG plots and ``summary.md`` from TensorBoard events and side files.

``populora report RUN [RUN ...]`` reads each run directory written by the training loop (layout in
docs/design.md, "Runs, files, logs")::

    runs/<name>/config.json           {"name", "arm": "population" | "baseline", "model", ...}
    runs/<name>/events.out.tfevents.* scalars (charts/, population/<member>/, losses/, programs/,
                                      validity/, time/, evolution/), global_step = training step
    runs/<name>/lineage.jsonl         one JSON object per evolution replacement
    runs/<name>/eval/results.json     optional, written by ``populora eval``

and writes ``<out>/*.png`` (one figure per diagnostic group, every run in one colour) plus
``<out>/summary.md`` (headline numbers per run, evaluation and evolution tables, links to the figures,
notes on what could not be drawn). ``out`` defaults to ``<first run>/report``.

A partial or early run never makes the report fail: a figure whose tags no run logs is skipped and the
skip is noted in ``summary.md``; a run directory without event files is an error naming that directory.

Matplotlib is used through ``matplotlib.figure.Figure`` with the Agg canvas only: no pyplot, no display,
no change to the process-wide backend.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "NoEventsError",
    "ReportConfig",
    "RunData",
    "load_run",
    "load_scalars",
    "make_report",
    "run_report",
    "smooth",
]

Scalars = dict[str, list[tuple[int, float]]]
"""tag -> [(step, value), ...] sorted by step, one value per step."""

# headline windows
LAST_N = 10  # "last-10 mean"
EDGE_FRACTION = 0.1  # "first 10% vs last 10%" of the logged points
OSC_EMA = 0.9  # EMA weight of the solve-rate oscillation diagnostic (docs/method.md §10)
OSC_WINDOW = 50  # sign changes are reported per this many steps
VALIDITY_BINS = 100  # the validity stack is drawn over at most this many step bins

TIME_PHASES = ("generation", "sandbox", "update", "evolution", "checkpoint")


class NoEventsError(FileNotFoundError):
    """A run directory holds no TensorBoard event files (or does not exist)."""


@dataclass
class ReportConfig:
    """Configuration of ``populora report``.

    Attributes:
        runs: run directories to compare (``runs/<name>``), at least one.
        out: output directory; default ``<first run>/report``.
        smoothing: EMA weight of the smoothed curves, in [0, 1) (0 = raw only); raw curves are drawn faintly.
        formats: image formats to write; ``png`` is always written (``summary.md`` links the PNGs).
        dpi: resolution of the images.
    """

    runs: list[Path] = field(default_factory=list)
    out: Path | None = None
    smoothing: float = 0.6
    formats: tuple[str, ...] = ("png",)
    dpi: int = 110


@dataclass
class RunData:
    """Everything the report reads from one run directory."""

    path: Path
    name: str
    config: dict[str, Any]
    scalars: Scalars
    lineage: list[dict[str, Any]]
    eval_results: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """``population`` / ``baseline`` from config.json, or ``?``."""
        return str(self.config.get("arm", self.config.get("kind", "?")))


# ----------------------------------------------------------------------------------------------- loading


def _event_files(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.iterdir() if p.is_file() and "tfevents" in p.name)


def load_scalars(run_dir: str | os.PathLike[str]) -> Scalars:
    """All scalar series of a run: ``{tag: [(step, value), ...]}`` sorted by step.

    Reads every event file directly in ``run_dir`` (a resumed run has several). Both classic
    ``simple_value`` scalars (``torch.utils.tensorboard``) and scalar tensors of the TensorBoard
    ``scalars`` plugin (tf.summary v2 style) are read. A run resumed from a checkpoint re-logs the steps
    after it: as in TensorBoard, the resumed writer's ``purge_step`` discards what the crashed session
    logged from that step on, and any step still logged twice keeps the value written last (wall time).

    Raises:
        NoEventsError: ``run_dir`` does not exist or holds no event files.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoEventsError(f"run directory {run_dir} does not exist")
    if not _event_files(run_dir):
        nested = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*tfevents*") if p.is_file())
        hint = (
            f"; event files were found in subdirectories ({', '.join(nested[:3])}), but the training loop "
            "writes them directly in the run directory"
            if nested
            else ""
        )
        raise NoEventsError(
            f"no TensorBoard event files (events.out.tfevents.*) in run directory {run_dir}{hint}"
        )

    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(
        str(run_dir),
        size_guidance={
            ea.SCALARS: 0,
            ea.TENSORS: 0,
            ea.IMAGES: 1,
            ea.AUDIO: 1,
            ea.HISTOGRAMS: 1,
            ea.COMPRESSED_HISTOGRAMS: 1,
        },
        # TensorBoard's restart semantics: a resumed writer's SessionLog.START (torch ``purge_step``) drops
        # every event at or after that step written before it; a step going backwards drops that tag's
        # later events. Remaining duplicates are resolved below by wall time, per (tag, step).
        purge_orphaned_data=True,
    )
    acc.Reload()
    tags = acc.Tags()
    raw: dict[str, list[tuple[float, int, float]]] = {}
    for tag in tags.get("scalars", []):
        points = [(e.wall_time, int(e.step), float(e.value)) for e in acc.Scalars(tag)]
        if points:  # a tag whose events were all purged stays listed, empty
            raw[tag] = points
    for tag in tags.get("tensors", []):
        meta = acc.summary_metadata.get(tag)
        if tag in raw or meta is None or meta.plugin_data.plugin_name != "scalars":
            continue  # text samples, histograms as tensors, ...
        points = []
        for e in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(e.tensor_proto)
            if arr.size == 1 and np.issubdtype(arr.dtype, np.number):
                points.append((e.wall_time, int(e.step), float(arr.reshape(()))))
        if points:
            raw[tag] = points

    out: Scalars = {}
    for tag, points in raw.items():
        by_step: dict[int, float] = {}
        for _, step, value in sorted(points, key=lambda p: p[0]):  # stable: file order breaks ties
            by_step[step] = value
        out[tag] = sorted(by_step.items())
    return out


def _read_json(path: Path, notes: list[str], what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{what}: could not read `{path}` ({type(exc).__name__}: {exc}); ignored.")
        return None


def load_run(run_dir: str | os.PathLike[str]) -> RunData:
    """Load a run directory: scalars, config.json, lineage.jsonl and eval/results.json (all optional
    except the event files). Problems with the side files become notes, never errors.

    Raises:
        NoEventsError: ``run_dir`` does not exist or holds no event files.
    """
    run_dir = Path(run_dir)
    scalars = load_scalars(run_dir)
    notes: list[str] = []
    config: dict[str, Any] = {}
    if (run_dir / "config.json").is_file():
        loaded = _read_json(run_dir / "config.json", notes, run_dir.name)
        config = loaded if isinstance(loaded, dict) else {}
    else:
        notes.append(f"{run_dir.name}: no config.json; the run is named after its directory.")
    name = str(config.get("name") or run_dir.name)

    lineage: list[dict[str, Any]] = []
    lineage_path = run_dir / "lineage.jsonl"
    if lineage_path.is_file():
        bad = 0
        for line in lineage_path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(record, dict):
                lineage.append(record)
            else:
                bad += 1
        if bad:
            notes.append(f"{name}: {bad} malformed line(s) in lineage.jsonl skipped (a write in progress?).")

    eval_results = None
    eval_path = run_dir / "eval" / "results.json"
    if eval_path.is_file():
        loaded = _read_json(eval_path, notes, name)
        if isinstance(loaded, dict) and isinstance(loaded.get("benchmarks"), dict):
            eval_results = loaded
        elif loaded is not None:
            notes.append(f'{name}: eval/results.json has no "benchmarks" mapping; ignored.')
    return RunData(run_dir, name, config, scalars, lineage, eval_results, notes)


# ------------------------------------------------------------------------------------------- numerics


def smooth(values: Sequence[float] | np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average with ``weight`` on the past.

    Non-finite values are passed through as NaN and do not enter the average. ``weight`` 0 returns the
    values unchanged.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out = np.full(len(values), np.nan)
    last, n = 0.0, 0
    for i, v in enumerate(values):
        v = float(v)
        if not math.isfinite(v):
            continue
        last = last * weight + (1.0 - weight) * v
        n += 1
        out[i] = last / (1.0 - weight**n)
    return out


def _series(run: RunData, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """Finite points of ``tag`` as (steps, values); empty arrays when not logged."""
    points = [(s, v) for s, v in run.scalars.get(tag, ()) if math.isfinite(v)]
    if not points:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    steps, values = zip(*points, strict=True)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)


def _has(run: RunData, tag: str) -> bool:
    return len(_series(run, tag)[1]) > 0


def _final_and_last_mean(values: np.ndarray, n: int = LAST_N) -> tuple[float, float] | None:
    if len(values) == 0:
        return None
    return float(values[-1]), float(np.mean(values[-n:]))


def _first_last(values: np.ndarray, fraction: float = EDGE_FRACTION) -> tuple[float, float] | None:
    """Means of the first and the last ``fraction`` of the points (at least one point each)."""
    if len(values) == 0:
        return None
    k = max(1, math.ceil(fraction * len(values)))
    return float(np.mean(values[:k])), float(np.mean(values[-k:]))


def _oscillation(steps: np.ndarray, values: np.ndarray) -> tuple[float, float] | None:
    """Solve-rate oscillation (docs/method.md §10): sign changes of the first difference of the EMA(0.9)
    per ``OSC_WINDOW`` steps, and the EMA's amplitude (max - min)."""
    if len(values) < 3:
        return None
    ema = smooth(values, OSC_EMA)
    diff = np.diff(ema)
    signs = np.sign(diff[np.abs(diff) > 1e-12])
    changes = int(np.sum(signs[1:] != signs[:-1])) if len(signs) > 1 else 0
    span = max(1, int(steps[-1] - steps[0]))
    return changes * OSC_WINDOW / span, float(np.max(ema) - np.min(ema))


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _members(run: RunData) -> list[str]:
    """Population members that log a rating (``population/<m>/conservative`` or ``mu`` and ``sigma``)."""
    names = set()
    for tag in run.scalars:
        parts = tag.split("/")
        if len(parts) == 3 and parts[0] == "population" and parts[2] in ("conservative", "mu"):
            names.add(parts[1])
    return sorted(names)


def _conservative(run: RunData, member: str) -> tuple[np.ndarray, np.ndarray]:
    """μ − 3σ of a member: logged ``conservative``, else computed from ``mu`` and ``sigma``."""
    steps, values = _series(run, f"population/{member}/conservative")
    if len(values):
        return steps, values
    mu = dict(zip(*_series(run, f"population/{member}/mu"), strict=True))
    sigma = dict(zip(*_series(run, f"population/{member}/sigma"), strict=True))
    common = sorted(set(mu) & set(sigma))
    return np.asarray(common, dtype=np.int64), np.asarray([mu[s] - 3 * sigma[s] for s in common], dtype=float)


def _evolution_steps(run: RunData) -> dict[str, list[int]]:
    """Steps of evolution replacements by operator: lineage.jsonl, else ``evolution/replacements`` > 0."""
    by_op: dict[str, list[int]] = {}
    if run.lineage:
        for rec in run.lineage:
            step = rec.get("step")
            if isinstance(step, int | float):
                by_op.setdefault(str(rec.get("operator", "unknown")), []).append(int(step))
        return by_op
    steps, values = _series(run, "evolution/replacements")
    hits = [int(s) for s, v in zip(steps, values, strict=True) if v > 0]
    return {"replacement": hits} if hits else {}


def _operator_counts(run: RunData) -> tuple[Counter[str], str]:
    """Replacement counts by operator and where they came from (``lineage`` / ``scalars`` / ``none``)."""
    if run.lineage:
        return Counter(str(r.get("operator", "unknown")) for r in run.lineage), "lineage"
    _, values = _series(run, "evolution/replacements")
    if len(values) and values.sum() > 0:
        return Counter({"(operator unknown)": int(round(values.sum()))}), "scalars"
    return Counter(), "none"


def _validity(run: RunData) -> tuple[list[int], dict[str, np.ndarray]]:
    """Union of steps and count per reason (0 where a reason was not logged at a step)."""
    reasons = sorted(t.split("/", 1)[1] for t in run.scalars if t.startswith("validity/") and _has(run, t))
    if not reasons:
        return [], {}
    per = {r: dict(run.scalars[f"validity/{r}"]) for r in reasons}
    steps = sorted(set().union(*per.values()))
    counts = {}
    for r in reasons:
        arr = np.asarray([per[r].get(s, 0.0) for s in steps], dtype=float)
        counts[r] = np.where(np.isfinite(arr), arr, 0.0)
    return steps, counts


def _time_phases(run: RunData) -> dict[str, float]:
    """Mean seconds per training step of each ``time/<phase>`` (total / number of timed steps, so a
    phase logged only at the steps where it runs, e.g. evolution, is not overstated)."""
    tags = [t for t in run.scalars if t.startswith("time/") and _has(run, t)]
    if not tags:
        return {}
    steps = set()
    for t in tags:
        steps.update(_series(run, t)[0].tolist())
    n = max(1, len(steps))
    phases = [p for p in TIME_PHASES if f"time/{p}" in tags] + sorted(
        t[5:] for t in tags if t[5:] not in TIME_PHASES
    )
    return {p: float(_series(run, f"time/{p}")[1].sum()) / n for p in phases}


# -------------------------------------------------------------------------------------------- eval


def _num(x: Any) -> float | None:
    """A score: a number, or a mapping with ``score`` / ``value`` / ``mean``."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Mapping):
        for key in ("score", "value", "mean"):
            if key in x:
                return _num(x[key])
    return None


@dataclass
class _EvalEntry:
    headline: float | None  # population mean (or mean of members, or best)
    weakest: float | None
    best: float | None
    members: dict[str, float]
    base: float | None
    baseline: float | None


def _eval_entries(run: RunData) -> dict[str, _EvalEntry]:
    if not run.eval_results:
        return {}
    out = {}
    for bench, rec in run.eval_results["benchmarks"].items():
        if not isinstance(rec, Mapping):
            continue
        members_raw = rec.get("members")
        members = {}
        if isinstance(members_raw, Mapping):
            members = {str(m): v for m, s in members_raw.items() if (v := _num(s)) is not None}
        weakest, best = _num(rec.get("weakest")), _num(rec.get("best"))
        if members:
            weakest = min(members.values()) if weakest is None else weakest
            best = max(members.values()) if best is None else best
        headline = _num(rec.get("population_mean"))
        if headline is None and members:
            headline = float(np.mean(list(members.values())))
        if headline is None:
            headline = best
        out[str(bench)] = _EvalEntry(
            headline, weakest, best, members, _num(rec.get("base")), _num(rec.get("baseline"))
        )
    return out


# ------------------------------------------------------------------------------------------- plotting


class _Plotter:
    """Figure writer: Agg canvas, consistent run colours, raw + smoothed curves."""

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

    def figure(self, nrows: int, ncols: int, size: tuple[float, float]) -> tuple[Any, list[Any]]:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
        return fig, axes

    def save(self, fig: Any, key: str) -> str:
        for fmt in self.formats:
            fig.savefig(self.out / f"{key}.{fmt}", dpi=self.dpi)
        return f"{key}.png"

    def curve(self, ax: Any, steps: np.ndarray, values: np.ndarray, colour: Any, label: str | None) -> None:
        if self.smoothing > 0 and len(values) > 1:
            ax.plot(steps, values, color=colour, alpha=0.25, lw=0.8)
            ax.plot(steps, smooth(values, self.smoothing), color=colour, lw=1.6, label=label)
        else:
            ax.plot(
                steps, values, color=colour, lw=1.4, label=label, marker="o" if len(values) == 1 else None
            )

    def run_legend(self, fig: Any, names: Sequence[str]) -> None:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=self.colour[n], lw=2) for n in names]
        fig.legend(handles, list(names), loc="outside lower center", ncol=min(len(names), 5))

    # -- figure kinds ------------------------------------------------------------------------------

    def lines(
        self, key: str, title: str, panels: Sequence[tuple[str, str]], ncols: int, notes: list[str]
    ) -> str | None:
        """One panel per (panel title, tag), one curve per run. Skipped when no run logs any tag."""
        present = {tag: [r for r in self.runs if _has(r, tag)] for _, tag in panels}
        if not any(present.values()):
            tags = ", ".join(f"`{t}`" for _, t in panels)
            notes.append(f"**{title}** skipped: no run logs {tags}.")
            return None
        nowhere = [f"`{tag}`" for _, tag in panels if not present[tag]]
        if nowhere:
            notes.append(f"{title}: no run logs {', '.join(nowhere)} (panel left empty).")
        for r in self.runs:
            lacking = [f"`{tag}`" for _, tag in panels if present[tag] and r not in present[tag]]
            if lacking:
                notes.append(f"{title}: {r.name} does not log {', '.join(lacking)}.")
        ncols = min(ncols, len(panels))
        nrows = math.ceil(len(panels) / ncols)
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (4.6 * ncols + 0.6, 3.1 * nrows + 0.7))
            for ax, (ptitle, tag) in zip(axes, panels, strict=False):
                if len(panels) > 1:
                    ax.set_title(ptitle)
                ax.set_xlabel("step")
                if not present[tag]:
                    ax.text(
                        0.5,
                        0.5,
                        f"{tag}\nnot logged",
                        ha="center",
                        va="center",
                        transform=ax.transAxes,
                        color="grey",
                    )
                for r in present[tag]:
                    steps, values = _series(r, tag)
                    self.curve(ax, steps, values, self.colour[r.name], r.name)
            for ax in axes[len(panels) :]:
                ax.set_visible(False)
            fig.suptitle(title + (f"  (EMA {self.smoothing:g}; raw faint)" if self.smoothing > 0 else ""))
            self.run_legend(fig, [r.name for r in self.runs if any(r in p for p in present.values())])
            return self.save(fig, key)

    def ratings(self, notes: list[str]) -> str | None:
        """μ − 3σ per member, one panel per run; evolution replacements as vertical lines by operator."""
        runs = [r for r in self.runs if _members(r)]
        if not runs:
            notes.append("**Ratings** skipped: no run logs `population/<member>/conservative` (or mu/sigma).")
            return None
        missing = [r.name for r in self.runs if r not in runs]
        if missing:
            notes.append(f"Ratings: no `population/<member>/...` ratings logged by {', '.join(missing)}.")
        operators = sorted({op for r in runs for op in _evolution_steps(r)})
        op_cmap = self.mpl.colormaps["Dark2"]
        op_colour = {op: op_cmap(i % op_cmap.N) for i, op in enumerate(operators)}
        ncols = min(2, len(runs))
        nrows = math.ceil(len(runs) / ncols)
        from matplotlib.lines import Line2D

        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.2 * ncols, 3.8 * nrows + 0.6))
            for ax, r in zip(axes, runs, strict=False):
                members = _members(r)
                roles = {str(rec.get("culled")): str(rec.get("role", "")) for rec in r.lineage}
                cmap = self.mpl.colormaps["tab10" if len(members) <= 10 else "tab20"]
                for i, m in enumerate(members):
                    steps, values = _conservative(r, m)
                    student = "student" in m.lower() or roles.get(m) == "student"
                    ax.plot(
                        steps, values, color=cmap(i % cmap.N), lw=1.2, ls="--" if student else "-", label=m
                    )
                handles, labels = ax.get_legend_handles_labels()
                for op, steps_ in _evolution_steps(r).items():
                    ax.vlines(
                        steps_,
                        0,
                        1,
                        transform=ax.get_xaxis_transform(),
                        colors=[op_colour[op]],
                        lw=0.8,
                        alpha=0.6,
                        linestyles=":",
                    )
                    handles.append(Line2D([], [], color=op_colour[op], ls=":", lw=1.5))
                    labels.append(f"{op} ({len(steps_)})")
                ax.set_title(f"{r.name} ({r.kind})", color=self.colour[r.name])
                ax.set_xlabel("step")
                ax.set_ylabel("μ − 3σ")
                ax.legend(handles, labels, fontsize=7, ncol=2 if len(labels) > 6 else 1, loc="best")
            for ax in axes[len(runs) :]:
                ax.set_visible(False)
            fig.suptitle("TrueSkill conservative rating μ − 3σ per member (dotted: evolution replacements)")
            return self.save(fig, "ratings")

    def validity(self, notes: list[str]) -> str | None:
        """Stacked fractions of proposal outcomes (``valid`` and each rejection reason), one panel per run."""
        data = {r.name: _validity(r) for r in self.runs}
        runs = [r for r in self.runs if data[r.name][1]]
        if not runs:
            notes.append("**Validity reasons** skipped: no run logs `validity/<reason>`.")
            return None
        missing = [r.name for r in self.runs if r not in runs]
        if missing:
            notes.append(f"Validity reasons: no `validity/<reason>` logged by {', '.join(missing)}.")
        totals: Counter[str] = Counter()
        for r in runs:
            for reason, counts in data[r.name][1].items():
                totals[reason] += float(counts.sum())
        order = (["valid"] if "valid" in totals else []) + [
            x for x, _ in totals.most_common() if x != "valid"
        ]
        cmap = self.mpl.colormaps["tab20"]
        palette = [cmap(i) for i in range(cmap.N) if i not in (4, 5)]  # greens reserved for "valid"
        colour = {"valid": "#2ca02c"} | {
            x: palette[i % len(palette)] for i, x in enumerate(order) if x != "valid"
        }
        from matplotlib.patches import Patch

        ncols = min(2, len(runs))
        nrows = math.ceil(len(runs) / ncols)
        with self.mpl.rc_context(self.rc):
            fig, axes = self.figure(nrows, ncols, (6.0 * ncols, 3.4 * nrows + 0.9))
            for ax, r in zip(axes, runs, strict=False):
                steps, counts = data[r.name]
                steps_arr = np.asarray(steps, dtype=float)
                nbins = min(len(steps), VALIDITY_BINS)
                edges = np.linspace(steps_arr[0], steps_arr[-1], nbins + 1)
                idx = np.clip(np.digitize(steps_arr, edges[1:-1]), 0, nbins - 1)
                reasons = [x for x in order if x in counts]
                binned = np.zeros((len(reasons), nbins))
                for j, reason in enumerate(reasons):
                    np.add.at(binned[j], idx, counts[reason])
                centre = np.asarray(
                    [steps_arr[idx == b].mean() if np.any(idx == b) else np.nan for b in range(nbins)]
                )
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
                ax.set_ylim(0, 1)
                ax.set_title(f"{r.name}", color=self.colour[r.name])
                ax.set_xlabel("step")
                ax.set_ylabel("fraction of proposals")
            for ax in axes[len(runs) :]:
                ax.set_visible(False)
            fig.legend(
                [Patch(color=colour[x]) for x in order],
                order,
                loc="outside lower center",
                ncol=min(len(order), 6),
            )
            fig.suptitle("Proposal outcomes: valid and rejection reasons (stacked fractions)")
            return self.save(fig, "validity")

    def timing(self, notes: list[str]) -> str | None:
        """Mean seconds per step by phase (stacked bar per run) and the step time over training."""
        phases = {r.name: _time_phases(r) for r in self.runs}
        step_runs = [r for r in self.runs if _has(r, "charts/step_seconds")]
        if not any(phases.values()) and not step_runs:
            notes.append("**Time per phase** skipped: no run logs `time/<phase>` or `charts/step_seconds`.")
            return None
        missing = [r.name for r in self.runs if not phases[r.name]]
        if missing:
            notes.append(f"Time per phase: no `time/<phase>` logged by {', '.join(missing)}.")
        all_phases = [p for p in TIME_PHASES if any(p in ph for ph in phases.values())] + sorted(
            {p for ph in phases.values() for p in ph} - set(TIME_PHASES)
        )
        cmap = self.mpl.colormaps["Set2"]
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
                    ax_bar.text(0, i, " time/<phase> not logged", va="center", color="grey")
            ax_bar.invert_yaxis()
            ax_bar.set_xlabel("mean seconds per step")
            ax_bar.set_title("time per phase")
            if all_phases:
                ax_bar.legend(loc="best")
            for r in step_runs:
                steps, values = _series(r, "charts/step_seconds")
                self.curve(ax_line, steps, values, self.colour[r.name], r.name)
            ax_line.set_title("charts/step_seconds" if step_runs else "charts/step_seconds not logged")
            ax_line.set_xlabel("step")
            ax_line.set_ylabel("seconds")
            if step_runs:
                ax_line.legend(loc="best")
            fig.suptitle("Wall time")
            return self.save(fig, "time")

    def evaluation(self, entries: dict[str, dict[str, _EvalEntry]], notes: list[str]) -> str | None:
        """Grouped bars per benchmark (one bar per run: population mean), members as dots, whiskers
        weakest..best when members are not listed, base / baseline references as horizontal ticks."""
        runs = [r for r in self.runs if entries.get(r.name)]
        if not runs:
            return None
        benches: list[str] = []
        for r in runs:
            benches += [b for b in entries[r.name] if b not in benches]
        width = 0.8 / len(runs)
        with self.mpl.rc_context(self.rc):
            fig, (ax,) = self.figure(
                1, 1, (max(6.0, 1.1 * len(benches) * max(1, len(runs)) ** 0.5 + 2.5), 4.4)
            )
            x = np.arange(len(benches))
            labelled: set[str] = set()
            for i, r in enumerate(runs):
                pos = x - 0.4 + width * (i + 0.5)
                for j, b in enumerate(benches):
                    e = entries[r.name].get(b)
                    if e is None or e.headline is None:
                        continue
                    ax.bar(
                        pos[j],
                        e.headline,
                        width * 0.92,
                        color=self.colour[r.name],
                        label=r.name if r.name not in labelled else None,
                    )
                    labelled.add(r.name)
                    if e.members:
                        vals = list(e.members.values())
                        ax.scatter(np.full(len(vals), pos[j]), vals, s=9, color="black", zorder=3)
                    elif e.weakest is not None and e.best is not None:
                        ax.errorbar(
                            pos[j],
                            e.headline,
                            yerr=[[max(0.0, e.headline - e.weakest)], [max(0.0, e.best - e.headline)]],
                            color="black",
                            capsize=3,
                            lw=1,
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
                            val,
                            x[j] - 0.45,
                            x[j] + 0.45,
                            colors="black" if attr == "base" else "dimgrey",
                            linestyles=style,
                            lw=1.4,
                            label=(f"{attr} (from results.json)" if attr not in refs_drawn else None),
                        )
                        refs_drawn.add(attr)
            ax.set_axisbelow(True)
            ax.set_xticks(x, benches, rotation=20 if len(benches) > 5 else 0)
            ax.set_ylabel("score")
            ax.legend(loc="best")
            fig.suptitle("Evaluation: population mean per run (dots: members; whiskers: weakest..best)")
            return self.save(fig, "eval")


# -------------------------------------------------------------------------------------------- summary


def _pair(v: tuple[float, float] | None, sep: str) -> str:
    return "n/a" if v is None else f"{_fmt(v[0])}{sep}{_fmt(v[1])}"


def _headline(run: RunData) -> dict[str, str]:
    """Headline numbers of one run, in table-row order."""
    rows: dict[str, str] = {}
    rows["kind"] = run.kind
    rows["model"] = str(run.config.get("model", "n/a"))
    all_steps = {s for pts in run.scalars.values() for s, _ in pts}
    rows["last step"] = str(max(all_steps)) if all_steps else "n/a"
    rows["logged steps"] = str(len(all_steps))
    for label, tag in (
        ("student solve rate", "charts/student_solve_rate"),
        ("teacher reward", "charts/teacher_reward"),
        ("student reward", "charts/student_reward"),
        ("valid rate", "charts/valid_rate"),
    ):
        values = _series(run, tag)[1]
        if label == "valid rate" and len(values) == 0:  # fall back on the validity counts
            steps, counts = _validity(run)
            if "valid" in counts:
                total = sum(counts.values())
                values = counts["valid"][total > 0] / total[total > 0]
        rows[f"{label} (final / last-{LAST_N} mean)"] = _pair(_final_and_last_mean(values), " / ")
    osc = _oscillation(*_series(run, "charts/student_solve_rate"))
    rows[f"solve-rate oscillation (sign changes per {OSC_WINDOW} steps / amplitude, EMA {OSC_EMA})"] = (
        "n/a" if osc is None else f"{osc[0]:.2f} / {_fmt(osc[1])}"
    )
    edge = f"(first → last {EDGE_FRACTION:.0%} mean)"
    for label, tag in (
        ("AST depth", "programs/ast_depth"),
        ("cyclomatic complexity", "programs/cyclomatic"),
        ("lines of code", "programs/loc"),
        ("variables", "programs/variables"),
    ):
        rows[f"{label} {edge}"] = _pair(_first_last(_series(run, tag)[1]), " → ")
    for label, tag in (
        ("programs", "programs/coverage_programs"),
        ("signatures", "programs/coverage_signatures"),
    ):
        values = _series(run, tag)[1]
        rows[f"coverage: {label} (final)"] = _fmt(float(values[-1])) if len(values) else "n/a"
    for role in ("teacher", "student"):
        rows[f"entropy {role} {edge}"] = _pair(_first_last(_series(run, f"charts/entropy/{role}")[1]), " → ")
    for role in ("teacher", "student"):
        rows[f"response length {role} {edge}"] = _pair(
            _first_last(_series(run, f"charts/response_length/{role}")[1]), " → "
        )
    step_seconds = _series(run, "charts/step_seconds")[1]
    if len(step_seconds):
        rows["wall time per step, median (s)"] = _fmt(statistics.median(step_seconds.tolist()))
        rows["wall time, total"] = _fmt_duration(float(step_seconds.sum()))
    else:
        rows["wall time per step, median (s)"] = "n/a"
        rows["wall time, total"] = "n/a"
    members = _members(run)
    rows["members with ratings"] = str(len(members))
    finals = [(float(v[-1]), m) for m in members if len(v := _conservative(run, m)[1])]
    rows["best final μ − 3σ"] = f"{_fmt(max(finals)[0])} ({max(finals)[1]})" if finals else "n/a"
    counts, source = _operator_counts(run)
    if source == "none":
        rows["evolution events"] = "0"
    else:
        detail = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
        rows["evolution events"] = f"{sum(counts.values())} ({detail})"
    _, vcounts = _validity(run)
    if vcounts:
        total = sum(float(c.sum()) for c in vcounts.values())
        rejects = sorted(((float(c.sum()), r) for r, c in vcounts.items() if r != "valid"), reverse=True)
        rows["top rejection reasons (share of proposals)"] = (
            (", ".join(f"{r} {n / total:.1%}" for n, r in rejects[:3] if n > 0) or "none")
            if total > 0
            else "n/a"
        )
    else:
        rows["top rejection reasons (share of proposals)"] = "n/a"
    return rows


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def _eval_section(runs: Sequence[RunData], entries: dict[str, dict[str, _EvalEntry]]) -> list[str]:
    with_eval = [r for r in runs if entries.get(r.name)]
    if not with_eval:
        return ["No run has `eval/results.json`."]
    benches: list[str] = []
    for r in with_eval:
        benches += [b for b in entries[r.name] if b not in benches]

    def ref(b: str, attr: str) -> str:
        val = next(
            (
                getattr(entries[r.name][b], attr)
                for r in with_eval
                if b in entries[r.name] and getattr(entries[r.name][b], attr) is not None
            ),
            None,
        )
        return _fmt(val)

    def cell(e: _EvalEntry | None) -> str:
        if e is None or e.headline is None:
            return "n/a"
        spread = (
            f" [{_fmt(e.weakest)} – {_fmt(e.best)}]" if e.weakest is not None and e.best is not None else ""
        )
        return _fmt(e.headline) + spread

    header = ["benchmark"] + [r.name for r in with_eval] + ["base", "baseline (from results.json)"]
    rows = [
        [b] + [cell(entries[r.name].get(b)) for r in with_eval] + [ref(b, "base"), ref(b, "baseline")]
        for b in benches
    ]
    common = [
        b
        for b in benches
        if all(b in entries[r.name] and entries[r.name][b].headline is not None for r in with_eval)
    ]
    if common:
        agg = [f"**mean over {len(common)} common benchmark(s)**"]
        for r in with_eval:
            es = [entries[r.name][b] for b in common]
            mean = float(np.mean([e.headline for e in es]))
            names = set.intersection(*(set(e.members) for e in es))
            if names:  # per-member aggregate: the weakest member on aggregate, as in the paper's claim
                per_member = [float(np.mean([e.members[m] for e in es])) for m in names]
                spread = f" [{_fmt(min(per_member))} – {_fmt(max(per_member))}]"
            else:
                spread = ""
            agg.append(_fmt(mean) + spread)
        for attr in ("base", "baseline"):
            vals = [
                next(
                    (
                        getattr(entries[r.name][b], attr)
                        for r in with_eval
                        if getattr(entries[r.name][b], attr) is not None
                    ),
                    None,
                )
                for b in common
            ]
            agg.append(_fmt(float(np.mean(vals))) if all(v is not None for v in vals) else "n/a")
        rows.append(agg)
    lines = [
        "Cells: population mean [weakest member – best member]; on the aggregate row the bracket is the",
        "weakest / best member by its own mean over the common benchmarks.",
        "",
    ]
    return lines + _md_table(header, rows)


def _evolution_section(runs: Sequence[RunData]) -> list[str]:
    counts = {r.name: _operator_counts(r) for r in runs}
    if all(src == "none" for _, src in counts.values()):
        return ["No evolution events (no `lineage.jsonl` records or `evolution/replacements` in any run)."]
    ops = sorted({op for c, _ in counts.values() for op in c})
    rows = [[op] + [str(counts[r.name][0].get(op, 0)) for r in runs] for op in ops]
    rows.append(["**total**"] + [str(sum(counts[r.name][0].values())) for r in runs])
    rows.append(["source"] + [counts[r.name][1] for r in runs])
    lines = _md_table(["operator"] + [r.name for r in runs], rows)
    by_role = []
    for r in runs:
        roles = Counter(str(rec.get("role", "?")) for rec in r.lineage)
        if roles:
            by_role.append(f"{r.name}: " + ", ".join(f"{role} {n}" for role, n in sorted(roles.items())))
    if by_role:
        lines += ["", "By role: " + "; ".join(by_role) + "."]
    return lines


def _unique_names(runs: list[RunData]) -> None:
    seen: Counter[str] = Counter()
    for r in runs:
        seen[r.name] += 1
        if seen[r.name] > 1:
            r.notes.append(
                f"two runs are named {r.name!r}; the one in {r.path} is shown as {r.name} ({seen[r.name]})."
            )
            r.name = f"{r.name} ({seen[r.name]})"


# ----------------------------------------------------------------------------------------------- entry


def make_report(
    runs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    smoothing: float = 0.6,
    *,
    formats: Sequence[str] = ("png",),
    dpi: int = 110,
) -> Path:
    """Write the figures and ``summary.md`` comparing ``runs``; return the output directory.

    Args:
        runs: run directories (``runs/<name>``), at least one.
        out: output directory, created if needed; default ``<first run>/report``.
        smoothing: EMA weight for the smoothed curves, in [0, 1).
        formats: image formats; PNG is always written.
        dpi: image resolution.

    Raises:
        ValueError: no runs, or a smoothing weight outside [0, 1).
        NoEventsError: a run directory is missing or holds no event files (the message names it).
    """
    if not runs:
        raise ValueError("make_report needs at least one run directory")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    paths = [Path(r) for r in runs]
    data = [load_run(p) for p in paths]
    _unique_names(data)
    out_dir = Path(out) if out is not None else paths[0] / "report"
    out_dir.mkdir(parents=True, exist_ok=True)

    notes: list[str] = [n for r in data for n in r.notes]
    for r in data:
        if not r.scalars:
            notes.append(f"{r.name}: the event files hold no scalars yet (an early or partial run).")
    plot = _Plotter(data, out_dir, smoothing, formats, dpi)
    entries = {r.name: _eval_entries(r) for r in data}

    task_types = sorted(
        {t.split("/", 2)[2] for r in data for t in r.scalars if t.startswith("charts/valid_rate/")}
    )
    figures: list[tuple[str, str | None]] = [
        (
            "Student solve rate",
            plot.lines(
                "solve_rate",
                "Student solve rate",
                [("student solve rate", "charts/student_solve_rate")],
                1,
                notes,
            ),
        ),
        (
            "Teacher reward",
            plot.lines(
                "teacher_reward", "Teacher reward", [("teacher reward", "charts/teacher_reward")], 1, notes
            ),
        ),
        (
            "Student reward",
            plot.lines(
                "student_reward", "Student reward", [("student reward", "charts/student_reward")], 1, notes
            ),
        ),
        ("Ratings", plot.ratings(notes)),
        (
            "Valid rate",
            plot.lines(
                "valid_rate",
                "Proposal valid rate",
                [("all task types", "charts/valid_rate")]
                + [(tt, f"charts/valid_rate/{tt}") for tt in task_types],
                4,
                notes,
            ),
        ),
        ("Validity reasons", plot.validity(notes)),
        (
            "Program complexity",
            plot.lines(
                "complexity",
                "Program complexity (valid teacher programs)",
                [
                    ("AST depth", "programs/ast_depth"),
                    ("cyclomatic complexity", "programs/cyclomatic"),
                    ("lines of code", "programs/loc"),
                    ("variables", "programs/variables"),
                ],
                2,
                notes,
            ),
        ),
        (
            "Coverage",
            plot.lines(
                "coverage",
                "Problem-space coverage (cumulative distinct)",
                [("programs", "programs/coverage_programs"), ("signatures", "programs/coverage_signatures")],
                2,
                notes,
            ),
        ),
        (
            "Response length",
            plot.lines(
                "response_length",
                "Response length (tokens)",
                [
                    ("teacher", "charts/response_length/teacher"),
                    ("student", "charts/response_length/student"),
                ],
                2,
                notes,
            ),
        ),
        (
            "Entropy",
            plot.lines(
                "entropy",
                "Policy entropy (mean per token)",
                [("teacher", "charts/entropy/teacher"), ("student", "charts/entropy/student")],
                2,
                notes,
            ),
        ),
        (
            "Losses",
            plot.lines(
                "losses",
                "Policy update (means over members)",
                [
                    ("policy loss", "losses/policy_loss"),
                    ("grad norm", "losses/grad_norm"),
                    ("clip fraction", "losses/clip_frac"),
                    ("entropy (loss)", "losses/entropy"),
                    ("fraction of zero-std reward groups", "charts/frac_reward_zero_std"),
                ],
                3,
                notes,
            ),
        ),
        ("Time per phase", plot.timing(notes)),
        ("Evaluation", plot.evaluation(entries, notes)),
    ]

    heads = {r.name: _headline(r) for r in data}
    metrics = list(heads[data[0].name])
    lines = [
        "# PopuLoRA report",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} from {len(data)} run(s): "
        + ", ".join(f"`{r.name}` ({r.path})" for r in data)
        + ".",
        f"Curves: EMA smoothing {smoothing:g} (raw drawn faintly). Last-{LAST_N} mean = mean of the last "
        f"{LAST_N} logged values; first/last {EDGE_FRACTION:.0%} = means of the first/last {EDGE_FRACTION:.0%} "
        "of the logged points (at least one).",
        "",
        "## Runs",
        "",
        *_md_table(
            ["metric"] + [r.name for r in data], [[m] + [heads[r.name][m] for r in data] for m in metrics]
        ),
        "",
        "## Evaluation",
        "",
        *_eval_section(data, entries),
        "",
        "## Evolution events",
        "",
        *_evolution_section(data),
        "",
        "## Figures",
        "",
    ]
    for title, png in figures:
        if png is not None:
            lines += [f"### {title}", "", f"[![{title}]({png})]({png})", ""]
    lines += ["## Notes", ""]
    lines += [f"- {n}" for n in notes] if notes else ["- nothing missing: every figure was drawn."]
    summary = out_dir / "summary.md"
    tmp = out_dir / ".summary.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(summary)
    return out_dir


def run_report(cfg: ReportConfig) -> Path:
    """Entry point for ``populora report``: :func:`make_report` from a :class:`ReportConfig`."""
    return make_report(cfg.runs, cfg.out, cfg.smoothing, formats=cfg.formats, dpi=cfg.dpi)
