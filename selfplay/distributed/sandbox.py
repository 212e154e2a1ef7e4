"""The project's sandbox on every node: one Ray actor per node wrapping :class:`populora_env.sandbox.Sandbox`.

:class:`RaySandbox` has the sandbox's ``run(jobs, deadline_s=None)`` contract, so the env takes it as its
``sandbox=`` and does not know it is distributed. A batch is cut into small chunks (dynamic: an actor gets the
next chunk as soon as it returns one, so a slow node takes fewer), results come back in the order of the jobs.

* **Batch deadline.** ``deadline_s`` (or ``ray.sandbox_deadline_s``, the smaller one) bounds the whole batch:
  each chunk is sent with the time left (the actor's sandbox clips running jobs to it), and chunks not sent by
  then come back ``"timeout"`` without running, as the local sandbox does.
* **Lost actors.** An actor that dies mid-chunk (node lost, process killed) or does not answer within its
  chunk's budget (``ceil(jobs / workers) * (timeout + 2 s) * 2 + 30 s``) is dropped and its chunk is given to
  another actor, so the batch still returns one result per job, the same results a healthy actor would have
  given (a job's result depends on the job, not on the worker). Actors restart (``max_restarts=-1``) and are
  taken back in at a later batch once they answer again. A batch fails with
  :class:`~populora_env.sandbox.SandboxError` only when no actor is left.
* **Isolation.** Each actor builds its sandbox with ``require="strong"`` unless ``ray.sandbox_require='any'``:
  a node without namespaces and seccomp stops the run at start-up (exit 2) instead of running model code
  with weaker isolation. What each node runs is logged (``info()``).

Model-written code runs only in the sandbox workers the actor starts, never in the actor's own process.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from populora_env.sandbox import ExecJob, ExecResult, Limits, SandboxError
from selfplay.distributed.config import RayConfig
from selfplay.distributed.errors import ClusterError

log = logging.getLogger(__name__)

__all__ = ["RaySandbox", "SandboxActor", "start_sandbox_actors"]


class SandboxActor:
    """One node's sandbox (a :class:`populora_env.sandbox.Sandbox` with ``workers`` warm workers)."""

    def __init__(self, workers: int, limits: Mapping[str, Any], require: str | None) -> None:
        from populora_env.sandbox import Sandbox

        self.workers = int(workers)
        self.sandbox = Sandbox(workers=self.workers, limits=Limits(**dict(limits)), require=require)

    def info(self) -> dict[str, Any]:
        """Where this actor runs and the isolation in force there."""
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "workers": self.workers,
                "mode": self.sandbox.mode, "isolation": list(self.sandbox.isolation),
                "missing": list(self.sandbox.missing)}

    def run(self, jobs: Sequence[ExecJob], deadline_s: float | None) -> list[ExecResult]:
        """``Sandbox.run`` on this node."""
        return self.sandbox.run(jobs, deadline_s=deadline_s)


