"""The hostile corpus: each program attacks the host, the worker or later jobs.

For every program we assert containment ON THE HOST, not only a status: the canary survives, no marker
file appears, the listeners see no traffic, the secret never shows up in anything the sandbox returns, the
workers are the same processes as before, and each worker uid owns nothing but its idle worker (no job,
thread or zombie left) with an empty private job area.

Jobs cannot import ``ctypes`` (the zygote they are forked from never loaded it, and their audit hook refuses
it): the programs that call the kernel directly through it (``native``) run on a sandbox that lets them
(``Sandbox(_native_jobs=True)``), as a job would that had broken out of the interpreter, so that the kernel
layers behind it (seccomp, uids, namespaces, rlimits) are tested on their own.
"""

from __future__ import annotations

import os
import platform
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from populora_env.sandbox import ExecJob, ExecResult, Limits, Sandbox
from populora_env.sandbox import isolation as iso

from .conftest import HostBait, assert_workers_clean

ANY_FAIL = {"error", "crashed", "timeout", "memory_limit", "output_limit"}

# Syscall numbers used by the raw ctypes attacks (libc wrappers could be bypassed this way).
_SYSCALLS = {
    "x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41, "execve": 59,
               "bpf": 321, "perf_event_open": 298, "io_uring_setup": 425, "keyctl": 250, "ptrace": 101,
               "unshare": 272, "setns": 308, "mount": 165, "setuid": 105, "kill": 62, "setsid": 112,
               "process_vm_readv": 310, "pidfd_open": 434, "init_module": 175, "reboot": 169},
    "aarch64": {"fork": None, "vfork": None, "clone": 220, "clone3": 435, "socket": 198, "execve": 221,
                "bpf": 280, "perf_event_open": 241, "io_uring_setup": 425, "keyctl": 219, "ptrace": 117,
                "unshare": 97, "setns": 268, "mount": 40, "setuid": 146, "kill": 129, "setsid": 157,
                "process_vm_readv": 270, "pidfd_open": 434, "init_module": 105, "reboot": 142},
}[platform.machine()]


@dataclass(frozen=True)
class Hostile:
    """One hostile program, the statuses it may end with, and an optional check of its result."""

    name: str
    code: str
    call: str | None = None
    expect: frozenset[str] = frozenset(ANY_FAIL)
    value: str | None = None  # exact expected value when given
    # Generous by default, so a busy machine cannot turn an expected result into a timeout; programs meant to
    # run into the wall clock set a short one and check that this clock (named in the error) killed them.
    timeout_s: float = 20.0
    check: Callable[[ExecResult], None] | None = None
    native: bool = False  # uses ctypes: runs on a sandbox that lets it (the kernel layers on their own)


def H(name: str, code: str, call: str | None = None, expect: set[str] | str = ANY_FAIL, **kw) -> Hostile:  # noqa: N802
    """Shorthand constructor (dedents the code)."""
    exp = frozenset({expect} if isinstance(expect, str) else expect)
    prefix = ""
    if code.startswith(RAW):
        prefix, code = RAW, code[len(RAW):]
    code = prefix + textwrap.dedent(code).strip() + "\n"
    return Hostile(name, code, call, exp, native=kw.pop("native", "import ctypes" in code), **kw)


def _stopped_early(r: ExecResult) -> None:
    """The worker stopped the job at once (output cap, reply), not at its 20 s deadline: even on a loaded
    machine such a job ends within seconds."""
    assert r.seconds < 10.0, f"took {r.seconds:.2f} s: the worker waited for the deadline"


def _killed_by_wall_clock(r: ExecResult) -> None:
    """Killed by the worker at its 0.5 s time limit (its own time: CPU, or wall time not spent waiting for a
    CPU): the error names it (not the kernel's CPU limit, not a worker restart), and the worker measured at least
    the limit (it never kills early)."""
    assert r.error == "time limit of 0.5 s exceeded; the job was killed", r.error
    assert r.seconds >= 0.5


RAW = f"import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nNR = {_SYSCALLS!r}\n"
RAW += "def raw(name, *args):\n    nr = NR[name]\n    if nr is None:\n        return ('n/a', 0)\n"
RAW += "    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])\n    return (r, ctypes.get_errno())\n"

