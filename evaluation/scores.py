"""Result summaries: ``<run>/eval/results.json``, ``<run>/eval/results.md`` and TensorBoard scalars.

Per benchmark the record is (the schema :mod:`evaluation.report` reads)::

    {"n": problems, "members": {member: pass@1}, "population_mean": x,
     "best": {"member": m, "score": x}, "weakest": {"member": m, "score": x},
     "headline": "students" | "members", "students": [member, ...] | null,
     "all_members": {"population_mean": x, "best": {...}, "weakest": {...}},
     "base": x | null,
     "baseline": {"score": mean, "run": dir, "members": {name: x}, "students": [...] | null} | null,
     "base_pass@1": {...same keys as scores, evalplus "base" tests only...},  # HumanEval+/MBPP+
     "avg@k": {"k": k, "temperature": t, "top_p": p, ...same keys as scores...}  # sampled benchmarks only
    }

**Headline rows are the students.** ``population_mean``, ``best`` and ``weakest`` are over the members that
train as solvers (the run's ``config.json`` mapping says which; teachers never train on answering), and
``all_members`` gives the same three over every member, teachers included (the secondary table). A run without
that mapping has every member as its headline (``"headline": "members"``). The baseline's score is the mean of
its students (its one adapter plays both roles).

Scores are greedy pass@1 (one greedy answer per problem: the fraction of problems solved). With k sampled
answers per problem, **avg@k** = (1/n) Σ_i c_i / k, where c_i of the k answers to problem i are correct: the
mean over problems of the per-problem success rate, an unbiased estimate of pass@1 under sampling with lower
variance than one sample on small sets such as AIME (30 problems) and AMC (40).

``results["aggregates"]`` (:func:`aggregate_rows`) holds the aggregate rows of AZR's tables (docs/azr.md §9)
computed from greedy pass@1, for every entry: **code average** = mean over the evaluated AZR code benchmarks
(HumanEval+, MBPP+; LiveCodeBench has no offline copy), **math average** = mean over the evaluated AZR math
benchmarks (AIME 24, AIME 25, AMC 23, MATH-500, Minerva, OlympiadBench), **overall** = (code average + math
average) / 2 (AZR's AVG). HumanEval and GSM8K are not in AZR's tables and stay out. Each row has the same keys
as a benchmark record plus ``benchmarks`` (those averaged), ``missing`` (AZR's benchmarks that were not) and
``vs_baseline`` (weakest member, population mean and best member minus the baseline's score on that row).

TensorBoard tags (written into the run directory, read back by the report): ``eval/<benchmark>/<member>``,
``eval/<benchmark>/population_mean``, ``eval/<benchmark>/best``, ``eval/<benchmark>/weakest``,
``eval/<benchmark>/base``, ``eval/<benchmark>/baseline/<member>``, and with students as the headline
``eval/<benchmark>/all_members/{population_mean,best,weakest}``; the same under
``eval/<benchmark>/avg@<k>/...`` for avg@k and ``eval/aggregate/<row>/...`` for the aggregate rows.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from selfplay.rundir import EVAL, EVAL_RESULTS, RunDir, write_text_atomic


def _spread(scores: Mapping[str, float]) -> dict[str, Any]:
    """``population_mean``, ``best`` and ``weakest`` of ``scores`` (ties go to the name: best is the max, weakest
    the min of ``(score, name)``); ``None`` each when empty."""
    if not scores:
        return {"population_mean": None, "best": None, "weakest": None}
    best = max(scores, key=lambda m: (scores[m], m))
    weakest = min(scores, key=lambda m: (scores[m], m))
    return {"population_mean": statistics.fmean(scores.values()), "best": {"member": best, "score": scores[best]},
            "weakest": {"member": weakest, "score": scores[weakest]}}


def summarize_benchmark(
    n: int,
    members: Mapping[str, float],
    base: float | None = None,
    baseline: Mapping[str, float] | None = None,
    baseline_run: str | None = None,
    students: Sequence[str] | None = None,
    baseline_students: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The per-benchmark record (see the module docstring) from pass@1 per member, base and baseline.

    ``students``: the members that train as solvers; when given (and any is scored) the headline rows
    (``population_mean``, ``best``, ``weakest``) are over them only (``"headline": "students"``) and
    ``all_members`` holds the same three over every member; otherwise the headline is every member
    (``"headline": "members"``). ``baseline_students`` does the same for the baseline's score."""
    rec: dict[str, Any] = {"n": n, "members": dict(members)}
    chosen = [m for m in (students or ()) if m in members]
    if chosen:
        rec.update(_spread({m: members[m] for m in chosen}))
        rec["headline"], rec["students"] = "students", chosen
    else:
        rec.update(_spread(members))
        rec["headline"], rec["students"] = "members", None
    rec["all_members"] = _spread(members)
    rec["base"] = base
    if baseline:
        counted = [m for m in (baseline_students or ()) if m in baseline] or list(baseline)
        rec["baseline"] = {
            "score": statistics.fmean(baseline[m] for m in counted),
            "run": baseline_run,
            "members": dict(baseline),
            "students": [m for m in (baseline_students or ()) if m in baseline] or None,
        }
    else:
        rec["baseline"] = None
    return rec


