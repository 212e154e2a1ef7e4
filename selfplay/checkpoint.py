"""Atomic, verifiable run checkpoints.

A checkpoint is a directory ``checkpoints/step_<n>/``: the caller's files, ``MANIFEST.json`` (the size and
SHA-256 of every one of them) and ``DONE``. :func:`write_checkpoint` writes it as follows:

1. a fresh temporary directory ``.tmp_step_<n>_<pid>`` in the same folder;
2. the caller's files (``write(tmp)``);
3. ``MANIFEST.json``, then an fsync of every file and directory;
4. ``DONE`` (holding ``n``), fsynced;
5. a rename to ``step_<n>`` (``os.replace`` of a directory is atomic on POSIX) and an fsync of the folder;
6. pruning to the newest ``keep``: each older checkpoint is first renamed to a temporary name (atomic), then
   deleted, so a kill while deleting leaves a temporary leftover, never a half-deleted ``step_<k>``.

A run killed at any instant (``kill -9`` included) therefore leaves the earlier checkpoints intact and at most a
temporary leftover (which :func:`cleanup_partial` removes). A failure in steps 1-5 (a full disk, an unwritable
folder) removes the temporary directory and raises :class:`CheckpointWriteError`; the earlier checkpoints are
untouched.

Before a checkpoint is used, :func:`verify_checkpoint` checks that ``DONE`` and ``MANIFEST.json`` are there and
that every recorded file is a path inside the checkpoint, a regular file (a symbolic link is never followed),
readable and of the recorded size and hash, and that every ``.json`` file decodes within the run directory's
nesting bound (:data:`selfplay.rundir.MAX_JSON_DEPTH`). A hash proves that a file is the one written, not that a
run directory from elsewhere was written by this code: the caller checks the contents too (``check`` of
:func:`find_resumable`; :mod:`selfplay.resume` checks ``loop_state.json``'s values). :func:`find_resumable`
returns the newest checkpoint that passes both and the damaged newer ones it skipped (each
:class:`CheckpointError` names the damaged file), or raises :class:`NoIntactCheckpoint` if the run has
checkpoints but none is intact.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from selfplay.rundir import (
    CHECKPOINTS,
    DONE,
    STEP_DIR_RE,
    RunFileError,
    list_checkpoints,
    read_json,
    read_text,
    real_dir,
    step_dirs,
    write_text_atomic,
)

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "populora-checkpoint"
MANIFEST_VERSION = 1
DAMAGED_DIR = "damaged"
"""Sub-folder of ``checkpoints/`` that damaged checkpoints newer than the resumed one are moved to."""

_TMP_PREFIX = ".tmp_"


class CheckpointError(Exception):
    """A checkpoint that cannot be used: ``path`` is the damaged file (or directory), ``checkpoint`` the
    checkpoint directory it belongs to."""

    def __init__(self, path: Path, reason: str, checkpoint: Path | None = None):
        self.path, self.reason = Path(path), reason
        self.checkpoint = Path(checkpoint) if checkpoint is not None else self.path
        super().__init__(f"{path}: {reason}")


class NoIntactCheckpoint(CheckpointError):
    """A run has checkpoints, but every one of them is damaged."""

    def __init__(self, run_dir: Path, damaged: list[CheckpointError]):
        self.damaged = list(damaged)
        details = "; ".join(str(e) for e in damaged)
        super().__init__(checkpoint_dir(run_dir), f"no intact checkpoint to resume from ({details})")




@dataclass(frozen=True)
class Resumable:
    """The checkpoint a run resumes from, and the damaged newer ones that were skipped (newest first)."""

    step: int
    path: Path
    skipped: tuple[CheckpointError, ...] = ()


def checkpoint_dir(run_dir: Path) -> Path:
    """The folder that holds a run's checkpoints."""
    return Path(run_dir) / CHECKPOINTS


def cleanup_partial(run_dir: Path) -> list[Path]:
    """Remove the temporary directories left by an interrupted checkpoint write or pruning; returns them."""
    root = checkpoint_dir(run_dir)
    removed = []
    if root.is_dir() and not root.is_symlink():
        for p in sorted(root.iterdir()):
            if p.name.startswith(_TMP_PREFIX):
                _remove_tree(p)
                removed.append(p)
    return removed


# ------------------------------------------------------------------------------------------- hashing


