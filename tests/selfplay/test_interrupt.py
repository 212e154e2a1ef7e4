"""Ctrl-C on every ``populora`` sub-command (issue 48): SIGINT, sent once the command is working, ends it
promptly with one line on stderr and exit status 130, never a traceback, and nothing half-written: the file or
directory being written is either whole or absent, with no temporary file left behind.

Each command runs in a subprocess whose work is held at a known point (:data:`_GATED`: a function of the
command's, replaced by one that touches a marker file and waits; the first ``after`` calls pass through), or, for
the plugin testers and ``list``, in plugin code that loops; the test sends SIGINT when the marker appears.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.selfplay.conftest import REPO, TINY, cli_env

_GATED = """
import importlib, os, signal, sys, time
# SIGINT as Python sets it up in a terminal's foreground command; a suite run as a background job (nohup, a
# non-interactive shell's '&') hands it down ignored, and no Ctrl-C would ever reach the command under test
signal.signal(signal.SIGINT, signal.default_int_handler)
target = os.environ.get("GATE")
if target:
    after, marker = int(os.environ.get("GATE_AFTER", "0")), os.environ["GATE_MARKER"]
    module_name, _, attr = target.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    real, calls = getattr(owner, name), [0]
    def gated(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            open(marker, "w").close()
            while True:
                time.sleep(0.01)
        return real(*args, **kwargs)
    setattr(owner, name, gated)
from populora_cli.main import main
sys.exit(main(sys.argv[1:]))
"""

LOOPING = """
import os, time
from agents.advantages import register_advantage
from populora_env import register_reward_scheme

if os.environ.get("LOOP_IN_IMPORT"):
    open(os.environ["GATE_MARKER"], "w").close()
    while True:
        pass


@register_reward_scheme("test_only_loops")
def loops(results):
    open(os.environ["GATE_MARKER"], "w").close()
    while True:  # a busy loop: the interrupt arrives between bytecodes, inside the plugin
        pass


@register_advantage("test_only_loops")
def loops_too(rewards, response_mask, group_ids, **kw):
    open(os.environ["GATE_MARKER"], "w").close()
    while True:
        time.sleep(0.01)


from evolution.selection import register_selection
from populora_env.matching import register_matching


@register_selection("test_only_loops")
def selection_loops(ctx):
    open(os.environ["GATE_MARKER"], "w").close()
    while True:
        pass


@register_matching("test_only_loops")
def matching_loops(p):
    open(os.environ["GATE_MARKER"], "w").close()
    while True:
        pass
"""


def interrupted(tmp_path: Path, *args: str, gate: str | None = None, after: int = 0, env: dict | None = None,
                wait: float = 300) -> tuple[int, str, float]:
    """Run ``populora ARGS`` held at ``gate``, send SIGINT once it is there; ``(status, stderr, seconds from
    the signal to the exit)``."""
    marker = tmp_path / "working"
    child_env = {**cli_env(), "GATE_MARKER": str(marker), **(env or {})}
    if gate:
        child_env |= {"GATE": gate, "GATE_AFTER": str(after)}
    p = subprocess.Popen([sys.executable, "-c", _GATED, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=child_env, cwd=REPO)
    try:
        deadline = time.monotonic() + wait
        while not marker.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                out, err = p.communicate(timeout=5) if p.poll() is not None else ("", "")
                pytest.fail(f"never reached {gate}: status {p.poll()}\n{out[-2000:]}\n{err[-3000:]}")
            time.sleep(0.05)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        return p.returncode, err, time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def one_line(cmd: str, rc: int, err: str, seconds: float, hint: str = "") -> None:
    """Exit 130, promptly, the last line of stderr ``populora CMD: interrupted...``, no traceback."""
    lines = err.strip().splitlines()
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert lines and lines[-1].startswith(f"populora {cmd}: interrupted"), err[-3000:]
    assert hint in lines[-1], lines[-1]
    assert seconds < 30, f"{cmd} took {seconds:.1f} s to stop"


def leftovers(root: Path) -> list[Path]:
    """Temporary files and directories of the project's atomic writes (``.NAME.tmp...``, ``.tmp-...``,
    ``.NAME.XXXX`` of :func:`evolution.adapters_io.save_adapter_dir`) under ``root``."""
    return [p for p in root.rglob(".*") if p.name not in (".lock", ".built") and not p.name.startswith(".write")]


@pytest.fixture
def looping_plugin(tmp_path: Path) -> str:
    """The plugin's path; only the commands under test import it (in their own processes), so nothing registers
    here and nothing needs removing."""
    path = tmp_path / "looping_plugin.py"
    path.write_text(LOOPING)
    return str(path)


@pytest.mark.parametrize("cmd", ["test-scheme", "test-estimator", "test-selection", "test-matching"])
def test_ctrl_c_in_a_looping_plugin_is_an_interrupt_not_a_plugin_failure(tmp_path: Path, looping_plugin: str,
                                                                          cmd: str) -> None:
    """The issue's case: Ctrl-C during ``test-scheme`` on a looping scheme printed a 23-line traceback. The
    KeyboardInterrupt is raised inside the plugin's code, yet a real SIGINT arrived: 130, not exit 2."""
    one_line(cmd, *interrupted(tmp_path, cmd, "--plugins", looping_plugin, "test_only_loops"))


