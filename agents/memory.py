"""Memory of a model's parts, estimated from its configuration alone, and measured on any device.

**Shape** (:func:`model_shape`): the model is built from its configuration on PyTorch's ``meta`` device (shapes,
no storage, no weights read), which gives its parameter count and every ``nn.Linear``'s ``(in, out)``, hence
the parameters of a LoRA adapter of rank r on the target modules: ``sum r * (in + out)``. The configuration
comes from ``agents/shapes/<shape>.json`` for ``random:<shape>``, the built-in names and the hub ids a shape
lists (``_hub_ids``: so a GPU preset's plan needs no download), else from a local model directory.

**Activations of one forward/backward pass** of the trainer's update (:func:`activation_bytes`): a pass of
``T`` token slots (``agents.forward``: the packed row) with ``n`` of them through the LM head at a time
(``min(logprob_chunk_size, completion tokens)``), compute element size ``e`` (2 for bf16, 4 for fp32), hidden
``h``, MLP width ``f``, ``q = heads x head_dim``, ``kv = kv_heads x head_dim``, rank ``r`` on ``m`` modules
per layer, ``L`` layers, vocabulary ``V``. What one decoder layer keeps per token for its backward pass
(frozen base weights, the fused LoRA of ``agents.population``, tree or flex attention, which keep no
``T x T`` scores)::

    A = 2 (4h + e h)        each RMSNorm's float32 input and the normalised output the projections read
      + e (q + 2 kv)        the rotated queries and keys, the values (the attention's inputs)
      + 2 e kv              keys and values gathered again for the query blocks that see them (about once)
      + 2 e q + 4 heads     the attention's output, o_proj's input, the log-sum-exp per head
      + 4 e f               the MLP's gate, its activation, up, and their product
      + e r m               each LoRA module's x A^T

and the LM head, at its peak (the backward of a chunk): ``H = n V (5 x 4 + e')`` bytes, five float32
``n x V`` tensors (logits, the softmax, their gradients, the entropy's product) plus the head's own output in
the compute dtype (``e' = e`` below float32, else 0). Then::

    without checkpointing:  peak = L A T + H
    with checkpointing:     peak = L e h T + max(H, (A + G) T),   G = e (2 f + 2 h)

(checkpointing keeps each layer's input, ``e h`` per token, and recomputes one layer at a time in the backward
pass, whose gradients ``G`` live beside it; the head's backward comes first, before any layer is recomputed).
``mask`` attention adds the dense ``T x T`` mask in the compute dtype, and on CUDA the math kernel's scores
(``heads x T x T`` float32 per layer, kept for the backward pass). On CPU, tree attention hands SDPA each
block's ``n x (seen + n)`` bool mask, which its kernel keeps as a float mask per layer: ``e P`` per layer kept,
``P = sum_b n_b (seen_b + n_b)`` over the row's blocks with ancestors (:func:`block_mask_pairs`; zero on CUDA,
where the blocks take a causal bias and no mask tensor). tests/agents/test_memory.py holds the
estimate to within 20 % of the peak measured (:class:`StorageTracker`) for the same update on CPU at two row
lengths, with and without checkpointing.

**Measuring on any device** (:class:`StorageTracker`): a dispatch mode that follows every tensor storage the
code allocates inside it from its creation to its release (views and in-place results are not new storage)
and records the peak of the bytes alive: CUDA's ``max_memory_allocated`` for a CPU run (the CPU allocator
keeps no such count).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from agents.models import RANDOM_PREFIX, SMOLLM2_NAME, TINY_RANDOM_NAME, random_shapes, shape_config

__all__ = ["ModelShape", "StorageTracker", "activation_bytes", "block_mask_pairs", "dtype_bytes", "model_shape"]

_SHAPES_DIR = Path(__file__).resolve().parent / "shapes"
HEAD_FLOAT32_COPIES = 5
"""Float32 ``n x V`` tensors alive at the LM head's peak (module docstring)."""


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class ModelShape:
    """What memory estimates read of a causal LM (module docstring)."""

    name: str
    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...]
    """``(name's last component, in, out)`` of every ``nn.Linear`` of the model."""

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        """Parameters of one LoRA adapter of ``rank`` on the modules named ``targets`` (as PEFT matches them: the
        last name component)."""
        wanted = {t.rsplit(".", 1)[-1] for t in targets}
        return sum(rank * (i + o) for name, i, o in self.linears if name in wanted)

    def lora_modules_per_layer(self, targets: Sequence[str]) -> int:
        """How many of one decoder layer's linear modules carry a LoRA."""
        wanted = {t.rsplit(".", 1)[-1] for t in targets}
        return sum(1 for name, _, _ in self.linears if name in wanted) // max(1, self.layers)

    def kv_bytes_per_token(self, dtype_size: int) -> int:
        """A KV cache's bytes per token: ``L x 2 x kv_heads x head_dim x e``."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_size


def _config_dict(model: str) -> tuple[str, dict | None, str | None]:
    """``(name, architecture fields, directory)`` of ``model``: a shipped shape's fields when one stands for it,
    else the directory holding its ``config.json``."""
    if model.startswith(RANDOM_PREFIX):
        return model, shape_config(model[len(RANDOM_PREFIX):]), None
    if model == SMOLLM2_NAME:
        return model, shape_config("smollm2-135m"), None
    for shape in random_shapes():
        ids = json.loads((_SHAPES_DIR / f"{shape}.json").read_text()).get("_hub_ids", [])
        if model in ids:
            return model, shape_config(shape), None
    if model == TINY_RANDOM_NAME:
        from agents.models import resolve_base

        return model, None, resolve_base(model)
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return model, None, str(path)
    raise ValueError(f"cannot read the configuration of model {model!r} without downloading it: give a local model "
                     f"directory, random:<shape> ({', '.join(random_shapes())}) or a model a shape lists")


@lru_cache(maxsize=16)
def model_shape(model: str) -> ModelShape:
    """The :class:`ModelShape` of ``model`` (a name :func:`agents.models.load_base` takes), built on the meta
    device from its configuration (module docstring).

    Raises:
        ValueError: the configuration cannot be read without a download."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name, fields, directory = _config_dict(model)
    if fields is not None:
        fields = dict(fields)
        config = AutoConfig.for_model(fields.pop("model_type"), **{k: v for k, v in fields.items()
                                                                     if k != "architectures"})
    else:
        config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return ModelShape(
        name=name,
        params=sum(p.numel() for p in net.parameters()),
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab=text.vocab_size,
        linears=tuple((n.rsplit(".", 1)[-1], m.in_features, m.out_features)
                      for n, m in net.named_modules() if isinstance(m, nn.Linear)),
    )


