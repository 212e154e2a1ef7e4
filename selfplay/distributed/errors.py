"""The error of ``--backend ray`` set-up (no Ray import): its own module so that :mod:`.cluster` (which starts
the sandbox actors) and :mod:`.sandbox` (whose actors can fail to start) both raise it without importing each
other."""

from __future__ import annotations

__all__ = ["ClusterError"]


class ClusterError(RuntimeError):
    """The cluster cannot hold the run as requested (one line; the command exits with status 2)."""
