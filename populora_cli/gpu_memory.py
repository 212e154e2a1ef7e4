"""``--gpu-memory-gib N``: the run's GPU memory plan (:mod:`selfplay.memory_plan`) before any work.

``populora train|baseline|compare ... --dry-run --gpu-memory-gib N`` prints the plan line by line and exits 0
when it fits, 2 (one error line naming what to change) when it does not; without ``--dry-run`` a run that does
not fit exits 2 the same way before its model loads, and one that fits starts. Only this module's functions
import torch (the plan builds the model on the meta device), and only once the flag is given.
"""

from __future__ import annotations

import sys
from typing import Any

from populora_cli.errors import fail

FLAG = "--gpu-memory-gib"


def take_flag(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without ``--gpu-memory-gib N`` (or ``--gpu-memory-gib=N``), and ``N`` as given (None: absent)."""
    rest: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == FLAG:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
            continue
        if a.startswith(FLAG + "="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return rest, value


def check(cmd: str, plans: list[tuple[str, Any, int]], value: str, dry_run: bool) -> int | None:
    """Plan each ``(arm, cfg, members)`` on a GPU of ``value`` GiB (the flag's text): with ``dry_run`` print every
    plan and return 0 / 2; without, return 2 (one line) when one does not fit, else None (the work may start). A
    value that is not a positive number is exit 2 before anything is planned."""
    try:
        gib = float(value)
    except ValueError:
        return fail(cmd, f"{FLAG}: expected a number of GiB, got {value!r}")
    if not 0 < gib < 1e6:
        return fail(cmd, f"{FLAG}: must be > 0, got {value}")
    from selfplay.memory_plan import memory_plan

    failed = []
    for arm, cfg, members in plans:
        try:
            plan = memory_plan(cfg, members, gib)
        except ValueError as e:
            return fail(cmd, f"{FLAG}: {e}")
        if dry_run:
            print(f"[{arm}] {plan.text()}" if len(plans) > 1 else plan.text())
        if not plan.fits:
            failed.append((arm, plan))
    if failed:
        arm, plan = failed[0]
        return fail(cmd, (f"{arm} arm: " if len(plans) > 1 else "") + plan.error_line())
    if dry_run:
        return 0
    print(f"GPU memory plan: fits in {gib:g} GiB ({FLAG})", file=sys.stderr)
    return None
