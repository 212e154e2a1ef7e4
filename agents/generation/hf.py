"""Hugging Face backend: mixed-adapter batches in one prefill + decode loop (or one HF ``generate`` call), on any
device. ``engine="loop"`` (the default; a run's ``generation.hf_engine``) is the backend's own loop
(:mod:`agents.generation.decode`): it prefills each adapter's unique prompts once, as the radix tree of their
tokens, drops finished rows and, for float32 Llama/Qwen2 models on CPU, runs its decode steps through
:mod:`agents.generation.fused`;
``engine="generate"`` is one HF ``generate`` call per
batch (the previous path; docs/results.md compares the two on the main job). The loop's levers reorder some
float sums, so a sampled token may flip where two candidates are within rounding of each other.

Rows of one batch may use different population members (and ``None`` = the base with adapters disabled).
By default the per-row adapters are applied by :meth:`LoRAPopulation.mixed` (two small matmuls per LoRA module
whatever the number of members); ``lora_impl="peft"`` uses PEFT's ``adapter_names=`` path instead (same
outputs, slower with many members).

Sampling is done by a logits processor that sees the RAW logits of every step: it records the unscaled
log-probability of the chosen token (``log_softmax`` at temperature 1, no top-p: what a policy-gradient
trainer compares against), draws the token for each row with that row's own temperature, top-p and
``torch.Generator`` (inverse-CDF sampling, :mod:`agents.generation.sampling`), and hands ``generate`` a
one-hot score so that greedy decoding picks it. Hence one ``generate`` call serves requests with different
temperatures / top-p / seeds / budgets, and no ``output_logits`` tensors (steps x rows x vocab) are kept.

Guarantees:

* ``token_ids`` stop at and INCLUDE the EOS token when one is produced (``finish_reason="stop"``), or the
  token that completes one of the request's ``stop`` strings (``"stop"``; the row stops generating there), else
  they have exactly the request's ``max_new_tokens`` tokens (``"length"``); ``text`` is the decoded
  ``token_ids`` without special tokens, cut right after the stop string when one ended the row (a token can
  carry a few characters past it); ``logprobs`` are aligned with ``token_ids``; ``prompt_token_ids`` are the
  unpadded prompt ids (chat template and response prefix applied, :func:`encode_prompt`).
* Sample ``k`` of a request with ``seed=s`` draws from a generator seeded with a hash of ``(s, k)``, so it
  does not depend on the other requests in the call, their order or ``batch_size``, up to float rounding of
  batched matmuls (which can flip a draw or an argmax between near-equal tokens; with ``fused_decode`` the
  decode matmuls' sums can depend on the batch size, so a row's tokens can depend on its
  chunk, still identically run to run). Requests with
  ``seed=None`` take seeds from the backend's own RNG (seeded by ``seed=`` at construction): the same
  sequence of calls on a fresh backend gives the same outputs. Greedy (``temperature == 0``) is seed-free.
"""

from __future__ import annotations

import hashlib
import random
import warnings
from collections.abc import Sequence
from typing import Literal

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from agents.generation.base import Completion, GenerationRequest
from agents.generation.decode import HFOptions, _Row, _Sampler, loop_supported, run_loop
from agents.generation.versions import AdapterVersions, check_state
from agents.population import BASE_ADAPTER, LoRAPopulation
from populora_env.prompts import with_prefix

__all__ = ["HFGenerator", "HFOptions", "check_request", "cut_at_stop", "encode_prompt", "prompt_text", "row_seed", "stop_token_ids"]


def prompt_text(tokenizer, request: GenerationRequest) -> tuple[str, bool]:
    """The text a request generates from, and whether it is chat-templated.

    With ``request.chat`` and a tokenizer that has a chat template: the template with
    ``add_generation_prompt=True`` (a string prompt becomes one user message), then ``request.prefix`` right
    after the assistant opening. Otherwise the prompt itself, ending with ``request.prefix`` (appended unless
    the prompt already ends with it: :func:`populora_env.prompts.with_prefix`, the rule the env's raw prompt
    sets follow, whose observations already end with their prefix)."""
    prompt = request.prompt
    if request.chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + request.prefix, True
    if not isinstance(prompt, str):
        raise ValueError(
            "a list-of-messages prompt needs a tokenizer with a chat template and chat=True; "
            "pass a string prompt instead"
        )
    return with_prefix(prompt, request.prefix), False


