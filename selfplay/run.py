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
from selfplay.checkpoint import (
    Resumable,
    cleanup_partial,
    find_resumable,
    free_bytes,
    write_failure,
    write_json,
)
from selfplay.config import ConfigError, TrainConfig, from_dict, read_config_json, to_dict
from selfplay.config_changes import HISTORY_NAME, check_changes, drop_retired, record_changes
from selfplay.logger import TensorBoardLogger
from selfplay.loop import SelfPlayLoop
from selfplay.rundir import check_resume_dir, default_run_dir, prepare_new_run_dir, run_lock

log = logging.getLogger(__name__)

HISTORY_KEYS = {
    "valid_rate": tags.VALID_RATE,
    "solve_rate": tags.SOLVE_RATE,
    "student_format_rate": tags.STUDENT_FORMAT_RATE,
    "teacher_reward": tags.TEACHER_REWARD,
    "student_reward": tags.STUDENT_REWARD,
    "step_seconds": tags.STEP_SECONDS,
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

    The run directory is locked for the whole call (:func:`selfplay.rundir.run_lock`): a second process
    writing the same directory fails at once with :class:`RunDirError` naming this one.

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
    target = Path(cfg.resume) if cfg.resume is not None else default_run_dir(cfg)
    if cfg.resume is not None:
        check_resume_dir(target)
    else:
        prepare_new_run_dir(target)
    with run_lock(target):
        return _train(cfg, assignment, meta, overrides)


def _resume_changes(cfg: TrainConfig, run_dir: Path, overrides: Sequence[str]) -> tuple[dict, list]:
    saved = read_config_json(run_dir / "config.json", "resume")
    if not isinstance(saved.get("config"), dict):
        raise ConfigError("resume", f"{run_dir / 'config.json'} holds no run configuration")
    # normalised through the dataclasses: a field added since the run was written is its default, not a change
    saved_config = to_dict(from_dict(TrainConfig, drop_retired(saved["config"])))
    return saved, check_changes(saved_config, to_dict(cfg), overrides)


def _train(cfg: TrainConfig, assignment: Mapping[str, str] | None, meta: Mapping[str, Any] | None,
           overrides: Sequence[str]) -> Path:
    resuming = cfg.resume is not None
    # every check on the directory and its checkpoints comes before the model loads
    chosen: Resumable | None = None
    if resuming:
        run_dir = check_resume_dir(Path(cfg.resume))
        saved, changes = _resume_changes(cfg, run_dir, overrides)
        cleanup_partial(run_dir)
        chosen = find_resumable(run_dir)  # NoIntactCheckpoint if every checkpoint is damaged
        if changes:  # recorded at the step the run continues from, before any step trains with them
            for line in record_changes(run_dir, chosen.step if chosen is not None else 0, changes):
                log.warning("resume: %s changed from %s to %s after step %d (recorded in %s)", line["field"],
                            json.dumps(line["old"]), json.dumps(line["new"]), line["step"], HISTORY_NAME)
            write_json(run_dir / "config.json", {**saved, "config": to_dict(cfg)})
    else:
        run_dir = prepare_new_run_dir(default_run_dir(cfg))  # RunDirError if it already holds a run
    loop = SelfPlayLoop(cfg, run_dir, assignment)
    t_setup = time.perf_counter()
    loop.setup()
    if not resuming:
        write_json(run_dir / "config.json", {"name": run_dir.name, **dict(meta or {}), "model": cfg.model,
                                             "rank": cfg.rank, "alpha": cfg.alpha,
                                             "mapping": loop.mapping.to_dict(), "config": to_dict(cfg)})
    resumed = loop.load_checkpoint(chosen) if resuming else False
    if resuming and not resumed:
        log.warning("no checkpoint in %s: starting from step 0", run_dir)
    # a resumed writer drops what the interrupted session logged after the checkpoint (steps > loop.step, all of
    # them without a checkpoint); the checkpoint's own step was logged before it was written and stays
    tb = TensorBoardLogger(str(run_dir), purge_step=loop.step + 1 if resuming else None)
    if not resumed:
        tb.log_hparams(to_dict(cfg))
    setup_s = time.perf_counter() - t_setup
    bar = tqdm(total=cfg.steps, initial=loop.step, desc=run_dir.name, disable=not cfg.progress, unit="step")
    try:
        while loop.step < cfg.steps:
            record = loop.train_step()
            for k, v in record.times.items():  # before the checkpoint, so a resumed run keeps the sums
                if k != "step":
                    loop.totals[f"time/{k}"] += v
            scalars = tb.log_step(record)  # before the checkpoint: the history goes into it
            loop.history.append({"step": loop.step, **{k: scalars.get(tag) for k, tag in HISTORY_KEYS.items()}})
            tb.log_samples(record, cfg.log_samples)  # flushed before the checkpoint, like the scalars
            ckpt_s = 0.0
            if loop.step % cfg.checkpoint_every == 0 or loop.step == cfg.steps:
                t0 = time.perf_counter()
                loop.save_checkpoint()
                ckpt_s = time.perf_counter() - t0
            loop.totals["time/checkpoint"] += ckpt_s
            # the one value logged after the checkpoint: lost if the run dies between the two
            tb.add_scalar(tags.time("checkpoint"), ckpt_s, loop.step)
            bar.update(1)
            line = _summary_line(loop.step, cfg.steps, scalars)
            tqdm.write(line) if cfg.progress else log.info(line)
    finally:
        bar.close()
        tb.close()
        loop.env.close()
    save_adapters(loop, run_dir / "adapters")
    step_times = [h["step_seconds"] for h in loop.history if h.get("step_seconds") is not None]
    summary = {"steps": loop.step, "setup_seconds": setup_s,
               "median_step_seconds": float(np.median(step_times)) if step_times else None,
               "totals_seconds": dict(loop.totals), "members": list(loop.population.names),
               "history": loop.history}
    write_json(run_dir / "run_summary.json", summary)
    log.info("run finished: %s", json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return run_dir
