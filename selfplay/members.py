"""A run's members as one process builds them: the base model, their LoRA population, and over it the generator
and/or the trainer (:func:`build_members`), after :func:`prepare_process` has set the process's threads and seeds.

Every process that holds members goes through these two calls: the local run (:func:`selfplay.parts.build_parts`,
every member with both the generator and the trainer; in an asynchronous run the trainer here and the generator
in a second call, in this process or in an engine process), each Ray trainer shard (its members, the trainer) and
each Ray generation engine (the members it serves, the generator). A process started for members (a Ray actor,
the local engine process of :mod:`selfplay.engine_process`) calls :func:`actor_members`, which imports the run's
plugins first. So an option or a part added here reaches a local
and a Ray run alike, and a member's adapter, optimizer and samples come from the same calls in the same order
wherever it lives (what keeps a Ray run bitwise the local one). Nothing here imports the Ray backend.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.generation import Generator, make_generator
from agents.models import load_base
from agents.population import LoRAPopulation
from agents.trainer import PolicyGradientTrainer
from selfplay.config import TrainConfig

__all__ = ["MemberParts", "actor_members", "build_members", "model_device", "prepare_process"]


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


def build_members(cfg: TrainConfig, members: Sequence[str], *, generator: bool = False,
                  trainer: bool = False, run_dir: Path | None = None) -> MemberParts:
    """Load the base model and build the members' population, and over it the generator (``generation``
    section) and/or the trainer (``trainer`` section).

    The base goes to :func:`model_device`, except in a process that only generates with vLLM: vLLM holds its
    own copy of the base on the GPU, and the HF copy only keeps the adapters (PEFT layout), on the CPU.

    Args:
        cfg: the run configuration.
        members: the adapters this process holds, in the run's order.
        generator, trainer: which of the two to build.
        run_dir: the run directory, where vLLM's adapters go when /dev/shm lacks the room (None: the temp dir).
    """
    base, tokenizer = load_base(cfg.model, dtype=getattr(torch, cfg.dtype))
    vllm_only = generator and not trainer and cfg.generation.engine == "vllm"
    base.to("cpu" if vllm_only else model_device(cfg))
    population = LoRAPopulation(base, list(members), rank=cfg.rank, alpha=cfg.alpha,
                                target_modules=cfg.target_modules, seed=cfg.seed)
    g = cfg.generation
    return MemberParts(
        population, tokenizer,
        generator=make_generator(g.engine, population, tokenizer, **g.generator_kwargs(cfg.model, run_dir)) if generator
        else None,
        trainer=PolicyGradientTrainer(population, cfg.trainer) if trainer else None)


def actor_members(cfg_dict: Mapping[str, Any], members: Sequence[str], threads: int, *, generator: bool = False,
                  trainer: bool = False) -> tuple[TrainConfig, MemberParts]:
    """``(cfg, parts)`` in a process started for members (a Ray actor, the local engine process): the run config
    rebuilt from its dict, the plugins imported, the process prepared (``threads`` torch threads, seeds) and the
    members' parts built by :func:`build_members`, the builder the local run uses (looked up after the plugins
    are imported: a plugin may replace it)."""
    from selfplay import members as member_parts
    from selfplay.config import from_dict
    from selfplay.plugins import load_plugins

    cfg = from_dict(TrainConfig, dict(cfg_dict))
    load_plugins(cfg.plugins)  # before the builder is looked up: a plugin may extend it
    member_parts.prepare_process(cfg, max(1, int(threads)))
    return cfg, member_parts.build_members(cfg, members, generator=generator, trainer=trainer)
