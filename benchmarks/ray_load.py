"""Does a seed's result depend on what else runs? The tiny AZR baseline with ``--backend local`` and ``--backend
ray`` (a private Ray instance), alone, side by side, and beside busy loops; and the same run at other thread counts.

Every run is ``populora baseline`` on ``tiny-random`` (``--steps`` steps, a checkpoint after each, one torch thread
for the updates and ``--generation-threads`` for generation, in the driver and in Ray's shard and engine alike).
The conditions, in this order:

* ``local-alone`` (the reference) and ``ray-alone``, one after the other;
* ``local-together`` and ``ray-together`` at the same time;
* ``--busy`` busy loops (``python -c 'while 1: pass'``) running, then ``--repeats`` rounds of two Ray runs and a
  local run at the same time beside them;
* with ``--threads-too``, the local run again with 2 torch threads for updates and generation (what another
  ``--threads`` / ``--generation.threads``, or ``populora compare --parallel K`` giving each run ``cores // K``
  threads, changes).

Each run is compared with the reference, bit for bit: the final adapter's tensors and every checkpoint's
``env_state.json`` (ratings, buffers, RNG). Printed: one line per run (``equal`` or what differs, with the largest
absolute difference of the adapter's weights), the machine's load average at the start and at the end.

Run: ``python benchmarks/ray_load.py [--steps 2] [--repeats 1] [--busy 2] [--generation-threads 2] [--threads-too]``
(needs the Ray extra: ``bash scripts/install.sh --ray``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--model",
    "tiny-random",
    "--env.num-teachers",
    "2",
    "--env.num-students",
    "2",
    "--rank",
    "4",
    "--alpha",
    "8",
    "--env.tasks-per-teacher",
    "2",
    "--env.samples-per-task",
    "2",
    "--env.sandbox-workers",
    "1",
    "--generation.teacher-max-new-tokens",
    "12",
    "--generation.student-max-new-tokens",
    "8",
    "--generation.temperature",
    "1.0",
    "--trainer.entropy-coef",
    "0.01",
    "--trainer.lr",
    "1e-3",
    "--pbt.interval",
    "2",
    "--no-progress",
    "--pbt.min-final-age",
    "0",
    "--generation.batch-size",
    "4",
    "--checkpoint-every",
    "1",
]
RAY = ["--backend", "ray", "--ray.sandbox-workers-per-node", "1", "--ray.placement-timeout-s", "600"]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)  # a private instance per Ray run
    return env


def _start(run: Path, steps: int, gen_threads: int, ray: bool, threads: int = 1) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "populora_cli.main",
        "baseline",
        *TINY,
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--generation.threads",
        str(gen_threads),
        *(RAY if ray else []),
        "--run-dir",
        str(run),
    ]
    log = open(run.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=_env(threads), cwd=REPO)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _wait(procs: dict[str, subprocess.Popen]) -> None:
    for name, p in procs.items():
        p.wait()
        p.log.close()  # type: ignore[attr-defined]
        if p.returncode != 0:
            sys.exit(f"{name} failed (exit {p.returncode}): see its log next to the run")


def _digest(run: Path) -> dict[str, str]:
    """A hash of the final adapter's tensors and of each checkpoint's ``env_state.json``."""
    from safetensors.torch import load_file

    out = {}
    for p in sorted((run / "adapters").rglob("*.safetensors")):
        t = load_file(str(p))
        out[str(p.relative_to(run))] = hashlib.sha256(
            b"".join(t[k].numpy().tobytes() for k in sorted(t))
        ).hexdigest()
    for p in sorted((run / "checkpoints").rglob("env_state.json")):
        out[str(p.relative_to(run))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _weight_gap(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = (load_file(str(r / "adapters" / "azr" / "adapter_model.safetensors")) for r in (a, b))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--repeats", type=int, default=1, help="rounds of two Ray runs and a local run beside busy loops"
    )
    ap.add_argument("--busy", type=int, default=2, help="busy loops running during those rounds")
    ap.add_argument("--generation-threads", type=int, default=2)
    ap.add_argument("--threads-too", action="store_true", help="also the local run with 2 torch threads")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ray_load_"))
    print(f"runs in {root}; load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    runs: list[str] = []

    def batch(specs: dict[str, tuple[bool, int]]) -> None:
        _wait(
            {
                n: _start(root / n, args.steps, args.generation_threads, ray, threads)
                for n, (ray, threads) in specs.items()
            }
        )
        runs.extend(specs)

    batch({"local-alone": (False, 1)})
    batch({"ray-alone": (True, 1)})
    batch({"local-together": (False, 1), "ray-together": (True, 1)})
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    try:
        for i in range(1, args.repeats + 1):
            batch({f"ray-a{i}-busy": (True, 1), f"ray-b{i}-busy": (True, 1), f"local-c{i}-busy": (False, 1)})
    finally:
        for b in busy:
            b.kill()
            b.wait()
    if args.threads_too:
        batch({"local-2-threads": (False, 2)})
    ref = _digest(root / "local-alone")
    for name in runs[1:]:
        got = _digest(root / name)
        diff = sorted(k for k in ref.keys() | got.keys() if ref.get(k) != got.get(k))
        gap = _weight_gap(root / "local-alone", root / name)
        print(
            f"{name}: "
            + ("equal" if not diff else f"differs in {', '.join(diff)}")
            + f" (max |Δw| {gap:.3g})"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
