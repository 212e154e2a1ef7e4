"""``--backend ray``: the run's parts as Ray actors behind the interfaces the loop already uses (docs/ray.md).

* :mod:`.config` — the ``ray`` section of the run config and its static checks (no Ray import);
* :mod:`.errors` — :class:`~.errors.ClusterError`, what set-up raises when the cluster cannot hold the run;
* :mod:`.cluster` — connecting, the checks that need the cluster (resources, run directory on every node),
  placement groups (:func:`~.cluster.preflight`);
* :mod:`.sandbox` — a sandbox actor per node and the ``run(jobs)`` contract over them;
* :mod:`.shards` — trainer shards, the trainer and population proxies, the sync metric;
* :mod:`.engines` — generation engines and the ``Generator`` over them;
* :mod:`.packing` — rollouts and completions as numpy arrays on the wire;
* :mod:`.backend` — :class:`~.backend.RayBackend`, what the run's builder (:func:`selfplay.parts.build_parts`)
  asks for; the actors build their members with :func:`selfplay.members.build_members`, as the local run does.

Only :mod:`.config` is imported here, so the run config can be read where Ray is not installed.
"""

import os

# Read by Ray when it is imported: without it Ray may rewrite 127.0.0.1 to the machine's routable address, and a
# loopback cluster (tests, one machine) cannot be reached.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from selfplay.distributed.config import RAY_INSTALL_HINT, RayConfig, ray_installed

__all__ = ["RAY_INSTALL_HINT", "RayConfig", "ray_installed"]
