"""Run a training job end to end: set-up, the step loop with logging and checkpoints, the final adapters and
``run_summary.json``. The ``populora`` command calls :func:`train` with the arm it chose (a population, or a
baseline's config and agent assignment); nothing here knows which arm it runs."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from selfplay import tags
from selfplay.checkpoint import free_bytes, write_failure, write_json
from selfplay.config import TrainConfig, to_dict
from selfplay.logger import TensorBoardLogger
from selfplay.loop import SelfPlayLoop
from selfplay.pipeline import make_loop
from selfplay.resume import Progress, ResumePoint, load_checkpoint, resume_point, save_checkpoint
from selfplay.rundir import ADAPTERS, CONFIG, SUMMARY
from selfplay.tamper import TamperSampler

log = logging.getLogger(__name__)

HISTORY_KEYS = {
    "valid_rate": tags.VALID_RATE,
    "solve_rate": tags.SOLVE_RATE,
    "student_format_rate": tags.STUDENT_FORMAT_RATE,
    "teacher_reward": tags.TEACHER_REWARD,
    "student_reward": tags.STUDENT_REWARD,
    "step_seconds": tags.STEP_SECONDS,
    "tamper": tags.TAMPER_TOTAL,
}
"""``run_summary.json`` history field -> the TensorBoard tag it copies (``solve_rate``: matched tasks only)."""


def _summary_line(step: int, total: int, sc: Mapping[str, float]) -> str:
    def f(key: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(sc[key]) if key in sc else "-"

    return (f"step {step}/{total} | valid {f(tags.VALID_RATE)} | solve {f(tags.SOLVE_RATE)} | "
            f"fmt {f(tags.STUDENT_FORMAT_RATE)} | R_teacher {f(tags.TEACHER_REWARD)} | "
            f"R_student {f(tags.STUDENT_REWARD)} | gen {f(tags.time('generation'), '{:.1f}s')} "
            f"sandbox {f(tags.time('sandbox'), '{:.1f}s')} update {f(tags.time('update'), '{:.1f}s')} "
            f"evo {f(tags.time('evolution'), '{:.2f}s')}")


def save_adapters(loop: SelfPlayLoop, adapters: Path) -> None:
    """Write every member as a PEFT directory under ``adapters/``, atomically: into a temporary sibling that
    replaces ``adapters/`` when complete (a failure removes it and leaves any earlier ``adapters/`` as it was)."""
    tmp = adapters.with_name(f".tmp_{adapters.name}_{os.getpid()}")
    old = adapters.with_name(f".tmp_old_{adapters.name}_{os.getpid()}")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        for member in loop.population.names:
            loop.population.save(member, tmp / member)
        if adapters.exists():
            os.replace(adapters, old)
        os.replace(tmp, adapters)
    except BaseException as exc:
        free = free_bytes(adapters.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not adapters.exists():
            os.replace(old, adapters)
        if isinstance(exc, Exception):
            raise write_failure(exc, f"the final adapters {adapters}", free) from exc
        raise
    shutil.rmtree(old, ignore_errors=True)


def train(cfg: TrainConfig, assignment: Mapping[str, str] | None = None,
          meta: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> Path:
    """Run (or, with ``cfg.resume``, continue) a job; returns the run directory.

    The run directory is checked, prepared and locked once, by :func:`selfplay.resume.resume_point` (a second
    process writing the same directory fails at once with :class:`RunDirError` naming this one), then
    :func:`train_from` runs the job.

    Args:
        cfg: the validated run configuration.
        assignment: env agent -> adapter name (``None``: one adapter per agent). Saved in ``config.json``.
        meta: extra fields for ``config.json`` (e.g. ``{"arm": "baseline"}``), read by the report.
        overrides: with ``cfg.resume``, the fields allowed to differ from the run's ``config.json``
            (:mod:`selfplay.config_changes`: any other difference raises :class:`ConfigError` before the
            model loads; an accepted one is recorded in ``config_history.jsonl`` at the resumed step).

    Raises:
        NonFiniteTraining: ``trainer.max_nonfinite_updates`` consecutive updates of a member were skipped
            (no checkpoint is written after them: the last one is intact).
    """
    with resume_point(cfg, overrides) as point:
        return train_from(point, cfg, assignment, meta)


def train_from(point: ResumePoint, cfg: TrainConfig, assignment: Mapping[str, str] | None = None,
               meta: Mapping[str, Any] | None = None) -> Path:
    """Run the job from ``point`` (a new run, or the checkpoint a resumed one continues from); returns the run
    directory. Called inside the :func:`~selfplay.resume.resume_point` block that made ``point``."""
    run_dir = point.run_dir
    loop = make_loop(cfg, run_dir, assignment)
    t_setup = time.perf_counter()
    loop.setup()
    if not point.resuming:
        write_json(run_dir / CONFIG, {"name": run_dir.name, **dict(meta or {}), "model": cfg.model,
                                             "rank": cfg.rank, "alpha": cfg.alpha,
                                             "mapping": loop.mapping.to_dict(), "config": to_dict(cfg),
                                             "trainer_roles": cfg.trainer.role_record()})
    progress = load_checkpoint(point, loop)
    sampler = TamperSampler(run_dir, cfg.tamper_samples)  # after resume dropped the samples past the checkpoint
    # a resumed writer drops what the interrupted session logged after the checkpoint (steps > loop.step, all of
    # them without a checkpoint); the checkpoint's own step was logged before it was written and stays
    tb = TensorBoardLogger(str(run_dir), purge_step=loop.step + 1 if point.resuming else None)
    if point.checkpoint is None:
        tb.log_hparams(to_dict(cfg))
    setup_s = time.perf_counter() - t_setup
    bar = tqdm(total=cfg.steps, initial=loop.step, desc=run_dir.name, disable=not cfg.progress, unit="step")
    peaks: dict[str, float] = {}  # GiB per phase, the largest of this session's steps (CUDA runs)
    try:
        while loop.step < cfg.steps:
            line = _run_step(loop, progress, tb, cfg, peaks, sampler)
            bar.update(1)
            tqdm.write(line) if cfg.progress else log.info(line)
    finally:
        bar.close()
        tb.close()
        loop.close()
    save_adapters(loop, run_dir / ADAPTERS)
    step_times = [h["step_seconds"] for h in progress.history if h.get("step_seconds") is not None]
    summary = {"steps": loop.step, "setup_seconds": setup_s,
               "median_step_seconds": float(np.median(step_times)) if step_times else None,
               "totals_seconds": dict(progress.totals), "members": list(loop.population.names),
               "history": progress.history}
    if peaks:
        summary["peak_gpu_memory_gib"] = peaks
    write_json(run_dir / SUMMARY, summary)
    log.debug("run finished: %s", json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return run_dir


def _run_step(loop: SelfPlayLoop, progress: Progress, tb: TensorBoardLogger, cfg: TrainConfig,
              peaks: dict[str, float], sampler: TamperSampler) -> str:
    """One step, its logs, its history row, its tamper samples and (when due) its checkpoint, in the order a resume
    relies on; returns the step's summary line. ``peaks``: the largest GPU memory per phase so far (GiB),
    updated."""
    record = loop.train_step()
    for k, v in record.times.items():  # before the checkpoint, so a resumed run keeps the sums
        if k != "step":
            progress.totals[f"time/{k}"] += v
    scalars = tb.log_step(record)  # before the checkpoint: the history goes into it
    progress.history.append({"step": loop.step, **{k: scalars.get(tag) for k, tag in HISTORY_KEYS.items()}})
    tb.log_samples(record, cfg.log_samples)  # flushed before the checkpoint, like the scalars
    sampler.write(record)  # fsynced before the checkpoint: a checkpoint never lacks its steps' samples
    ckpt_s = 0.0
    if cfg.checkpoint_due(loop.step):
        t0 = time.perf_counter()
        with loop.memory.phase("checkpoint"):
            save_checkpoint(loop, progress, cfg.keep_checkpoints)
        ckpt_s = time.perf_counter() - t0
    progress.totals["time/checkpoint"] += ckpt_s
    # the values logged after the checkpoint: lost if the run dies between the two
    tb.add_scalar(tags.time("checkpoint"), ckpt_s, loop.step)
    for phase, n in {**record.memory, **loop.memory.take()}.items():
        peaks[phase] = max(peaks.get(phase, 0.0), n / 2**30)
        if phase == "checkpoint":
            tb.add_scalar(tags.memory(phase), n / 2**30, loop.step)
    return _summary_line(loop.step, cfg.steps, scalars)
