"""The text of ``summary.md``: headline numbers per run, evaluation, evolution and retention tables, the
teacher × student matrices, tampering (when any), links to the figures and the notes on what could not be drawn."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from evaluation.report import numerics as nx
from evaluation.report.loading import RunData
from evaluation.report.tamper import tamper_section
from selfplay import tags
from selfplay.rundir import CONFIG_HISTORY, LINEAGE

HEADLINE_RATES = (
    ("student solve rate on matched tasks", tags.SOLVE_RATE),
    ("filler solve rate", tags.FILLER_SOLVE_RATE),
    ("student format rate", tags.STUDENT_FORMAT_RATE),
    ("teacher reward", tags.TEACHER_REWARD),
    ("student reward", tags.STUDENT_REWARD),
    ("valid rate", tags.VALID_RATE),
)
COMPLEXITY_LABELS = {
    "ast_depth": "AST depth",
    "cyclomatic": "cyclomatic complexity",
    "loc": "lines of code",
    "variables": "variables",
}
COVERAGE_LABELS = {"coverage_programs": "programs", "coverage_signatures": "signatures"}


def headline(run: RunData) -> dict[str, str]:
    """Headline numbers of one run, in table-row order."""
    rows: dict[str, str] = {}
    rows["arm"] = run.arm
    rows["model"] = str(run.config.get("model", "n/a"))
    all_steps = {s for pts in run.scalars.values() for s, _ in pts}
    rows["last step"] = str(max(all_steps)) if all_steps else "n/a"
    rows["logged steps"] = str(len(all_steps))
    for label, tag in HEADLINE_RATES:
        steps, values = nx.series(run, tag)
        if tag == tags.VALID_RATE and len(values) == 0:  # fall back on the validity counts
            _, counts = nx.validity(run)
            if "valid" in counts:
                total = sum(counts.values())
                values = counts["valid"][total > 0] / total[total > 0]
                steps = []
        text = nx.pair_str(nx.final_and_last_mean(values), " / ")
        if len(steps) and all_steps and int(steps[-1]) < max(all_steps):  # e.g. no valid task in the last steps
            text += f" (final from step {int(steps[-1])}: none logged after it)"
        rows[f"{label} (final / last-{nx.LAST_N} mean)"] = text
    osc = nx.oscillation(*nx.series(run, tags.SOLVE_RATE))
    rows[f"solve-rate oscillation (sign changes per {nx.OSC_WINDOW} steps / amplitude, EMA {nx.OSC_EMA})"] = (
        "n/a" if osc is None else f"{osc[0]:.2f} / {nx.fmt(osc[1])}"
    )
    edge = f"(first → last {nx.EDGE_FRACTION:.0%} mean)"
    for key, label in COMPLEXITY_LABELS.items():
        rows[f"{label} {edge}"] = nx.pair_str(nx.first_last(nx.series(run, tags.program(key))[1]), " → ")
    for key, label in COVERAGE_LABELS.items():
        values = nx.series(run, tags.program(key))[1]
        rows[f"coverage: {label} (final)"] = nx.fmt(float(values[-1])) if len(values) else "n/a"
    for what, tag_of in (("entropy", tags.entropy), ("response length", tags.response_length)):
        for role in tags.ROLES:
            alias = "proposer" if role == "teacher" else "solver"  # the single-member baseline's two roles
            rows[f"{what} {role} / {alias} {edge}"] = nx.pair_str(
                nx.first_last(nx.series(run, tag_of(role))[1]), " → "
            )
    step_seconds = nx.series(run, tags.STEP_SECONDS)[1]
    if len(step_seconds):
        rows["wall time per step, median (s)"] = nx.fmt(statistics.median(step_seconds.tolist()))
        rows["wall time, total"] = nx.fmt_duration(float(step_seconds.sum()))
    else:
        rows["wall time per step, median (s)"] = "n/a"
        rows["wall time, total"] = "n/a"
    names = nx.members(run)
    rows["members with ratings"] = str(len(names))
    finals = [(float(v[-1]), m) for m in names if len(v := nx.conservative(run, m)[1])]
    rows["best final μ − 3σ"] = f"{nx.fmt(max(finals)[0])} ({max(finals)[1]})" if finals else "n/a"
    counts, source = nx.operator_counts(run)
    if source == "none":
        rows["evolution events"] = "0"
    else:
        detail = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
        rows["evolution events"] = f"{sum(counts.values())} ({detail})"
    _, vcounts = nx.validity(run)
    if vcounts:
        total = sum(float(c.sum()) for c in vcounts.values())
        rejects = sorted(((float(c.sum()), r) for r, c in vcounts.items() if r != "valid"), reverse=True)
        rows["top rejection reasons (share of proposals)"] = (
            (", ".join(f"{r} {n / total:.1%}" for n, r in rejects[:3] if n > 0) or "none") if total > 0 else "n/a"
        )
    else:
        rows["top rejection reasons (share of proposals)"] = "n/a"
    return rows


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def eval_section(runs: Sequence[RunData], entries: dict[str, dict[str, nx.EvalEntry]]) -> list[str]:
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
        return nx.fmt(val)

    def cell(e: nx.EvalEntry | None) -> str:
        if e is None or e.headline is None:
            return "n/a"
        spread = f" [{nx.fmt(e.weakest)} – {nx.fmt(e.best)}]" if e.weakest is not None and e.best is not None else ""
        return nx.fmt(e.headline) + spread

    header = ["benchmark"] + [r.name for r in with_eval] + ["base", "baseline (from results.json)"]
    rows = [[b] + [cell(entries[r.name].get(b)) for r in with_eval] + [ref(b, "base"), ref(b, "baseline")] for b in benches]
    common = [
        b for b in benches if all(b in entries[r.name] and entries[r.name][b].headline is not None for r in with_eval)
    ]
    if common:
        agg = [f"**mean over {len(common)} common benchmark(s)**"]
        for r in with_eval:
            es = [entries[r.name][b] for b in common]
            mean = float(np.mean([e.headline for e in es]))
            names = set.intersection(*(set(e.members) for e in es))
            if names:  # per-member aggregate: the weakest member on aggregate, as in the paper's claim
                per_member = [float(np.mean([e.members[m] for e in es])) for m in names]
                spread = f" [{nx.fmt(min(per_member))} – {nx.fmt(max(per_member))}]"
            else:
                spread = ""
            agg.append(nx.fmt(mean) + spread)
        for attr in ("base", "baseline"):
            vals = [
                next(
                    (getattr(entries[r.name][b], attr) for r in with_eval if getattr(entries[r.name][b], attr) is not None),
                    None,
                )
                for b in common
            ]
            agg.append(nx.fmt(float(np.mean(vals))) if all(v is not None for v in vals) else "n/a")
        rows.append(agg)
    lines = [
        "Cells: population mean [weakest member – best member]; on the aggregate row the bracket is the",
        "weakest / best member by its own mean over the common benchmarks.",
        "",
    ]
    return lines + md_table(header, rows)


def evolution_section(runs: Sequence[RunData]) -> list[str]:
    counts = {r.name: nx.operator_counts(r) for r in runs}
    if all(src == "none" for _, src in counts.values()):
        return [f"No evolution events (no `{LINEAGE}` records or `{tags.REPLACEMENTS}` in any run)."]
    ops = sorted({op for c, _ in counts.values() for op in c})
    rows = [[op] + [str(counts[r.name][0].get(op, 0)) for r in runs] for op in ops]
    rows.append(["**total**"] + [str(sum(counts[r.name][0].values())) for r in runs])
    rows.append(["source"] + [counts[r.name][1] for r in runs])
    lines = md_table(["operator"] + [r.name for r in runs], rows)
    by_role = []
    for r in runs:
        roles = Counter(str(rec.get("role", "?")) for rec in r.lineage)
        if roles:
            by_role.append(f"{r.name}: " + ", ".join(f"{role} {n}" for role, n in sorted(roles.items())))
    if by_role:
        lines += ["", "By role: " + "; ".join(by_role) + "."]
    rules = [f"{r.name}: {rule}" for r in runs if (rule := _rules(r.lineage))]
    if rules:
        lines += ["", "Decided by: " + "; ".join(rules) + "."]
    return lines


def _rules(lineage: Sequence[dict[str, Any]]) -> str:
    """The fitness, selection rule and exploration named by a run's lineage records (``name`` with kwargs,
    counted), e.g. ``fitness mu_minus_3sigma ×4, selection tournament {"elites": 1} ×4``; empty for records
    written before lineage named them."""
    def name(part: Any) -> str | None:
        if not isinstance(part, dict) or "name" not in part and "mode" not in part:
            return None
        label = str(part.get("name", part.get("mode")))
        params = part.get("params")
        return label + (f" {json.dumps(params, sort_keys=True)}" if params else "")

    found: list[str] = []
    for key in ("fitness", "selection", "explore"):
        counts = Counter(n for rec in lineage if (n := name(rec.get(key))) is not None)
        found += [f"{key} {n} ×{c}" for n, c in sorted(counts.items())]
    return ", ".join(found)


def retention_section(runs: Sequence[RunData], kids: dict[str, list[nx.Child]]) -> list[str]:
    """Per run, role and operator: children, the replaced members' mean rank at culling, and at each k the
    children's mean rank at +k with how many rank better than the member they replaced did at culling."""
    groups: dict[tuple[str, str, str], list[nx.Child]] = {}
    for r in runs:
        for c in kids.get(r.name, []):
            groups.setdefault((r.name, c.role, c.operator), []).append(c)
    if not groups:
        return [f"No evolved child (no `{LINEAGE}` records in any run)."]
    reached = {k for cs in groups.values() for c in cs for k in c.ranks}
    ks = [k for k in nx.RETENTION_KS if k in reached]
    header = ["run", "role", "operator", "children", "members", "replaced member's rank at culling"]
    header += [f"rank at +{k}" for k in ks]
    rows = []
    for (run, role, op), cs in groups.items():
        culled = [c.culled_rank for c in cs if c.culled_rank is not None]
        row = [run, role, op, str(len(cs)), "/".join(sorted({str(c.n_members) for c in cs})),
               nx.fmt(float(np.mean(culled))) if culled else "n/a"]
        for k in ks:
            at = [c for c in cs if k in c.ranks]
            if not at:
                row.append("n/a")
                continue
            better = sum(1 for c in at if c.culled_rank is not None and c.ranks[k] < c.culled_rank)
            row.append(f"{nx.fmt(float(np.mean([c.ranks[k] for c in at])))} ({better}/{len(at)} better)")
        rows.append(row)
    lines = [
        "Rank within the role by μ − 3σ (1 = best) of each child k steps after its birth, mean over the children",
        "of that operator; \"better\" = children ranked above the rank the member they replaced had when it was",
        "culled. A child stops counting once its slot is replaced again.",
        "",
    ]
    return lines + md_table(header, rows)


