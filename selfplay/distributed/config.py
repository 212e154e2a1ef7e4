"""The ``ray`` section of the run config (``--backend ray``) and its static checks.

Nothing here imports Ray: the section must be readable (presets, ``--dry-run``, ``--help``) where Ray is not
installed. :meth:`RayConfig.validate` is called by :meth:`selfplay.config.TrainConfig.validate` (with the
``ray.`` prefix); the checks that need the cluster (resources, the run directory on every node) are
:func:`selfplay.distributed.cluster.preflight`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

from populora_env.checks import check, check_choice, check_int, check_number

__all__ = ["RAY_INSTALL_HINT", "RayConfig", "ray_installed"]

RAY_INSTALL_HINT = "pip install -c constraints.txt '.[ray]' (or: bash scripts/install.sh --ray)"


@dataclass
class RayConfig:
    """Where the actors of ``--backend ray`` run and how many there are (docs/ray.md)."""

    address: str | None = None
    """Cluster to join: 'auto' (the cluster `ray start` made on this machine), 'HOST:PORT' of a head node; None
    joins $RAY_ADDRESS when it is set, else starts a private Ray instance on this machine."""
    trainers: int = 1
    """Trainer shards: the members are split into this many groups (teachers and students mixed); each shard
    holds one base copy with its members' adapters and optimizers."""
    engines: int = 1
    """Generation engines. Each holds every member's adapter (new states arrive as object refs after every
    update) and takes whole batches of the generation plan, so a sample does not depend on which engine made it."""
    engine_adapters: Literal["all", "shard"] = "all"
    """'all': every engine serves every member and takes whole chunks of the local generation plan (samples are
    bitwise those of --backend local). 'shard': engine i serves only the members of shard i mod trainers (less
    adapter memory per engine; samples equal local ones only up to float rounding of the batch composition)."""
    sandbox_workers_per_node: int = 2
    """Sandbox worker processes of the sandbox actor on each node (one job each at a time)."""
    sandbox_nodes: int = 0
    """Nodes that get a sandbox actor (0: every node of the cluster)."""
    sandbox_require: Literal["strong", "any"] = "strong"
    """'strong': every sandbox actor must have namespaces + seccomp (checked on its node at start-up, exit 2
    otherwise); 'any': accept what each node offers (its isolation is logged)."""
    sandbox_deadline_s: float = 0.0
    """Wall-clock budget of one sandbox batch (0: none): jobs not started by then come back 'timeout'."""
    sandbox_chunk: int = 0
    """Jobs per chunk handed to a sandbox actor (0: about a quarter of an even share, at least one)."""
    trainer_cpus: float = 1.0
    """CPUs reserved per trainer shard (its torch threads: --threads, or this when --threads is 0)."""
    trainer_gpus: float = 0.0
    """GPUs reserved per trainer shard (set 1 on GPU nodes)."""
    engine_cpus: float = 1.0
    """CPUs reserved per generation engine."""
    engine_gpus: float = 0.0
    """GPUs reserved per generation engine (set 1 on GPU nodes; vLLM needs one)."""
    sync_rollouts: int = 4
    """Rollouts per member scored by the trainer before its update for the sync metric (trainer vs engine
    log-prob gap on the same tokens)."""
    init_timeout_s: float = 60.0
    """How long connecting to the cluster may take before the run stops with an error."""
    placement_timeout_s: float = 120.0
    """How long reserving the actors' resources (placement groups) and starting them may take."""

    def validate(self, max_members: int | None = None) -> None:
        """Static checks of the section (no cluster needed); raise :class:`ConfigError` naming the field.

        Args:
            max_members: with ``--backend ray``, an upper bound of the population size (teachers + students):
                shards beyond it are refused. ``None`` (the local backend): the values are checked, not their fit.
        """
        check(self.address is None or (isinstance(self.address, str) and self.address.strip() != ""), "address",
              "must be 'auto', HOST:PORT or unset")
        check_int("trainers", self.trainers, 1, 4096)
        check_int("engines", self.engines, 1, 4096)
        check_choice("engine_adapters", self.engine_adapters, ("all", "shard"))
        check_int("sandbox_workers_per_node", self.sandbox_workers_per_node, 1, 4096)
        check_int("sandbox_nodes", self.sandbox_nodes, 0, 1 << 16)
        check_choice("sandbox_require", self.sandbox_require, ("strong", "any"))
        check_number("sandbox_deadline_s", self.sandbox_deadline_s, low=0.0, high=1e6)
        check_int("sandbox_chunk", self.sandbox_chunk, 0, 1 << 20)
        for name in ("trainer_cpus", "engine_cpus"):
            check_number(name, getattr(self, name), low=0.0, high=4096.0, low_open=True)
        for name in ("trainer_gpus", "engine_gpus"):
            check_number(name, getattr(self, name), low=0.0, high=64.0)
        check_int("sync_rollouts", self.sync_rollouts, 1, 1 << 16)
        check_number("init_timeout_s", self.init_timeout_s, low=0.0, high=3600.0, low_open=True)
        check_number("placement_timeout_s", self.placement_timeout_s, low=0.0, high=3600.0, low_open=True)
        if max_members is None:
            return
        check(self.trainers <= max_members, "trainers",
              f"{self.trainers} trainer shards for at most {max_members} members: every shard needs a member")
        if self.engine_adapters == "shard":
            check(self.engines >= self.trainers, "engines",
                  f"engine_adapters=shard needs an engine per shard ({self.trainers}), got {self.engines}")


def ray_installed() -> bool:
    """Whether ``import ray`` can work (without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False
