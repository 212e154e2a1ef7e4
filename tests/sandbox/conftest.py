"""Shared fixtures for the sandbox tests: a host context full of bait, and a sandbox serving it.

The bait is what a hostile job would go after: a secret in the test process's environment, a
world-readable secret file in the user's home, a canary file, TCP/UDP listeners on 127.0.0.1, and marker
paths a job must not be able to create. Every check is made on the host, never trusting the job's report.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from populora_env.sandbox import Limits, Sandbox


@dataclass
class HostBait:
    """Everything a hostile job might target, plus what it takes to check the host afterwards."""

    token: str
    env_var: str
    home_secret: Path
    canary: Path
    canary_text: str
    tcp: socket.socket
    udp: socket.socket
    marker_dir: Path
    markers: list[Path] = field(default_factory=list)

    @property
    def tcp_port(self) -> int:
        return self.tcp.getsockname()[1]

    @property
    def udp_port(self) -> int:
        return self.udp.getsockname()[1]

    def subst(self, code: str) -> str:
        """Fill ``$TOKEN``-style placeholders of a hostile program with this host's bait."""
        from string import Template

        return Template(code).safe_substitute(
            HOST_PID=os.getpid(), TCP_PORT=self.tcp_port, UDP_PORT=self.udp_port, CANARY=str(self.canary),
            HOME_SECRET=str(self.home_secret), ENV_VAR=self.env_var, MARKER_DIR=str(self.marker_dir),
        )

    def assert_untouched(self) -> None:
        """The canary survives, no marker appeared, no connection or datagram reached the listeners."""
        assert self.canary.read_text() == self.canary_text, "canary file was modified"
        assert self.home_secret.exists()
        leftovers = sorted(p.name for p in self.marker_dir.iterdir())
        assert leftovers == [], f"a job created files on the host: {leftovers}"
        for path in ("/tmp/populora_pwned", "/root/populora_pwned", "/etc/populora_pwned",
                     "/dev/shm/populora_pwned", "/var/tmp/populora_pwned"):
            assert not os.path.exists(path), f"a job created {path} on the host"
        self.tcp.setblocking(False)
        with pytest.raises(BlockingIOError):
            conn, addr = self.tcp.accept()
            conn.close()
            raise AssertionError(f"the TCP listener saw a connection from {addr}")
        self.udp.setblocking(False)
        with pytest.raises(BlockingIOError):
            data = self.udp.recv(100)
            raise AssertionError(f"the UDP listener received {data!r}")


def all_procs() -> list[dict]:
    """Every process on the host (from /proc): pid, ppid, real uid, state, name."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        out.append({"pid": int(entry), "uid": int(fields["Uid"].split()[0]), "state": fields["State"].strip(),
                    "name": fields["Name"].strip(), "ppid": int(fields["PPid"])})
    return out


def sandbox_procs(sb: Sandbox) -> list[dict]:
    """All processes descending from this sandbox's worker processes (other sandboxes may share the host)."""
    procs = all_procs()
    children: dict[int, list[dict]] = {}
    for p in procs:
        children.setdefault(p["ppid"], []).append(p)
    out, todo = [], list(sb.worker_pids)
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child["pid"])
    return out


