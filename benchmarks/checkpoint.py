"""What verifiable checkpoints cost: ``write_checkpoint`` with and without its ``MANIFEST.json`` (a SHA-256 per
file), and ``verify_checkpoint`` (what a resume reads), side by side on one payload.

    python benchmarks/checkpoint.py [--members 4] [--member-mb 29] [--repeats 5] [--dir /tmp]

The payload imitates a population checkpoint: per member an adapter file of ``member-mb / 3`` MiB and an
optimizer file of twice that (Adam's two moments), plus small JSON files. The default, 4 members of 29 MiB, is the
cpu-smoke preset's population (SmolLM2-135M, rank 8 on all seven projections: 2.44M parameters per member).
Everything is written with fsync, so the disk's write speed is in both timings; the manifest's extra cost is one
read and hash of every file (from the page cache, just written). Medians of ``--repeats``; the ratio is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from selfplay import checkpoint as ck


def payload(members: int, member_mb: float):
    adapter = os.urandom(int(member_mb / 3 * 2**20))
    optimizer = os.urandom(2 * len(adapter))

    def write(d: Path) -> None:
        for m in range(members):
            md = d / "population" / f"member_{m}"
            md.mkdir(parents=True)
            (md / "adapter_model.safetensors").write_bytes(adapter)
            (md / "optimizer.pt").write_bytes(optimizer)
        (d / "env_state.json").write_text("[" + ", ".join(["{}"] * 10_000) + "]")  # JSON: verification decodes it
        (d / "loop_state.json").write_text("[" + ", ".join(["{}"] * 10_000) + "]")

    return write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--member-mb", type=float, default=29.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    a = ap.parse_args()
    write = payload(a.members, a.member_mb)
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=a.dir))
    real_manifest = ck.write_manifest
    times: dict[str, list[float]] = {"without manifest": [], "with manifest": [], "verify": []}
    try:
        for i in range(a.repeats):
            for label in ("without manifest", "with manifest"):  # alternate: both see the same machine state
                ck.write_manifest = real_manifest if label == "with manifest" else (lambda d, step: {})
                t0 = time.perf_counter()
                final = ck.write_checkpoint(root / label.replace(" ", "_"), i + 1, write, keep=1)
                times[label].append(time.perf_counter() - t0)
            ck.write_manifest = real_manifest
            t0 = time.perf_counter()
            ck.verify_checkpoint(root / "with_manifest" / "checkpoints" / final.name)
            times["verify"].append(time.perf_counter() - t0)
    finally:
        ck.write_manifest = real_manifest
        shutil.rmtree(root, ignore_errors=True)
    size = a.members * a.member_mb
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"payload {size:.0f} MiB ({a.members} members), {a.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    for k, v in med.items():
        print(f"  {k:17s} median {v:7.3f} s  ({size / v:6.0f} MiB/s)")
    print(f"  with / without manifest: {med['with manifest'] / med['without manifest']:.2f}x")


if __name__ == "__main__":
    main()
