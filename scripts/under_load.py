"""Run one or more tests N times in fresh pytest processes while K busy loops hold the cores: a gate that fails
only under load fails here, not in CI.

    python scripts/under_load.py --runs 30 --busy 2 tests/evaluation/test_code.py::test_per_test_time_limit_and_load_failures

Each run is ``python -m pytest -q -n 0 -p no:cacheprovider NODE...`` in a new interpreter (nothing warm is
shared between runs); the busy loops are plain ``while True: pass`` processes started before the first run and
killed after the last. Prints one line per run (status, wall seconds, the 1-minute load average at its end) and
a summary: passed of runs, median and maximum wall seconds. Exit 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", nargs="+", help="pytest node ids or paths")
    parser.add_argument("--runs", type=int, default=30, help="fresh pytest processes, one after the other")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes held for the whole time")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        parser.error(f"--runs must be >= 1 and --busy >= 0, got {args.runs} and {args.busy}")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    walls: list[float] = []
    passed = 0
    try:
        for i in range(1, args.runs + 1):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                   *args.nodes], capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            ok = proc.returncode == 0
            passed += ok
            print(f"run {i}: {'passed' if ok else 'FAILED'} {walls[-1]:.1f} s, load {os.getloadavg()[0]:.1f}",
                  flush=True)
            if not ok:
                print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n")
    finally:
        for p in busy:
            p.kill()
    print(f"passed {passed} of {args.runs}; wall median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
