"""The run directory: where a run lives, and the checks made on it before any work starts.

A run directory holds ``config.json``, ``checkpoints/``, TensorBoard event files, ``lineage.jsonl``,
``seeding.json``, ``adapters/``, ``run_summary.json`` and ``report/``. A new run starts only in a directory
that holds none of these: a second run there would mix with the first (its checkpoints next to the old ones,
``config.json`` overwritten, and a later ``--resume`` combining the old checkpoint with the new config).
Continuing a run is ``--resume``. Everything here is standard library only, so the command line can check a
directory before it imports the learning stack or loads a model.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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
    if not (path / "config.json").is_file():
        raise RunDirError(f"--resume: {path / 'config.json'} not found (is {path} a run directory?)")
    check_writable(path)
    return path
