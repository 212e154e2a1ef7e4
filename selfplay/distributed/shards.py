"""Trainer shards: the members split into groups, each group's adapters, optimizers and updates in one actor.

A :class:`TrainerShard` holds one copy of the base with its members' LoRA adapters (a
:class:`~agents.population.LoRAPopulation` of those members only) and a
:class:`~agents.trainer.PolicyGradientTrainer` over them, built by :func:`selfplay.members.build_members` as the
local run builds its own (:func:`actor_members`). The driver reaches the shards through two proxies
with the interfaces the loop and the PBT controller already use:

* :class:`RayTrainer` — ``update_many(batches)`` (and ``update``): every shard updates its members at the same
  time, members in the order given, each from its rollouts (sent as numpy arrays, :mod:`.packing`);
* :class:`RayPopulation` — ``names``, ``state`` / ``load_state`` / ``reset_optimizer`` (PBT reads a parent's
  state from its shard and writes the child into the culled member's shard), ``save`` / ``load``,
  ``save_all`` / ``load_all`` (each shard writes and reads its members' files in the run directory itself;
  the driver writes ``population.json``). The files are those :class:`~agents.population.LoRAPopulation` writes.

**Same update wherever a member lives.** A member's update reads only the base, its own adapter and its own
optimizer (PEFT applies the active adapter only; other members are not in the forward), the rollouts arrive
in the same order, the micro-batching is the trainer's own, and the shard sets its torch threads explicitly
(``--threads``, or ``ray.trainer_cpus`` when that is 0: Ray would otherwise leave ``OMP_NUM_THREADS`` =
the actor's CPUs). With the same thread count as the local run, the result is bitwise the local one.

**Sync metric.** Before updating a member the shard scores up to ``ray.sync_rollouts`` of its rollouts with the
trainer's weights — the weights the engine should have generated them with — and reports
``sync = mean_t |log pi_trainer(y_t) - log pi_engine(y_t)|`` over their completion tokens (the engine's
log-probs are the rollouts' behaviour log-probs). An engine serving stale weights shows up as a gap far above
float rounding (the failure other frameworks only found through this metric). In an asynchronous run
(``pipeline.max_staleness >= 1``) the rollouts were generated with an older version on purpose, so ``sync`` also
holds that version's drift from the trainer's weights (the staleness it costs), not only the mismatch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import torch

from agents.population import OPTIMIZER_FILE, POPULATION_FILE, save_optimizer_state
from agents.rollout import Rollout
from selfplay.distributed.packing import pack_rollouts, unpack_rollouts
from selfplay.members import actor_members

__all__ = ["RayPopulation", "RayTrainer", "TrainerShard", "actor_members", "sync_gap"]


@torch.no_grad()
def sync_gap(population, member: str, rollouts: Sequence[Rollout]) -> float | None:
    """Mean absolute gap between ``member``'s log-probs of the rollouts' completion tokens and the rollouts'
    own (the generator's) log-probs; ``None`` when no rollout has both tokens and log-probs.

    Scored one rollout at a time (no padding), logits only at the completion positions."""
    rows = [r for r in rollouts if r.logprobs is not None and len(r.completion_ids) > 0]
    if not rows:
        return None
    model = population.model
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with population.activate(member):
        was_training = model.training
        model.eval()
        try:
            for r in rows:
                ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)], dtype=torch.long, device=device)
                n = len(r.completion_ids)
                logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()
                lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, -n:, None]).squeeze(1)
                engine = torch.tensor(r.logprobs, dtype=torch.float32, device=device)
                total += float((lp - engine).abs().sum())
                count += n
        finally:
            model.train(was_training)
    return total / max(count, 1)


class TrainerShard:
    """One group of members: base copy, their adapters and optimizers, the trainer (module docstring)."""

    def __init__(self, cfg_dict: Mapping[str, Any], members: Sequence[str], threads: int) -> None:
        _cfg, parts = actor_members(cfg_dict, members, threads, trainer=True)
        self.population, self.trainer = parts.population, parts.trainer

    def info(self) -> dict[str, Any]:
        """Where the shard runs and its population's LoRA settings (for ``population.json``)."""
        p = self.population
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "members": p.names,
                "threads": torch.get_num_threads(), "rank": p.rank, "alpha": p.alpha,
                "target_modules": list(p.target_modules), "dropout": p.dropout, "seed": p.seed}

    def update_many(self, packed: Mapping[str, dict], sync_rollouts: int, versions: Mapping[str, int] | None = None
                    ) -> tuple[dict[str, dict[str, float]], float]:
        """Update each member of ``packed`` (in order) from its packed rollouts (``versions``: the members' current
        versions, an asynchronous run's); metrics per member, with ``sync`` scored before the update, and the
        seconds this took."""
        t0 = time.perf_counter()
        out = {}
        versions = versions or {}
        for member, p in packed.items():
            rollouts = unpack_rollouts(p)
            gap = sync_gap(self.population, member, rollouts[:sync_rollouts])
            metrics = self.trainer.update(member, rollouts, versions.get(member))
            if gap is not None:
                metrics["sync"] = gap
            out[member] = metrics
        return out, time.perf_counter() - t0

    def publish(self, names: Sequence[str]) -> dict[str, Any]:
        """Each member's current state put in the object store: ``name -> ObjectRef`` (the driver passes the
        refs on to the engines without fetching the tensors)."""
        return {n: ray.put(self.population.state(n)) for n in names}

    def state(self, name: str) -> dict[str, torch.Tensor]:
        return self.population.state(name)

    def load_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        self.population.load_state(name, state)

    def reset_optimizer(self, name: str) -> None:
        self.population.reset_optimizer(name)

    def save(self, name: str, directory: str, dtype: str | None = None) -> str:
        return str(self.population.save(name, directory, None if dtype is None else getattr(torch, dtype)))

    def load(self, directory: str, name: str) -> None:
        self.population.load(directory, name)

    def save_members(self, directory: str, names: Sequence[str]) -> None:
        """``LoRAPopulation.save_all``'s per-member files for ``names``: PEFT directory + ``optimizer.pt``."""
        for name in names:
            member_dir = self.population.save(name, Path(directory) / name)
            opt_file = member_dir / OPTIMIZER_FILE
            sd = self.population.optimizer_state_dict(name)
            if sd is not None:
                save_optimizer_state(sd, opt_file)
            elif opt_file.exists():
                opt_file.unlink()

    def load_members(self, directory: str, names: Sequence[str]) -> None:
        """``LoRAPopulation.load_all``'s per-member part for ``names``: weights and optimizer states."""
        for name in names:
            self.population.load(Path(directory) / name, name)
        for name in names:
            opt_file = Path(directory) / name / OPTIMIZER_FILE
            sd = torch.load(opt_file, map_location="cpu", weights_only=True) if opt_file.is_file() else None
            self.population.load_optimizer_state_dict(name, sd)


