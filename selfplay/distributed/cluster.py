"""Connecting to the Ray cluster and checking that it can hold the run, before any work.

:func:`preflight` is called by the ``populora`` command before the run starts (and by
:func:`selfplay.distributed.backend.RayBackend` when a run is started in-process). Every request the cluster
cannot satisfy raises :class:`ClusterError` with one line naming the problem, which the command turns into exit
status 2:

* Ray is not installed, or the cluster cannot be reached within ``ray.init_timeout_s`` (never an endless wait);
* an actor's demand (CPUs, GPUs) fits no node, the demands together do not fit the cluster, or more sandbox
  nodes are asked for than there are nodes — checked against the nodes' totals first, so nothing is reserved
  for an impossible request;
* the resources exist but are not free: the placement groups are not ready within ``ray.placement_timeout_s``
  (they are removed again: never a pending placement group);
* the run directory is not visible from a node that holds a trainer shard (shards write their members'
  checkpoint files there themselves, so adapters never travel through the driver);
* a sandbox actor cannot start with the isolation ``ray.sandbox_require`` asks for on its node.

What was prepared (the connection, the placement groups, the started sandbox actors) is kept in a
:class:`Prepared` object that the backend then uses.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfplay.distributed.config import RAY_INSTALL_HINT, RayConfig, ray_installed
from selfplay.distributed.errors import ClusterError

log = logging.getLogger(__name__)

__all__ = [
    "ClusterError", "Prepared", "fit_demands", "member_count", "preflight", "sandbox_limits", "split_members",
    "visibility_problems",
]


def split_members(members: Sequence[str], roles: Mapping[str, Sequence[str]], shards: int) -> list[list[str]]:
    """Members per trainer shard, teachers and students mixed.

    Role by role (sorted), each member goes to the next shard in turn (the count carries over from one role to
    the next), so with 2 teachers, 2 students and 2 shards each shard gets one of each. A member acting in two
    roles (the single-agent baseline) is placed once. Within a shard, members keep their global order.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    owner: dict[str, int] = {}
    k = 0
    for role in sorted(roles):
        for m in roles[role]:
            if m not in owner:
                owner[m] = k % shards
                k += 1
    for m in members:
        if m not in owner:
            owner[m] = k % shards
            k += 1
    groups = [[m for m in members if owner[m] == s] for s in range(shards)]
    empty = [s for s, g in enumerate(groups) if not g]
    if empty:
        raise ValueError(f"{shards} shards for {len(members)} members: shard(s) {empty} would hold no member")
    return groups


# --------------------------------------------------------------------------------------- resources


def fit_demands(nodes: Sequence[Mapping[str, float]], demands: Sequence[Mapping[str, float]],
                spread: Sequence[Mapping[str, float]] = ()) -> str | None:
    """Why ``demands`` (one dict of resources per actor) and ``spread`` (one per distinct node) cannot be placed
    on nodes with the given total resources, or ``None`` if they can (first-fit decreasing; ``spread`` bundles go
    first, each on its own node)."""
    free = [dict(n) for n in nodes]
    if len(spread) > len(free):
        return f"{len(spread)} sandbox nodes asked for, the cluster has {len(free)} node(s)"

    def fits(have: Mapping[str, float], want: Mapping[str, float]) -> bool:
        return all(have.get(k, 0.0) + 1e-9 >= v for k, v in want.items() if v > 0)

    def take(have: dict[str, float], want: Mapping[str, float]) -> None:
        for k, v in want.items():
            have[k] = have.get(k, 0.0) - v

    for want in [*spread, *demands]:
        if not any(fits(n, want) for n in nodes):
            biggest = {k: max(n.get(k, 0.0) for n in nodes) for k in want if want[k] > 0}
            return f"an actor needs {_fmt(want)}, but no node has that much (largest per node: {_fmt(biggest)})"
    # spread bundles: each on a distinct node, the roomiest nodes first
    order = sorted(range(len(free)), key=lambda i: -free[i].get("CPU", 0.0))
    used: set[int] = set()
    for want in spread:
        i = next((i for i in order if i not in used and fits(free[i], want)), None)
        if i is None:
            return f"{len(spread)} sandbox actors of {_fmt(want)} each need distinct nodes; not enough nodes have that"
        used.add(i)
        take(free[i], want)
    for want in sorted(demands, key=lambda d: (-d.get("GPU", 0.0), -d.get("CPU", 0.0))):
        i = next((i for i in range(len(free)) if fits(free[i], want)), None)
        if i is None:
            total = {k: sum(d.get(k, 0.0) for d in [*spread, *demands]) for k in ("CPU", "GPU")}
            have = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
            return (f"the actors need {_fmt(total)} in all (trainers, engines, sandboxes), the cluster has "
                    f"{_fmt(have)}; they do not fit")
        take(free[i], want)
    return None


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in res.items() if v > 0) or "nothing"