def start_sandbox_actors(rc: RayConfig, limits: Mapping[str, Any], pg: Any, count: int) -> tuple[list, list[dict]]:
    """Start ``count`` sandbox actors, bundle ``i`` of the STRICT_SPREAD placement group ``pg`` each (one per
    node), and wait (``rc.placement_timeout_s``) until each has started its sandbox and reported its isolation.

    Raises :class:`~selfplay.distributed.errors.ClusterError` naming the node when one cannot start."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cls = ray.remote(SandboxActor)
    require = "strong" if rc.sandbox_require == "strong" else None
    actors = [cls.options(num_cpus=rc.sandbox_workers_per_node, max_restarts=-1, max_task_retries=0,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
              .remote(rc.sandbox_workers_per_node, dict(limits), require) for i in range(count)]
    infos = []
    for i, a in enumerate(actors):
        try:
            infos.append(ray.get(a.info.remote(), timeout=rc.placement_timeout_s))
        except Exception as exc:
            for b in actors:
                ray.kill(b, no_restart=True)
            table = ray.util.placement_group_table(pg).get("bundles_to_node_id", {})
            node = str(table.get(i, "?"))[:12]
            text = str(exc).strip().splitlines()
            why = next((ln for ln in text if "Sandbox" in ln or "Error" in ln), text[0] if text else type(exc).__name__)
            raise ClusterError(f"the sandbox actor on node {node} could not start "
                               f"(ray.sandbox_require={rc.sandbox_require}): {why.strip()[:400]}") from None
    for info in infos:
        if info["missing"]:
            log.warning("sandbox on node %s runs in mode %s without: %s", info["node"][:12], info["mode"],
                        "; ".join(info["missing"]))
    return actors, infos


class RaySandbox:
    """The sandbox's ``run(jobs)`` contract over sandbox actors on several nodes (module docstring).

    Args:
        actors: started :class:`SandboxActor` handles (:func:`start_sandbox_actors`).
        workers: sandbox workers per actor (sizes the chunks and their budgets).
        limits: the actors' per-job limits (their timeout sizes the chunk budgets).
        deadline_s: default batch deadline (0: none).
        chunk: jobs per chunk (0: about a quarter of an even share per actor, at least 1).
    """

    def __init__(self, actors: Sequence[Any], workers: int, limits: Limits, deadline_s: float = 0.0,
                 chunk: int = 0) -> None:
        if not actors:
            raise ValueError("RaySandbox needs at least one sandbox actor")
        self.actors = list(actors)
        self.workers = int(workers)
        self.limits = limits
        self.deadline_s = float(deadline_s)
        self.chunk = int(chunk)
        self._dead: dict[int, Any] = {}  # actor index -> ping ref sent when it was dropped
        self.last_batch: dict[str, Any] = {}  # what the last batch did: chunks per actor, retries

    def _chunk_budget(self, jobs: Sequence[ExecJob]) -> float:
        slowest = max((j.timeout_s or self.limits.timeout_s) for j in jobs)
        return math.ceil(len(jobs) / self.workers) * (slowest + 2.0) * 2 + 30.0

    def _revive(self) -> None:
        """Take back dropped actors that answer again (restarted by Ray)."""
        for i, ping in list(self._dead.items()):
            ready, _ = ray.wait([ping], timeout=0)
            if not ready:
                continue
            try:
                ray.get(ping)
            except Exception:
                self._dead[i] = self.actors[i].info.remote()
                continue
            del self._dead[i]

    def _drop(self, i: int, why: str) -> None:
        log.warning("sandbox actor %d dropped for this batch (%s); its chunk goes to another actor", i, why)
        self._dead[i] = self.actors[i].info.remote()

    def run(self, jobs: Sequence[ExecJob], deadline_s: float | None = None) -> list[ExecResult]:
        """Run a batch on the actors; one result per job, in order (module docstring)."""
        jobs = list(jobs)
        for j in jobs:
            if not isinstance(j, ExecJob):
                raise TypeError(f"RaySandbox.run expects ExecJob items, got {type(j).__name__}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 or None, got {deadline_s!r}")
        if not jobs:
            return []
        self._revive()
        limits = [d for d in (deadline_s, self.deadline_s or None) if d is not None]
        t_end = time.monotonic() + min(limits) if limits else None
        live = [i for i in range(len(self.actors)) if i not in self._dead]
        if not live:
            raise SandboxError("no sandbox actor is alive")
        size = self.chunk or max(1, math.ceil(len(jobs) / (4 * len(live))))
        pending = deque((s, min(len(jobs), s + size)) for s in range(0, len(jobs), size))
        results: list[ExecResult | None] = [None] * len(jobs)
        idle = deque(live)
        inflight: dict[Any, tuple[int, tuple[int, int], float]] = {}
        stats = {"chunks": {}, "retried": 0, "chunk_size": size}
        while pending or inflight:
            now = time.monotonic()
            while idle and pending:
                if t_end is not None and now >= t_end - 0.001:
                    for s, e in pending:
                        for k in range(s, e):
                            results[k] = ExecResult(status="timeout", error="the batch deadline passed before "
                                                    "this job could start")
                    pending.clear()
                    break
                i, (s, e) = idle.popleft(), pending.popleft()
                left = None if t_end is None else t_end - now
                ref = self.actors[i].run.remote(jobs[s:e], left)
                inflight[ref] = (i, (s, e), now + self._chunk_budget(jobs[s:e]))
            if not inflight:
                if pending:
                    raise SandboxError("every sandbox actor was lost during the batch")
                break
            wait_s = max(0.0, min(b for _, _, b in inflight.values()) - time.monotonic())
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=min(wait_s, 5.0))
            for ref in ready:
                i, (s, e), _ = inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                        ray.exceptions.RayTaskError) as exc:
                    self._drop(i, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
                    pending.appendleft((s, e))
                    stats["retried"] += 1
                    continue
                if len(out) != e - s:
                    self._drop(i, f"returned {len(out)} results for {e - s} jobs")
                    pending.appendleft((s, e))
                    stats["retried"] += 1
                    continue
                results[s:e] = out
                stats["chunks"][i] = stats["chunks"].get(i, 0) + 1
                idle.append(i)
            now = time.monotonic()
            for ref, (i, (s, e), budget) in list(inflight.items()):
                if now > budget:  # the actor stopped answering: kill it (Ray restarts it) and retry elsewhere
                    inflight.pop(ref)
                    ray.kill(self.actors[i], no_restart=False)
                    self._drop(i, "no answer within the chunk's budget")
                    pending.appendleft((s, e))
                    stats["retried"] += 1
            if pending and not idle and not inflight:
                raise SandboxError("every sandbox actor was lost during the batch")
        self.last_batch = stats
        return [r if r is not None else ExecResult(status="crashed", error="lost") for r in results]

    def close(self) -> None:
        """Stop every actor."""
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.actors = []
