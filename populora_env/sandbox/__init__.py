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

* A job's reply is written by the sandbox's harness after the call returned, never by the job's code: it
  is sealed with a per-job secret only the harness holds, and the fork server accepts no other (``docs/sandbox.md``
  §7). ``status`` is what happened; with ``ExecResult.plain`` the ``value`` is the ``repr`` of exact builtin
  data, printed by the harness with no job code running: what the call returned (``ExecJob(plain=True)``
  requires it). A value that is not plain data is printed by its own ``__repr__``, a claim. Compare values on
  the host: ``compare_to`` never leaves it (``match`` is computed there), the worker never reads a job's text
  nor keeps its reply, so no job sees another's.
* Time limits count the job's own time (CPU, or wall time not spent waiting for a CPU): a verdict does not
  depend on the machine's load; a job the machine could not time fairly is run again, then
  ``SandboxBusy`` is raised (never a verdict).
* After the job's code started, the harness reads only what it bound before (no attribute, global or builtin is
  looked up: a job can rewrite even a builtin type's dict); ``ExecResult.tamper`` names the first defence a job
  tripped (frames, ``ctypes``, a type's dict, signals, forks, its reply channel, its own exit), recorded outside
  its reach; ``ExecResult.entropy`` says it drew randomness or read the clock (``docs/sandbox.md`` 7.2, 7.3).
* Every worker runs with ``PYTHONHASHSEED=0`` (str hashing and so set order are the same on every worker);
  ``random`` (and ``numpy.random`` when preloaded) is seeded per job by the fork server. ``id()``-dependent output
  can repeat between two jobs on the same worker, so run determinism checks as two jobs and do not rely on that
  alone.
* Workers are started with bubblewrap's ``--die-with-parent`` (PR_SET_PDEATHSIG), which fires when the
  *thread* that started them exits: create the Sandbox in a long-lived thread. (Dead workers are restarted
  on the next batch; a job running at that moment comes back ``"crashed"``.)
* Without namespaces (``mode == "plain"``, see ``Sandbox.missing``) jobs can read world-readable host files
  and leave files in world-writable directories such as ``/tmp`` and ``/dev/shm``, which no limit bounds.
* ``memory_mb`` bounds a job's address space (RLIMIT_AS over its zygote's size); its files are bounded
  separately by ``tmp_mb`` and ``max_files``; memfd, SysV/POSIX shared memory and queues, inotify, byte-range
  locks and pipe resizing are refused. No memory cgroup is used.
"""

from populora_env.sandbox.api import (
    STATUSES,
    TAMPER_CLASSES,
    ExecJob,
    ExecResult,
    Limits,
    SandboxBusy,
    SandboxError,
    SandboxUnavailable,
    Status,
)
from populora_env.sandbox.pool import DEFAULT_PRELOAD, Sandbox

__all__ = [
    "DEFAULT_PRELOAD",
    "STATUSES",
    "TAMPER_CLASSES",
    "ExecJob",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxBusy",
    "SandboxError",
    "SandboxUnavailable",
    "Status",
]