def visibility_problems(token: str, reports: Mapping[str, tuple[bool, str]]) -> list[str]:
    """Nodes (by id) whose report ``(exists, content)`` of the marker file does not show ``token``."""
    return sorted(node for node, (exists, content) in reports.items() if not exists or content != token)


def sandbox_limits(cfg: Any) -> Any:
    """The limits the env gives its own sandbox (its timeout and memory), for the sandbox actors."""
    return cfg.env.sandbox_limits()


def member_count(cfg: Any, assignment: Mapping[str, str] | None) -> int:
    """Adapters of the run: one per agent, or the distinct adapters of ``assignment``."""
    if assignment is None:
        return cfg.env.num_teachers + cfg.env.num_students
    return len(set(assignment.values()))


# ------------------------------------------------------------------------------------------ prepared


@dataclass
class Prepared:
    """What :func:`preflight` set up: kept for the backend of the same run."""

    config: RayConfig
    limits: dict
    learn_pg: Any
    sandbox_pg: Any
    sandbox_actors: list = field(default_factory=list)
    sandbox_info: list[dict] = field(default_factory=list)
    own_ray: bool = False

    def close(self) -> None:
        """Stop the sandbox actors and release the placement groups (and a private Ray instance)."""
        import ray

        for a in self.sandbox_actors:
            try:
                ray.kill(a)
            except Exception:  # already gone
                pass
        self.sandbox_actors = []
        for pg in (self.learn_pg, self.sandbox_pg):
            if pg is not None:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:
                    pass
        self.learn_pg = self.sandbox_pg = None


_PREPARED: Prepared | None = None


def take_prepared(rc: RayConfig, limits: Mapping[str, Any]) -> Prepared | None:
    """The :class:`Prepared` of a preflight with this section and limits (handed over once), else ``None``."""
    global _PREPARED
    p, _PREPARED = _PREPARED, None
    if p is not None and (p.config != rc or p.limits != dict(limits)):
        p.close()
        return None
    return p


def connect(rc: RayConfig, private_cpus: float = 0.0) -> bool:
    """Connect to the cluster (``rc.address``) or start a private instance, within ``rc.init_timeout_s``.

    A private instance (``address`` unset) declares ``max(cores, private_cpus)`` logical CPUs, so the actors asked
    for fit on one machine (they share its cores). Returns whether this call connected (False: already
    connected)."""
    if not ray_installed():
        raise ClusterError(f"--backend ray: ray is not installed; {RAY_INSTALL_HINT}")
    # Without this Ray may rewrite 127.0.0.1 to the machine's routable address, and a loopback cluster can hang.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    # unset: RAY_ADDRESS (Ray's own convention, e.g. on a cluster node) or else a private instance
    address = rc.address or os.environ.get("RAY_ADDRESS") or None
    shown = address or "(private instance)"
    box: dict[str, Any] = {}

    def init() -> None:
        try:
            extra = {} if address else {"num_cpus": int(max(os.cpu_count() or 1, math.ceil(private_cpus)))}
            # "local": a new instance even where `ray start` left a cluster on this machine ("auto" joins that)
            ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=True, configure_logging=False, **extra)
            box["ok"] = True
        except BaseException as exc:  # reported by the caller
            box["error"] = exc

    if not address:
        # A private instance is started in this thread: Ray ties its processes to the life of the thread that
        # starts them (PR_SET_PDEATHSIG), so a helper thread would take them down when it ends. Starting one
        # locally has Ray's own start-up timeouts and cannot wait on a remote cluster.
        init()
        alive = False
    else:
        t = threading.Thread(target=init, name="ray-init", daemon=True)
        t.start()
        t.join(rc.init_timeout_s)
        alive = t.is_alive()
    if alive:
        raise ClusterError(f"--ray.address {shown}: no connection to the Ray cluster "
                           f"within {rc.init_timeout_s:g} s (ray.init_timeout_s); is `ray start` running there, "
                           "and do RAY_AUTH_MODE / the auth token match the cluster's?")
    if "error" in box:
        exc = box["error"]
        raise ClusterError(f"--ray.address {shown}: cannot connect to the Ray cluster: "
                           f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    return True


def node_totals() -> list[dict[str, Any]]:
    """Alive nodes: ``{"id", "address", "CPU", "GPU"}`` (their total resources)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append({"id": n["NodeID"], "address": n.get("NodeManagerAddress", "?"), "CPU": float(res.get("CPU", 0)),
                    "GPU": float(res.get("GPU", 0))})
    return out


def demands(rc: RayConfig) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """``(learn bundles, sandbox bundle per node)``: trainers then engines, each ``{"CPU", "GPU"}``."""
    trainer = {"CPU": float(rc.trainer_cpus), "GPU": float(rc.trainer_gpus)}
    engine = {"CPU": float(rc.engine_cpus), "GPU": float(rc.engine_gpus)}
    sandbox = {"CPU": float(rc.sandbox_workers_per_node)}
    nodes = len(node_totals()) if rc.sandbox_nodes == 0 else rc.sandbox_nodes
    return [dict(trainer) for _ in range(rc.trainers)] + [dict(engine) for _ in range(rc.engines)], \
        [dict(sandbox) for _ in range(nodes)]


def _bundle(d: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in d.items() if v > 0}


def _reserve(bundles: list[dict[str, float]], strategy: str, timeout_s: float, what: str) -> Any:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([_bundle(b) for b in bundles], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except Exception as exc:
        remove_placement_group(pg)
        kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else type(exc).__name__
        raise ClusterError(f"the {what} ({len(bundles)} x {_fmt(bundles[0])}) could not be placed within "
                           f"{timeout_s:g} s ({kind}): the cluster has the resources in total, but they are in "
                           "use; free them or ask for less (ray.placement_timeout_s)") from None
    return pg


def check_visibility(run_dir: Path, node_ids: Sequence[str], timeout_s: float) -> None:
    """Raise :class:`ClusterError` unless every node in ``node_ids`` sees a marker file written in ``run_dir``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    marker = Path(run_dir) / f".populora-visible-{token}"
    marker.write_text(token)
    try:
        @ray.remote(num_cpus=0, max_retries=0)
        def look(path: str) -> tuple[bool, str]:
            try:
                return True, Path(path).read_text()
            except OSError:
                return False, ""

        ids = sorted(set(node_ids))
        refs = [look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(str(marker))
                for n in ids]
        try:
            reports = dict(zip(ids, ray.get(refs, timeout=timeout_s), strict=True))
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"could not check within {timeout_s:g} s that the run directory {run_dir} is "
                               "visible from every trainer node") from None
    finally:
        marker.unlink(missing_ok=True)
    bad = visibility_problems(token, reports)
    if bad:
        raise ClusterError(f"the run directory {Path(run_dir).resolve()} is not visible from node(s) "
                           f"{', '.join(b[:12] for b in bad)}: trainer shards write checkpoints there; put it on a "
                           "file system every node mounts at the same path")