AZR_CODE_BENCHMARKS = ("humaneval+", "mbpp+", "livecodebench")
"""The code benchmarks of AZR's tables (their mean is the code average)."""
AZR_MATH_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
"""The math benchmarks of AZR's tables (their mean is the math average)."""
AGGREGATE_ROWS = ("code", "math", "overall")


def _entry_scores(rec: Mapping[str, Any]) -> tuple[dict[str, float], float | None, dict[str, float]]:
    """(members, base, baseline members) of one benchmark record."""
    baseline = rec.get("baseline") or {}
    return dict(rec.get("members") or {}), rec.get("base"), dict(baseline.get("members") or {})


def _mean_over(values: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the dicts; keys missing from any dict are dropped (an entry not scored on every
    averaged benchmark has no average)."""
    if not values:
        return {}
    keys = set(values[0]).intersection(*values[1:])
    return {k: statistics.fmean(v[k] for v in values) for k in sorted(keys)}


def aggregate_rows(benchmarks: Mapping[str, Mapping[str, Any]], baseline_run: str | None = None) -> dict[str, Any]:
    """AZR's aggregate rows (code, math, overall) from per-benchmark records (see the module docstring);
    a row is ``None`` when none of its benchmarks was evaluated (overall: unless both averages exist)."""
    rows: dict[str, Any] = {}
    per_family: dict[str, tuple[dict[str, float], dict[str, float], dict[str, float]] | None] = {}
    for row, family in (("code", AZR_CODE_BENCHMARKS), ("math", AZR_MATH_BENCHMARKS)):
        included = [b for b in family if b in benchmarks]
        if not included:
            rows[row] = None
            per_family[row] = None
            continue
        scored = [_entry_scores(benchmarks[b]) for b in included]
        members = _mean_over([m for m, _, _ in scored])
        bases = [b for _, b, _ in scored]
        base = {"base": statistics.fmean(bases)} if all(b is not None for b in bases) else {}
        baseline = _mean_over([bl for _, _, bl in scored])
        per_family[row] = (members, base, baseline)
        rows[row] = _row(members, base, baseline, baseline_run, included, [b for b in family if b not in benchmarks],
                         *_students_of(benchmarks[included[0]]))
    code, math_ = per_family["code"], per_family["math"]
    if code is None or math_ is None:
        rows["overall"] = None
    else:
        both = [_mean_over([c, m]) for c, m in zip(code, math_, strict=True)]
        rows["overall"] = _row(
            both[0], both[1], both[2], baseline_run,
            rows["code"]["benchmarks"] + rows["math"]["benchmarks"], rows["code"]["missing"] + rows["math"]["missing"],
            *_students_of(benchmarks[rows["code"]["benchmarks"][0]]),
        )
    return rows


def _students_of(rec: Mapping[str, Any]) -> tuple[list[str] | None, list[str] | None]:
    """The students of a benchmark record and of its baseline (``None`` when not known)."""
    return rec.get("students"), (rec.get("baseline") or {}).get("students")


def _row(members: dict[str, float], base: dict[str, float], baseline: dict[str, float],
         baseline_run: str | None, included: list[str], missing: list[str],
         students: list[str] | None = None, baseline_students: list[str] | None = None) -> dict[str, Any]:
    rec = summarize_benchmark(len(included), members, base.get("base"), baseline, baseline_run, students,
                              baseline_students)
    rec["n"] = None  # an average of benchmarks, not a problem count
    rec["benchmarks"], rec["missing"] = list(included), list(missing)
    vs: dict[str, float | None] = {"weakest": None, "population_mean": None, "best": None}
    if rec["baseline"] and members:
        reference = rec["baseline"]["score"]
        vs = {"weakest": rec["weakest"]["score"] - reference, "population_mean": rec["population_mean"] - reference,
              "best": rec["best"]["score"] - reference}
    rec["vs_baseline"] = vs
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
    heads = {rec.get("headline", "members") for rec in benches.values()}
    who = "students" if heads == {"students"} else "members"
    if who == "students":
        lines += ["Population rows are over the **students** (the members that train as solvers); every member, "
                  "teachers included, is in the second table.", ""]
    lines += [
        f"| benchmark | n | {who}: mean | best | weakest | base | baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for bench, rec in benches.items():
        lines.append(f"| {bench} | {rec.get('n')} | {_summary_cells(rec)} |")
    if who == "students":
        lines += ["", "## All members (teachers included; greedy pass@1, %)", "",
                  "| benchmark | n | all members: mean | best | weakest |", "|---|---|---|---|---|"]
        for bench, rec in benches.items():
            spread = rec.get("all_members") or {}
            lines.append(f"| {bench} | {rec.get('n')} | {_spread_cells(spread)} |")
    sampled = {b: r["avg@k"] for b, r in benches.items() if r.get("avg@k")}
    if sampled:
        first = next(iter(sampled.values()))
        lines += ["", f"## avg@k over sampled answers (%; temperature {first.get('temperature')}, top-p "
                  f"{first.get('top_p')})", "",
                  "| benchmark | k | population mean | best | weakest | base | baseline | greedy population mean |",
                  "|---|---|---|---|---|---|---|---|"]
        for bench, rec in sampled.items():
            greedy = _pct(benches[bench].get("population_mean"))
            lines.append(f"| {bench} | {rec.get('k')} | {_summary_cells(rec)} | {greedy} |")
    aggregates = results.get("aggregates") or {}
    if any(aggregates.get(row) for row in AGGREGATE_ROWS):
        lines += ["", "## AZR's aggregate rows (greedy pass@1, %)", ""] + _aggregate_tables(aggregates)
    for bench, rec in benches.items():
        lines += ["", f"## {bench}", ""] + _entry_table(rec)
    if results.get("failed_reference"):
        lines += ["", "Canonical solutions that failed in the sandbox (counted as failures for every model):"]
        for bench, ids in results["failed_reference"].items():
            lines.append(f"- {bench}: {', '.join(ids)}")
    return "\n".join(lines) + "\n"


def _spread_cells(rec: Mapping[str, Any]) -> str:
    """``mean | best | weakest`` cells."""
    best, weakest = rec.get("best"), rec.get("weakest")
    best_s = f"{_pct(best['score'])} ({best['member']})" if best else "–"
    weakest_s = f"{_pct(weakest['score'])} ({weakest['member']})" if weakest else "–"
    return f"{_pct(rec.get('population_mean'))} | {best_s} | {weakest_s}"


def _summary_cells(rec: Mapping[str, Any]) -> str:
    """``population mean | best | weakest | base | baseline`` cells of a record."""
    best, weakest, baseline = rec.get("best"), rec.get("weakest"), rec.get("baseline")
    best_s = f"{_pct(best['score'])} ({best['member']})" if best else "–"
    weakest_s = f"{_pct(weakest['score'])} ({weakest['member']})" if weakest else "–"
    baseline_s = _pct(baseline["score"]) if baseline else "–"
    return f"{_pct(rec.get('population_mean'))} | {best_s} | {weakest_s} | {_pct(rec.get('base'))} | {baseline_s}"


def _signed(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def _aggregate_tables(aggregates: Mapping[str, Any]) -> list[str]:
    """The aggregate rows, then every entry's code / math / overall averages."""
    rows = {r: aggregates[r] for r in AGGREGATE_ROWS if aggregates.get(r)}
    lines = ["| row | population mean | best | weakest | base | baseline | weakest − baseline | averaged over |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rec in rows.items():
        missing = f" (missing: {', '.join(rec['missing'])})" if rec.get("missing") else ""
        lines.append(f"| {name} | {_summary_cells(rec)} | {_signed(rec['vs_baseline']['weakest'])} "
                     f"| {', '.join(rec['benchmarks'])}{missing} |")
    lines += ["", "| entry | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    labels: dict[str, dict[str, float | None]] = {}
    for name, rec in rows.items():
        for member, score in rec.get("members", {}).items():
            labels.setdefault(member, {})[name] = score
        if rec.get("base") is not None:
            labels.setdefault("base model", {})[name] = rec["base"]
        for member, score in ((rec.get("baseline") or {}).get("members") or {}).items():
            labels.setdefault(f"baseline `{member}`", {})[name] = score
    for label, values in labels.items():
        lines.append(f"| {label} | " + " | ".join(_pct(values.get(r)) for r in rows) + " |")
    return lines


def _entry_table(rec: Mapping[str, Any]) -> list[str]:
    with_base = "base_pass@1" in rec
    extra = rec.get("base_pass@1") or {}
    sampled = rec.get("avg@k") or {}
    avg_head = f" avg@{sampled.get('k')} (%) |" if sampled else ""
    lines = [
        "| entry | pass@1 (%) |" + (" base tests only (%) |" if with_base else "") + avg_head,
        "|---|---|" + ("---|" if with_base else "") + ("---|" if sampled else ""),
    ]

    def row(label: str, value: float | None, base_value: float | None, avg_value: float | None) -> str:
        cell = f" {_pct(base_value)} |" if with_base else ""
        cell += f" {_pct(avg_value)} |" if sampled else ""
        return f"| {label} | {_pct(value)} |{cell}"

    extra_members = extra.get("members", {})
    avg_members = sampled.get("members", {})
    students = set(rec.get("students") or ())
    for member, score in rec.get("members", {}).items():
        label = f"{member} (student)" if member in students else member
        lines.append(row(label, score, extra_members.get(member), avg_members.get(member)))
    if rec.get("members"):
        who = "students" if students else "population"
        lines.append(row(f"**{who} mean**", rec.get("population_mean"), extra.get("population_mean"),
                         sampled.get("population_mean")))
    if rec.get("base") is not None:
        lines.append(row("base model", rec["base"], extra.get("base"), sampled.get("base")))
    baseline = rec.get("baseline")
    if baseline:
        extra_bl = (extra.get("baseline") or {}).get("members", {})
        avg_bl = (sampled.get("baseline") or {}).get("members", {})
        for member, score in baseline["members"].items():
            lines.append(row(f"baseline `{member}`", score, extra_bl.get(member), avg_bl.get(member)))
    return lines


def _record_scalars(prefix: str, rec: Mapping[str, Any], out: dict[str, float]) -> None:
    for member, score in rec.get("members", {}).items():
        out[f"{prefix}/{member}"] = float(score)
    for key in ("population_mean", "base"):
        if rec.get(key) is not None:
            out[f"{prefix}/{key}"] = float(rec[key])
    for key in ("best", "weakest"):
        if rec.get(key):
            out[f"{prefix}/{key}"] = float(rec[key]["score"])
    if rec.get("headline") == "students":
        spread = rec.get("all_members") or {}
        if spread.get("population_mean") is not None:
            out[f"{prefix}/all_members/population_mean"] = float(spread["population_mean"])
        for key in ("best", "weakest"):
            if spread.get(key):
                out[f"{prefix}/all_members/{key}"] = float(spread[key]["score"])
    if rec.get("baseline"):
        for member, score in rec["baseline"]["members"].items():
            out[f"{prefix}/baseline/{member}"] = float(score)


def tensorboard_scalars(results: Mapping[str, Any]) -> dict[str, float]:
    """Tag -> value of every eval scalar (see the module docstring)."""
    out: dict[str, float] = {}
    for bench, rec in results.get("benchmarks", {}).items():
        _record_scalars(f"eval/{bench}", rec, out)
        if rec.get("avg@k"):
            _record_scalars(f"eval/{bench}/avg@{rec['avg@k']['k']}", rec["avg@k"], out)
    for row, rec in (results.get("aggregates") or {}).items():
        if isinstance(rec, Mapping):
            _record_scalars(f"eval/aggregate/{row}", rec, out)
    return out


def write_results(
    results: Mapping[str, Any],
    run_dir: str | Path,
    step: int = 0,
    tensorboard: bool = True,
    out_dir: str | Path | None = None,
) -> Path:
    """Write ``results.json`` and ``results.md`` into ``out_dir`` (default ``<run_dir>/eval``, a real directory
    inside the run) and the scalars to TensorBoard events in ``run_dir``. Each file is replaced atomically (a link
    planted at its name is replaced, not written through). Returns the output directory."""
    out = Path(out_dir) if out_dir is not None else RunDir(run_dir).subdir(EVAL)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / EVAL_RESULTS, json.dumps(results, indent=2, sort_keys=False) + "\n", sync=False)
    write_text_atomic(out / "results.md", markdown_tables(results), sync=False)
    if tensorboard:
        from selfplay.logger import tensorboard_writer

        writer = tensorboard_writer(run_dir)
        try:
            for tag, value in tensorboard_scalars(results).items():
                writer.add_scalar(tag, value, global_step=step)
        finally:
            writer.close()
    return out