class RayTrainer:
    """``update_many`` / ``update`` over the trainer shards (module docstring).

    Args:
        shards: :class:`TrainerShard` handles.
        owner: member -> index of its shard.
        sync_rollouts: rollouts per member scored for the sync metric.
    """

    def __init__(self, shards: Sequence[Any], owner: Mapping[str, int], sync_rollouts: int) -> None:
        self.shards = list(shards)
        self.owner = dict(owner)
        self.sync_rollouts = int(sync_rollouts)
        # driver wall time of update_many and the busiest shard's own seconds (see RayGenerator.totals)
        self.totals = {"calls": 0, "wall_s": 0.0, "compute_s": 0.0}

    def update_many(self, batches: Mapping[str, Sequence[Rollout]], versions: Mapping[str, int] | None = None
                    ) -> dict[str, dict[str, float]]:
        """Every member of ``batches`` updated on its shard (shards in parallel; ``versions``: the members' current
        versions, an asynchronous run's); metrics in ``batches``' order."""
        t0 = time.perf_counter()
        per_shard: dict[int, dict[str, dict]] = {}
        for member, rollouts in batches.items():
            if member not in self.owner:
                raise KeyError(f"no member named {member!r}; members: {sorted(self.owner)}")
            per_shard.setdefault(self.owner[member], {})[member] = pack_rollouts(list(rollouts))
        versions = dict(versions or {})
        refs = [self.shards[s].update_many.remote(p, self.sync_rollouts, {m: versions[m] for m in p if m in versions})
                for s, p in per_shard.items()]
        merged: dict[str, dict[str, float]] = {}
        busiest = 0.0
        for out, seconds in ray.get(refs):
            merged.update(out)
            busiest = max(busiest, seconds)
        self.totals["calls"] += 1
        self.totals["wall_s"] += time.perf_counter() - t0
        self.totals["compute_s"] += busiest
        return {m: merged[m] for m in batches}

    def update(self, member: str, rollouts: Sequence[Rollout]) -> dict[str, float]:
        return self.update_many({member: rollouts})[member]


