"""One run per directory: the run-directory lock (``selfplay.rundir.run_lock``), in a process and across processes,
its take-over after ``kill -9``, and two ``populora train`` on one directory at the same time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selfplay.rundir import (
    LOCK_NAME,
    RunDirError,
    check_resume_dir,
    lock_holder,
    prepare_new_run_dir,
    run_lock,
)
from tests.selfplay.conftest import REPO, TINY, cli_env, populora

_HOLD = """
import sys, time
from pathlib import Path
from selfplay.rundir import run_lock
with run_lock(Path(sys.argv[1]), "holder"):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder_process(run: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=cli_env(),
                         cwd=REPO)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_process_is_refused_naming_the_holder_then_takes_over_after_kill_9(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    holder = _holder_process(run)
    try:
        expected = f"pid {holder.pid} on host {socket.gethostname()}"
        assert lock_holder(run) is not None and lock_holder(run).startswith(expected)
        with pytest.raises(RunDirError, match=f"is in use by {expected}"), run_lock(run):
            pass
        for check in (prepare_new_run_dir, check_resume_dir):  # the checks before any work name it too
            with pytest.raises(RunDirError, match=f"in use by {expected}"):
                check(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the dead holder's lock; its pid/host record is still in the file (stale) and is replaced
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == holder.pid
    assert lock_holder(run) is None
    with run_lock(run, "train"):
        record = json.loads((run / LOCK_NAME).read_text())
        assert (record["pid"], record["host"], record["command"]) == (os.getpid(), socket.gethostname(), "train")
        with run_lock(run):  # re-entrant in one process
            assert lock_holder(run) is None
    assert (run / LOCK_NAME).read_text() == ""  # released: no holder recorded


def test_a_stale_record_without_a_lock_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "elsewhere", "since": "yesterday"}))
    assert lock_holder(run) is None
    with run_lock(run):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    prepare_new_run_dir(run)  # the lock file alone does not mark a run


def test_two_trains_on_one_directory_one_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["-m", "populora_cli.main", "train", *TINY, "--steps", "1", "--run-dir", str(run)]
    first = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cli_env(), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:  # until the first holds the directory
            if (run / LOCK_NAME).is_file() and (run / LOCK_NAME).read_text().strip():
                break
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()[1][-3000:]
        # read while the first holds it: on a slow machine the first may finish (and free it) before the
        # second's refusal is checked
        since = json.loads((run / LOCK_NAME).read_text())["since"]
        second = populora("train", *TINY, "--steps", "1", "--run-dir", str(run), timeout=300)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == (
            f"populora train: error: run directory {run} is in use by pid {first.pid} on host {socket.gethostname()} "
            f"(since {since}, train): one run per directory; wait for "
            "it to finish, or choose another --run-dir")
        _out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    assert len([p for p in run.iterdir() if p.name.startswith("events.out.tfevents.")]) == 1
