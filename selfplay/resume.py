"""Starting or continuing a run, and what a checkpoint of it holds.

:func:`resume_point` is the one entry: the ``populora`` command and :func:`selfplay.run.train` call it once per
run. It decides between a new run and a resumed one and makes every check on the run directory before the model
loads:

* **new run** (``cfg.resume`` unset): the directory (``cfg.run_dir``, else ``runs/<name>``) must be new or empty
  (:func:`selfplay.rundir.prepare_new_run_dir`); it is created;
* **resume** (``cfg.resume = R``): ``R`` must be a writable run directory with no link where a run writes
  (:func:`selfplay.rundir.check_resume_dir`); the configuration may differ from ``R/config.json`` only as
  :mod:`selfplay.config_changes` allows (the file is read and compared once, by
  :func:`~selfplay.config_changes.plan_resume`: the command line makes that plan before a dry run and hands it
  over); the leftovers of an interrupted checkpoint write are removed; the newest intact checkpoint is chosen
  (:func:`selfplay.checkpoint.find_resumable`, its contents checked by :func:`check_checkpoint`: ``loop_state.json``
  value by value, every tensor file through a loader that runs no code; none intact:
  :class:`~selfplay.checkpoint.NoIntactCheckpoint`); accepted config
  changes are recorded at its step; the damaged newer checkpoints are moved to ``checkpoints/damaged/``; the
  lineage lines and tamper samples written after it are dropped (a run killed before its first checkpoint
  restarts from step 0 and drops them all).

It holds the directory's lock (:func:`selfplay.rundir.run_lock`) until the ``with`` block ends.

A checkpoint (written atomically by :func:`selfplay.checkpoint.write_checkpoint`) holds everything needed to
continue exactly: the population's adapters and optimizer states, the env's state (ratings, buffers, RNG), the
PBT controller's state, and ``loop_state.json`` (the step, the run's :class:`Progress` and the Python, NumPy and
torch RNG states, all JSON). Sampling seeds are derived from (seed, step, phase, agent, index), so a resumed run
repeats the uninterrupted one value for value.

Nothing in a checkpoint is unpickled but the optimizer states (``torch.load(weights_only=True)``, explicitly, so
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn the restricted loader off) and, in a checkpoint written before the
torch RNG state moved into ``loop_state.json``, ``torch_rng.pt`` (the same way). Whatever a damaged or foreign
file makes a loader raise is a :class:`~selfplay.checkpoint.CheckpointError` naming the file.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from selfplay.checkpoint import (
    CheckpointError,
    Resumable,
    cleanup_partial,
    find_resumable,
    set_aside,
    write_checkpoint,
    write_json,
)
from selfplay.config import TrainConfig, to_dict
from selfplay.config_changes import HISTORY_NAME, ResumePlan, plan_resume, record_changes
from selfplay.rundir import (
    CONFIG,
    LINEAGE,
    TAMPER_SAMPLES,
    RunDir,
    RunFileError,
    check_resume_dir,
    finite_number,
    prepare_new_run_dir,
    read_json,
    run_lock,
    valid_step,
    write_text_atomic,
)

if TYPE_CHECKING:
    from selfplay.loop import SelfPlayLoop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: its directory and, when it continues, the checkpoint it continues from.

    Attributes:
        run_dir: the run directory (locked while the :func:`resume_point` block runs).
        resuming: the run continues an earlier one (``cfg.resume``); its ``config.json`` is there.
        checkpoint: the intact checkpoint to load (``None``: start from step 0).
    """

    run_dir: Path
    resuming: bool = False
    checkpoint: Resumable | None = None


