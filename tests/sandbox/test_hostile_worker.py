"""Jobs that try to change their worker (or any other process) for good, checked on the host.

Each attack runs on a single-worker pool, namespaced and plain; afterwards, on the host: the same worker processes are still there
(no restart was needed), the fork server's and the zygote's nice, scheduling policy, real-time priority,
affinity, I/O priority, rlimits and autogroup nice are exactly what they were before any job ran (and normal:
nice 0, SCHED_OTHER), the next job sees the same values for itself as a job before the attacks did, and a real
job answers correctly. Every attack program also reports which of its attempts the kernel accepted: none may be.

The attacks call the kernel through ctypes, which jobs cannot import: they run on ``Sandbox(_native_jobs=True)``,
as a job would that had broken out of the interpreter, so the kernel layers are tested on their own. Their
"worker" is the job's parent, the zygote (it forks every job); the fork server is the zygote's parent.

Which layer stops each attack is listed in ``docs/sandbox.md``.
"""

from __future__ import annotations

import platform
import textwrap

import pytest

from populora_env.sandbox import ExecJob, Limits, Sandbox

from .conftest import NORMAL, assert_workers_clean, process_attributes

_NR = {
    "x86_64": {"setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
               "sched_setattr": 314, "ioprio_set": 251, "prlimit64": 302, "fcntl": 72, "ioctl": 16},
    "aarch64": {"setpriority": 140, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
                "sched_setattr": 274, "ioprio_set": 30, "prlimit64": 261, "fcntl": 25, "ioctl": 29},
}[platform.machine()]

# Shared by every attack: `accepted` collects the attempts the kernel did NOT refuse (must stay empty).
PRELUDE = f"""
import ctypes, errno, os, resource, signal, struct
libc = ctypes.CDLL(None, use_errno=True)
NR = {_NR!r}
ppid = os.getppid()
accepted = []
def py(label, fn, *args):
    try:
        fn(*args)
    except OSError:
        return
    accepted.append(label)
def raw(label, name, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]  # buffers, byref(), None stay
    if libc.syscall(NR[name], *conv) != -1:
        accepted.append(label)
"""

HIGH = 1 << 32  # high bits the kernel drops (it reads these arguments as 32-bit ints)
SCHED_IDLE, SCHED_BATCH = 5, 3

