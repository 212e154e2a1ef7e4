"""The warm sandbox worker: a fork server that runs each job in a fresh, confined child of its zygote.

The host imports this file only for :func:`wipe_tree`. Its source is handed to a fresh interpreter
(``python -S -s -c <source> <config-json>``), usually inside bubblewrap namespaces, so it must only use the
standard library (plus ``pyseccomp``, which is pure ctypes). Protocol on the worker's stdin/stdout:
frames of a 4-byte big-endian length followed by UTF-8 JSON. Per job the host sends a control frame
(limits and deadline, read by the worker) and the job frame (code and call, read only by the job's child);
the worker answers a ``result`` frame (metadata, then the child's raw reply and output) as soon as the job is
over, then restores its job area and its own state
and answers ``clean`` (or ``retire`` followed by its exit, when it cannot).

Three processes per worker (``docs/sandbox.md`` section 1):

* **this fork server** (privileged where the host allows: it mounts each job's tmpfs, holds ``ctypes``);
* **the zygote** (:mod:`populora_env.sandbox._zygote`), started once: a child of this server that gives up
  every capability the job must not have (the job's uid, or only ``CAP_SETUID``/``CAP_SETGID`` to hand it to
  the job where the host is root), takes a parent-death signal, a Landlock ruleset (no ``/proc``) and the
  seccomp filter, then *executes* a fresh interpreter: the zygote and every job forked from it hold no
  ``ctypes`` (a process that ever imported it keeps classes that read and write raw memory);
* **one job child per job**, forked by the zygote on this server's request: it reads its job frame, switches
  to the job's uid, moves into the fresh job area, sets its rlimits, installs an audit hook and runs the job;
  its reply is sealed with a per-job secret (``token``, HMAC-SHA256) only the harness holds, and the server
  accepts no other.

The seccomp filter refuses process creation, programs, sockets and the rest listed in ``_DENY_EPERM``; a few
calls go to this server instead (``SECCOMP_RET_USER_NOTIF``): the zygote may fork (once per request) and
install its interpreter's signal handlers, a job may signal only itself and may not install a signal handler
(a Python handler is handed the interrupted frame, a way to the harness's locals).
The worker enforces the job's time limit (its own time, ``_supervise``) with SIGKILL of the child, reads its
zygote's report of how it ended, answers, then unmounts (or wipes, iteratively) the job area and checks that
its own and its zygote's priority, scheduling policy and parameters, affinity, I/O priority, rlimits and
autogroup nice are what they were at start-up.

Like the rest of the sandbox, no function here is over 80 lines (``tests/test_layout.py``): one job's life is
:meth:`Worker._supervise` over a :class:`_Watch` of what was seen so far.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hmac
import json
import os
import resource
import select
import signal
import socket
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
_SECCOMP_GET_NOTIF_SIZES = 3
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
_SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
_SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
_SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# LANDLOCK_ACCESS_FS_* rights known per ABI version; the rights of a regular file (not a directory).
_LANDLOCK_FS = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF, 5: 0xFFFF}
_LANDLOCK_FILE_RIGHTS = 0x1 | 0x2 | 0x4 | 0x4000 | 0x8000  # EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV
_LANDLOCK_SCOPE_SIGNAL = 0x2  # ABI 6: no signals to processes outside the domain
_ZSOCK_FD, _ZREQ_FD = 3, 4  # the zygote's socket and request pipe (see _zygote.py)
_TOKEN_BYTES = 16
_MAC_BYTES = 32  # HMAC-SHA256(token, frame): the seal before the child's reply frame
_REPLY_SLACK = 64 * 1024
_FIONREAD = 0x541B  # the same on x86_64 and aarch64
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_CHUNK = 64 * 1024
_KEEP_CHUNKS = 2  # chunks a sink keeps (zeroed) between jobs; more are freed after being zeroed
_ZEROS = bytes(_CHUNK)
# Tampering classes, by code (``_zygote.TAMPER_CLASSES``, index + 1): the ones this server sees itself, and the mark
# a job's audit hook sends it, ``kill(-(_MARK_BASE + code), 0)`` (no such process group exists; it is answered
# EPERM). A job can add marks, never remove one: they are kept here, outside its process.
_TAMPER_CODES = 7
_SIGNAL, _PROCESS, _REPLY_FORGERY, _EXIT = 4, 5, 6, 7
_MARK_BASE = 1 << 30
#: Exit statuses of the harness's own that come without a reply (the zygote's fork loop, "could not reply", the
#: plain-mode lifeline): any other exit without a reply is the job ending its process itself (``exit``).
_HARNESS_EXITS = frozenset({71, 75, 137})
#: glibc's internal signals (SIGCANCEL, SIGSETXID): it installs their actions when a process starts its first
#: thread. Refused like any other, but not tampering.
_LIBC_SIGNALS = frozenset({32, 33})

# Syscalls refused with EPERM (where the running kernel/libseccomp knows them).
_DENY_EPERM = (
    # (process creation and programs: fork, vfork, clone without CLONE_THREAD, execve(at) go to the server)
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
    # identity changes (setuid, setgid, setgroups: a root zygote's child switches to the job's ids with them;
    # afterwards it holds no capability, and the kernel refuses any change)
    "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "capset",
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
# Syscalls decided by the fork server (SECCOMP_RET_USER_NOTIF): process creation and programs (the zygote only,
# when asked), signals (a job: only to itself), signal handlers (the zygote's interpreter only), and reads of the
# OS's entropy (allowed, and counted: a job that reads it is not a function of its input).
_NOTIFY_PROCESS = ("fork", "vfork", "execve", "execveat")
_NOTIFY_SIGNAL = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
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

    def views(self, start: int, end: int):
        """Views of bytes ``start`` to ``end`` (exclusive), chunk by chunk (no copy)."""
        pos = 0
        for chunk in self.chunks:
            if pos >= end:
                return
            lo, hi = max(start - pos, 0), min(end - pos, _CHUNK)
            pos += _CHUNK
            if lo < hi:
                yield memoryview(chunk)[lo:hi]

    def send(self, fd: int, end: int, start: int = 0) -> None:
        """Write bytes ``start`` to ``end`` (exclusive) to ``fd``."""
        for view in self.views(start, end):
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


class _Watch:
    """What the fork server has seen of the running job (:meth:`Worker._supervise`)."""

    def __init__(self, t0: float, timeout: float, backstop: float, batch: bool, cap: int, token: bytes,
                 r_rep: int, r_out: int) -> None:
        self.t0, self.timeout, self.deadline, self.backstop, self.batch = t0, timeout, t0 + timeout, backstop, batch
        self.cap, self.token, self.r_rep, self.r_out = cap, token, r_rep, r_out
        self.rep_cap = cap * 6 + _REPLY_SLACK  # the harness's reply: at most 4 bytes a char of its capped value,
        # its error text (4,000 chars at most), framing
        self.out_cap = cap * 4 + 4  # UTF-8: cap chars are at most 4 * cap bytes
        self.open_fds = [r_rep, r_out]
        self.timed_out = self.out_over = self.forged = self.stop = False
        self.infra: str | None = None
        self.ended: tuple[int, float] | None = None  # the zygote's report, once the child has ended
        self.reply = 0  # length of the first complete reply frame (seal and header included), 0 while none


class Worker:
    """The fork server. One instance per worker process."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.uid: int = cfg["uid"]  # the job's uid/gid
        self.gid: int = cfg["gid"]
        self.drop_uid: bool = cfg["drop_uid"]  # the worker is root: each job child switches to uid/gid
        self.drop_caps: bool = cfg["drop_caps"]  # the worker holds capabilities the zygote must give up
        self.reach_runtime: bool = cfg["reach_runtime"]  # plain root mode: runtime reached through O_PATH fds
        self.area: str = cfg["area"]  # "mount": a fresh tmpfs per job; "dir": a directory wiped per job
        self.base: str = cfg["tmp_base"]
        # A root worker's job (another uid) must traverse the base to reach its own directory.
        self.base_mode = 0o711 if self.drop_uid else 0o700
        self.seccomp_error: str | None = None
        self.landlock_error: str | None = None
        self.pyseccomp = None
        self.bpf: bytes | None = None  # the compiled filter, loaded once, by the zygote
        self.notify_nrs: dict[str, set[int]] = {}  # syscall numbers the filter hands to this server, by kind
        self.libc = ctypes.CDLL(cfg["libs"].get("c") or None, use_errno=True)
        self.baseline_as = 0
        self.bounding: list[int] = []  # capabilities in the worker's bounding set (dropped by the zygote)
        self.mounted = False
        self.base_dev = 0
        self.attrs: dict | None = None  # the worker's and zygote's scheduling/rlimit attributes at start-up
        self._arch = os.uname().machine
        self.pid = os.getpid()
        self.req_fd = 0
        self.frame_pending = False
        self.rep_sink = _Sink()  # the child's reply, relayed raw to the host
        self.out_sink = _Sink()  # the child's stdout, relayed raw to the host
        self.zpid = 0  # the zygote
        self.zsock: socket.socket | None = None
        self.listener = -1  # the seccomp notification descriptor (-1: no filter)
        self.notif_size = 80
        self.expect: str | None = None  # what the zygote may do next: "exec" (at start-up), "fork" (per job)
        self.job_pid = 0  # the running job child
        self.probe_facts: dict | None = None  # the kernel's view of a probe job (see _on_notification)
        self.keep_fds: list[int] = []  # plain root mode: the zygote's runtime directories, kept by each job
        self.pending: list[bytearray] = []  # notifications of a job child whose pid is not known yet
        self.marks: list[int] = []  # tampering classes the running job tripped, in order (codes)
        self.entropy = False  # the running job read the OS's entropy
        self.self_signals: set[int] = set()  # signals the running job sent itself
        self.fork_entropy = 0  # entropy reads of a job child before its code (the interpreter's at-fork reseed)
        self.entropy_allowance = 0
        self.sig_arg: dict[int, int] = {}  # signal syscall number -> the argument holding the signal

    # ------------------------------------------------------------------ start-up
    def boot(self, req_fd: int) -> dict:
        """Confine the worker itself, prepare the job area, start the zygote, and describe the result."""
        cfg = self.cfg
        self.req_fd = req_fd
        if self.area == "mount":
            self._prepare_mount_area()
        else:
            os.makedirs(self.base, mode=self.base_mode, exist_ok=True)
            os.chmod(self.base, self.base_mode)
        # Jobs must not open /proc/<worker>/mem, /proc/<worker>/fd, write /proc/<worker>/autogroup, ...: the
        # files of a non-dumpable process belong to root (of its user namespace).
        self.libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        # Orphans come back to us, so we can always reap them.
        self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if _effective_caps() & (1 << _CAP_SETPCAP):  # else the bounding set cannot (and need not) be emptied
            self.bounding = [c for c in range(_CAP_LAST + 1)
                             if self.libc.prctl(_PR_CAPBSET_READ, c, 0, 0, 0) == 1]
        sys.path[:] = cfg["sys_path"]
        if cfg["seccomp"]:
            self._import_pyseccomp()
        ns = {}
        for name in ("net", "pid", "mnt", "ipc", "uts", "user"):
            try:
                ns[name] = os.readlink(f"/proc/self/ns/{name}")
            except OSError:
                ns[name] = None
        zygote = self._start_zygote()
        self.keep_fds = [int(fd) for fd in zygote.get("keep_fds", [])]
        self.fork_entropy = int(zygote.get("fork_entropy", 0))
        with open(f"/proc/{self.zpid}/statm") as fh:  # the zygote's size: every job child starts as a copy
            self.baseline_as = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        self.attrs = self._all_attributes()
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
            "landlock_error": self.landlock_error,
            "preload_errors": zygote.get("preload_errors", {}),
            "baseline_as": self.baseline_as,
            "attributes": self.attrs,
            "python": sys.version.split()[0],
            "zygote": {"pid": self.zpid, "uid": zygote.get("uid"), "python": zygote.get("python")},
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
            self.bpf = None
        finally:
            ctypes.util.find_library = original

    def _compile_filter(self) -> None:
        """Compile the filter once to classic BPF; the zygote loads it (every job child inherits it).

        Building the filter through libseccomp costs far more than loading a ready BPF program, which is a
        single syscall (docs/results.md), so it is built once per worker.
        """
        if self._arch not in _SYS_SECCOMP:
            raise RuntimeError(f"no seccomp syscall number known for {self._arch}")
        self.seccomp_nr = _SYS_SECCOMP[self._arch]
        with os.fdopen(os.memfd_create("populora-bpf", os.MFD_CLOEXEC), "w+b") as fh:
            self._build_filter().export_bpf(fh)
            fh.seek(0)
            bpf = fh.read()
        if not bpf or len(bpf) % 8:
            raise RuntimeError(f"unexpected BPF export of {len(bpf)} bytes")
        sc = self.pyseccomp
        arch = sc.system_arch()

        def numbers(names: tuple[str, ...]) -> set[int]:
            out = set()
            for name in names:
                try:
                    nr = sc.resolve_syscall(arch, name)
                except (OSError, ValueError, RuntimeError):
                    continue
                if isinstance(nr, int) and nr >= 0:
                    out.add(nr)
            return out

        self.notify_nrs = {"fork": numbers(("fork", "vfork", "clone")), "exec": numbers(("execve", "execveat")),
                           "signal": numbers(_NOTIFY_SIGNAL), "sigaction": numbers(("rt_sigaction",)),
                           "getrandom": numbers(("getrandom",)), "kill": numbers(("kill",))}
        # kill(pid, sig), rt_sigqueueinfo(pid, sig, info): argument 1; tgkill, rt_tgsigqueueinfo: argument 2
        self.sig_arg = {nr: 2 for nr in numbers(("tgkill", "rt_tgsigqueueinfo"))}
        sizes = (ctypes.c_uint16 * 3)()
        if self.libc.syscall(self.seccomp_nr, _SECCOMP_GET_NOTIF_SIZES, 0, ctypes.byref(sizes)) == 0:
            self.notif_size = max(80, int(sizes[0]))
        self.bpf = bpf

    def _build_filter(self):
        sc = self.pyseccomp
        flt = sc.SyscallFilter(sc.ALLOW)
        # another architecture's calls (x32 numbers, int 0x80) kill the whole process, not only the thread that
        # made them (a job may have more than one)
        flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
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
        for name in _NOTIFY_PROCESS + _NOTIFY_SIGNAL + ("getrandom",):
            rule(sc.NOTIFY, name)
        # clone: threads (CLONE_THREAD set) are allowed, a new process goes to the server; clone3 -> ENOSYS so
        # libc falls back to clone.
        flt.add_rule(sc.NOTIFY, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        rule(sc.ERRNO(errno.ENOSYS), "clone3")
        # installing a signal handler (a non-NULL new action) goes to the server; reading one is allowed
        flt.add_rule(sc.NOTIFY, "rt_sigaction", sc.Arg(1, sc.NE, 0))
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
        # the parent-death signal that kills the zygote with its server stays
        flt.add_rule(eperm, "prctl", sc.Arg(0, sc.MASKED_EQ, _LOW32, _PR_SET_PDEATHSIG))
        return flt

    # ------------------------------------------------------------------ the zygote
    def _start_zygote(self) -> dict:
        """Fork the zygote, receive its seccomp listener, allow its one ``execve``, wait for its report."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the zygote before it executes its own interpreter
            try:
                mine.close()
                self._become_zygote(theirs)
            except BaseException as exc:
                try:
                    theirs.send(json.dumps({"type": "failed", "error": f"{type(exc).__name__}: {exc}"}).encode())
                finally:
                    os._exit(72)
            os._exit(73)
        theirs.close()
        self.zpid, self.zsock = pid, mine
        deadline = time.monotonic() + 60.0
        if self.bpf is not None:  # first message: the listener (or a failure)
            msg, fds = self._zygote_message(deadline, fds=1)
            if not fds:
                raise RuntimeError(f"the zygote did not start: {msg.get('error', msg)}")
            self.listener = fds[0]
            os.set_inheritable(self.listener, False)
        self.expect = "exec"
        msg, _ = self._zygote_message(deadline)
        self.expect = None
        if msg.get("type") != "zygote":
            raise RuntimeError(f"the zygote did not start: {msg.get('error', msg)}")
        return msg

    def _zygote_message(self, deadline: float, fds: int = 0) -> tuple[dict, list[int]]:
        """The zygote's next message (JSON), answering seccomp notifications meanwhile."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("the zygote did not answer in time")
            watch = [self.zsock] + ([self.listener] if self.listener >= 0 else [])
            ready, _, _ = select.select(watch, [], [], left)
            if self.listener in ready:
                self._on_notification()
            if self.zsock in ready:
                if fds:
                    msg, got, _, _ = socket.recv_fds(self.zsock, 1 << 16, fds)
                else:
                    msg, got = self.zsock.recv(1 << 16), []
                if not msg:
                    raise RuntimeError("the zygote exited")
                return json.loads(msg), got

    def _become_zygote(self, sock: socket.socket) -> None:  # pragma: no cover - in the zygote, before exec
        """In the forked zygote: descriptors, privileges, Landlock, seccomp (its listener to the server), exec."""
        cfg = self.cfg
        # fds: 0, 1 /dev/null; 2 the worker's stderr; 3 the socket; 4 the request pipe; keep: runtime dirs
        high = [os.dup(sock.fileno()), os.dup(self.req_fd)]
        devnull = os.open("/dev/null", os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(high[0], _ZSOCK_FD)
        os.dup2(high[1], _ZREQ_FD)
        host_pid = (cfg.get("host_ns") or {}).get("pid")
        private_pid_ns = bool(host_pid) and os.readlink("/proc/self/ns/pid") != host_pid
        zcfg = {"sys_path": cfg["sys_path"], "preload": cfg["preload"], "path_fds": {},
                "lifeline": not private_pid_ns}
        if self.reach_runtime:
            zcfg["path_fds"] = self._runtime_fds()
        keep = sorted(zcfg["path_fds"].values())
        low = _ZREQ_FD + 1
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        zsock = socket.socket(fileno=os.dup(_ZSOCK_FD))  # for sending the listener (closed before exec)
        # SIGINT as a fresh interpreter expects it: SIG_DFL, so the zygote installs its KeyboardInterrupt handler.
        # A host started with SIGINT ignored (a background job of a non-interactive shell) hands SIG_IGN down to
        # here, and in jobs under SIG_IGN _thread.interrupt_main (evaluation's per-test watchdog) does nothing.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        self._confine_zygote()
        if self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != self.pid:
            os._exit(72)
        if not cfg.get("native_jobs"):
            self._landlock()
        if self.libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if self.bpf is not None:
            buf = (ctypes.c_ubyte * len(self.bpf)).from_buffer(bytearray(self.bpf))
            prog = _SockFprog(len(self.bpf) // 8, ctypes.addressof(buf))
            listener = self.libc.syscall(self.seccomp_nr, _SECCOMP_SET_MODE_FILTER,
                                         _SECCOMP_FILTER_FLAG_NEW_LISTENER, ctypes.byref(prog))
            if listener < 0:
                raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
            socket.send_fds(zsock, [b"{}"], [listener])
            os.close(listener)  # only the server may answer: a job holding it could allow its own fork
        zsock.close()
        zcfg["native_jobs"] = bool(cfg.get("native_jobs"))
        python = cfg["python"]
        os.execve(python, [python, "-S", "-s", "-c", cfg["zygote_source"], json.dumps(zcfg)], dict(os.environ))

    def _confine_zygote(self) -> None:  # pragma: no cover - in the zygote, before exec
        """Give up what the zygote and its jobs must not hold: the bounding and ambient sets, and every
        capability but, for a root worker's zygote, ``CAP_SETUID``/``CAP_SETGID`` (kept through the execve as
        inheritable capabilities, only to hand each job child its uid: the zygote stays uid 0, which a job's
        uid cannot signal, trace or read)."""
        libc = self.libc
        keep = (1 << 6) | (1 << 7) if self.drop_uid else 0  # CAP_SETGID, CAP_SETUID
        header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        if self.drop_uid:  # inheritable first (it must be a subset of the bounding set when set)
            now = (ctypes.c_uint32 * 6)()
            if libc.capget(header, now) != 0:
                raise OSError(ctypes.get_errno(), "capget failed")
            now[2] = keep
            if libc.capset(header, now) != 0:
                raise OSError(ctypes.get_errno(), "capset of the inheritable set failed")
        for cap in self.bounding:  # needs CAP_SETPCAP (held by the worker wherever its bounding set is not empty)
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        if self.drop_uid or self.drop_caps:
            data = (ctypes.c_uint32 * 6)(keep, keep, keep, 0, 0, 0)  # effective, permitted, inheritable
            if libc.capset(header, data) != 0:
                raise OSError(ctypes.get_errno(), "capset failed")

    def _landlock(self) -> None:  # pragma: no cover - in the zygote, before exec
        """A Landlock ruleset: everything under every top-level directory but ``/proc`` stays as reachable as
        before (file permissions and the mounts still decide); ``/proc`` (``/proc/self/mem``, the worker's
        counters) is refused. Where the kernel has no Landlock the worker reports the missing layer."""
        libc = self.libc
        nrs = _SYS_LANDLOCK.get(self._arch)
        abi = libc.syscall(nrs[0], None, 0, _LANDLOCK_CREATE_RULESET_VERSION) if nrs else -1
        if abi < 1:
            self.landlock_error = f"Landlock unavailable (errno {ctypes.get_errno()})"
            return
        fs = _LANDLOCK_FS[min(abi, 5)]
        attr = (ctypes.c_uint64 * 3)(fs, 0, _LANDLOCK_SCOPE_SIGNAL if abi >= 6 else 0)
        size = ctypes.sizeof(ctypes.c_uint64) * (3 if abi >= 6 else 1)
        ruleset = libc.syscall(nrs[0], ctypes.byref(attr), size, 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
        rule = (ctypes.c_ubyte * 12)()
        try:
            for name in sorted(os.listdir("/")):
                if name == "proc":
                    continue
                try:
                    fd = os.open("/" + name, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    rights = fs if stat.S_ISDIR(os.fstat(fd).st_mode) else fs & _LANDLOCK_FILE_RIGHTS
                    struct.pack_into("=Qi", rule, 0, rights, fd)
                    if libc.syscall(nrs[1], ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule(/{name}) failed")
                finally:
                    os.close(fd)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.syscall(nrs[2], ruleset, 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
        finally:
            os.close(ruleset)

    def _runtime_fds(self) -> dict[str, int]:  # pragma: no cover - in the zygote, before exec
        """Plain root mode: the interpreter may live under a directory the job uid cannot traverse (e.g.
        ``/root/.pyenv``). An O_PATH descriptor per ``sys.path`` directory, opened while still root, lets the
        job import through ``/proc/self/fd/N``: path checks then start at that directory, so the job reaches
        exactly the runtime's (world-readable) files and not its ancestors. The zygote maps its paths."""
        out = {}
        for entry in self.cfg["sys_path"]:
            try:
                out[entry] = os.open(entry, os.O_PATH | os.O_DIRECTORY)
            except OSError:
                continue
            os.set_inheritable(out[entry], True)  # through the execve
        return out

    def _on_notification(self) -> None:
        """Answer one seccomp notification: the zygote may execute its interpreter (once, at start-up), fork a
        job child (once per job) and install its interpreter's signal handlers; a job may signal only itself;
        anything else is refused with EPERM. For a probe job the kernel's view of the job process is recorded
        while it waits for the answer (its signal to itself, ``os.kill(os.getpid(), 0)``)."""
        buf = bytearray(self.notif_size)
        try:
            fcntl.ioctl(self.listener, _SECCOMP_IOCTL_NOTIF_RECV, buf)
        except OSError:
            return  # the caller died meanwhile (ENOENT), or nothing was pending
        if struct.unpack_from("=I", buf, 8)[0] != self.zpid and not self.job_pid:
            self.pending.append(buf)  # a new job child, before its zygote told us its pid: answered then
            return
        self._answer(buf)

    def _answer(self, buf: bytearray) -> None:
        """Decide and answer one received notification (see :meth:`_on_notification`)."""
        nid, pid, _flags = struct.unpack_from("=QII", buf, 0)
        nr = struct.unpack_from("=i", buf, 16)[0]
        args = struct.unpack_from("=6q", buf, 32)
        allow = self._zygote_may(nr) if pid == self.zpid else self._job_may(nr, args)
        resp = struct.pack("=QqiI", nid, 0, 0 if allow else -errno.EPERM,
                           _SECCOMP_USER_NOTIF_FLAG_CONTINUE if allow else 0)
        try:
            fcntl.ioctl(self.listener, _SECCOMP_IOCTL_NOTIF_SEND, bytearray(resp))
        except OSError:
            pass  # it died meanwhile

    def _zygote_may(self, nr: int) -> bool:
        """The zygote (which never runs job code): its one ``execve``, one fork per job asked for, its own
        interpreter's signal handlers and entropy."""
        kinds = self.notify_nrs
        if nr in kinds["exec"] and self.expect == "exec":
            self.expect = None
            return True
        if nr in kinds["fork"] and self.expect == "fork":
            self.expect = None
            return True
        return nr in kinds["sigaction"] or nr in kinds["getrandom"]

    def _job_may(self, nr: int, args: tuple[int, ...]) -> bool:
        """A job child (any of its threads): entropy is allowed and counted; a signal only to itself; its audit
        hook's marks, other signals, signal handlers, forks and programs are refused, each marked."""
        kinds = self.notify_nrs
        if nr in kinds["getrandom"]:
            if self.entropy_allowance:
                self.entropy_allowance -= 1  # the interpreter's own reseed of `random` after the fork
            else:
                self.entropy = True
            return True
        if nr in kinds["signal"]:
            target, sig = args[0], args[self.sig_arg.get(nr, 1)]
            low = (target & 0xFFFFFFFF) - ((target & 0x80000000) << 1)  # pid_t: the low 32 bits, signed
            if nr in kinds["kill"] and sig == 0 and -(_MARK_BASE + _TAMPER_CODES) <= low <= -_MARK_BASE:
                if low == -_MARK_BASE:
                    self.entropy = True  # a clock wrapper: the job read the clock
                else:
                    self._mark(-low - _MARK_BASE)  # the audit hook's mark
                return False
            if self.job_pid and target == self.job_pid:
                self.self_signals.add(sig)
                if self.probe_facts is not None and not self.probe_facts:
                    self.probe_facts.update(_process_facts(self.job_pid))
                return True
            self._mark(_SIGNAL)
            return False
        if nr in kinds["sigaction"]:
            if args[0] not in _LIBC_SIGNALS:  # glibc sets its own up as a job's first thread starts
                self._mark(_SIGNAL)  # a Python handler is handed the interrupted frame
        elif nr in kinds["fork"] or nr in kinds["exec"]:
            self._mark(_PROCESS)
        return False

    def _mark(self, code: int) -> None:
        """Record tampering class ``code`` for the running job (once)."""
        if code not in self.marks:
            self.marks.append(code)

    # ------------------------------------------------------------------ per job
    def serve(self, rep_fd: int) -> None:
        """Answer jobs until the host closes our stdin.

        Per job the host sends two frames: a **control** frame (the limits and the deadline: numbers only),
        which the worker reads, and the **job** frame (code and call), which the worker never reads: the job
        child reads it from the same pipe after the zygote forked it. The child's reply and output come back
        into :class:`_Sink` buffers and are relayed to the host as raw bytes, never decoded here, and the
        buffers are zeroed after every job. The zygote never holds a job's text either, so no job finds an
        earlier one's text, value or output in its memory (``tests/sandbox/test_reward_hacking.py`` scans a
        job's memory for the previous job's markers).

        The result goes out as soon as the job is over; restoring the job area and checking our own state
        come after it, under the host's separate cleanup budget, so a job that fills its area until its
        deadline never makes the worker look unresponsive. A worker that cannot restore itself says why and
        exits (the host starts a fresh one) instead of answering later jobs from a dirty state.
        """
        while True:
            ctl = _read_frame(self.req_fd)
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
                self.rep_sink.send(rep_fd, meta["reply"] + _MAC_BYTES, start=_MAC_BYTES)
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
        mb = 1024 * 1024
        as_bytes = self.baseline_as + int(lim["memory_mb"]) * mb
        cpu = int(-(-float(lim["cpu_s"]) // 1))
        nproc = int(lim["max_threads"]) + 4
        token = os.urandom(_TOKEN_BYTES)
        self.marks, self.entropy, self.self_signals = [], False, set()
        self.entropy_allowance = self.fork_entropy
        req = {"token": token.hex(), "seed": os.urandom(8).hex(), "jobdir": jobdir, "max_output_chars": cap,
               "uid": self.uid if self.drop_uid else None, "gid": self.gid,
               "as_bytes": [as_bytes, as_bytes], "cpu": [cpu, cpu + 1], "nproc": [nproc, nproc],
               "fsize": [int(lim["max_file_mb"]) * mb] * 2, "nofile": [int(lim["max_open_files"])] * 2,
               "keep_fds": self.keep_fds, "native": bool(self.cfg.get("native_jobs"))}
        self.probe_facts = {} if ctl.get("probe") else None
        r_rep, w_rep = os.pipe2(os.O_CLOEXEC)
        r_out, w_out = os.pipe2(os.O_CLOEXEC)
        t0 = time.monotonic()
        try:
            socket.send_fds(self.zsock, [json.dumps(req).encode()], [w_rep, w_out])
        finally:
            os.close(w_rep)
            os.close(w_out)
        try:
            self.expect = "fork"
            msg, _ = self._zygote_message(t0 + max(30.0, timeout))
            self.expect = None
            self.job_pid = int(msg["pid"])
            while self.pending:
                self._answer(self.pending.pop(0))
            backstop = (float(ctl.get("backstop_s") or timeout), bool(ctl.get("backstop_batch")))
            meta = self._supervise(r_rep, r_out, t0, timeout, cap, lim, token, backstop)
            if self.probe_facts is not None:
                meta["probe"] = self.probe_facts
            return meta
        finally:
            self.job_pid = 0
            self.probe_facts = None
            self.pending.clear()
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

    def _supervise(self, r_rep: int, r_out: int, t0: float, timeout: float, cap: int, lim: dict,
                   token: bytes, ctl_backstop: tuple[float, bool]) -> dict:
        """Wait for the child's reply (its first frame, after the token), its output and its end; kill it, and
        read from the zygote how it ended.

        The job's time limit is its own time, not the machine's: at the deadline the child is killed only if
        it used ``timeout`` seconds of CPU or of its own wall time (time not spent waiting for a CPU, from
        ``/proc/<pid>/schedstat``); a job that was kept waiting gets the time it waited. Past the backstop
        (``ctl_backstop``: ten times the limit and 10 s, from the host) a job that still has not used its time
        is stopped with status ``infra`` (the host retries it; its verdict is never "timeout" for the machine's
        load), or ``timeout`` when the backstop is the host's batch deadline.

        Returns the result's metadata; the raw reply and output stay in the sinks (never decoded here).
        """
        w = _Watch(t0, timeout, t0 + float(ctl_backstop[0]), ctl_backstop[1], cap, token, r_rep, r_out)
        for fd in w.open_fds:
            os.set_blocking(fd, False)
        while (w.open_fds or w.ended is None) and not w.reply and not w.stop:
            self._watch_once(w)
        if not (w.reply or w.stop) and self.rep_sink.n and os.WIFEXITED(w.ended[0]):
            # The channel closed on bytes that are no complete frame, and the process exited (the harness writes
            # its whole frame, then exits): a frame the job began, whose length the harness's reply never filled.
            w.forged = True
            self._mark(_REPLY_FORGERY)
        seconds = time.monotonic() - t0
        if w.reply and not w.out_over:
            # The child flushed stdout before replying: whatever it printed is already in the pipe.
            while self.out_sink.n <= w.out_cap:
                try:
                    if not self.out_sink.read_from(r_out):
                        break
                except BlockingIOError:
                    break
            w.out_over = self.out_sink.n > w.out_cap
        if w.ended is None:
            self._drain_notifications()  # what its threads tripped while the reply was read
            try:  # kill the job child, even after a normal reply (threads, stragglers); its zygote reaps it
                os.kill(self.job_pid, signal.SIGKILL)
            except OSError:
                pass
            w.ended = self._ended(wait=True)
        meta = self._job_meta(w, lim)
        meta.update(seconds=seconds, tamper=list(self.marks), entropy=self.entropy)
        return meta

    def _watch_once(self, w: _Watch) -> None:
        """One wait of :meth:`_supervise`: the deadline, a seccomp notification, the zygote's report of the
        child's end, its reply and output as they come."""
        remaining = w.deadline - time.monotonic()
        if remaining <= 0:
            verdict, more = self._past_deadline(w.t0, w.timeout, w.backstop, w.batch)
            if verdict == "timeout":
                w.timed_out = w.stop = True
            elif verdict != "more":
                w.infra, w.stop = verdict, True
            else:
                w.deadline = time.monotonic() + more
            return
        watch = w.open_fds + [self.zsock] + ([self.listener] if self.listener >= 0 else [])
        ready, _, _ = select.select(watch, [], [], remaining)
        if self.listener in ready:
            self._on_notification()
        if self.zsock in ready:
            w.ended = self._ended()
        for fd in ready:
            if fd not in w.open_fds:
                continue
            sink = self.out_sink if fd == w.r_out else self.rep_sink
            try:
                got = sink.read_from(fd)
            except BlockingIOError:
                continue
            if not got:
                w.open_fds.remove(fd)
            elif fd == w.r_out:
                w.out_over = self.out_sink.n > w.out_cap
            else:
                self._check_reply(w)
        if w.out_over or w.forged:
            w.reply = 0 if w.forged else w.reply
            w.stop = True

    def _check_reply(self, w: _Watch) -> None:
        """After reading reply bytes: the first complete frame, if its seal is right; anything else is the job's
        own writing on its reply channel (tampering: ``reply_forgery``)."""
        rep, head = self.rep_sink, _MAC_BYTES + _HEADER.size
        # the harness's own reply is never over rep_cap (its text is capped): anything longer is the job's
        if rep.n > w.rep_cap:
            w.forged = True
        elif rep.n >= head:
            (size,) = _HEADER.unpack_from(rep.chunks[0], _MAC_BYTES)
            if size > w.rep_cap:
                w.forged = True
            elif rep.n >= head + size:
                w.reply = head + size  # first frame only
                w.forged = not self._sealed(w.token, w.reply)
        if w.forged:
            self._mark(_REPLY_FORGERY)

    def _job_meta(self, w: _Watch, lim: dict) -> dict:
        """The result's metadata from what :meth:`_supervise` saw (its verdict on limits, forgeries and crashes,
        or the length of the harness's reply, which the host parses)."""
        wstatus, cpu_used = w.ended
        base = {"status": None, "error": None, "reply": 0, "stdout": 0}
        if w.out_over:
            return {**base, "status": "output_limit",
                    "error": f"stdout exceeded max_output_chars={w.cap} (output is never truncated)"}
        base["stdout"] = self.out_sink.n
        if w.timed_out:
            return {**base, "status": "timeout",
                    "error": f"time limit of {w.timeout:g} s exceeded; the job was killed"}
        if w.infra:
            return {**base, "stdout": 0, "status": "infra", "error": w.infra}
        if w.forged:
            return {**base, "status": "crashed",
                    "error": "the job wrote to its reply channel itself (only the sandbox's harness may)"}
        if w.reply:
            return {**base, "reply": w.reply - _MAC_BYTES}  # the host parses it (the seal is not relayed)
        # No reply: the child died.
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= float(lim["cpu_s"]) - 0.05):
                return {**base, "status": "timeout", "error": f"CPU time limit of {lim['cpu_s']:g} s exceeded"}
            if sig in self.self_signals and sig != signal.SIGABRT:  # (CPython's own fatal errors abort too)
                self._mark(_EXIT)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return {**base, "status": "crashed", "error": f"the job process was killed by {name}"}
        code = os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else -1
        if os.WIFEXITED(wstatus) and code not in _HARNESS_EXITS:
            self._mark(_EXIT)  # only the job's own code ends the process without the harness's reply
        return {**base, "status": "crashed",
                "error": f"the job process exited with code {code} without a result (os._exit?)"}

    def _drain_notifications(self, most: int = 64) -> None:
        """Answer the seccomp notifications already waiting (at most ``most``), so that what the job's threads
        tripped while its reply was read is recorded before the job is killed."""
        for _ in range(most):
            if self.listener < 0 or not select.select([self.listener], [], [], 0)[0]:
                return
            self._on_notification()

    def _sealed(self, token: bytes, end: int) -> bool:
        """Whether the reply's first ``end`` bytes are a frame sealed with ``token`` (HMAC-SHA256 of the frame,
        then the frame): only the job's harness holds the token."""
        mac = hmac.new(token, digestmod="sha256")
        for view in self.rep_sink.views(_MAC_BYTES, end):
            mac.update(view)
        claimed = b"".join(bytes(v) for v in self.rep_sink.views(0, _MAC_BYTES))
        return hmac.compare_digest(mac.digest(), claimed)

    def _past_deadline(self, t0: float, timeout: float, backstop: float, batch: bool) -> tuple[str, float]:
        """At the job's deadline: ``("timeout", 0)`` when it used its time (CPU, or its own wall time), else
        ``("more", s)`` with the time it has left, or, past the backstop, ``("timeout", 0)`` for the host's
        batch deadline and ``(<why>, 0)`` for the machine's load."""
        now = time.monotonic()
        try:
            with open(f"/proc/{self.job_pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: every thread
            with open(f"/proc/{self.job_pid}/schedstat") as fh:
                waited = int(fh.read().split()[1]) / 1e9  # the main thread's time runnable, not running
        except (OSError, IndexError, ValueError):
            return "timeout", 0.0  # gone, or no schedstat here: the wall clock decides
        own = now - t0 - waited
        used = max(cpu, own)
        if used >= timeout - 1e-3:
            return "timeout", 0.0
        if now >= backstop:
            if batch:
                return "timeout", 0.0
            return (f"the job had {used:.2f} s of its {timeout:g} s after {now - t0:.1f} s ({waited:.1f} s waiting "
                    f"for a CPU): the machine is too busy to time it fairly"), 0.0
        return "more", max(timeout - used, 0.005)

    def _ended(self, wait: bool = False) -> tuple[int, float]:
        """The zygote's report on the job child (wait status, CPU seconds); with ``wait``, waits for it."""
        msg, _ = self._zygote_message(time.monotonic() + (30.0 if wait else 5.0))
        if "wstatus" not in msg:
            raise RuntimeError(f"unexpected message from the zygote: {msg}")
        return int(msg["wstatus"]), float(msg["cpu"])

    def _restore(self) -> str | None:
        """After a job: reap orphans, empty the job area, check our own attributes and that the zygote lives.

        A job child cannot fork (the seccomp filter hands its forks to this server, which refuses them), so
        nothing outlives the job but what its zygote reaps. Returns why the worker cannot go on (it then
        retires), or None when it is as it was at start-up.
        """
        problems = []
        while True:  # reap orphans handed to us as subreaper (none expected)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.zpid:
                problems.append("the zygote exited")
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
        now = self._all_attributes()
        for key, value in self.attrs.items():
            if now.get(key) != value:
                problems.append(f"worker {key} changed from {value!r} to {now.get(key)!r}")
        return "; ".join(problems) or None

    def _attributes(self, pid: int = 0) -> dict:
        """The attributes of this worker (``pid`` 0) or of its zygote a job might try to change for good (each
        read is one syscall)."""
        out: dict = {
            "nice": os.getpriority(os.PRIO_PROCESS, pid),
            "policy": os.sched_getscheduler(pid),
            "sched_priority": os.sched_getparam(pid).sched_priority,
            "affinity": sorted(os.sched_getaffinity(pid)),
            "rlimits": [resource.prlimit(pid, r) if pid else resource.getrlimit(r) for r in _RLIMITS],
        }
        nr = _SYS_IOPRIO_GET.get(self._arch)
        if nr is not None:
            out["ioprio"] = self.libc.syscall(nr, _IOPRIO_WHO_PROCESS, pid)
        try:  # "/autogroup-N nice K" (absent without CONFIG_SCHED_AUTOGROUP); os.open: 4x cheaper than open()
            fd = os.open(f"/proc/{pid or 'self'}/autogroup", os.O_RDONLY | os.O_CLOEXEC)
            try:
                out["autogroup_nice"] = os.read(fd, 256).split()[-1].decode()
            finally:
                os.close(fd)
        except (OSError, IndexError):
            out["autogroup_nice"] = None
        return out

    def _all_attributes(self) -> dict:
        """This worker's attributes and its zygote's (``zygote <key>``)."""
        out = self._attributes()
        out.update({f"zygote {k}": v for k, v in self._attributes(self.zpid).items()})
        return out

    # ------------------------------------------------------------------ in the child


def _effective_caps() -> int:
    """The calling process's effective capability set, from /proc/self/status."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _process_facts(pid: int) -> dict:
    """The kernel's view of a process (``/proc/PID/status`` capability, seccomp and no-new-privs lines, its
    namespaces): what a probe job cannot read itself (Landlock refuses it ``/proc``)."""
    facts: dict = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh", "Seccomp", "NoNewPrivs", "Uid"):
                    facts[key] = value.strip()
        facts["ns"] = {n: os.readlink(f"/proc/{pid}/ns/{n}") for n in ("net", "pid", "mnt", "ipc", "uts", "user")}
    except OSError as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


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
        ready = worker.boot(req_fd)
    except BaseException as exc:
        _write_frame(rep_fd, {"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        raise
    _write_frame(rep_fd, ready)
    worker.serve(rep_fd)


if __name__ == "__main__":
    main()
