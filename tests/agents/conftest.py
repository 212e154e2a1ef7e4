"""Shared fixtures for tests of ``agents`` (models, population, generation, trainer...).

Everything here runs on the ``"tiny-random"`` base (2 layers, hidden 64, SmolLM2 tokenizer and chat
template, seeded weights; built once into the model cache, then ~0.3 s to load). Nothing downloads:
``HF_HUB_OFFLINE=1`` is set for every test under ``tests/agents``, and torch runs one intra-op thread
(``POPULORA_TEST_THREADS`` overrides it).

Fixtures:

* ``tiny_tokenizer`` (session): SmolLM2's tokenizer (pad token = EOS ``<|im_end|>``, chat template).
* ``tiny_base_path`` (session): the local HF directory of the tiny-random model (for vLLM / reload tests).
* ``tiny_base`` (function): ``(model, tokenizer)`` like ``load_base("tiny-random")``: a FRESH frozen copy
  of a session-cached pristine model (a ``deepcopy``, milliseconds), because wrapping a base in a
  ``LoRAPopulation`` injects LoRA layers into it in place.
* ``population`` (function): a factory ``population(names=("ma", "mb"), rank=4, alpha=8, seed=0,
  nonzero_std=None, **kwargs) -> LoRAPopulation`` on a fresh tiny base. With ``nonzero_std`` set, every
  member gets a distinct seeded random B of that std (``randomize_member``), so members really differ
  (0.5 gives clearly different greedy outputs on tiny-random). The tokenizer is ``tiny_tokenizer``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# Tiny models on a shared CPU: one intra-op thread is >10x faster than two fighting over a busy core
# (OpenMP synchronisation dominates 64-wide matmuls). Override with POPULORA_TEST_THREADS=N.
torch.set_num_threads(int(os.environ.get("POPULORA_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def _pristine_tiny():
    from agents.models import load_base

    return load_base("tiny-random")


@pytest.fixture(scope="session")
def tiny_tokenizer(_pristine_tiny):
    """SmolLM2's tokenizer (shared: do not mutate it)."""
    return _pristine_tiny[1]


@pytest.fixture(scope="session")
def tiny_base_path() -> str:
    """Local HF directory of the tiny-random model."""
    from agents.models import resolve_base

    return resolve_base("tiny-random")


@pytest.fixture
def tiny_base(_pristine_tiny):
    """``(model, tokenizer)``: a fresh frozen eval-mode copy of the tiny-random base."""
    model, tokenizer = _pristine_tiny
    return copy.deepcopy(model), tokenizer


@pytest.fixture
def population(_pristine_tiny) -> Callable[..., object]:
    """Factory of LoRA populations on fresh tiny-random bases (see the module docstring)."""
    from agents.population import LoRAPopulation, randomize_member

    def make(
        names: Sequence[str] = ("ma", "mb"),
        rank: int = 4,
        alpha: float = 8,
        seed: int = 0,
        nonzero_std: float | None = None,
        **kwargs,
    ) -> LoRAPopulation:
        base = copy.deepcopy(_pristine_tiny[0])
        pop = LoRAPopulation(base, list(names), rank=rank, alpha=alpha, seed=seed, **kwargs)
        if nonzero_std is not None:
            for name in pop.names:
                randomize_member(pop, name, std=nonzero_std, seed=seed)
        return pop

    return make
