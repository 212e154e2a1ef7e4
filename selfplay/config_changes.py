"""Resume = the run's own configuration: what may differ from ``config.json`` when a run is continued, and the
record of what did.

``populora train --resume R`` starts from ``R/config.json``. Every field of the configuration the command line
resolves is compared with it (:func:`config_diff`, dotted names such as ``trainer.lr``):

- fields that say where and how the run shows itself, not what it computes (:data:`UNRECORDED`: ``resume``,
  ``run_dir``, ``name``, ``progress``, ``pipeline.layout``) may differ freely;
- ``steps`` may be raised or lowered without ``--override`` (continuing a run for longer is what resume is
  for) and the change is recorded;
- structural fields (:data:`STRUCTURAL`: the model, its dtype, the LoRA rank, alpha and target modules, the
  number of teachers and students) never change: the checkpoint's adapters, optimizer states and ratings are
  shaped by them;
- any other difference (a seed, a learning rate, a reward scheme, another preset) is refused unless the user
  names the field with ``--override FIELD`` (or a section, e.g. ``--override trainer``).

An accepted change is appended to ``R/config_history.jsonl`` as ``{"step", "field", "old", "new", "time"}``
(``step``: the checkpoint the run continues from, i.e. the first step trained with the new value is ``step +
1``), logged, and written into ``config.json``, whose ``config`` is always the configuration the run trains
with now. A run is then reproduced from its directory by replaying the history; ``populora report`` marks each
change at its step. Everything here is standard library and the config module only, so the refusal happens
before the learning stack is imported or a model loads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfplay.config import ConfigError, TrainConfig, from_dict, to_dict
from selfplay.rundir import CONFIG, CONFIG_HISTORY, RunDir, RunDirError, open_append

__all__ = ["HISTORY_NAME", "STRUCTURAL", "UNRECORDED", "FREE", "RETIRED", "ResumePlan", "SavedRun", "check_changes",
           "config_diff", "drop_retired", "normalize_override", "plan_resume", "read_history", "read_saved_run",
           "record_changes"]

HISTORY_NAME = CONFIG_HISTORY

STRUCTURAL = ("model", "dtype", "rank", "alpha", "target_modules", "env.num_teachers", "env.num_students")
"""Fields a resumed run can never change."""
UNRECORDED = ("resume", "run_dir", "name", "progress", "pipeline.layout")
"""Fields that do not change what a run computes: they may differ on resume and are not recorded (where an
asynchronous run's generator runs gives the same run: tests/selfplay/test_pipeline.py)."""
FREE = ("steps",)
"""Fields that may differ on resume without ``--override``; the change is recorded."""

RETIRED = {
    "env.max_completion_chars": "it only set the declared max_length of the env's action space; completions of "
                                "any length were and are processed",
}
"""Settings removed from the configuration, with why: a ``config.json`` written before their removal still
carries them (see :func:`drop_retired`)."""

_MISSING = object()


def drop_retired(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A run's saved configuration (``config.json["config"]``) without the :data:`RETIRED` settings, so that a
    run written before their removal still resumes (none of them changed what a run computes). A preset is not
    passed through this: one that names a retired setting is refused as an unknown field."""
    out = dict(saved)
    for name in RETIRED:
        section, _, field = name.rpartition(".")
        if isinstance(out.get(section), Mapping) and field in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != field}
    return out


@functools.cache
def _sections(cls: type = TrainConfig, prefix: str = "") -> frozenset[str]:
    """Dotted names of the nested config sections (fields whose type is a dataclass), from the annotations."""
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.add(prefix + f.name)
            out |= _sections(hints[f.name], prefix + f.name + ".")
    return frozenset(out)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = prefix + k
        if isinstance(v, Mapping) and name in _sections():
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, old value, new value)`` for every dotted field whose JSON value differs (sorted by field);
    dict-valued settings (``env.reward_kwargs``, ``pbt.operators``, ...) compare as one value."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name, _MISSING), b.get(name, _MISSING)
        if va != vb or type(va) is not type(vb):
            out.append((name, None if va is _MISSING else va, None if vb is _MISSING else vb))
    return out


def normalize_override(name: str) -> str:
    """``--trainer.max-grad-norm`` / ``trainer.max_grad_norm`` -> ``trainer.max_grad_norm``."""
    return name.strip().removeprefix("--").replace("-", "_")


def _covered(name: str, overrides: Iterable[str]) -> bool:
    return any(name == o or name.startswith(o + ".") for o in overrides)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _show(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def check_changes(old: Mapping[str, Any], new: Mapping[str, Any], overrides: Sequence[str] = (),
                  known: Iterable[str] = ()) -> list[tuple[str, Any, Any]]:
    """The changes a resume may make, or :class:`ConfigError` listing every one it may not.

    Args:
        old: the run's saved configuration (``config.json["config"]``).
        new: the configuration the command line resolved.
        overrides: fields (or sections) named with ``--override``.
        known: every dotted field name of the configuration (an override naming none of them is an error).

    Returns:
        the ``(field, old, new)`` changes to record (``UNRECORDED`` fields left out).
    """
    overrides = [normalize_override(o) for o in overrides]
    names = set(known) | set(_flatten(old)) | set(_flatten(new))
    for o in overrides:
        if not any(n == o or n.startswith(o + ".") for n in names):
            raise ConfigError("override", f"{o!r} is not a configuration field")
    diff = [d for d in config_diff(old, new) if not _covered(d[0], UNRECORDED)]
    structural = [d for d in diff if _covered(d[0], STRUCTURAL)]
    if structural:
        listing = "; ".join(f"{_flag(n)} {_show(a)} -> {_show(b)}" for n, a, b in structural)
        raise ConfigError("resume", f"cannot change what the checkpoint is shaped by ({listing}); these never "
                                    "change on resume: start a new run instead")
    refused = [d for d in diff if not _covered(d[0], FREE) and not _covered(d[0], overrides)]
    if refused:
        listing = "; ".join(f"{_flag(n)} {_show(a)} -> {_show(b)}" for n, a, b in refused)
        names_ = " ".join(n for n, _, _ in refused)
        raise ConfigError("resume", f"differs from the run's {CONFIG}: {listing}. A resumed run keeps its own "
                                    f"configuration; to change it and record the change, add --override {names_}")
    return diff


def record_changes(run_dir: Path, step: int, changes: Sequence[tuple[str, Any, Any]]) -> list[dict]:
    """Append one line per change to ``run_dir/config_history.jsonl`` (flushed and fsynced); returns the lines."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    lines = [{"step": int(step), "field": n, "old": a, "new": b, "time": when} for n, a, b in changes]
    if not lines:
        return lines
    with open_append(Path(run_dir) / HISTORY_NAME) as f:
        for line in lines:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return lines


def read_history(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The recorded changes of a run (:meth:`selfplay.rundir.RunDir.config_history`)."""
    return RunDir(run_dir).config_history()


# -------------------------------------------------------------------------------------- the run resumed


@dataclass(frozen=True)
class SavedRun:
    """A run to continue, read once: its reader, its ``config.json`` and the configuration it holds as this
    version reads it (a field added since the run was written is its default; a :data:`RETIRED` one dropped).

    Attributes:
        run: the run directory's reader.
        record: ``config.json``.
        config: ``config.json["config"]`` through the dataclasses.
    """

    run: RunDir
    record: dict[str, Any]
    config: TrainConfig

    @property
    def assignment(self) -> dict[str, str] | None:
        """The run's agent -> adapter assignment (``mapping.agent_to_member``), ``None`` when not saved."""
        mapping = self.record.get("mapping")
        members = mapping.get("agent_to_member") if isinstance(mapping, dict) else None
        return dict(members) if isinstance(members, dict) else None


def read_saved_run(path: str | os.PathLike[str]) -> SavedRun:
    """Read the run ``path`` continues (``--resume``) once, before anything else is decided.

    Raises:
        RunDirError: no ``config.json``, or one that cannot be read (damaged, nested too deep, a link out of the
            run, no ``config`` object); the message names it.
        ConfigError: a saved setting this version refuses (field ``resume``; the reason names the file).
    """
    run = RunDir(path)
    if run.config() is None:
        raise RunDirError(f"{run.entry(CONFIG)} not found (is {run.path} a run directory?)")
    saved = run.train_config()
    try:
        config = from_dict(TrainConfig, drop_retired(saved))
    except ConfigError as e:
        raise ConfigError("resume", f"{run.entry(CONFIG)}: {e.field}: {e.reason}") from None
    return SavedRun(run, dict(run.config() or {}), config)


@dataclass(frozen=True)
class ResumePlan:
    """What a resume continues and what it changes, decided once (the command line makes it before a dry run,
    :func:`selfplay.resume.resume_point` uses it): the saved run and the accepted ``(field, old, new)``
    changes."""

    saved: SavedRun
    changes: list[tuple[str, Any, Any]]


def plan_resume(cfg: TrainConfig, overrides: Sequence[str] = (), saved: SavedRun | None = None) -> ResumePlan:
    """Compare ``cfg`` with the run it resumes (``cfg.resume``, read here unless ``saved`` is given).

    Raises:
        RunDirError: see :func:`read_saved_run`.
        ConfigError: a difference that may not be made (:func:`check_changes`).
    """
    if saved is None:
        saved = read_saved_run(cfg.resume)
    return ResumePlan(saved, check_changes(to_dict(saved.config), to_dict(cfg), overrides))