ATTACKS: dict[str, str] = {
    # --- CPU priority (the case: the old rule looked at `which`, PRIO_PROCESS is 0)
    "setpriority_worker": "py('ppid', os.setpriority, os.PRIO_PROCESS, ppid, 19)",
    "setpriority_worker_high_bits": f"""
        raw('which+high', 'setpriority', 0 | {HIGH}, ppid, 19)
        raw('who+high', 'setpriority', 0, ppid | {HIGH}, 19)
        """,
    "setpriority_pgrp_and_user": """
        py('pgrp of worker', os.setpriority, os.PRIO_PGRP, os.getpgid(ppid), 19)
        py('own pgrp', os.setpriority, os.PRIO_PGRP, 0, 19)
        py('own user', os.setpriority, os.PRIO_USER, 0, 19)
        py('user of job', os.setpriority, os.PRIO_USER, os.getuid(), 19)
        worker_uid = int(open(f'/proc/{ppid}/status').read().split('Uid:')[1].split()[0])
        py('user of worker', os.setpriority, os.PRIO_USER, worker_uid, 19)  # 0 (root) means "own uid" here
        """,
    "setpriority_init_and_pid_scan": """
        for pid in range(1, 200):
            if pid != os.getpid():
                py(pid, os.setpriority, os.PRIO_PROCESS, pid, 19)
        """,
    # --- scheduling policy and parameters
    "sched_setscheduler_worker": f"""
        py('idle', os.sched_setscheduler, ppid, {SCHED_IDLE}, os.sched_param(0))
        py('batch', os.sched_setscheduler, ppid, {SCHED_BATCH}, os.sched_param(0))
        raw('raw+high', 'sched_setscheduler', ppid | {HIGH}, {SCHED_IDLE}, ctypes.byref(ctypes.c_int(0)))
        """,
    "sched_setparam_worker": "py('param', os.sched_setparam, ppid, os.sched_param(0))",
    "sched_setattr_worker": f"""
        # struct sched_attr (version 0, 48 bytes): size, policy, flags, nice, priority, runtime, deadline, period
        for policy, nice in (({SCHED_IDLE}, 0), (0, 19), ({SCHED_BATCH}, 19)):
            attr = ctypes.create_string_buffer(struct.pack('=IIQiIQQQ', 48, policy, 0, nice, 0, 0, 0, 0))
            raw(('setattr', policy, nice), 'sched_setattr', ppid, attr, 0)
        """,
    "sched_setaffinity_worker": """
        py('affinity', os.sched_setaffinity, ppid, {0})
        mask = ctypes.c_ulong(1)
        raw('raw', 'sched_setaffinity', ppid, ctypes.sizeof(mask), ctypes.byref(mask))
        """,
    # --- I/O priority (IOPRIO_WHO_PROCESS/PGRP/USER; class IDLE = 3 << 13)
    "ioprio_set_worker": """
        raw('process', 'ioprio_set', 1, ppid, 3 << 13)
        raw('pgrp', 'ioprio_set', 2, 0, 3 << 13)
        raw('user', 'ioprio_set', 3, os.getuid(), 3 << 13)
        raw('self', 'ioprio_set', 1, 0, 3 << 13)
        """,
    # --- rlimits of other processes
    "prlimit_worker": f"""
        for res in (resource.RLIMIT_NOFILE, resource.RLIMIT_CPU, resource.RLIMIT_STACK, resource.RLIMIT_AS,
                    resource.RLIMIT_NPROC, resource.RLIMIT_NICE):
            py(res, resource.prlimit, ppid, res, (1, 1))
        new = (ctypes.c_ulong * 2)(1, 1)
        raw('raw+high', 'prlimit64', ppid | {HIGH}, resource.RLIMIT_NOFILE, new, None)
        """,
    # --- signal ownership: SIGIO (kills by default) or F_SETSIG=SIGSTOP aimed at the worker
    "f_setown_worker": f"""
        import fcntl
        r, w = os.pipe()
        py('setown', fcntl.fcntl, r, fcntl.F_SETOWN, ppid)
        py('setown pgrp', fcntl.fcntl, r, fcntl.F_SETOWN, -os.getpgid(ppid))
        raw('setown raw+high', 'fcntl', r, fcntl.F_SETOWN | {HIGH}, ppid)
        py('setsig stop', fcntl.fcntl, r, 10, signal.SIGSTOP)  # F_SETSIG
        owner = ctypes.create_string_buffer(struct.pack('=ii', 1, ppid))  # F_OWNER_PID
        raw('setown_ex', 'fcntl', r, 15, owner)  # F_SETOWN_EX
        raw('fiosetown', 'ioctl', r, 0x8901, ctypes.byref(ctypes.c_int(ppid)))
        raw('siocspgrp', 'ioctl', r, 0x8902, ctypes.byref(ctypes.c_int(ppid)))
        # whatever was accepted, make it fire: O_ASYNC on, then I/O on the pipe
        flags = fcntl.fcntl(r, fcntl.F_GETFL)
        fcntl.fcntl(r, fcntl.F_SETFL, flags | os.O_ASYNC | os.O_NONBLOCK)
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_ASYNC)
        for _ in range(20):
            os.write(w, b'x')  # SIGIO would be queued to the owner right here, in the kernel
            os.read(r, 1)
        """,
    # --- /proc files of the worker (a non-dumpable process: root-owned) and its session's autogroup
    "proc_files_of_worker": """
        for name, value in (('autogroup', '19'), ('oom_score_adj', '1000'), ('timerslack_ns', '1'),
                            ('comm', 'pwned'), ('sched', '0'), ('coredump_filter', '0')):
            try:
                with open(f'/proc/{ppid}/{name}', 'w') as fh:
                    fh.write(value)
            except OSError:
                continue
            accepted.append(name)
        """,
    # --- its own attributes: allowed, but must not outlive the job (the next job and the worker are normal)
    "own_attributes_then_exit": f"""
        os.nice(19)
        os.sched_setaffinity(0, {{0}})
        os.sched_setscheduler(0, {SCHED_IDLE}, os.sched_param(0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, 1 << 20))
        try:
            with open('/proc/self/autogroup', 'w') as fh:  # its own session's autogroup
                fh.write('19')
        except OSError:
            pass
        import threading
        t = threading.Thread(target=lambda: os.nice(19))
        t.start()
        t.join()
        """,
}


