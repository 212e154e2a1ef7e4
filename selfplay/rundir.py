"""The run directory: its layout, the one reader of it (:class:`RunDir`), and the checks made on it before any
work starts.

**Layout.** A run directory holds ``config.json``, ``checkpoints/``, TensorBoard event files, ``lineage.jsonl``,
``config_history.jsonl``, ``tamper_samples.jsonl``, ``seeding.json``, ``adapters/``, ``run_summary.json``,
``report/`` and ``eval/``. The
names are defined here and nowhere else in the library (a test scans for them): every reader and writer of a run
(the run itself, resume, ``populora report``, ``populora eval``, ``populora compare``, the command line) takes
them from this module, and every reader reads them through :class:`RunDir`.

**New runs, resumes, the lock.** A new run starts only in a directory that does not exist or is empty (a lock
file left by a run killed before it wrote anything aside): one that holds a run would mix with it (its
checkpoints next to the old ones, ``config.json`` overwritten, a later ``--resume`` combining the old checkpoint
with the new config), and one that holds anything else is not a run directory (a home directory named by
mistake would get ``.lock``, ``adapters/``, ``checkpoints/`` and event files). Continuing a run is ``--resume``.
While a process writes a run it holds the directory's lock (:func:`run_lock`), so a second ``train``/
``baseline``/``--resume`` on the same directory exits at once naming the holder.

**Trust.** A run directory can come from someone else (a published run, a colleague's ``populora compare``
output), so reading one must not run code, exhaust the stack or write outside it:

* every JSON file is read with bounded nesting (:data:`MAX_JSON_DEPTH`; deeper is :class:`UnsafeRunFile`);
* an entry that is a symbolic link leading out of the directory is never followed (:class:`UnsafeRunFile`); a
  directory this project writes into (``report/``, ``eval/``, ``checkpoints/damaged/``) must be a real
  directory, and files are replaced atomically through a temporary file created with ``O_EXCL | O_NOFOLLOW``
  and renamed over the name (a link planted at the name is replaced, not written through); the lock file is
  opened with ``O_NOFOLLOW``;
* what an interrupted run leaves (a torn last line, a missing file) is not an error for the readers that
  tolerate it (``populora report``, ``populora compare``): they note it. What this project never writes (JSON
  nested beyond the bound, a link out of the directory) is refused by every reader, exit 2 naming the file.

Standard library only, so the command line can check a directory before it imports the learning stack and
``populora report`` stays free of torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import re
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# ------------------------------------------------------------------------------------------------- the layout

CONFIG = "config.json"
"""The run's record: name, arm, model, rank, alpha, agent mapping and ``config`` (the resolved configuration)."""
SUMMARY = "run_summary.json"
"""Written once, after the last step and the final adapters: timings and the per-step ``history``."""
LINEAGE = "lineage.jsonl"
"""One JSON object per evolution replacement, appended by the PBT controller."""
CONFIG_HISTORY = "config_history.jsonl"
"""One JSON object per configuration change a resume accepted (:mod:`selfplay.config_changes`)."""
TAMPER_SAMPLES = "tamper_samples.jsonl"
"""The first ``tamper_samples`` completions per member whose run tripped a sandbox defence, one JSON object per
line (:mod:`selfplay.tamper`): data to read, never code to run (the model's text is a JSON string in it)."""
MAX_TAMPER_BYTES = 64 << 20
"""Largest ``tamper_samples.jsonl`` a reader reads (a run writes at most ``tamper_samples`` lines per member, each
with a capped text); a larger one is a :class:`RunFileError` the report notes."""
CHECKPOINTS = "checkpoints"
"""The folder of the run's checkpoints (:mod:`selfplay.checkpoint`)."""
STEP_DIR_RE = re.compile(r"^step_(\d+)$")
"""The name of a checkpoint folder in ``checkpoints/``."""
DONE = "DONE"
"""The file that marks a checkpoint complete (written last, holding its step)."""
SEEDING = "seeding.json"
"""The buffers the seeding stage filled (:mod:`selfplay.seeding`)."""
ADAPTERS = "adapters"
"""The final adapters, one PEFT directory per member."""
ADAPTER_CONFIG = "adapter_config.json"
"""The file that marks a PEFT adapter directory."""
REPORT = "report"
"""``populora report``'s default output folder."""
EVAL = "eval"
"""``populora eval``'s default output folder."""
EVAL_RESULTS = "results.json"
"""The results file in ``eval/``."""
LOCK_NAME = ".lock"
"""The lock file of a run directory: an advisory ``flock`` held by the process that writes the run, and the
holder's pid, host and start time (JSON) for the message a second process gets."""
EVENTS_PREFIX = "events.out.tfevents."