def preflight(rc: RayConfig, n_members: int, run_dir: Path, limits: Mapping[str, Any]) -> Prepared:
    """Connect, check that the cluster can hold the run, reserve its resources and start the sandbox actors.

    Args:
        rc: the ``ray`` section.
        n_members: the population size (adapters; 1 for the single-agent baseline).
        run_dir: the run directory (it must exist): trainer nodes must see it.
        limits: the fields of the sandbox's :class:`~populora_env.sandbox.Limits` (the env's timeout and memory).

    The result is kept for the run's backend (:func:`take_prepared`). Raises :class:`ClusterError`."""
    global _PREPARED
    if rc.trainers > n_members:
        raise ClusterError(f"--ray.trainers {rc.trainers}: more trainer shards than members ({n_members}); "
                           "every shard needs a member")
    if rc.engine_adapters == "shard" and rc.engines < rc.trainers:
        raise ClusterError(f"--ray.engines {rc.engines}: engine_adapters=shard needs an engine per shard "
                           f"({rc.trainers})")
    workers = rc.sandbox_workers_per_node * max(1, rc.sandbox_nodes)
    own = connect(rc, rc.trainers * rc.trainer_cpus + rc.engines * rc.engine_cpus + workers)
    from selfplay.distributed.sandbox import start_sandbox_actors

    nodes = node_totals()
    learn, spread = demands(rc)
    problem = fit_demands([{"CPU": n["CPU"], "GPU": n["GPU"]} for n in nodes], learn, spread)
    if problem:
        raise ClusterError(f"the cluster ({len(nodes)} node(s)) cannot hold the run: {problem}")
    import ray

    learn_pg = _reserve(learn, "PACK", rc.placement_timeout_s, "trainer shards and engines")
    try:
        sandbox_pg = _reserve(spread, "STRICT_SPREAD", rc.placement_timeout_s, "sandbox actors (one per node)")
    except ClusterError:
        ray.util.remove_placement_group(learn_pg)
        raise
    prepared = Prepared(rc, dict(limits), learn_pg, sandbox_pg, own_ray=own)
    try:
        table = ray.util.placement_group_table(learn_pg)
        trainer_nodes = [table["bundles_to_node_id"][i] for i in range(rc.trainers)]
        check_visibility(run_dir, trainer_nodes, rc.placement_timeout_s)
        prepared.sandbox_actors, prepared.sandbox_info = start_sandbox_actors(rc, limits, sandbox_pg, len(spread))
    except BaseException:
        prepared.close()
        raise
    log.info("ray: %d node(s); %d trainer shard(s), %d engine(s), sandbox on %d node(s) (%s)", len(nodes),
             rc.trainers, rc.engines, len(spread), "; ".join(f"{i['node'][:8]}: {i['mode']}" for i in prepared.sandbox_info))
    _PREPARED = prepared
    return prepared