def pairs_section(runs: Sequence[RunData], windows: dict[str, list[nx.PairWindow]]) -> list[str]:
    """Per run and window, the matrix of solve rates (correct/attempts) on matched tasks."""
    present = [r for r in runs if windows.get(r.name)]
    if not present:
        return [f"No run logs `{tags.pair('<teacher>', '<student>', 'attempts')}`."]
    lines = [
        "Solve rate of each student (columns) on its matched teacher's (rows) tasks: rate (correct/attempts);",
        "0/0: matched, but the teacher had no valid task; –: never matched in the window.",
        "",
    ]
    for r in present:
        for w in windows[r.name]:
            lines += [f"**{r.name}, {w.label}**", ""]
            rows = []
            for a, t in enumerate(w.teachers):
                cells = [
                    f"{nx.fmt(w.rate[a, b])} ({int(w.correct[a, b])}/{int(w.attempts[a, b])})"
                    if w.attempts[a, b] > 0 else ("0/0" if w.matched[a, b] > 0 else "–")
                    for b in range(len(w.students))
                ]
                rows.append([t, *cells])
            lines += md_table(["teacher \\ student", *w.students], rows) + [""]
    return lines[:-1]


def unique_names(runs: list[RunData]) -> None:
    """Rename runs that share a name (``name (2)``), with a note."""
    seen: Counter[str] = Counter()
    for r in runs:
        seen[r.name] += 1
        if seen[r.name] > 1:
            r.notes.append(f"two runs are named {r.name!r}; the one in {r.path} is shown as {r.name} ({seen[r.name]}).")
            r.name = f"{r.name} ({seen[r.name]})"


