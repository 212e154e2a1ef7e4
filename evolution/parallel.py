"""Per-module execution of the operators: one generator per module, chunks in a thread pool, scratch arenas.

Module ``j`` of an operator call draws its randomness from its own ``torch.Generator().manual_seed(seeds[j])``,
``seeds = torch.randint(0, 2**62, (L,), generator=op_generator)`` (:func:`module_seeds`), so a child does not
depend on how the modules are scheduled: it is bitwise identical for any ``torch.get_num_threads()``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from evolution.keys import LoraModule

__all__ = ["CHUNK", "map_modules", "module_seeds", "one_thread", "workspace"]

CHUNK = 8
"""Modules per work item: the small ``r×r`` linear algebra (eigh/SVD/solve) is batched over a chunk, and chunks
run in parallel threads (see :func:`map_modules`)."""

_TLS = threading.local()


def workspace(numel: int, dtype: torch.dtype, device: torch.device, tag: str = "gram") -> Tensor:
    """A reusable flat scratch buffer (per thread, tag, dtype and device) of at least ``numel`` elements.

    Fresh multi-megabyte allocations are returned to the OS on free and page-faulted in again on every use, which
    cost more than the Gram products themselves. The buffers grow, never shrink: per worker thread the largest
    ``d × k·r`` float64 Gram block (~10 MB for a 7B model's MLP at rank 32) and, for DARE, the masked factors of
    one chunk of modules (~50 MB).
    """
    cache = getattr(_TLS, "ws", None)
    if cache is None:
        cache = _TLS.ws = {}
    key = (tag, dtype, str(device))
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch intra-op threads = 1 inside the block (the previous count is restored)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def module_seeds(generator: torch.Generator, n: int) -> list[int]:
    """One seed per module, ``torch.randint(0, 2**62, (n,), generator=generator)`` (the module's randomness comes
    from ``torch.Generator().manual_seed(seed)``)."""
    return torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()


def map_modules(
    modules: Sequence[LoraModule],
    generator: torch.Generator,
    device: torch.device,
    work: Callable[[Sequence[LoraModule], list[torch.Generator]], dict[str, Tensor]],
    rank_of: Callable[[LoraModule], int] = lambda m: 0,
) -> dict[str, Tensor]:
    """Run ``work(chunk, generators)`` over chunks of :data:`CHUNK` modules and merge the children's tensors.

    Module ``j`` gets its own ``torch.Generator().manual_seed(seeds[j])`` with ``seeds`` drawn from ``generator``
    (:func:`module_seeds`, in module order), so the result does not depend on how chunks are scheduled. Chunks
    hold modules of one rank (``rank_of``; PEFT ``rank_pattern`` adapters mix ranks). On CPU the chunks run in a
    pool of ``torch.get_num_threads()`` Python threads with torch's intra-op threads set to 1: MKL does not
    parallelise the skinny ``d×r`` GEMMs and ``uniform_``/``randn`` are serial kernels, so module-level parallelism
    is what uses the cores (and it has no OpenMP barriers, which stall on an oversubscribed machine). Every path
    runs each op single-threaded, so 1 and N workers give bitwise-identical children. Each work item runs in a
    copy of the caller's ``contextvars`` context (e.g. :func:`evolution.gram.gram_precision`).
    """
    seeds = module_seeds(generator, len(modules))
    ranks = [rank_of(m) for m in modules]
    items = []
    for r in dict.fromkeys(ranks):  # chunks share one rank
        idx = [i for i, ri in enumerate(ranks) if ri == r]
        for c in range(0, len(idx), CHUNK):
            sel = idx[c : c + CHUNK]
            items.append(([modules[i] for i in sel], [seeds[i] for i in sel]))
    gen_device = generator.device

    def run(item: tuple[Sequence[LoraModule], list[int]]) -> dict[str, Tensor]:
        mods, sds = item
        return work(mods, [torch.Generator(device=gen_device).manual_seed(s) for s in sds])

    workers = min(torch.get_num_threads(), len(items)) if device.type == "cpu" else 1
    with one_thread():
        if workers <= 1:
            outs = [run(it) for it in items]
        else:
            # one context copy per item: a Context cannot be entered by two threads at once
            contexts = [contextvars.copy_context() for _ in items]
            with ThreadPoolExecutor(workers) as pool:
                outs = list(pool.map(lambda ctx, it: ctx.run(run, it), contexts, items))
    child: dict[str, Tensor] = {}
    for out in outs:
        child.update(out)
    return child
