"""A run's record of the configuration changes its resumes accepted: ``RUN_DIR/config_history.jsonl``, one JSON
object per change (``{"step", "field", "old", "new", "time"}``, written by
:func:`selfplay.config_changes.record_changes`). Standard library only, so that ``populora report`` reads it
without importing the configuration and, through it, torch and transformers (about half of the command's time
on a run without resumes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["HISTORY_NAME", "read_history"]

HISTORY_NAME = "config_history.jsonl"


def read_history(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The recorded changes of a run (``[]`` if none); a line that is not a JSON object is skipped."""
    path = Path(run_dir) / HISTORY_NAME
    if not path.is_file():
        return []
    out = []
    for ln in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if isinstance(rec, dict) and "step" in rec and "field" in rec:
            out.append(rec)
    return out
