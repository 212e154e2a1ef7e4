"""Adapter states: PEFT LoRA key parsing, grouping of factors into modules, per-module copies.

An *adapter state* is a PEFT-named dict of factors, as ``LoRAPopulation.state()`` returns it::

    {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": A  # [r, d_in]
     "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": B  # [d_out, r]
     ...}

(keys with an adapter name, ``...lora_A.default.weight``, work too). A *module* is one LoRA target: the pair
(``lora_A``, ``lora_B``) sharing a key prefix; its update is ``ΔW = s·B·A``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AdapterState",
    "LoraModule",
    "check_parents",
    "copy_module",
    "lora_modules",
    "module_factors",
    "ordered",
]

AdapterState = Mapping[str, Tensor]


@dataclass(frozen=True)
class LoraModule:
    """One LoRA target: its name (key prefix) and the keys of its ``lora_A`` / ``lora_B`` weights."""

    name: str
    a_key: str
    b_key: str


_A_TAG = ".lora_A"
_B_TAG = ".lora_B"


def _split_key(key: str) -> tuple[str, str, str] | None:
    """``prefix.lora_A[.adapter].weight`` -> (prefix, "A", adapter-suffix); None for any other key."""
    if not key.endswith(".weight"):
        return None
    for tag, which in ((_A_TAG, "A"), (_B_TAG, "B")):
        idx = key.rfind(tag + ".")
        if idx < 0:
            continue
        middle = key[idx + len(tag) : -len(".weight")]  # "" or ".adapter"
        if middle == "" or (middle.startswith(".") and "." not in middle[1:]):
            return key[:idx], which, middle
    return None


def lora_modules(state: AdapterState) -> list[LoraModule]:
    """Pair the ``lora_A`` / ``lora_B`` keys of an adapter state into modules, sorted by module name.

    The order is canonical, not the state's key order: the operators draw per-module randomness in this order
    (one seed per module, a layer pick per module), so the same parents and seed give the same child whether
    they come from the live population (the model's module order) or from safetensors files (keys sorted by
    name), and a PBT child is reproducible offline from its lineage record (``populora evolve``).

    Raises:
        ValueError: a key that is not a LoRA A/B weight (e.g. DoRA magnitudes, ``modules_to_save``), an A without
            its B or vice versa, a factor that is not 2-D, or A/B ranks that disagree.
    """
    a_keys: dict[str, str] = {}
    b_keys: dict[str, str] = {}
    order: list[str] = []
    other: list[str] = []
    for key in state:
        parts = _split_key(key)
        if parts is None:
            other.append(key)
            continue
        prefix, which, adapter = parts
        name = prefix + adapter
        (a_keys if which == "A" else b_keys)[name] = key
        if name not in order:
            order.append(name)
    if other:
        raise ValueError(
            f"{len(other)} key(s) are not LoRA factors (expected '<module>.lora_A.weight' / "
            f"'<module>.lora_B.weight'; DoRA, biases and modules_to_save are not supported): {other[:5]}"
        )
    if not order:
        raise ValueError("the adapter state has no LoRA factors")
    modules = []
    for name in sorted(order):
        if name not in a_keys or name not in b_keys:
            have, miss = ("lora_A", "lora_B") if name in a_keys else ("lora_B", "lora_A")
            raise ValueError(f"module {name!r} has {have} but no {miss}")
        A, B = state[a_keys[name]], state[b_keys[name]]
        if A.ndim != 2 or B.ndim != 2:
            raise ValueError(
                f"module {name!r}: only linear LoRA factors are supported, got lora_A {tuple(A.shape)} and "
                f"lora_B {tuple(B.shape)}"
            )
        if A.shape[0] != B.shape[1]:
            raise ValueError(
                f"module {name!r}: lora_A has rank {A.shape[0]} ([r, d_in] = {tuple(A.shape)}) but lora_B has "
                f"rank {B.shape[1]} ([d_out, r] = {tuple(B.shape)})"
            )
        modules.append(LoraModule(name, a_keys[name], b_keys[name]))
    return modules


def check_parents(parents: Sequence[AdapterState]) -> list[LoraModule]:
    """Parent 1's modules, after checking every other parent has exactly its keys, shapes, dtypes and devices.

    Raises:
        ValueError: naming the first mismatch (missing/extra keys, shape, dtype or device).
    """
    modules = lora_modules(parents[0])
    ref = parents[0]
    for i, other in enumerate(parents[1:], start=2):
        missing = [k for k in ref if k not in other]
        extra = [k for k in other if k not in ref]
        if missing or extra:
            raise ValueError(
                f"parent {i} does not have parent 1's keys: {len(missing)} missing {missing[:3]}, "
                f"{len(extra)} extra {extra[:3]}"
            )
        for key, t in ref.items():
            o = other[key]
            if o.shape != t.shape:
                raise ValueError(
                    f"parent {i}: {key} has shape {tuple(o.shape)}, parent 1 has {tuple(t.shape)}"
                )
            if o.dtype != t.dtype:
                raise ValueError(f"parent {i}: {key} has dtype {o.dtype}, parent 1 has {t.dtype}")
            if o.device != t.device:
                raise ValueError(f"parent {i}: {key} is on {o.device}, parent 1 on {t.device}")
    return modules


def module_factors(state: AdapterState, m: LoraModule, cdt: torch.dtype) -> tuple[Tensor, Tensor]:
    """Module ``m``'s ``(A, B)`` cast to the compute dtype ``cdt``."""
    return state[m.a_key].to(cdt), state[m.b_key].to(cdt)


def copy_module(child: dict[str, Tensor], parent: AdapterState, m: LoraModule) -> None:
    """Put copies of ``parent``'s raw factors of module ``m`` into ``child``."""
    child[m.a_key] = parent[m.a_key].clone()
    child[m.b_key] = parent[m.b_key].clone()


def ordered(child: dict[str, Tensor], parent: AdapterState) -> dict[str, Tensor]:
    """``child`` with its keys in ``parent``'s order."""
    return {k: child[k] for k in parent}
