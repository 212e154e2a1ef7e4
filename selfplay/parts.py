"""How a run's parts are built: one builder for the local loop and for the Ray actors.

A run has an env, an agent mapping, a LoRA population on one base model, a generator and a trainer over that
population, and (with evolution) a PBT controller. :func:`build_parts` builds them in the driver for the run
backend (``backend``):

* ``local`` — every part in this process: the env, the mapping, the PBT controller, and the members with both
  the generator and the trainer (:func:`selfplay.members.build_members`);
* ``ray`` — the env, the mapping and the PBT controller stay in the driver, while each trainer shard builds its
  members with the trainer and each generation engine the members it serves with the generator, through the
  same :func:`selfplay.members.build_members` (:mod:`selfplay.distributed`); the driver gets proxies with the
  same interfaces.

An option or a part added to :func:`selfplay.members.build_members` therefore reaches a local and a Ray run
alike; one added here (a driver-side part) reaches both as well.

An asynchronous run (``pipeline.max_staleness >= 1``, :mod:`selfplay.pipeline`) needs the generator apart from
the trainer, since a round is generated with older versions of the adapters while the trainer updates them: a
local HF run builds the members with the trainer here and the generator over a second copy of the base — in this
process (``pipeline.layout = "thread"``) or in an engine process (``"process"``,
:class:`selfplay.engine_process.EngineProcess`), both through the same builder; a local vLLM run keeps its one
engine, which serves the versions it is given without touching the trainer's weights; on Ray the engines and the
shards are apart already.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolution.pbt import PBTController
from populora_env import parallel_env
from populora_env.env import PopuLoRAParallelEnv
from selfplay import members as member_parts
from selfplay.config import TrainConfig
from selfplay.mapping import AgentMapping

if TYPE_CHECKING:
    from selfplay.distributed.backend import RayBackend

__all__ = ["RunParts", "build_parts", "build_pbt"]


def build_pbt(cfg: TrainConfig, mapping: AgentMapping, lineage: Path) -> PBTController | None:
    """The PBT controller (seeded from the run's seed, lineage appended to ``lineage``), or ``None`` without
    evolution or when no role has two members to rank."""
    if not (cfg.evolution and any(len(ms) >= 2 for ms in mapping.roles.values())):
        return None
    pbt_cfg = dataclasses.replace(cfg.pbt, seed=cfg.seed + cfg.pbt.seed)  # one seed drives the run
    base_lr = {role: cfg.trainer.lr for role in mapping.roles}  # what an explored child's lr scale multiplies
    return PBTController(pbt_cfg, lineage, final_step=cfg.steps, base_lr=base_lr)


@dataclass
class RunParts:
    """Every part of a run, as the loop drives them (module docstring).

    ``tokenizer`` is ``None`` on Ray (the engines hold theirs); ``backend`` is the
    :class:`~selfplay.distributed.backend.RayBackend` that owns the actors, ``None`` locally.
    """

    env: PopuLoRAParallelEnv
    mapping: AgentMapping
    population: Any
    generator: Any
    trainer: Any
    pbt: PBTController | None
    tokenizer: Any = None
    backend: RayBackend | None = None


def build_parts(cfg: TrainConfig, run_dir: Path, assignment: Mapping[str, str] | None, lineage: Path) -> RunParts:
    """Build a run's parts in this process (the driver) for the run backend ``cfg.backend``.

    Args:
        cfg: the validated run configuration.
        run_dir: the run directory (Ray's trainer shards write checkpoint files there).
        assignment: env agent -> adapter (``None``: one adapter per agent).
        lineage: the PBT controller's lineage file.
    """
    member_parts.prepare_process(cfg, cfg.threads)
    backend: RayBackend | None = None
    if cfg.backend == "ray":  # the same parts as Ray actors behind the same interfaces (docs/ray.md)
        from selfplay.distributed.backend import RayBackend

        backend = RayBackend(cfg, run_dir, assignment)
    env = parallel_env(cfg.env, seed=cfg.seed, sandbox=None if backend is None else backend.sandbox)
    mapping = AgentMapping.build(env.teachers, env.students, assignment)
    if backend is not None:
        population, generator, trainer = backend.build(mapping)
        tokenizer = None
    elif cfg.asynchronous and cfg.generation.engine == "hf":
        population, generator, trainer, tokenizer = _apart(cfg, mapping.members)
    else:
        built = member_parts.build_members(cfg, mapping.members, generator=True, trainer=True, run_dir=run_dir)
        population, generator, trainer, tokenizer = built.population, built.generator, built.trainer, built.tokenizer
    return RunParts(env, mapping, population, generator, trainer, build_pbt(cfg, mapping, lineage), tokenizer,
                    backend)


def _apart(cfg: TrainConfig, members: list[str]) -> tuple[Any, Any, Any, Any]:
    """``(population, generator, trainer, tokenizer)`` of a local asynchronous HF run: the trainer over this
    process's population, the generator over another copy of the base (module docstring). The engine process is
    started first, so that it loads its copy while this process loads its own."""
    generator: Any = None
    if cfg.pipeline.layout == "process":
        import torch

        from selfplay.config import to_dict
        from selfplay.engine_process import EngineProcess

        generator = EngineProcess(to_dict(cfg), members, cfg.generation.threads or torch.get_num_threads())
    try:
        built = member_parts.build_members(cfg, members, trainer=True)
        if generator is None:
            generator = member_parts.build_members(cfg, members, generator=True).generator
        else:
            generator.wait_started()
    except BaseException:
        if generator is not None and hasattr(generator, "close"):
            generator.close()
        raise
    return built.population, generator, built.trainer, built.tokenizer
