"""PEFT adapter directories in and out of the operators: the function behind ``populora evolve``.

A PEFT LoRA directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (keys
``base_model.model.<module>.lora_A.weight`` / ``.lora_B.weight``). :func:`evolve_dirs` loads the parents, checks
that they can be combined (same rank, alpha, target modules, shapes), applies a registered operator with a seeded
generator and writes the child as a PEFT directory with parent 1's ``adapter_config.json``, loadable by
``PeftModel.from_pretrained`` and vLLM.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from evolution.operators import get_operator, lora_modules

__all__ = ["AdapterFileError", "evolve_dirs", "load_adapter_dir", "parse_params", "save_adapter_dir"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
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
    return config, _read_weights(weights)


def save_adapter_dir(
    path: str | Path,
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    config_file: str | Path | None = None,
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (into a temp dir, then renamed into place).

    ``config_file``, if given, is copied verbatim instead of serialising ``config``.
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
        if path.exists():
            if not path.is_dir():
                raise FileExistsError(f"{path} exists and is not a directory")
            for name in (CONFIG_NAME, WEIGHTS_NAME):
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


def evolve_dirs(
    op: str,
    parents: Sequence[str | Path],
    out: str | Path,
    params: Mapping[str, float | int | str] | None = None,
    seed: int = 0,
) -> Path:
    """Apply operator ``op`` to the PEFT adapters in ``parents`` and write the child to ``out``.

    For crossovers the second parent is the fitter one where it matters (``extrapolate``). The child gets parent
    1's ``adapter_config.json`` unchanged (same rank, alpha and target modules) and the same tensor keys, shapes
    and dtypes. All randomness comes from ``torch.Generator().manual_seed(seed)``.

    Raises:
        ValueError: unknown operator (listing the known ones), wrong number of parents, incompatible parents
            (naming the mismatch), bad parameters.
        FileNotFoundError: a missing parent directory or file.
    """
    operator = get_operator(op)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    paths = [Path(p) for p in parents]
    if len(paths) != operator.arity:
        raise ValueError(f"operator {op!r} takes {operator.arity} parent(s), got {len(paths)}: {paths}")
    resolved = operator.resolve_params(dict(params or {}))
    loaded = [load_adapter_dir(p) for p in paths]
    configs = [c for c, _ in loaded]
    states = [s for _, s in loaded]
    for p, s in zip(paths, states, strict=True):
        try:
            lora_modules(s)
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None
    _check_compatible(paths, configs, states)
    given = ", ".join(f"{k}={v}" for k, v in sorted(dict(params or {}).items())) or "its default parameters"
    try:
        child = operator(*states, generator=torch.Generator().manual_seed(int(seed)), **resolved)
    except RuntimeError as exc:  # e.g. torch.linalg on values an extreme parameter made ill-conditioned
        raise ValueError(f"operator {op!r} with {given} failed: {type(exc).__name__}: {exc}") from None
    bad = [k for k, t in child.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"operator {op!r} with {given} (resolved: {resolved}) produced a child with NaN/inf "
                         f"weights in {len(bad)} tensor(s), e.g. {bad[0]}: nothing was written; choose smaller "
                         f"values of {', '.join(sorted(dict(params or {}))) or 'the parameters'}")
    return save_adapter_dir(out, configs[0], child, config_file=paths[0] / CONFIG_NAME)
