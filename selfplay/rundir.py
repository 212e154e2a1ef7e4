"""The run directory: where a run lives, and the checks made on it before any work starts.

A run directory holds ``config.json``, ``checkpoints/``, TensorBoard event files, ``lineage.jsonl``,
``seeding.json``, ``adapters/``, ``run_summary.json`` and ``report/``. A new run starts only in a directory
that holds none of these: a second run there would mix with the first (its checkpoints next to the old ones,
``config.json`` overwritten, and a later ``--resume`` combining the old checkpoint with the new config).
Continuing a run is ``--resume``. While a process writes a run it holds the directory's lock (:func:`run_lock`),
so a second ``train``/``baseline``/``--resume`` on the same directory exits at once naming the holder.
Everything here is standard library only, so the command line can check a
directory before it imports the learning stack or loads a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selfplay.config import TrainConfig

RUN_ENTRIES = ("config.json", "run_summary.json", "lineage.jsonl", "seeding.json", "checkpoints", "adapters",
               "report")
"""Names whose presence marks a directory as holding a run (besides TensorBoard event files)."""
EVENTS_PREFIX = "events.out.tfevents."


class RunDirError(Exception):
    """A run directory that cannot be used; the message names it and says why."""


def default_run_dir(cfg: TrainConfig) -> Path:
    """``cfg.run_dir``, else ``runs/<cfg.name>`` (the caller names the run)."""
    if cfg.run_dir is not None:
        return Path(cfg.run_dir)
    return Path("runs") / (cfg.name or f"{Path(cfg.preset).stem}-s{cfg.seed}")


def run_entries(path: Path) -> list[str]:
    """The entries of ``path`` that belong to a run (sorted; empty if none or if ``path`` is no directory)."""
    path = Path(path)
    if not path.is_dir():
        return []
    names = set(os.listdir(path))
    found = [n for n in RUN_ENTRIES if n in names]
    found += sorted(n for n in names if n.startswith(EVENTS_PREFIX))
    return found


def os_error_line(exc: OSError) -> str:
    """``strerror`` plus the file it is about, in one line (no errno number, no traceback)."""
    what = exc.strerror or str(exc)
    name = exc.filename if exc.filename is not None else None
    return f"{what}: {name}" if name is not None else what


def _first_existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: Path) -> None:
    """Create and remove a probe file in directory ``path``; raise :class:`RunDirError` if that fails."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
    except OSError as exc:
        raise RunDirError(f"cannot write in run directory {path}: {exc.strerror or exc}") from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _check_not_in_use(path: Path) -> None:
    holder = lock_holder(path)
    if holder is not None:
        raise RunDirError(f"run directory {path} is in use by {holder}: one run per directory; wait for it to "
                          f"finish, or choose another --run-dir")


def prepare_new_run_dir(path: Path) -> Path:
    """Check the directory of a new run and create it (with its parents); returns it.

    Nothing inside an existing directory is touched unless the checks pass.

    Raises:
        RunDirError: ``path`` is not a directory, already holds a run, or cannot be created or written.
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise RunDirError(f"run directory {path} exists and is not a directory")
        _check_not_in_use(path)
        found = run_entries(path)
        if found:
            raise RunDirError(f"run directory {path} already holds a run ({', '.join(found)}); continue it with "
                              f"--resume {path}, or choose another --run-dir")
    else:
        ancestor = _first_existing_ancestor(path)
        if not ancestor.is_dir():
            raise RunDirError(f"cannot create run directory {path}: {ancestor} is not a directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {path}: {exc.strerror or exc}") from exc
    check_writable(path)
    return path


def check_resume_dir(path: Path) -> Path:
    """Check that ``path`` is a writable run directory to continue; returns it.

    Raises:
        RunDirError: it does not exist, is no directory, has no ``config.json`` or cannot be written.
    """
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"--resume: {path} is not a directory")
    _check_not_in_use(path)
    if not (path / "config.json").is_file():
        raise RunDirError(f"--resume: {path / 'config.json'} not found (is {path} a run directory?)")
    check_writable(path)
    return path


# ------------------------------------------------------------------------------------------------- the lock

LOCK_NAME = ".lock"
"""The lock file of a run directory: an advisory ``flock`` held by the process that writes the run, and the
holder's pid, host and start time (JSON) for the message a second process gets."""

_held: dict[str, tuple[int, int]] = {}  # realpath -> (fd, depth): this process's locks (re-entrant)


def _holder(path: Path) -> str:
    try:
        info = json.loads((path / LOCK_NAME).read_text() or "{}")
        return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} "
                f"(since {info.get('since', '?')}, {info.get('command', '?')})")
    except (OSError, ValueError):
        return "another process (its pid/host record is not readable)"


def lock_holder(path: Path) -> str | None:
    """Who holds the lock of run directory ``path`` (pid, host, since when), or ``None`` if nobody (this
    process's own lock counts as nobody). Takes nothing: a shared ``flock`` is tried and released at once."""
    path = Path(path)
    if os.path.realpath(path) in _held:
        return None
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the probe's shared lock too
    return None


@contextlib.contextmanager
def run_lock(path: Path, command: str = "train") -> Iterator[Path]:
    """Hold the run directory ``path`` for this process: ``flock(LOCK_EX | LOCK_NB)`` on ``path/.lock``.

    A second process that tries while the lock is held gets :class:`RunDirError` naming the holder's pid and
    host; reading a run (``populora report``, ``populora eval``) takes no lock. The kernel drops the lock when
    its holder exits however it exits (``kill -9`` included), so a lock file left by a dead process is stale by
    construction: the next process acquires it and overwrites the record; no pid is probed, so a reused pid
    cannot make a dead holder look alive. Taken once per run, by :func:`selfplay.resume.resume_point`;
    re-entrant within one process all the same (a holder may call code that takes it again). The directory must
    exist.

    Why ``fcntl.flock`` and not ``filelock``: the same kernel lock underneath, but the record of who holds it
    lives in the locked file itself, so the refusal can name the holder (POSIX only; on NFS, Linux maps
    ``flock`` to byte-range locks that the server arbitrates between hosts).
    """
    path = Path(path)
    key = os.path.realpath(path)
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
        try:
            yield path
        finally:
            fd, depth = _held[key]
            _held[key] = (fd, depth - 1)
        return
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunDirError(f"cannot lock run directory {path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        _check_not_in_use(path)  # names the holder
        raise RunDirError(f"run directory {path} is in use by another process") from None
    except OSError as exc:
        os.close(fd)
        raise RunDirError(f"cannot lock run directory {path}: {exc.strerror or exc}") from exc
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:  # a full disk: the lock holds all the same, only the message of a second process is poorer
        pass
    _held[key] = (fd, 1)
    try:
        yield path
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the flock
