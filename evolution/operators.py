"""LoRA weight-space operators: a registry of mutations, crossovers and controls.

An *adapter state* is a PEFT-named dict of factors, as ``LoRAPopulation.state()`` returns it::

    {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": A  # [r, d_in]
     "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": B  # [d_out, r]
     ...}

(keys with an adapter name, ``...lora_A.default.weight``, work too). A module's update is ``ΔW = s·B·A`` with
``s = alpha/r``; operators never change ``r``, ``alpha`` or the module set, so ``s`` is a constant and every
formula below is written on ``B·A`` (``ΔW`` means ``B·A`` from here on).

Calling convention::

    child = get_operator("dare")(parent_1, parent_2, generator=torch.Generator().manual_seed(0), p=0.7)

* the child has exactly the parents' keys (in parent 1's order), shapes and dtypes; computation is in float32
  (float64 for float64 parents) and cast back; the parents are never modified;
* for crossovers, **parent 2 is the fitter parent** where it matters (``extrapolate``);
* all randomness comes from ``generator`` (never the global RNG): the same seed gives the same child. Most
  operators first draw one seed per module from it and give module ``j`` its own ``torch.Generator`` (so modules
  can run in parallel threads): the child is bitwise identical for any ``torch.get_num_threads()``;
* SVD-based operators (``svd_mutation``, ``component_mask``, ``svd_crossover`` and every ΔW-space combination)
  use the exact factor SVD of :mod:`evolution.lowrank` and refactor with ``√S`` on both sides; components that end
  up dead (zero singular value) get a zero B column and a fresh PEFT-init A row so they can regrow
  (populora-method.md §8.4.2). A module whose ΔW is identically 0 in every parent (e.g. an untrained ``B = 0``)
  is returned as a copy of parent 1's raw factors by these operators;
* ``space="delta"`` (default) applies a combination to ΔW exactly — no ``B_i A_j`` cross terms — and truncates
  to rank ``r`` (Eckart–Young, via the stacked factors, never forming ΔW); ``space="factor"`` applies it to the
  A and B factors separately (lucidrains/populora and PEFT ``add_weighted_adapter`` semantics), which is cheaper
  but mixes the non-identifiable bases of the parents (``(ΣB_i)(ΣA_i)`` contains ``B_i A_j``).

Operators (defaults from populora-method.md §8 / §12; ``[D]`` = this project's choice):

=====================  =========  =====  =================================================================
name                   family     arity  math
=====================  =========  =====  =================================================================
``svd_mutation``       mutation   1      M1: ``S' = S⊙exp(εz)``, ``U' = U R_U``, ``V' = V R_V`` (Cayley rotations)
``layer_mutation``     mutation   1      M2: noise ``ε·std(X)·Z`` on a random fraction ``f`` of the modules
``component_mask``     mutation   1      M3: zero ``⌈ρr⌉`` random singular components
``adaptive_noise``     mutation   1      M4: noise ``ε·std(X)·Z`` on every factor of every module
``dare``               crossover  2      X1: ``½(D(B₁)D(A₁) + D(B₂)D(A₂))`` → rank r
``layer_crossover``    crossover  2      X2: each module's factors copied from a uniformly chosen parent
``svd_crossover``      crossover  2      X3: parent-1 triplets ``1..k``, parent-2 triplets ``k+1..r``
``extrapolate``        crossover  2      X4: ``(1−η)ΔW₁ + ηΔW₂``, ``η ~ U[1, 1.5]`` → rank r
``ties``               crossover  2      TIES on ΔW (trim, elect sign, disjoint merge) → rank r
``task_arithmetic``    crossover  2      ``Σ wᵢ ΔWᵢ`` → rank r
``copy_parent``        control    1      bitwise copy of the raw factors
``linear_0_5``         control    2      ``½ΔW₁ + ½ΔW₂`` → rank r
=====================  =========  =====  =================================================================

Only M1–M4 and X1–X4 are in the *default pool* (``Operator.default_pool``) from which the PBT controller draws
uniformly within a family; ``ties``, ``task_arithmetic`` and the controls are chosen only by name.

Register a new operator with :func:`register_operator`; it receives ``(parents, modules, generator, **params)``
where ``modules`` is the validated list of :class:`LoraModule` pairs.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from evolution.lowrank import compute_dtype, dead_components, gram_core, lora_a_init
from populora_env.registry import Registry, UnknownEntryError

__all__ = [
    "AdapterState",
    "LoraModule",
    "Operator",
    "UnknownOperatorError",
    "dare_drop",
    "dare_mask_pair",
    "get_operator",
    "list_operators",
    "lora_modules",
    "register_operator",
    "unregister_operator",
]

AdapterState = Mapping[str, Tensor]
FAMILIES = ("mutation", "crossover", "control")
CHUNK = 8
"""Modules per work item: the small ``r×r`` linear algebra (eigh/SVD/solve) is batched over a chunk, and chunks
run in parallel threads (see ``_map_modules``)."""


class UnknownOperatorError(UnknownEntryError):
    """An operator name that is not registered (a :class:`~populora_env.registry.UnknownEntryError`: both a
    ``KeyError`` and a ``ValueError``; the message lists the known operators)."""


# ------------------------------------------------------------------------------------------- modules


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
    """Pair the ``lora_A`` / ``lora_B`` keys of an adapter state into modules (in the state's key order).

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
    for name in order:
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


def _check_parents(parents: Sequence[AdapterState]) -> list[LoraModule]:
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


# ------------------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Operator:
    """A registered operator: call it as ``op(*parents, generator=g, **params) -> child state``.

    Attributes:
        name: registry name.
        family: ``"mutation"``, ``"crossover"`` or ``"control"``.
        arity: number of parents (1 or 2).
        defaults: every accepted parameter with its default value.
        default_pool: whether the PBT controller draws it when a *family* is chosen.
        fn: the implementation, ``fn(parents, modules, generator, **params)``.
    """

    name: str
    family: str
    arity: int
    defaults: Mapping[str, Any]
    default_pool: bool
    fn: Callable[..., dict[str, Tensor]] = field(repr=False)

    @property
    def summary(self) -> str:
        """First line of the implementation's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``params`` (coerced to the default's type); unknown names raise ValueError."""
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            accepted = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items()) or "none"
            raise ValueError(
                f"operator {self.name!r} got unknown parameter(s) {unknown}; accepted: {accepted}"
            )
        out = dict(self.defaults)
        for key, value in params.items():
            out[key] = _coerce(self.name, key, value, self.defaults[key])
        return out

    def __call__(
        self, *parents: AdapterState, generator: torch.Generator, **params: Any
    ) -> dict[str, Tensor]:
        if len(parents) != self.arity:
            raise ValueError(f"operator {self.name!r} takes {self.arity} parent(s), got {len(parents)}")
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"operator {self.name!r} needs generator=torch.Generator (all randomness comes from it), "
                f"got {type(generator).__name__}"
            )
        resolved = self.resolve_params(params)
        modules = _check_parents(parents)
        device = parents[0][modules[0].a_key].device
        if torch.device(generator.device).type != device.type:
            raise ValueError(f"generator is on {generator.device} but the parents are on {device}")
        with _STATS_LOCK:
            GRAM_STATS.update(float32=0, float64=0)
        with torch.no_grad():
            return self.fn(parents, modules, generator, **resolved)