def layer_bytes_per_token(shape: ModelShape, e: int, rank: int, lora_modules: int) -> int:
    """``A`` of the module docstring: what one decoder layer keeps per token for its backward pass."""
    h, f, q, kv = shape.hidden, shape.intermediate, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return (2 * (4 * h + e * h) + e * (q + 2 * kv) + 2 * e * kv + 2 * e * q + 4 * shape.heads + 4 * e * f
            + e * rank * lora_modules)


def head_bytes(shape: ModelShape, head_tokens: int, e: int) -> int:
    """``H`` of the module docstring: the LM head's peak over ``head_tokens`` tokens."""
    return head_tokens * shape.vocab * (HEAD_FLOAT32_COPIES * 4 + (e if e < 4 else 0))


def block_mask_pairs(blocks: Sequence[Sequence[tuple[int, int, Sequence[tuple[int, int]]]]]) -> int:
    """``P`` of the module docstring: query-key pairs of the explicit masks of packed rows' blocks with
    ancestors (``agents.packing.PackedRows.blocks``)."""
    total = 0
    for row in blocks:
        for s, e, anc in row:
            seen = sum(b - a for a, b in anc)
            if seen:
                total += (e - s) * (seen + e - s)
    return total


def activation_bytes(shape: ModelShape, tokens: int, head_tokens: int, dtype: str | torch.dtype, *,
                     checkpointing: bool, rank: int, targets: Sequence[str], attention: str = "tree",
                     cuda: bool = False, mask_pairs: int = 0) -> int:
    """Peak activation bytes of one forward/backward pass of ``tokens`` token slots with ``head_tokens`` of
    them through the LM head at once (module docstring); ``attention``: ``tree``/``flex`` or ``mask`` (adds the
    dense mask, and on ``cuda`` the math kernel's scores); ``mask_pairs``: ``P`` of CPU tree attention's block
    masks (:func:`block_mask_pairs`; 0 on CUDA)."""
    e = dtype_bytes(dtype)
    A = layer_bytes_per_token(shape, e, rank, shape.lora_modules_per_layer(targets))
    H = head_bytes(shape, head_tokens, e)
    if checkpointing:
        G = e * (2 * shape.intermediate + 2 * shape.hidden)
        peak = shape.layers * e * shape.hidden * tokens + max(H, (A + G) * tokens + e * mask_pairs)
    else:
        peak = shape.layers * (A * tokens + e * mask_pairs) + H
    if attention == "mask":
        peak += e * tokens * tokens
        if cuda:  # an explicit mask with grouped-query attention: SDPA's math kernel keeps float32 scores
            kept = 1 if checkpointing else shape.layers
            peak += kept * shape.heads * tokens * tokens * 4
    return peak


class StorageTracker(TorchDispatchMode):
    """Inside ``with StorageTracker() as t:``, every tensor storage an operator creates is counted from its
    creation until it is freed; ``t.peak`` is the most bytes alive at once (module docstring). Storages that
    existed before (parameters, inputs) are not counted, nor are views and in-place results of them."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self._sizes:
                continue
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out
