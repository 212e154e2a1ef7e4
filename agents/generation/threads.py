"""Torch's intra-op CPU threads during generation (one switch for every caller).

Decoding a small model on CPU is memory-bound, so the right thread count differs from the updates'
(``--threads``). OpenMP worker threads that wait actively spin on their cores between parallel regions, which
on a busy machine steals the cores the other threads need: the ``populora`` command therefore sets
``OMP_WAIT_POLICY=PASSIVE`` (unless the user set it) before torch is imported, since libgomp reads it once, when
it loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["generation_threads"]


@contextmanager
def generation_threads(threads: int, device: str) -> Iterator[int]:
    """Run the block with ``threads`` torch intra-op threads when generating on CPU (``threads`` 0, or another
    device: leave them as they are); the previous count is restored afterwards, even on error. Yields the
    count in effect."""
    before = torch.get_num_threads()
    if threads > 0 and device == "cpu":
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
