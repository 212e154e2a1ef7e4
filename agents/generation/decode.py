"""The HF backend's own prefill + decode loop (``HFGenerator(engine="loop")``, the default), with five levers.

HF ``generate`` prefills every row of a chunk in one left-padded batch and decodes every row until the last one
finishes. This loop calls the model's forward itself, so that:

* ``share_prompts``: each UNIQUE ``(adapter, prompt ids)`` is prefilled once and its keys/values are copied
  into the cache rows of its ``n`` samples (students' attempts at one task share a prompt); the first logits
  are shared the same way.
* ``tree_prefill``: the unique prompts of each adapter are prefilled as the radix tree of their tokens
  (:func:`agents.packing.pack_prefix_shared`, grouped by adapter): a prefix that several prompts share (the
  role's instructions, a task's statement) is computed once, trees are packed into rows without padding, and
  :mod:`agents.tree_attention` lets each token see exactly its own prompt's earlier tokens at their own
  positions. Each row's decode cache then gathers its prompt's columns (``PackedRows.prompt_ranges``) and
  holds what a prefill of that prompt alone holds, up to float summation order.
* ``drop_finished``: a row that emitted EOS, completed a stop string or reached its budget leaves the decode
  batch (its cache rows, mask row and adapter row are dropped), so it stops costing attention, LoRA and
  sampling work.
* ``fused_decode``: decode steps of Llama-family models on CPU run through :class:`agents.generation.fused.
  FusedDecoder` (stacked, transposed projections; LoRA per row in one low-rank product per module group;
  attention of one query by two batched matmuls) instead of HF's forward; the prefill stays HF's.
* ``onednn_decode`` (with ``fused_decode``): the fused step's gate/up projections and LM head read their weights
  in oneDNN's packed layout (:class:`agents.generation.fused.FusedDecoder`, ``onednn=``) where the torch build
  has it; off, they use MKL's GEMM on the transposed weights as the other projections do.

``fused_decode`` is a run's setting (``HFGenerator(fused_decode=...)``); the others are :class:`HFOptions`, which
benchmarks and tests construct. Two levers measured and not taken were removed: a prefill of each unique prompt
alone, without padding, and decode steps over the base weights stored transposed (their measurements:
docs/results.md, "Component measurements that used to live in docstrings").

With the five off, the loop computes what ``generate`` computes (the same padded prefill with the same mask and
position ids, ``logits_to_keep=1``, every row fed the pad token after it finishes, the same sampler calls):
the same tokens and log-probs, bit for bit (``tests/agents/test_generation_loop.py``). Each lever changes the
shapes of some matmuls (one row instead of ``n``; a packed tree instead of a padded batch; fewer rows; another
weight layout), so the float sums of the logits can differ in the last bits and a sampled token can flip
between near-equal candidates: greedy tokens stay identical on the tested prompts and the logits agree within
the tolerance the tests state. Sampling stays per row, seeded by the row's own generator (one uniform per
step while the row is generating), so a row's draws do not depend on the other rows or on which rows were
dropped, and the same seed gives the same tokens run to run.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from agents.generation.fused import FusedDecoder, fused_decoder, fused_unsupported, onednn_available
from agents.generation.sampling import SAMPLERS
from agents.models import activation_dtype
from agents.packing import pack_prefix_shared
from agents.tree_attention import takes_tree_mask, tree_attention

if TYPE_CHECKING:
    from agents.population import LoRAPopulation

__all__ = ["KV_CACHES", "HFOptions", "loop_supported", "run_loop"]

KV_CACHES = ("preallocated", "dynamic", "static")


@dataclass
class _Row:
    """One sample to generate: which request and sample it is, its adapter, prompt ids and sampling settings (both
    HF engines read it; defined here so that ``hf`` imports ``decode`` and not the reverse)."""

    request_index: int
    sample_index: int
    adapter: str | None
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: tuple[str, ...] = ()
    version: int | None = None  # the adapter version the request asked for (agents.generation.versions)


@dataclass(frozen=True)
class HFOptions:
    """The HF backend's settings for ablations, benchmarks and tests (a run uses the defaults).

    Attributes:
        sampler: ``"topk"`` (sorts only the tokens that can be in the nucleus) or ``"sort"`` (sorts the whole
            vocabulary); both draw exactly the same tokens (:mod:`agents.generation.sampling`).
        kv_cache: (``engine="generate"`` only; the loop has its own preallocated, row-selectable cache)
            ``"preallocated"``: each layer's keys and values are written in place into a buffer of ``prompt
            width + max_new_tokens`` positions allocated at the prefill, attention reading the filled part (the
            same values and shapes as ``"dynamic"``, so the same tokens and log-probs, without copying every
            layer's cache at every step); ``"dynamic"``: HF's cache grown by concatenation; ``"static"``: HF's
            ``StaticCache`` (attention over all preallocated positions, masked: log-probs differ in the last
            float bits, so a draw can flip; for ablations). ``torch.compile`` stays off in every case.
        share_prompts, tree_prefill, drop_finished, onednn_decode: the loop's levers (module docstring), on by
            default; ``tree_prefill`` shares equal prompts whatever ``share_prompts`` says.
    """

    sampler: Literal["topk", "sort"] = "topk"
    kv_cache: Literal["preallocated", "dynamic", "static"] = "preallocated"
    share_prompts: bool = True
    tree_prefill: bool = True
    drop_finished: bool = True
    onednn_decode: bool = True

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {self.sampler!r}")
        if self.kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {self.kv_cache!r}")


def _cache_buffers(like: torch.Tensor, rows: int, capacity: int, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed key and value buffers ``[rows, heads, capacity, dim]`` for a cache layer shaped like ``like``.

    For the fused step (``fused``) the keys are a transposed view of a ``[rows, heads, dim, capacity]`` buffer:
    its scores ``q K^T`` then read ``K^T`` contiguous along the positions, which MKL's batched GEMM serves
    ~2x faster at the main job's shapes than the transposed operand of a ``[.., capacity, dim]`` buffer, with
    the same sums in the same order (equal bit for bit in a probe). HF's attention keeps contiguous keys (its
    kernels sum strided keys in another order)."""
    heads, dim = like.shape[1], like.shape[-1]
    if fused:
        keys = like.new_zeros((rows, heads, dim, capacity)).transpose(-1, -2)
    else:
        keys = like.new_zeros((rows, heads, capacity, dim))
    return keys, like.new_zeros((rows, heads, capacity, dim))


class _RowsLayer(DynamicLayer):
    """A cache layer over preallocated ``[rows, heads, capacity, dim]`` buffers filled up to ``length``
    (:func:`_cache_buffers`): ``update`` writes in place and returns views of the filled positions (what the
    concatenating layer would hold); :meth:`select` keeps only some batch rows (and the buffers' layouts)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self._k, self._v, self._len = keys, values, length
        self.device = keys.device
        self.is_initialized = True
        self.keys, self.values = keys[..., :length, :], values[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._len + key_states.shape[-2]
        if end > self._k.shape[-2]:
            raise RuntimeError(f"decode cache full ({self._k.shape[-2]} positions)")
        self._k[..., self._len:end, :] = key_states
        self._v[..., self._len:end, :] = value_states
        self._len = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def select(self, rows: torch.Tensor) -> None:
        if self._k.stride(-1) == 1:
            self._k = self._k.index_select(0, rows)
        else:  # keys stored transposed (:func:`_cache_buffers`): keep that layout
            self._k = self._k.transpose(-1, -2).index_select(0, rows).transpose(-1, -2)
        self._v = self._v.index_select(0, rows)
        self.keys, self.values = self._k[..., : self._len, :], self._v[..., : self._len, :]


def loop_supported(population: LoRAPopulation) -> bool:
    """Whether the loop can serve this model: every cache layer is a plain dynamic (full-attention) layer."""
    cache = DynamicCache(config=population.model.base_model.model.config)
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


class _Forward:
    """One forward of the causal LM (the PEFT-injected HF model) returning the last position's logits; decode
    steps (one position) go through the fused step when one is given (:meth:`use_fused`)."""

    def __init__(self, population: LoRAPopulation) -> None:
        self.model = population.model.base_model.model
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.2x names the cache argument ``cache``; older 5.x ``past_key_values``
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.device = next(self.model.parameters()).device
        self.fused: FusedDecoder | None = None
        self.transposed_keys = False  # the decode cache stores keys for the fused step (:func:`_cache_buffers`)

    def use_fused(self, onednn: bool) -> None:
        """Serve decode steps with :class:`FusedDecoder` (the caller checked :func:`fused_unsupported`);
        ``onednn``: its oneDNN layouts where this torch build has them."""
        self.fused = fused_decoder(self.model, onednn=onednn and onednn_available())

    def bind(self) -> None:
        """The rows' members changed (a new ``LoRAPopulation.mixed`` block): the fused step re-reads them."""
        if self.fused is not None:
            self.fused.bind()

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache) -> torch.Tensor:
        if self.fused is not None and ids.shape[1] == 1 and mask is not None:
            return self.fused.step(ids[:, 0], pos[:, 0], mask, cache.layers)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **{self.cache_kw: cache})
        return out.logits[:, -1]