def _coerce(op: str, key: str, value: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, tuple):
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(float(v) for v in items)
        if default is None and isinstance(value, str):
            return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"operator {op!r}: parameter {key}={value!r} is not a valid {type(default).__name__}"
        ) from None
    return value


_REGISTRY: Registry[Operator] = Registry("operator", error=UnknownOperatorError)


def register_operator(
    name: str,
    *,
    family: str,
    arity: int,
    defaults: Mapping[str, Any] | None = None,
    default_pool: bool = False,
) -> Callable[[Callable[..., dict[str, Tensor]]], Callable[..., dict[str, Tensor]]]:
    """Decorator registering ``fn(parents, modules, generator, **params) -> child`` under ``name``.

    Raises:
        ValueError: family/arity are invalid, or (:class:`~populora_env.registry.DuplicateEntryError`) ``name``
            is already registered.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if arity not in (1, 2):
        raise ValueError(f"arity must be 1 or 2, got {arity}")

    def deco(fn: Callable[..., dict[str, Tensor]]) -> Callable[..., dict[str, Tensor]]:
        params = MappingProxyType(dict(defaults or {}))
        _REGISTRY.add(name, Operator(name, family, arity, params, default_pool, fn))
        return fn

    return deco


def unregister_operator(name: str) -> Operator:
    """Remove ``name`` from the registry and return its :class:`Operator` (for plugins and tests).

    Raises:
        UnknownOperatorError: ``name`` is not registered.
    """
    return _REGISTRY.remove(name)


def get_operator(name: str) -> Operator:
    """The operator registered as ``name``.

    Raises:
        UnknownOperatorError: (a KeyError and a ValueError) unknown name; the message lists the known operators.
    """
    return _REGISTRY.get(name)


def list_operators(family: str | None = None) -> list[Operator]:
    """Registered operators sorted by name, optionally only one family."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return [op for _, op in _REGISTRY.items() if family is None or op.family == family]


# ------------------------------------------------------------------------------------------- helpers


def _space(space: str) -> str:
    if space not in ("delta", "factor"):
        raise ValueError(f"space must be 'delta' or 'factor', got {space!r}")
    return space


def _weights(weights: Sequence[float], n: int, op: str) -> tuple[float, ...]:
    if len(weights) != n:
        raise ValueError(f"{op}: expected {n} weights, got {len(weights)}")
    return tuple(float(w) for w in weights)


def _factors(state: AdapterState, m: LoraModule, cdt: torch.dtype) -> tuple[Tensor, Tensor]:
    return state[m.a_key].to(cdt), state[m.b_key].to(cdt)


def _copy_module(child: dict[str, Tensor], parent: AdapterState, m: LoraModule) -> None:
    child[m.a_key] = parent[m.a_key].clone()
    child[m.b_key] = parent[m.b_key].clone()


def _ordered(child: dict[str, Tensor], parent: AdapterState) -> dict[str, Tensor]:
    return {k: child[k] for k in parent}


def _regrow(A: Tensor, dead: Tensor, generator: torch.Generator) -> Tensor:
    """Fresh PEFT-init rows of ``A`` (``[r, d_in]``) where ``dead`` (``[r]``); B's columns are already 0."""
    n_dead = int(dead.sum())
    if n_dead:
        A[dead] = lora_a_init((n_dead, A.shape[-1]), generator=generator, dtype=A.dtype, device=A.device)
    return A


