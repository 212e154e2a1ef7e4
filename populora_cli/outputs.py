"""An output directory that would write into a command's own inputs, refused before anything is written.

Every command that writes next to what it reads takes its output directory through :func:`overlap`:

* ``populora evolve --out`` and its ``--parents`` (the child's files would replace a parent's);
* ``populora report --out`` and its run directories (default ``<first run>/report``, a run's own report folder);
* ``populora eval --out-dir`` and the run, ``--baseline`` and ``--adapters`` directories it reads (default
  ``<run>/eval`` or ``<first adapter>/eval``), and ``populora eval --samples FILE --results`` (never ``FILE``);
* ``populora compare --from RUN ... --out`` (its runs may lie inside ``--out``: ``compare --preset``'s layout).

An output that *is* an input, *is inside* one (but for the input's own output folder, e.g. ``<run>/report``) or
*contains* one (but where the command's layout puts its inputs inside its output) is refused with one line naming
both flags and paths. Paths are compared resolved (links followed, ``..`` collapsed), so a link or a relative
spelling of an input is the input.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _resolved(p: str | Path) -> Path:
    return Path(os.path.abspath(Path(p).expanduser().resolve(strict=False)))


def overlap(
    out: str | Path,
    inputs: Iterable[str | Path],
    *,
    out_flag: str,
    input_flag: str,
    own: Iterable[str] = (),
    may_contain: bool = False,
) -> str | None:
    """The reason ``out`` may not be written, or ``None``.

    Args:
        out: the output directory (or file).
        inputs: the directories (or files) the command reads.
        out_flag: how the user named ``out`` (``--out``).
        input_flag: how the user named the inputs (``--parents``).
        own: folder names inside an input reserved for this command's output (``report``): ``out`` may be one
            of them or lie inside one.
        may_contain: ``out`` may hold the inputs (a layout that puts them there).
    """
    o = _resolved(out)
    for given in inputs:
        i = _resolved(given)
        relation = None
        if o == i:
            relation = "is"
        elif o.is_relative_to(i) and not any(o.is_relative_to(i / name) for name in own):
            relation = "is inside"
        elif i.is_relative_to(o) and not may_contain:
            relation = "contains"
        if relation:
            return f"{out_flag} {out} {relation} {input_flag} {given}; nothing was written: choose another {out_flag}"
    return None


__all__ = ["overlap"]