def config_changes_section(runs: Sequence[RunData]) -> list[str]:
    """``## Configuration changes``: every change a resume recorded (``config_history.jsonl``), at its step;
    nothing when no run has one."""
    rows = [[r.name, str(h["step"]), f"`{h['field']}`", f"`{json.dumps(h.get('old'))}`", f"`{json.dumps(h.get('new'))}`"]
            for r in runs for h in r.config_history]
    if not rows:
        return []
    return ["## Configuration changes", "",
            f"Settings changed when the run was resumed (`--override`, or `steps`), from `{CONFIG_HISTORY}`: "
            "steps after the one shown trained with the new value.", "",
            *md_table(["run", "after step", "field", "old", "new"], rows), ""]


def pipeline_section(runs: Sequence[RunData]) -> list[str]:
    """``## Asynchronous steps``: per run that overlapped generation and training (``pipeline.max_staleness``) and
    member, the staleness of its batches (mean and largest over the steps) and the mismatch its updates measured
    between the weights they trained and the log-probs the batch was sampled with, and the rollouts PBT
    discarded; nothing when no run is asynchronous."""
    rows: list[list[str]] = []
    dropped: list[str] = []

    def mean(r: RunData, m: str, key: str) -> str:
        values = nx.series(r, tags.member(m, key))[1]
        return nx.fmt(float(np.mean(values))) if len(values) else "n/a"

    for r in runs:
        names = sorted({m for tag in r.scalars if (p := tags.parse_member(tag)) and p[1] == tags.STALENESS
                        for m in [p[0]]})
        for m in names:
            st = nx.series(r, tags.member(m, tags.STALENESS))[1]
            top = nx.series(r, tags.member(m, tags.STALENESS_MAX))[1]
            rows.append([r.name, m, nx.fmt(float(np.mean(st))), nx.fmt(float(np.max(top))) if len(top) else "n/a",
                         str(len(st)), mean(r, m, tags.MISMATCH_ABS_MEAN), mean(r, m, tags.MISMATCH_KL)])
        discarded = nx.series(r, tags.pipeline(tags.DISCARDED))[1]
        if len(discarded) and names:
            dropped.append(f"{r.name}: {int(discarded.sum())}")
    if not rows:
        return []
    return ["## Asynchronous steps", "",
            "Staleness = updates between the adapter version that generated a member's batch and the version its "
            f"update trained (`{tags.member('<member>', tags.STALENESS)}`); the mismatch is the update's "
            "|log π_trainer − log π_behaviour| and its k3 KL estimate, the trainer's weights before the update "
            f"against the log-probs the batch was sampled with (`{tags.member('<member>', tags.MISMATCH_ABS_MEAN)}`, "
            f"`{tags.member('<member>', tags.MISMATCH_KL)}`): for a stale batch the drift of its updates plus the "
            "engines' numerical mismatch.",
            "", *md_table(["run", "member", "staleness (mean)", "staleness (max)", "updates",
                           "mismatch, mean abs Δ log p", "mismatch KL (mean)"], rows), "",
            "Rollouts discarded because PBT replaced their member after they were generated "
            f"(`{tags.pipeline(tags.DISCARDED)}`): {'; '.join(dropped) or 'none'}.", ""]