def _emit(
    Bs: Sequence[Tensor],
    As: Sequence[Tensor],
    YB: Tensor,
    YA: Tensor,
    dead: Tensor,
    generator: torch.Generator,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """``B' = Σ_i B_i YB_i``, ``A' = Σ_i YA_iᵀ A_i`` (``YB``/``YA`` stacked ``[k·r, r]``), regrow dead, cast."""
    cdt = Bs[0].dtype
    YB = YB.to(cdt)
    YA = YA.to(cdt)
    r = As[0].shape[0]
    B = Bs[0] @ YB[:r]
    A = YA[:r].mT @ As[0]
    for i in range(1, len(Bs)):
        B.addmm_(Bs[i], YB[i * r : (i + 1) * r])
        A.addmm_(YA[i * r : (i + 1) * r].mT, As[i])
    if bool(dead.any()):
        B[:, dead] = 0
        _regrow(A, dead, generator)
    return A.to(dtype), B.to(dtype)


_TLS = threading.local()


def _workspace(numel: int, dtype: torch.dtype, device: torch.device, tag: str = "gram") -> Tensor:
    """A reusable flat scratch buffer (per thread, tag, dtype and device) of at least ``numel`` elements.

    Fresh multi-megabyte allocations are returned to the OS on free and page-faulted in again on every use, which
    cost more than the Gram products themselves. The buffers grow, never shrink: per worker thread the largest
    ``d × k·r`` float64 Gram block (~10 MB for a 7B model's MLP at rank 32) and, for DARE, the masked factors of
    one chunk of modules (~50 MB).
    """
    cache = getattr(_TLS, "ws", None)
    if cache is None:
        cache = _TLS.ws = {}
    key = (tag, dtype, str(device))
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def _cat_gram(Xs: Sequence[Tensor], *, rows: bool, precision: torch.dtype = torch.float64) -> Tensor:
    """Gram matrix (returned as float64) of the concatenation of ``Xs``: ``[X₁|…|X_k]ᵀ[X₁|…|X_k]`` for B's
    (``rows=False``, each ``[d, r]``), ``[X₁;…;X_k][X₁;…;X_k]ᵀ`` for A's (``rows=True``, each ``[r, d]``).

    The factors are copied (cast) into a reused workspace of dtype ``precision`` and multiplied in one GEMM.
    """
    k = len(Xs)
    if k == 1 and Xs[0].dtype == precision:
        x = Xs[0]
        return (x @ x.mT if rows else x.mT @ x).to(torch.float64)
    d, r = (Xs[0].shape[1], Xs[0].shape[0]) if rows else Xs[0].shape
    ws = _workspace(d * k * r, precision, Xs[0].device)
    if rows:
        X = ws.view(k * r, d)
        for i, x in enumerate(Xs):
            X[i * r : (i + 1) * r].copy_(x)
        G = X @ X.mT
    else:
        X = ws.view(d, k * r)
        for i, x in enumerate(Xs):
            X[:, i * r : (i + 1) * r].copy_(x)
        G = X.mT @ X
    return G.to(torch.float64)


GRAM_PRECISION = "auto"
"""``"auto"``: Gram matrices in float32, recomputed in float64 for a module whose equilibrated conditioning
``λ_min/λ_max`` is below :data:`FP32_GRAM_MIN_RATIO` (always float64 for float64 parents); ``"float64"``: always
float64 (~2.5× the Gram cost)."""
FP32_GRAM_MIN_RATIO = 1e-2
"""Accept a float32 Gram when the equilibrated ``λ_min/λ_max ≥`` this (κ ≤ 10): measured orthogonality error of
the resulting basis ≤ 1.4e-6 for ``d = 18944`` (Householder QR in float32: ~1e-6)."""
GRAM_STATS = {"float32": 0, "float64": 0}
"""Gram matrices (per module and side) computed in each precision since the last operator call started."""
_STATS_LOCK = threading.Lock()


def _core(
    bstacks: Sequence[Sequence[Tensor]], astacks: Sequence[Sequence[Tensor]], weights: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Exact SVD maps of ``Σ_i w_i B_i A_i`` for a batch of modules: ``(XB, S, XA, GB, GA)`` (see ``gram_core``).

    ``bstacks[j]`` / ``astacks[j]`` are module ``j``'s B's / A's. Per :data:`GRAM_PRECISION` the Gram matrices are
    first formed in float32 and only the modules whose equilibrated conditioning fails the
    :data:`FP32_GRAM_MIN_RATIO` test are redone in float64.
    """
    try32 = GRAM_PRECISION == "auto" and bstacks[0][0].dtype != torch.float64
    prec = torch.float32 if try32 else torch.float64
    GB = torch.stack([_cat_gram(bs, rows=False, precision=prec) for bs in bstacks])
    GA = torch.stack([_cat_gram(as_, rows=True, precision=prec) for as_ in astacks])
    XB, S, XA, ratio_b, ratio_a = gram_core(GB, GA, weights, return_ratio=True)
    n64 = 0 if try32 else len(bstacks)
    if try32:
        bad = ((ratio_b < FP32_GRAM_MIN_RATIO) | (ratio_a < FP32_GRAM_MIN_RATIO)).nonzero().flatten().tolist()
        if bad:
            GB[bad] = torch.stack([_cat_gram(bstacks[i], rows=False) for i in bad])
            GA[bad] = torch.stack([_cat_gram(astacks[i], rows=True) for i in bad])
            XB[bad], S[bad], XA[bad] = gram_core(GB[bad], GA[bad], weights)
            n64 = len(bad)
    with _STATS_LOCK:
        GRAM_STATS["float64"] += n64
        GRAM_STATS["float32"] += len(bstacks) - n64
    return XB, S, XA, GB, GA


def _is_zero(G: Tensor) -> Tensor:
    """Whether a Gram matrix (``[..., c, c]``) comes from an all-zero factor (exact: sums of squares)."""
    return torch.diagonal(G, dim1=-2, dim2=-1).sum(-1) == 0


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Torch intra-op threads = 1 inside the block (the previous count is restored)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


# ------------------------------------------------------------------------------- per-module execution


def _module_seeds(generator: torch.Generator, n: int) -> list[int]:
    """One seed per module, drawn from the operator's generator (the module's randomness comes from it)."""
    return torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()


def _map_modules(
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    device: torch.device,
    work: Callable[[Sequence[LoraModule], list[torch.Generator]], dict[str, Tensor]],
    rank_of: Callable[[LoraModule], int] = lambda m: 0,
) -> dict[str, Tensor]:
    """Run ``work(chunk, generators)`` over chunks of :data:`CHUNK` modules and merge the children's tensors.

    Module ``j`` gets its own ``torch.Generator().manual_seed(seeds[j])`` with ``seeds`` drawn from ``generator``
    (:func:`_module_seeds`), so the result does not depend on how chunks are scheduled. On CPU the chunks run in a
    pool of ``torch.get_num_threads()`` Python threads with torch's intra-op threads set to 1: MKL does not
    parallelise the skinny ``d×r`` GEMMs and ``uniform_``/``randn`` are serial kernels, so module-level parallelism
    is what uses the cores (and it has no OpenMP barriers, which stall on an oversubscribed machine). Every path
    runs each op single-threaded, so 1 and N workers give bitwise-identical children.
    """
    seeds = _module_seeds(generator, len(modules))
    ranks = [rank_of(m) for m in modules]
    items = []
    for r in dict.fromkeys(ranks):  # chunks share one rank (PEFT rank_pattern may mix ranks)
        idx = [i for i, ri in enumerate(ranks) if ri == r]
        for c in range(0, len(idx), CHUNK):
            sel = idx[c : c + CHUNK]
            items.append(([modules[i] for i in sel], [seeds[i] for i in sel]))
    gen_device = generator.device

    def run(item: tuple[Sequence[LoraModule], list[int]]) -> dict[str, Tensor]:
        mods, sds = item
        return work(mods, [torch.Generator(device=gen_device).manual_seed(s) for s in sds])

    workers = min(torch.get_num_threads(), len(items)) if device.type == "cpu" else 1
    with _one_thread():
        if workers <= 1:
            outs = [run(it) for it in items]
        else:
            with ThreadPoolExecutor(workers) as pool:
                outs = list(pool.map(run, items))
    child: dict[str, Tensor] = {}
    for out in outs:
        child.update(out)
    return child


def _sum_to_rank(
    parents: Sequence[AdapterState],
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    weights: Sequence[float],
    drop_p: float | None = None,
) -> dict[str, Tensor]:
    """Child with ``ΔW_c`` = best rank-r approximation of ``Σ_i w_i B_i A_i`` per module (stacked factors, exact).

    With ``drop_p`` (DARE, two parents) every factor is first multiplied by a keep-mask: per module, one float32
    ``u ~ U[0, 1)`` of B's shape then one of A's shape from the module's generator, each giving parent 1's and
    parent 2's masks through :func:`dare_mask_pair` (the ``1/(1−p)`` rescale is left to the weights). Dead components regrow from the module's generator afterwards. Modules whose ΔW is zero
    in every parent are copied from parent 1.
    """
    ref = parents[0]
    dtype = ref[modules[0].a_key].dtype
    device = ref[modules[0].a_key].device
    cdt = compute_dtype(dtype)
    k = len(parents)

    def work(chunk: Sequence[LoraModule], gens: list[torch.Generator]) -> dict[str, Tensor]:
        # each module's factors side by side, [B₁|…|B_k] (d_out × k·r) and [A₁;…;A_k] (k·r × d_in), in a reused
        # per-thread arena: one Gram GEMM and one output GEMM per side instead of k² and k
        r = ref[chunk[0].a_key].shape[0]
        need = sum(k * r * (ref[m.b_key].shape[0] + ref[m.a_key].shape[1]) for m in chunk)
        arena = _workspace(need, cdt, device, tag="stack")
        offset = 0
        cats: list[tuple[Tensor, Tensor]] = []
        for m, g in zip(chunk, gens, strict=True):
            d_out, d_in = ref[m.b_key].shape[0], ref[m.a_key].shape[1]
            Bcat = arena[offset : offset + d_out * k * r].view(d_out, k * r)
            offset += d_out * k * r
            Acat = arena[offset : offset + k * r * d_in].view(k * r, d_in)
            offset += k * r * d_in
            facs = [_factors(p, m, cdt) for p in parents]
            if drop_p is None:
                for i, (A, B) in enumerate(facs):
                    Bcat[:, i * r : (i + 1) * r].copy_(B)
                    Acat[i * r : (i + 1) * r].copy_(A)
            else:  # one uniform per factor entry gives both parents' masks (dare_mask_pair); B first, then A
                for f, cat in ((1, Bcat), (0, Acat)):
                    x1, x2 = facs[0][f], facs[1][f]
                    u = _workspace(x1.numel(), torch.float32, device, tag="u").view(x1.shape)
                    tmp = _workspace(x1.numel(), cdt, device, tag="tmp").view(x1.shape)
                    d1, d2 = (cat[:, :r], cat[:, r:]) if f == 1 else (cat[:r], cat[r:])
                    u.uniform_(generator=g)
                    # float masks, same values as dare_mask_pair: m₁ = [u ≥ p], m₂ = [u ≥ p²] − m₁ + [u ≥ 2p − p²]
                    torch.ge(u, drop_p, out=d1)
                    torch.ge(u, drop_p * drop_p, out=d2)
                    torch.ge(u, 2.0 * drop_p - drop_p * drop_p, out=tmp)
                    d2.sub_(d1).add_(tmp).mul_(x2)
                    d1.mul_(x1)
            cats.append((Bcat, Acat))
        omega = torch.tensor(weights, dtype=torch.float64, device=device).repeat_interleave(r)
        XB, S, XA, GB, GA = _core([[Bc] for Bc, _ in cats], [[Ac] for _, Ac in cats], omega)
        zero = torch.ones(GB.shape[0], dtype=torch.bool, device=GB.device)
        for i in range(k):
            blk = slice(i * r, (i + 1) * r)
            zero &= _is_zero(GB[:, blk, blk]) | _is_zero(GA[:, blk, blk])
        S_r = S[:, :r]
        dead = dead_components(S_r, width=k * r) | (S_r <= 0)
        root = torch.where(dead, torch.zeros_like(S_r), S_r.clamp(min=0).sqrt())
        YB = XB[:, :, :r] * root.unsqueeze(-2)
        YA = XA[:, :, :r] * root.unsqueeze(-2)
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                _copy_module(child, ref, m)
                continue
            Bc, Ac = cats[j]
            child[m.a_key], child[m.b_key] = _emit([Bc], [Ac], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return _ordered(_map_modules(modules, generator, device, work, lambda m: ref[m.a_key].shape[0]), ref)


def _single_svd(
    parent: AdapterState,
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    modify: Callable[[Tensor, Tensor, list[torch.Generator]], tuple[Tensor, Tensor | None, Tensor | None]],
) -> dict[str, Tensor]:
    """Per module: exact SVD ``B·A = U diag(S) Vᵀ``, then ``(S', R_U, R_V) = modify(S, live, generators)`` and the
    child ``B' = U R_U diag(√S')``, ``A' = diag(√S') (V R_V)ᵀ`` (``R`` None = identity).

    ``modify`` gets a chunk's ``S [m, r]``, the live mask ``S > 0`` (numerically) and the modules' generators; it
    must draw module ``j``'s randomness from ``generators[j]`` only. Dead components of ``S'`` regrow (from the
    module's generator, after ``modify``'s draws); modules with ``ΔW = 0`` are copied.
    """
    dtype = parent[modules[0].a_key].dtype
    device = parent[modules[0].a_key].device
    cdt = compute_dtype(dtype)

    def work(chunk: Sequence[LoraModule], gens: list[torch.Generator]) -> dict[str, Tensor]:
        facs = [_factors(parent, m, cdt) for m in chunk]
        XB, S, XA, GB, GA = _core([[B] for _, B in facs], [[A] for A, _ in facs])
        r = S.shape[-1]
        zero = _is_zero(GB) | _is_zero(GA)
        live = ~(dead_components(S, width=r) | (S <= 0))
        S2, RU, RV = modify(S, live, gens)
        if RU is not None:
            XB = XB @ RU
        if RV is not None:
            XA = XA @ RV
        dead = dead_components(S2, width=r) | (S2 <= 0)
        root = torch.where(dead, torch.zeros_like(S2), S2.clamp(min=0).sqrt())
        YB = XB * root.unsqueeze(-2)
        YA = XA * root.unsqueeze(-2)
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                _copy_module(child, parent, m)
                continue
            A, B = facs[j]
            child[m.a_key], child[m.b_key] = _emit([B], [A], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return _ordered(
        _map_modules(modules, generator, device, work, lambda m: parent[m.a_key].shape[0]), parent
    )


def _cayley(Kskew: Tensor, eps: float) -> Tensor:
    """Exact rotation ``(I − εK/2)⁻¹ (I + εK/2)`` of a skew-symmetric ``K`` (batched, float64)."""
    eye = torch.eye(Kskew.shape[-1], dtype=Kskew.dtype, device=Kskew.device).expand_as(Kskew)
    half = 0.5 * eps * Kskew
    return torch.linalg.solve(eye - half, eye + half)


def _noise(X: Tensor, eps: float, generator: torch.Generator) -> Tensor:
    """``X + ε·std(X)·Z`` with ``Z ~ N(0, 1)`` (``std`` the tensor's unbiased std; 0 for a constant tensor)."""
    cdt = compute_dtype(X.dtype)
    Xc = X.to(cdt)
    std = Xc.std() if Xc.numel() > 1 else torch.zeros((), dtype=cdt, device=X.device)
    Z = torch.randn(X.shape, generator=generator, dtype=cdt, device=X.device)
    return Z.mul_(eps * std).add_(Xc).to(X.dtype)


def dare_drop(x: Tensor, p: float, generator: torch.Generator) -> Tensor:
    """DARE's drop-and-rescale ``D(x) = x ⊙ M / (1 − p)`` with ``M_ij ~ Bernoulli(1 − p)`` i.i.d.

    ``M_ij = [u_ij ≥ p]`` for ``u ~ U[0, 1)`` (float32, one draw per entry in ``x``'s memory order) from
    ``generator``, so ``E[D(x)] = x``; survivors are exactly ``x/(1 − p)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"drop probability p must be in [0, 1), got {p}")
    if p == 0.0:
        return x.clone()
    u = torch.empty(x.shape, dtype=torch.float32, device=x.device).uniform_(generator=generator)
    if x.dtype == torch.float32:
        return u.ge_(p).mul_(x).div_(1.0 - p)
    return (x * (u >= p)).div_(1.0 - p)


def dare_mask_pair(u: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """Two independent ``Bernoulli(1 − p)`` keep-masks from ONE uniform ``u ~ U[0, 1)``.

    ``m₁ = [u ≥ p]``; given ``m₁``, the residual ``(u − p)/(1 − p)`` (kept) or ``u/p`` (dropped) is again
    ``U[0, 1)`` and independent of ``m₁``, and ``m₂ = [residual ≥ p]`` simplifies to
    ``m₂ = [u ≥ 2p − p²] ∨ [p² ≤ u < p]``: ``P(m₂) = 1 − p`` and ``P(m₁ ∧ m₂) = (1 − p)²``. Exact up to the
    float32 grid of ``u`` (2⁻²⁴), it halves the random numbers DARE draws (the RNG is a serial kernel).
    """
    m1 = u >= p
    m2 = (u >= 2.0 * p - p * p).logical_or_((u >= p * p).logical_and_(u < p))
    return m1, m2


# ---------------------------------------------------------------------------------------- mutations


@register_operator("svd_mutation", family="mutation", arity=1, defaults={"epsilon": 0.1}, default_pool=True)
def svd_mutation(parents, modules, generator, *, epsilon: float):
    """M1 spectral mutation on ΔW's SVD: log-normal singular values and small exact rotations.

    Per module, with ``B·A = U diag(S) Vᵀ`` (exact, :mod:`evolution.lowrank`)::

        S' = S ⊙ exp(ε z),          z ~ N(0, I_r)
        U' = U R_U,  V' = V R_V,    R = (I − εK/2)⁻¹ (I + εK/2),  K = (G − Gᵀ)/2,  G ~ N(0, 1)^{r×r}
        B' = U' diag(√S'),  A' = diag(√S') V'ᵀ

    The Cayley transform makes ``R`` exactly orthogonal (lucidrains' ``I + ε·skew(G)`` is only first-order
    orthogonal); it equals ``I + εK + O(ε²)``. Rotations act only among live components (``S_i > 0``): dead
    components have no defined singular vectors and stay dead (then regrow as fresh LoRA components). With
    ``epsilon = 0`` the child's ΔW equals the parent's. Module ``j`` draws ``z``, ``G_U``, ``G_V`` (float64) from
    its own generator.
    """

    def modify(S, live, gens):
        m, r = S.shape
        z = torch.stack([torch.randn(r, generator=g, dtype=torch.float64, device=g.device) for g in gens])
        GU, GV = [], []
        for g in gens:
            GU.append(torch.randn((r, r), generator=g, dtype=torch.float64, device=g.device))
            GV.append(torch.randn((r, r), generator=g, dtype=torch.float64, device=g.device))
        GU = torch.stack(GU).to(S.device)
        GV = torch.stack(GV).to(S.device)
        pair = (live.unsqueeze(-1) & live.unsqueeze(-2)).to(torch.float64)
        KU = 0.5 * (GU - GU.mT) * pair
        KV = 0.5 * (GV - GV.mT) * pair
        S2 = S * torch.exp(epsilon * z.to(S.device))
        return S2, _cayley(KU, epsilon), _cayley(KV, epsilon)

    return _single_svd(parents[0], modules, generator, modify)


@register_operator(
    "layer_mutation",
    family="mutation",
    arity=1,
    defaults={"epsilon": 0.1, "fraction": 0.33},
    default_pool=True,
)
def layer_mutation(parents, modules, generator, *, epsilon: float, fraction: float):
    """M2 layer-selective Gaussian noise on the factors of a random subset of modules.

    Choose ``n = max(1, ⌊f·L⌋)`` of the ``L`` modules uniformly without replacement (``randperm``, the operator's
    first draw); on those only::

        A' = A + ε·std(A)·Z_A,   B' = B + ε·std(B)·Z_B,   Z ~ N(0, 1) entrywise (module's generator, A then B)

    (``std`` = the tensor's own unbiased std, so the noise is relative to each factor's scale). Other modules
    are bitwise copies. Acts on the factors (ΔW changes by ``ε(std(B) Z_B A + std(A) B Z_A) + O(ε²)``). A factor
    with zero std (an untrained ``B = 0``) gets no noise, and noise on A alone leaves ΔW = 0 there.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"layer_mutation: fraction must be in [0, 1], got {fraction}")
    parent = parents[0]
    n = max(1, math.floor(fraction * len(modules)))
    chosen = set(torch.randperm(len(modules), generator=generator, device=generator.device)[:n].tolist())
    picked = [m for i, m in enumerate(modules) if i in chosen]
    child: dict[str, Tensor] = {}
    for i, m in enumerate(modules):
        if i not in chosen:
            _copy_module(child, parent, m)
    if picked:
        child.update(_noise_modules(parent, picked, generator, epsilon))
    return _ordered(child, parent)


def _noise_modules(parent, modules, generator, epsilon) -> dict[str, Tensor]:
    device = parent[modules[0].a_key].device

    def work(chunk, gens):
        out = {}
        for m, g in zip(chunk, gens, strict=True):
            out[m.a_key] = _noise(parent[m.a_key], epsilon, g)
            out[m.b_key] = _noise(parent[m.b_key], epsilon, g)
        return out

    return _map_modules(modules, generator, device, work)


@register_operator("component_mask", family="mutation", arity=1, defaults={"rho": 0.3}, default_pool=True)
def component_mask(parents, modules, generator, *, rho: float):
    """M3 component masking: zero ``⌈ρ·r⌉`` uniformly chosen singular components of each module's ΔW.

    ``B·A = U diag(S) Vᵀ``; ``S'_i = 0`` for a random index set of size ``⌈ρr⌉`` (drawn among all ``r`` indices,
    per module: the ``⌈ρr⌉`` smallest of ``r`` uniform scores from the module's generator), else ``S'_i = S_i``;
    refactor ``B' = U diag(√S')``, ``A' = diag(√S') Vᵀ``. The masked components come back as dead LoRA
    components (B column 0, fresh A row) — nominal rank kept, effective rank lower, and able to regrow.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"component_mask: rho must be in [0, 1], got {rho}")

    def modify(S, live, gens):
        m, r = S.shape
        n_mask = min(r, math.ceil(rho * r))
        scores = torch.stack([torch.rand(r, generator=g, dtype=torch.float64, device=g.device) for g in gens])
        idx = scores.to(S.device).argsort(dim=-1)[:, :n_mask]
        keep = torch.ones_like(S).scatter_(-1, idx, 0.0)
        return S * keep, None, None

    return _single_svd(parents[0], modules, generator, modify)


@register_operator(
    "adaptive_noise", family="mutation", arity=1, defaults={"epsilon": 0.15}, default_pool=True
)
def adaptive_noise(parents, modules, generator, *, epsilon: float):
    """M4 full-tensor adaptive Gaussian noise: M2 on every module.

    ``A' = A + ε·std(A)·Z_A``, ``B' = B + ε·std(B)·Z_B`` for every module (noise relative to each tensor's own
    std; a zero-std tensor gets none; ``Z`` from the module's generator, A then B). Acts on the factors.
    """
    return _ordered(_noise_modules(parents[0], modules, generator, epsilon), parents[0])


# ---------------------------------------------------------------------------------------- crossovers


@register_operator(
    "dare", family="crossover", arity=2, defaults={"p": 0.7, "space": "delta"}, default_pool=True
)
def dare(parents, modules, generator, *, p: float, space: str):
    """X1 DARE crossover: drop-and-rescale each parent, then average.

    ``D(X) = X ⊙ M / (1 − p)``, ``M ~ Bernoulli(1 − p)`` i.i.d. (:func:`dare_drop`), independent masks for every
    factor of every parent.

    * ``space="delta"`` (default): ``ΔW_c = ½(D(B₁)D(A₁) + D(B₂)D(A₂))`` exactly, truncated to rank r via the
      stacked factors. Independent masks on A and B keep ``E[D(B)D(A)] = BA``, so ``E[ΔW_c]`` (before truncation)
      is ``½(ΔW₁ + ΔW₂)``. The ``1/(1 − p)`` of both factors is folded into the weights (``½/(1 − p)²``).
    * ``space="factor"``: ``A_c = ½(D(A₁) + D(A₂))``, ``B_c = ½(D(B₁) + D(B₂))`` (lucidrains' X1; its ΔW has the
      cross terms ``D(B_i)D(A_j)``).

    Randomness (reproducible): module ``j`` has its own generator (seeded from the operator's generator, see
    ``_map_modules``) and draws one float32 uniform of B's shape, then one of A's shape; each yields the two
    parents' independent masks via :func:`dare_mask_pair` (half the random numbers of one draw per mask entry).
    """
    space = _space(space)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dare: p must be in [0, 1), got {p}")
    if space == "delta":
        if p == 0.0:
            return _sum_to_rank(parents, modules, generator, (0.5, 0.5))
        w = 0.5 / (1.0 - p) ** 2
        return _sum_to_rank(parents, modules, generator, (w, w), drop_p=p)
    ref = parents[0]
    device = ref[modules[0].a_key].device

    def work(chunk, gens):
        out = {}
        for m, g in zip(chunk, gens, strict=True):
            cdt = compute_dtype(ref[m.a_key].dtype)
            for key in (m.b_key, m.a_key):  # same draws as the delta space: B's uniform, then A's
                u = torch.empty(ref[key].shape, dtype=torch.float32, device=device).uniform_(generator=g)
                m1, m2 = dare_mask_pair(u, p)
                x1, x2 = parents[0][key].to(cdt), parents[1][key].to(cdt)
                acc = (x1 * m1).add_(x2 * m2).div_(2.0 * (1.0 - p))
                out[key] = acc.to(ref[key].dtype)
        return out

    return _ordered(_map_modules(modules, generator, device, work), ref)


@register_operator("layer_crossover", family="crossover", arity=2, defaults={}, default_pool=True)
def layer_crossover(parents, modules, generator):
    """X2 module-wise crossover: ``(A_m, B_m) ← parent π_m``'s raw factors, ``π_m ~ U{1, 2}`` per module.

    Exact: each child module's ΔW equals one parent's, bitwise. One draw of ``L`` bits (``randint``).
    """
    pick = torch.randint(0, 2, (len(modules),), generator=generator, device=generator.device).tolist()
    child: dict[str, Tensor] = {}
    for m, i in zip(modules, pick, strict=True):
        _copy_module(child, parents[i], m)
    return _ordered(child, parents[0])


@register_operator(
    "svd_crossover", family="crossover", arity=2, defaults={"mode": "index"}, default_pool=True
)
def svd_crossover(parents, modules, generator, *, mode: str):
    """X3 SVD-subspace crossover: leading singular triplets from parent 1, the rest from parent 2.

    Per module, with ``B_p A_p = U_p diag(S_p) V_pᵀ`` (exact) and a split ``k ~ U{1, …, r−1}`` (``U{0, 1}`` when
    ``r = 1``: the child takes one parent's only component; drawn from the module's generator)::

        ΔW_c = Σ_{i≤k} S₁ᵢ u₁ᵢ v₁ᵢᵀ + Σ_{i>k} S₂ⱼ₍ᵢ₎ u₂ⱼ₍ᵢ₎ v₂ⱼ₍ᵢ₎ᵀ,
        j(i) = i ("index", default: parent 2's triplets k+1..r)  or  i − k ("top": parent 2's top r − k)

    refactored component-wise with √S (``B_c[:, i] = √S u``, ``A_c[i] = √S vᵀ``). Components with ``S = 0`` regrow.
    """
    if mode not in ("index", "top"):
        raise ValueError(f"svd_crossover: mode must be 'index' or 'top', got {mode!r}")
    ref = parents[0]
    dtype = ref[modules[0].a_key].dtype
    device = ref[modules[0].a_key].device
    cdt = compute_dtype(dtype)

    def work(chunk, gens):
        facs = [[_factors(p, m, cdt) for p in parents] for m in chunk]
        # [2m, r, r], order (module, parent)
        XB, S, XA, GB, GA = _core([[B] for f in facs for _, B in f], [[A] for f in facs for A, _ in f])
        nm, r = len(chunk), S.shape[-1]
        XB, XA, S = XB.view(nm, 2, r, r), XA.view(nm, 2, r, r), S.view(nm, 2, r)
        zero = (_is_zero(GB) | _is_zero(GA)).view(nm, 2).all(-1)
        lo, hi = (1, r) if r > 1 else (0, 2)
        k = torch.tensor(
            [int(torch.randint(lo, hi, (), generator=g, device=g.device)) for g in gens], device=S.device
        )
        idx = torch.arange(r, device=S.device).expand(nm, r)
        from1 = idx < k.unsqueeze(-1)
        src2 = idx if mode == "index" else (idx - k.unsqueeze(-1)).clamp(min=0)
        Sc = torch.where(from1, S[:, 0], S[:, 1].gather(-1, src2))
        dead = dead_components(Sc, width=r) | (Sc <= 0)
        root = torch.where(dead, torch.zeros_like(Sc), Sc.clamp(min=0).sqrt())
        g2 = src2.unsqueeze(-2).expand(nm, r, r)
        cols1 = (from1 & ~dead).to(torch.float64) * root
        cols2 = (~from1 & ~dead).to(torch.float64) * root
        YB = torch.cat(
            [XB[:, 0] * cols1.unsqueeze(-2), XB[:, 1].gather(-1, g2) * cols2.unsqueeze(-2)], dim=-2
        )
        YA = torch.cat(
            [XA[:, 0] * cols1.unsqueeze(-2), XA[:, 1].gather(-1, g2) * cols2.unsqueeze(-2)], dim=-2
        )
        child: dict[str, Tensor] = {}
        for j, m in enumerate(chunk):
            if bool(zero[j]):
                _copy_module(child, ref, m)
                continue
            (A1, B1), (A2, B2) = facs[j]
            child[m.a_key], child[m.b_key] = _emit([B1, B2], [A1, A2], YB[j], YA[j], dead[j], gens[j], dtype)
        return child

    return _ordered(_map_modules(modules, generator, device, work, lambda m: ref[m.a_key].shape[0]), ref)


@register_operator(
    "extrapolate",
    family="crossover",
    arity=2,
    defaults={"eta_min": 1.0, "eta_max": 1.5, "eta": None, "space": "delta"},
    default_pool=True,
)
def extrapolate(
    parents, modules, generator, *, eta_min: float, eta_max: float, eta: float | None, space: str
):
    """X4 extrapolative combination: a step from parent 1 through the fitter parent 2 and beyond.

    ``η ~ U[η_min, η_max]`` once per child (the operator's first draw), or the fixed ``eta``;

    * ``space="delta"`` (default): ``ΔW_c = (1 − η)ΔW₁ + ηΔW₂`` exactly, truncated to rank r (stacked factors);
    * ``space="factor"``: ``A_c = A₁ + η(A₂ − A₁)``, ``B_c = B₁ + η(B₂ − B₁)`` (lucidrains' X4, with cross terms).
    """
    space = _space(space)
    if eta is None:
        if eta_max < eta_min:
            raise ValueError(f"extrapolate: eta_max ({eta_max}) < eta_min ({eta_min})")
        u = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)
        eta = float(eta_min + (eta_max - eta_min) * u)
    eta = float(eta)
    if space == "delta":
        return _sum_to_rank(parents, modules, generator, (1.0 - eta, eta))
    return _factor_linear(parents, modules, (1.0 - eta, eta))


def _factor_linear(parents, modules, weights: Sequence[float]) -> dict[str, Tensor]:
    """``A_c = Σ w_i A_i``, ``B_c = Σ w_i B_i`` (factor space)."""
    ref = parents[0]
    child: dict[str, Tensor] = {}
    for m in modules:
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        for key in (m.a_key, m.b_key):
            acc = parents[0][key].to(cdt) * weights[0]
            for w, par in zip(weights[1:], parents[1:], strict=True):
                acc.add_(par[key].to(cdt), alpha=w)
            child[key] = acc.to(dtype)
    return _ordered(child, ref)


@register_operator(
    "task_arithmetic", family="crossover", arity=2, defaults={"weights": (1.0, 1.0), "space": "delta"}
)
def task_arithmetic(parents, modules, generator, *, weights: tuple[float, ...], space: str):
    """Task arithmetic (Ilharco et al. 2023): ``ΔW_c = Σ_i w_i ΔW_i``, truncated to rank r.

    Default weights ``(1, 1)`` [D] (PEFT's ``task_arithmetic``, λ folded into the weights).

    * ``space="delta"`` (default): exact sum via the stacked factors, best rank-r approximation.
    * ``space="factor"``: PEFT ``add_weighted_adapter(combination_type="task_arithmetic")`` semantics:
      ``A_c = Σ sign(w_i)√|w_i| A_i``, ``B_c = Σ √|w_i| B_i`` (with cross terms ``√|w_i w_j| B_i A_j``).
    """
    space = _space(space)
    weights = _weights(weights, len(parents), "task_arithmetic")
    if space == "delta":
        return _sum_to_rank(parents, modules, generator, weights)
    return _factor_signed_sqrt(parents, modules, weights, lambda stack, w: (stack * w).sum(0))


def _factor_signed_sqrt(
    parents, modules, weights, merge: Callable[[Tensor, Tensor], Tensor]
) -> dict[str, Tensor]:
    """PEFT's element-wise combination of factors: A weighted by ``sign(w)√|w|``, B by ``√|w|``, then merged."""
    ref = parents[0]
    child: dict[str, Tensor] = {}
    for m in modules:
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        dev = ref[m.a_key].device
        wa = torch.tensor([math.copysign(math.sqrt(abs(w)), w) for w in weights], dtype=cdt, device=dev)
        wb = torch.tensor([math.sqrt(abs(w)) for w in weights], dtype=cdt, device=dev)
        for key, w in ((m.a_key, wa), (m.b_key, wb)):
            stack = torch.stack([p[key].to(cdt) for p in parents])
            child[key] = merge(stack, w.view(-1, *([1] * (stack.ndim - 1)))).to(dtype)
    return _ordered(child, ref)


@register_operator("copy_parent", family="control", arity=1, defaults={})
def copy_parent(parents, modules, generator):
    """Control: the child is a bitwise copy of the parent's raw factors (no refactoring)."""
    return {k: v.clone() for k, v in parents[0].items()}


@register_operator("linear_0_5", family="control", arity=2, defaults={"space": "delta"})
def linear_0_5(parents, modules, generator, *, space: str):
    """Control: the midpoint ``ΔW_c = ½ΔW₁ + ½ΔW₂``.

    * ``space="delta"`` (default): exact, truncated to rank r via the stacked factors.
    * ``space="factor"``: ``A_c = ½(A₁ + A₂)``, ``B_c = ½(B₁ + B₂)`` — lucidrains' ``average`` = PEFT ``linear``
      with weights ``(¼, ¼)``; its ΔW is ``¼(B₁ + B₂)(A₁ + A₂)``, with cross terms.
    """
    space = _space(space)
    if space == "delta":
        return _sum_to_rank(parents, modules, generator, (0.5, 0.5))
    return _factor_linear(parents, modules, (0.5, 0.5))


# ---------------------------------------------------------------------------------------------- TIES


def kth_largest(x: Tensor, k: int) -> Tensor:
    """Exact ``k``-th largest value of ``x`` (flattened), ``1 ≤ k ≤ x.numel()``.

    Same value as ``torch.kthvalue(x, n − k + 1)`` but several times faster on large tensors: a deterministic
    strided sample brackets the answer, one counting pass confirms the bracket, and ``kthvalue`` runs on the few
    candidates inside it (falls back to the full ``kthvalue`` if the bracket misses).
    """
    flat = x.reshape(-1)
    n = flat.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if n <= 1 << 20:
        return torch.kthvalue(flat, n - k + 1).values
    step = max(1, n // (1 << 18))
    sample = flat[::step].clone()
    ns = sample.numel()
    q = 1.0 - k / n  # the answer sits at this quantile
    margin = 8.0 / math.sqrt(ns) + 2.0 / ns
    lo_rank = max(1, min(ns, math.floor((q - margin) * ns)))
    hi_rank = max(1, min(ns, math.ceil((q + margin) * ns)))
    lo = torch.kthvalue(sample, lo_rank).values if q - margin > 0 else None
    hi = torch.kthvalue(sample, hi_rank).values if q + margin < 1 else None
    above_hi = int(torch.count_nonzero(flat > hi)) if hi is not None else 0
    if lo is None and hi is None:
        return torch.kthvalue(flat, n - k + 1).values
    if lo is None:
        sel = flat <= hi
    else:
        sel = flat >= lo
        if hi is not None:
            sel.logical_and_(flat <= hi)
    cand = flat[sel]
    need = k - above_hi  # rank of the answer among the candidates, counted from the top
    if not 1 <= need <= cand.numel():
        return torch.kthvalue(flat, n - k + 1).values
    return torch.kthvalue(cand, cand.numel() - need + 1).values


def magnitude_trim(t: Tensor, density: float, *, inplace: bool = False) -> Tensor:
    """TIES step 1: keep the ``k = ⌊density·numel⌋`` largest-magnitude entries of ``t``, zero the rest.

    Exactly ``k`` entries survive, as in PEFT ``merge_utils.magnitude_based_pruning``; among entries whose
    magnitude equals the threshold, the first ones in memory order are kept (``torch.topk``, which PEFT uses,
    leaves that choice unspecified, so the two may differ on such ties only). ``density ≥ 1`` keeps everything,
    a ``k`` of 0 zeroes everything. ``inplace`` overwrites ``t``.
    """
    if density < 0.0:
        raise ValueError(f"density must be >= 0, got {density}")
    out = t if inplace else t.clone()
    if density >= 1.0:
        return out
    k = int(density * t.numel())
    if k == 0:
        return out.zero_()
    mag = t.abs()
    thr = kth_largest(mag, k)
    keep = mag > thr
    n_more = k - int(torch.count_nonzero(keep))
    if n_more > 0:  # entries equal to the threshold: the first n_more of them
        ties = (mag == thr).view(-1).nonzero().view(-1)[:n_more]
        keep.view(-1)[ties] = True
    return out.mul_(keep)


def ties_merge(
    taus: Sequence[Tensor],
    weights: Sequence[float],
    density: float,
    majority: str = "total",
    *,
    inplace: bool = False,
) -> Tensor:
    """TIES-merging of dense task tensors (Yadav et al. 2023), PEFT ``merge_utils.ties`` semantics.

    ``τ̂_i = trim(τ_i, density)``; elected sign ``γ = sign(Σ_i τ̂_i)`` (``"total"``) or ``sign(Σ_i sign τ̂_i)``
    (``"frequency"``), ``+`` on ties; ``mask_i = [sign(τ̂_i) = γ]``; result
    ``Σ_i w_i τ̂_i mask_i / max(1, Σ_i mask_i)`` (disjoint mean; weights applied after the election, as PEFT).
    ``inplace`` lets it overwrite the ``taus`` (saves memory on big modules).
    """
    if majority not in ("total", "frequency"):
        raise ValueError(f"majority must be 'total' or 'frequency', got {majority!r}")
    trimmed = [magnitude_trim(t, density, inplace=inplace) for t in taus]
    # Large modules: every fresh 272 MB tensor costs ~0.5 s of page faults here, so the result is built in the
    # storage of the (owned) trimmed tensors and the elected-sign tensor, with one extra float buffer.
    if majority == "total":
        gamma = trimmed[0].clone()
        for t in trimmed[1:]:
            gamma.add_(t)
    else:
        gamma = trimmed[0].sign()
        for t in trimmed[1:]:
            gamma.add_(t.sign())
    gamma = gamma.ge_(0).mul_(2).sub_(1)  # elected sign γ = ±1
    for t in trimmed:
        t.mul_(gamma).clamp_(min=0)  # |τ̂| where sign(τ̂) = γ, else 0
    count = trimmed[0].sign()  # 1 where it agrees (values are >= 0 now), else 0
    for t in trimmed[1:]:
        count.add_(t.sign())
    num = trimmed[0].mul_(float(weights[0]))
    for t, w in zip(trimmed[1:], weights[1:], strict=True):
        num.add_(t, alpha=float(w))
    return num.div_(gamma.mul_(count.clamp_(min=1.0)))  # γ = ±1: dividing by γ·n is multiplying by γ/n


def _topr_dense(
    M: Tensor,
    r: int,
    *,
    method: str,
    init: Tensor | None,
    niter: int,
    oversample: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``r`` SVD triplets of a dense ``M``: ``"dense"`` = full ``torch.linalg.svd``; ``"randomized"`` = block
    subspace iteration started from ``init`` (the parents' row spaces) plus ``oversample`` Gaussian columns,
    ``niter`` power iterations, then an exact SVD of the projected ``c×d_in`` matrix."""
    if method == "dense":
        U, S, Vh = torch.linalg.svd(M, full_matrices=False)
        return U[:, :r], S[:r], Vh[:r].mT
    if method != "randomized":
        raise ValueError(f"ties: svd must be 'dense' or 'randomized', got {method!r}")
    d_in = M.shape[1]
    cols = [] if init is None else [init]
    if oversample > 0 or init is None:
        cols.append(
            torch.randn((d_in, max(oversample, r)), generator=generator, dtype=M.dtype, device=M.device)
        )
    omega = torch.cat(cols, dim=1)
    Q = torch.linalg.qr(M @ omega).Q
    for _ in range(niter):
        Q = torch.linalg.qr(M.mT @ Q).Q
        Q = torch.linalg.qr(M @ Q).Q
    Us, S, Vh = torch.linalg.svd(Q.mT @ M, full_matrices=False)
    return Q @ Us[:, :r], S[:r], Vh[:r].mT


TIES_TIMINGS: dict[str, float] = {}
"""Seconds of the last ``ties`` call: ``dense`` (ΔW products), ``merge`` (trim/elect/merge), ``svd`` (truncation)."""


@register_operator(
    "ties",
    family="crossover",
    arity=2,
    defaults={
        "density": 0.5,
        "weights": (1.0, 1.0),
        "majority": "total",
        "space": "delta",
        "svd": "randomized",
        "niter": 1,
        "oversample": 16,
    },
)
def ties(
    parents,
    modules,
    generator,
    *,
    density: float,
    weights: tuple[float, ...],
    majority: str,
    space: str,
    svd: str,
    niter: int,
    oversample: int,
):
    """TIES-merging (trim, elect sign, disjoint merge; Yadav et al. 2023) of the parents' ΔW, back to rank r.

    * ``space="delta"`` (default): per module, the dense ``τ_i = B_i A_i`` (one module at a time, never the whole
      adapter), ``M = ties_merge(τ, weights, density)`` (PEFT ``merge_utils.ties`` semantics; defaults density 0.5
      [D], weights (1, 1) = disjoint mean), then the top-``r`` SVD of ``M`` refactored with √S. TIES is defined
      entrywise on ΔW, so the dense matrix is unavoidable; the truncation is either ``svd="dense"`` (exact full
      SVD: 26 s for an 18944×3584 module, 80 s for a 3584×18944 one, on the 2-core dev box) or
      ``svd="randomized"`` (default: subspace iteration started from the parents' row spaces ``[A₁ᵀ|A₂ᵀ]`` +
      ``oversample`` Gaussian columns, ``niter`` = 1 power iteration, then an exact SVD of the ``c×d_in``
      projection: ~0.9 s for those modules). Measured on such a
      module, the randomized residual ``‖M − M_r‖`` equals the optimal (dense) one to 1e-7 relative and ``M_r``
      is within 3e-5 of the dense truncation (niter 0: 7e-6 / 4e-3); the tests and the benchmark check it.
      Either way this is the slow operator (minutes per 7B child): exempt from the speed target.
    * ``space="factor"``: PEFT ``add_weighted_adapter(combination_type="ties")`` semantics on the factors:
      ``ties_merge`` of the A's (weighted ``sign(w)√|w|``) and of the B's (weighted ``√|w|``) separately, with
      cross terms in the product; no SVD.
    """
    space = _space(space)
    weights = _weights(weights, len(parents), "ties")
    ref = parents[0]
    if space == "factor":
        return _factor_signed_sqrt(
            parents,
            modules,
            weights,
            lambda stack, w: ties_merge(list(stack), w.reshape(-1).tolist(), density, majority),
        )
    # big dense modules: one at a time with torch's intra-op threads (these GEMMs and elementwise passes do
    # parallelise), each module with its own generator as in ``_map_modules``
    seeds = _module_seeds(generator, len(modules))
    t_dense = t_merge = t_svd = 0.0
    child: dict[str, Tensor] = {}
    for m, seed in zip(modules, seeds, strict=True):
        gen = torch.Generator(device=generator.device).manual_seed(seed)
        dtype = ref[m.a_key].dtype
        cdt = compute_dtype(dtype)
        facs = [_factors(p, m, cdt) for p in parents]
        r = facs[0][0].shape[0]
        if all(bool((A == 0).all()) or bool((B == 0).all()) for A, B in facs):
            _copy_module(child, ref, m)
            continue
        t0 = time.perf_counter()
        taus = [B @ A for A, B in facs]
        t1 = time.perf_counter()
        M = ties_merge(taus, weights, density, majority, inplace=True)
        del taus
        t2 = time.perf_counter()
        init = torch.cat([A.mT for A, _ in facs], dim=1)
        U, S, V = _topr_dense(M, r, method=svd, init=init, niter=niter, oversample=oversample, generator=gen)
        del M
        t3 = time.perf_counter()
        t_dense, t_merge, t_svd = t_dense + t1 - t0, t_merge + t2 - t1, t_svd + t3 - t2
        dead = dead_components(S, width=r) | (S <= 0)
        root = torch.where(dead, torch.zeros_like(S), S.clamp(min=0).sqrt())
        B = U * root
        A = (V * root).mT.contiguous()
        if bool(dead.any()):
            _regrow(A, dead, gen)
        child[m.a_key], child[m.b_key] = A.to(dtype), B.to(dtype)
    TIES_TIMINGS.clear()
    TIES_TIMINGS.update(dense=t_dense, merge=t_merge, svd=t_svd)
    return _ordered(child, ref)
