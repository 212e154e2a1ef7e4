"""Starting or continuing a run, and what a checkpoint of it holds.

:func:`resume_point` is the one entry: the ``populora`` command and :func:`selfplay.run.train` call it once per
run. It decides between a new run and a resumed one and makes every check on the run directory before the model
loads:

* **new run** (``cfg.resume`` unset): the directory (``cfg.run_dir``, else ``runs/<name>``) must hold no run
  (:func:`selfplay.rundir.prepare_new_run_dir`); it is created;
* **resume** (``cfg.resume = R``): ``R`` must be a writable run directory
  (:func:`selfplay.rundir.check_resume_dir`); the configuration may differ from ``R/config.json`` only as
  :mod:`selfplay.config_changes` allows; the leftovers of an interrupted checkpoint write are removed; the
  newest intact checkpoint is chosen (:func:`selfplay.checkpoint.find_resumable`; none intact:
  :class:`~selfplay.checkpoint.NoIntactCheckpoint`); accepted config changes are recorded at its step; the
  damaged newer checkpoints are moved to ``checkpoints/damaged/``; the lineage lines written after it are
  dropped (a run killed before its first checkpoint restarts from step 0 and drops them all).

It holds the directory's lock (:func:`selfplay.rundir.run_lock`) until the ``with`` block ends.

A checkpoint (written atomically by :func:`selfplay.checkpoint.write_checkpoint`) holds everything needed to
continue exactly: the population's adapters and optimizer states, the env's state (ratings, buffers, RNG), the
PBT controller's state, and ``loop_state.json`` (the step, the run's :class:`Progress` and the Python and NumPy
RNG states) plus ``torch_rng.pt``. Sampling seeds are derived from (seed, step, phase, agent, index), so a
resumed run repeats the uninterrupted one value for value.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from selfplay.checkpoint import (
    CheckpointError,
    Resumable,
    cleanup_partial,
    find_resumable,
    set_aside,
    write_checkpoint,
    write_json,
    write_text_atomic,
)
from selfplay.config import ConfigError, TrainConfig, from_dict, read_config_json, to_dict
from selfplay.config_changes import HISTORY_NAME, check_changes, drop_retired, record_changes
from selfplay.rundir import check_resume_dir, default_run_dir, prepare_new_run_dir, run_lock

if TYPE_CHECKING:
    from selfplay.loop import SelfPlayLoop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: its directory and, when it continues, the checkpoint it continues from.

    Attributes:
        run_dir: the run directory (locked while the :func:`resume_point` block runs).
        resuming: the run continues an earlier one (``cfg.resume``); its ``config.json`` is there.
        checkpoint: the intact checkpoint to load (``None``: start from step 0).
    """

    run_dir: Path
    resuming: bool = False
    checkpoint: Resumable | None = None


@dataclass
class Progress:
    """The run's own counters, carried in every checkpoint: summed seconds per phase (``time/<phase>``) and one
    history row per step (``run_summary.json``)."""

    totals: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    history: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def resume_point(cfg: TrainConfig, overrides: Sequence[str] = (), command: str = "train") -> Iterator[ResumePoint]:
    """Decide between a new run and a resumed one, check and prepare the run directory (see the module
    docstring), and hold its lock while the block runs.

    Args:
        cfg: the validated run configuration (``cfg.resume``: the run to continue).
        overrides: with ``cfg.resume``, the fields allowed to differ from the run's ``config.json``.
        command: what holds the lock (named to a second process that tries).

    Raises:
        RunDirError: the directory cannot be used (holds a run already, is no run, is locked, is unwritable).
        ConfigError: a resumed run's configuration differs in a field that may not change.
        NoIntactCheckpoint: the resumed run has checkpoints, but none is intact.
    """
    if cfg.resume is None:
        run_dir = prepare_new_run_dir(default_run_dir(cfg))
        with run_lock(run_dir, command):
            yield ResumePoint(run_dir)
        return
    run_dir = check_resume_dir(Path(cfg.resume))
    with run_lock(run_dir, command):
        yield _continue(cfg, run_dir, overrides)


def _continue(cfg: TrainConfig, run_dir: Path, overrides: Sequence[str]) -> ResumePoint:
    """The checks and clean-up of a resumed run, before its model loads."""
    saved, changes = _config_changes(cfg, run_dir, overrides)
    cleanup_partial(run_dir)
    chosen = find_resumable(run_dir)
    step = chosen.step if chosen is not None else 0
    if changes:  # recorded at the step the run continues from, before any step trains with them
        for line in record_changes(run_dir, step, changes):
            log.warning("resume: %s changed from %s to %s after step %d (recorded in %s)", line["field"],
                        json.dumps(line["old"]), json.dumps(line["new"]), line["step"], HISTORY_NAME)
        write_json(run_dir / "config.json", {**saved, "config": to_dict(cfg)})
    if chosen is None:
        log.warning("no checkpoint in %s: starting from step 0", run_dir)
    else:
        set_aside(run_dir, [e.checkpoint for e in chosen.skipped])
    truncate_lineage(run_dir, step)
    return ResumePoint(run_dir, resuming=True, checkpoint=chosen)


