"""The generation contract shared by every backend (Hugging Face on CPU, vLLM multi-LoRA on GPU).

A request names the adapter (population member) that must act; a backend serves a list of requests with
mixed adapters in as few batched passes as it can, and returns one :class:`Completion` per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete with one adapter.

    Attributes:
        adapter: population member whose LoRA acts; ``None`` means the base model with adapters disabled.
        prompt: user text (the backend applies the tokenizer's chat template when the model has one and
            ``chat`` is true) or a list of chat messages ``[{"role": ..., "content": ...}]``.
        max_new_tokens: generation budget.
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling threshold (1.0 = off).
        seed: per-request sampling seed (``None``: the backend's own RNG).
        n: number of samples for this prompt.
        chat: apply the chat template (ignored when the tokenizer has none). The env's requests say it per
            prompt set (``infos[a]["requests"][k]["chat_template"]``).
        prefix: response prefix the completion continues (a pre-filled answer opening, ``"<think>"``...). The
            text generated from always ends with it (:func:`populora_env.prompts.with_prefix`): with the chat
            template it follows the assistant opening; a raw prompt gets it appended unless it already ends
            with it. It is part of ``Completion.prompt_token_ids``, not of the completion's text or tokens.
        stop: strings that end the completion (the closing answer tag); the completion's text ends with the
            first one produced, its tokens with the token that completes it.
        version: the version of ``adapter`` to generate with (an asynchronous run's schedule,
            :mod:`agents.generation.versions`): an engine that does not serve exactly that version refuses the
            request; ``None``: whatever version the engine holds.
    """

    adapter: str | None
    prompt: str | Sequence[dict]
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    chat: bool = True
    prefix: str = ""
    stop: tuple[str, ...] = ()
    version: int | None = None


@dataclass
class Completion:
    """One sampled completion.

    ``logprobs[i]`` is log pi(token_ids[i] | prompt_token_ids + token_ids[:i]) under the adapter's *unscaled*
    (temperature 1, no top-p) distribution, i.e. the behaviour log-probability a policy-gradient trainer
    compares against. ``prompt_token_ids`` are exactly the tokens generated from (chat template and response
    prefix included). ``finish_reason`` is ``"stop"`` after an EOS token or a stop string, ``"length"`` at the
    token budget. ``version`` is the version of the adapter that generated it (the request's, else the one the engine
    had loaded; ``None`` when the engine tracks none: the synchronous loop reads live weights).
    """

    request_index: int
    sample_index: int
    adapter: str | None
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"] = "stop"
    extra: dict = field(default_factory=dict)
    version: int | None = None


@runtime_checkable
class Generator(Protocol):
    """A generation backend: ``generate(requests)`` returns the completions of every request, ordered by
    ``(request_index, sample_index)``. ``refresh(name)`` makes the backend pick up new weights of a member
    after an update (a no-op for backends that read the live model)."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def refresh(self, names: Sequence[str] | None = None) -> None: ...


@runtime_checkable
class VersionedGenerator(Generator, Protocol):
    """A backend that serves versions of the members' adapters given to it (the lifecycle contract of
    :mod:`agents.generation.versions`): ``load_version(name, version, state)`` makes ``state`` (PEFT keys, as
    ``LoRAPopulation.state`` gives) the weights it serves as ``version`` of ``name``, atomically, keeping the old
    version while a call uses it and when the new one is refused (:class:`~agents.generation.versions.
    AdapterLoadError`)."""

    def load_version(self, name: str, version: int, state: dict) -> None: ...
