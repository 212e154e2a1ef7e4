"""Reading a run directory: TensorBoard scalars, ``config.json``, ``lineage.jsonl`` and ``eval/results.json``.

Only the event files are required; a missing or malformed side file becomes a note in the report, never an
error, so a partial or still running run can always be reported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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
        lineage: the records of ``lineage.jsonl`` (one per evolution replacement), torn lines skipped.
        eval_results: ``eval/results.json`` when it has a ``benchmarks`` mapping.
        notes: what could not be read, for the report's notes.
    """

    path: Path
    name: str
    config: dict[str, Any]
    scalars: Scalars
    lineage: list[dict[str, Any]]
    eval_results: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    @property
    def arm(self) -> str:
        """``population`` / ``baseline``: ``config.json``'s ``arm`` (``kind`` in runs written before it was
        renamed), or ``?``."""
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
        return self.arm == "baseline"


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


def _read_json(path: Path, notes: list[str], what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{what}: could not read `{path}` ({type(exc).__name__}: {exc}); ignored.")
        return None


def _read_lineage(path: Path, name: str, notes: list[str]) -> list[dict[str, Any]]:
    """The records of ``lineage.jsonl``; malformed lines (a write in progress) are skipped with a note."""
    lineage: list[dict[str, Any]] = []
    if not path.is_file():
        return lineage
    bad = 0
    for line in path.read_text().splitlines():
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
    return lineage


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
    lineage = _read_lineage(run_dir / "lineage.jsonl", name, notes)

    eval_results = None
    eval_path = run_dir / "eval" / "results.json"
    if eval_path.is_file():
        loaded = _read_json(eval_path, notes, name)
        if isinstance(loaded, dict) and isinstance(loaded.get("benchmarks"), dict):
            eval_results = loaded
        elif loaded is not None:
            notes.append(f'{name}: eval/results.json has no "benchmarks" mapping; ignored.')
    return RunData(run_dir, name, config, scalars, lineage, eval_results, notes)