CORPUS: list[Hostile] = [
    # ---------------------------------------------------------------- processes
    H("fork_bomb", "import os\nwhile True:\n    os.fork()", expect="error"),
    H("fork_bomb_counting", """
        import os
        n = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    os._exit(0)
                n += 1
            except OSError:
                pass
        """, "n", expect="ok", value="0"),
    H("thread_bomb", """
        import threading, time
        threads, err = [], None
        try:
            while len(threads) < 10000:
                t = threading.Thread(target=time.sleep, args=(30,), daemon=True)
                t.start()
                threads.append(t)
        except Exception as exc:
            err = type(exc).__name__
        """, "(len(threads) < 64, err)", expect="ok", value="(True, 'RuntimeError')"),
    H("multiprocessing_process", """
        import multiprocessing as mp
        p = mp.Process(target=print)
        p.start()
        p.join()
        """),
    H("subprocess_run", 'import subprocess\nsubprocess.run(["touch", "$MARKER_DIR/subprocess"])'),
    H("os_system", 'import os\nrc = os.system("touch $MARKER_DIR/system")', "rc != 0", expect="ok", value="True"),
    H("posix_spawn", 'import os\nos.posix_spawn("/usr/bin/touch", ["touch", "$MARKER_DIR/spawn"], {})'),
    H("execv", 'import os\nos.execv("/usr/bin/touch", ["touch", "$MARKER_DIR/execv"])'),
    H("reload_os_then_posix_system", """
        import importlib, os, posix
        importlib.reload(os)
        rc = posix.system("touch $MARKER_DIR/posix")
        """, "rc != 0", expect="ok", value="True"),
    H("pty_spawn", 'import pty\npty.spawn(["touch", "$MARKER_DIR/pty"])'),
    H("ctypes_libc_system", """
        import ctypes
        rc = ctypes.CDLL(None).system(b"touch $MARKER_DIR/ctypes")
        """, "rc != 0", expect="ok", value="True"),
    H("raw_process_syscalls", RAW + """
        SIGCHLD = 17
        out = [raw("fork"), raw("vfork"), raw("clone", SIGCHLD, 0, 0, 0, 0), raw("clone3", 0, 0)]
        out += [raw("execve", 0, 0, 0)]
        """, "[r for r in out if r[0] not in ('n/a', -1)]", expect="ok", value="[]"),
    # ---------------------------------------------------------------- signals and other processes
    H("kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", expect="error"),
    H("kill_host_pid", "import os\nos.kill($HOST_PID, 9)", expect="error"),
    H("kill_everything", "import os\nos.kill(-1, 9)", expect="error"),
    H("kill_init", "import os\nos.kill(1, 9)", expect="error"),
    H("kill_scan", """
        import os
        me, n = os.getpid(), 0
        for p in range(1, 3000):
            if p != me:
                try:
                    os.kill(p, 9)
                    n += 1
                except OSError:
                    pass
        """, "n", expect="ok", value="0"),
    H("pidfd_parent", "import os\nfd = os.pidfd_open(os.getppid())", expect="error"),
    H("raw_kill_and_ptrace_parent", RAW + """
        import os
        ppid = os.getppid()
        out = [raw("kill", ppid, 9), raw("kill", -1, 9), raw("ptrace", 16, ppid, 0, 0),
               raw("process_vm_readv", ppid, 0, 0, 0, 0, 0), raw("pidfd_open", ppid, 0)]
        """, "[r for r in out if r[0] != -1]", expect="ok", value="[]"),
    H("proc_mem_of_parent", "import os\nopen(f'/proc/{os.getppid()}/mem', 'r+b').write(b'x')", expect="error"),
    H("prlimit_parent", """
        import os, resource
        resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))
        """, expect="error"),
    # ---------------------------------------------------------------- secrets
    H("env_secret", "import os\nv = os.environ.get('$ENV_VAR')", "(v, sorted(os.environ))", expect="ok",
      check=lambda r: _no_host_env(r)),
    H("proc_environ_scan", """
        import os
        hits = []
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                for what in ('environ', 'cmdline'):
                    try:
                        data = open(f'/proc/{pid}/{what}', 'rb').read()
                    except OSError:
                        continue
                    if b'POPULORA-SECRET' in data or b'$ENV_VAR' in data:
                        hits.append((pid, what))
        """, "hits", expect="ok", value="[]", native=True),  # (/proc is refused to jobs: "proc_listing")
    H("proc_listing", "import os\nprint(os.listdir('/proc'))", expect="error"),
    H("home_secret_file", "print(open('$HOME_SECRET').read())", expect="error"),
    H("home_listing", """
        import os
        seen = []
        for d in ('/root', os.path.expanduser('~'), '/home'):
            try:
                seen += os.listdir(d)
            except OSError:
                pass
        """, "[n for n in seen if 'populora_sandbox_secret' in n or n in ('.bash_history', '.ssh')]",
      expect="ok", value="[]"),
    H("etc_shadow", "print(open('/etc/shadow').read())", expect="error"),
    H("walk_for_secrets", """
        import os
        hits, files = [], 0
        for top in ('/', ):
            for root, dirs, names in os.walk(top):
                dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', '/usr')]
                for n in names:
                    files += 1
                    if 'populora_sandbox_secret' in n or 'populora-canary' in root:
                        hits.append(os.path.join(root, n))
        """, "hits", expect="ok", value="[]"),
    # ---------------------------------------------------------------- network
    H("tcp_connect", "import socket\nsocket.create_connection(('127.0.0.1', $TCP_PORT), timeout=1)",
      expect="error"),
    H("udp_send", """
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b'leak', ('127.0.0.1', $UDP_PORT))
        """, expect="error"),
    H("raw_socket_syscall", RAW + "r = raw('socket', 2, 1, 0)", "r", expect="ok", value="(-1, 1)"),
    H("urllib", "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:$TCP_PORT/', timeout=1)",
      expect="error"),
    # ---------------------------------------------------------------- file system
    H("delete_canary", "import os\nos.remove('$CANARY')", expect="error"),
    H("overwrite_canary", "open('$CANARY', 'w').write('pwned')", expect="error"),
    H("write_outside", """
        import os
        ok = []
        for p in ('/tmp/populora_pwned', '/root/populora_pwned', '/etc/populora_pwned',
                  '/dev/shm/populora_pwned', '/var/tmp/populora_pwned', '$MARKER_DIR/fs', '/populora_pwned',
                  '/usr/populora_pwned'):
            try:
                with open(p, 'w') as fh:
                    fh.write('x')
                ok.append(p)
            except OSError:
                pass
        """, "ok", expect="ok", value="[]"),
    H("write_sibling_of_cwd", """
        import os
        open('../leak', 'w').write('x')
        os.mkdir('../leakdir')
        open('inside', 'w').write('y')
        """, "sorted(os.listdir('..'))", expect="error", check=lambda r: _erofs(r)),
    H("chmod_job_area", """
        import os
        open('f', 'w').close()
        os.mkdir('d')
        open('d/g', 'w').close()
        os.chmod('d', 0)
        refused = []
        for p in (os.path.dirname(os.getcwd()), '/tmp', '.'):
            try:
                os.chmod(p, 0)
            except OSError as exc:
                refused.append((p, exc.errno))
        """, "refused", expect="ok", value="[('/tmp', 30), ('/tmp', 30)]"),
    H("fill_tmp", """
        i = 0
        while True:
            with open(f'f{i}', 'wb') as fh:
                fh.write(b'x' * (8 << 20))
            i += 1
        """, expect="error"),
    H("file_size_bomb", "open('big', 'wb').write(b'x' * (100 << 20))", expect="error",
      check=lambda r: _error_starts(r, "OSError: [Errno 27] File too large")),
    H("fd_bomb", "fds = [open('/dev/null') for _ in range(100000)]", expect="error"),
    H("proc_root_of_parent", "import os\nprint(os.listdir(f'/proc/{os.getppid()}/root/'))", expect="error"),
    H("sysrq_and_kmsg", "open('/proc/sysrq-trigger', 'w').write('b')", expect="error"),
    # ---------------------------------------------------------------- ctypes / mmap
    H("ctypes_null_deref", "import ctypes\nctypes.string_at(0)", expect="crashed"),
    H("ctypes_corrupt_small_int", """
        import ctypes, sys
        ctypes.c_long.from_address(id(5) + sys.getsizeof(0)).value = 6
        """, "2 + 3", expect={"ok", "crashed", "error"}),
    H("mmap_bomb", "import mmap\nm = mmap.mmap(-1, 8 << 30)", expect="error",
      check=lambda r: _error_starts(r, "OSError: [Errno 12] Cannot allocate memory")),
    H("mmap_touch_all", """
        import mmap
        m = mmap.mmap(-1, 200 << 20)
        for i in range(0, len(m), 4096):
            m[i] = 1
        m2 = mmap.mmap(-1, 200 << 20)
        """, expect="error", check=lambda r: _error_starts(r, "OSError: [Errno 12] Cannot allocate memory")),
    H("raw_privileged_syscalls", RAW + """
        import os
        names = ('unshare', 'setns', 'mount', 'bpf', 'perf_event_open', 'io_uring_setup', 'keyctl',
                 'setuid', 'setsid', 'init_module', 'reboot')
        out = {n: raw(n, *([0x10000000] if n == 'unshare' else [0] * 5)) for n in names}
        out['chroot'] = (libc.chroot(b'/'), ctypes.get_errno())
        """, "{k: v for k, v in out.items() if v[0] != -1}", expect="ok", value="{}"),
    H("seccomp_self_disable", "import ctypes\nr = ctypes.CDLL(None).prctl(22, 0, 0, 0, 0)", "r", expect="ok",
      value="-1"),
    # ---------------------------------------------------------------- memory
    H("bytearray_bomb", "x = bytearray(8 << 30)", expect="memory_limit"),
    H("list_growth", "x = []\nwhile True:\n    x.append(' ' * 10**6)", expect="memory_limit"),
    H("string_doubling", "s = 'x'\nwhile True:\n    s += s", expect="memory_limit"),
    H("huge_pow", "x = 2 ** (10 ** 11)", expect={"memory_limit", "timeout"}, timeout_s=1.0),
    H("threads_allocating", """
        import threading
        def grab():
            global keep
            keep = [bytearray(50 << 20) for _ in range(100)]
        ts = [threading.Thread(target=grab) for _ in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        """, "len(keep)", expect={"memory_limit", "error", "ok"}),
    # ---------------------------------------------------------------- CPU
    H("while_true", "while True:\n    pass", expect="timeout", timeout_s=0.5, check=_killed_by_wall_clock),
    H("c_level_loop", "sum(range(10**12))", expect="timeout", timeout_s=0.5, check=_killed_by_wall_clock),
    H("c_level_factorial", "import math\nmath.factorial(10**8)", expect={"timeout", "memory_limit"},
      timeout_s=0.5),
    H("regex_catastrophe", "import re\nre.match(r'(a+)+$', 'a' * 60 + 'b')", expect="timeout", timeout_s=0.5,
      check=_killed_by_wall_clock),
    H("ignore_sigxcpu", """
        import signal
        try:
            signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # refused: a job installs no signal action
        except OSError:
            pass
        while True:
            pass
        """, expect="timeout", timeout_s=0.5, check=_killed_by_wall_clock),
    H("block_all_signals", """
        import signal
        signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))
        while True:
            pass
        """, expect="timeout", timeout_s=0.5, check=_killed_by_wall_clock),
    H("sleep_past_timeout", "import time\ntime.sleep(60)", expect="timeout", timeout_s=0.5,
      check=_killed_by_wall_clock),
    H("select_forever", "import select\nselect.select([], [], [])", expect="timeout", timeout_s=0.5,
      check=_killed_by_wall_clock),
    H("thread_outlives_job", """
        import threading, time
        threading.Thread(target=time.sleep, args=(60,)).start()
        """, "'returned'", expect="ok", value="'returned'", check=_stopped_early),
    # ---------------------------------------------------------------- output
    H("print_flood", "while True:\n    print('x' * 1000)", expect="output_limit", check=_stopped_early),
    H("raw_stdout_flood", "import os\nwhile True:\n    os.write(1, b'y' * 65536)", expect="output_limit",
      check=_stopped_early),
    H("huge_repr", "s = 'x' * 10**6", "s", expect="output_limit", check=lambda r: _no_value(r)),
    H("repr_raises", "class A:\n    def __repr__(self):\n        raise ValueError('no repr')", "A()",
      expect="error"),
    H("stderr_flood", "import sys\nfor _ in range(10000):\n    sys.stderr.write('e' * 1000)", "1",
      expect="ok", value="1"),
    H("close_stdout", "import os\nos.close(1)\nprint('hidden')", "1", expect="ok", value="1"),
    H("read_stdin", "x = input()", expect="error"),
    H("write_to_other_fds", """
        import os
        n = 0
        for fd in range(4, 300):
            try:
                os.write(fd, b'garbage')
                n += 1
            except OSError:
                pass
        """, "n", expect="ok", value="0"),
    # ---------------------------------------------------------------- exits and recursion
    H("sys_exit", "import sys\nsys.exit(0)", expect="error"),
    H("os__exit", "import os\nos._exit(0)", expect="crashed"),
    H("os_abort", "import os\nos.abort()", expect="crashed"),
    H("keyboard_interrupt", "raise KeyboardInterrupt", expect="error"),
    H("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", expect="error"),
    H("unbounded_recursion", """
        import sys
        sys.setrecursionlimit(10**8)
        def f(n):
            return f(n + 1) + 1
        f(0)
        """, expect={"crashed", "error", "memory_limit", "timeout"}, timeout_s=1.0),
    # ---------------------------------------------------------------- the interpreter's ways to native code and
    # to the harness's locals (refused to every job, so no job can rewrite the reply its harness sends)
    H("ctypes_import", "import ctypes", expect="error", native=False,
      check=lambda r: _error_starts(r, "ImportError: import of ctypes is refused")),
    H("ctypes_extension_loaded_by_hand", """
        import _imp, glob, importlib.machinery as m, sys
        so = [p for d in sys.path for p in glob.glob(d + '/_ctypes*.so')][0]
        _imp.create_dynamic(m.ModuleSpec('_ctypes', m.ExtensionFileLoader('_ctypes', so), origin=so))
        """, expect="error", check=lambda r: _error_starts(r, "ImportError: import of _ctypes is refused")),
    H("ctypes_classes_of_the_zygote", """
        def walk(c, seen):
            for s in type.__subclasses__(c):
                if s not in seen:
                    seen.add(s)
                    walk(s, seen)
            return seen
        found = sorted(c.__name__ for c in walk(object, set()) if 'ctypes' in str(c.__module__))
        """, "found", expect="ok", value="[]"),
    H("frame_of_the_harness", "import sys\nf = sys._getframe(1)", expect="error",
      check=lambda r: _error_starts(r, "ValueError: frame access is refused")),
    H("frame_through_a_traceback", """
        try:
            1 / 0
        except ZeroDivisionError as e:
            fr = e.__traceback__.tb_frame
        """, expect="error", check=lambda r: _error_starts(r, "AttributeError: frame access is refused")),
    H("frame_through_a_generator", "g = (x for x in [1])\nfr = g.gi_frame", expect="error"),
    H("gc_object_walk", "import gc\nobjs = gc.get_objects()", expect="error"),
    H("gc_referrers", "import gc\nr = gc.get_referrers(print)", expect="error"),
    H("trace_function", "import sys\nsys.settrace(lambda *a: None)", expect="error"),
    H("profile_function", "import sys\nsys.setprofile(lambda *a: None)", expect="error"),
    H("signal_handler", "import signal\nsignal.signal(signal.SIGUSR1, lambda s, f: None)", expect="error",
      check=lambda r: _error_starts(r, "PermissionError: [Errno 1] Operation not permitted")),
    H("signal_handler_replaced", "import signal\nsignal.signal(signal.SIGINT, lambda s, f: None)",
      "signal.getsignal(signal.SIGINT) is signal.default_int_handler", expect="error"),
    H("audit_hook_of_its_own", """
        import sys
        seen = []
        sys.addaudithook(lambda e, a: seen.append(e))
        open('x', 'w').close()
        """, "seen", expect="ok", value="[]"),
    H("crafted_bytecode", "import marshal\nc = marshal.loads(marshal.dumps((lambda: 1).__code__))",
      expect="error"),
    H("code_object_built", "c = (lambda: 1).__code__.replace(co_consts=(2,))", expect="error"),
    H("code_object_swapped", "def f():\n    return 1\nf.__code__ = (lambda: 2).__code__", expect="error"),
    H("own_memory_through_proc", "open('/proc/self/mem', 'rb')", expect="error",
      check=lambda r: _error_starts(r, "PermissionError: [Errno 13] Permission denied")),
    H("own_memory_through_a_link", """
        import os
        os.symlink('/proc/self/mem', 'm')
        open('m', 'rb')
        """, expect="error", check=lambda r: _error_starts(r, "PermissionError: [Errno 13] Permission denied")),
    H("counters_of_the_parent", "import os\nopen(f'/proc/{os.getppid()}/stat').read()", expect="error",
      check=lambda r: _error_starts(r, "PermissionError: [Errno 13] Permission denied")),
    # the fork server's counters (and any other process's): a job can guess its pid, never open its /proc entry
    H("counters_of_every_process", """
        readable = []
        for pid in range(1, 300):
            try:
                open(f'/proc/{pid}/stat').read()
                readable.append(pid)
            except OSError:
                pass
        """, "readable", expect="ok", value="[]"),
    H("signal_the_zygote_group", "import os, signal\nos.kill(0, signal.SIGKILL)", expect="error"),
    # ---------------------------------------------------------------- tampering (state must not leak)
    H("tamper_builtins", """
        import builtins
        builtins.sorted = lambda *a, **k: 'hacked'
        builtins.len = lambda x: 42
        """, "sorted([2, 1])", expect="ok", value="'hacked'"),
    H("tamper_sys_modules", "import sys, math\nmath.sqrt = lambda x: -1\nsys.modules.clear()", "1",
      expect="ok", value="1"),
    H("tamper_reply_machinery", """
        import json, os
        json.dumps = lambda *a, **k: 1 / 0
        os.write = lambda *a: 0
        """, "'tampered'", expect="ok", value="'tampered'"),
    H("tamper_random_seed", "import random\nrandom.seed(0)", "random.random()", expect="ok"),
]


