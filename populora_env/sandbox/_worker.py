"""The warm sandbox worker: a fork server that runs each job in a fresh, confined child.

This file is NOT imported by the host. Its source is handed to a fresh interpreter
(``python -S -s -c <source> <config-json>``), usually inside bubblewrap namespaces, so it must only use the
standard library (plus ``pyseccomp``, which is pure ctypes). Protocol on the worker's stdin/stdout:
frames of a 4-byte big-endian length followed by UTF-8 JSON.

Per job the worker forks a child which, before touching any job text:
  1. becomes its own process group (the worker kills the whole group afterwards);
  2. drops to the worker's unprivileged uid/gid if the worker is still root (fallback mode);
  3. moves into a fresh private temp dir, takes stdin from /dev/null, stdout into a bounded pipe;
  4. sets rlimits (AS, CPU, NPROC, FSIZE, NOFILE, CORE);
  5. loads a seccomp deny-list (no process creation, sockets, exec, ptrace, namespaces, signals aimed
     outside itself, ...).
The worker enforces the wall clock with SIGKILL of the child's process group, always reaps it, kills
stragglers, wipes the temp area and reports. Only the first framed reply of the child is parsed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

_HEADER = struct.Struct(">I")
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SECCOMP_SET_MODE_FILTER = 1
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
# Stand-in for the job's pid while the filter is compiled once per worker; patched per child.
# Larger than any pid (pid_max <= 2**22), and not a syscall number or an audit arch value.
_PID_PLACEHOLDER = 0x7A5EC0DE
_MAX_ERROR_CHARS = 4000
_REPLY_SLACK = 64 * 1024

# Syscalls refused with EPERM (where the running kernel/libseccomp knows them).
_DENY_EPERM = (
    # process creation and program execution (threads use clone with CLONE_THREAD, allowed below)
    "fork", "vfork", "execve", "execveat",
    # network
    "socket", "socketpair",
    # debugging / other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "tkill",
    # file systems and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount", "fsconfig",
    "fspick", "move_mount", "open_tree", "mount_setattr", "name_to_handle_at", "open_by_handle_at",
    "quotactl", "swapon", "swapoff", "acct",
    # kernel interfaces
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "syslog", "userfaultfd", "lookup_dcookie",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "personality", "uselib", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "sethostname",
    "setdomainname",
    # identity changes
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid",
    "setgroups", "capset",
    # leaving the process group the worker kills
    "setsid", "setpgid",
)
# Syscalls refused unless their first argument is the job's own pid (signals, rlimits of others).
_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Syscalls refused unless their first argument is 0 (= the calling process).
_ZERO_ONLY = ("prlimit64", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
              "migrate_pages", "move_pages", "ioprio_set")


class _SockFprog(ctypes.Structure):
    """``struct sock_fprog`` for seccomp(2)."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _write_frame(fd: int, obj: object) -> None:
    data = json.dumps(obj).encode("utf-8", "surrogatepass")
    data = _HEADER.pack(len(data)) + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> object | None:
    head = _read_exact(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    body = _read_exact(fd, size)
    if body is None:
        return None
    return json.loads(body.decode("utf-8", "surrogatepass"))


def _short(text: str, limit: int = _MAX_ERROR_CHARS, len=len) -> str:  # noqa: A002
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"... [{len(text) - limit} chars cut] ..." + text[-limit // 2:]


class Worker:
    """The fork server. One instance per worker process."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.uid: int = cfg["uid"]
        self.gid: int = cfg["gid"]
        self.drop_in_child: bool = cfg["drop_in_child"]
        self.base: str = cfg["tmp_base"]
        self.wipe_keep: frozenset[str] = frozenset(cfg.get("wipe_keep", ()))  # read-only binds inside base
        # In fallback mode the worker is root and the job another uid, which must traverse the base.
        self.base_mode = 0o711 if self.drop_in_child else 0o700
        self.pidns_private: bool = False
        self.seccomp_error: str | None = None
        self.pyseccomp = None
        self.bpf: bytes | None = None  # the compiled filter with _PID_PLACEHOLDER
        self.bpf_pid_offsets: list[int] = []
        self.libc = ctypes.CDLL(cfg["libs"].get("c") or None, use_errno=True)
        self.baseline_as = 0

    # ------------------------------------------------------------------ start-up
    def boot(self) -> dict:
        """Confine the worker itself, import what jobs need, and describe the result."""
        cfg = self.cfg
        if cfg["setuid_at_boot"]:
            # Privileged bubblewrap (root host): the only capabilities left are SETUID/SETGID/CHOWN.
            os.makedirs(self.base, mode=0o700, exist_ok=True)
            os.chown(self.base, self.uid, self.gid)
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)  # clears every remaining capability
        else:
            os.makedirs(self.base, mode=self.base_mode, exist_ok=True)
            os.chmod(self.base, self.base_mode)
        # Same-uid jobs must not open /proc/<worker>/mem, /proc/<worker>/fd, ... (ptrace access check).
        self.libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        # Orphans of a job come back to us, so we can always reap them.
        self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        sys.path[:] = cfg["sys_path"]
        if cfg["seccomp"]:
            self._import_pyseccomp()
        preload_errors = {}
        for name in cfg["preload"]:
            try:
                __import__(name)
            except Exception as exc:  # a bad preload entry is reported, not fatal
                preload_errors[name] = f"{type(exc).__name__}: {exc}"
        import gc
        import traceback  # noqa: F401  (used by every child: import once here)

        gc.collect()
        gc.freeze()  # children never walk (and so never copy-on-write) the worker's own objects
        with open("/proc/self/statm") as fh:
            self.baseline_as = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        ns = {}
        for name in ("net", "pid", "mnt", "ipc", "uts", "user"):
            try:
                ns[name] = os.readlink(f"/proc/self/ns/{name}")
            except OSError:
                ns[name] = None
        host_ns = cfg.get("host_ns") or {}
        self.pidns_private = bool(ns["pid"] and host_ns.get("pid") and ns["pid"] != host_ns["pid"])
        return {
            "type": "ready",
            "pid": os.getpid(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "ns": ns,
            "seccomp_error": self.seccomp_error,
            "preload_errors": preload_errors,
            "baseline_as": self.baseline_as,
            "python": sys.version.split()[0],
        }

    def _import_pyseccomp(self) -> None:
        import ctypes.util

        libs = self.cfg["libs"]
        original = ctypes.util.find_library

        def find_library(name: str) -> str | None:  # avoid spawning ldconfig/gcc in the sandbox
            return libs.get(name) or original(name)

        ctypes.util.find_library = find_library
        try:
            import pyseccomp

            self.pyseccomp = pyseccomp
            self._compile_filter()
        except Exception as exc:
            self.seccomp_error = f"{type(exc).__name__}: {exc}"
            self.pyseccomp = None
        finally:
            ctypes.util.find_library = original

    def _compile_filter(self) -> None:
        """Compile the deny-list once to classic BPF; each child only patches in its pid and loads it.

        Building and loading through libseccomp costs about 2 ms per fork on a busy 2-core VM; loading a
        ready BPF program is a single syscall.
        """
        import platform
        import tempfile

        if platform.machine() not in _SYS_SECCOMP:
            raise RuntimeError(f"no seccomp syscall number known for {platform.machine()}")
        self.seccomp_nr = _SYS_SECCOMP[platform.machine()]
        with tempfile.TemporaryFile(dir=self.base) as fh:
            self._build_filter(_PID_PLACEHOLDER).export_bpf(fh)
            fh.seek(0)
            bpf = fh.read()
        if not bpf or len(bpf) % 8:
            raise RuntimeError(f"unexpected BPF export of {len(bpf)} bytes")
        offsets = []
        for off in range(0, len(bpf), 8):
            code, _jt, _jf, k = struct.unpack_from("=HBBI", bpf, off)
            if k == _PID_PLACEHOLDER:
                if code != _BPF_JEQ_K:
                    raise RuntimeError(f"pid placeholder in an unexpected BPF instruction 0x{code:x}")
                offsets.append(off + 4)
        if not offsets:  # libseccomp shares identical rule blocks, so one occurrence can serve all
            raise RuntimeError("pid placeholder not found in the compiled filter")
        self.bpf = bpf
        self.bpf_pid_offsets = offsets
        # A mutable copy plus the sock_fprog pointing at it; children inherit both at the same address.
        self.bpf_prog = bytearray(bpf)
        self._bpf_buf = (ctypes.c_ubyte * len(bpf)).from_buffer(self.bpf_prog)
        self._bpf_fprog = _SockFprog(len(bpf) // 8, ctypes.addressof(self._bpf_buf))
        self.bpf_fprog_ref = ctypes.byref(self._bpf_fprog)

    def _reach_runtime_after_drop(self) -> None:
        """Fallback mode only (no namespaces, root host): keep the Python runtime importable after the uid drop.

        The interpreter may live under a directory the job uid cannot traverse (e.g. ``/root/.pyenv``). While
        still root, open an O_PATH fd to each ``sys.path`` directory and import through
        ``/proc/self/fd/N``: path checks then start at that directory, so the job reaches exactly the
        runtime's (world-readable) files and not its ancestors.
        """
        paths, remap = [], []
        for entry in sys.path:
            try:
                fd = os.open(entry, os.O_PATH | os.O_DIRECTORY)
            except OSError:
                continue
            paths.append(f"/proc/self/fd/{fd}")
            remap.append((entry.rstrip("/") + "/", f"/proc/self/fd/{fd}/"))
        sys.path[:] = paths
        sys.path_importer_cache.clear()
        remap.sort(key=lambda pair: -len(pair[0]))
        for module in list(sys.modules.values()):  # submodules of preloaded packages (encodings.idna, ...)
            path = getattr(module, "__path__", None)
            if isinstance(path, list):
                for i, entry in enumerate(path):
                    for old, new in remap:
                        if entry.startswith(old):
                            path[i] = new + entry[len(old):]
                            break

    def _load_filter(self, pid: int) -> None:
        """In the child: patch our pid into the compiled filter, set no_new_privs, load it.

        Everything (buffer, ctypes structure, bound functions) was prepared in the worker, so the child
        only patches a few bytes and makes three system calls.
        """
        prog = self.bpf_prog
        for off in self.bpf_pid_offsets:
            struct.pack_into("=I", prog, off, pid)
        if self.libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if self.libc.syscall(self.seccomp_nr, _SECCOMP_SET_MODE_FILTER, 0, self.bpf_fprog_ref) != 0:
            raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")

    def _build_filter(self, pid: int):
        sc = self.pyseccomp
        flt = sc.SyscallFilter(sc.ALLOW)
        eperm = sc.ERRNO(errno.EPERM)

        def rule(action: int, name: str, *args) -> None:
            try:
                flt.add_rule(action, name, *args)
            except (OSError, ValueError, RuntimeError):
                # unknown on this kernel/libseccomp: cannot be called here either
                # (libseccomp only rejects names it cannot resolve for the native arch)
                pass

        for name in _DENY_EPERM:
            rule(eperm, name)
        # clone: only threads (CLONE_THREAD set) are allowed; clone3 -> ENOSYS so libc falls back to clone.
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for name in _SELF_ONLY:
            rule(eperm, name, sc.Arg(0, sc.NE, pid))
        for name in _ZERO_ONLY:
            rule(eperm, name, sc.Arg(0, sc.NE, 0))
        return flt

    # ------------------------------------------------------------------ per job
    def serve(self, req_fd: int, rep_fd: int) -> None:
        """Answer job frames until the host closes our stdin."""
        while True:
            job = _read_frame(req_fd)
            if job is None:
                return
            try:
                result = self.run(job)
            except Exception as exc:  # a bug here must not kill the worker silently
                result = {"status": "crashed", "value": None, "match": None, "stdout": "",
                          "error": f"sandbox worker error: {type(exc).__name__}: {exc}", "seconds": 0.0}
            _write_frame(rep_fd, result)

    def run(self, job: dict) -> dict:
        lim = job["limits"]
        cap = int(lim["max_output_chars"])
        timeout = float(job["timeout_s"])
        jobdir = os.path.join(self.base, f"job-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(jobdir, 0o700)
        if self.drop_in_child:
            os.chown(jobdir, self.uid, self.gid)
        r_rep, w_rep = os.pipe2(os.O_CLOEXEC)
        r_out, w_out = os.pipe2(os.O_CLOEXEC)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.close(r_rep)
                os.close(r_out)
                self._child(job, w_rep, w_out, jobdir)
            finally:
                os._exit(71)
        os.close(w_rep)
        os.close(w_out)
        try:
            os.setpgid(pid, pid)  # also done by the child: whichever runs first wins the race
        except OSError:
            pass
        try:
            return self._supervise(pid, r_rep, r_out, t0, timeout, cap, lim)
        finally:
            os.close(r_rep)
            os.close(r_out)
            self._cleanup()

    def _supervise(self, pid: int, r_rep: int, r_out: int, t0: float, timeout: float, cap: int,
                   lim: dict) -> dict:
        deadline = t0 + timeout
        out = bytearray()
        rep = bytearray()
        rep_cap = cap * 6 + _REPLY_SLACK
        out_cap = cap * 4 + 4  # UTF-8: cap chars are at most 4 * cap bytes
        open_fds = [r_rep, r_out]
        for fd in open_fds:
            os.set_blocking(fd, False)
        timed_out = out_over = rep_over = False
        reply = None
        while open_fds and reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(open_fds, [], [], remaining)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    open_fds.remove(fd)
                    continue
                if fd == r_out:
                    out += data
                    if len(out) > out_cap:
                        out_over = True
                else:
                    rep += data
                    if len(rep) > rep_cap:
                        rep_over = True
                    elif len(rep) >= _HEADER.size:
                        (size,) = _HEADER.unpack_from(rep)
                        if size > rep_cap:
                            rep_over = True
                        elif len(rep) >= _HEADER.size + size:
                            reply = bytes(rep[_HEADER.size:_HEADER.size + size])  # first frame only
            if out_over or rep_over:
                break
        seconds = time.monotonic() - t0
        if reply is not None and not out_over:
            # The child flushed stdout before replying: whatever it printed is already in the pipe.
            while len(out) <= out_cap:
                try:
                    data = os.read(r_out, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                out += data
            out_over = len(out) > out_cap
        # Kill the whole job process group, even after a normal reply (threads, stragglers).
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass
        _, wstatus, rusage = os.wait4(pid, 0)
        stdout = out.decode("utf-8", "replace")
        if len(stdout) > cap:
            out_over = True
        base = {"value": None, "match": None, "stdout": "", "seconds": seconds}
        if out_over:
            return {**base, "status": "output_limit",
                    "error": f"stdout exceeded max_output_chars={cap} (output is never truncated)"}
        if timed_out:
            return {**base, "status": "timeout", "stdout": stdout,
                    "error": f"wall-clock limit of {timeout:g} s exceeded; the job was killed"}
        if rep_over:
            return {**base, "status": "output_limit",
                    "error": f"the job's reply exceeded the size allowed by max_output_chars={cap}"}
        if reply is not None:
            parsed = self._parse_reply(reply, cap)
            parsed["stdout"] = stdout
            parsed["seconds"] = seconds
            return parsed
        # No reply: the child died.
        cpu = rusage.ru_utime + rusage.ru_stime
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= float(lim["cpu_s"]) - 0.05):
                return {**base, "status": "timeout", "stdout": stdout,
                        "error": f"CPU time limit of {lim['cpu_s']:g} s exceeded"}
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return {**base, "status": "crashed", "stdout": stdout,
                    "error": f"the job process was killed by {name}"}
        code = os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else -1
        return {**base, "status": "crashed", "stdout": stdout,
                "error": f"the job process exited with code {code} without a result (os._exit?)"}

    @staticmethod
    def _parse_reply(raw: bytes, cap: int) -> dict:
        bad = {"status": "crashed", "value": None, "match": None, "error": "malformed reply from the job"}
        try:
            msg = json.loads(raw.decode("utf-8", "surrogatepass"))
        except (ValueError, UnicodeDecodeError):
            return bad
        if not isinstance(msg, dict):
            return bad
        status, value, match, error = msg.get("status"), msg.get("value"), msg.get("match"), msg.get("error")
        if status not in ("ok", "error", "memory_limit", "output_limit"):
            return bad
        if value is not None and not isinstance(value, str):
            return bad
        if match is not None and not isinstance(match, bool):
            return bad
        if error is not None and not isinstance(error, str):
            return bad
        if value is not None and len(value) > cap:
            return {**bad, "status": "output_limit", "error": f"value repr exceeds max_output_chars={cap}"}
        return {"status": status, "value": value, "match": match,
                "error": None if error is None else _short(error)}

    def _cleanup(self) -> None:
        if self.pidns_private and os.getuid() != 0:
            # Our own pid namespace and an unprivileged uid: this reaches only job stragglers
            # (bubblewrap's init is root; kill(-1) never signals the caller itself).
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        while True:  # reap orphans handed to us as subreaper
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        self._wipe(self.base, self.base_mode, self.wipe_keep)

    @staticmethod
    def _wipe(base: str, mode: int, keep: frozenset[str] = frozenset()) -> None:
        """Empty the job area. A job may have chmod-ed things to 0: restore access and retry once."""
        failed = []

        def note(*_args: object) -> None:
            failed.append(True)

        for attempt in range(2):
            failed.clear()
            try:
                os.chmod(base, mode)
                entries = os.listdir(base)
            except OSError:
                return
            for name in entries:
                if name in keep:
                    continue
                path = os.path.join(base, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, onerror=note)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        failed.append(True)
            if not failed or attempt:
                return
            for root, dirs, _files in os.walk(base):  # top-down: fix each dir before descending into it
                if root == base:
                    dirs[:] = [d for d in dirs if d not in keep]
                for d in dirs:
                    try:
                        os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
                    except OSError:
                        pass

    # ------------------------------------------------------------------ in the child
    def _child(self, job: dict, w_rep: int, w_out: int, jobdir: str) -> None:  # pragma: no cover
        lim = job["limits"]
        rep_fd = w_rep
        try:
            os.setpgid(0, 0)
            devnull = os.open("/dev/null", os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(w_out, 1)
            os.dup2(devnull, 2)
            os.dup2(w_rep, 3, inheritable=False)
            rep_fd = 3
            os.closerange(4, 1 << 16)
            if self.drop_in_child:
                self._reach_runtime_after_drop()
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                # setuid made us non-dumpable (so /proc/self/fd would be root's); we need it for imports and
                # no other process of this uid exists while the job runs.
                self.libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            os.chdir(jobdir)
            mb = 1024 * 1024
            as_bytes = self.baseline_as + int(lim["memory_mb"]) * mb
            cpu = int(-(-float(lim["cpu_s"]) // 1))
            nproc = int(lim["max_threads"]) + 4
            for res, value in (
                (resource.RLIMIT_AS, (as_bytes, as_bytes)),
                (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                (resource.RLIMIT_NPROC, (nproc, nproc)),
                (resource.RLIMIT_FSIZE, (int(lim["max_file_mb"]) * mb,) * 2),
                (resource.RLIMIT_NOFILE, (int(lim["max_open_files"]),) * 2),
                (resource.RLIMIT_CORE, (0, 0)),
            ):
                resource.setrlimit(res, value)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead
            if self.bpf is not None:
                self._load_filter(os.getpid())
            elif self.cfg["seccomp"]:
                raise RuntimeError("seccomp was requested but could not be set up")
        except BaseException as exc:  # never run the job half-confined
            try:
                _write_frame(rep_fd, {"status": "error", "value": None, "match": None,
                                     "error": f"sandbox setup failed: {type(exc).__name__}: {exc}"})
            finally:
                os._exit(70)
        # sys.stdin/stdout/stderr already wrap fds 0/1/2 (now /dev/null, the stdout pipe, /dev/null) and the
        # worker never wrote to them, so their buffers are empty.
        sys.argv = ["<job>"]
        # Each job sees fresh randomness (a fork would otherwise repeat the worker's random state).
        if "random" in sys.modules:
            sys.modules["random"].seed()
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            try:
                np_random.seed()
            except Exception:
                pass
        # Bind what the reply needs before job code can monkey-patch modules.
        write, dumps, exit_, stdout, len_ = os.write, json.dumps, os._exit, sys.stdout, len
        result = _execute(job, int(lim["max_output_chars"]))
        for stream in (sys.stdout, stdout):
            try:
                stream.flush()
            except BaseException:
                pass
        try:
            data = dumps(result).encode("utf-8", "surrogatepass")
        except BaseException:
            data = b'{"status": "error", "error": "the result could not be encoded"}'
        data = _HEADER.pack(len_(data)) + data
        try:
            view = memoryview(data)
            while view:
                view = view[write(rep_fd, view):]
        finally:
            exit_(0)


def _describe(exc: BaseException, tb_limit: int = 5, type=type, str=str) -> str:  # noqa: A002
    """Exception type + message and a short traceback tail restricted to the job's own frames."""
    import traceback

    try:
        frames = [fr for fr in traceback.extract_tb(exc.__traceback__)
                  if fr.filename in ("<job>", "<call>", "<compare_to>")][-tb_limit:]
        only = "".join(traceback.format_exception_only(type(exc), exc)).rstrip().splitlines()
        # "Type: message" first; a SyntaxError's location and caret lines follow it
        text = "\n".join([only[-1], *only[:-1]]) if only else type(exc).__name__
        if frames:
            text += "\nTraceback (most recent call last, job frames only):\n"
            text += "".join(traceback.format_list(frames)).rstrip()
    except BaseException:
        try:
            text = f"{type(exc).__name__}: {exc}"
        except BaseException:
            text = type(exc).__name__
    return _short(text)


def _execute(job: dict, cap: int, len=len, repr=repr, type=type, str=str, compile=compile,  # noqa: A002
             exec=exec, eval=eval, BaseException=BaseException, MemoryError=MemoryError,  # noqa: A002
             SystemExit=SystemExit) -> dict:  # pragma: no cover - runs in the child
    """Run code / call / compare_to in a fresh namespace; return a JSON-safe result dict.

    The builtins it needs are bound as defaults when the worker loads, so a job that monkey-patches
    ``builtins`` (``len``, ``repr``, ...) cannot garble its own report.
    """
    import builtins

    status, value, match, error = "ok", None, None, None
    ns: dict = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None, "__package__": None,
                "__spec__": None, "__loader__": None}
    sys.modules["__main__"] = type(sys)("__main__")
    sys.modules["__main__"].__dict__.update(ns)
    ns = sys.modules["__main__"].__dict__
    stage = "code"
    try:
        exec(compile(job["code"], "<job>", "exec"), ns)
        if job.get("call") is not None:
            stage = "call"
            result = eval(compile(job["call"], "<call>", "eval"), ns)
            stage = "repr"
            text = repr(result)
            if type(text) is not str:
                raise TypeError("__repr__ returned a non-string")
            if len(text) > cap:
                return {"status": "output_limit", "value": None, "match": None,
                        "error": f"repr of the value has {len(text)} chars > max_output_chars={cap}"}
            value = text
            if job.get("compare_to") is not None:
                stage = "compare_to"
                match, error = _compare(result, job["compare_to"], ns)
    except MemoryError as exc:
        status, value, match, error = "memory_limit", None, None, f"MemoryError during {stage}: {exc}"[:500]
    except SystemExit as exc:
        status, value, match, error = "error", None, None, f"SystemExit: {exc.code!r} (during {stage})"[:500]
    except BaseException as exc:
        status, value, match = "error", None, None
        error = _describe(exc)
        if stage != "code":
            error = f"[during {stage}] {error}"
    return {"status": status, "value": value, "match": match, "error": error}


def _compare(result: object, compare_to: str, ns: dict, type=type, eval=eval, compile=compile,  # noqa: A002
             bool=bool, BaseException=BaseException,  # noqa: A002
             MemoryError=MemoryError) -> tuple[bool, str | None]:  # pragma: no cover
    try:
        expected = eval(compile(compare_to, "<compare_to>", "eval"), ns)
    except MemoryError:
        raise
    except BaseException as exc:
        return False, f"compare_to could not be evaluated: {_describe(exc, 2)}"
    try:
        equal = result == expected
    except MemoryError:
        raise
    except BaseException as exc:
        return False, f"== raised: {_describe(exc, 2)}"
    if type(equal) is not bool:
        return False, f"== returned {type(equal).__name__}, not bool: counted as no match"
    return equal, None


def main() -> None:
    """Entry point: ``python -S -s -c <this source> <config json>``."""
    cfg = json.loads(sys.argv[1])
    # Keep the protocol pipes away from the standard fds a job inherits, then blank those.
    req_fd = os.dup(0)
    rep_fd = os.dup(1)
    os.set_inheritable(req_fd, False)
    os.set_inheritable(rep_fd, False)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    worker = Worker(cfg)
    try:
        ready = worker.boot()
    except BaseException as exc:
        _write_frame(rep_fd, {"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        raise
    _write_frame(rep_fd, ready)
    worker.serve(req_fd, rep_fd)


if __name__ == "__main__":
    main()
