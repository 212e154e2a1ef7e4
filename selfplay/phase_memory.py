"""Peak GPU memory per phase of a step (generation, update, evolution, checkpoint), on CUDA only.

``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the start of each phase: the bytes the
run's tensors held at the phase's peak (not the allocator's cached slack nor the CUDA context). A phase that
runs several times in a step (generation: the teachers', then the students') keeps its largest peak. Off CUDA
nothing is measured or recorded, so a CPU run's step is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["PhaseMemory"]


class PhaseMemory:
    """Per-phase peaks of one step, in bytes (:meth:`phase`), for ``device`` (``"cuda"``, ``"cuda:N"``)."""

    def __init__(self, device: str) -> None:
        self.on = str(device).startswith("cuda") and torch.cuda.is_available()
        self.device = torch.device(device) if self.on else None
        self.peaks: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the peak of ``name`` over the block (the largest of its blocks in this step)."""
        if not self.on:
            yield
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            torch.cuda.synchronize(self.device)
            peak = int(torch.cuda.max_memory_allocated(self.device))
            self.peaks[name] = max(self.peaks.get(name, 0), peak)

    def take(self) -> dict[str, int]:
        """This step's peaks, and a fresh start for the next step."""
        out, self.peaks = self.peaks, {}
        return out
