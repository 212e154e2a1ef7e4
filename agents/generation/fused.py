"""A lean decode step for Llama-family models on CPU: the decode loop's ``fused_decode`` lever (the default).

A decode step feeds one new token per row. On CPU, HF's forward of a small model for a few rows takes several
times as long as reading its fp32 weights once, the step's floor (``benchmarks/generation.py --throughput``;
docs/results.md): its GEMMs run with the weight as a transposed right operand, a layout in which MKL's small-M kernels are ~2x
slower than with the weight stored ``[in, out]``, and the rest is several hundred small operations (seven linear
modules per layer, each with its LoRA, norms, rotary, flash attention built for long queries). This module
computes the same function of the same weights with fewer, larger operations. Per layer, for the rows' hidden
states ``x`` (``[B, d_model]``):

* **norms** as HF computes them: ``RMSNorm(x) = w * (x * rsqrt(mean(x^2) + eps))`` in float32 (torch's
  ``rms_norm``);
* **projections**: ``[q | k | v] = h [W_q; W_k; W_v]^T + b`` is one matmul against the stacked weights stored
  transposed and contiguous, and ``[gate | up] = h [W_gate; W_up]^T`` another; ``o`` and ``down`` alone;
* **LoRA, one member per row**, as :meth:`agents.population.LoRAPopulation.mixed` defines it: for modules ``G``
  that share an input ``h``, ``delta_G = ((h A_G^T) * M) B_G`` where ``A_G`` stacks the used members' ``A`` of
  every module in ``G`` (``[sum_m P r, d_in]``), ``M`` keeps for row ``i`` only its member's ``r`` columns times
  that member's scaling, and ``B_G`` is block-diagonal (module ``m``'s ``B^T`` in its rows and output columns),
  added to the group's output in place by one ``addmm_`` (its zero blocks, a few hundred KB per layer, cost
  less to read than one small product per module);
* **rotary embeddings** from the model's own rotary module (so any rope scaling it implements), applied to ``q``
  to ``q`` and ``k`` together as ``x cos + rotate_half(x) sin`` (:func:`_rotate`); the new key and value are
  written into the loop's cache;
* **attention of one query per row** by two batched matmuls over the GQA groups (``g = H / H_kv`` query heads
  share a key/value head): ``s = q_g K^T / sqrt(d_head) + bias`` (one ``baddbmm``; ``bias`` = -inf at left
  padding; the loop's cache stores the keys transposed, so ``K^T`` is read contiguous along the positions),
  ``p = softmax(s)``, ``o = p V``, all in float32 (as SDPA accumulates them);
* ``x <- x + o W_o^T``, then ``x <- x + down(silu(gate) * up)``; after the last layer the final norm and the LM
  head (stored transposed) give the logits. The gate/up projection and the LM head can also keep their weights
  in oneDNN's packed layout (``onednn``, :class:`_Dense`): the same product, faster for those shapes here.

The values are those of HF's forward up to the order of float sums (stacked GEMMs, the weight layout, the
attention kernel): the tests hold the logits within a stated tolerance of HF's and greedy tokens equal; a
sampled token can flip between near-equal candidates, as with the loop's other levers. Models it does not
cover (another architecture, an activation other than SiLU, a device other than the CPU, a dtype other than
float32) fall back to HF's forward (:func:`fused_unsupported` says why).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from agents.population import mixed_factors

__all__ = ["FusedDecoder", "fused_decoder", "fused_unsupported", "onednn_available"]

_ARCHS = ("llama", "qwen2")
_ATTN = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")


def fused_unsupported(model: nn.Module) -> str | None:
    """Why the fused step cannot serve this HF causal LM (``None``: it can)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in _ARCHS:
        return f"architecture {getattr(cfg, 'model_type', None)!r} (fused decode covers {', '.join(_ARCHS)})"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"activation {cfg.hidden_act!r} (fused decode covers silu)"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        return f"device {weight.device.type} (fused decode is a CPU path)"
    if weight.dtype != torch.float32:
        # bfloat16 runs but its log-probs were not shown to stay within the tests' tolerance of HF's forward
        return f"dtype {str(weight.dtype).removeprefix('torch.')} (fused decode is checked for float32)"
    return None


