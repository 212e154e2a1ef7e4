"""A job with ``memory_mb=256`` holds no more than its limit plus the documented slack, by any route.

Each job grabs as much memory as it can through one route, signals that it holds it (renames a file in its
cwd, made before it started grabbing, so no inode or block is needed), and waits until the host deletes it. Meanwhile the host measures what the job really holds, from /proc:
anonymous and shared-anonymous resident memory (``RssAnon``, ``RssShmem``), the job's tmpfs (``statvfs``),
files behind its descriptors (``st_blocks``: memfds, deleted files), and the bytes queued in its pipes
(each pipe reopened through ``/proc/PID/fd`` and asked with ``FIONREAD``). Bounds, per route (see
``docs/sandbox.md``):

* anonymous / shared anonymous (incl. thread stacks): ``memory_mb`` + the zygote's address space
  (RLIMIT_AS is the zygote's size plus ``memory_mb``; a job can dirty its copy of the zygote's pages);
* files: ``tmp_mb`` and ``max_files`` inodes (the job's tmpfs); /tmp, /dev/shm read-only;
* memfd, SysV shared memory, POSIX message queues: refused;
* pipes: ``max_open_files`` descriptors of at most 64 KiB each (resizing refused).
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
import textwrap
import threading
import time
from pathlib import Path

import pytest

from populora_env.sandbox import ExecResult, Limits, Sandbox

from .conftest import assert_workers_clean, sandbox_procs

MB = 1 << 20
LIMITS = Limits(timeout_s=120.0, memory_mb=256, tmp_mb=64, max_files=10_000, max_open_files=64)
PIPE_BYTES = 64 * 1024  # a pipe's default capacity; F_SETPIPE_SZ is refused

# Every route job starts with _READY and ends with _HOLD: say it holds, wait for the host's release, report.
_READY = "import os\nopen('ready', 'w').close()\n"
_HOLD = """
import os as _os, time as _time
_os.rename('ready', 'holding')
for _ in range(12000):
    if not _os.path.exists('holding'):
        break
    _time.sleep(0.01)
