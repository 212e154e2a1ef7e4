"""The Ray backend: the parts of a run as actors, behind the interfaces the loop already uses.

:class:`RayBackend` is what :func:`selfplay.parts.build_parts` asks for when ``backend == "ray"``:

* ``sandbox`` — a :class:`~selfplay.distributed.sandbox.RaySandbox` (the env's ``sandbox=``);
* after the env and the agent mapping exist, :meth:`RayBackend.build` gives the population
  (:class:`~selfplay.distributed.shards.RayPopulation`), the generator
  (:class:`~selfplay.distributed.engines.RayGenerator`) and the trainer
  (:class:`~selfplay.distributed.shards.RayTrainer`).

The loop stays the single controller: the env, matching, ratings, rewards, rollouts, PBT, logging and the
checkpoint layout run in the driver exactly as with ``--backend local``. Placement: the trainer shards and the
engines take the bundles of one PACK placement group, the sandbox actors one bundle each of a STRICT_SPREAD
group (one per node), all reserved and checked by :func:`~selfplay.distributed.cluster.preflight` before any
model loads.
"""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from selfplay.config import TrainConfig, to_dict
from selfplay.distributed.cluster import (
    ClusterError,
    Prepared,
    member_count,
    preflight,
    sandbox_limits,
    split_members,
    take_prepared,
)
from selfplay.distributed.engines import Engine, RayGenerator
from selfplay.distributed.sandbox import RaySandbox
from selfplay.distributed.shards import RayPopulation, RayTrainer, TrainerShard
from selfplay.mapping import AgentMapping

log = logging.getLogger(__name__)

__all__ = ["RayBackend"]


class RayBackend:
    """The run's actors (module docstring).

    Args:
        cfg: the run configuration (``backend == "ray"``).
        run_dir: the run directory (shards write checkpoint files there).
        assignment: env agent -> adapter (``None``: one adapter per agent).
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, assignment: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        rc = cfg.ray
        limits = sandbox_limits(cfg)
        prepared = take_prepared(rc, asdict(limits))  # what the command's preflight set up, if it ran
        if prepared is None:
            preflight(rc, member_count(cfg, assignment), Path(run_dir), asdict(limits))
            prepared = take_prepared(rc, asdict(limits))
        assert prepared is not None
        self.prepared: Prepared = prepared
        self.sandbox = RaySandbox(prepared.sandbox_actors, rc.sandbox_workers_per_node, limits,
                                  deadline_s=rc.sandbox_deadline_s, chunk=rc.sandbox_chunk)
        self.shards: list[Any] = []
        self.engines: list[Any] = []

    def build(self, mapping: AgentMapping) -> tuple[RayPopulation, RayGenerator, RayTrainer]:
        """Start the trainer shards and engines for ``mapping``'s members; returns the three proxies."""
        cfg, rc = self.cfg, self.cfg.ray
        members = list(mapping.members)
        groups = split_members(members, mapping.roles, rc.trainers)
        owner = {m: s for s, g in enumerate(groups) for m in g}
        if rc.engine_adapters == "all":
            serves = [members] * rc.engines
        else:
            serves = [groups[e % rc.trainers] for e in range(rc.engines)]
        cfg_dict = to_dict(cfg)
        pg = self.prepared.learn_pg
        t_threads = cfg.threads if cfg.threads > 0 else max(1, int(rc.trainer_cpus))
        on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and rc.engine_gpus == 0)
        e_threads = cfg.generation.threads if cfg.generation.threads > 0 and on_cpu else max(1, int(rc.engine_cpus))

        def where(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)

        shard_cls, engine_cls = ray.remote(TrainerShard), ray.remote(Engine)
        self.shards = [shard_cls.options(num_cpus=rc.trainer_cpus, num_gpus=rc.trainer_gpus, max_restarts=0,
                                         scheduling_strategy=where(s)).remote(cfg_dict, g, t_threads)
                       for s, g in enumerate(groups)]
        self.engines = [engine_cls.options(num_cpus=rc.engine_cpus, num_gpus=rc.engine_gpus, max_restarts=0,
                                           scheduling_strategy=where(rc.trainers + e)).remote(cfg_dict, serves[e],
                                                                                               e_threads)
                        for e in range(rc.engines)]
        try:
            infos = ray.get([a.info.remote() for a in [*self.shards, *self.engines]],
                            timeout=rc.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"the trainer shards and engines did not start within {rc.placement_timeout_s:g} s "
                               "(ray.placement_timeout_s)") from None
        self.shard_info, self.engine_info = infos[:len(self.shards)], infos[len(self.shards):]
        for s, info in enumerate(self.shard_info):
            log.info("trainer shard %d on node %s: %s (%d threads)", s, info["node"][:12], info["members"],
                     info["threads"])
        for e, info in enumerate(self.engine_info):
            log.info("engine %d on node %s serves %d member(s) (%s, %d threads)", e, info["node"][:12],
                     len(info["members"]), info["engine"], info["threads"])
        meta = {k: self.shard_info[0][k] for k in ("rank", "alpha", "target_modules", "dropout", "seed")}
        population = RayPopulation(self.shards, members, owner, meta)
        trainer = RayTrainer(self.shards, owner, rc.sync_rollouts)
        generator = RayGenerator(self.engines, serves, self.shards, owner, cfg.generation.engine,
                                 cfg.generation.batch_size, whole_chunks=rc.engine_adapters == "all")
        generator.refresh(members)  # the engines start from the shards' states
        generator.wait_loaded()
        generator.totals.update(calls=0, wall_s=0.0, compute_s=0.0)
        self.generator, self.trainer = generator, trainer
        atexit.register(self.log_overhead)
        return population, generator, trainer

    def overhead(self) -> dict[str, float]:
        """Driver wall time vs the actors' own compute so far: ``generation_*``, ``update_*`` seconds and
        ``overhead_s`` = the wall time not spent computing in the busiest engine / shard (transfers, packing,
        refresh, scheduling)."""
        g, t = self.generator.totals, self.trainer.totals
        return {"generate_calls": g["calls"], "generation_wall_s": g["wall_s"], "generation_compute_s": g["compute_s"],
                "update_calls": t["calls"], "update_wall_s": t["wall_s"], "update_compute_s": t["compute_s"],
                "overhead_s": g["wall_s"] - g["compute_s"] + t["wall_s"] - t["compute_s"]}

    def log_overhead(self) -> None:
        """Log :meth:`overhead` (at exit: the command's runs print it once)."""
        if getattr(self, "generator", None) is not None:
            log.info("ray overhead: %s", json.dumps({k: round(v, 4) for k, v in self.overhead().items()}))

    def close(self) -> None:
        """Stop every actor and release the reserved resources."""
        for a in [*self.shards, *self.engines]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.shards, self.engines = [], []
        self.sandbox.close()
        self.prepared.close()
