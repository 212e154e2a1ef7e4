"""Reports comparing training runs: figures and ``summary.md`` from TensorBoard events and side files.

``populora report RUN [RUN ...]`` reads each run directory written by the training loop (layout in
docs/design.md, "Runs, files, logs")::

    runs/<name>/config.json           {"name", "arm": "population" | "baseline" (older runs: "kind"),
                                       "model", "mapping", ...}
    runs/<name>/events.out.tfevents.* scalars (tag names: ``selfplay.tags``), global_step = training step
    runs/<name>/lineage.jsonl         one JSON object per evolution replacement
    runs/<name>/eval/results.json     optional, written by ``populora eval``

and writes ``<out>/*.png`` (one figure per diagnostic group, every run in one colour), ``<out>/summary.md``
(headline numbers per run, evaluation, evolution and retention tables, the teacher × student matrices, links
to the figures, notes on what could not be drawn) and ``<out>/figures.json`` (what each figure drew: panels,
curves and point counts, heatmap cells). ``out`` defaults to ``<first run>/report``.

A partial or early run never makes the report fail: a figure whose tags no run logs is skipped and the
skip is noted in ``summary.md``; a run directory without event files is an error naming that directory.

Modules: :mod:`~evaluation.report.loading` (reading a run), :mod:`~evaluation.report.numerics` (derived
numbers: smoothing, headline statistics, pair matrices, retention), :mod:`~evaluation.report.plots` (the
figures), :mod:`~evaluation.report.summary` (``summary.md``), :mod:`~evaluation.report.make` (the entry).
"""

from evaluation.report.loading import NoEventsError, RunData, Scalars, load_run, load_scalars
from evaluation.report.make import make_report
from evaluation.report.numerics import Child, PairWindow, children, pair_windows, smooth

__all__ = [
    "Child",
    "NoEventsError",
    "PairWindow",
    "RunData",
    "Scalars",
    "children",
    "load_run",
    "load_scalars",
    "make_report",
    "pair_windows",
    "smooth",
]
