"""AZR's prompt-length rule in front of any generation backend: a prompt longer than a limit is never generated.

AZR filters out prompts longer than its ``max_prompt_length`` (6,144 tokens) before they reach the engine; a
vLLM engine asked for a prompt past its ``max_model_len`` raises instead, which would end a run (and a resumed
run would meet the same prompt at the same step). :class:`PromptLimit` wraps a
:class:`~agents.generation.base.Generator`: each request's prompt is tokenised as the backends tokenise it
(:func:`agents.generation.hf.encode_prompt`: chat template and response prefix included); a request over the
limit is answered without generating, with ``n`` empty completions (no tokens, no log-probs,
``finish_reason == "length"``, ``extra["dropped"] == "prompt_too_long"`` and ``extra["prompt_tokens"]``); the
others go to the wrapped backend in one call, as they came. The run layer counts the dropped ones per role,
trains on none of them and hands the env no text for them (``None``, which the env scores as a format error
under every prompt set; docs/azr.md §14).
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.generation.base import Completion, GenerationRequest, Generator
from agents.generation.hf import encode_prompt

__all__ = ["DROPPED", "PromptLimit", "dropped"]

DROPPED = "prompt_too_long"
"""``Completion.extra["dropped"]`` of a request whose prompt was over the limit."""


def dropped(completion: object) -> bool:
    """Whether ``completion`` stands for a prompt the limit dropped (no generation happened)."""
    extra = getattr(completion, "extra", None)
    return isinstance(extra, dict) and extra.get("dropped") == DROPPED


class PromptLimit:
    """``generator`` with prompts over ``max_prompt_tokens`` tokens dropped (module docstring).

    Every other attribute (``refresh``, ``close``, ...) is the wrapped generator's."""

    def __init__(self, generator: Generator, tokenizer, max_prompt_tokens: int) -> None:
        if max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
        self.generator = generator
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["generator"], name)

    def refresh(self, names: Sequence[str] | None = None) -> None:
        self.generator.refresh(names)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """The wrapped backend's completions of the requests within the limit, and empty ``dropped`` ones for
        the others, ordered by ``(request_index, sample_index)`` as the contract says."""
        kept: list[int] = []
        out: list[Completion] = []
        for index, req in enumerate(requests):
            ids = encode_prompt(self.tokenizer, req)
            if len(ids) <= self.max_prompt_tokens:
                kept.append(index)
                continue
            out += [Completion(request_index=index, sample_index=k, adapter=req.adapter, text="",
                               prompt_token_ids=ids, token_ids=[], logprobs=[], finish_reason="length",
                               extra={"dropped": DROPPED, "prompt_tokens": len(ids)}) for k in range(req.n)]
        if kept:
            for c in self.generator.generate([requests[i] for i in kept]):
                c.request_index = kept[c.request_index]
                out.append(c)
        return sorted(out, key=lambda c: (c.request_index, c.sample_index))
