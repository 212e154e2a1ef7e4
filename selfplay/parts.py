"""How a run's parts are built: one builder for the local loop and for the Ray actors.

A run has an env, an agent mapping, a LoRA population on one base model, a generator and a trainer over that
population, and (with evolution) a PBT controller. Where they live depends on the run backend (``backend``):

* ``local`` — every part in this process: :func:`build_parts` builds the env, the mapping, then
  :func:`build_members` over every member with both the generator and the trainer;
* ``ray`` — the env, the mapping and PBT stay in the driver (:func:`build_parts` again), while each trainer shard
  calls :func:`build_members` for its members with the trainer, and each generation engine for the members it
  serves with the generator (:mod:`selfplay.distributed`); the driver gets proxies with the same interfaces.

Every process that holds members goes through :func:`prepare_process` (threads, seeds) and
:func:`build_members` (base model, population, generator, trainer), so an option or a part added there reaches
a local and a Ray run alike, and a member's adapter, optimizer and samples are built from the same calls
in the same order wherever it lives (what keeps a Ray run bitwise the local one).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agents.generation import Generator, make_generator
from agents.models import load_base
from agents.population import LoRAPopulation
from agents.trainer import PolicyGradientTrainer
from evolution.pbt import PBTController
from populora_env import parallel_env
from populora_env.env import PopuLoRAParallelEnv
from selfplay.config import TrainConfig
from selfplay.mapping import AgentMapping

if TYPE_CHECKING:
    from selfplay.distributed.backend import RayBackend

__all__ = ["MemberParts", "RunParts", "build_members", "build_parts", "build_pbt", "model_device",
           "prepare_process"]


def model_device(cfg: TrainConfig) -> str:
    """The torch device a process's model runs on: ``cfg.device``, where ``auto`` is CUDA if available."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def prepare_process(cfg: TrainConfig, threads: int) -> None:
    """Set this process's torch intra-op threads (``threads`` > 0; 0 keeps torch's default) and seed its
    global generators (torch, Python's ``random``, numpy's legacy one) from the run's seed, before any part is
    built."""
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed & 0xFFFFFFFF)  # numpy's legacy seed takes 32 bits; the same for seeds < 2**32


@dataclass
class MemberParts:
    """What one process holds for a set of members: the base with their adapters, and the generator and/or the
    trainer over them (``None`` where not asked for)."""

    population: LoRAPopulation
    tokenizer: Any
    generator: Generator | None = None
    trainer: PolicyGradientTrainer | None = None


def build_members(cfg: TrainConfig, members: Sequence[str], *, generator: bool = False, trainer: bool = False,
                  device: str | None = None) -> MemberParts:
    """Load the base model and build the members' population, and over it the generator (``generation``
    section) and/or the trainer (``trainer`` section).

    Args:
        cfg: the run configuration.
        members: the adapters this process holds, in the run's order.
        generator, trainer: which of the two to build.
        device: where the base goes (default :func:`model_device`); a vLLM engine keeps its HF copy on the CPU,
            for the adapters only.
    """
    base, tokenizer = load_base(cfg.model, dtype=getattr(torch, cfg.dtype))
    base.to(device or model_device(cfg))
    population = LoRAPopulation(base, list(members), rank=cfg.rank, alpha=cfg.alpha,
                                target_modules=cfg.target_modules, seed=cfg.seed)
    g = cfg.generation
    return MemberParts(
        population, tokenizer,
        generator=make_generator(g.engine, population, tokenizer, **g.generator_kwargs(cfg.model)) if generator
        else None,
        trainer=PolicyGradientTrainer(population, cfg.trainer) if trainer else None)


def build_pbt(cfg: TrainConfig, mapping: AgentMapping, lineage: Path) -> PBTController | None:
    """The PBT controller (seeded from the run's seed, lineage appended to ``lineage``), or ``None`` without
    evolution or when no role has two members to rank."""
    if not (cfg.evolution and any(len(ms) >= 2 for ms in mapping.roles.values())):
        return None
    pbt_cfg = dataclasses.replace(cfg.pbt, seed=cfg.seed + cfg.pbt.seed)  # one seed drives the run
    return PBTController(pbt_cfg, lineage, final_step=cfg.steps)


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
    prepare_process(cfg, cfg.threads)
    backend: RayBackend | None = None
    if cfg.backend == "ray":  # the same parts as Ray actors behind the same interfaces (docs/ray.md)
        from selfplay.distributed.backend import RayBackend

        backend = RayBackend(cfg, run_dir, assignment)
    env = parallel_env(cfg.env, seed=cfg.seed, sandbox=None if backend is None else backend.sandbox)
    mapping = AgentMapping.build(env.teachers, env.students, assignment)
    if backend is not None:
        population, generator, trainer = backend.build(mapping)
        tokenizer = None
    else:
        members = build_members(cfg, mapping.members, generator=True, trainer=True)
        population, generator, trainer = members.population, members.generator, members.trainer
        tokenizer = members.tokenizer
    return RunParts(env, mapping, population, generator, trainer, build_pbt(cfg, mapping, lineage), tokenizer,
                    backend)