def file_digest(path: Path) -> tuple[int, str]:
    """``(size in bytes, SHA-256 hex)`` of a file, read once."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        size = f.tell()
    return size, digest


def _payload_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and p.relative_to(d).as_posix() not in (MANIFEST, DONE))


def write_manifest(d: Path, step: int) -> dict[str, Any]:
    """Record the size and SHA-256 of every file under ``d`` in ``d/MANIFEST.json``; returns the manifest."""
    files = {}
    for p in _payload_files(d):
        size, sha = file_digest(p)
        files[p.relative_to(d).as_posix()] = {"size": size, "sha256": sha}
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "step": step, "files": files}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def verify_checkpoint(d: Path) -> int:
    """Check checkpoint directory ``d`` and return its step.

    Checked: the name is ``step_<n>``; ``DONE`` holds ``n``; ``MANIFEST.json`` parses and is for step ``n``; every
    recorded file is a readable regular file of the recorded size and SHA-256. Files not in the manifest are
    ignored.

    Raises:
        CheckpointError: naming the first damaged file and what is wrong with it.
    """
    d = Path(d)
    try:
        return _verify(d)
    except CheckpointError as exc:
        exc.checkpoint = d
        raise


def _verify(d: Path) -> int:
    m = STEP_DIR_RE.match(d.name)
    if m is None or not d.is_dir():
        raise CheckpointError(d, f"not a checkpoint directory (expected {CHECKPOINTS}/step_<n>/)")
    step = int(m.group(1))
    if not os.path.lexists(d / DONE):
        raise CheckpointError(d / DONE, "missing: the checkpoint was never completed")
    try:
        done = read_text(d / DONE, max_bytes=64).strip()
    except RunFileError as exc:
        raise CheckpointError(d / DONE, f"unreadable ({exc.reason})") from None
    if done != str(step):
        raise CheckpointError(d / DONE, f"holds {done!r}, expected {step}")
    try:
        manifest = read_json(d / MANIFEST)
    except RunFileError as exc:
        what = ("missing: the checkpoint cannot be verified" if not (d / MANIFEST).exists()
                else f"unreadable ({exc.reason})")
        raise CheckpointError(d / MANIFEST, what) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or manifest.get("format") != MANIFEST_FORMAT
            or manifest.get("version") != MANIFEST_VERSION):
        raise CheckpointError(d / MANIFEST, f"not a version-{MANIFEST_VERSION} {MANIFEST_FORMAT} manifest")
    if manifest.get("step") != step:
        raise CheckpointError(d / MANIFEST, f"is for step {manifest.get('step')!r}, expected {step}")
    for rel, rec in sorted(files.items()):
        _verify_file(d, rel, rec)
    return step


def _verify_file(d: Path, rel: str, rec: Any) -> None:
    """One file the manifest records: inside the checkpoint, a regular file (never a link), of the recorded size
    and SHA-256; a ``.json`` file also decodes within the run directory's nesting bound."""
    parts = PurePosixPath(rel).parts
    if not rel or PurePosixPath(rel).is_absolute() or ".." in parts or "\\" in rel:
        raise CheckpointError(d / MANIFEST, f"records {rel!r}, which is not a path inside the checkpoint")
    p = d.joinpath(*parts)
    try:
        want_size, want_sha = int(rec["size"]), str(rec["sha256"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(d / MANIFEST, f"bad entry for {rel!r}: {rec!r}") from None
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise CheckpointError(p, "missing") from None
    except OSError as exc:
        raise CheckpointError(p, f"unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode) or any(q.is_symlink() for q in list(p.parents)[:len(parts) - 1]):
        raise CheckpointError(p, "not a regular file" if not stat.S_ISLNK(st.st_mode) else
                              "a symbolic link (a checkpoint holds none: not followed)")
    if st.st_size != want_size:
        raise CheckpointError(p, f"{st.st_size} bytes, {want_size} recorded when the checkpoint was written")
    try:
        _size, sha = file_digest(p)
    except OSError as exc:
        raise CheckpointError(p, f"unreadable ({exc.strerror or exc})") from None
    if sha != want_sha:
        raise CheckpointError(p, "content differs from the SHA-256 recorded when the checkpoint was written")
    if p.suffix == ".json":
        try:
            read_json(p)
        except RunFileError as exc:
            raise CheckpointError(p, exc.reason) from None


def find_resumable(run_dir: Path, check: Callable[[Path], None] | None = None) -> Resumable | None:
    """The newest intact checkpoint of a run (verified with :func:`verify_checkpoint`, then by ``check(path)``,
    which raises :class:`CheckpointError` for contents the caller cannot use).

    Returns None if the run has no ``step_<n>`` directory at all. Damaged checkpoints newer than the one returned
    are listed in ``skipped`` (newest first) and logged with the file that is damaged.

    Raises:
        NoIntactCheckpoint: the run has checkpoints, but none is intact (the message names each damaged file).
    """
    damaged: list[CheckpointError] = []
    for step, d in reversed(step_dirs(run_dir)):
        try:
            verify_checkpoint(d)
            if check is not None:
                check(d)
        except CheckpointError as exc:
            exc.checkpoint = d
            log.warning("checkpoint %s is damaged, skipped: %s", d.name, exc)
            damaged.append(exc)
            continue
        return Resumable(step, d, tuple(damaged))
    if damaged:
        raise NoIntactCheckpoint(run_dir, damaged)
    return None


def set_aside(run_dir: Path, checkpoints: list[Path]) -> list[Path]:
    """Move checkpoint directories out of the run's list into ``checkpoints/damaged/`` (replacing an earlier one of
    the same name); returns the new paths. Used for damaged checkpoints newer than the one a run resumes from, so
    that they are neither counted when pruning nor mistaken for progress."""
    target = checkpoint_dir(run_dir) / DAMAGED_DIR
    moved = []
    for d in checkpoints:
        real_dir(target)  # a link planted there would move the checkpoint out of the run
        dest = target / Path(d).name
        if dest.exists():
            _remove_tree(dest)
        os.replace(d, dest)
        log.warning("moved damaged checkpoint %s to %s", d, dest)
        moved.append(dest)
    return moved


# ------------------------------------------------------------------------------------------- writing


def _fsync_path(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            _fsync_path(os.path.join(dirpath, f))
        _fsync_path(dirpath)


def _remove_tree(path: Path) -> None:
    """Remove a directory tree, or just the link when ``path`` is a symbolic link (its target is left alone)."""
    if path.is_symlink():
        with contextlib.suppress(OSError):
            path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)


def _mark_done(tmp: Path, step: int) -> None:
    """Write and fsync ``DONE``: from here on the directory is a complete checkpoint."""
    with open(tmp / DONE, "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    _fsync_path(tmp)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the complete temporary directory to ``final`` (replacing an earlier checkpoint of the same step)."""
    if final.exists():  # re-writing the same step; a kill between the two renames falls back to the step before
        old = final.with_name(f"{_TMP_PREFIX}old_{final.name}_{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        _remove_tree(old)
    else:
        os.replace(tmp, final)
    _fsync_path(final.parent)


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (``keep <= 0`` keeps all); returns those removed.

    Each one is renamed to a temporary name first (atomic), so an interruption leaves a temporary leftover."""
    if keep <= 0:
        return []
    removed = []
    for _s, p in list_checkpoints(run_dir)[:-keep]:
        doomed = p.with_name(f"{_TMP_PREFIX}prune_{p.name}_{os.getpid()}")
        try:
            os.replace(p, doomed)
        except OSError as exc:
            log.warning("could not prune checkpoint %s: %s", p, exc)
            continue
        _remove_tree(doomed)
        removed.append(p)
    return removed


_LOW_SPACE = 1 << 20  # bytes: below this a failed write is reported as a full disk




def free_bytes(path: Path) -> int | None:
    """Bytes free for the caller on the filesystem of ``path`` (None if it cannot be told)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class WriteFailed(OSError):
    """Writing a run's files failed (a full disk, an unwritable folder); ``str()`` is one line."""

    def __str__(self) -> str:
        return str(self.strerror)


def write_failure(exc: BaseException, what: str, free: int | None, cls: type[WriteFailed] = WriteFailed
                  ) -> WriteFailed:
    """One-line error saying why ``what`` could not be written. torch reports a full disk as ``RuntimeError: ...
    unexpected pos``, safetensors as ``SafetensorError``: under 1 MiB of ``free`` space (measured before any
    clean-up) it is reported as a full disk."""
    code = exc.errno if isinstance(exc, OSError) and exc.errno else None
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    if code != errno.ENOSPC and free is not None and free < _LOW_SPACE:
        code, reason = errno.ENOSPC, f"no space left on the device ({reason})"
    where = "" if free is None else f"; {free / 2**20:.1f} MiB free there"
    return cls(code or errno.EIO, f"cannot write {what}: {reason}{where}")


class CheckpointWriteError(WriteFailed):
    """Writing a checkpoint failed (the temporary directory was removed; earlier checkpoints are untouched)."""


def write_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically (see the module docstring) and prune to the newest ``keep``.

    ``write(tmp_dir)`` fills a fresh temporary directory with the checkpoint's files.

    Raises:
        CheckpointWriteError: the checkpoint could not be written (e.g. the disk is full); the temporary directory
            is removed and the earlier checkpoints are untouched. The original exception is the ``__cause__``.
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step}"
    tmp = root / f"{_TMP_PREFIX}step_{step}_{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            _remove_tree(tmp)
        tmp.mkdir()
        write(tmp)
        write_manifest(tmp, step)
        _fsync_tree(tmp)
        _mark_done(tmp, step)
        _publish(tmp, final)
    except Exception as exc:
        free = free_bytes(root)  # before the clean-up gives the space back
        if tmp.exists():
            _remove_tree(tmp)
        raise write_failure(exc, f"checkpoint {final}", free, CheckpointWriteError) from exc
    except BaseException:  # KeyboardInterrupt and the like: leave no temporary directory, re-raise as is
        if tmp.exists():
            _remove_tree(tmp)
        raise
    prune_checkpoints(run_dir, keep)
    return final


def write_json(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` atomically (temp file + rename)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))
