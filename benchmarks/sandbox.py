"""Throughput of the sandbox against the two designs it replaces, on the same self-play-like jobs.

(a) ``populora_env.sandbox.Sandbox``: warm workers in bubblewrap, fork per job, uid drop, rlimits, seccomp;
(b) a fresh ``python3 -c`` process per job with rlimits (the human-eval / evalplus style);
(c) an unprotected in-process ``exec`` pool (the AZR style: no isolation at all, state leaks between jobs).

Jobs are small pure functions applied to an input with an expected output (AZR's deduction check), e.g.
``f([3, 1, 2])`` compared with ``[1, 2, 3]``. Run: ``python benchmarks/sandbox.py [--jobs 2000] [--workers 2]``.

``--baseline-ref REV`` adds a side-by-side figure for the sandbox as it was at git revision ``REV`` (e.g. the
commit before a new isolation layer): that tree's ``populora_env`` is extracted to a temporary directory and
both versions run the same jobs, each in its own subprocess, interleaved repeat by repeat (the order
alternating), so load changes on a shared machine hit both alike. It prints each median and their ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from populora_env.sandbox import ExecJob, Limits, Sandbox

_PROGRAMS = [
    ("def f(xs):\n    return sorted(xs)[::-1]", lambda r: [r.randint(-50, 50) for _ in range(r.randint(1, 8))]),
    ("def f(s):\n    return ''.join(c.upper() if i % 2 else c for i, c in enumerate(s))",
     lambda r: "".join(r.choice("abcdefgh") for _ in range(r.randint(1, 12)))),
    ("def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     lambda r: r.randint(0, 60)),
    ("from collections import Counter\ndef f(s):\n    return Counter(s).most_common(2)",
     lambda r: "".join(r.choice("aabbbc") for _ in range(r.randint(1, 10)))),
    ("def f(d):\n    return {v: k for k, v in d.items()}", lambda r: {f"k{i}": r.randint(0, 9) for i in range(4)}),
    ("def f(xs):\n    out = []\n    for x in xs:\n        if x % 2 == 0:\n            out.append(x * x)\n"
     "    return sum(out)", lambda r: [r.randint(0, 20) for _ in range(r.randint(0, 10))]),
    ("import math\ndef f(n):\n    return [i for i in range(2, n) if all(i % p for p in range(2, math.isqrt(i) + 1))]",
     lambda r: r.randint(2, 80)),
    ("def f(s):\n    stack = []\n    for c in s:\n        if c == '(':\n            stack.append(c)\n"
     "        elif stack:\n            stack.pop()\n        else:\n            return False\n    return not stack",
     lambda r: "".join(r.choice("()") for _ in range(r.randint(0, 10)))),
]


def make_jobs(n: int, seed: int = 0) -> list[ExecJob]:
    """``n`` AZR-like deduction checks: program + input, compared with the true output."""
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        code, gen = rng.choice(_PROGRAMS)
        arg = gen(rng)
        ns: dict = {}
        exec(code, ns)  # our own fixed programs, to know the expected output
        jobs.append(ExecJob(code=code, call=f"f({arg!r})", compare_to=repr(ns["f"](arg))))
    return jobs


# ---------------------------------------------------------------------------------------------- (b)
_SPAWN_TEMPLATE = """
import json, sys
job = json.loads(sys.argv[1])
ns = {"__name__": "__main__"}
exec(job["code"], ns)
value = eval(job["call"], ns)
print(json.dumps({"value": repr(value), "match": value == eval(job["compare_to"], ns)}))
"""


def _rlimits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (3, 4))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _spawn_one(job: ExecJob) -> tuple[str | None, bool | None]:
    payload = json.dumps({"code": job.code, "call": job.call, "compare_to": job.compare_to})
    try:
        out = subprocess.run([sys.executable, "-I", "-c", _SPAWN_TEMPLATE, payload], capture_output=True,
                             text=True, timeout=5, preexec_fn=_rlimits, stdin=subprocess.DEVNULL)
        res = json.loads(out.stdout)
        return res["value"], res["match"]
    except (subprocess.TimeoutExpired, ValueError):
        return None, None


def run_spawn(jobs: list[ExecJob], workers: int) -> list[tuple[str | None, bool | None]]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(_spawn_one, jobs))


# ---------------------------------------------------------------------------------------------- (c)
def _exec_one(job: tuple[str, str, str]) -> tuple[str | None, bool | None]:
    code, call, compare_to = job
    try:
        ns: dict = {"__name__": "__main__"}
        exec(code, ns)  # unprotected, in the pool process: what the sandbox exists to avoid
        value = eval(call, ns)
        return repr(value), value == eval(compare_to, ns)
    except Exception:
        return None, None


def run_exec_pool(pool, jobs: list[ExecJob]) -> list[tuple[str | None, bool | None]]:
    return list(pool.imap(_exec_one, [(j.code, j.call, j.compare_to) for j in jobs], chunksize=1))


# ---------------------------------------------------------------------------------------------- side by side
_REPO = Path(__file__).resolve().parents[1]


def _tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds used by the processes under ``roots`` and the children they reaped (utime + stime + cutime
    + cstime from /proc): the workers, and every job, which its worker waits for."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0, list(roots)
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
    return total / tick


def sandbox_once(n_jobs: int, workers: int) -> dict:
    """One (a) measurement in this process: rate, CPU per job (workers + jobs, and the host's dispatch), wrong
    results, layers, where the sandbox was imported from. CPU time moves much less than wall time with the
    load of a shared machine."""
    import populora_env.sandbox as sandbox_pkg

    jobs = make_jobs(n_jobs)
    with Sandbox(workers=workers, limits=Limits(timeout_s=5.0, memory_mb=512)) as sb:
        time.sleep(0.5)  # let the workers settle after the start-up probe
        cpu0, host0, t0 = _tree_cpu_s(sb.worker_pids), sum(os.times()[:2]), time.perf_counter()
        res = sb.run(jobs)
        wall = time.perf_counter() - t0
        host_cpu = sum(os.times()[:2]) - host0
        time.sleep(0.5)  # the last jobs' cleanup (current version) belongs to the batch
        worker_cpu = _tree_cpu_s(sb.worker_pids) - cpu0
        layers = [layer.split(":")[0] for layer in sb.isolation]
    bad = sum(1 for r in res if not (r.status == "ok" and r.match is True))
    return {"rate": len(jobs) / wall, "worker_cpu_ms": 1000 * worker_cpu / len(jobs),
            "host_cpu_ms": 1000 * host_cpu / len(jobs), "bad": bad, "layers": layers,
            "module": sandbox_pkg.__file__}


def _extract(rev: str, into: str) -> None:
    """``populora_env`` as of git revision ``rev``, written under ``into``."""
    data = subprocess.run(["git", "-C", str(_REPO), "archive", "--format=tar", rev, "populora_env"],
                          capture_output=True, check=True).stdout
    tar_path = Path(into) / "tree.tar"
    tar_path.write_bytes(data)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")


def _measure_in_subprocess(root: str, n_jobs: int, workers: int) -> dict:
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, __file__, "--only-sandbox", "--jobs", str(n_jobs), "--workers",
                          str(workers)], capture_output=True, text=True, env=env, check=True, timeout=3600)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["module"].startswith(root):
        raise RuntimeError(f"the subprocess imported {res['module']}, not the tree under {root}")
    return res


def side_by_side(rev: str, n_jobs: int, workers: int, repeats: int) -> None:
    """The current sandbox against the one at ``rev``, interleaved, each measurement in a fresh subprocess."""
    with tempfile.TemporaryDirectory(prefix="populora-bench-") as old_root:
        _extract(rev, old_root)
        runs: dict[str, list[dict]] = {"current": [], rev: []}
        roots = {"current": str(_REPO), rev: old_root}
        for i in range(repeats):
            order = ["current", rev] if i % 2 == 0 else [rev, "current"]
            for name in order:
                runs[name].append(_measure_in_subprocess(roots[name], n_jobs, workers))
    med = {name: statistics.median(r["rate"] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r["worker_cpu_ms"] for r in rs) for name, rs in runs.items()}
    host = {name: statistics.median(r["host_cpu_ms"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        rates = ", ".join(f"{r['rate']:.0f}" for r in rs)
        print(f"(a) sandbox {name:>12}: {med[name]:8.1f} jobs/s (median of {len(rs)}: {rates}); CPU per job: "
              f"workers+jobs {cpu[name]:.2f} ms, host {host[name]:.2f} ms; wrong results "
              f"{sum(r['bad'] for r in rs)}; layers: {', '.join(rs[0]['layers'])}")
    print(f"ratio current / {rev}: throughput {med['current'] / med[rev]:.3f}, CPU per job (workers+jobs) "
          f"{cpu['current'] / cpu[rev]:.3f}, host CPU per job {host['current'] / host[rev]:.3f}")


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs per measurement (default 2000)")
    ap.add_argument("--workers", type=int, default=2, help="parallel workers for each design (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of (a) and (c); medians are printed")
    ap.add_argument("--spawn-repeats", type=int, default=1, help="repeats of (b), the slow one (default 1)")
    ap.add_argument("--baseline-ref", metavar="REV",
                    help="also measure the sandbox of git revision REV side by side with the current one")
    ap.add_argument("--only-sandbox", action="store_true", help=argparse.SUPPRESS)  # one (a) run, as JSON
    args = ap.parse_args()
    for name in ("jobs", "workers", "repeats", "spawn_repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.only_sandbox:
        print(json.dumps(sandbox_once(args.jobs, args.workers)))
        return
    if args.baseline_ref:
        try:
            subprocess.run(["git", "-C", str(_REPO), "rev-parse", "--verify", f"{args.baseline_ref}^{{commit}}"],
                           capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            ap.error(f"--baseline-ref {args.baseline_ref!r} is not a git revision of {_REPO}")
    jobs = make_jobs(args.jobs)
    print(f"{args.jobs} jobs, {args.workers} workers, {os.cpu_count()} CPUs, "
          f"load average before: {os.getloadavg()[0]:.2f}")

    def timed(fn) -> tuple[float, list]:
        t0 = time.perf_counter()
        out = fn()
        return len(jobs) / (time.perf_counter() - t0), out

    rates_a, rates_b, rates_c = [], [], []
    t0 = time.perf_counter()
    with Sandbox(workers=args.workers, limits=Limits(timeout_s=5.0, memory_mb=512)) as sb:
        start_s = time.perf_counter() - t0
        for _ in range(args.repeats):
            rate, res_a = timed(lambda: sb.run(jobs))
            rates_a.append(rate)
        layers = [layer.split(":")[0] for layer in sb.isolation]
    bad_a = sum(1 for r in res_a if not (r.status == "ok" and r.match is True))
    for _ in range(args.spawn_repeats):
        rate, res_b = timed(lambda: run_spawn(jobs, args.workers))
        rates_b.append(rate)
    bad_b = sum(1 for v, m in res_b if m is not True)
    ctx = mp.get_context("fork")
    with ctx.Pool(args.workers) as pool:
        for _ in range(args.repeats):
            rate, res_c = timed(lambda: run_exec_pool(pool, jobs))
            rates_c.append(rate)
    bad_c = sum(1 for v, m in res_c if m is not True)
    same = sum(1 for r, (v, _m) in zip(res_a, res_b, strict=True) if r.value == v)
    a, b, c = (statistics.median(x) for x in (rates_a, rates_b, rates_c))
    print(f"(a) populora sandbox          : {a:8.1f} jobs/s (median of {rates_a and len(rates_a)}: "
          f"{', '.join(f'{x:.0f}' for x in rates_a)}); start-up {start_s:.2f} s; layers: {', '.join(layers)}")
    print(f"(b) python3 -c per job+rlimits: {b:8.1f} jobs/s (median of {len(rates_b)}: "
          f"{', '.join(f'{x:.0f}' for x in rates_b)})")
    print(f"(c) in-process exec pool      : {c:8.1f} jobs/s (median of {len(rates_c)}: "
          f"{', '.join(f'{x:.0f}' for x in rates_c)}) -- no isolation")
    print(f"ratio a/b = {a / b:.2f}x   ratio a/c = {a / c:.3f}x")
    print(f"wrong or failed results: a={bad_a} b={bad_b} c={bad_c}; a and b agree on {same}/{len(jobs)} values")
    if args.baseline_ref:
        print(f"side by side with {args.baseline_ref} (load average now {os.getloadavg()[0]:.2f}):")
        side_by_side(args.baseline_ref, args.jobs, args.workers, args.repeats)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