def _no_host_env(r: ExecResult) -> None:
    # the scrubbed worker environment is all there is (PWD is set by bubblewrap's --chdir)
    keys = sorted([*iso.worker_env(), "PWD"])
    assert r.value == repr((None, keys))


def _erofs(r: ExecResult) -> None:
    assert r.error.startswith("OSError: [Errno 30] Read-only file system: '../leak'"), r.error


def _error_starts(r: ExecResult, text: str) -> None:
    assert r.error.startswith(text), r.error


def _no_value(r: ExecResult) -> None:
    assert r.value is None


def test_corpus_size() -> None:
    assert len(CORPUS) == 101  # update when adding programs: a shrinking corpus must not go unnoticed
    assert len({c.name for c in CORPUS}) == len(CORPUS)


def _host_checks(sb: Sandbox, bait: HostBait, r: ExecResult, pids: list[int]) -> None:
    for text in (r.value, r.stdout, r.error):
        assert bait.token not in (text or ""), "the secret leaked into a result"
    bait.assert_untouched()
    assert sb.worker_pids == pids, "a worker died or was restarted"
    assert_workers_clean(sb)


@pytest.fixture(scope="module")
def native_sb(bait: HostBait) -> Sandbox:
    """The same sandbox, but its jobs may use ctypes (and read /proc): the kernel layers on their own."""
    with Sandbox(workers=2, limits=Limits(timeout_s=1.0, memory_mb=256, max_output_chars=10_000),
                 _native_jobs=True) as box:
        yield box


