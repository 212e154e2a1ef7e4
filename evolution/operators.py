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
  (docs/method.md §8.4.2). A module whose ΔW is identically 0 in every parent (e.g. an untrained ``B = 0``)
  is returned as a copy of parent 1's raw factors by these operators;
* ``space="delta"`` (default) applies a combination to ΔW exactly — no ``B_i A_j`` cross terms — and truncates
  to rank ``r`` (Eckart–Young, via the stacked factors, never forming ΔW); ``space="factor"`` applies it to the
  A and B factors separately (lucidrains/populora and PEFT ``add_weighted_adapter`` semantics), which is cheaper
  but mixes the non-identifiable bases of the parents (``(ΣB_i)(ΣA_i)`` contains ``B_i A_j``).

Operators (defaults from docs/method.md §8 / §12; ``[D]`` = this project's choice):

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

Gram precision (SVD-based operators): float32 Grams with a float64 fallback by default; for float64 throughout,
``with gram_precision("float64"): ...`` or ``op(..., gram_precision="float64")`` (:mod:`evolution.gram`).

Where things live (this module re-exports the public names): :mod:`evolution.registry` (the :class:`Operator`
record and the registry), :mod:`evolution.keys` (LoRA key parsing, modules), :mod:`evolution.parallel`
(per-module generators, thread pool), :mod:`evolution.gram` (Gram precision, stacked factors, exact SVD maps,
refactoring), :mod:`evolution.factor_space`, :mod:`evolution.mutations`, :mod:`evolution.crossovers`,
:mod:`evolution.controls`, :mod:`evolution.ties`. Importing this module registers the built-in operators.
"""

from __future__ import annotations

# importing the operator modules registers the built-ins
from evolution.controls import copy_parent, linear_0_5
from evolution.crossovers import (
    dare,
    dare_drop,
    dare_mask_pair,
    extrapolate,
    layer_crossover,
    svd_crossover,
    task_arithmetic,
)
from evolution.gram import FP32_GRAM_MIN_RATIO, GRAM_STATS, current_gram_precision, gram_precision
from evolution.keys import AdapterState, LoraModule, lora_modules
from evolution.mutations import adaptive_noise, component_mask, layer_mutation, svd_mutation
from evolution.parallel import CHUNK
from evolution.registry import (
    FAMILIES,
    Operator,
    UnknownOperatorError,
    get_operator,
    list_operators,
    register_operator,
    unregister_operator,
)
from evolution.ties import TIES_TIMINGS, kth_largest, magnitude_trim, ties, ties_merge

__all__ = [
    "CHUNK",
    "FAMILIES",
    "FP32_GRAM_MIN_RATIO",
    "GRAM_STATS",
    "TIES_TIMINGS",
    "AdapterState",
    "LoraModule",
    "Operator",
    "UnknownOperatorError",
    "adaptive_noise",
    "component_mask",
    "copy_parent",
    "current_gram_precision",
    "dare",
    "dare_drop",
    "dare_mask_pair",
    "extrapolate",
    "get_operator",
    "gram_precision",
    "kth_largest",
    "layer_crossover",
    "layer_mutation",
    "linear_0_5",
    "list_operators",
    "lora_modules",
    "magnitude_trim",
    "register_operator",
    "svd_crossover",
    "svd_mutation",
    "task_arithmetic",
    "ties",
    "ties_merge",
    "unregister_operator",
]