def _base(module: nn.Module) -> nn.Linear:
    """The frozen ``nn.Linear`` of a (possibly PEFT-wrapped) projection."""
    return getattr(module, "base_layer", module)


def _stack_t(modules: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[W_1; W_2; ...]^T`` contiguous (``[in, sum out]``) and the stacked bias (zeros where a module has none;
    ``None`` if none has one)."""
    weights = [_base(m).weight.detach() for m in modules]
    stacked = torch.cat(weights, dim=0).t().contiguous()
    biases = [_base(m).bias for m in modules]
    if all(b is None for b in biases):
        return stacked, None
    return stacked, torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0])
                               for b, w in zip(biases, weights, strict=True)])


@dataclass
class _Lora:
    """One module group's LoRA for the bound rows: ``out += ((h @ a_t) * mask) @ b_t``, with ``b_t`` the
    block-diagonal ``B_G`` of the module docstring (``[sum P r, sum out]``: module ``m``'s ``B^T`` in its rows
    and output columns, zeros elsewhere): one product for the whole group. Its zero blocks are a few hundred KB
    per layer, cheaper to read than one small product per module."""

    a_t: torch.Tensor  # [d_in, sum P r]
    mask: torch.Tensor  # [rows, sum P r]
    b_t: torch.Tensor  # [sum P r, sum out]

    def add_to(self, out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        low = (h.to(self.a_t.dtype) @ self.a_t).mul_(self.mask)
        if out.dtype == self.b_t.dtype:
            return out.addmm_(low, self.b_t)
        return out.add_((low @ self.b_t).to(out.dtype))


def _group_lora(modules: Sequence[nn.Module]) -> _Lora | None:
    """The group's LoRA as bound by ``LoRAPopulation.mixed`` (``None``: no member adapter is in use; raises
    ``RuntimeError`` for an active adapter outside ``mixed``, :func:`agents.population.mixed_factors`)."""
    a_rows: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    blocks: list[tuple[int, int, torch.Tensor]] = []  # (first output column, last + 1, B_cat^T)
    col = 0
    for m in modules:
        out = _base(m).out_features
        factors = mixed_factors(m)
        if factors is not None:
            a_cat, b_cat, mask = factors
            a_rows.append(a_cat)
            masks.append(mask)
            blocks.append((col, col + out, b_cat.t()))
        col += out
    if not a_rows:
        return None
    width = sum(a.shape[0] for a in a_rows)
    b_t = blocks[0][2].new_zeros((width, col))
    row = 0
    for c0, c1, block in blocks:
        b_t[row:row + block.shape[0], c0:c1] = block
        row += block.shape[0]
    return _Lora(torch.cat(a_rows, dim=0).t().contiguous(), torch.cat(masks, dim=1), b_t)


def _projections(layer: nn.Module) -> tuple[list[nn.Module], nn.Module, list[nn.Module], nn.Module]:
    """A decoder layer's projections as the fused step groups them: ``[q, k, v]``, ``o``, ``[gate, up]``,
    ``down``."""
    attn, mlp = layer.self_attn, layer.mlp
    return [getattr(attn, n) for n in _ATTN], attn.o_proj, [getattr(mlp, n) for n in _MLP], mlp.down_proj


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's prepacked fp32 linear (``torch.ops.mkldnn._linear_pointwise``)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class _Dense:
    """A frozen projection ``h W^T + b`` for a decode step's few rows: ``W^T`` stored contiguous (``[in, out]``),
    the layout in which MKL's small-M GEMM is fastest; with ``onednn``, also oneDNN's own packed layout of ``W``,
    used from 2 rows on (one row keeps MKL's matrix-vector kernel, faster there). On this project's CPU, with
    the weights streamed from memory as a decode step streams them, oneDNN took 0.66-0.76x of MKL's time for
    the LM head (2-16 rows) and 0.79-0.96x for the stacked gate/up projection, but about as much as MKL or more
    for the smaller ``q/k/v``, ``o`` and ``down`` shapes (``benchmarks/generation.py --gemm``, 2026-12-02), so
    only those two use it. The packed copies cost their size again in memory (0.33 GB for SmolLM2-135M).
    """

    def __init__(self, modules: Sequence[nn.Module], onednn: bool = False) -> None:
        self.t, self.bias = _stack_t(modules)
        self.packed: torch.Tensor | None = None
        if onednn:
            self.pack()

    def pack(self) -> None:
        """Also keep ``W`` in oneDNN's packed layout (the only place that calls oneDNN's private reorder op)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.t.t(), 8)

    def mkl(self, h: torch.Tensor) -> torch.Tensor:
        """``h W^T + b`` by MKL's GEMM on the transposed weight."""
        return torch.addmm(self.bias, h, self.t) if self.bias is not None else h @ self.t

    def onednn(self, h: torch.Tensor) -> torch.Tensor:
        """``h W^T + b`` by oneDNN on the packed weight (:meth:`pack` first)."""
        return torch.ops.mkldnn._linear_pointwise(h, self.packed, self.bias, "none", [], "")

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.onednn(h) if self.packed is not None and h.shape[0] > 1 else self.mkl(h)


