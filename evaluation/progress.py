"""Incremental evaluation: every scored answer is kept on disk as soon as it is scored, and a second call resumes.

``<out>/generations/<benchmark>.jsonl`` gets one JSON row per answer (entry, task id, decoding, sample index,
answer, outcome), appended and flushed after every generation chunk; ``<out>/progress.json`` holds the settings
the rows were made under (:func:`settings_diff` compares them). A killed ``populora eval`` keeps every row it
wrote; the next call with the same settings reads them back, generates only what is missing and writes the
same results as an uninterrupted call (greedy rows are deterministic; sampled rows are seeded per problem). A
call whose settings differ in anything that changes an answer (model, adapter weights, engine, device, dtype,
budgets, prompt templates, sampling settings) is refused before any model loads, naming what differs;
``restart`` starts afresh instead. A smaller or larger ``--limit``, other benchmarks or other members are not
differences: rows are per (entry, problem), so they are reused where they apply.

:class:`Bars` draws one tqdm bar per entry (model) and benchmark: problems done, problems/s, time left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from selfplay.rundir import (
    EVAL_RESULTS,
    RunFileError,
    UnsafeRunFile,
    open_append,
    parse_json,
    read_json,
    read_text,
    real_dir,
    write_text_atomic,
)

PROGRESS_FILE = "progress.json"
GENERATIONS_DIR = "generations"
FORMAT_VERSION = 1

RowKey = tuple[str, str, str, int]
"""(entry key ``group:label``, task id, ``"greedy"`` | ``"sampled"``, sample index)."""


class SettingsMismatch(ValueError):
    """Earlier partial results were made under other settings."""


def row_key(row: Mapping[str, Any]) -> RowKey:
    return (str(row["entry"]), str(row["task_id"]), str(row.get("decoding", "greedy")), int(row.get("sample", 0)))


def row_ok(row: Any) -> bool:
    """Whether ``row`` has the shape :class:`ResultLog` writes: an object with string ``entry`` and
    ``task_id``, ``decoding`` ``greedy`` / ``sampled`` (default greedy), ``sample`` a non-negative int (default
    0) and a bool ``passed`` (what the scores are computed from)."""
    if not isinstance(row, dict) or not isinstance(row.get("entry"), str) or not isinstance(row.get("task_id"), str):
        return False
    sample = row.get("sample", 0)
    return (row.get("decoding", "greedy") in ("greedy", "sampled") and isinstance(sample, int)
            and not isinstance(sample, bool) and sample >= 0 and isinstance(row.get("passed"), bool))


def adapter_fingerprint(adapter_dir: Path) -> str:
    """SHA-256 over an adapter directory's files (names and bytes): a changed adapter invalidates its rows."""
    h = hashlib.sha256()
    for f in sorted(p for p in adapter_dir.rglob("*") if p.is_file()):
        h.update(f.relative_to(adapter_dir).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


RENAMED_SETTINGS = {"backend": "engine"}
"""Common settings renamed since an earlier release (old -> new name): a progress file written before still
resumes."""


def _current_names(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with the common settings under their current names (:data:`RENAMED_SETTINGS`)."""
    common = {RENAMED_SETTINGS.get(k, k): v for k, v in settings.get("common", {}).items()}
    return {**settings, "common": common}


def settings_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two settings dicts ``{"common": {...}, "entries": {...}, "benchmarks": {...}}``:
    every common key, and the entries and benchmarks present in both (new ones are not differences)."""
    diffs = [f"{k}: {old.get('common', {}).get(k)!r} -> {v!r}" for k, v in new.get("common", {}).items()
             if old.get("common", {}).get(k) != v]
    for section in ("entries", "benchmarks"):
        before = old.get(section, {})
        for name, value in new.get(section, {}).items():
            if name in before and before[name] != value:
                diffs.append(f"{section[:-1]} {name}: {before[name]!r} -> {value!r}")
    return diffs


class ResultLog:
    """The rows and settings of one output directory (see the module docstring)."""

    def __init__(self, out_dir: Path, settings: Mapping[str, Any], restart: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.settings = {k: dict(v) for k, v in settings.items()}
        self.restart = restart

    @property
    def gen_dir(self) -> Path:
        return self.out_dir / GENERATIONS_DIR

    def check(self) -> bool:
        """Raise :class:`SettingsMismatch` if earlier rows were made under other settings (unless ``restart``);
        return whether earlier rows will be reused. Reads only: nothing is written or deleted here."""
        path = self.out_dir / PROGRESS_FILE
        if self.restart or not path.is_file():
            return False
        try:
            old = read_json(path)
            if not isinstance(old, dict):
                raise RunFileError(path, "is not a JSON object")
            sections = old.get("settings", {})
            if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
                raise RunFileError(path, "holds no settings object of sections")
        except UnsafeRunFile:
            raise
        except RunFileError as exc:
            raise SettingsMismatch(f"{path} is unreadable ({exc.reason}); pass --restart to start afresh") from exc
        before = _current_names(old.get("settings", {}))
        diffs = settings_diff(before, self.settings)
        if diffs:
            raise SettingsMismatch(
                f"{self.out_dir} holds partial results made under other settings ({'; '.join(diffs)}); pass "
                "--restart to discard them, or --out-dir for a new directory"
            )
        self._merged = {k: {**before.get(k, {}), **v} for k, v in self.settings.items()}
        return True

    def begin(self) -> None:
        """Start writing: with ``restart``, drop earlier rows and results; record the settings. The output and
        generations folders must be real directories (a link there is refused, never written through)."""
        real_dir(self.out_dir)
        if self.restart:
            _remove(self.gen_dir)
            for name in (PROGRESS_FILE, EVAL_RESULTS, "results.md"):
                (self.out_dir / name).unlink(missing_ok=True)
        real_dir(self.gen_dir)
        merged = getattr(self, "_merged", self.settings)
        write_text_atomic(self.out_dir / PROGRESS_FILE,
                          json.dumps({"format_version": FORMAT_VERSION, "settings": merged}, indent=2) + "\n")

    def load(self, bench: str) -> dict[RowKey, dict[str, Any]]:
        """The rows already scored on ``bench`` (a torn last line, from a kill mid-write, is ignored)."""
        path = self.gen_dir / f"{bench}.jsonl"
        rows: dict[RowKey, dict[str, Any]] = {}
        if not path.is_file():
            return rows
        for i, line in enumerate(read_text(path).splitlines(), 1):
            try:
                row = parse_json(line, f"{path}, line {i}")
            except UnsafeRunFile:
                raise
            except RunFileError:
                continue
            if row_ok(row):  # a row of another shape (crafted, another version) is scored again
                rows[row_key(row)] = row
        return rows

    def append(self, bench: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append rows to ``bench``'s file and flush them to disk."""
        path = self.gen_dir / f"{bench}.jsonl"
        with open_append(path) as fh:  # never through a link planted at the name
            size = os.fstat(fh.fileno()).st_size
            # a torn last line (killed mid-write) must not swallow the next row
            torn = size > 0 and os.pread(fh.fileno(), 1, size - 1) != b"\n"
            if torn:
                fh.write("\n")
            for row in rows:
                fh.write(json.dumps(row) + "\n")
            fh.flush()

    def discard(self) -> None:
        """Delete the rows and the settings (``save_generations=False`` once the results are complete)."""
        _remove(self.gen_dir)
        (self.out_dir / PROGRESS_FILE).unlink(missing_ok=True)


def _remove(path: Path) -> None:
    """Remove a directory tree, or only the link when ``path`` is a symbolic link."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


class Bars:
    """One progress bar per entry of a benchmark phase: problems done, problems/s, time left."""

    def __init__(self, title: str, labels: Sequence[tuple[str, str]], total: int, done: Mapping[str, int],
                 enabled: bool = True) -> None:
        width = max((len(label) for _, label in labels), default=0)
        self.bars = {
            key: tqdm(total=total, initial=done.get(key, 0), desc=f"{title} {label:<{width}}", unit="problem",
                      position=i, leave=True, disable=not enabled, dynamic_ncols=True, mininterval=1.0)
            for i, (key, label) in enumerate(labels)
        }

    def update(self, key: str, n: int) -> None:
        if n:
            self.bars[key].update(n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