@dataclass
class Progress:
    """The run's own counters, carried in every checkpoint: summed seconds per phase (``time/<phase>``) and one
    history row per step (``run_summary.json``)."""

    totals: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    history: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def resume_point(cfg: TrainConfig, overrides: Sequence[str] = (), command: str = "train",
                 plan: ResumePlan | None = None) -> Iterator[ResumePoint]:
    """Decide between a new run and a resumed one, check and prepare the run directory (see the module
    docstring), and hold its lock while the block runs.

    Args:
        cfg: the validated run configuration (``cfg.resume``: the run to continue).
        overrides: with ``cfg.resume``, the fields allowed to differ from the run's ``config.json``.
        command: what holds the lock (named to a second process that tries).
        plan: with ``cfg.resume``, the comparison the caller already made (:func:`plan_resume`: the command line
            makes it before a dry run); ``None``: made here. Either way ``config.json`` is read once.

    Raises:
        RunDirError: the directory cannot be used (holds a run already, is no run, is locked, is unwritable,
            holds a link where a run writes).
        ConfigError: a resumed run's configuration differs in a field that may not change.
        NoIntactCheckpoint: the resumed run has checkpoints, but none is intact.
    """
    if cfg.resume is None:
        run_dir = prepare_new_run_dir(default_run_dir(cfg))
        with run_lock(run_dir, command):
            yield ResumePoint(run_dir)
        return
    run_dir = check_resume_dir(Path(cfg.resume))
    with run_lock(run_dir, command):
        yield _continue(cfg, run_dir, plan if plan is not None else plan_resume(cfg, overrides))


def default_run_dir(cfg: TrainConfig) -> Path:
    """``cfg.run_dir``, else ``runs/<cfg.name>`` (the caller names the run)."""
    if cfg.run_dir is not None:
        return Path(cfg.run_dir)
    return Path("runs") / (cfg.name or f"{Path(cfg.preset).stem}-s{cfg.seed}")


def _continue(cfg: TrainConfig, run_dir: Path, plan: ResumePlan) -> ResumePoint:
    """The checks and clean-up of a resumed run, before its model loads."""
    cleanup_partial(run_dir)
    chosen = find_resumable(run_dir, check=lambda d: check_checkpoint(d, cfg))  # before the model loads
    step = chosen.step if chosen is not None else 0
    if plan.changes:  # recorded at the step the run continues from, before any step trains with them
        for line in record_changes(run_dir, step, plan.changes):
            log.warning("resume: %s changed from %s to %s after step %d (recorded in %s)", line["field"],
                        json.dumps(line["old"]), json.dumps(line["new"]), line["step"], HISTORY_NAME)
        write_json(run_dir / CONFIG, {**plan.saved.record, "config": to_dict(cfg)})
    if chosen is None:
        log.warning("no checkpoint in %s: starting from step 0", run_dir)
    else:
        set_aside(run_dir, [e.checkpoint for e in chosen.skipped])
    truncate_lineage(plan.saved.run, step)
    truncate_tamper_samples(plan.saved.run, step)
    return ResumePoint(run_dir, resuming=True, checkpoint=chosen)


def _truncate_lines(run: RunDir, name: str, lines: list[tuple[str, Any]], step: int, what: str) -> None:
    """Rewrite the JSON-lines entry ``name`` (its ``lines``, raw and decoded) without the lines of a step after
    ``step`` or without a step (a line cut short by a kill included: it was being written after the checkpoint);
    not rewritten when there is none."""
    keep = [ln for ln, rec in lines if valid_step(rec.get("step") if isinstance(rec, dict) else None, step)]
    if len(keep) < len(lines):
        log.info("%s: dropped %d line(s) written after checkpoint step %d", what, len(lines) - len(keep), step)
        write_text_atomic(run.entry(name), "".join(ln + "\n" for ln in keep))


def truncate_lineage(run: RunDir | Path, step: int) -> None:
    """Drop the lineage lines written after checkpoint ``step`` by a run that was killed later."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    _truncate_lines(run, LINEAGE, run.lineage_lines(), step, "lineage")


def truncate_tamper_samples(run: RunDir | Path, step: int) -> None:
    """Drop the tamper samples written after checkpoint ``step`` (:mod:`selfplay.tamper`): the resumed run writes
    those steps' samples again."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    _truncate_lines(run, TAMPER_SAMPLES, run.tamper_sample_lines(), step, "tamper samples")


# ------------------------------------------------------------------------------------ the checkpoint's state

