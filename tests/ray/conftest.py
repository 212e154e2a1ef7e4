"""A Ray cluster on this one machine for the ``ray`` tests: a head and two fake extra nodes
(``ray.cluster_utils.Cluster``), started once per session; every test connects to it as a driver, and CLI
runs join it with ``--ray.address``."""

from __future__ import annotations

import os

import pytest

if os.environ.get("POPULORA_REQUIRE_RAY") == "1":  # CI: a missing ray is an error, not a skip
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (bash scripts/install.sh --ray)")

NODE_CPUS = 4  # logical CPUs per node (Ray's bookkeeping; the machine's cores are shared by all of them)


_STARTED: list = []  # the session's cluster, once started


def _shutdown() -> None:
    while _STARTED:
        cluster = _STARTED.pop()
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def ray_cluster():
    """``(cluster, address)``: head + 2 nodes, ``NODE_CPUS`` logical CPUs each. Stopped after the last test of
    this directory (not at the end of the session: its idle processes would share the cores with later tests)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": NODE_CPUS, "include_dashboard": False})
    _STARTED.append(cluster)
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=NODE_CPUS)
        cluster.wait_for_nodes(timeout=180)
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
        yield cluster, cluster.address
    finally:
        _shutdown()


def pytest_runtest_teardown(item, nextitem):
    here = os.path.dirname(__file__)
    if _STARTED and (nextitem is None or not str(nextitem.path).startswith(here + os.sep)):
        _shutdown()