def _config_changes(cfg: TrainConfig, run_dir: Path, overrides: Sequence[str]) -> tuple[dict, list]:
    saved = read_config_json(run_dir / "config.json", "resume")
    if not isinstance(saved.get("config"), dict):
        raise ConfigError("resume", f"{run_dir / 'config.json'} holds no run configuration")
    # normalised through the dataclasses: a field added since the run was written is its default, not a change
    saved_config = to_dict(from_dict(TrainConfig, drop_retired(saved["config"])))
    return saved, check_changes(saved_config, to_dict(cfg), overrides)


def truncate_lineage(run_dir: Path, step: int) -> None:
    """Drop the lineage lines written after checkpoint ``step`` by a run that was killed later (a line cut short
    by the kill included: it was being written after the checkpoint)."""
    path = Path(run_dir) / "lineage.jsonl"
    if not path.is_file():
        return
    keep, dropped = [], 0
    for ln in path.read_text().splitlines():
        try:
            line_step = json.loads(ln)["step"] if ln.strip() else None
        except (json.JSONDecodeError, TypeError, KeyError):
            line_step = None
        if isinstance(line_step, int) and line_step <= step:
            keep.append(ln)
        elif ln.strip():
            dropped += 1
    if dropped:
        log.info("lineage: dropped %d line(s) written after checkpoint step %d", dropped, step)
        write_text_atomic(path, "".join(ln + "\n" for ln in keep))


# ------------------------------------------------------------------------------------ the checkpoint's state


def save_checkpoint(loop: SelfPlayLoop, progress: Progress, keep: int) -> Path:
    """Write checkpoint ``loop.step`` of ``loop.run_dir`` atomically, pruned to the newest ``keep``."""

    def write(d: Path) -> None:
        loop.population.save_all(d / "population")
        write_json(d / "env_state.json", loop.env.state_dict())
        if loop.pbt is not None:
            write_json(d / "pbt_state.json", loop.pbt.state_dict())
        write_json(d / "loop_state.json", {
            "step": loop.step, "totals": dict(progress.totals), "history": progress.history,
            "python_rng": repr(random.getstate()),
            "numpy_rng": _np_state_to_json(np.random.get_state()),
        })
        torch.save({"torch_rng": torch.get_rng_state()}, d / "torch_rng.pt")

    return write_checkpoint(loop.run_dir, loop.step, write, keep=keep)


def load_checkpoint(point: ResumePoint, loop: SelfPlayLoop) -> Progress:
    """Restore ``loop`` (set up, at step 0) from ``point``'s checkpoint and return the run's progress there;
    without a checkpoint the loop stays at step 0 and the progress is empty.

    Raises:
        CheckpointError: the checkpoint does not fit this run.
    """
    chosen = point.checkpoint
    if chosen is None:
        return Progress()
    d = chosen.path
    st = json.loads((d / "loop_state.json").read_text())
    if int(st["step"]) != chosen.step:
        raise CheckpointError(d / "loop_state.json", f"holds step {st['step']}, expected {chosen.step}")
    loop.population.load_all(d / "population")
    loop.env.load_state_dict(json.loads((d / "env_state.json").read_text()))
    if loop.pbt is not None and (d / "pbt_state.json").is_file():
        loop.pbt.load_state_dict(json.loads((d / "pbt_state.json").read_text()))
    progress = Progress(defaultdict(float, st.get("totals", {})), list(st.get("history", [])))
    random.setstate(ast.literal_eval(st["python_rng"]))  # our own repr of random.getstate(): a tuple of ints
    np.random.set_state(_np_state_from_json(st["numpy_rng"]))
    torch.set_rng_state(torch.load(d / "torch_rng.pt")["torch_rng"])
    loop.continue_after(chosen.step)
    skipped = "".join(f"; skipped damaged {e.checkpoint.name} ({e})" for e in chosen.skipped)
    log.info("resumed %s from checkpoint step %d%s", point.run_dir, chosen.step, skipped)
    return progress


def _np_state_to_json(state: tuple) -> list:
    name, keys, pos, has_gauss, cached = state
    return [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _np_state_from_json(s: list) -> tuple:
    return (s[0], np.array(s[1], dtype=np.uint32), s[2], s[3], s[4])


__all__ = ["Progress", "ResumePoint", "load_checkpoint", "resume_point", "save_checkpoint", "truncate_lineage"]
