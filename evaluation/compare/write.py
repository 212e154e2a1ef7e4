"""``compare.md``, ``compare.json`` and the figures of a comparison (matplotlib ``Figure`` on the Agg canvas, as
:mod:`evaluation.report.plots`: no pyplot, no change to the process-wide backend)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evaluation.compare.rundirs import METRIC_LABELS
from evaluation.compare.summary import REFERENCE, TREATMENT
from selfplay.rundir import SUMMARY

COLOURS = ("tab:blue", "tab:orange")
"""The treatment's and the reference's colours."""


def _pair(result: dict[str, Any]) -> tuple[str, str]:
    """``(treatment, reference)`` of a comparison (population and baseline unless it names others)."""
    return result.get("treatment", TREATMENT), result.get("reference", REFERENCE)


def _colour(result: dict[str, Any], arm: str) -> str | None:
    pair = _pair(result)
    return COLOURS[pair.index(arm)] if arm in pair else None


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _ci(e: dict[str, Any] | None, pct: bool = False) -> str:
    if not e:
        return "-"
    f = 100.0 if pct else 1.0
    fmt = "{:.1f}" if pct else "{:.3f}"
    return f"{fmt.format(e['point'] * f)} [{fmt.format(e['low'] * f)}, {fmt.format(e['high'] * f)}]"


def _verdict(block: dict[str, Any], pair: tuple[str, str] = (TREATMENT, REFERENCE)) -> str:
    d = block.get("difference")
    if not d:
        return "-"
    if min(d["runs"]) < 2:
        return "too few seeds"
    if d["low"] > 0:
        return f"{pair[0]} higher"
    if d["high"] < 0:
        return f"{pair[1]} higher"
    return "intervals overlap 0"


def _table(rows: list[tuple[str, dict[str, Any]]], arms: list[str], pct: bool = False,
           pair: tuple[str, str] = (TREATMENT, REFERENCE)) -> list[str]:
    treatment, reference = pair
    head = ["what"] + [f"{a} mean" for a in arms] + [f"{a} IQM" for a in arms] + \
        [f"{treatment} − {reference}", f"P({treatment} > {reference})", "reading"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, block in rows:
        a = block["arms"]
        cells = [label] + [_ci(a.get(x, {}).get("mean"), pct) + (f" n={len(a[x]['runs'])}" if x in a else "")
                           for x in arms]
        cells += [_ci(a.get(x, {}).get("iqm"), pct) for x in arms]
        cells += [_ci(block.get("difference"), pct), _ci(block.get("probability_of_improvement")),
                  _verdict(block, pair)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _seed_count(result: dict[str, Any], arms: list[str]) -> str:
    """``"3 seeds"``, or ``"2-3 seeds"`` when the arms have different numbers of runs."""
    counts = sorted({len(result["runs"][a]) for a in arms}) or [0]
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{n} seed{'' if n == '1' else 's'}"


def render_markdown(result: dict[str, Any], figures: list[str]) -> str:
    """``compare.md``: the runs, one table per block (mean and IQM per arm with 95 % intervals, difference and
    probability of improvement), the figures and the notes."""
    pair = _pair(result)
    arms = [a for a in pair if a in result["runs"]] + sorted(a for a in result["runs"] if a not in pair)
    s = result["settings"]
    conf = int(round(100 * s["confidence"]))
    title = "Population vs single agent" if pair == (TREATMENT, REFERENCE) else f"{pair[0]} vs {pair[1]}"
    lines = [f"# {title} over seeds", "",
             f"Written {result['created']}. Each cell: estimate [{conf} % stratified-bootstrap interval], "
             f"{s['reps']} replicates, bootstrap seed {s['bootstrap_seed']}; n = runs (seeds). `final` = a run's "
             f"mean over its last k = min({s['tail']}, steps // 2) logged steps; `gain` = final minus the mean of "
             "its first k. Reading: the difference's interval above 0, below 0, or overlapping it "
             "(estimators: evaluation/stats.py). A percentile-bootstrap interval never leaves the range of the "
             f"seeds' own values: with {_seed_count(result, arms)} per arm it understates the uncertainty.", "",
             "## Runs", ""]
    for arm in arms:
        rs = result["runs"][arm]
        lines.append(f"- **{arm}** ({len(rs)}): " + ", ".join(
            f"`{Path(r['path']).name}` (seed {r['seed']}, {r['steps']} steps)" for r in rs))
    for path, why in result["excluded"].items():
        lines.append(f"- excluded `{path}`: {why}")
    if result["launched"]:
        lines.append(f"- launched or resumed by this call: {', '.join(result['launched'])}")
    lines += ["", f"## Training metrics ({SUMMARY} history)", ""]
    rows = []
    for metric, blocks in result["metrics"].items():
        label = METRIC_LABELS.get(metric, metric)
        rows += [(f"{label}: final", blocks["final"]), (f"{label}: gain", blocks["gain"])]
    quiet = result.get("no_signal") or {}
    lines += _table(rows, arms, pair=pair) if rows else [
        "No metric varied over the runs: none carries a signal." if quiet else "No complete run logged a history."]
    if quiet:
        lines += ["", "No signal (the same value at every logged step of every run: no interval, no probability "
                  "of improvement):", ""]
        lines += [f"- {METRIC_LABELS.get(m, m)}: {q['value']:g} in all {q['runs']} runs — carries no signal"
                  for m, q in quiet.items()]
    ev = result.get("eval")
    if ev:
        lines += ["", f"## Benchmarks (populora eval; a run's score: `{s['eval_score']}`, pass@1 in %)", ""]
        rows = [(k, b) for k, b in ev["benchmarks"].items()]
        if ev.get("aggregate"):
            rows.append((f"aggregate over {', '.join(ev['aggregate']['benchmarks'])}", ev["aggregate"]))
        lines += _table(rows, arms, pct=True, pair=pair)
        lines += ["", "Probability of improvement is a probability (0-1), not a percentage."]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _figure(rows: int, cols: int, size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def plot_curves(result: dict[str, Any], out: Path) -> str | None:
    """``curves.png``: per metric, each arm's mean over seeds per step with its interval band."""
    metrics = list(result["curves"])
    if not metrics:
        return None
    cols = min(3, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = _figure(rows, cols, (4.2 * cols, 3.0 * rows))
    for i, metric in enumerate(metrics):
        ax = axes[i // cols][i % cols]
        for arm, c in result["curves"][metric].items():
            if not c["steps"]:
                continue
            colour = _colour(result, arm)
            n = max(c["runs"])
            ax.plot(c["steps"], c["mean"], marker=".", color=colour, label=f"{arm} (n={n})")
            ax.fill_between(c["steps"], c["low"], c["high"], color=colour, alpha=0.2, linewidth=0)
        ax.set_title(METRIC_LABELS.get(metric, metric))
        ax.set_xlabel("step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    for j in range(len(metrics), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.savefig(out / "curves.png", dpi=110)
    return "curves.png"


def _interval_panel(ax: Any, result: dict[str, Any], rows: list[tuple[str, dict[str, Any]]], title: str,
                    scale: float = 1.0) -> None:
    treatment, reference = _pair(result)
    arms = sorted({a for _, b in rows for a in b["arms"]}, key=lambda a: (a != treatment, a != reference, a))
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        xs, ys, lo, hi = [], [], [], []
        for i, (_, b) in enumerate(rows):
            e = b["arms"].get(arm, {}).get("mean")
            if e:
                xs.append(i + (k - (len(arms) - 1) / 2) * width)
                ys.append(e["point"] * scale)
                lo.append((e["point"] - e["low"]) * scale)
                hi.append((e["high"] - e["point"]) * scale)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, color=_colour(result, arm), label=arm)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)


def plot_final(result: dict[str, Any], out: Path) -> str | None:
    """``final.png``: per metric, each arm's mean final value over seeds with its interval, and the
    difference population - baseline with its interval."""
    metrics = list(result["metrics"])
    if not metrics:
        return None
    fig, axes = _figure(1, 2, (10, 3.6))
    _interval_panel(axes[0][0], result, [(METRIC_LABELS.get(m, m), result["metrics"][m]["final"]) for m in metrics],
                    "final value per arm (mean over seeds)")
    ax = axes[0][1]
    diffs = [(METRIC_LABELS.get(m, m), result["metrics"][m]["final"].get("difference")) for m in metrics]
    diffs = [(lab, d) for lab, d in diffs if d]
    if diffs:
        ax.errorbar(range(len(diffs)), [d["point"] for _, d in diffs],
                    yerr=[[d["point"] - d["low"] for _, d in diffs], [d["high"] - d["point"] for _, d in diffs]],
                    fmt="o", capsize=3, color="black")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(diffs)), [lab for lab, _ in diffs], rotation=30, ha="right", fontsize=7)
    ax.set_title("{} − {} (final)".format(*_pair(result)))
    ax.grid(alpha=0.3)
    fig.savefig(out / "final.png", dpi=110)
    return "final.png"


def plot_eval(result: dict[str, Any], out: Path) -> str | None:
    """``eval.png``: per benchmark (and the aggregate), each arm's mean score over seeds with its interval."""
    ev = result.get("eval")
    if not ev:
        return None
    rows = list(ev["benchmarks"].items())
    if ev.get("aggregate"):
        rows.append(("aggregate", ev["aggregate"]))
    fig, axes = _figure(1, 1, (max(5.0, 0.9 * len(rows) + 2), 3.6))
    _interval_panel(axes[0][0], result, rows, "pass@1 (%) per arm, mean over seeds", scale=100.0)
    fig.savefig(out / "eval.png", dpi=110)
    return "eval.png"


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    """Write ``compare.json``, the figures and ``compare.md`` into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    figures = [f for f in (plot_curves(result, out), plot_final(result, out), plot_eval(result, out)) if f]
    _write_text(out / "compare.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
    _write_text(out / "compare.md", render_markdown(result, figures))
    return [out / "compare.json", out / "compare.md"] + [out / f for f in figures]
