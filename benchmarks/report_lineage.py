"""What a long ``lineage.jsonl`` costs ``populora report``: reading it (:class:`selfplay.rundir.RunDir`), the
retention of every child (``evaluation.report.numerics.children``) and the whole report, on a synthetic run.

    python benchmarks/report_lineage.py [--records 100000] [--steps 200] [--members 8] [--repeats 3] [--no-report]

The run logs ``--steps`` steps of conservative ratings for ``--members`` members (half teachers, half students)
and a lineage of ``--records`` replacements spread evenly over the steps, each culling the next member of its role
in turn (so a slot is replaced many times per step when the records outnumber the steps: the shape of a crafted
or very long lineage). Medians of ``--repeats`` runs of each phase, written to a fresh temporary directory per
repeat. Run it against another checkout with ``PYTHONPATH=<checkout>`` to compare (the functions it calls exist
in both).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from evaluation.report import load_run, make_report
from evaluation.report.numerics import children
from selfplay import tags


def write_run(root: Path, records: int, steps: int, members: int) -> Path:
    run = root / "run"
    run.mkdir()
    names = [f"teacher_{i}" for i in range(members // 2)] + [f"student_{i}" for i in range(members - members // 2)]
    roles = {n: n.split("_")[0] for n in names}
    mapping = {"agent_to_member": {n: n for n in names}, "agent_roles": roles}
    (run / "config.json").write_text(json.dumps({"name": "run", "arm": "population", "mapping": mapping,
                                                 "config": {"steps": steps}}))
    writer = EventFileWriter(str(run))
    for step in range(1, steps + 1):
        values = [summary_pb2.Summary.Value(tag=tags.member(n, "conservative"),
                                            simple_value=float((i * 7 + step * 3) % members))
                  for i, n in enumerate(names)]
        writer.add_event(event_pb2.Event(step=step, wall_time=1e9 + step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    by_role = {r: [n for n in names if roles[n] == r] for r in ("teacher", "student")}
    with open(run / "lineage.jsonl", "w") as f:
        for i in range(records):
            role = ("teacher", "student")[i % 2]
            slot = by_role[role][(i // 2) % len(by_role[role])]
            f.write(json.dumps({"step": 1 + i * steps // records, "role": role, "culled": slot,
                                "parents": [slot], "operator": ("dare", "ties")[i % 3 == 0]}) + "\n")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-report", action="store_true", help="time reading and the retention only")
    a = ap.parse_args()
    times: dict[str, list[float]] = {"load_run": [], "children": [], "make_report": []}
    for _ in range(a.repeats):
        root = Path(tempfile.mkdtemp(prefix="report-lineage-"))
        try:
            run = write_run(root, a.records, a.steps, a.members)
            t0 = time.perf_counter()
            data = load_run(run)
            t1 = time.perf_counter()
            kids = children(data)
            t2 = time.perf_counter()
            if not a.no_report:
                make_report([run])
            t3 = time.perf_counter()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        times["load_run"].append(t1 - t0)
        times["children"].append(t2 - t1)
        if not a.no_report:
            times["make_report"].append(t3 - t2)
    print(f"{a.records} lineage records ({len(data.lineage)} read, {len(kids)} children), {a.steps} steps, "
          f"{a.members} members, {a.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    for k, v in times.items():
        if v:
            print(f"  {k:12s} median {statistics.median(v):8.3f} s")


if __name__ == "__main__":
    main()
