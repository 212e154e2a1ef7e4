"""Decode-friendly weight layout on CPU: the frozen base's linear weights stored transposed while decoding.

A linear layer computes ``y = x W^T`` with ``W`` stored ``[out, in]`` row-major. At decode the batch ``x`` has only
a few rows (8-16), and MKL's GEMM with a transposed right operand is then 1.7-2.4x slower than the same product
with ``W^T`` stored contiguously (``[in, out]``), which runs near the time of reading the weights once (measured
on this project's CPU, one thread, SmolLM2-135M's shapes; ``benchmarks/generation.py --throughput`` shows the
effect on a whole decode step). For prefill-sized batches (hundreds of rows) the native layout is as fast or
faster, so the swap happens between the prefill and the first decode step.

:func:`transposed_weights` re-lays every frozen base ``nn.Linear`` weight on the CPU as ``W^T`` contiguous, seen
through a transposed view with the original shape, so every module computes the same product ``x W^T``
(``F.linear`` hands MKL the contiguous ``W^T``). The values are the same; the float sums of a GEMM may be
ordered differently between the two layouts (differences of a few ulps; the tests state the tolerance).
The original tensors are kept for the duration of the block (the base's weights twice in memory while
decoding) and put back on exit, so training and everything else see exactly the tensors they had.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["transposed_weights"]


@contextmanager
def transposed_weights(model: nn.Module) -> Iterator[int]:
    """Inside the block, every frozen (``requires_grad=False``), contiguous, 2-D CPU weight of an ``nn.Linear``
    of ``model`` is stored transposed (module docstring); a tied weight (the LM head and the embeddings) is
    swapped once. Yields the number of weights swapped; restores the original tensors on exit, even on error."""
    swapped: list[tuple[nn.Parameter, torch.Tensor]] = []
    seen: set[int] = set()
    try:
        for module in model.modules():
            if not isinstance(module, nn.Linear):
                continue
            w = module.weight
            if (id(w) in seen or w.requires_grad or w.device.type != "cpu" or w.dim() != 2
                    or not w.is_contiguous()):
                continue
            seen.add(id(w))
            original = w.data
            w.data = original.t().contiguous().t()
            swapped.append((w, original))
        yield len(swapped)
    finally:
        for w, original in swapped:
            w.data = original
