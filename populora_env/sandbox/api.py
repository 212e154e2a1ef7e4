"""Public value types of the sandbox: limits, jobs, results and errors.

These are plain dataclasses so that other modules (the environment, evaluation) can build jobs and read
results without touching the process machinery in :mod:`populora_env.sandbox.pool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Every status an :class:`ExecResult` can carry.
Status = Literal["ok", "error", "timeout", "memory_limit", "output_limit", "crashed"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "memory_limit", "output_limit", "crashed")


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, or lost every worker). Never raised for a bad job."""


class SandboxUnavailable(SandboxError):
    """The isolation the caller required (``Sandbox(require="strong")``) is not available on this host."""


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every job (a job may override only ``timeout_s``).

    Attributes:
        timeout_s: wall-clock limit per job, enforced by SIGKILL of the job's process group.
        memory_mb: address space the job may add on top of the warm worker's own (RLIMIT_AS).
        cpu_s: CPU-seconds limit (RLIMIT_CPU, whole seconds, rounded up); ``None`` means
            ``ceil(timeout) + 1``, a backstop behind the wall-clock kill.
        max_output_chars: cap on the characters of the value's ``repr`` and of the captured stdout;
            exceeding it gives status ``"output_limit"``, never a truncated value.
        max_threads: threads (and processes) the job's uid may hold (RLIMIT_NPROC, plus a small
            allowance for the worker itself).
        max_file_mb: largest file the job may write (RLIMIT_FSIZE).
        max_open_files: RLIMIT_NOFILE.
        tmp_mb: size of the job's private tmpfs (its cwd; a fresh one per job in namespaced modes).
        max_files: files, directories, fifos and symlinks a job may create there (the tmpfs ``nr_inodes``):
            each costs about 1 KiB of kernel memory that no rlimit counts, so this bounds that memory.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    cpu_s: float | None = None
    max_output_chars: int = 100_000
    max_threads: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    tmp_mb: int = 64
    max_files: int = 10_000

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"Limits.timeout_s must be > 0, got {self.timeout_s!r}")
        if self.memory_mb < 16:
            raise ValueError(f"Limits.memory_mb must be >= 16, got {self.memory_mb!r}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ValueError(f"Limits.cpu_s must be > 0 or None, got {self.cpu_s!r}")
        for name in ("max_output_chars", "max_threads", "max_file_mb", "max_open_files", "tmp_mb",
                     "max_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_open_files < 8:
            raise ValueError("Limits.max_open_files must be >= 8 (the job needs its standard streams)")


@dataclass(frozen=True)
class ExecJob:
    """One unit of untrusted work.

    Attributes:
        code: Python source executed in a fresh ``__main__``-like namespace.
        call: an expression evaluated in that namespace after ``code``; its ``repr`` becomes
            :attr:`ExecResult.value`. ``None`` means: only execute ``code``.
        compare_to: an expression evaluated in the same namespace (after ``code``) and compared with the
            call's value by ``==`` inside the sandbox; the outcome is :attr:`ExecResult.match`.
            Requires ``call``.
        timeout_s: per-job wall-clock override of :attr:`Limits.timeout_s`.
    """

    code: str
    call: str | None = None
    compare_to: str | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise TypeError(f"ExecJob.code must be str, got {type(self.code).__name__}")
        for name in ("call", "compare_to"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"ExecJob.{name} must be str or None, got {type(value).__name__}")
        if self.compare_to is not None and self.call is None:
            raise ValueError("ExecJob.compare_to needs a call whose value it is compared with")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"ExecJob.timeout_s must be > 0 or None, got {self.timeout_s!r}")


@dataclass(frozen=True)
class ExecResult:
    """What happened to one job. Every field was produced in the sandbox; treat strings as untrusted.

    Attributes:
        status: ``"ok"`` | ``"error"`` | ``"timeout"`` | ``"memory_limit"`` | ``"output_limit"`` |
            ``"crashed"``.
        value: ``repr()`` of the call's value (computed in the sandbox), or ``None``.
        match: ``None`` without ``compare_to``; else whether ``value == eval(compare_to)`` was exactly
            ``True`` (a raising ``==`` or a non-bool result gives ``False`` with a note in ``error``).
        stdout: what the job printed (never truncated: too much output gives ``"output_limit"``).
        error: exception type and message with a short traceback tail, or a description of the limit
            or crash; ``None`` when nothing went wrong.
        seconds: wall-clock time of the job as measured by its worker.
    """

    status: Status
    value: str | None = None
    match: bool | None = None
    stdout: str = ""
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the job ran to completion without an exception or a broken limit."""
        return self.status == "ok"
