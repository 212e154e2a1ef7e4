"""Atomic run checkpoints.

A checkpoint is a directory ``checkpoints/step_<n>/`` written under a temporary name in the same folder and
renamed into place only when complete (``os.replace`` of a directory is atomic on POSIX), so a run killed
at any instant (``kill -9`` included) leaves either the previous checkpoints or the new one, never half of
one. ``latest_checkpoint`` ignores temporary leftovers, which ``cleanup_partial`` removes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp_"


def checkpoint_dir(run_dir: Path) -> Path:
    """The folder that holds a run's checkpoints."""
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as ``(step, path)``, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and (p / "DONE").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint, or None."""
    cps = list_checkpoints(run_dir)
    return cps[-1] if cps else None


def cleanup_partial(run_dir: Path) -> None:
    """Remove temporary directories left by a checkpoint write that was interrupted."""
    root = checkpoint_dir(run_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(_TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically.

    ``write(tmp_dir)`` fills a fresh temporary directory; it is then fsynced, marked complete with a
    ``DONE`` file and renamed to ``step_<step>``. Only the newest ``keep`` checkpoints are kept
    (``keep <= 0`` keeps all).
    """
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}step_{step}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write(tmp)
    (tmp / "DONE").write_text(str(step))
    _fsync_tree(tmp)
    final = root / f"step_{step}"
    if final.exists():  # re-writing the same step (e.g. the final checkpoint after a periodic one)
        old = root / f"{_TMP_PREFIX}old_step_{step}_{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep > 0:
        for _s, p in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
    return final


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` atomically (temp file + rename)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))