"""

ROUTES: dict[str, str] = {
    "anonymous": """
        anon_keep = []
        try:
            while True:
                chunk = bytearray(8 << 20)
                chunk[::4096] = b'\x01' * 2048  # touch every page (calloc'd pages are not resident yet)
                anon_keep.append(chunk)
        except MemoryError:
            pass
        got = len(anon_keep) * 8
        """,
    "shared_anonymous": """
        import mmap
        shm_keep = []
        try:
            while True:
                m = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
                for i in range(0, len(m), 4096):
                    m[i] = 1
                shm_keep.append(m)
        except (OSError, MemoryError):
            pass
        got = len(shm_keep) * 8
        """,
    "threads": """
        import threading
        threading.stack_size(64 << 20)
        stop = threading.Event()
        def grab():
            data = bytearray(32 << 20)
            stop.wait()
        ts = []
        try:
            while True:
                t = threading.Thread(target=grab, daemon=True)
                t.start()
                ts.append(t)
        except (RuntimeError, MemoryError):
            pass
        got = len(ts)
        """,
    "memfd_and_shm": """
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        refused = []
        try:
            os.memfd_create('x')
        except OSError as exc:
            refused.append(('memfd', exc.errno))
        fd = libc.syscall(319 if os.uname().machine == 'x86_64' else 279, b'x', 0)  # raw memfd_create
        refused.append(('raw memfd', ctypes.get_errno() if fd == -1 else 'allowed'))
        try:
            open('/dev/shm/x', 'wb')
        except OSError as exc:
            refused.append(('/dev/shm', exc.errno))
        r = libc.shmget(0, 200 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        refused.append(('shmget', ctypes.get_errno() if r == -1 else 'allowed'))
        r = libc.msgget(0, 0o1600)
        refused.append(('msgget', ctypes.get_errno() if r == -1 else 'allowed'))
        r = libc.semget(0, 1, 0o1600)
        refused.append(('semget', ctypes.get_errno() if r == -1 else 'allowed'))
        r = libc.mq_open(b'/x', os.O_CREAT | os.O_RDWR, 0o600, None)
        refused.append(('mq_open', ctypes.get_errno() if r == -1 else 'allowed'))
        got = refused
        """,
    "tmpfs_files": """
        written = 0
        for where in ('.', '/tmp', '/dev/shm'):
            i = 0
            try:
                while True:
                    with open(f'{where}/big{i}', 'wb') as fh:
                        for _ in range(16):
                            fh.write(b'x' * (1 << 20))
                            written += 1
                    i += 1
            except OSError:
                pass
        got = written
        """,
    "tmpfs_inodes": """
        n = 0
        try:
            while True:
                os.mkfifo(f'p{n}') if n % 2 else os.mkdir(f'd{n}')
                n += 1
        except OSError:
            pass
        got = n
        """,
    "pipes": """
        import fcntl
        pipes = []
        try:
            while True:
                r, w = os.pipe()
                pipes.append((r, w))
        except OSError:
            pass
        resized = 0
        for r, w in pipes:
            try:
                fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
                resized += 1
            except OSError:
                pass
            os.set_blocking(w, False)
            try:
                while True:
                    os.write(w, b'x' * 4096)
            except BlockingIOError:
                pass
        got = (len(pipes), resized)
        """,
}


def _hold_code(body: str) -> str:
    return _READY + textwrap.dedent(body).strip() + "\n" + _HOLD


def _job_pid(box: Sandbox) -> int | None:
    uid = box.worker_uids[0]
    servers = set(box.fork_server_pids)
    pids = [p["pid"] for p in sandbox_procs(box) if p["uid"] == uid and p["pid"] not in servers]
    return pids[0] if pids else None


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if val.strip().endswith("kB"):
            out[key] = int(val.split()[0])
    return out


def measure(pid: int) -> dict[str, int]:
    """What the job process ``pid`` holds, in bytes, per route, read on the host."""
    st = _status_kb(pid)
    vfs = os.statvfs(f"/proc/{pid}/cwd")
    out = {"anon": st.get("RssAnon", 0) * 1024, "shmem": st.get("RssShmem", 0) * 1024,
           "tmpfs": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize, "inodes": vfs.f_files - vfs.f_ffree,
           "fd_files": 0, "pipes": 0, "pipe_fds": 0, "memfds": 0}
    seen = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(path)
            info = os.stat(path)
        except OSError:
            continue
        if target.startswith("/memfd:"):
            out["memfds"] += 1
        if target.startswith("pipe:"):
            out["pipe_fds"] += 1
            if target in seen:
                continue
            seen.add(target)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                queued = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            finally:
                os.close(fd)
            out["pipes"] += queued
        elif os.path.isfile(path) and (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            out["fd_files"] += info.st_blocks * 512
    return out


def hold_and_measure(box: Sandbox, body: str) -> tuple[ExecResult, dict[str, int]]:
    """Run a route job, measure it on the host while it holds its memory, then release it."""
    box.wait_clean()
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", box.run_one(_hold_code(body), "got")))
    runner.start()
    measured = None
    deadline = time.monotonic() + 110
    try:
        while time.monotonic() < deadline and runner.is_alive():
            pid = _job_pid(box)
            if pid is not None and os.path.exists(f"/proc/{pid}/cwd/holding"):
                measured = measure(pid)
                os.unlink(f"/proc/{pid}/cwd/holding")
                break
            time.sleep(0.01)
    finally:
        runner.join()
    assert measured is not None, f"the job never signalled that it holds its memory: {out.get('r')}"
    return out["r"], measured


@pytest.fixture(scope="module")
def box():
    # jobs with ctypes (raw memfd, SysV and POSIX IPC calls) and /proc: these bounds are the kernel's, they
    # hold for a job that broke out of the interpreter too
    with Sandbox(workers=1, limits=LIMITS, _native_jobs=True) as sb:
        sb.wait_clean()
        zygote = sb.zygote_pids[0]  # every job is forked from it
        baseline = _status_kb(zygote)["VmSize"] * 1024  # RLIMIT_AS = this + memory_mb
        yield sb, list(sb.worker_pids), baseline


def _bound(box) -> int:
    """Anonymous bound: memory_mb plus the zygote's address space (a job may dirty its copy of all of it)."""
    return LIMITS.memory_mb * MB + box[2]


def _next_jobs_fine(box) -> None:
    sb, pids, _ = box
    r = sb.run_one("def f(x):\n    return sorted(x)", "f([3, 1, 2])", "[1, 2, 3]")
    assert (r.status, r.value, r.match) == ("ok", "[1, 2, 3]", True)
    assert sb.worker_pids == pids
    assert_workers_clean(sb)


def test_anonymous(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["anonymous"])
    assert r.status == "ok", r
    assert 200 <= int(r.value) <= 256  # stopped by RLIMIT_AS near its limit (MiB in 8 MiB steps)
    assert m["anon"] + m["shmem"] <= _bound(box), m
    _next_jobs_fine(box)


def test_shared_anonymous(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["shared_anonymous"])
    assert r.status == "ok", r
    assert 200 <= int(r.value) <= 256
    assert m["shmem"] >= 200 * MB  # really held, as shared memory
    assert m["anon"] + m["shmem"] <= _bound(box), m
    _next_jobs_fine(box)


def test_threads(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["threads"])
    assert r.status == "ok", r
    assert 1 <= int(r.value) <= LIMITS.max_threads  # RLIMIT_AS (64 MiB stacks) or RLIMIT_NPROC stops them
    assert m["anon"] + m["shmem"] <= _bound(box), m
    _next_jobs_fine(box)


def test_memfd_shm_and_queues_are_refused(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["memfd_and_shm"])
    assert r.status == "ok", r
    assert r.value == str([("memfd", 1), ("raw memfd", 1), ("/dev/shm", 30), ("shmget", 1), ("msgget", 1),
                           ("semget", 1), ("mq_open", 1)])  # EPERM (seccomp) or EROFS
    assert (m["memfds"], m["fd_files"]) == (0, 0)
    # the worker's IPC namespace (shared by all its jobs) holds no SysV object afterwards
    r = box[0].run_one("import os", "[len(open('/proc/sysvipc/' + k).read().splitlines()) for k in "
                                    "('shm', 'msg', 'sem')]")
    assert r.value == "[1, 1, 1]"  # header lines only
    _next_jobs_fine(box)


def test_tmpfs_files(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["tmpfs_files"])
    assert r.status == "ok", r
    assert int(r.value) == LIMITS.tmp_mb  # MiB written in its cwd before ENOSPC; /tmp and /dev/shm refuse all
    assert m["tmpfs"] == LIMITS.tmp_mb * MB, m
    assert m["anon"] + m["shmem"] <= _bound(box), m
    _next_jobs_fine(box)


def test_tmpfs_inodes(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["tmpfs_inodes"])
    assert r.status == "ok", r
    # every inode of the tmpfs is in use: its root directory, 'ready' (made first) and the job's entries
    assert int(r.value) == LIMITS.max_files - 1
    assert m["inodes"] == LIMITS.max_files + 1, m
    _next_jobs_fine(box)


def test_pipes(box) -> None:
    r, m = hold_and_measure(box[0], ROUTES["pipes"])
    assert r.status == "ok", r
    # RLIMIT_NOFILE stopped it: fds 0-3 (stdin, stdout, stderr, the reply pipe) were taken; F_SETPIPE_SZ refused
    n_pipes = (LIMITS.max_open_files - 4) // 2
    assert r.value == str((n_pipes, 0))
    assert m["pipes"] == n_pipes * PIPE_BYTES, m  # every pipe full at its default 64 KiB
    _next_jobs_fine(box)


def test_every_route_at_once(box) -> None:
    """All routes in one job: the total is bounded by memory_mb + worker size + tmp_mb + pipes (the
    documented combined slack), here 256 + ~20 + 64 + 2 MiB; without the route filters the memfd route alone
    held 840 MiB at memory_mb=512."""
    body = "import ctypes, fcntl, mmap, threading\n" + "\n".join(
        textwrap.dedent(ROUTES[k]).strip() + f"\nresult_{k} = got"
        for k in ("tmpfs_files", "shared_anonymous", "anonymous", "memfd_and_shm", "pipes"))
    r, m = hold_and_measure(box[0], body)
    assert r.status == "ok", r
    total = m["anon"] + m["shmem"] + m["tmpfs"] + m["fd_files"] + m["pipes"]
    bound = _bound(box) + LIMITS.tmp_mb * MB + LIMITS.max_open_files // 2 * PIPE_BYTES
    assert total <= bound, (total / MB, bound / MB, m)
    assert total >= LIMITS.memory_mb * MB  # it did grab a lot: the measurement sees it
    _next_jobs_fine(box)
