"""The warm sandbox worker: a fork server that runs each job in a fresh, confined child.

The host imports this file only for :func:`wipe_tree`. Its source is handed to a fresh interpreter
(``python -S -s -c <source> <config-json>``), usually inside bubblewrap namespaces, so it must only use the
standard library (plus ``pyseccomp``, which is pure ctypes). Protocol on the worker's stdin/stdout:
frames of a 4-byte big-endian length followed by UTF-8 JSON. Per job the host sends a control frame
(limits and deadline, read by the worker) and the job frame (code and call, read only by the job's child);
the worker answers a ``result`` frame (metadata, then the child's raw reply and output) as soon as the job is
over, then restores its job area and its own state
and answers ``clean`` (or ``retire`` followed by its exit, when it cannot).

Per job the worker prepares a fresh job area (namespaced modes: a new tmpfs mounted on the job area, with a
size and an inode limit; plain mode: a new directory) and forks a child which, before touching any job text:
  1. starts its own session (so its own process group, which the worker kills afterwards, and its own
     scheduler autogroup, so even the autogroup nice it may set is its own);
  2. gives up every capability the worker holds (bounding and ambient sets emptied, then the uid switch to
     the job's uid, or ``capset`` to nothing where the job keeps the worker's uid);
  3. moves into the job area, takes stdin from /dev/null, stdout into a bounded pipe;
  4. sets rlimits (AS, CPU, NPROC, FSIZE, NOFILE, CORE);
  5. loads a seccomp filter (no process creation, sockets, exec, ptrace, namespaces; signals, priority,
     scheduling, affinity, rlimits and memory policy only for itself; no signal ownership (F_SETOWN/
     F_SETSIG/FIOSETOWN), no memfd, SysV IPC, POSIX message queues, inotify, byte-range locks or pipe
     resizing).
The worker enforces the wall clock with SIGKILL of the child's process group, always reaps it, answers, then
kills stragglers, unmounts (or wipes, iteratively) the job area and checks that its own priority, scheduling
policy and parameters, affinity, I/O priority, rlimits and autogroup nice are what they were at start-up.
Only the first framed reply of the child is parsed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

_HEADER = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_SETPCAP = 8
_CAP_LAST = 63  # prctl(PR_CAPBSET_READ) answers EINVAL past the kernel's last capability
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_THREAD = 0x00010000
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_ST_FLAGS_TO_MS = {os.ST_RDONLY: _MS_RDONLY, os.ST_NOSUID: _MS_NOSUID, os.ST_NODEV: _MS_NODEV,
                   os.ST_NOEXEC: _MS_NOEXEC}
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
_IOPRIO_WHO_PROCESS = 1
_SECCOMP_SET_MODE_FILTER = 1
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
# Stand-in for the job's pid while the filter is compiled once per worker; patched per child.
# Larger than any pid (pid_max <= 2**22), and not a syscall number or an audit arch value.
_PID_PLACEHOLDER = 0x7A5EC0DE
_MAX_ERROR_CHARS = 4000
_REPLY_SLACK = 64 * 1024
_FIONREAD = 0x541B  # the same on x86_64 and aarch64
_CHUNK = 64 * 1024
_KEEP_CHUNKS = 2  # chunks a sink keeps (zeroed) between jobs; more are freed after being zeroed
_ZEROS = bytes(_CHUNK)

# Syscalls refused with EPERM (where the running kernel/libseccomp knows them).
_DENY_EPERM = (
    # process creation and program execution (threads use clone with CLONE_THREAD, allowed below)
    "fork", "vfork", "execve", "execveat",
    # network
    "socket", "socketpair",
    # debugging / other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "tkill", "process_madvise", "process_mrelease",
    # file systems and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount", "fsconfig",
    "fspick", "move_mount", "open_tree", "mount_setattr", "name_to_handle_at", "open_by_handle_at",
    "quotactl", "swapon", "swapoff", "acct",
    # host-wide I/O: sync() flushes every file system of the host, syncfs() the host's root (read-only binds)
    "sync", "syncfs",
    # kernel interfaces
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "syslog", "userfaultfd", "lookup_dcookie",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "personality", "uselib", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "sethostname",
    "setdomainname",
    # identity changes
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid",
    "setgroups", "capset",
    # leaving the session / process group the worker kills
    "setsid", "setpgid",
    # I/O priority: no job needs it, and IOPRIO_WHO_PGRP/USER reach other processes
    "ioprio_set",
    # memory no rlimit counts, some of it outliving the job in the worker's IPC namespace: memfd, SysV shared
    # memory / message queues / semaphores, POSIX message queues; inotify/fanotify marks
    "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init",
    "fanotify_mark",
)
# Syscalls refused unless their first argument is the job's own pid (signals).
_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Syscalls refused unless their first argument is exactly 0 (= the calling thread/process). The comparison is
# on all 64 bits, so a value whose low 32 bits are 0 but high bits are not is refused too.
_ZERO_ONLY = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
              "migrate_pages", "move_pages")
# fcntl commands refused: signal ownership (the kernel signals the owner on I/O: a way to signal the worker),
# pipe resizing (pipe buffers are kernel memory outside RLIMIT_AS) and byte-range locks (one unaccounted
# kernel object per locked range). Compared on the low 32 bits, the width the kernel reads.
_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETPIPE_SZ = 8, 10, 15, 1031
_F_SETLK, _F_SETLKW, _F_OFD_SETLK, _F_OFD_SETLKW = 6, 7, 37, 38
_FCNTL_DENY = (_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_SETPIPE_SZ, _F_SETLK, _F_SETLKW, _F_OFD_SETLK,
               _F_OFD_SETLKW)
# ioctl commands refused: FIOSETOWN and SIOCSPGRP set the same owner as F_SETOWN.
_IOCTL_DENY = (0x8901, 0x8902)
_LOW32 = 0xFFFFFFFF
_RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))


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


class _Sink:
    """Bytes of a job (its reply or its output), read into reusable ``bytearray`` chunks with ``readv`` (never
    into new ``bytes`` objects, whose freed memory would keep the text for the next fork), relayed as they are,
    and zeroed after every job."""

    def __init__(self) -> None:
        self.chunks: list[bytearray] = []
        self.n = 0

    def read_from(self, fd: int) -> int:
        """One ``readv`` into the free space; the bytes read (0 at EOF). Raises ``BlockingIOError``."""
        idx, off = divmod(self.n, _CHUNK)
        if idx == len(self.chunks):
            self.chunks.append(bytearray(_CHUNK))
        got = os.readv(fd, [memoryview(self.chunks[idx])[off:]])
        self.n += got
        return got

    def send(self, fd: int, count: int) -> None:
        """Write the first ``count`` bytes to ``fd``."""
        for chunk in self.chunks:
            if count <= 0:
                return
            view = memoryview(chunk)[: min(count, _CHUNK)]
            count -= len(view)
            while view:
                view = view[os.write(fd, view):]

    def wipe(self) -> None:
        """Zero every byte a job wrote; free the chunks beyond the first few."""
        for i, chunk in enumerate(self.chunks):
            if i * _CHUNK >= self.n:
                break
            memoryview(chunk)[:] = _ZEROS
        del self.chunks[_KEEP_CHUNKS:]
        self.n = 0


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
        self.uid: int = cfg["uid"]  # the job's uid/gid
        self.gid: int = cfg["gid"]
        self.drop_uid: bool = cfg["drop_uid"]  # the worker is root: the child switches to uid/gid
        self.drop_caps: bool = cfg["drop_caps"]  # the worker holds capabilities the child must give up
        self.reach_runtime: bool = cfg["reach_runtime"]  # plain root mode: runtime reached through O_PATH fds
        self.area: str = cfg["area"]  # "mount": a fresh tmpfs per job; "dir": a directory wiped per job
        self.base: str = cfg["tmp_base"]
        # A root worker's job (another uid) must traverse the base to reach its own directory.
        self.base_mode = 0o711 if self.drop_uid else 0o700
        self.pidns_private: bool = False
        self.seccomp_error: str | None = None
        self.pyseccomp = None
        self.bpf: bytes | None = None  # the compiled filter with _PID_PLACEHOLDER
        self.bpf_pid_offsets: list[int] = []
        self.libc = ctypes.CDLL(cfg["libs"].get("c") or None, use_errno=True)
        self.baseline_as = 0
        self.bounding: list[int] = []  # capabilities in the worker's bounding set (dropped in every child)
        self.mounted = False
        self.base_dev = 0
        self.attrs: dict | None = None  # the worker's own scheduling/rlimit attributes at start-up
        self._arch = os.uname().machine
        self.pid = os.getpid()
        self.req_fd = 0
        self.frame_pending = False
        self.rep_sink = _Sink()  # the child's reply, relayed raw to the host
        self.out_sink = _Sink()  # the child's stdout, relayed raw to the host

    # ------------------------------------------------------------------ start-up
    def boot(self) -> dict:
        """Confine the worker itself, prepare the job area, import what jobs need, and describe the result."""
        cfg = self.cfg
        if self.area == "mount":
            self._prepare_mount_area()
        else:
            os.makedirs(self.base, mode=self.base_mode, exist_ok=True)
            os.chmod(self.base, self.base_mode)
        # Jobs must not open /proc/<worker>/mem, /proc/<worker>/fd, write /proc/<worker>/autogroup, ...: the
        # files of a non-dumpable process belong to root (of its user namespace).
        self.libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        # Orphans of a job come back to us, so we can always reap them.
        self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if _effective_caps() & (1 << _CAP_SETPCAP):  # else the bounding set cannot (and need not) be emptied
            self.bounding = [c for c in range(_CAP_LAST + 1)
                             if self.libc.prctl(_PR_CAPBSET_READ, c, 0, 0, 0) == 1]
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
        self.attrs = self._attributes()
        return {
            "type": "ready",
            "pid": os.getpid(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "job_uid": self.uid,
            "job_gid": self.gid,
            "area": self.area,
            "ns": ns,
            "seccomp_error": self.seccomp_error,
            "preload_errors": preload_errors,
            "baseline_as": self.baseline_as,
            "attributes": self.attrs,
            "python": sys.version.split()[0],
        }

    def _prepare_mount_area(self) -> None:
        """Namespaced modes: a mount namespace of our own, the job-area mount point, the rest of /tmp read-only.

        In user-namespace mode bubblewrap's mount namespace belongs to an outer user namespace, so the worker's
        capabilities do not reach it; a mount namespace created here belongs to the worker's user namespace.
        """
        if self.libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) for the job-area mounts failed")
        os.makedirs(self.base, mode=0o711, exist_ok=True)
        os.chmod(self.base, 0o711)
        parent = os.path.dirname(self.base)
        # Keep the flags the mount already has (a mount inherited from a more privileged namespace must keep
        # them), add read-only.
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        have = os.statvfs(parent).f_flag
        for st_flag, ms_flag in _ST_FLAGS_TO_MS.items():
            if have & st_flag:
                flags |= ms_flag
        if self.libc.mount(None, parent.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"could not make {parent} read-only")
        self.base_dev = os.stat(self.base).st_dev
        self._mount_job_area(1, 16)  # fail at start-up, not at the first job
        self._unmount_job_area()

    def _mount_job_area(self, size_mb: int, max_files: int) -> None:
        opts = (f"size={int(size_mb)}m,nr_inodes={int(max_files) + 1},mode=0700,"
                f"uid={self.uid},gid={self.gid}").encode()
        if self.libc.mount(b"tmpfs", self.base.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts) != 0:
            raise OSError(ctypes.get_errno(), "mounting the job's tmpfs failed")
        self.mounted = True

    def _unmount_job_area(self) -> None:
        """Unmount the job's tmpfs: the kernel frees the whole tree, however deep or strange, in one call.

        No lazy detach: every job process is dead and reaped by now, so EBUSY means something survived, and
        the worker must not go on.
        """
        if self.libc.umount2(self.base.encode(), 0) != 0:
            raise OSError(ctypes.get_errno(), "unmounting the job's tmpfs failed")
        self.mounted = False

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

        Building and loading through libseccomp at every fork costs far more than loading a ready BPF program,
        which is a single syscall (docs/results.md).
        """
        if self._arch not in _SYS_SECCOMP:
            raise RuntimeError(f"no seccomp syscall number known for {self._arch}")
        self.seccomp_nr = _SYS_SECCOMP[self._arch]
        with os.fdopen(os.memfd_create("populora-bpf", os.MFD_CLOEXEC), "w+b") as fh:
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
        # setpriority(which, who, prio): only (PRIO_PROCESS, 0), i.e. the calling thread. Its first argument is
        # `which`, not a pid: PRIO_PROCESS is 0, so a rule on argument 0 alone lets (PRIO_PROCESS, ppid) through.
        # (These exist everywhere: a failure to add them must fail the set-up, not pass silently.)
        flt.add_rule(eperm, "setpriority", sc.Arg(0, sc.NE, 0))
        flt.add_rule(eperm, "setpriority", sc.Arg(1, sc.NE, 0))
        for cmd in _FCNTL_DENY:
            flt.add_rule(eperm, "fcntl", sc.Arg(1, sc.MASKED_EQ, _LOW32, cmd))
        for cmd in _IOCTL_DENY:
            flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, _LOW32, cmd))
        # the parent-death signal that kills the job with its worker stays
        flt.add_rule(eperm, "prctl", sc.Arg(0, sc.MASKED_EQ, _LOW32, _PR_SET_PDEATHSIG))
        return flt

    # ------------------------------------------------------------------ per job
    def serve(self, req_fd: int, rep_fd: int) -> None:
        """Answer jobs until the host closes our stdin.

        Per job the host sends two frames: a **control** frame (the limits and the deadline: numbers only),
        which the worker reads, and the **job** frame (code and call), which the worker never reads: the job
        child reads it from the same pipe after the fork. The child's reply and output come back into
        :class:`_Sink` buffers and are relayed to the host as raw bytes, never decoded here, and the buffers
        are zeroed before the next fork. So the worker's memory, which every later job inherits, never holds
        a job's text, value or output (no frame-to-frame channel; ``tests/sandbox/test_reward_hacking.py``
        scans a job's memory for the previous job's markers).

        The result goes out as soon as the job is over; restoring the job area and checking our own state
        come after it, under the host's separate cleanup budget, so a job that fills its area until its
        deadline never makes the worker look unresponsive. A worker that cannot restore itself says why and
        exits (the host starts a fresh one) instead of answering later jobs from a dirty state.
        """
        self.req_fd = req_fd
        while True:
            ctl = _read_frame(req_fd)
            if ctl is None:
                return
            try:
                meta = self.run(ctl)
            except Exception as exc:  # a bug here must not kill the worker silently
                meta = {"status": "crashed", "error": f"sandbox worker error: {type(exc).__name__}: {exc}",
                        "seconds": 0.0, "reply": 0, "stdout": 0}
            meta["type"] = "result"
            try:
                _write_frame(rep_fd, meta)
                self.rep_sink.send(rep_fd, meta["reply"])
                self.out_sink.send(rep_fd, meta["stdout"])
            finally:
                self.rep_sink.wipe()
                self.out_sink.wipe()
            try:
                why = self._restore()
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            if why:
                _write_frame(rep_fd, {"type": "retire", "why": why})
                return
            _write_frame(rep_fd, {"type": "clean"})

    def run(self, ctl: dict) -> dict:
        lim = ctl["limits"]
        cap = int(lim["max_output_chars"])
        timeout = float(ctl["timeout_s"])
        self.frame_pending = True  # the job frame waits in the pipe until the child reads it
        if self.area == "mount":
            self._mount_job_area(lim["tmp_mb"], lim["max_files"])
            jobdir = self.base
        else:
            jobdir = os.path.join(self.base, "job")
            os.mkdir(jobdir, 0o700)
            if self.drop_uid:
                os.chown(jobdir, self.uid, self.gid)
        r_rep, w_rep = os.pipe2(os.O_CLOEXEC)
        r_out, w_out = os.pipe2(os.O_CLOEXEC)
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.close(r_rep)
                os.close(r_out)
                self._child(lim, w_rep, w_out, jobdir)
            finally:
                os._exit(71)
        os.close(w_rep)
        os.close(w_out)
        try:
            return self._supervise(pid, r_rep, r_out, t0, timeout, cap, lim)
        finally:
            os.close(r_rep)
            os.close(r_out)
            # every job process is dead: the frame was read by the child, or is still in the pipe (the
            # child died first), which desynchronises the protocol: then the worker retires
            self.frame_pending = self._unread(self.req_fd) != 0

    def _unread(self, fd: int) -> int:
        """Bytes waiting in the pipe ``fd`` (FIONREAD); -1 when it cannot be asked."""
        n = ctypes.c_int(0)
        if self.libc.ioctl(fd, _FIONREAD, ctypes.byref(n)) != 0:
            return -1
        return n.value

    def _supervise(self, pid: int, r_rep: int, r_out: int, t0: float, timeout: float, cap: int,
                   lim: dict) -> dict:
        """Wait for the child's reply (its first frame), its output and its end; kill and reap it.

        Returns the result's metadata; the raw reply and output stay in the sinks (never decoded here).
        """
        deadline = t0 + timeout
        rep, out = self.rep_sink, self.out_sink
        rep_cap = cap * 6 + _REPLY_SLACK  # UTF-8 JSON without ASCII escaping: at most 6 bytes per char (\u001f)
        out_cap = cap * 4 + 4  # UTF-8: cap chars are at most 4 * cap bytes
        open_fds = [r_rep, r_out]
        for fd in open_fds:
            os.set_blocking(fd, False)
        timed_out = out_over = rep_over = False
        reply = 0  # length of the first complete reply frame (header included), 0 while there is none
        while open_fds and not reply:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(open_fds, [], [], remaining)
            for fd in ready:
                sink = out if fd == r_out else rep
                try:
                    got = sink.read_from(fd)
                except BlockingIOError:
                    continue
                if not got:
                    open_fds.remove(fd)
                    continue
                if fd == r_out:
                    out_over = out.n > out_cap
                else:
                    if rep.n > rep_cap:
                        rep_over = True
                    elif rep.n >= _HEADER.size:
                        (size,) = _HEADER.unpack_from(rep.chunks[0])
                        if size > rep_cap:
                            rep_over = True
                        elif rep.n >= _HEADER.size + size:
                            reply = _HEADER.size + size  # first frame only
            if out_over or rep_over:
                break
        seconds = time.monotonic() - t0
        if reply and not out_over:
            # The child flushed stdout before replying: whatever it printed is already in the pipe.
            while out.n <= out_cap:
                try:
                    if not out.read_from(r_out):
                        break
                except BlockingIOError:
                    break
            out_over = out.n > out_cap
        # Kill the whole job process group, even after a normal reply (threads, stragglers).
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass
        _, wstatus, rusage = os.wait4(pid, 0)
        base = {"status": None, "error": None, "seconds": seconds, "reply": 0, "stdout": 0}
        if out_over:
            return {**base, "status": "output_limit",
                    "error": f"stdout exceeded max_output_chars={cap} (output is never truncated)"}
        base["stdout"] = out.n
        if timed_out:
            return {**base, "status": "timeout",
                    "error": f"wall-clock limit of {timeout:g} s exceeded; the job was killed"}
        if rep_over:
            return {**base, "stdout": 0, "status": "output_limit",
                    "error": f"the job's reply exceeded the size allowed by max_output_chars={cap}"}
        if reply:
            return {**base, "reply": reply}  # the host parses it
        # No reply: the child died.
        cpu = rusage.ru_utime + rusage.ru_stime
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= float(lim["cpu_s"]) - 0.05):
                return {**base, "status": "timeout", "error": f"CPU time limit of {lim['cpu_s']:g} s exceeded"}
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return {**base, "status": "crashed", "error": f"the job process was killed by {name}"}
        code = os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else -1
        return {**base, "status": "crashed",
                "error": f"the job process exited with code {code} without a result (os._exit?)"}

    def _restore(self) -> str | None:
        """After a job: kill and reap stragglers, empty the job area, check our own attributes.

        Returns why the worker cannot go on (it then retires), or None when it is as it was at start-up.
        """
        if self.pidns_private:
            # Our own pid namespace: this reaches only job stragglers (kill(-1) skips the namespace's init, which
            # is bubblewrap's, and the caller).
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
        problems = []
        if self.frame_pending:
            problems.append("the job's frame was not read by its child (protocol out of step)")
        if self.area == "mount":
            if self.mounted:
                try:
                    self._unmount_job_area()
                except OSError as exc:
                    problems.append(f"job area: {exc}")
            try:
                st = os.stat(self.base)
                left = os.listdir(self.base)
            except OSError as exc:
                problems.append(f"job area: {exc}")
            else:
                if st.st_dev != self.base_dev or left:
                    problems.append("job area: the mount point is still mounted or not empty")
        else:
            try:
                os.chmod(self.base, self.base_mode)
                wipe_tree(self.base)
                left = os.listdir(self.base)
            except OSError as exc:
                problems.append(f"job area: could not be wiped: {exc}")
            else:
                if left:
                    problems.append(f"job area: {len(left)} entries left after the wipe")
        now = self._attributes()
        for key, value in self.attrs.items():
            if now.get(key) != value:
                problems.append(f"worker {key} changed from {value!r} to {now.get(key)!r}")
        return "; ".join(problems) or None

    def _attributes(self) -> dict:
        """The worker's own attributes a job might try to change for good (each read is one syscall)."""
        out: dict = {
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "policy": os.sched_getscheduler(0),
            "sched_priority": os.sched_getparam(0).sched_priority,
            "affinity": sorted(os.sched_getaffinity(0)),
            "rlimits": [resource.getrlimit(r) for r in _RLIMITS],
        }
        nr = _SYS_IOPRIO_GET.get(self._arch)
        if nr is not None:
            out["ioprio"] = self.libc.syscall(nr, _IOPRIO_WHO_PROCESS, 0)
        try:  # "/autogroup-N nice K" (absent without CONFIG_SCHED_AUTOGROUP); os.open: 4x cheaper than open()
            fd = os.open("/proc/self/autogroup", os.O_RDONLY | os.O_CLOEXEC)
            try:
                out["autogroup_nice"] = os.read(fd, 256).split()[-1].decode()
            finally:
                os.close(fd)
        except (OSError, IndexError):
            out["autogroup_nice"] = None
        return out

    # ------------------------------------------------------------------ in the child
    def _drop_privileges(self) -> None:
        """In the child: give up every capability and, where the worker is root, its uid, for good."""
        libc = self.libc
        for cap in self.bounding:  # needs CAP_SETPCAP (held by the worker wherever its bounding set is not empty)
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        if self.drop_uid:
            if self.reach_runtime:
                self._reach_runtime_after_drop()
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)  # real, effective and saved uid all non-zero: every capability is cleared
            if self.reach_runtime:
                # setuid made us non-dumpable (so /proc/self/fd would be root's); imports through /proc/self/fd
                # need it, and the job is the only process of its uid.
                libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        elif self.drop_caps:
            header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
            data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
            if libc.capset(header, data) != 0:
                raise OSError(ctypes.get_errno(), "capset to no capabilities failed")

    def _child(self, lim: dict, w_rep: int, w_out: int, jobdir: str) -> None:  # pragma: no cover
        rep_fd = w_rep
        try:
            # The job's text: read here, in the child, from the pipe the worker left it in (the worker never
            # reads it, so no later fork inherits it).
            job = _read_frame(self.req_fd)
            if not isinstance(job, dict) or not isinstance(job.get("code"), str):
                raise RuntimeError("no job frame")
            # Own session: own process group (killed as a whole afterwards) and own scheduler autogroup.
            os.setsid()
            devnull = os.open("/dev/null", os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(w_out, 1)
            os.dup2(devnull, 2)
            os.dup2(w_rep, 3, inheritable=False)
            rep_fd = 3
            os.closerange(4, 1 << 16)
            self._drop_privileges()
            # Die with the worker even where no pid namespace does it for us (plain mode): set after the uid
            # switch (which clears it), checked against a worker that died before, locked by the filter.
            if self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
            if os.getppid() != self.pid:
                os._exit(72)
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
                _write_frame(rep_fd, {"status": "error", "value": None,
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
        try:  # no ASCII escaping: at most 6 bytes per character (a control character as \\u001f)
            data = dumps(result, ensure_ascii=False).encode("utf-8", "surrogatepass")
        except BaseException:
            data = b'{"status": "error", "error": "the result could not be encoded"}'
        data = _HEADER.pack(len_(data)) + data
        try:
            view = memoryview(data)
            while view:
                view = view[write(rep_fd, view):]
        finally:
            exit_(0)


def _effective_caps() -> int:
    """The calling process's effective capability set, from /proc/self/status."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open a directory without following a symlink; restore its permissions if the job took them away."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory (never a symlink: checked by the caller's lstat type)
        fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)  # we need to list it and remove its entries
    except BaseException:
        os.close(fd)
        raise
    return fd


def _clear_entries(fd: int) -> list[str]:
    """Unlink every non-directory entry of the directory ``fd``; return the names of its subdirectories."""
    subdirs = []
    with os.scandir(fd) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:  # files, symlinks (never followed), fifos (never opened), sockets, device nodes
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
    return subdirs


def wipe_tree(path: str) -> None:
    """Remove everything below the directory ``path`` (not ``path`` itself), for any tree a job can make.

    Iterative depth-first walk with O(1) open descriptors and no recursion: it descends with ``openat`` of the
    child (``O_NOFOLLOW``) and climbs back with ``openat(fd, "..")``, keeping only the names on the way down,
    so a tree thousands of levels deep (deeper than ``PATH_MAX`` allows a path to name) is no harder than a
    flat one. Directories the job made unreadable are given back their owner permissions first. Only used
    where nothing else can change the tree any more (every job process is dead), so ``..`` is the directory
    we came from.
    """
    top = _open_dir(path, None)
    fd = top
    trail: list[tuple[str, list[str]]] = []  # (directory we went into, its parent's subdirectories left)
    try:
        pending = _clear_entries(fd)
        while True:
            if pending:
                name = pending.pop()
                child = _open_dir(name, fd)
                trail.append((name, pending))
                if fd != top:
                    os.close(fd)
                fd = child
                pending = _clear_entries(fd)
                continue
            if not trail:
                return
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = parent
            name, pending = trail.pop()
            os.rmdir(name, dir_fd=fd)
    finally:
        if fd != top:
            os.close(fd)
        os.close(top)


def _describe(exc: BaseException, tb_limit: int = 5, type=type, str=str) -> str:  # noqa: A002
    """Exception type + message and a short traceback tail restricted to the job's own frames."""
    import traceback

    try:
        frames = [fr for fr in traceback.extract_tb(exc.__traceback__)
                  if fr.filename in ("<job>", "<call>")][-tb_limit:]
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
    """Run code / call in a fresh namespace; return a JSON-safe result dict (no expected value is ever here:
    the host compares).

    The builtins it needs are bound as defaults when the worker loads, so a job that monkey-patches
    ``builtins`` (``len``, ``repr``, ...) cannot garble its own report.
    """
    import builtins

    status, value, error = "ok", None, None
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
                return {"status": "output_limit", "value": None,
                        "error": f"repr of the value has {len(text)} chars > max_output_chars={cap}"}
            value = text
    except MemoryError as exc:
        status, value, error = "memory_limit", None, f"MemoryError during {stage}: {exc}"[:500]
    except SystemExit as exc:
        status, value, error = "error", None, f"SystemExit: {exc.code!r} (during {stage})"[:500]
    except BaseException as exc:
        status, value = "error", None
        error = _describe(exc)
        if stage != "code":
            error = f"[during {stage}] {error}"
    return {"status": status, "value": value, "error": error}


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
