"""How long ``populora`` takes to answer a command line that does no work: ``--help``, ``train --help``, a flag
tyro cannot parse, a value validation refuses, in fresh interpreters, for one or more source trees side by side.

    python benchmarks/startup.py [--tree DIR ...] [--repeats 7]

Each tree is a checkout of the project (default: this one); every command runs as ``python -m
populora_cli.main ARGS`` with that tree first on ``PYTHONPATH`` and as its working directory, in the same
interpreter and environment, the trees' runs interleaved (tree 1, tree 2, tree 1, ...) so load on the machine
falls on all of them alike. Printed: per command and tree the median wall time of ``--repeats`` runs and its
ratio to the first tree's. A command a tree does not have (a sub-command added later) is shown as ``-``.
What a command imports is pinned by ``tests/selfplay/test_cli_imports.py`` (no torch on a bare parse); the
seconds belong here, not in a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "populora --help": ["--help"],
    "populora train --help": ["train", "--help"],
    "train --trainer.lr abc (parse error)": ["train", "--trainer.lr", "abc"],
    "train --trainer.lrr 1 (unknown flag)": ["train", "--trainer.lrr", "1"],
    "train --trainer.lr -1 (refused value)": ["train", "--trainer.lr", "-1"],
    "eval --help": ["eval", "--help"],
}


def once(tree: Path, args: list[str]) -> float | None:
    """Wall seconds of one ``python -m populora_cli.main ARGS`` in ``tree``; None if it failed unexpectedly (a
    usage error exits 2, help exits 0)."""
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", *args], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    return seconds if p.returncode in (0, 2) and "Traceback" not in p.stderr else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", type=Path, help="a checkout (repeatable; default: this one)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    print(f"{len(trees)} tree(s), {args.repeats} runs each, medians in seconds; {os.cpu_count()} cores")
    for name, argv in COMMANDS.items():
        times: dict[Path, list[float]] = {t: [] for t in trees}
        failed: set[Path] = set()
        for _ in range(args.repeats):
            for tree in trees:
                if tree in failed:
                    continue
                s = once(tree, argv)
                if s is None:
                    failed.add(tree)
                else:
                    times[tree].append(s)
        medians = {t: statistics.median(v) if v and t not in failed else None for t, v in times.items()}
        first = medians[trees[0]]
        cells = []
        for t in trees:
            m = medians[t]
            ratio = f" ({m / first:.2f}x)" if m is not None and first and t != trees[0] else ""
            cells.append("-" if m is None else f"{m:.2f}{ratio}")
        print(f"  {name:<40} " + "   ".join(cells))
    for i, t in enumerate(trees, 1):
        print(f"  tree {i}: {t}")


if __name__ == "__main__":
    main()
