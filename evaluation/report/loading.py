"""Reading a run directory for the report: TensorBoard scalars here, everything else through the run layer's
one reader (:class:`selfplay.rundir.RunDir`: ``config.json``, ``lineage.jsonl``, ``config_history.jsonl``,
``tamper_samples.jsonl``, ``eval/results.json``).

Only the event files are required; a missing or damaged side file becomes a note in the report, so a partial or
still running run can always be reported. What this project never writes (JSON nested beyond the run
directory's bound, an entry that is a link out of the directory) is refused
(:class:`~selfplay.rundir.UnsafeRunFile`, exit 2 naming it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from selfplay.rundir import CONFIG, EVAL, EVAL_RESULTS, RunDir, RunFileError, UnsafeRunFile

__all__ = ["NoEventsError", "RunData", "Scalars", "load_run", "load_scalars"]

Scalars = dict[str, list[tuple[int, float]]]
"""tag -> [(step, value), ...] sorted by step, one value per step."""


class NoEventsError(FileNotFoundError):
    """A run directory holds no TensorBoard event files (or does not exist)."""


@dataclass
class RunData:
    """Everything the report reads from one run directory.

    Attributes:
        path: the run directory.
        name: ``config.json``'s ``name``, else the directory's name (made unique by the report).
        config: ``config.json`` (empty when missing or unreadable).
        scalars: every scalar series (:func:`load_scalars`).
        lineage: the records of ``lineage.jsonl`` (one per evolution replacement), torn lines and records
            without a step in ``0..steps`` skipped (:meth:`~selfplay.rundir.RunDir.lineage`).
        eval_results: ``eval/results.json`` when it has a ``benchmarks`` mapping.
        notes: what could not be read, for the report's notes.
        config_history: the changes resumes recorded (``config_history.jsonl``).
        tamper_samples: the samples of ``tamper_samples.jsonl`` that have a sample's shape (data only: the
            report counts them and never runs their text).
    """

    path: Path
    name: str
    config: dict[str, Any]
    scalars: Scalars
    lineage: list[dict[str, Any]]
    eval_results: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    config_history: list[dict[str, Any]] = field(default_factory=list)
    tamper_samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def arm(self) -> str:
        """``population`` / ``baseline`` (or the label ``--arm`` gave the run, its kind then in ``arm_kind``):
        ``config.json``'s ``arm`` (``kind`` in runs written before it was renamed), or ``?``."""
        return str(self.config.get("arm", self.config.get("kind", "?")))

    @property
    def agent_roles(self) -> dict[str, str]:
        """Agent -> role from ``config.json``'s ``mapping`` (empty for runs that did not save it)."""
        mapping = self.config.get("mapping")
        roles = mapping.get("agent_roles") if isinstance(mapping, dict) else None
        return {str(a): str(r) for a, r in roles.items()} if isinstance(roles, dict) else {}

    @property
    def agent_members(self) -> dict[str, str]:
        """Agent -> member (adapter) from ``config.json``'s ``mapping`` (empty when not saved)."""
        mapping = self.config.get("mapping")
        members = mapping.get("agent_to_member") if isinstance(mapping, dict) else None
        return {str(a): str(m) for a, m in members.items()} if isinstance(members, dict) else {}

    @property
    def single_member_both_roles(self) -> bool:
        """Whether one member plays both roles (the single-agent baseline: teacher = proposer, student =
        solver); from the mapping, else from the arm."""
        members, roles = self.agent_members, self.agent_roles
        if members and roles:
            by_member: dict[str, set[str]] = {}
            for agent, m in members.items():
                by_member.setdefault(m, set()).add(roles.get(agent, "?"))
            return any(len(rs) > 1 for rs in by_member.values())
        return self.config.get("arm_kind", self.arm) == "baseline"


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
    if not RunDir(run_dir).event_files():  # each checked: a link out of the run directory is refused
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
    found = acc.Tags()
    raw: dict[str, list[tuple[float, int, float]]] = {}
    for tag in found.get("scalars", []):
        points = [(e.wall_time, int(e.step), float(e.value)) for e in acc.Scalars(tag)]
        if points:  # a tag whose events were all purged stays listed, empty
            raw[tag] = points
    for tag in found.get("tensors", []):
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


def _side_file(read: Any, what: str, notes: list[str], name: str) -> Any:
    """``read()``, or ``None`` with a note when the file is damaged; :class:`UnsafeRunFile` passes."""
    try:
        return read()
    except UnsafeRunFile:
        raise
    except RunFileError as exc:
        notes.append(f"{name}: could not read {what} ({exc}); ignored.")
        return None


def load_run(run_dir: str | os.PathLike[str]) -> RunData:
    """Load a run directory: scalars, config.json, lineage.jsonl, tamper_samples.jsonl, config_history.jsonl and
    eval/results.json (all optional except the event files). A damaged side file becomes a note; see the module docstring.

    Raises:
        NoEventsError: ``run_dir`` does not exist or holds no event files.
        UnsafeRunFile: a file this project never writes (naming it).
    """
    run = RunDir(run_dir)
    scalars = load_scalars(run.path)
    notes: list[str] = []
    config = _side_file(run.config, CONFIG, notes, run.name) or {}
    if not run.has(CONFIG):
        notes.append(f"{run.name}: no {CONFIG}; the run is named after its directory.")
    name = str(config.get("name") or run.name)
    lineage = _side_file(run.lineage, "the lineage", notes, name) or []
    samples = _side_file(run.tamper_samples, "the tamper samples", notes, name) or []
    notes += [f"{name}: {n}" for n in run.notes]  # what the lineage and sample readers skipped
    history = _side_file(run.config_history, "the configuration history", notes, name) or []
    eval_results = _side_file(run.eval_results, f"{EVAL}/{EVAL_RESULTS}", notes, name)
    if eval_results is not None and not isinstance(eval_results.get("benchmarks"), dict):
        notes.append(f'{name}: {EVAL}/{EVAL_RESULTS} has no "benchmarks" mapping; ignored.')
        eval_results = None
    return RunData(run.path, name, config, scalars, lineage, eval_results, notes, history, samples)
