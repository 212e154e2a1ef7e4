"""The main job's step time, synchronous against asynchronous (``pipeline.max_staleness``), runs interleaved.

    python benchmarks/pipeline.py [--preset cpu-smoke] [--steps N] [--repeats 2] [--variants sync,process-1+1]
                                  [--out FILE.json] [--keep DIR]

Each *variant* is one way to run the preset (its values unchanged, ``--steps`` aside): ``sync`` is the
synchronous loop as the main job runs it (``pipeline.max_staleness 0``, the preset's threads); the others run
staleness 1 with a layout and thread counts::

    <layout>-<generation threads>+<update threads>[-active]

``layout`` is ``process`` (the generator in an engine process) or ``thread`` (in this process; both sides then
share one torch thread count, so the two numbers must be equal), ``-active`` runs with ``OMP_WAIT_POLICY=ACTIVE``
(default: ``PASSIVE``, what the ``populora`` command sets). Every run is a real ``populora train`` in a
subprocess, one at a time; the variants take turns (``sync``, ``process-1+1``, ``sync``, ``process-1+1``, ...),
so a machine whose load drifts slows them alike. Printed per variant: each run's median step seconds (its
``run_summary.json``), their median, the ratio to ``sync``'s (the issue's target: <= 0.75 for staleness 1), and
whether the runs of the variant have the same history value for value (the same seed must give the same run).

Timings on a shared machine are noisy: read the ratios of interleaved runs, and say how loaded the machine was
(printed: the load average before and after each run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANT = re.compile(r"^(sync|(process|thread)-(\d+)\+(\d+)(-active)?)$")
TIMED = ("step_seconds",)


def variant_flags(name: str) -> tuple[list[str], dict[str, str]]:
    """The ``populora train`` flags and environment of a variant (module docstring)."""
    m = VARIANT.match(name)
    if not m:
        raise SystemExit(f"unknown variant {name!r}: sync or <process|thread>-<gen>+<update>[-active]")
    if name == "sync":
        return [], {}
    layout, gen, upd, active = m.group(2), int(m.group(3)), int(m.group(4)), bool(m.group(5))
    if layout == "thread" and gen != upd:
        raise SystemExit(f"{name}: the thread layout shares one thread count between the sides")
    flags = ["--pipeline.max-staleness", "1", "--pipeline.layout", layout, "--threads", str(upd),
             "--generation.threads", str(gen)]
    return flags, ({"OMP_WAIT_POLICY": "ACTIVE"} if active else {})


def run_once(preset: str, steps: int | None, variant: str, run_dir: Path) -> dict:
    """One ``populora train`` run of ``variant``; its history, median step seconds and the load around it."""
    flags, env_extra = variant_flags(variant)
    env = dict(os.environ, HF_HUB_OFFLINE="1", **env_extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "populora_cli.main", "train", "--preset", preset, "--run-dir", str(run_dir),
            "--no-progress", *flags] + (["--steps", str(steps)] if steps else [])
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{variant}: exit {p.returncode}\n{p.stderr[-3000:]}")
    summary = json.loads((run_dir / "run_summary.json").read_text())
    return {"variant": variant, "run_dir": str(run_dir), "wall_s": wall, "load_before": load0,
            "load_after": os.getloadavg()[0], "median_step_s": summary["median_step_seconds"],
            "step_s": [h["step_seconds"] for h in summary["history"]],
            "history": [{k: v for k, v in h.items() if k not in TIMED} for h in summary["history"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="cpu-smoke")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: the preset's)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per variant (interleaved)")
    ap.add_argument("--variants", default="sync,process-1+1", help="comma-separated (module docstring)")
    ap.add_argument("--out", type=Path, default=None, help="write every run's record as JSON")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        variant_flags(v)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="populora-pipeline-"))
    root.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for rep in range(args.repeats):
        for v in variants:
            rec = run_once(args.preset, args.steps, v, root / f"{v}-r{rep}")
            records.append(rec)
            print(f"[{len(records)}/{args.repeats * len(variants)}] {v} r{rep}: median step "
                  f"{rec['median_step_s']:.1f} s, wall {rec['wall_s']:.0f} s, load {rec['load_before']:.1f} -> "
                  f"{rec['load_after']:.1f}", flush=True)
            if args.out:
                args.out.write_text(json.dumps(records, indent=1))
    by = {v: [r for r in records if r["variant"] == v] for v in variants}
    ref = statistics.median([r["median_step_s"] for r in by["sync"]]) if "sync" in by else None
    print(f"\n{'variant':<22} {'median step per run (s)':<30} {'median':>8} {'x sync':>7}  same history")
    for v, rs in by.items():
        med = statistics.median([r["median_step_s"] for r in rs])
        same = all(r["history"] == rs[0]["history"] for r in rs[1:]) if len(rs) > 1 else None
        runs = ", ".join(f"{r['median_step_s']:.1f}" for r in rs)
        ratio = f"{med / ref:.2f}" if ref else "-"
        print(f"{v:<22} {runs:<30} {med:8.1f} {ratio:>7}  {'-' if same is None else same}")
    if not args.keep:
        print(f"(run directories in {root})")


if __name__ == "__main__":
    main()
