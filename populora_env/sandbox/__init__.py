"""Sandboxed execution of untrusted Python: a pool of warm, isolated fork-server workers.

Public API::

    from populora_env.sandbox import Sandbox, Limits, ExecJob, ExecResult

    with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        r = sb.run_one("def f(x):\\n    return x + 1", call="f(1)")
        rs = sb.run([ExecJob(code=..., call=..., compare_to="2"), ...])
        sb.isolation  # the layers actually in force on this host

See :mod:`populora_env.sandbox.pool` for the design and :mod:`populora_env.sandbox.isolation` for the
layers and how each is detected.
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