def _padded(prompts: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids, 2-D mask and position ids (``cumsum(mask) - 1``, 0 on padding: ``generate``'s rule)."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids, mask, pos


class _Sampler:
    """Chooses each active row's next token (both engines: ``hf._RowSampler`` calls it with every row): the
    raw-logit log-prob at temperature 1; the row's temperature, top-p and its own generator (one uniform per
    row, so a row's draws never depend on other rows) for sampled rows; argmax for greedy ones."""

    def __init__(self, rows: Sequence[_Row], device: torch.device, sampler: str) -> None:
        self.rows = rows
        self.sample = SAMPLERS[sampler]
        self.generators = [torch.Generator(device=device).manual_seed(r.seed) for r in rows]

    def __call__(self, logits: torch.Tensor, active: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        choice = logits.argmax(dim=-1)
        sampled = [j for j, i in enumerate(active) if self.rows[i].temperature > 0]
        if sampled:
            idx = torch.tensor(sampled, device=logits.device)
            temps = torch.tensor([self.rows[active[j]].temperature for j in sampled], device=logits.device)
            top_ps = torch.tensor([self.rows[active[j]].top_p for j in sampled], device=logits.device)
            probs = torch.softmax(logits[idx] / temps[:, None], dim=-1)
            u = torch.cat([torch.rand(1, generator=self.generators[active[j]], device=logits.device)
                           for j in sampled])
            choice[idx] = self.sample(probs, top_ps, u)
        return choice, logp.gather(1, choice[:, None]).squeeze(1)


def _prefill(fwd: _Forward, population: LoRAPopulation, rows: Sequence[_Row], pad: int, capacity: int,
             opts: HFOptions) -> tuple[torch.Tensor, list[_RowsLayer], torch.Tensor]:
    """Prefill (once per unique prompt with ``share_prompts``; as the adapters' prompt trees with
    ``tree_prefill``); returns the first logits of every row, the decode cache's layers (``[rows, heads,
    capacity, dim]``, filled up to the chunk's prompt width) and the rows' 2-D prompt mask."""
    owner: list[int] = []
    uniques: list[int] = []  # row index of each unique prompt
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        key = (r.adapter, tuple(r.prompt_ids)) if opts.share_prompts else (i,)
        if key not in seen:
            seen[key] = len(uniques)
            uniques.append(i)
        owner.append(seen[key])
    width = max(len(r.prompt_ids) for r in rows)
    _, mask, _ = _padded([r.prompt_ids for r in rows], pad)
    own = torch.tensor(owner, device=fwd.device)
    layers: list[_RowsLayer] = []
    if opts.tree_prefill and takes_tree_mask(fwd.model):  # (flash-attention kernels keep the padded batch)
        return _tree_prefill(fwd, population, rows, uniques, owner, capacity) + (mask,)
    ids, umask, pos = _padded([rows[i].prompt_ids for i in uniques], pad)
    cache = DynamicCache(config=fwd.model.config)
    with population.mixed([rows[i].adapter for i in uniques]):
        logits = fwd(ids.to(fwd.device), umask.to(fwd.device), pos.to(fwd.device), cache)
    for layer in cache.layers:
        k, v = layer.keys.index_select(0, own), layer.values.index_select(0, own)
        kb, vb = _cache_buffers(k, k.shape[0], capacity, fwd.transposed_keys)
        kb[..., :width, :], vb[..., :width, :] = k, v
        layers.append(_RowsLayer(kb, vb, width))
    return logits.index_select(0, own), layers, mask


def _tree_prefill(fwd: _Forward, population: LoRAPopulation, rows: Sequence[_Row], uniques: Sequence[int],
                  owner: Sequence[int], capacity: int) -> tuple[torch.Tensor, list[_RowsLayer]]:
    """``tree_prefill`` (module docstring): one forward over the adapters' prompt trees; returns the first logits
    of every row and its left-padded decode cache (the prompt's keys/values right-aligned at ``width``)."""
    prompts = [rows[i].prompt_ids for i in uniques]
    adapters = [rows[i].adapter for i in uniques]
    packed = pack_prefix_shared(prompts, [[] for _ in uniques], groups=adapters, dtype=activation_dtype(fwd.model),
                                device=fwd.device)
    row_adapter: list[str | None] = [None] * packed.input_ids.shape[0]
    for u, a in enumerate(adapters):
        row_adapter[int(packed.row[u])] = a
    cols = packed.prompt_last.unique()  # logits only where a prompt ends
    cache = DynamicCache(config=fwd.model.config)
    with population.mixed(row_adapter), tree_attention(fwd.model):
        out = fwd.model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                        position_ids=packed.position_ids, use_cache=True, logits_to_keep=cols,
                        tree_blocks=packed.blocks, tree_pad_start=packed.pad_start, **{fwd.cache_kw: cache})
    at = torch.searchsorted(cols, packed.prompt_last)
    firsts = out.logits[packed.row, at]  # [unique prompts, vocab]
    width = max(len(r.prompt_ids) for r in rows)
    # each unique prompt's columns in its packed row, in position order
    gather = [torch.cat([torch.arange(a, b) for a, b in packed.prompt_ranges[u]]).to(fwd.device)
              for u in range(len(uniques))]
    layers = []
    for layer in cache.layers:
        kb, vb = _cache_buffers(layer.keys, len(rows), capacity, fwd.transposed_keys)
        for r, u in enumerate(owner):
            n = len(rows[r].prompt_ids)
            pr = int(packed.row[u])
            kb[r, :, width - n:width, :] = layer.keys[pr].index_select(1, gather[u])
            vb[r, :, width - n:width, :] = layer.values[pr].index_select(1, gather[u])
        layers.append(_RowsLayer(kb, vb, width))
    return firsts.index_select(0, torch.tensor(list(owner), device=fwd.device)), layers


def run_loop(population: LoRAPopulation, tokenizer, rows: Sequence[_Row], stop_ids: Sequence[int],
             opts: HFOptions, fused_decode: bool, stopper) -> tuple[list[list[int]], list[list[float]]]:
    """Generate ``rows``; returns each row's tokens and log-probs (up to where it finished; the caller cuts at
    EOS / stop strings as for ``generate``'s output). ``fused_decode``: the fused decode step where the model
    supports it (module docstring). ``stopper(row, token, n)`` -> whether a stop string ended row ``row`` at
    its ``n``-th token (``hf._RowStop.feed``)."""
    fwd = _Forward(population)
    pad = tokenizer.pad_token_id
    budget = max(r.max_new_tokens for r in rows)
    width = max(len(r.prompt_ids) for r in rows)
    stops = set(stop_ids)
    choose = _Sampler(rows, fwd.device, opts.sampler)
    tokens: list[list[int]] = [[] for _ in rows]
    logprobs: list[list[float]] = [[] for _ in rows]
    fused = fused_decode and budget > 1 and fused_unsupported(fwd.model) is None
    fwd.transposed_keys = fused  # the decode cache's key layout (:func:`_cache_buffers`)
    logits, layers, mask = _prefill(fwd, population, rows, pad, width + budget, opts)
    if fused:
        fwd.use_fused(opts.onednn_decode)
    cache = DynamicCache(config=fwd.model.config)
    cache.layers = layers
    mask = torch.cat([mask, mask.new_ones((len(rows), budget))], dim=1).to(fwd.device)
    pos = torch.tensor([len(r.prompt_ids) for r in rows], device=fwd.device)
    active = list(range(len(rows)))  # the rows in the batch, in batch order
    done = [False] * len(rows)
    with ExitStack() as adapters:
        adapters.enter_context(population.mixed([rows[i].adapter for i in active]))
        fwd.bind()
        for step in range(budget):
            choice, lp = choose(logits, active)
            toks, lps = choice.tolist(), lp.tolist()
            for j, i in enumerate(active):
                if done[i]:
                    continue
                tokens[i].append(toks[j])
                logprobs[i].append(lps[j])
                n = len(tokens[i])
                if toks[j] in stops or n >= rows[i].max_new_tokens or stopper(i, toks[j], n):
                    done[i] = True
            if all(done) or step + 1 == budget:
                break
            feed = [pad if done[i] else toks[j] for j, i in enumerate(active)]
            if opts.drop_finished and any(done[i] for i in active):
                keep = [j for j, i in enumerate(active) if not done[i]]
                sel = torch.tensor(keep, device=fwd.device)
                for layer in layers:
                    layer.select(sel)
                mask, pos = mask.index_select(0, sel), pos.index_select(0, sel)
                active = [active[j] for j in keep]
                feed = [feed[j] for j in keep]
                adapters.close()
                adapters.enter_context(population.mixed([rows[i].adapter for i in active]))
                fwd.bind()
            length = width + step + 1
            ids = torch.tensor(feed, device=fwd.device)[:, None]
            logits = fwd(ids, mask[:, :length], pos[:, None] + step, cache)
    return tokens, logprobs