class _Layer:
    """One decoder layer's stacked, transposed weights and its modules (for the LoRA bound per row set)."""

    def __init__(self, layer: nn.Module, onednn: bool = False) -> None:
        self.attn_modules, self.o_module, self.mlp_modules, self.down_module = _projections(layer)
        self.dense = {"qkv": _Dense(self.attn_modules), "o": _Dense([self.o_module]),
                      "gu": _Dense(self.mlp_modules, onednn), "down": _Dense([self.down_module])}
        self.ln1 = layer.input_layernorm
        self.ln2 = layer.post_attention_layernorm
        self.scaling = float(layer.self_attn.scaling)
        self.head_dim = int(layer.self_attn.head_dim)
        self.lora: dict[str, _Lora | None] = {}

    def bind(self) -> None:
        self.lora = {"qkv": _group_lora(self.attn_modules), "o": _group_lora([self.o_module]),
                     "gu": _group_lora(self.mlp_modules), "down": _group_lora([self.down_module])}

    def project(self, name: str, h: torch.Tensor) -> torch.Tensor:
        out = self.dense[name](h)
        lora = self.lora.get(name)
        return lora.add_to(out, h) if lora is not None else out


def _rms(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HF's RMSNorm of a float32 ``x`` (the only dtype the fused step serves): ``w * (x * rsqrt(mean(x^2) +
    eps))``, by torch's own ``rms_norm`` (one call instead of six; equal to HF's module within float rounding,
    ``tests/agents/test_generation_fused.py``)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` with ``rotate_half(x) = [-x_2, x_1]``, computed as ``x cos + roll(x) s``
    where ``roll(x) = [x_2, x_1]`` and ``s = [-sin_1, sin_2]`` (:func:`_signed_sin`): the same products (a sign
    moved from one factor to the other is exact), two fewer operations."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin))


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class FusedDecoder:
    """The fused decode step of one HF Llama/Qwen2 causal LM (module docstring). It copies the frozen base
    weights into the stacked, transposed layout (the base's size again in memory while it lives; get it through
    :func:`fused_decoder`, which keeps one per model while its base weights are unchanged). :meth:`bind` it after
    every entry into ``LoRAPopulation.mixed`` (the rows' members), then call :meth:`step` for each decode step."""

    def __init__(self, model: nn.Module, onednn: bool | None = None) -> None:
        """``onednn``: the gate/up projections and the LM head in oneDNN's packed layout too (:class:`_Dense`;
        default: where this torch build has it, :func:`onednn_available`)."""
        why = fused_unsupported(model)
        if why is not None:
            raise ValueError(f"fused decode cannot serve this model: {why}")
        if onednn is None:
            onednn = onednn_available()
        elif onednn and not onednn_available():
            raise ValueError("onednn=True but this torch build has no oneDNN prepacked linear")
        self.onednn = onednn
        inner = model.model
        with torch.no_grad():
            self.layers = [_Layer(layer, onednn) for layer in inner.layers]
            self.head = _Dense([model.lm_head], onednn)
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.kv_heads = int(model.config.num_key_value_heads)
        self.heads = int(model.config.num_attention_heads)
        self.signature = _signature(model)

    def bind(self) -> None:
        """Read the LoRA of the rows now bound by ``LoRAPopulation.mixed`` (or none, with adapters disabled)."""
        for layer in self.layers:
            layer.bind()

    @torch.no_grad()
    def step(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache_layers: Sequence) -> torch.Tensor:
        """Logits ``[B, vocab]`` of one new token per row: ``ids`` ``[B]``, their positions ``pos`` ``[B]``, the
        2-D attention mask ``[B, length]`` over the cache after this token (1 = attend), and the loop's cache
        layers (``update(k, v)`` appends one position and returns the filled keys and values)."""
        x = self.embed(ids)
        rows, d = x.shape[0], self.layers[0].head_dim
        cos, sin = self.rotary(x[:, None, :], pos[:, None])
        cos, sin = cos[:, :, None, :], _signed_sin(sin)[:, :, None, :]  # [B, 1, 1, d]: over heads
        group = self.heads // self.kv_heads
        # the additive mask, laid out as the scores of one layer: [B * H_kv, group, length]
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=x.device).masked_fill_(mask == 0, float("-inf"))
        bias = bias[:, None, None, :].expand(rows, self.kv_heads, group, -1).reshape(rows * self.kv_heads, group, -1)
        nq, nkv = self.heads * d, self.kv_heads * d
        for layer, cache in zip(self.layers, cache_layers, strict=True):
            h = _rms(layer.ln1, x)
            qkv = layer.project("qkv", h)
            qk = _rotate(qkv[:, None, :nq + nkv].view(rows, 1, self.heads + self.kv_heads, d), cos, sin)
            v = qkv[:, nq + nkv:].view(rows, self.kv_heads, 1, d)
            keys, values = cache.update(qk[:, :, self.heads:].transpose(1, 2), v)  # [B, H_kv, length, d]
            qg = qk[:, 0, :self.heads].reshape(rows * self.kv_heads, group, d)
            length = keys.shape[-2]
            # scores, softmax and the weighted sum in float32, as SDPA accumulates them (no-ops for fp32 models)
            scores = torch.baddbmm(bias, qg.float(), keys.float().reshape(rows * self.kv_heads, length, d)
                                   .transpose(1, 2), alpha=layer.scaling)
            attn = torch.bmm(torch.softmax(scores, dim=-1),
                             values.float().reshape(rows * self.kv_heads, length, d)).to(x.dtype)
            x = x.add_(layer.project("o", attn.view(rows, nq)))
            h = _rms(layer.ln2, x)
            gu = layer.project("gu", h)
            half = gu.shape[-1] // 2
            x = x.add_(layer.project("down", F.silu(gu[:, :half]).mul_(gu[:, half:])))
        return self.head(_rms(self.norm, x))


def _signature(model: nn.Module) -> tuple:
    """Identity, storage and in-place version of every base weight and bias the fused layout copies (the
    projections of every layer and the LM head): a decoder built from other values than the model's current
    ones is rebuilt."""
    modules = [model.lm_head]
    for layer in model.model.layers:
        qkv, o, gate_up, down = _projections(layer)
        modules += [*qkv, o, *gate_up, down]
    tensors = [t for m in modules for t in (_base(m).weight, _base(m).bias) if t is not None]
    return tuple((id(t), t.data_ptr(), t._version) for t in tensors)


_DECODERS: weakref.WeakKeyDictionary[nn.Module, dict[bool, FusedDecoder]] = weakref.WeakKeyDictionary()


def fused_decoder(model: nn.Module, onednn: bool | None = None) -> FusedDecoder:
    """The model's fused decoder, built on first use and kept (one per model and ``onednn`` setting; ``None``:
    where available) while the model's frozen weights are the same tensors with the same values
    (:func:`_signature`); rebuilt otherwise: copying the weights into the layout is paid once instead of at every
    generation call."""
    if onednn is None:
        onednn = onednn_available()
    kept = _DECODERS.setdefault(model, {})
    signature = _signature(model)
    for setting in [s for s, d in kept.items() if d.signature != signature]:
        del kept[setting]  # built from other weights
    if onednn not in kept:
        kept[onednn] = FusedDecoder(model, onednn=onednn)
    return kept[onednn]
