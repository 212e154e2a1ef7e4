"""10,000 mixed jobs through one sandbox: every job gets the right status, nothing leaks."""

from __future__ import annotations

import os
import random
import time

import pytest

from populora_env.sandbox import ExecJob, Limits, Sandbox

from .conftest import all_procs, assert_workers_clean

# (kind, code, call, expected status). Every kind but "timeout" gets a generous per-job timeout (a loaded
# machine must not turn an expected result into a timeout); the "timeout" kind gets a short one.
_KINDS = [
    ("ok", "def f(x):\n    return sorted(x, reverse=True)", "f([{a}, {b}, 3])", "ok"),
    ("ok_print", "def f(x):\n    print(x)\n    return x * 2", "f({a})", "ok"),
    ("ok_compare", "def f(s):\n    return s[::-1]", "f('ab{a}')", "ok"),
    ("error", "def f(x):\n    return x // 0", "f({a})", "error"),
    ("syntax", "def f(x)\n    return x", "f(1)", "error"),
    ("fork", "import os\nos.fork()", None, "error"),
    ("memory", "x = bytearray(1 << 31)", None, "memory_limit"),
    ("output", "print('z' * 5000)", None, "output_limit"),
    ("crash", "import os\nos._exit(1)", None, "crashed"),
    ("timeout", "while True:\n    pass", None, "timeout"),
    ("thread", "import threading, time\nthreading.Thread(target=time.sleep, args=(9,)).start()", "1", "ok"),
]
_WEIGHTS = [40, 15, 15, 8, 4, 4, 3, 3, 3, 1, 4]


def _fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))




@pytest.mark.slow
def test_ten_thousand_mixed_jobs() -> None:
    rng = random.Random(1234)
    host_fds = _fd_count()
    with Sandbox(workers=2, limits=Limits(timeout_s=10.0, memory_mb=256, max_output_chars=4000)) as sb:
        pids = sb.worker_pids
        assert_workers_clean(sb)
        servers = sb.fork_server_pids
        worker_fds = {pid: _fd_count(pid) for pid in servers}
        t0 = time.monotonic()
        done = 0
        for _chunk in range(10):
            picks = rng.choices(range(len(_KINDS)), weights=_WEIGHTS, k=1000)
            jobs, want = [], []
            for k in picks:
                kind, code, call, status = _KINDS[k]
                a, b = rng.randint(-99, 99), rng.randint(0, 9)
                call = call.format(a=a, b=b) if call else None
                compare = repr(f"ab{a}"[::-1]) if kind == "ok_compare" else None
                jobs.append(ExecJob(code=code, call=call, compare_to=compare,
                                    timeout_s=0.2 if kind == "timeout" else None))
                want.append((kind, status, a, b))
            results = sb.run(jobs)
            for (kind, status, a, b), r in zip(want, results, strict=True):
                assert r.status == status, f"{kind}: {r}"
                if kind == "ok":
                    assert r.value == repr(sorted([a, b, 3], reverse=True))
                elif kind == "ok_print":
                    assert (r.value, r.stdout) == (repr(a * 2), f"{a}\n")
                elif kind == "ok_compare":
                    assert r.match is True
            done += len(jobs)
            assert sb.worker_pids == pids, "a worker was restarted"
            assert_workers_clean(sb)
            assert sb.fork_server_pids == servers
            assert {pid: _fd_count(pid) for pid in servers} == worker_fds, "worker fd leak"
            assert _fd_count() == host_fds + len(pids) * 3 + len(sb.worker_uids), "host fd leak"
        rate = done / (time.monotonic() - t0)
        print(f"\n10k mixed jobs: {rate:.0f} jobs/s")
        uids = set(sb.worker_uids)
    time.sleep(0.1)
    assert [p for p in all_procs() if p["uid"] in uids] == [], "processes of the job uids survived close()"
    assert _fd_count() == host_fds, "host fd leak after close()"