LOOP_STATE = "loop_state.json"
TORCH_RNG_LEGACY = "torch_rng.pt"
"""Where checkpoints written before the torch RNG state moved into ``loop_state.json`` kept it (a pickle, read
only with ``torch.load(weights_only=True)``, whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says)."""
MAX_RNG_REPR = 1 << 16
"""Longest ``python_rng`` read (``repr(random.getstate())`` is about 7,000 characters)."""


def save_checkpoint(loop: SelfPlayLoop, progress: Progress, keep: int) -> Path:
    """Write checkpoint ``loop.step`` of ``loop.run_dir`` atomically, pruned to the newest ``keep``."""

    def write(d: Path) -> None:
        loop.population.save_all(d / "population")
        write_json(d / "env_state.json", loop.env_state())
        loop.save_extra(d)
        if loop.pbt is not None:
            write_json(d / "pbt_state.json", loop.pbt.state_dict())
        write_json(d / LOOP_STATE, {
            "step": loop.step, "totals": dict(progress.totals), "history": progress.history,
            "python_rng": repr(random.getstate()),
            "numpy_rng": _np_state_to_json(np.random.get_state()),
            "torch_rng": torch.get_rng_state().numpy().tobytes().hex(),
        })

    return write_checkpoint(loop.run_dir, loop.step, write, keep=keep)


@dataclass(frozen=True)
class LoopState:
    """``loop_state.json``, checked: the step, the run's progress and the three RNG states, each as its
    ``setstate`` takes it."""

    step: int
    totals: dict[str, float]
    history: list[dict[str, Any]]
    python_rng: tuple
    numpy_rng: tuple
    torch_rng: torch.Tensor


def read_loop_state(d: Path) -> LoopState:
    """``d/loop_state.json`` (and, in a checkpoint written before the torch RNG state moved into it,
    ``d/torch_rng.pt``), every value checked: the step is the checkpoint's, the totals are numbers, the history
    a list of objects, and each RNG state is accepted by a scratch generator of its kind. Nothing is unpickled
    except the legacy ``torch_rng.pt``, with ``weights_only=True``.

    Raises:
        CheckpointError: naming the file and, for ``loop_state.json``, the field.
    """
    path = Path(d) / LOOP_STATE
    try:
        st = read_json(path)
    except RunFileError as exc:
        raise CheckpointError(path, exc.reason) from None
    if not isinstance(st, dict):
        raise CheckpointError(path, f"holds a JSON {type(st).__name__}, not an object")

    def bad(name: str, why: str) -> CheckpointError:
        return CheckpointError(path, f"field {name!r}: {why}")

    step = int(Path(d).name.rpartition("_")[2]) if Path(d).name.rpartition("_")[2].isdigit() else None
    if not valid_step(st.get("step")) or st["step"] != step:
        raise bad("step", f"holds {st.get('step')!r}, expected {step}")
    totals = st.get("totals", {})
    if not isinstance(totals, dict) or not all(isinstance(k, str) and finite_number(v) for k, v in totals.items()):
        raise bad("totals", "not an object of finite numbers")
    history = st.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise bad("history", "not a list of objects")
    return LoopState(step, dict(totals), list(history), _python_rng(st.get("python_rng"), bad),
                     _numpy_rng(st.get("numpy_rng"), bad), _torch_rng(st.get("torch_rng"), Path(d), bad))


