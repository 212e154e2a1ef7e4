"""Result summaries: ``<run>/eval/results.json``, ``<run>/eval/results.md`` and TensorBoard scalars.

Per benchmark the record is (the schema :mod:`evaluation.report` reads)::

    {"n": problems, "members": {member: pass@1}, "population_mean": x,
     "best": {"member": m, "score": x}, "weakest": {"member": m, "score": x},
     "base": x | null, "baseline": {"score": mean, "run": dir, "members": {name: x}} | null,
     "base_pass@1": {...same keys as scores, evalplus "base" tests only...}  # HumanEval+/MBPP+
    }

TensorBoard tags (written into the run directory, read back by the report): ``eval/<benchmark>/<member>``,
``eval/<benchmark>/population_mean``, ``eval/<benchmark>/best``, ``eval/<benchmark>/weakest``,
``eval/<benchmark>/base``, ``eval/<benchmark>/baseline/<member>``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def summarize_benchmark(
    n: int,
    members: Mapping[str, float],
    base: float | None = None,
    baseline: Mapping[str, float] | None = None,
    baseline_run: str | None = None,
) -> dict[str, Any]:
    """The per-benchmark record (see the module docstring) from pass@1 per member, base and baseline."""
    rec: dict[str, Any] = {"n": n, "members": dict(members)}
    if members:
        best = max(members, key=lambda m: (members[m], m))
        weakest = min(members, key=lambda m: (members[m], m))
        rec["population_mean"] = statistics.fmean(members.values())
        rec["best"] = {"member": best, "score": members[best]}
        rec["weakest"] = {"member": weakest, "score": members[weakest]}
    else:
        rec["population_mean"] = rec["best"] = rec["weakest"] = None
    rec["base"] = base
    if baseline:
        rec["baseline"] = {
            "score": statistics.fmean(baseline.values()),
            "run": baseline_run,
            "members": dict(baseline),
        }
    else:
        rec["baseline"] = None
    return rec


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown_tables(results: Mapping[str, Any]) -> str:
    """A summary table (one row per benchmark) and one table per benchmark listing every entry."""
    benches: Mapping[str, Any] = results.get("benchmarks", {})
    lines = [f"# Evaluation of {results.get('run', '?')}", ""]
    meta = [f"model `{results.get('model')}`", "greedy pass@1 (%)"]
    if results.get("limit"):
        meta.append(f"first {results['limit']} problems per benchmark")
    if results.get("complete") is False:
        meta.append("**partial** (the evaluation is still running or was stopped)")
    lines += [", ".join(meta), ""]
    lines += [
        "| benchmark | n | population mean | best | weakest | base | baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for bench, rec in benches.items():
        best, weakest, baseline = rec.get("best"), rec.get("weakest"), rec.get("baseline")
        best_s = f"{_pct(best['score'])} ({best['member']})" if best else "–"
        weakest_s = f"{_pct(weakest['score'])} ({weakest['member']})" if weakest else "–"
        baseline_s = _pct(baseline["score"]) if baseline else "–"
        lines.append(
            f"| {bench} | {rec.get('n')} | {_pct(rec.get('population_mean'))} | {best_s} | {weakest_s} "
            f"| {_pct(rec.get('base'))} | {baseline_s} |"
        )
    for bench, rec in benches.items():
        lines += ["", f"## {bench}", ""] + _entry_table(rec)
    if results.get("failed_reference"):
        lines += ["", "Canonical solutions that failed in the sandbox (counted as failures for every model):"]
        for bench, ids in results["failed_reference"].items():
            lines.append(f"- {bench}: {', '.join(ids)}")
    return "\n".join(lines) + "\n"


def _entry_table(rec: Mapping[str, Any]) -> list[str]:
    with_base = "base_pass@1" in rec
    extra = rec.get("base_pass@1") or {}
    lines = [
        "| entry | pass@1 (%) |" + (" base tests only (%) |" if with_base else ""),
        "|---|---|" + ("---|" if with_base else ""),
    ]

    def row(label: str, value: float | None, base_value: float | None) -> str:
        cell = f" {_pct(base_value)} |" if with_base else ""
        return f"| {label} | {_pct(value)} |{cell}"

    extra_members = extra.get("members", {})
    for member, score in rec.get("members", {}).items():
        lines.append(row(member, score, extra_members.get(member)))
    if rec.get("members"):
        lines.append(row("**population mean**", rec.get("population_mean"), extra.get("population_mean")))
    if rec.get("base") is not None:
        lines.append(row("base model", rec["base"], extra.get("base")))
    baseline = rec.get("baseline")
    if baseline:
        extra_bl = (extra.get("baseline") or {}).get("members", {})
        for member, score in baseline["members"].items():
            lines.append(row(f"baseline `{member}`", score, extra_bl.get(member)))
    return lines


def tensorboard_scalars(results: Mapping[str, Any]) -> dict[str, float]:
    """Tag -> value of every eval scalar (see the module docstring)."""
    out: dict[str, float] = {}
    for bench, rec in results.get("benchmarks", {}).items():
        for member, score in rec.get("members", {}).items():
            out[f"eval/{bench}/{member}"] = float(score)
        for key in ("population_mean", "base"):
            if rec.get(key) is not None:
                out[f"eval/{bench}/{key}"] = float(rec[key])
        for key in ("best", "weakest"):
            if rec.get(key):
                out[f"eval/{bench}/{key}"] = float(rec[key]["score"])
        if rec.get("baseline"):
            for member, score in rec["baseline"]["members"].items():
                out[f"eval/{bench}/baseline/{member}"] = float(score)
    return out


def write_results(
    results: Mapping[str, Any],
    run_dir: str | Path,
    step: int = 0,
    tensorboard: bool = True,
    out_dir: str | Path | None = None,
) -> Path:
    """Write ``results.json`` and ``results.md`` into ``out_dir`` (default ``<run_dir>/eval``) and the scalars
    to TensorBoard events in ``run_dir``. Returns the output directory."""
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    tmp.replace(out / "results.json")
    (out / "results.md").write_text(markdown_tables(results))
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir))
        try:
            for tag, value in tensorboard_scalars(results).items():
                writer.add_scalar(tag, value, global_step=step)
        finally:
            writer.close()
    return out
