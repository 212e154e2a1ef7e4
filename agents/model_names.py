"""The model names a run can ask for, known without loading anything (no torch): the ``random:<shape>`` prefix
and the shipped architecture configs it takes (``agents/shapes/*.json``).

The run configuration checks ``--model`` against them while the command line is parsed; :mod:`agents.models`,
which builds the models, re-exports them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HF_CONFIG", "RANDOM_PREFIX", "random_shapes"]

RANDOM_PREFIX = "random:"
"""``random:<shape>``: a published architecture with seeded random weights (:func:`agents.models.random_base`)."""
HF_CONFIG = "config.json"
"""A Hugging Face model directory's configuration file (not a run's ``config.json``, which
:mod:`selfplay.rundir` names)."""
_SHAPES_DIR = Path(__file__).resolve().parent / "shapes"


def random_shapes() -> list[str]:
    """Names of the shipped architecture configs (``random:<name>``), sorted."""
    return sorted(p.stem for p in _SHAPES_DIR.glob("*.json"))