def check_checkpoint(d: Path, cfg: TrainConfig | None = None) -> None:
    """The contents of an intact checkpoint (:func:`~selfplay.checkpoint.find_resumable`'s ``check``), before the
    model loads, so that whatever damage a reader would find makes resume fall back to an older checkpoint:
    ``loop_state.json`` value by value (:func:`read_loop_state`), the member names of
    ``population/population.json`` (folders beside it, so no member is read from elsewhere), an asynchronous run's
    ``pipeline_state.json`` value by value, the adapter versions it names held
    (:func:`selfplay.pipeline.read_pipeline_state`), ``pbt_state.json`` value by value, every ``.pt`` file through
    ``torch.load(weights_only=True)`` (a pickle that names anything but tensors and plain containers is refused,
    and never runs) and every ``.safetensors`` header; with the run's ``cfg``, also what only the run's settings
    tell: ``env_state.json`` restored into a scratch env of ``cfg.env`` (the env's own checks, no sandbox
    started), and the population's rank and target modules, each member's adapter rank and optimizer size.

    Raises:
        CheckpointError: naming the file (and, in ``loop_state.json``, the field).
    """
    step = read_loop_state(d).step
    names = _member_names(Path(d) / "population" / "population.json")
    from selfplay.pipeline import PIPELINE_STATE, read_pipeline_state  # an asynchronous run's record

    if (Path(d) / PIPELINE_STATE).is_file():
        read_pipeline_state(Path(d) / PIPELINE_STATE, names, step)
    _check_pbt_state(Path(d) / "pbt_state.json", names, step)
    tensors = _tensor_files(Path(d))
    if cfg is not None:
        _check_env_state(Path(d) / "env_state.json", cfg)
        _check_members(Path(d) / "population", names, cfg, tensors)


def _member_names(members: Path) -> list[str]:
    """The ``names`` of ``population/population.json``: member folders beside it."""
    try:
        meta = read_json(members) if members.is_file() else {"names": []}
    except RunFileError as exc:
        raise CheckpointError(members, exc.reason) from None
    names = meta.get("names") if isinstance(meta, dict) else None

    def member_dir(n: Any) -> bool:
        p = members.parent / n if isinstance(n, str) and n not in ("", ".", "..") and Path(n).name == n else None
        return p is not None and not p.is_symlink() and p.is_dir()

    if not isinstance(names, list) or not all(member_dir(n) for n in names) or len(set(names)) != len(names):
        raise CheckpointError(members, "'names' is not a list of the member folders beside it")
    return list(names)