@pytest.fixture(scope="module")
def start_pids(sb: Sandbox, native_sb: Sandbox) -> dict[bool, list[int]]:
    for box in (sb, native_sb):
        assert box.run_one("x = 1", "x").value == "1"
    return {False: list(sb.worker_pids), True: list(native_sb.worker_pids)}


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_hostile(case: Hostile, sb: Sandbox, native_sb: Sandbox, bait: HostBait,
                 start_pids: dict[bool, list[int]]) -> None:
    box = native_sb if case.native else sb
    r = box.run_one(bait.subst(case.code), call=case.call, timeout_s=case.timeout_s)
    assert r.status in case.expect, f"{case.name}: {r}"
    if case.value is not None:
        assert r.value == case.value, f"{case.name}: {r}"
    if case.check is not None:
        case.check(r)
    _host_checks(box, bait, r, start_pids[case.native])


@pytest.mark.parametrize("native", [False, True], ids=["jobs", "native_jobs"])
def test_whole_corpus_as_one_batch_then_normal_job(native: bool, sb: Sandbox, native_sb: Sandbox, bait: HostBait,
                                                   start_pids: dict[bool, list[int]]) -> None:
    """All hostile programs at once on both workers; afterwards the pool still answers correctly."""
    sb = native_sb if native else sb
    cases = [c for c in CORPUS if c.native == native]
    jobs = [ExecJob(code=bait.subst(c.code), call=c.call, timeout_s=c.timeout_s) for c in cases]
    t0 = time.monotonic()
    # a bound, not a timing check: the batch normally takes well under a minute; a job stopped by this deadline
    # would show as an unexpected "timeout" below
    results = sb.run(jobs, deadline_s=600)
    assert time.monotonic() - t0 < 600
    for case, r in zip(cases, results, strict=True):
        assert r.status in case.expect, f"{case.name}: {r}"
        for text in (r.value, r.stdout, r.error):
            assert bait.token not in (text or "")
    r = sb.run_one("def f(x):\n    return sorted(x)", call="f([3, 1, 2])", compare_to="[1, 2, 3]")
    assert (r.status, r.value, r.match) == ("ok", "[1, 2, 3]", True)
    _host_checks(sb, bait, r, start_pids[native])
    # nothing owned by a job uid anywhere in the host's temp dirs
    # (find, not os.walk: os.walk recurses per level and any deep tree in /tmp would break this check)
    uid_tests = " -o ".join(f"-uid {u}" for u in sb.worker_uids)
    tops = [t for t in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(t)]
    out = subprocess.run(["find", *tops, "-xdev", "(", *uid_tests.split(), ")", "-print"], capture_output=True,
                         text=True, timeout=300)
    assert out.stdout == "", f"owned by a job uid: {out.stdout[:2000]}"


