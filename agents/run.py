"""Run a training job end to end: set-up, the step loop with logging and checkpoints, final adapters and
the report. Used by ``populora train`` and ``populora baseline``."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from agents.checkpoint import write_json
from agents.config import TrainConfig, to_dict
from agents.logger import TensorBoardLogger
from agents.loop import AgentMapping, SelfPlayLoop, population_mapping

log = logging.getLogger(__name__)

Kind = Literal["population", "baseline"]


def default_run_dir(cfg: TrainConfig, kind: Kind) -> Path:
    """``runs/<name>``; the name defaults to ``<preset>-<kind>-s<seed>``."""
    if cfg.run_dir is not None:
        return Path(cfg.run_dir)
    name = cfg.name or f"{cfg.preset}-{kind}-s{cfg.seed}"
    return Path("runs") / name


def mapping_for(cfg: TrainConfig, kind: Kind) -> AgentMapping:
    if kind == "baseline":
        from baselines.azr import azr_mapping

        return azr_mapping()
    return population_mapping(cfg.num_teachers, cfg.num_students)


def _summary_line(step: int, total: int, sc: dict[str, float]) -> str:
    def f(key: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(sc[key]) if key in sc else "-"

    return (f"step {step}/{total} | valid {f('charts/valid_rate')} | solve {f('charts/student_solve_rate')} | "
            f"R_teacher {f('charts/teacher_reward')} | R_student {f('charts/student_reward')} | "
            f"gen {f('time/generation', '{:.1f}s')} sandbox {f('time/sandbox', '{:.1f}s')} "
            f"update {f('time/update', '{:.1f}s')} evo {f('time/evolution', '{:.2f}s')}")


def train(cfg: TrainConfig, kind: Kind, make_report: bool = True) -> Path:
    """Run (or resume) a job; returns the run directory."""
    resuming = cfg.resume is not None
    run_dir = Path(cfg.resume) if resuming else default_run_dir(cfg, kind)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resuming:
        write_json(run_dir / "config.json", {"name": run_dir.name, "kind": kind, "model": cfg.model,
                                             "rank": cfg.rank, "alpha": cfg.alpha, "config": to_dict(cfg)})
    loop = SelfPlayLoop(cfg, kind, mapping_for(cfg, kind), run_dir,
                        evolve=(kind == "population" and cfg.evolution))
    t_setup = time.perf_counter()
    loop.setup()
    resumed = loop.load_checkpoint() if resuming else False
    if resuming and not resumed:
        log.warning("no checkpoint in %s: starting from step 0", run_dir)
    tb = TensorBoardLogger(str(run_dir), purge_step=loop.step if resumed else None)
    if not resumed:
        tb.log_hparams(to_dict(cfg))
    setup_s = time.perf_counter() - t_setup
    bar = tqdm(total=cfg.steps, initial=loop.step, desc=run_dir.name, disable=not cfg.progress, unit="step")
    step_times: list[float] = []
    try:
        while loop.step < cfg.steps:
            stats = loop.train_step()
            for k, v in stats["time"].items():  # before the checkpoint, so a resumed run keeps the sums
                loop.totals[f"time/{k}"] += v
            ckpt_s = 0.0
            if loop.step % cfg.checkpoint_every == 0 or loop.step == cfg.steps:
                t0 = time.perf_counter()
                loop.save_checkpoint()
                ckpt_s = time.perf_counter() - t0
            stats["time"]["checkpoint"] = ckpt_s
            loop.totals["time/checkpoint"] += ckpt_s
            scalars = tb.log_step(loop.step, stats, cfg.log_samples)
            step_times.append(stats["time"]["step"])
            bar.update(1)
            tqdm.write(_summary_line(loop.step, cfg.steps, scalars)) if cfg.progress else log.info(
                _summary_line(loop.step, cfg.steps, scalars))
    finally:
        bar.close()
        tb.close()
        loop.env.close()
    adapters = run_dir / "adapters"
    for member in loop.population.names:
        loop.population.save(member, adapters / member)
    summary = {"steps": loop.step, "setup_seconds": setup_s,
               "median_step_seconds": float(np.median(step_times)) if step_times else None,
               "totals_seconds": dict(loop.totals), "members": list(loop.population.names)}
    write_json(run_dir / "run_summary.json", summary)
    if make_report:
        from agents.report import make_report as _report

        _report([run_dir])
    log.info("run finished: %s", json.dumps(summary))
    return run_dir