def encode_prompt(tokenizer, request: GenerationRequest) -> list[int]:
    """Prompt token ids of a request: :func:`prompt_text` encoded in one piece (the template's special tokens
    are in the text, so no others are added; a raw prompt gets the tokenizer's usual special tokens). Every
    backend uses this, so prompt ids are identical across backends, and they are exactly the tokens generated
    from (the trainer scores completions after them)."""
    text, templated = prompt_text(tokenizer, request)
    if templated:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def stop_token_ids(population: LoRAPopulation, tokenizer) -> list[int]:
    """The token ids that end a completion: the model's generation-config EOS id(s) plus the tokenizer's."""
    model_eos = population.model.generation_config.eos_token_id
    eos = set(model_eos if isinstance(model_eos, list) else [model_eos] if model_eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    if not eos:
        raise ValueError("neither the model nor the tokenizer defines an EOS token")
    return sorted(eos)


def check_request(index: int, request: GenerationRequest, population: LoRAPopulation) -> None:
    """Validate one request against the population (shared by the backends)."""
    if request.adapter is not None and request.adapter not in population:
        raise KeyError(f"request {index} names adapter {request.adapter!r}, not a member: {population.names}")
    if request.max_new_tokens < 1:
        raise ValueError(f"request {index}: max_new_tokens must be >= 1, got {request.max_new_tokens}")
    if request.temperature < 0 or not 0 < request.top_p <= 1 or request.n < 1:
        raise ValueError(
            f"request {index}: need temperature >= 0, 0 < top_p <= 1, n >= 1 "
            f"(got {request.temperature}, {request.top_p}, {request.n})"
        )
    if not isinstance(request.prefix, str):
        raise ValueError(f"request {index}: prefix must be a str, got {request.prefix!r}")
    if isinstance(request.stop, str) or not all(isinstance(s, str) and s for s in request.stop):
        raise ValueError(f"request {index}: stop must be a tuple of non-empty strings, got {request.stop!r}")


def row_seed(seed: int, sample_index: int) -> int:
    """The generator seed of sample ``sample_index`` of a request with ``seed``."""
    digest = hashlib.sha256(f"populora-sample:{seed}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class _RowSampler:
    """Logits processor choosing each row's next token; records tokens and unscaled log-probs."""

    def __init__(self, rows: Sequence[_Row], device: torch.device, sampler: str = "topk") -> None:
        self.choose = _Sampler(rows, device, sampler)  # the loop's own token choice: one rule for both engines
        self.every_row = range(len(rows))
        self.tokens: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        choice, logprob = self.choose(scores, self.every_row)
        self.tokens.append(choice)
        self.logprobs.append(logprob)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, choice[:, None], 0.0)
        return forced


class _RowStop:
    """Stopping criterion: row ``i`` is done once it has ``max_new_tokens[i]`` tokens or its generated text
    contains one of its stop strings (EOS is ``generate``'s own business).

    After each step the decoded tail of every row that has stop strings and has not stopped is searched: a
    stop string of ``c`` characters that appears for the first time ends within the newest token and spans at
    most ``c`` tokens (each token decodes to at least one character), so the last ``c + 1`` tokens suffice.
    ``stopped_at[i]`` is the number of tokens up to and including the one that completed a stop string.
    """

    def __init__(self, sampler: _RowSampler | None, rows: Sequence[_Row], tokenizer, device: torch.device) -> None:
        """``sampler``: the ``generate`` engine's (its stopping criterion reads the rows' tokens from it); None on
        the loop engine, which hands each token to :meth:`feed` itself."""
        self.sampler = sampler
        self.limits = torch.tensor([r.max_new_tokens for r in rows], device=device)
        self.tokenizer = tokenizer
        self.stops = [r.stop for r in rows]
        self.windows = [max((len(s) for s in r.stop), default=0) + 1 for r in rows]
        self.watch = [i for i, r in enumerate(rows) if r.stop]
        self.ids: list[list[int]] = [[] for _ in rows]
        self.stopped_at: list[int | None] = [None] * len(rows)

    def feed(self, i: int, token: int, n: int) -> bool:
        """Row ``i``'s ``n``-th token is ``token``: whether a stop string has ended the row (now or before)."""
        if self.stopped_at[i] is not None:
            return True
        if not self.stops[i]:
            return False
        self.ids[i].append(token)
        tail = self.tokenizer.decode(self.ids[i][-self.windows[i] :], skip_special_tokens=True)
        if any(s in tail for s in self.stops[i]):
            self.stopped_at[i] = n
            return True
        return False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        n = len(self.sampler.tokens)
        done = n >= self.limits
        if self.watch:
            newest = self.sampler.tokens[-1].tolist()
            for i in self.watch:
                self.feed(i, newest[i], n)
            hit = [i for i in self.watch if self.stopped_at[i] is not None]
            if hit:
                done = done.clone()
                done[hit] = True
        return done


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """``text`` up to and including the earliest-ending stop string, and that string (``None`` if none
    occurs)."""
    best: tuple[int, str] | None = None
    for s in stops:
        at = text.find(s)
        if at != -1 and (best is None or at + len(s) < best[0]):
            best = (at + len(s), s)
    return (text, None) if best is None else (text[: best[0]], best[1])


ENGINES = ("loop", "generate")


class _PreallocatedLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` whose keys and values live in a buffer of ``capacity``
    positions allocated at the first update and written in place; ``keys``/``values`` are views of the filled
    positions, so attention sees exactly the tensors the concatenating layer would build (same values, same
    shape), without re-copying the whole cache every step. Grows (by copying) only past ``capacity``."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._k = self._v = None
        self._len = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._len + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            size = max(end, self.capacity)
            k = key_states.new_empty((*key_states.shape[:-2], size, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:-2], size, value_states.shape[-1]))
            if self._k is not None:
                k[..., : self._len, :] = self._k[..., : self._len, :]
                v[..., : self._len, :] = self._v[..., : self._len, :]
            self._k, self._v = k, v
        self._k[..., self._len : end, :] = key_states
        self._v[..., self._len : end, :] = value_states
        self._len = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._k = self._v = None
        self._len = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the preallocated generation cache is not croppable")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("the preallocated generation cache does not repeat rows")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("the preallocated generation cache does not select rows")


def _preallocated_cache(config, capacity: int) -> DynamicCache:
    """A :class:`DynamicCache` for ``config`` whose layers are :class:`_PreallocatedLayer` of ``capacity``
    positions; the plain dynamic cache where the model has other layer kinds (sliding windows...)."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [_PreallocatedLayer(capacity) for _ in cache.layers]
    return cache


class HFGenerator:
    """The :class:`~agents.generation.base.Generator` over a :class:`LoRAPopulation` with HF ``generate``.

    It reads the population's live weights (``refresh`` is a no-op), and is also a
    :class:`~agents.generation.base.VersionedGenerator`: :meth:`load_version` copies a given version of a member
    into the population under the lifecycle contract of :mod:`agents.generation.versions` (checked first, copied
    once no generate call is running, refused with the old weights kept), for an engine that serves an
    asynchronous run from its own copy of the population.

    Args:
        population: the members.
        tokenizer: the base's tokenizer (needs a pad token: ``load_base`` sets one).
        batch_size: most rows (requests x samples) per ``generate`` call; more rows are split into chunks
            (rows sorted by prompt length first, to pad less).
        seed: seeds the backend's RNG used for requests with ``seed=None``.
        engine: ``"loop"`` (default): the backend's own prefill + decode loop (:mod:`agents.generation.decode`,
            a run's ``generation.hf_engine``); ``"generate"``: HF ``generate``. The loop needs
            ``lora_impl="fused"`` and full-attention cache layers; otherwise ``generate`` is used.
        fused_decode: (loop, CPU, float32 Llama/Qwen2) decode steps through
            :class:`agents.generation.fused.FusedDecoder` instead of HF's forward (other models keep HF's
            forward; a run's ``generation.fused_decode``).
        lora_impl: ``"fused"`` (:meth:`LoRAPopulation.mixed`) or ``"peft"`` (PEFT's ``adapter_names=``).
        options: the sampler, the ``generate`` engine's KV cache and the loop's other levers
            (:class:`~agents.generation.decode.HFOptions`; its defaults are what a run uses). With the loop,
            ``fused_decode=False`` and the levers off, tokens and log-probs are those of ``engine="generate"``
            bit for bit; each lever reorders some float sums (:mod:`agents.generation.decode`).
    """

    def __init__(
        self,
        population: LoRAPopulation,
        tokenizer,
        batch_size: int = 32,
        seed: int = 0,
        engine: Literal["loop", "generate"] = "loop",
        fused_decode: bool = True,
        lora_impl: Literal["fused", "peft"] = "fused",
        options: HFOptions | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if lora_impl not in ("fused", "peft"):
            raise ValueError(f"lora_impl must be 'fused' or 'peft', got {lora_impl!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; load the model with agents.models.load_base")
        self.population = population
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.lora_impl = lora_impl
        self.fused_decode = fused_decode
        self.options = options if options is not None else HFOptions()
        self.engine = engine if engine == "generate" or (lora_impl == "fused" and loop_supported(population)) \
            else "generate"
        self._rng = random.Random(seed)
        self.stop_token_ids = stop_token_ids(population, tokenizer)
        self.versions = AdapterVersions()

    def refresh(self, names: Sequence[str] | None = None) -> None:
        """No-op: this backend reads the population's live weights."""

    def load_version(self, name: str, version: int, state: dict[str, torch.Tensor]) -> None:
        """Serve ``state`` as ``version`` of member ``name`` (module :mod:`agents.generation.versions`)."""
        if name not in self.population:
            raise KeyError(f"cannot load {name!r}: not a member ({self.population.names})")
        problem = check_state(state, self.population.state(name))
        with self.versions.swap(name, version, problem):
            self.population.load_state(name, state)

    # ------------------------------------------------------------------ prompts

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """Prompt token ids of a request (see :func:`encode_prompt`)."""
        return encode_prompt(self.tokenizer, request)

    def _rows(self, requests: Sequence[GenerationRequest]) -> list[_Row]:
        rows = []
        for index, req in enumerate(requests):
            check_request(index, req, self.population)
            self.versions.check(index, req.adapter, req.version)
            prompt_ids = self.encode_prompt(req)
            if not prompt_ids:
                raise ValueError(f"request {index}: the prompt encodes to no tokens")
            for k in range(req.n):
                seed = req.seed if req.seed is not None else self._rng.getrandbits(62)
                rows.append(
                    _Row(
                        index,
                        k,
                        req.adapter,
                        prompt_ids,
                        req.max_new_tokens,
                        req.temperature,
                        req.top_p,
                        row_seed(seed, k),
                        tuple(req.stop),
                        req.version,
                    )
                )
        return rows

    # ------------------------------------------------------------------ generation

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request (``n`` samples each); returns completions ordered by (request, sample)."""
        with self.versions.in_use():
            return self._generate_rows(self._rows(requests))

    def _generate_rows(self, rows: list[_Row]) -> list[Completion]:
        order = (
            sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids))
            if len(rows) > self.batch_size
            else list(range(len(rows)))
        )
        completions: list[Completion | None] = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, completion in zip(chunk, self._generate_chunk([rows[i] for i in chunk]), strict=True):
                completions[i] = completion
        return completions  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_chunk(self, rows: list[_Row]) -> list[Completion]:
        if self.engine == "loop":
            stopper = _RowStop(None, rows, self.tokenizer, next(self.population.model.parameters()).device)
            tokens, logprobs = run_loop(self.population, self.tokenizer, rows, self.stop_token_ids, self.options,
                                        self.fused_decode, stopper.feed)
            return self._completions(rows, tokens, logprobs, stopper.stopped_at)
        return self._generate_chunk_hf(rows)

    def _generate_chunk_hf(self, rows: list[_Row]) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        model = self.population.model
        device = next(model.parameters()).device
        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding
            input_ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
            attention[i, width - len(row.prompt_ids) :] = 1
        sampler = _RowSampler(rows, device, self.options.sampler)
        limits = [r.max_new_tokens for r in rows]
        stopper = _RowStop(sampler, rows, self.tokenizer, device)
        config = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max(limits),
            eos_token_id=self.stop_token_ids,
            pad_token_id=pad,
            use_cache=True,
            cache_implementation="static" if self.options.kv_cache == "static" else None,
            disable_compile=True,
        )
        kwargs = dict(
            past_key_values=(_preallocated_cache(model.config, width + max(limits))
                             if self.options.kv_cache == "preallocated" else None),
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([stopper]),
        )
        adapters = [r.adapter for r in rows]
        # The model's own generation defaults (penalties, temperature...) must not touch the raw logits the
        # sampler sees: swap in the clean config for the duration of the call.
        hf_model = model.base_model.model
        saved_config = hf_model.generation_config
        hf_model.generation_config = config
        try:
            with warnings.catch_warnings():
                # transformers 5.2x renames ``past_key_values`` to ``cache`` (older 5.x, e.g. the GPU machine's,
                # only know the former): keep the name every 5.x accepts, without its deprecation notice
                warnings.filterwarnings("ignore", message=".past_key_values. is deprecated", category=FutureWarning)
                if self.lora_impl == "peft":
                    if all(a is None for a in adapters):
                        with self.population.disabled():
                            model.generate(**kwargs)
                    else:
                        model.generate(**kwargs, adapter_names=[a or BASE_ADAPTER for a in adapters])
                else:
                    with self.population.mixed(adapters):
                        model.generate(**kwargs)
        finally:
            hf_model.generation_config = saved_config
        tokens = torch.stack(sampler.tokens, dim=1).tolist()
        logprobs = torch.stack(sampler.logprobs, dim=1).tolist()
        return self._completions(rows, tokens, logprobs, stopper.stopped_at)

    def _completions(self, rows: Sequence[_Row], tokens: list[list[int]], logprobs: list[list[float]],
                     stopped_at: Sequence[int | None]) -> list[Completion]:
        """Each row's completion from its generated tokens: cut at its budget, its first EOS (included) or the
        token that completed a stop string, whichever comes first."""
        stops = set(self.stop_token_ids)
        out = []
        for i, row in enumerate(rows):
            ids = tokens[i][: row.max_new_tokens]
            finish = "length"
            for j, t in enumerate(ids):
                if t in stops:
                    ids, finish = ids[: j + 1], "stop"
                    break
            extra: dict = {"seed": row.seed}
            at = stopped_at[i]
            if at is not None and at <= len(ids):  # a stop string ended the row before any EOS
                ids, finish = ids[:at], "stop"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if at is not None and at <= len(ids):
                text, extra["stop"] = cut_at_stop(text, row.stop)
            out.append(
                Completion(
                    request_index=row.request_index,
                    sample_index=row.sample_index,
                    adapter=row.adapter,
                    text=text,
                    prompt_token_ids=list(row.prompt_ids),
                    token_ids=ids,
                    logprobs=logprobs[i][: len(ids)],
                    finish_reason=finish,
                    extra=extra,
                    version=self.versions.completion_version(row.adapter, row.version),
                )
            )
        return out
