"""Generation backends behind one contract (:mod:`agents.generation.base`).

``make_generator("hf", population, tokenizer, **kw)`` builds the Hugging Face backend (CPU or GPU, reads live
weights); ``make_generator("vllm", population, tokenizer, model_path=..., **kw)`` the vLLM multi-LoRA backend
(optional extra ``pip install .[vllm]``, GPU).
"""

from __future__ import annotations

from typing import Literal

from agents.generation.base import Completion, GenerationRequest, Generator
from agents.generation.hf import HFGenerator, HFOptions

__all__ = ["Completion", "GenerationRequest", "Generator", "HFGenerator", "HFOptions", "make_generator"]


def make_generator(kind: Literal["hf", "vllm"], population, tokenizer, max_prompt_tokens: int | None = None,
                   **kwargs) -> Generator:
    """Build a generation backend over ``population``.

    Args:
        kind: ``"hf"`` (:class:`HFGenerator`) or ``"vllm"`` (:class:`agents.generation.vllm.VLLMGenerator`).
        population: the :class:`~agents.population.LoRAPopulation` whose members requests name.
        tokenizer: the base's tokenizer (the vLLM backend uses it to apply the chat template, so prompt token
            ids are identical across backends).
        max_prompt_tokens: drop prompts longer than this before they reach the backend
            (:class:`agents.generation.limit.PromptLimit`); None: no limit.
        **kwargs: passed to the backend's constructor.
    """
    if kind == "hf":
        generator: Generator = HFGenerator(population, tokenizer, **kwargs)
    elif kind == "vllm":
        from agents.generation.vllm import VLLMGenerator

        generator = VLLMGenerator(population, tokenizer=tokenizer, **kwargs)
    else:
        raise ValueError(f"unknown generator kind {kind!r}; use 'hf' or 'vllm'")
    if max_prompt_tokens is None:
        return generator
    from agents.generation.limit import PromptLimit

    return PromptLimit(generator, tokenizer, max_prompt_tokens)