def _code(body: str) -> str:
    return PRELUDE + textwrap.dedent(body).strip() + "\n"


# What a job sees of itself: the values every later job must see too.
SELF_VIEW = (
    "import os, resource\n"
    "ag = open('/proc/self/autogroup').read().split()[-1] if os.path.exists('/proc/self/autogroup') else None\n"
    "state = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, "
    "sorted(os.sched_getaffinity(0)), [resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) "
    "if n.startswith('RLIMIT_')], ag)\n"
)


@pytest.fixture(scope="module", params=["bwrap", "plain"])
def one(request):
    """A single-worker pool (each mode) and what was true before any attack: the fork server's and the
    zygote's attributes, a job's view of itself."""
    with Sandbox(workers=1, mode=request.param, limits=Limits(timeout_s=20.0, memory_mb=256),
                 _native_jobs=True) as box:
        view = box.run_one(SELF_VIEW, "state")
        assert view.status == "ok", view
        box.wait_clean()
        server, zygote = box.fork_server_pids[0], box.zygote_pids[0]
        before = [process_attributes(server), process_attributes(zygote)]
        assert all({k: b[k] for k in NORMAL} == NORMAL for b in before)
        yield box, list(box.worker_pids), (server, zygote), before, view.value


def _after_attack(one) -> None:
    box, pids, (server, zygote), before, view = one
    assert box.worker_pids == pids and box.fork_server_pids == [server], "the worker was restarted"
    assert box.zygote_pids == [zygote], "the zygote was restarted"
    assert_workers_clean(box)
    assert process_attributes(server) == before[0], "the fork server's attributes changed"
    assert process_attributes(zygote) == before[1], "the zygote's attributes changed"
    assert box.run_one(SELF_VIEW, "state").value == view, "the next job runs with different attributes"
    r = box.run_one("def f(x):\n    return sorted(x)", "f([3, 1, 2])", "[1, 2, 3]")
    assert (r.status, r.value, r.match) == ("ok", "[1, 2, 3]", True)
    assert box.worker_pids == pids


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_on_worker_attributes(name: str, one) -> None:
    box = one[0]
    r = box.run_one(_code(ATTACKS[name]), "accepted")
    assert (r.status, r.value) == ("ok", "[]"), f"{name}: the kernel accepted {r.value} ({r.error})"
    _after_attack(one)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_x32_syscall_numbers_are_killed(one) -> None:
    """The x32 ABI (syscall number | 0x40000000) would bypass rules keyed on x86_64 numbers: libseccomp's
    filter kills any such call."""
    box = one[0]
    code = _code("libc.syscall(0x40000000 | NR['setpriority'], ctypes.c_long(0), ctypes.c_long(ppid), "
                 "ctypes.c_long(19))")
    r = box.run_one(code, "accepted")
    assert (r.status, r.error) == ("crashed", "the job process was killed by SIGSYS")
    _after_attack(one)


def test_every_attack_in_one_batch_on_two_workers() -> None:
    """The same attacks as one batch on two workers: no worker is restarted or changed, later jobs are right."""
    with Sandbox(workers=2, limits=Limits(timeout_s=20.0), _native_jobs=True) as box:
        box.wait_clean()
        pids = list(box.worker_pids)
        servers = box.fork_server_pids + box.zygote_pids
        before = [process_attributes(s) for s in servers]
        results = box.run([ExecJob(_code(body), "accepted") for body in ATTACKS.values()])
        assert [(r.status, r.value) for r in results] == [("ok", "[]")] * len(ATTACKS)
        rs = box.run([ExecJob("def f(x):\n    return x * 2", f"f({i})", str(2 * i)) for i in range(20)])
        assert all(r.match for r in rs) and [r.value for r in rs] == [str(2 * i) for i in range(20)]
        assert box.worker_pids == pids
        assert_workers_clean(box)
        assert [process_attributes(s) for s in box.fork_server_pids + box.zygote_pids] == before
