"""PEFT adapter directories in and out of the operators: the function behind ``populora evolve``.

A PEFT LoRA directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (keys
``base_model.model.<module>.lora_A.weight`` / ``.lora_B.weight``). :func:`evolve_dirs` loads the parents, checks
that they can be combined (same rank, alpha, target modules, shapes), applies a registered operator with a seeded
generator and writes the child as a PEFT directory with parent 1's ``adapter_config.json``, loadable by
``PeftModel.from_pretrained`` and vLLM, and ``provenance.json`` beside them: how the child was made (operator,
parents with the SHA-256 of their files, parameters as given and as resolved, seed, time), so a child found later
can be traced to its parents and made again (``populora evolve --op OP --parents ... --param ... --seed S``).
PEFT and vLLM ignore the extra file.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from evolution.operators import get_operator, lora_modules

__all__ = ["AdapterFileError", "EvolveError", "PROVENANCE_NAME", "evolve_dirs", "load_adapter_dir", "parse_params",
           "provenance", "save_adapter_dir"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PROVENANCE_NAME = "provenance.json"
"""How ``populora evolve`` made a child (:func:`provenance`), written next to its PEFT files."""
# config fields that must agree between parents (they change the meaning of the factors)
_MUST_MATCH = ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "rank_pattern", "alpha_pattern")


def parse_params(items: Sequence[str]) -> dict[str, float | int | str]:
    """``["density=0.5", "niter=3", "space=factor"]`` -> ``{"density": 0.5, "niter": 3, "space": "factor"}``.

    Values parse as int, then float, else stay strings (the operator coerces them to its parameter types, e.g.
    ``weights=0.3,0.7`` becomes a tuple). Raises ValueError for an item without ``=``, an empty key or a key given
    twice.
    """
    out: dict[str, float | int | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ValueError(f"operator parameter {item!r} is not of the form key=value")
        if key in out:
            raise ValueError(f"operator parameter {key!r} given twice")
        value: float | int | str
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                value = raw
        out[key] = value
    return out


class AdapterFileError(ValueError):
    """An adapter file that cannot be used (unreadable, truncated, garbage, non-finite); the message names it."""


class EvolveError(ValueError):
    """Why :func:`evolve_dirs` cannot make the child; ``argument`` names the input at fault (``op``,
    ``parents``, ``param`` or ``out``: the ``populora evolve`` flag the message goes with)."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def _read_config(cfg_file: Path) -> dict[str, Any]:
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AdapterFileError(f"{cfg_file}: not a readable adapter config ({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict):
        raise AdapterFileError(f"{cfg_file}: not an adapter config (a JSON object), got {type(config).__name__}")
    return config


def _read_weights(weights: Path) -> dict[str, torch.Tensor]:
    try:
        state = load_file(str(weights))
    except Exception as exc:  # safetensors' SafetensorError (truncated, bad header), OSError, ...
        raise AdapterFileError(f"{weights}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    for key, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise AdapterFileError(f"{weights}: tensor {key} holds NaN or inf values")
    return state


def load_adapter_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(adapter_config, state)`` of a PEFT LoRA directory (safetensors weights only).

    Raises:
        FileNotFoundError: no directory, no ``adapter_config.json`` or no weights file.
        AdapterFileError: (a ValueError naming the file) an unreadable or garbage ``adapter_config.json``, a
            truncated or damaged weights file, or weights holding NaN/inf.
        ValueError: only a pickled ``adapter_model.bin`` (not loaded: it can execute code), or not a LoRA adapter.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"adapter directory {path} does not exist")
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} is not a PEFT adapter directory: no {CONFIG_NAME}")
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        if (path / "adapter_model.bin").is_file():
            raise ValueError(
                f"{path} has only a pickled adapter_model.bin; convert it to {WEIGHTS_NAME} first (e.g. load "
                f"with PeftModel.from_pretrained and save_pretrained(..., safe_serialization=True))"
            )
        raise FileNotFoundError(f"{path} has no {WEIGHTS_NAME}")
    config = _read_config(cfg_file)
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(
            f"{cfg_file}: peft_type is {config.get('peft_type')!r}, only LORA adapters are supported"
        )
    state = _read_weights(weights)
    _check_ranks(cfg_file, config, state)
    return config, state


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_ranks(cfg_file: Path, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> None:
    """The config's sizes are the weights' (:class:`AdapterFileError` naming the file otherwise), so what is
    allocated from the config (a population of rank ``r``: ``r · (d_in + d_out)`` numbers per module) is
    bounded by the file that was read: ``r`` (and each ``rank_pattern`` value) a positive int that some
    ``lora_A`` (``r × d_in``) / ``lora_B`` (``d_out × r``) pair holds, every pair's rank one of them, and
    ``lora_alpha`` a finite real number."""
    ranks = {config.get("r")}
    pattern = config.get("rank_pattern") or {}
    if not isinstance(pattern, Mapping):
        raise AdapterFileError(f"{cfg_file}: rank_pattern is not an object, got {type(pattern).__name__}")
    ranks |= set(pattern.values())
    bad = [r for r in ranks if not _is_int(r) or r < 1]
    if bad:
        raise AdapterFileError(f"{cfg_file}: r must be a positive int, got {bad[0]!r}")
    alpha = config.get("lora_alpha", config["r"])
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise AdapterFileError(f"{cfg_file}: lora_alpha must be a finite number, got {alpha!r}")
    held = {}
    for key, t in state.items():
        if key.endswith("lora_A.weight") and t.dim() == 2:
            held[key] = int(t.shape[0])
        elif key.endswith("lora_B.weight") and t.dim() == 2:
            held[key] = int(t.shape[1])
    wrong = next(((k, n) for k, n in held.items() if n not in ranks), None)
    if wrong is not None:
        key, n = wrong
        raise AdapterFileError(f"{cfg_file}: r = {config['r']} but {key} in {WEIGHTS_NAME} has rank {n}: the "
                               "config does not describe these weights")


def save_adapter_dir(
    path: str | Path,
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    config_file: str | Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (into a temp dir, then renamed into place).

    ``config_file``, if given, is copied verbatim instead of serialising ``config``; ``extra``: more JSON files
    written with them (file name -> JSON value), e.g. :data:`PROVENANCE_NAME`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        if config_file is not None:
            shutil.copyfile(config_file, tmp / CONFIG_NAME)
        else:
            (tmp / CONFIG_NAME).write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")
        tensors = {k: v.detach().contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        for name, value in (extra or {}).items():
            (tmp / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if path.exists():
            if not path.is_dir():
                raise FileExistsError(f"{path} exists and is not a directory")
            for name in (CONFIG_NAME, WEIGHTS_NAME, PROVENANCE_NAME):
                (path / name).unlink(missing_ok=True)
            for f in tmp.iterdir():
                f.replace(path / f.name)
        else:
            tmp.replace(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _check_compatible(paths: Sequence[Path], configs: Sequence[Mapping[str, Any]], states) -> None:
    ref_cfg, ref_state = configs[0], states[0]
    for i in range(1, len(paths)):
        cfg, state = configs[i], states[i]
        for key in _MUST_MATCH:
            a, b = ref_cfg.get(key), cfg.get(key)
            if key in ("rank_pattern", "alpha_pattern"):
                a, b = a or {}, b or {}
            if a != b:
                raise ValueError(
                    f"parents differ in {key}: {paths[0]} has {a!r}, {paths[i]} has {b!r} (operators need the "
                    f"same rank, alpha and scaling)"
                )
        ta, tb = ref_cfg.get("target_modules"), cfg.get("target_modules")
        if isinstance(ta, list) and isinstance(tb, list):
            ta, tb = sorted(ta), sorted(tb)
        if ta != tb:
            raise ValueError(
                f"parents differ in target_modules: {paths[0]} has {ta!r}, {paths[i]} has {tb!r}"
            )
        missing = sorted(set(ref_state) - set(state))
        extra = sorted(set(state) - set(ref_state))
        if missing or extra:
            raise ValueError(
                f"parents have different LoRA modules: {paths[i]} lacks {len(missing)} of {paths[0]}'s tensors "
                f"{missing[:3]} and has {len(extra)} others {extra[:3]}"
            )
        for key, t in ref_state.items():
            if state[key].shape != t.shape:
                raise ValueError(
                    f"parents differ in the shape of {key}: {tuple(t.shape)} in {paths[0]}, "
                    f"{tuple(state[key].shape)} in {paths[i]}"
                )
            if state[key].dtype != t.dtype:
                raise ValueError(
                    f"parents differ in the dtype of {key}: {t.dtype} in {paths[0]}, {state[key].dtype} in {paths[i]}"
                )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def provenance(op: str, family: str, parents: Sequence[Path], params: Mapping[str, Any],
               resolved: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The record of how a child was made: the operator and its family, each parent directory (as given and
    resolved) with the SHA-256 of its two PEFT files, the parameters as given and as the operator resolved them,
    the seed of its generator, the time (UTC) and the command that makes the same child again."""
    param_flags = " ".join(f"--param {k}={v}" for k, v in sorted(params.items()))
    return {
        "operator": op,
        "family": family,
        "parents": [{"path": str(p), "resolved": str(p.resolve()),
                     "sha256": {name: _sha256(p / name) for name in (CONFIG_NAME, WEIGHTS_NAME)}} for p in parents],
        "params": _json_value(dict(params)),
        "resolved_params": _json_value(dict(resolved)),
        "seed": int(seed),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["populora evolve --op", op, "--parents", *map(str, parents), "--out OUT",
                             *([param_flags] if param_flags else []), "--seed", str(int(seed))]),
    }


def evolve_dirs(
    op: str,
    parents: Sequence[str | Path],
    out: str | Path,
    params: Mapping[str, float | int | str] | None = None,
    seed: int = 0,
) -> Path:
    """Apply operator ``op`` to the PEFT adapters in ``parents`` and write the child to ``out``, with its
    :data:`PROVENANCE_NAME` (:func:`provenance`).

    For crossovers the second parent is the fitter one where it matters (``extrapolate``). The child gets parent
    1's ``adapter_config.json`` unchanged (same rank, alpha and target modules) and the same tensor keys, shapes
    and dtypes. All randomness comes from ``torch.Generator().manual_seed(seed)``.

    Raises:
        EvolveError: (a ValueError; ``argument`` names the input) unknown operator (listing the known ones),
            ``out`` a file, wrong number of parents, unusable or incompatible parents (naming the file or the
            mismatch), bad parameters, an operator that fails or gives non-finite weights.
        FileNotFoundError: a missing parent directory or file.
    """
    try:
        operator = get_operator(op)
    except KeyError as exc:
        raise EvolveError("op", str(exc)) from None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise EvolveError("out", f"{out} exists and is not a directory")
    paths = [Path(p) for p in parents]
    if len(paths) != operator.arity:
        raise EvolveError("parents", f"operator {op!r} takes {operator.arity} parent(s), got {len(paths)}: {paths}")
    try:
        resolved = operator.check_params(dict(params or {}))  # the operator's own checks, before reading parents
    except ValueError as exc:
        raise EvolveError("param", str(exc)) from None
    states, configs = _load_parents(paths)
    given = ", ".join(f"{k}={v}" for k, v in sorted(dict(params or {}).items())) or "its default parameters"
    try:
        child = operator(*states, generator=torch.Generator().manual_seed(int(seed)), **resolved)
    except (RuntimeError, ValueError) as exc:  # torch.linalg on ill-conditioned values; a check on real shapes
        raise EvolveError("param", f"operator {op!r} with {given} failed: {type(exc).__name__}: {exc}") from None
    bad = [k for k, t in child.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise EvolveError("param", f"operator {op!r} with {given} (resolved: {resolved}) produced a child with "
                          f"NaN/inf weights in {len(bad)} tensor(s), e.g. {bad[0]}: nothing was written; choose "
                          f"smaller values of {', '.join(sorted(dict(params or {}))) or 'the parameters'}")
    record = provenance(op, operator.family, paths, dict(params or {}), resolved, seed)
    return save_adapter_dir(out, configs[0], child, config_file=paths[0] / CONFIG_NAME,
                            extra={PROVENANCE_NAME: record})


def _load_parents(paths: Sequence[Path]) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, Any]]]:
    """The parents' states and configs, checked to be LoRA adapters that can be combined (:class:`EvolveError`
    for ``parents`` naming the file or the mismatch; FileNotFoundError for a missing one)."""
    try:
        loaded = [load_adapter_dir(p) for p in paths]
        states = [s for _, s in loaded]
        for p, s in zip(paths, states, strict=True):
            try:
                lora_modules(s)
            except ValueError as e:
                raise ValueError(f"{p}: {e}") from None
        _check_compatible(paths, [c for c, _ in loaded], states)
    except FileNotFoundError:
        raise
    except ValueError as exc:
        raise EvolveError("parents", str(exc)) from None
    return states, [c for c, _ in loaded]