def _tensor_files(d: Path) -> dict[Path, Any]:
    """Every ``.pt`` file loaded with ``weights_only=True`` and every ``.safetensors`` header read: path ->
    the loaded object (``.pt``) or ``{key: shape}`` (``.safetensors``)."""
    from safetensors import safe_open

    out: dict[Path, Any] = {}
    for p in sorted(d.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        try:
            if p.suffix == ".pt":
                out[p] = torch.load(p, map_location="cpu", weights_only=True)
            elif p.suffix == ".safetensors":
                with safe_open(str(p), framework="pt") as f:
                    out[p] = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as exc:  # noqa: BLE001 - whatever a foreign file makes the loader raise, e.g. a refused pickle
            raise CheckpointError(p, f"not a tensor file this project writes ({_brief(exc)})") from None
    return out


def _check_pbt_state(path: Path, names: list[str], step: int) -> None:
    """``pbt_state.json`` (when the run evolves) as :meth:`evolution.pbt.PBTController.load_state_dict` reads
    it: version 1 or 2, ``protected`` role -> the run's members, ``history`` member -> ``[step, win rate,
    reward]`` rows (a step up to the checkpoint's, finite numbers or null), ``lr_scale`` member -> a finite
    positive number, counts, ``last_step`` a step up to the checkpoint's."""
    if not path.is_file():
        return
    try:
        st = read_json(path)
    except RunFileError as exc:
        raise CheckpointError(path, exc.reason) from None
    if not isinstance(st, dict) or st.get("version") not in (1, 2):
        raise CheckpointError(path, "is not a PBT controller state of version 1 or 2")

    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(path, f"field {field!r}: {why}")

    protected = st.get("protected")
    if not isinstance(protected, dict) or not all(
            isinstance(v, list) and all(isinstance(n, str) and n in names for n in v) for v in protected.values()):
        raise bad("protected", f"not an object of lists of the run's members {names}")

    def row_ok(row: Any) -> bool:
        return (isinstance(row, list) and len(row) == 3 and valid_step(row[0], step)
                and all(v is None or finite_number(v) for v in row[1:]))

    history = st.get("history", {})
    if not isinstance(history, dict) or not all(isinstance(v, list) and all(map(row_ok, v)) for v in history.values()):
        raise bad("history", f"not an object of [step in 0..{step}, win rate, reward] rows per member")
    scales = st.get("lr_scale", {})
    if not isinstance(scales, dict) or not all(finite_number(v) and v > 0 for v in scales.values()):
        raise bad("lr_scale", "not an object of finite positive numbers")
    for key in ("n_events", "n_replacements"):
        if not valid_step(st.get(key)):
            raise bad(key, f"not a count, got {st.get(key)!r}")
    last = st.get("last_step")
    if last is not None and not (valid_step(last) and last <= step):
        raise bad("last_step", f"not a step in 0..{step}, got {last!r}")


def _check_env_state(path: Path, cfg: TrainConfig) -> None:
    """``env_state.json`` restored into a scratch env of ``cfg.env`` (its sandbox is started on first use only:
    never here); whatever the env's own :meth:`load_state_dict` refuses names the file."""
    from populora_env import parallel_env

    try:
        state = read_json(path)
    except RunFileError as exc:
        raise CheckpointError(path, exc.reason) from None
    env = parallel_env(cfg.env, seed=cfg.seed)
    try:
        env.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - the env's refusal of a state it cannot use, whatever its type
        raise CheckpointError(path, f"cannot be restored ({_brief(exc)})") from None
    finally:
        env.close()


def _check_members(population: Path, names: list[str], cfg: TrainConfig, tensors: dict[Path, Any]) -> None:
    """``population.json``'s rank and target modules are the run's, each member's ``lora_A`` weights
    (``rank × d_in``) have that rank, and its optimizer state covers as many tensors as its adapter holds."""
    meta_file = population / "population.json"
    meta = read_json(meta_file)
    targets = meta.get("target_modules")
    if meta.get("rank") != cfg.rank or not isinstance(targets, list) or not all(isinstance(t, str) for t in targets) \
            or set(targets) != set(cfg.target_modules):
        raise CheckpointError(meta_file, f"rank {meta.get('rank')!r} / targets {meta.get('target_modules')!r} are "
                                         f"not the run's ({cfg.rank} / {list(cfg.target_modules)})")
    for name in names:
        weights = tensors.get(population / name / "adapter_model.safetensors")
        if weights is None:
            raise CheckpointError(population / name, "holds no adapter_model.safetensors")
        bad = [k for k, shape in weights.items() if k.endswith("lora_A.weight") and shape[:1] != (cfg.rank,)]
        if bad:
            raise CheckpointError(population / name / "adapter_model.safetensors",
                                  f"{bad[0]} is not of rank {cfg.rank}")
        opt = tensors.get(population / name / "optimizer.pt")
        if opt is None:
            continue
        try:
            held = sum(len(g["params"]) for g in opt["param_groups"])
        except (TypeError, KeyError) as exc:
            raise CheckpointError(population / name / "optimizer.pt", f"not an optimizer state ({_brief(exc)})") \
                from None
        if held != len(weights):
            raise CheckpointError(population / name / "optimizer.pt",
                                  f"holds the state of {held} tensors, the adapter {len(weights)}")


def _python_rng(value: Any, bad: Callable[[str, str], CheckpointError]) -> tuple:
    if not isinstance(value, str) or len(value) > MAX_RNG_REPR:
        raise bad("python_rng", f"not the repr of a random.getstate() (a string of at most {MAX_RNG_REPR} "
                                "characters)")
    try:  # our own repr of random.getstate(): a tuple of ints; literal_eval evaluates literals only
        state = ast.literal_eval(value)
        random.Random().setstate(state)  # an empty tuple: IndexError
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError, IndexError,
            KeyError) as exc:
        raise bad("python_rng", f"not a random.getstate() ({_brief(exc)})") from None
    return state


def _numpy_rng(value: Any, bad: Callable[[str, str], CheckpointError]) -> tuple:
    try:
        state = _np_state_from_json(value)
        np.random.RandomState().set_state(state)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise bad("numpy_rng", f"not a NumPy MT19937 state ({_brief(exc)})") from None
    return state


