"""Sandboxed execution of untrusted Python: a pool of warm, isolated fork-server workers.

Public API::

    from populora_env.sandbox import Sandbox, Limits, ExecJob, ExecResult

    with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        r = sb.run_one("def f(x):\\n    return x + 1", call="f(1)")
        rs = sb.run([ExecJob(code=..., call=..., compare_to="2"), ...])
        sb.isolation  # the layers actually in force on this host

See :mod:`populora_env.sandbox.pool` for the design, :mod:`populora_env.sandbox.isolation` for the modes,
and ``docs/sandbox.md`` for every layer, the attack each one stops, and the memory bound route by route.

Known limits (read before using results as rewards):

* A job reports its own result: code under test can write a well-formed reply frame to its reply pipe and
  ``os._exit``, so ``value`` (and ``status``) are the job's claim. What the sandbox guarantees is that the
  claim is made **without the answer**: ``compare_to`` is a literal that never leaves the host (``match`` is
  computed on the host), the worker never reads a job's text nor keeps its reply (so no job sees another's),
  and a forged claim must therefore guess the expected value. Never take a verdict (a pass, a score) from a
  job that ran untrusted code; compare its values on the host, or in a separate job that runs none
  (``docs/sandbox.md`` §7).
* Every worker runs with ``PYTHONHASHSEED=0`` (str hashing and so set order are the same on every worker);
  ``random`` (and ``numpy.random`` when preloaded) is reseeded per job. ``id()``-dependent output can repeat
  between two jobs on the same worker, so run determinism checks as two jobs and do not rely on that alone.
* Workers are started with bubblewrap's ``--die-with-parent`` (PR_SET_PDEATHSIG), which fires when the
  *thread* that started them exits: create the Sandbox in a long-lived thread. (Dead workers are restarted
  on the next batch; a job running at that moment comes back ``"crashed"``.)
* Without namespaces (``mode == "plain"``, see ``Sandbox.missing``) jobs can read world-readable host files
  and leave files in world-writable directories such as ``/tmp`` and ``/dev/shm``, which no limit bounds.
* ``memory_mb`` bounds a job's address space (RLIMIT_AS over the worker's own size); its files are bounded
  separately by ``tmp_mb`` and ``max_files``; memfd, SysV/POSIX shared memory and queues, inotify, byte-range
  locks and pipe resizing are refused. No memory cgroup is used.
"""

from populora_env.sandbox.api import (
    STATUSES,
    ExecJob,
    ExecResult,
    Limits,
    SandboxError,
    SandboxUnavailable,
    Status,
)
from populora_env.sandbox.pool import DEFAULT_PRELOAD, Sandbox

__all__ = [
    "DEFAULT_PRELOAD",
    "STATUSES",
    "ExecJob",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "Status",
]