def assert_workers_clean(sb: Sandbox) -> None:
    """No job process, thread or zombie is left, each fork server is idle, and each job area is empty.

    Looks at every descendant of the sandbox's worker processes (orphans are re-parented to the fork server,
    which is a subreaper, or to the namespace's init, so nothing escapes this view): the fork server and its
    zygote, idle, one thread each, and nothing else; and, in namespaced
    modes, checks from the host (through /proc/PID/root) that each job-area tmpfs is unmounted and its mount
    point empty. Waits for the workers' post-job cleanup first (they answer before cleaning).
    """
    sb.wait_clean()
    uids = set(sb.worker_uids)
    servers = sb.fork_server_pids
    assert len(servers) == sb.n_workers, f"fork servers {servers} for {sb.n_workers} workers"
    zygotes = sb.zygote_pids
    assert len(zygotes) == sb.n_workers, f"zygotes {zygotes} for {sb.n_workers} workers"
    procs = sandbox_procs(sb)
    for p in procs:
        assert p["uid"] in uids or p["uid"] in (0, os.getuid()), f"unexpected uid in the sandbox tree: {p}"
        assert not p["state"].startswith("Z"), f"zombie left: {p}"
    left = [p for p in procs if p["uid"] in uids and p["pid"] not in servers + zygotes]
    assert left == [], f"job processes left: {left}"
    for pid in servers + zygotes:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state in "SR", f"fork server {pid} is in state {state}"
        threads = len(os.listdir(f"/proc/{pid}/task"))
        assert threads == 1, f"fork server {pid} has {threads} threads"
        if sb.mode.startswith("bwrap"):
            area = Path(f"/proc/{pid}/root/tmp/populora")
            assert sorted(os.listdir(area)) == [], f"job files left in the worker {pid}"
            assert area.stat().st_dev == area.parent.stat().st_dev, f"a job tmpfs is still mounted in {pid}"


def process_attributes(pid: int) -> dict:
    """Everything a job might try to change for good about a process, read on the host from /proc and syscalls.

    nice, scheduling policy and real-time priority (/proc/PID/stat fields 19, 41, 40), CPU affinity, I/O
    priority (ioprio_get), rlimits (/proc/PID/limits), the autogroup's nice.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out = {"nice": int(fields[16]), "policy": int(fields[38]), "rt_priority": int(fields[37]),
           "affinity": sorted(os.sched_getaffinity(pid)), "limits": Path(f"/proc/{pid}/limits").read_text(),
           "ioprio": _libc.syscall(_IOPRIO_GET[platform.machine()], 1, pid)}
    try:
        out["autogroup"] = Path(f"/proc/{pid}/autogroup").read_text().split()[-1]
    except OSError:
        out["autogroup"] = None
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}
#: What a process started normally has on this host: nice 0, SCHED_OTHER, no real-time priority.
NORMAL = {"nice": 0, "policy": os.SCHED_OTHER, "rt_priority": 0}


@pytest.fixture(scope="session")
def bait() -> HostBait:
    token = "POPULORA-SECRET-" + secrets.token_hex(16)
    env_var = "POPULORA_TEST_SECRET_TOKEN"
    os.environ[env_var] = token  # set before any sandbox starts: a leak through inheritance would show
    home_secret = Path.home() / f".populora_sandbox_secret_{secrets.token_hex(4)}"
    home_secret.write_text(token)
    os.chmod(home_secret, 0o644)  # world-readable on purpose: only isolation can hide it
    canary_dir = Path(tempfile.mkdtemp(prefix="populora-canary-"))
    os.chmod(canary_dir, 0o777)  # world-writable on purpose, so a uid drop alone would not protect it
    canary = canary_dir / "canary.txt"
    canary_text = "canary " + token
    canary.write_text(canary_text)
    os.chmod(canary, 0o666)
    marker_dir = Path(tempfile.mkdtemp(prefix="populora-markers-"))
    os.chmod(marker_dir, 0o777)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    b = HostBait(token=token, env_var=env_var, home_secret=home_secret, canary=canary, canary_text=canary_text,
                 tcp=tcp, udp=udp, marker_dir=marker_dir)
    yield b
    tcp.close()
    udp.close()
    home_secret.unlink(missing_ok=True)
    canary.unlink(missing_ok=True)
    canary_dir.rmdir()
    for p in marker_dir.iterdir():
        p.unlink()
    marker_dir.rmdir()
    os.environ.pop(env_var, None)


@pytest.fixture(scope="module")
def sb(bait: HostBait) -> Sandbox:
    """A 2-worker sandbox shared by a test module (the hostile corpus must not break it)."""
    with Sandbox(workers=2, limits=Limits(timeout_s=1.0, memory_mb=256, max_output_chars=10_000)) as box:
        yield box