RUN_ENTRIES = (CONFIG, SUMMARY, LINEAGE, CONFIG_HISTORY, TAMPER_SAMPLES, SEEDING, CHECKPOINTS, ADAPTERS, REPORT)
"""Names whose presence marks a directory as holding a run (besides TensorBoard event files)."""

MAX_JSON_DEPTH = 100
"""Deepest nesting of objects/lists read from a run directory's JSON files (this project writes at most about
ten levels); deeper is refused before anything recursive (the decoder, a comparison, a copy) can exhaust the
stack."""
MAX_STEP = (1 << 63) - 1
"""Largest step a run can have (the configuration's ``steps`` is a signed 64-bit integer)."""


class RunDirError(Exception):
    """A run directory that cannot be used; the message names it and says why."""


class RunFileError(RunDirError):
    """A file of a run directory that cannot be read: ``path`` is the file, ``reason`` what is wrong with it."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


class UnsafeRunFile(RunFileError):
    """A file this project never writes in that shape (JSON nested beyond :data:`MAX_JSON_DEPTH`, a symbolic
    link out of the run directory): every reader refuses it, even those that note a damaged file and go on."""


# ------------------------------------------------------------------------------------------------------ JSON


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 1), computed without recursion; stops counting once
    past ``limit``."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > limit:
            break
        if isinstance(v, dict):
            todo.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            todo.extend((x, d + 1) for x in v)
    return deepest


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        self.key = key
        super().__init__(key)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse_json(text: str, where: str | os.PathLike[str], max_depth: int = MAX_JSON_DEPTH,
               unique_keys: bool = False) -> Any:
    """Decode ``text`` (read from ``where``), nested at most ``max_depth`` levels.

    Raises:
        UnsafeRunFile: nested deeper than ``max_depth``.
        RunFileError: not JSON, or (``unique_keys``) an object holds a key twice (JSON keeps the last one
            silently: in a configuration that hides a setting).
    """
    try:
        value = json.loads(text, object_pairs_hook=_unique_pairs if unique_keys else None)
    except RecursionError:
        raise UnsafeRunFile(where, f"nests deeper than {max_depth} levels") from None
    except _DuplicateKey as exc:
        raise RunFileError(where, f"holds the key {exc.key!r} twice in one object") from None
    except ValueError as exc:
        raise RunFileError(where, f"is not valid JSON ({exc})") from None
    if json_depth(value, max_depth) > max_depth:
        raise UnsafeRunFile(where, f"nests deeper than {max_depth} levels")
    return value


def read_text(path: str | os.PathLike[str], max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file (at most ``max_bytes``); :class:`RunFileError` naming it otherwise.
    Opened with ``O_NONBLOCK``, so a FIFO planted at the name cannot stall the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RunFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(path, "is not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise RunFileError(path, f"is {st.st_size} bytes, more than the {max_bytes} such a file can be")
        try:
            data = f.read()
        except OSError as exc:
            raise RunFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunFileError(path, f"is not UTF-8 text ({exc})") from None


def read_json(path: str | os.PathLike[str], max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None,
              unique_keys: bool = False) -> Any:
    """A JSON file, read with :func:`read_text` and decoded with :func:`parse_json`."""
    return parse_json(read_text(path, max_bytes), path, max_depth, unique_keys)


# ------------------------------------------------------------------------------------------------- writing


def write_text_atomic(path: str | os.PathLike[str], data: str | bytes, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, created with ``O_CREAT |
    O_EXCL | O_NOFOLLOW`` under a random name (nothing planted in the folder is written through), then renamed
    over ``path`` (a link at ``path`` is replaced, its target untouched). ``sync``: fsync before the rename (a
    crash leaves the old file or the new one). The temporary file is removed on failure."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{secrets.token_hex(6)}")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: str | os.PathLike[str]) -> IO[str]:
    """``path`` opened to append UTF-8 text, created if missing; never through a symbolic link
    (``O_NOFOLLOW``: :class:`UnsafeRunFile` naming it). The descriptor is also readable (``os.pread``)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError:
        if os.path.islink(path):
            raise UnsafeRunFile(path, "is a symbolic link: refusing to write through it") from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def real_dir(path: str | os.PathLike[str], create: bool = True) -> Path:
    """``path`` as a real directory (created with its parents when ``create``; else it may be missing), never a
    symbolic link.

    Raises:
        UnsafeRunFile: ``path`` is a symbolic link (its target is left alone).
        RunFileError: ``path`` exists and is no directory.
    """
    path = Path(path)
    if path.is_symlink():
        raise UnsafeRunFile(path, "is a symbolic link: refusing to write through it (remove it)")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        return path
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):  # planted between the check and the mkdir
        raise UnsafeRunFile(path, "is a symbolic link: refusing to write through it (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise RunFileError(path, "is not a directory")
    return path


def _inside(path: Path, root: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


# ---------------------------------------------------------------------------------------------- the reader


@dataclass
class Lineage:
    """The records of ``lineage.jsonl`` a reader can use, and what it skipped.

    Attributes:
        records: the JSON objects with a valid ``step`` (an integer in ``0..steps``), in file order.
        torn: lines that are not a JSON object (a line cut short by a kill, a write in progress).
        bad_steps: objects skipped because their ``step`` is missing, not an integer, or out of range.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    torn: int = 0
    bad_steps: int = 0


class RunDir:
    """One run directory, read once: every file a run writes is read here, validated, and cached.

    A file that is missing is ``None`` (or empty); one that is damaged raises :class:`RunFileError` naming it
    (readers that go on without it catch that and note it); :class:`UnsafeRunFile` (JSON nested beyond
    :data:`MAX_JSON_DEPTH`, an entry that is a link out of the directory) is never worked around. Standard
    library only.

    Args:
        path: the run directory (a symbolic link to one is fine: entries are checked against its real path).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.notes: list[str] = []
        """What the readers skipped (torn lines, steps out of range), one sentence each naming the file (the
        caller prefixes the run's name)."""
        self._objects: dict[tuple[str, ...], dict[str, Any] | None] = {}

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    # -- entries ---------------------------------------------------------------------------------------

    def entry(self, *parts: str) -> Path:
        """The path of an entry (``run.entry("eval", "results.json")``), refused when it leads out of the run
        directory through a symbolic link (:class:`UnsafeRunFile`); it need not exist."""
        p = self.path.joinpath(*parts)
        if os.path.lexists(p) and not _inside(p, self.path):
            raise UnsafeRunFile(p, f"is a symbolic link out of the run directory {self.path}: not followed")
        return p

    def has(self, *parts: str) -> bool:
        """Whether the entry exists (a link out of the directory raises, see :meth:`entry`)."""
        return self.entry(*parts).exists()

    def entries(self) -> list[str]:
        """The entries that belong to a run (sorted as :data:`RUN_ENTRIES`, then the event files; empty if none
        or if the path is no directory)."""
        return run_entries(self.path)

    def event_files(self) -> list[Path]:
        """The TensorBoard event files directly in the run directory, sorted (each checked by :meth:`entry`)."""
        if not self.path.is_dir():
            return []
        names = sorted(n for n in os.listdir(self.path) if "tfevents" in n)
        return [p for p in (self.entry(n) for n in names) if p.is_file()]

    def subdir(self, name: str, create: bool = True) -> Path:
        """A folder of the run that a reader writes into (``report/``, ``eval/``): a real directory inside the
        run, created if needed (:func:`real_dir`)."""
        return real_dir(self.path / name, create)

    def _json(self, *parts: str) -> Any:
        """The JSON in an entry, ``None`` when it does not exist."""
        p = self.entry(*parts)
        if not p.exists() and not p.is_symlink():
            return None
        return read_json(p)

    # -- the files -------------------------------------------------------------------------------------

    def _object(self, *parts: str) -> dict[str, Any] | None:
        """The JSON object in an entry, read once (``None`` when it does not exist)."""
        if parts not in self._objects:
            value = self._json(*parts)
            if value is not None and not isinstance(value, dict):
                raise RunFileError(self.path.joinpath(*parts), f"holds a JSON {type(value).__name__}, not an object")
            self._objects[parts] = value
        return self._objects[parts]

    def config(self) -> dict[str, Any] | None:
        """``config.json`` (``None`` when the run has none): ``name``, ``arm``, ``model``, ``rank``, ``alpha``,
        ``mapping`` and ``config``, the resolved configuration."""
        return self._object(CONFIG)

    def train_config(self) -> dict[str, Any]:
        """``config.json``'s ``config`` object, the configuration the run trains with.

        Raises:
            RunFileError: there is no ``config.json`` or it holds no ``config`` object.
        """
        record = self.config()
        if record is None:
            raise RunFileError(self.path / CONFIG, f"not found (is {self.path} a run directory?)")
        if not isinstance(record.get("config"), dict):
            raise RunFileError(self.path / CONFIG, 'is not a run configuration (no "config" object)')
        return record["config"]

    def steps_total(self) -> int | None:
        """The steps the run is configured for (``config.json``), ``None`` when not recorded."""
        record = self.config() or {}
        steps = record.get("config", {}).get("steps") if isinstance(record.get("config"), dict) else None
        return steps if isinstance(steps, int) and not isinstance(steps, bool) else None

    def summary(self) -> dict[str, Any] | None:
        """``run_summary.json`` (``None`` until the run finished a session)."""
        return self._object(SUMMARY)

    def history(self) -> list[dict[str, Any]]:
        """``run_summary.json``'s per-step rows (objects only; empty without the file)."""
        rows = (self.summary() or {}).get("history")
        return [h for h in rows if isinstance(h, dict)] if isinstance(rows, list) else []

    def _lines(self, name: str, max_bytes: int | None = None) -> list[tuple[str, Any]]:
        """Every non-blank line of a JSON-lines entry with its decoded value (``None`` where it does not parse);
        empty when the file does not exist. A line nested too deep is :class:`UnsafeRunFile`; a file over
        ``max_bytes`` a :class:`RunFileError`."""
        p = self.entry(name)
        if not p.exists() and not p.is_symlink():
            return []
        out = []
        for i, ln in enumerate(read_text(p, max_bytes).splitlines(), 1):
            if not ln.strip():
                continue
            try:
                out.append((ln, parse_json(ln, f"{p}, line {i}")))
            except UnsafeRunFile:
                raise
            except RunFileError:
                out.append((ln, None))
        return out

    def lineage_lines(self) -> list[tuple[str, Any]]:
        """The raw lines of ``lineage.jsonl`` with their decoded values (for resume's truncation)."""
        return self._lines(LINEAGE)

    @functools.cached_property
    def _lineage(self) -> Lineage:
        bound = self.steps_total()
        bound = MAX_STEP if bound is None else bound
        out = Lineage()
        for _line, rec in self.lineage_lines():
            if not isinstance(rec, dict):
                out.torn += 1
            elif valid_step(rec.get("step"), bound):
                out.records.append(rec)
            else:
                out.bad_steps += 1
        if out.torn:
            self.notes.append(f"{out.torn} malformed line(s) in {LINEAGE} skipped (a write in progress?).")
        if out.bad_steps:
            self.notes.append(f"{out.bad_steps} record(s) of {LINEAGE} without an integer step in 0..{bound} "
                              "skipped.")
        return out

    def lineage(self) -> list[dict[str, Any]]:
        """The evolution records of ``lineage.jsonl`` (one per replacement) whose ``step`` is an integer in
        ``0..steps``; torn lines and other steps are skipped, each kind with a note (:attr:`notes`). Linear in
        the file's size."""
        return self._lineage.records

    def config_history(self) -> list[dict[str, Any]]:
        """The configuration changes resumes recorded (``config_history.jsonl``; ``[]`` if none); a line that is
        not an object with ``step`` and ``field`` is skipped."""
        return [rec for _ln, rec in self._lines(CONFIG_HISTORY)
                if isinstance(rec, dict) and "step" in rec and "field" in rec]

    def tamper_sample_lines(self) -> list[tuple[str, Any]]:
        """The raw lines of ``tamper_samples.jsonl`` with their decoded values (for resume's truncation); a file
        over :data:`MAX_TAMPER_BYTES` is a :class:`RunFileError`."""
        return self._lines(TAMPER_SAMPLES, MAX_TAMPER_BYTES)

    def tamper_samples(self) -> list[dict[str, Any]]:
        """The samples of ``tamper_samples.jsonl`` (``[]`` without it) that have the shape a run writes
        (:func:`tamper_sample_ok`, a step in ``0..steps``), in file order, read once; the other lines are skipped
        with a note (:attr:`notes`). The texts are returned as strings and never run."""
        return self._tamper_samples

    @functools.cached_property
    def _tamper_samples(self) -> list[dict[str, Any]]:
        bound = self.steps_total()
        bound = MAX_STEP if bound is None else bound
        lines = self.tamper_sample_lines()
        out = [rec for _ln, rec in lines if tamper_sample_ok(rec, bound)]
        if len(out) < len(lines):
            self.notes.append(f"{len(lines) - len(out)} line(s) of {TAMPER_SAMPLES} that are not a sample with a step "
                              f"in 0..{bound} skipped.")
        return out

    def checkpoints(self) -> list[tuple[int, Path]]:
        """The complete checkpoints as ``(step, path)``, oldest first (:func:`list_checkpoints`)."""
        return list_checkpoints(self.path)

    def adapters(self) -> dict[str, Path]:
        """Member -> PEFT directory of the final adapters (``adapters/<member>/`` holding ``adapter_config.json``),
        sorted by name; empty when the run has none. An adapter directory or file that is a link out of the run
        is :class:`UnsafeRunFile`."""
        root = self.entry(ADAPTERS)
        if not root.is_dir():
            return {}
        out = {}
        for name in sorted(os.listdir(root)):
            d = self.entry(ADAPTERS, name)
            if d.is_dir() and self.entry(ADAPTERS, name, ADAPTER_CONFIG).is_file():
                for f in os.listdir(d):
                    self.entry(ADAPTERS, name, f)
                out[name] = d
        return out

    def eval_results(self) -> dict[str, Any] | None:
        """``eval/results.json`` (``None`` without it)."""
        return self._object(EVAL, EVAL_RESULTS)


def step_dirs(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every ``checkpoints/step_<n>`` directory of a run (complete or not) as ``(n, path)``, oldest first; a
    symbolic link is none (never followed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR_RE.match(p.name)
        if m and not p.is_symlink() and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoints of a run marked complete (``DONE``) as ``(step, path)``, oldest first (not verified:
    :func:`selfplay.checkpoint.find_resumable` does that)."""
    return [(s, p) for s, p in step_dirs(run_dir) if (p / DONE).is_file()]


def valid_step(step: Any, bound: int = MAX_STEP) -> bool:
    """Whether ``step`` is an integer (not a bool) in ``0..bound``."""
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= bound


TAMPER_SAMPLE_FIELDS = {"step": int, "member": str, "agent": str, "role": str, "index": int, "task_type": str,
                        "task_id": str, "class": str, "text": str, "truncated": bool}
"""The fields of a line of ``tamper_samples.jsonl`` and their JSON types (:mod:`selfplay.tamper` writes them)."""
MAX_TAMPER_NAME = 256
"""Longest member, agent, role, task type, task id or class a reader accepts in a tamper sample."""


def tamper_sample_ok(rec: Any, bound: int = MAX_STEP) -> bool:
    """Whether ``rec`` is a tamper sample as a run writes it: an object with exactly
    :data:`TAMPER_SAMPLE_FIELDS`, each of its type (an integer is not a bool), the step in ``0..bound``, the index
    non-negative and every name at most :data:`MAX_TAMPER_NAME` characters."""
    if not isinstance(rec, dict) or rec.keys() != TAMPER_SAMPLE_FIELDS.keys():
        return False
    for key, kind in TAMPER_SAMPLE_FIELDS.items():
        v = rec[key]
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            return False
        if kind is str and key != "text" and len(v) > MAX_TAMPER_NAME:
            return False
    return valid_step(rec["step"], bound) and rec["index"] >= 0


def finite_number(x: Any) -> bool:
    """Whether ``x`` is an int or float (not a bool) and finite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


# ------------------------------------------------------------------------------------- checks before a run


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


def check_output_dir(path: str | os.PathLike[str], what: str, flag: str) -> None:
    """``path`` (a folder a reader writes into: ``report/``, ``eval/``) can be written: a probe file is created
    and removed in it, or, while it does not exist yet, in its nearest existing ancestor. Checked before any
    work, so a run directory on a read-only file system (or one the user may not write) is one line.

    Raises:
        RunDirError: ``cannot write WHAT in PATH: REASON; give FLAG DIR elsewhere``.
    """
    target = Path(path)
    where = target if target.is_dir() else _first_existing_ancestor(target)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=where)
    except OSError as exc:
        raise RunDirError(f"cannot write {what} in {target}: {exc.strerror or exc}; give {flag} DIR elsewhere") \
            from exc
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
        RunDirError: ``path`` is not a directory, already holds a run, holds anything else (it is not a run
            directory: only a new or empty one is), or cannot be created or written.
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
        other = sorted(n for n in os.listdir(path) if n != LOCK_NAME)
        if other:
            shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
            raise RunDirError(f"run directory {path} is not empty and holds no run ({shown}): a new run needs a "
                              "new or empty directory; choose another --run-dir")
        if os.path.islink(path / LOCK_NAME):
            raise RunDirError(f"{path / LOCK_NAME} is a symbolic link: refusing to write through it (remove it)")
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


WRITTEN_ON_RESUME = (CONFIG, SUMMARY, LINEAGE, CONFIG_HISTORY, TAMPER_SAMPLES, SEEDING, CHECKPOINTS, ADAPTERS, REPORT,
                     LOCK_NAME)
"""The entries a resumed run writes, removes or renames: none of them may be a symbolic link."""


def check_resume_dir(path: Path) -> Path:
    """Check that ``path`` is a writable run directory to continue; returns it.

    Raises:
        RunDirError: it does not exist, is no directory, has no ``config.json``, cannot be written, or one of
            the entries a run writes (:data:`WRITTEN_ON_RESUME`) is a symbolic link (resume would write, rename
            or delete through it, e.g. the ``.tmp_*`` leftovers of a linked ``checkpoints/``).
    """
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"--resume: {path} is not a directory")
    _check_not_in_use(path)
    links = [n for n in WRITTEN_ON_RESUME if os.path.islink(path / n)]
    if links:
        raise RunDirError(f"--resume: {path / links[0]} is a symbolic link: a run directory holds none, and resume "
                          "would write through it; remove it (or copy what it points to into the run)")
    if not (path / CONFIG).is_file():
        raise RunDirError(f"--resume: {path / CONFIG} not found (is {path} a run directory?)")
    check_writable(path)
    return path


# ------------------------------------------------------------------------------------------------- the lock

_held: dict[str, tuple[int, int]] = {}  # realpath -> (fd, depth): this process's locks (re-entrant)


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
        return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} "
                f"(since {info.get('since', '?')}, {info.get('command', '?')})")
    except (OSError, ValueError, AttributeError, RecursionError):
        return "another process (its pid/host record is not readable)"


def _open_lock(path: Path, flags: int) -> int:
    """The lock file's descriptor: never through a symbolic link, never a FIFO or device (``O_NONBLOCK``, then a
    regular-file check)."""
    fd = os.open(path / LOCK_NAME, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirError(f"{path / LOCK_NAME} is not a regular file: remove it")
    return fd


def lock_holder(path: Path) -> str | None:
    """Who holds the lock of run directory ``path`` (pid, host, since when), or ``None`` if nobody (this
    process's own lock counts as nobody). Takes nothing: a shared ``flock`` is tried and released at once."""
    path = Path(path)
    if os.path.realpath(path) in _held:
        return None
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except (OSError, RunDirError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
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
    exist; a ``.lock`` that is a symbolic link is refused, its target untouched.

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
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if os.path.islink(path / LOCK_NAME):
            raise RunDirError(f"{path / LOCK_NAME} is a symbolic link: refusing to write through it (remove it)"
                              ) from None
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