def _torch_rng(value: Any, d: Path, bad: Callable[[str, str], CheckpointError]) -> torch.Tensor:
    legacy = value is None and (d / TORCH_RNG_LEGACY).is_file()
    if not legacy and not isinstance(value, str):
        raise bad("torch_rng", f"missing or not a hex string (and no {TORCH_RNG_LEGACY})")
    try:
        state = _legacy_torch_rng(d / TORCH_RNG_LEGACY) if legacy else torch.frombuffer(
            bytearray(bytes.fromhex(value)), dtype=torch.uint8)
        torch.Generator().set_state(state)
    except (ValueError, RuntimeError, TypeError) as exc:
        why = f"not a torch CPU generator state ({_brief(exc)})"
        raise (CheckpointError(d / TORCH_RNG_LEGACY, why) if legacy else bad("torch_rng", why)) from None
    return state


def _legacy_torch_rng(path: Path) -> torch.Tensor:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        state = saved["torch_rng"]
    except Exception as exc:  # noqa: BLE001 - whatever a foreign file makes the restricted unpickler raise
        raise CheckpointError(path, f"not a torch RNG state saved by this project ({_brief(exc)})") from None
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise CheckpointError(path, "holds no uint8 tensor under 'torch_rng'")
    return state


def _brief(exc: BaseException) -> str:
    """An exception in one line: its type and message, whitespace collapsed; for torch's refusal of a pickle, the
    restricted unpickler's own reason instead of its advice to load the file unrestricted."""
    text = " ".join(str(exc).split())
    marker = "WeightsUnpickler error:"
    if marker in text:
        reason = text.split(marker, 1)[1].split(" Check the documentation", 1)[0].strip()
        text = f"refused by torch's weights-only loader: {reason}"
    return f"{type(exc).__name__}: {text}"


def _restore(path: Path, restore: Callable[[], Any]) -> Any:
    """``restore()``, with whatever a foreign or damaged file makes it raise reported as a
    :class:`CheckpointError` naming ``path`` (the original exception is the ``__cause__``)."""
    try:
        return restore()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a loader's error on content it cannot use, e.g. a refused pickle
        raise CheckpointError(path, f"cannot be restored ({_brief(exc)})") from exc


def load_checkpoint(point: ResumePoint, loop: SelfPlayLoop) -> Progress:
    """Restore ``loop`` (set up, at step 0) from ``point``'s checkpoint and return the run's progress there;
    without a checkpoint the loop stays at step 0 and the progress is empty.

    Raises:
        CheckpointError: the checkpoint does not fit this run (naming the file).
    """
    chosen = point.checkpoint
    if chosen is None:
        return Progress()
    d = chosen.path
    st = read_loop_state(d)
    _restore(d / "population", lambda: loop.population.load_all(d / "population"))
    _restore(d / "env_state.json", lambda: loop.env.load_state_dict(read_json(d / "env_state.json")))
    if loop.pbt is not None and (d / "pbt_state.json").is_file():
        _restore(d / "pbt_state.json", lambda: loop.pbt.load_state_dict(read_json(d / "pbt_state.json")))
    _restore(d, lambda: loop.load_extra(d))
    progress = Progress(defaultdict(float, st.totals), st.history)
    random.setstate(st.python_rng)
    np.random.set_state(st.numpy_rng)
    torch.set_rng_state(st.torch_rng)
    loop.continue_after(chosen.step)
    skipped = "".join(f"; skipped damaged {e.checkpoint.name} ({e})" for e in chosen.skipped)
    log.info("resumed %s from checkpoint step %d%s", point.run_dir, chosen.step, skipped)
    return progress


def _np_state_to_json(state: tuple) -> list:
    name, keys, pos, has_gauss, cached = state
    return [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _np_state_from_json(s: list) -> tuple:
    if not isinstance(s, list) or len(s) != 5 or not isinstance(s[1], list) or len(s[1]) != 624:
        raise ValueError("expected [name, 624 keys, pos, has_gauss, cached_gaussian]")
    return (s[0], np.array(s[1], dtype=np.uint32), s[2], s[3], s[4])


__all__ = ["LoopState", "Progress", "ResumePoint", "check_checkpoint", "load_checkpoint", "read_loop_state",
           "resume_point", "save_checkpoint", "truncate_lineage",
           "truncate_tamper_samples"]