def test_tampering_does_not_leak_to_later_jobs(bait: HostBait) -> None:
    """With one worker, every job after a tampering job runs on the same worker and sees pristine state."""
    tamper = [c for c in CORPUS if c.name.startswith(("tamper_", "ctypes_corrupt"))]
    assert [c.name for c in tamper] == ["ctypes_corrupt_small_int", "tamper_builtins", "tamper_sys_modules",
                                        "tamper_reply_machinery", "tamper_random_seed"]
    check = ExecJob(
        code="import math, json, os, random\nstate = (sorted([2, 1]), len('ab'), math.sqrt(4), 2 + 3, "
             "json.dumps([1]), os.write.__name__)",
        call="state", compare_to="([1, 2], 2, 2.0, 5, '[1]', 'write')")
    with Sandbox(workers=1, _native_jobs=True) as one:  # even a job with ctypes leaves nothing for the next one
        jobs = []
        for c in tamper:
            jobs += [ExecJob(code=bait.subst(c.code), call=c.call), check]
        results = one.run(jobs)
        for c, r in zip(tamper, results[1::2], strict=True):
            assert (r.status, r.match) == ("ok", True), f"state leaked after {c.name}: {r}"
        # randomness is fresh in every job even though each is forked from the same warm worker
        values = {one.run_one("import random", "random.random()").value for _ in range(4)}
        assert len(values) == 4