def summary_markdown(
    runs: Sequence[RunData],
    smoothing: float,
    entries: dict[str, dict[str, nx.EvalEntry]],
    kids: dict[str, list[nx.Child]],
    windows: dict[str, list[nx.PairWindow]],
    figures: Sequence[tuple[str, str | None, str]],
    notes: Sequence[str],
) -> str:
    """The whole ``summary.md``; ``figures`` are (title, png or None when skipped, caption)."""
    heads = {r.name: headline(r) for r in runs}
    metrics = list(heads[runs[0].name])
    lines = [
        "# PopuLoRA report",
        "",
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} from {len(runs)} run(s): "
        + ", ".join(f"`{r.name}` ({r.path})" for r in runs)
        + ".",
        f"Curves: EMA smoothing {smoothing:g} (raw drawn faintly). Last-{nx.LAST_N} mean = mean of the last "
        f"{nx.LAST_N} logged values; first/last {nx.EDGE_FRACTION:.0%} = means of the first/last "
        f"{nx.EDGE_FRACTION:.0%} of the logged points (at least one). The student solve rate counts matched "
        "attempts only (a student's attempts at its matched teacher's tasks); filler tasks are reported apart.",
        "",
        "## Runs",
        "",
        *md_table(["metric"] + [r.name for r in runs], [[m] + [heads[r.name][m] for r in runs] for m in metrics]),
        "",
        *config_changes_section(runs),
        *pipeline_section(runs),
        *tamper_section(runs),
        "## Evaluation",
        "",
        *eval_section(runs, entries),
        "",
        "## Evolution events",
        "",
        *evolution_section(runs),
        "",
        "## Evolution retention",
        "",
        *retention_section(runs, kids),
        "",
        "## Teacher × student solve rate",
        "",
        *pairs_section(runs, windows),
        "",
        "## Figures",
        "",
    ]
    for title, png, caption in figures:
        if png is not None:
            lines += [f"### {title}", ""] + ([caption, ""] if caption else []) + [f"[![{title}]({png})]({png})", ""]
    lines += ["## Notes", ""]
    lines += [f"- {n}" for n in notes] if notes else ["- nothing missing: every figure was drawn."]
    return "\n".join(lines) + "\n"
