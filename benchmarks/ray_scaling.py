"""What ``--backend ray`` buys and costs, measured side by side in one run on one machine.

(1) **Sandbox scaling with nodes.** A Ray cluster with a head and two fake extra nodes
(``ray.cluster_utils.Cluster``) on this machine; sandbox actors (``populora_env``'s Sandbox with
``--workers`` workers each) on 1, 2 and 3 nodes; the same batch of sleep-bound jobs (each sleeps
``--sleep`` s: a 2-core machine cannot show CPU scaling, but it shows that the batch is spread over every node
and that nodes add throughput). The node counts are measured interleaved, ``--repeats`` times, and the median
jobs/s of each is printed with its ratio to one node and the chunks each node took.

(2) **Ray overhead per step.** The same ``tiny-random`` run (``--steps`` steps, evolution, 2+2 members) with
``--backend local``, with ``--backend ray`` on 1 trainer shard + 1 engine + a sandbox actor on 1 node
(``ray-1x1``: the cost of the actors alone — transfers, refresh, the sync metric) and on 2 + 2 + 2 nodes
(``ray-2x2``, the test's layout: two engines and two shards also work at the same time), all joining the same
cluster. Every run ends with bitwise the local adapters (checked here), so the differences of the median step
times are the per-step cost (or gain) of the actors. Set-up times are printed apart (Ray starts processes that
each load the base). On a loaded shared machine the step-time difference also carries the CPU share the
extra processes get (it came out negative there, see docs/ray.md), so the backend also logs
its own account at exit (``ray overhead:``): the driver's wall time in ``generate`` and ``update_many`` minus
the busiest engine's / shard's compute, i.e. what transfers, packing, refresh and scheduling cost per step.

Run: ``python benchmarks/ray_scaling.py [--jobs 24] [--sleep 0.5] [--workers 2] [--repeats 3] [--steps 4]
[--step-repeats 2]`` (``--skip-steps`` / ``--skip-sandbox`` for one part). The runs of part 2 are interleaved
(order reversed every repeat) so load changes on a shared machine hit every backend alike. Quote the machine's load (printed) with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--model", "tiny-random", "--env.num-teachers", "2", "--env.num-students", "2", "--rank", "4", "--alpha", "8",
    "--env.tasks-per-teacher", "2", "--env.samples-per-task", "2", "--env.sandbox-workers", "1",
    "--generation.teacher-max-new-tokens", "12", "--generation.student-max-new-tokens", "8",
    "--generation.temperature", "1.0", "--generation.batch-size", "4", "--trainer.entropy-coef", "0.01",
    "--trainer.lr", "1e-3", "--pbt.interval", "2", "--threads", "1", "--no-progress",
]


ARMS = {"local": "0", "ray-1x1": "1", "ray-2x2": "2"}


def sandbox_scaling(args: argparse.Namespace) -> dict:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from populora_env.sandbox import ExecJob, Limits
    from selfplay.distributed.config import RayConfig
    from selfplay.distributed.sandbox import RaySandbox, start_sandbox_actors

    limits = Limits(timeout_s=args.sleep + 5, memory_mb=256)
    rc = RayConfig(sandbox_workers_per_node=args.workers, placement_timeout_s=600)
    jobs = [ExecJob(f"import time\ntime.sleep({args.sleep})", call="1") for _ in range(args.jobs)]
    sandboxes = {}
    for nodes in (1, 2, 3):
        pg = placement_group([{"CPU": args.workers}] * nodes, strategy="STRICT_SPREAD")
        ray.get(pg.ready(), timeout=600)
        actors, infos = start_sandbox_actors(rc, asdict(limits), pg, nodes)
        sb = RaySandbox(actors, args.workers, limits, chunk=1)
        sb.run(jobs[: args.workers * nodes])  # warm
        sandboxes[nodes] = (sb, pg, infos)
    rates: dict[int, list[float]] = {1: [], 2: [], 3: []}
    used: dict[int, list[int]] = {}
    for rep in range(args.repeats):
        for nodes in ((1, 2, 3) if rep % 2 == 0 else (3, 2, 1)):
            sb = sandboxes[nodes][0]
            t0 = time.perf_counter()
            out = sb.run(jobs)
            dt = time.perf_counter() - t0
            assert [r.value for r in out] == ["1"] * len(jobs), [r.status for r in out]
            rates[nodes].append(len(jobs) / dt)
            used[nodes] = [sb.last_batch["chunks"].get(i, 0) for i in range(nodes)]
    for sb, pg, _ in sandboxes.values():
        sb.close()
        remove_placement_group(pg)
    med = {n: statistics.median(v) for n, v in rates.items()}
    ideal = args.workers / args.sleep
    print(f"\n(1) sandbox: {args.jobs} jobs sleeping {args.sleep} s, {args.workers} workers per node, chunk 1, "
          f"median of {args.repeats} (interleaved)")
    print(f"{'nodes':>5} {'jobs/s':>8} {'vs 1 node':>9} {'ideal':>7}  chunks per node   isolation")
    for n in (1, 2, 3):
        modes = ",".join(i["mode"] for i in sandboxes[n][2])
        print(f"{n:>5} {med[n]:>8.2f} {med[n] / med[1]:>8.2f}x {ideal * n:>7.2f}  {str(used[n]):<16} {modes}")
    return {"jobs_per_s": med, "ratio_3_vs_1": med[3] / med[1], "chunks_per_node": used}


def step_overhead(args: argparse.Namespace, address: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    order = [a for rep in range(args.step_repeats) for a in (list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1])]
    with tempfile.TemporaryDirectory(prefix="populora-ray-bench-") as tmp:
        for k, arm in enumerate(order):
            n = ARMS[arm]
            extra = [] if arm == "local" else [
                "--backend", "ray", "--ray.address", address, "--ray.trainers", n, "--ray.engines", n,
                "--ray.sandbox-nodes", n, "--ray.sandbox-workers-per-node", "1", "--ray.placement-timeout-s", "900"]
            run = Path(tmp) / f"{arm}-{k}"
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", *TINY, "--steps", str(args.steps),
                                "--checkpoint-every", str(args.steps), *extra, "--run-dir", str(run)],
                               capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"{arm} run failed:\n{p.stderr[-3000:]}")
            summary = json.loads((run / "run_summary.json").read_text())
            steps = [h["step_seconds"] for h in summary["history"]]
            line = next((ln for ln in p.stderr.splitlines() if "ray overhead: " in ln), None)
            over = json.loads(line.split("ray overhead: ", 1)[1]) if line else {}
            runs[arm].append({"dir": run, "median_step_s": statistics.median(steps), "steps_s": steps,
                              "actor_overhead_s": over.get("overhead_s", 0.0) / args.steps, "overhead": over,
                              "setup_s": summary["setup_seconds"], "wall_s": wall,
                              "phases": {key.removeprefix("time/"): v / args.steps
                                         for key, v in summary["totals_seconds"].items()}})
        from safetensors.torch import load_file

        ref = runs["local"][0]["dir"] / "adapters"
        same = {}
        for arm in ARMS:
            same[arm] = True
            for r in runs[arm]:
                for m in sorted(p.name for p in ref.iterdir()):
                    a = load_file(str(ref / m / "adapter_model.safetensors"))
                    b = load_file(str(r["dir"] / "adapters" / m / "adapter_model.safetensors"))
                    same[arm] = same[arm] and all((a[key] == b[key]).all() for key in a)
            rs = runs[arm]
            out[arm] = {"median_step_s": statistics.median(r["median_step_s"] for r in rs),
                        "per_run_median_step_s": [r["median_step_s"] for r in rs],
                        "actor_overhead_per_step_s": statistics.median(r["actor_overhead_s"] for r in rs),
                        "overhead_detail": [r["overhead"] for r in rs],
                        "setup_s": statistics.median(r["setup_s"] for r in rs),
                        "wall_s": statistics.median(r["wall_s"] for r in rs),
                        "phases": {key: statistics.median(r["phases"][key] for r in rs) for key in rs[0]["phases"]}}
    loc = out["local"]
    print(f"\n(2) tiny-random, {args.steps} steps, 2 teachers + 2 students, evolution at step 2; ray-NxN: N trainer "
          f"shards, N engines, sandbox on N nodes; {args.step_repeats} run(s) per backend, interleaved "
          f"({', '.join(order)}); medians")
    print(f"{'backend':>8} {'median step s':>14} {'vs local':>9} {'actor overhead/step':>20} {'set-up s':>9} "
          f"{'wall s':>7}  bitwise  per-step phases (s)")
    for arm in ARMS:
        r = out[arm]
        ph = " ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
        ov = "-" if arm == "local" else f"{r['actor_overhead_per_step_s']:.3f} s"
        print(f"{arm:>8} {r['median_step_s']:>14.2f} {r['median_step_s'] - loc['median_step_s']:>+8.2f}s {ov:>20} "
              f"{r['setup_s']:>9.1f} {r['wall_s']:>7.1f}  {str(same[arm]):<7}  {ph}")
    over = {arm: out[arm]["median_step_s"] - loc["median_step_s"] for arm in ARMS if arm != "local"}
    print("step time vs local: " + ", ".join(f"{a} {v:+.2f} s" for a, v in over.items())
          + "; actor overhead per step (driver wall time of generate + update_many minus the busiest engine's /"
          " shard's own compute: transfers, packing, refresh, scheduling): "
          + ", ".join(f"{a} {out[a]['actor_overhead_per_step_s']:.3f} s" for a in over))
    return {"runs": out, "step_vs_local_s": over, "adapters_equal": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step-repeats", type=int, default=2, help="runs per backend in part 2 (interleaved)")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--skip-sandbox", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    print(f"load average: {os.getloadavg()}  cores: {os.cpu_count()}")
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=4)
        cluster.wait_for_nodes(timeout=600)
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
        print(f"cluster: head + 2 fake nodes, 4 logical CPUs each, up in {time.perf_counter() - t0:.1f} s")
        result = {} if args.skip_sandbox else {"sandbox": sandbox_scaling(args)}
        if not args.skip_steps:
            result["steps"] = step_overhead(args, cluster.address)
        print(f"\nload average at the end: {os.getloadavg()}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