class RayPopulation:
    """The population's state interface over the trainer shards (module docstring).

    Args:
        shards: :class:`TrainerShard` handles.
        names: every member, in the run's order.
        owner: member -> index of its shard.
        meta: the LoRA settings of ``population.json`` (rank, alpha, target_modules, dropout, seed).
    """

    def __init__(self, shards: Sequence[Any], names: Sequence[str], owner: Mapping[str, int],
                 meta: Mapping[str, Any]) -> None:
        self.shards = list(shards)
        self._names = list(names)
        self.owner = dict(owner)
        self.meta = dict(meta)
        self.rank = int(meta["rank"])
        self.alpha = meta["alpha"]
        self.target_modules = tuple(meta["target_modules"])
        self.active = self._names[0]

    # structure
    @property
    def names(self) -> list[str]:
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self.owner

    def __iter__(self):
        return iter(list(self._names))

    def _shard(self, name: str) -> Any:
        if name not in self.owner:
            raise KeyError(f"no member named {name!r}; members: {self._names}")
        return self.shards[self.owner[name]]

    def _by_shard(self, names: Sequence[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for n in names:
            self._shard(n)
            out.setdefault(self.owner[n], []).append(n)
        return out

    # what PBT uses
    def state(self, name: str) -> dict[str, torch.Tensor]:
        return ray.get(self._shard(name).state.remote(name))

    def load_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        ray.get(self._shard(name).load_state.remote(name, state))

    def reset_optimizer(self, name: str) -> None:
        ray.get(self._shard(name).reset_optimizer.remote(name))

    # files
    def save(self, name: str, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
        dt = None if dtype is None else str(dtype).removeprefix("torch.")
        return Path(ray.get(self._shard(name).save.remote(name, str(Path(directory).resolve()), dt)))

    def load(self, directory: str | Path, name: str) -> None:
        ray.get(self._shard(name).load.remote(str(Path(directory).resolve()), name))

    def save_all(self, directory: str | Path) -> Path:
        """``LoRAPopulation.save_all``'s layout: each shard writes its members, the driver ``population.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        where = str(directory.resolve())
        ray.get([self.shards[s].save_members.remote(where, ns) for s, ns in self._by_shard(self._names).items()])
        meta = {"names": self._names, "rank": self.meta["rank"], "alpha": self.meta["alpha"],
                "target_modules": list(self.meta["target_modules"]), "dropout": self.meta["dropout"],
                "seed": self.meta["seed"], "active": self.active}
        (directory / POPULATION_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    def load_all(self, directory: str | Path) -> None:
        """Restore a :meth:`save_all` checkpoint (the members must be this run's)."""
        directory = Path(directory)
        meta_file = directory / POPULATION_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(f"{directory} has no {POPULATION_FILE}: not a LoRAPopulation checkpoint")
        meta = json.loads(meta_file.read_text())
        saved = list(meta["names"])
        if sorted(saved) != sorted(self._names):
            raise ValueError(f"checkpoint {directory} holds members {saved}; this run has {self._names}")
        if meta["rank"] != self.rank or set(meta["target_modules"]) != set(self.target_modules):
            raise ValueError(f"checkpoint {directory} has rank {meta['rank']} / targets {meta['target_modules']}, "
                             f"this population rank {self.rank} / targets {list(self.target_modules)}")
        where = str(directory.resolve())
        ray.get([self.shards[s].load_members.remote(where, ns) for s, ns in self._by_shard(saved).items()])
        self._names = saved
        self.active = meta.get("active") if meta.get("active") in saved else saved[0]
