"""Public value types of the sandbox: limits, jobs, results and errors.

These are plain dataclasses so that other modules (the environment, evaluation) can build jobs and read
results without touching the process machinery in :mod:`populora_env.sandbox.pool`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from populora_env.checks import check, check_int, check_number
from populora_env.literals import literal_value

#: Every status an :class:`ExecResult` can carry.
Status = Literal["ok", "error", "timeout", "memory_limit", "output_limit", "crashed", "infra"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "memory_limit", "output_limit", "crashed", "infra")

#: Every class :attr:`ExecResult.tamper` can name, in code order (``docs/sandbox.md`` section 7.2): frames, the
#: garbage collector's walks, trace hooks (``introspection``); ``ctypes``, ``marshal``, code objects
#: (``native``); a builtin type's dictionary written (``type_dict``); a signal handler or a signal to another
#: process (``signal``); a fork or a program (``process``); bytes on the reply channel not sealed by the harness
#: (``reply_forgery``); the process ended without the harness's reply (``exit``).
TAMPER_CLASSES: tuple[str, ...] = ("introspection", "native", "type_dict", "signal", "process", "reply_forgery",
                                   "exit")


#: Upper bounds of every limit (a limit is finite and at most this): a job's wall clock, its CPU seconds, its
#: address space, its reply and the rest. A larger value is refused when the :class:`Limits` or
#: :class:`ExecJob` is built, before anything is sent to a worker (``timeout_s=9e9`` used to overflow the
#: worker's ``select`` and leave the pool unusable).
MAX_TIMEOUT_S = 3600.0
MAX_LIMITS: dict[str, int] = {
    "memory_mb": 1 << 20,  # 1 TiB
    "max_output_chars": 1 << 28,
    "max_threads": 4096,
    "max_file_mb": 1 << 16,
    "max_open_files": 1 << 16,
    "tmp_mb": 1 << 16,
    "max_files": 1 << 24,
}


def _check_seconds(owner: str, value: object, *, optional: bool) -> None:
    """A finite number of seconds in ``(0, MAX_TIMEOUT_S]`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise ValueError(f"{owner} must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value!r}")


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, or lost every worker). Never raised for a bad job."""


class SandboxBusy(SandboxError):
    """A job could not be given its time (the machine was too busy) even after the sandbox's retries: no
    verdict is given for the machine's load (``Sandbox(infra_retries=...)``)."""


class SandboxUnavailable(SandboxError):
    """The isolation the caller required (``Sandbox(require="strong")``) is not available on this host."""


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every job (a job may override only ``timeout_s``).

    Attributes:
        timeout_s: time limit per job, in the job's own time: it is killed (status ``"timeout"``) once it used
            this many seconds of CPU, or of wall time not spent waiting for a CPU, so a verdict does not depend
            on how busy the machine is. A job kept waiting past ten times the limit plus 10 s gets status
            ``"infra"`` and is run again (``Sandbox(infra_retries=...)``).
        memory_mb: address space the job may add on top of the warm worker's own (RLIMIT_AS).
        cpu_s: CPU-seconds limit (RLIMIT_CPU, whole seconds, rounded up); ``None`` means
            ``ceil(timeout) + 1``, a backstop behind the time limit.
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

    def __post_init__(self) -> None:  # a bad Limits is refused when built: it is also built per job by the host
        self.validate()

    def validate(self) -> None:
        """Check every limit; raise :class:`~populora_env.checks.ConfigError` (a ``ValueError``) naming it."""
        check_number("timeout_s", self.timeout_s, low=0.0, high=MAX_TIMEOUT_S, low_open=True)
        if self.cpu_s is not None:
            check_number("cpu_s", self.cpu_s, low=0.0, high=MAX_TIMEOUT_S, low_open=True)
        for name, top in MAX_LIMITS.items():
            check_int(name, getattr(self, name), 1, top)
        check_int("memory_mb", self.memory_mb, 16)
        check(self.max_open_files >= 8, "max_open_files",
              f"must be >= 8 (the job needs its standard streams), got {self.max_open_files}")


@dataclass(frozen=True)
class ExecJob:
    """One unit of untrusted work.

    Attributes:
        code: Python source executed in a fresh ``__main__``-like namespace.
        call: an expression evaluated in that namespace after ``code``; its ``repr`` becomes
            :attr:`ExecResult.value`. ``None`` means: only execute ``code``.
        compare_to: the expected value, as a Python literal (``ast.literal_eval`` syntax). It is **never sent
            to the worker**: the host parses the job's ``value`` as a literal and compares the two values with
            ``==`` (builtin types only, so no job code runs); the outcome is :attr:`ExecResult.match`. A job
            therefore cannot read its expected value, and a forged reply must guess it. Requires ``call``;
            a ``compare_to`` that is not a literal is refused here.
        timeout_s: per-job wall-clock override of :attr:`Limits.timeout_s` (finite, at most
            :data:`MAX_TIMEOUT_S`).
        plain: the call's value must be plain data, built only from exact builtin types (``int``, ``float``,
            ``complex``, ``str``, ``bytes``, ``bool``, ``None``, ``list``, ``tuple``, ``set``, ``frozenset``,
            ``dict``; no subclass, no cycle); otherwise the result is an ``"error"`` whose text holds
            :data:`~populora_env.literals.NOT_LITERAL_MARKER`. The check and the ``repr`` are the harness's,
            made after the call returned (:attr:`ExecResult.plain`).
    """

    code: str
    call: str | None = None
    compare_to: str | None = None
    timeout_s: float | None = None
    plain: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise TypeError(f"ExecJob.code must be str, got {type(self.code).__name__}")
        for name in ("call", "compare_to"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"ExecJob.{name} must be str or None, got {type(value).__name__}")
        if not isinstance(self.plain, bool):
            raise TypeError(f"ExecJob.plain must be a bool, got {type(self.plain).__name__}")
        if self.plain and self.call is None:
            raise ValueError("ExecJob.plain needs a call whose value is checked")
        if self.compare_to is not None and self.call is None:
            raise ValueError("ExecJob.compare_to needs a call whose value it is compared with")
        if self.compare_to is not None:
            if not literal_value(self.compare_to)[0]:
                raise ValueError("ExecJob.compare_to must be a Python literal (it is compared on the host)")
        _check_seconds("ExecJob.timeout_s", self.timeout_s, optional=True)


@dataclass(frozen=True)
class ExecResult:
    """What happened to one job. Every field was produced in the sandbox; treat strings as untrusted.

    Attributes:
        status: ``"ok"`` | ``"error"`` | ``"timeout"`` | ``"memory_limit"`` | ``"output_limit"`` |
            ``"crashed"`` (``"infra"``, the machine too busy to time the job, never leaves :meth:`Sandbox.run`:
            such a job is run again, or ``SandboxBusy`` is raised).
        value: ``repr()`` of the call's value (computed in the sandbox: the job's claim), or ``None``.
        match: ``None`` without ``compare_to``; else whether ``value``, parsed on the host as a Python literal,
            equals the literal ``compare_to`` (``False`` when the value is not a literal, e.g. ``nan`` or an
            object's default ``repr``). Decided by the host, never by the job.
        stdout: what the job printed (never truncated: too much output gives ``"output_limit"``).
        error: exception type and message with a short traceback tail, or a description of the limit
            or crash; ``None`` when nothing went wrong.
        seconds: wall-clock time of the job as measured by its worker.
        plain: ``value`` is the ``repr`` of plain data (exact builtin types only), checked and printed by the
            sandbox's harness after the call had returned, with no other thread of the job alive: what the
            call really returned. ``False``: the text came from the job's own code (a ``__repr__``), a claim.
        tamper: the first sandbox defence the job tripped, by class (:data:`TAMPER_CLASSES`), whatever its status
            and even if the job caught the refusal and went on; ``None`` when it tripped none. Recorded by the
            fork server as it happened (outside the job's process) and by the harness in the sealed reply, so the
            job can neither forge nor clear it.
        entropy: the job drew randomness from the sandbox: it moved the interpreter's global ``random``
            generator (seeded by the harness for each job), or read the OS's entropy (``os.urandom``,
            ``random.SystemRandom``, an unseeded ``random.Random()``...). Such a run is not a function of its
            input (``docs/sandbox.md`` section 7.3).
    """

    status: Status
    value: str | None = None
    match: bool | None = None
    stdout: str = ""
    error: str | None = None
    seconds: float = 0.0
    plain: bool = False
    tamper: str | None = None
    entropy: bool = False

    @property
    def ok(self) -> bool:
        """True when the job ran to completion without an exception or a broken limit."""
        return self.status == "ok"