def test_ctrl_c_in_a_plugin_s_import_during_list(tmp_path: Path, looping_plugin: str) -> None:
    one_line("list", *interrupted(tmp_path, "list", "--plugins", looping_plugin, env={"LOOP_IN_IMPORT": "1"}))


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []


@pytest.mark.parametrize("cmd", ["train", "baseline"])
def test_ctrl_c_while_a_checkpoint_is_written(tmp_path: Path, cmd: str) -> None:
    """Held inside step 1's checkpoint write (its temporary directory filled, the manifest next): after the
    interrupt no temporary directory is left, no checkpoint was published half-made, and the run is not
    locked (a resume is offered)."""
    run = tmp_path / "run"
    rc, err, s = interrupted(tmp_path, cmd, *TINY, "--steps", "2", "--checkpoint-every", "1", "--run-dir", str(run),
                             gate="selfplay.checkpoint:write_manifest")
    one_line(cmd, rc, err, s, "--resume")
    assert _checkpoints(run) == [] and leftovers(run) == [], sorted(map(str, run.rglob("*")))
    assert (run / "config.json").is_file()


def test_ctrl_c_during_report_leaves_whole_figures_only(tmp_path: Path, tiny_run: Path) -> None:
    out = tmp_path / "report"
    rc, err, s = interrupted(tmp_path, "report", str(tiny_run), "--out", str(out),
                             gate="evaluation.report.plots:write_text_atomic", after=2)
    one_line("report", rc, err, s)
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 2 and leftovers(out) == [] and not (out / "summary.md").exists()
    assert all(p.read_bytes()[-8:-4] == b"IEND" for p in pngs)  # each figure whole


def test_ctrl_c_during_eval_keeps_whole_answers(tmp_path: Path, tiny_run: Path) -> None:
    """Held after the first batch of answers was appended: every line of the answers file is a whole JSON row,
    and no results.json was written."""
    out = tmp_path / "eval"
    rc, err, s = interrupted(tmp_path, "eval", str(tiny_run), "--benchmarks", "gsm8k", "--limit", "2",
                             "--out-dir", str(out), "--no-progress", "--members", "student_0", "--chunk-size", "1",
                             gate="evaluation.progress:ResultLog.append", after=1)
    one_line("eval", rc, err, s, "run the same command again")
    rows = [json.loads(line) for line in (out / "generations" / "gsm8k.jsonl").read_text().splitlines()]
    assert rows and not (out / "results.json").exists() and leftovers(out) == []


def test_ctrl_c_during_evolve_writes_no_child(tmp_path: Path, tiny_run: Path) -> None:
    """Held while the child's weights are written into its temporary directory: no child, no temporary one."""
    parents = sorted((tiny_run / "adapters").iterdir())[:2]
    out = tmp_path / "child"
    rc, err, s = interrupted(tmp_path, "evolve", "--op", "linear_0_5", "--parents", *map(str, parents), "--out",
                             str(out), gate="evolution.adapters_io:save_file")
    one_line("evolve", rc, err, s)
    assert not out.exists() and leftovers(tmp_path) == []


def test_ctrl_c_during_compare_from_leaves_no_partial_file(tmp_path: Path, tiny_run: Path) -> None:
    pytest.importorskip("rliable")
    run = tmp_path / "runs" / "pop"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "cmp"
    rc, err, s = interrupted(tmp_path, "compare", "--from", str(run), "--out", str(out), "--reps", "10",
                             gate="evaluation.compare.write:_write_text", after=0)
    one_line("compare", rc, err, s)
    assert not (out / "compare.md").exists() and leftovers(out) == []


def test_the_handler_is_the_caller_s_again_after_main(tmp_path: Path) -> None:
    """``main()`` called in a host process (a notebook, the tests) puts back the SIGINT handler it replaced."""
    from populora_cli.main import main

    before = signal.getsignal(signal.SIGINT)
    assert main(["list", "presets"]) == 0
    assert signal.getsignal(signal.SIGINT) is before
