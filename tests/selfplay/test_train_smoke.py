"""End-to-end runs of ``populora train`` / ``populora baseline`` on the tiny random model (subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from tests.selfplay.conftest import REPO, TINY, cli_env, populora


def _adapters(run: Path) -> dict[str, dict]:
    out = {}
    for d in sorted((run / "adapters").iterdir()):
        out[d.name] = load_file(str(d / "adapter_model.safetensors"))
    return out


def _final_env_state(run: Path) -> dict:
    cps = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return json.loads((cps[-1] / "env_state.json").read_text())


def test_train_smoke_writes_everything(tmp_path: Path) -> None:
    run = tmp_path / "smoke"
    p = populora("train", *TINY, "--steps", "2", "--checkpoint-every", "1", "--run-dir", str(run))
    assert p.returncode == 0, p.stderr[-4000:]
    assert list(run.glob("events.out.tfevents.*")), "no TensorBoard events"
    assert (run / "checkpoints" / "step_2" / "DONE").is_file()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"] == "population" and cfg["model"] == "tiny-random"
    members = sorted(d.name for d in (run / "adapters").iterdir())
    assert members == ["student_0", "student_1", "teacher_0", "teacher_1"]
    for m in members:
        assert (run / "adapters" / m / "adapter_config.json").is_file()
    assert (run / "report" / "summary.md").is_file()
    assert list((run / "report").glob("*.png"))
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["steps"] == 2

    # the report command renders from the finished run into another folder
    out = tmp_path / "rep"
    p = populora("report", str(run), "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "smoke" in (out / "summary.md").read_text()


def test_baseline_smoke_one_adapter(tmp_path: Path) -> None:
    run = tmp_path / "base"
    p = populora("baseline", *TINY, "--steps", "1", "--run-dir", str(run))
    assert p.returncode == 0, p.stderr[-4000:]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"] == "baseline"
    assert cfg["config"]["env"]["reward_scheme"] == "azr"
    assert [d.name for d in (run / "adapters").iterdir()] == ["azr"]


def test_kill_9_mid_run_resumes_and_matches_uninterrupted(tmp_path: Path) -> None:
    steps = ["--steps", "5", "--checkpoint-every", "1", "--keep-checkpoints", "10"]
    ref = tmp_path / "ref"
    p = populora("train", *TINY, *steps, "--run-dir", str(ref))
    assert p.returncode == 0, p.stderr[-4000:]

    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "populora_cli.main", "train", *TINY, *steps, "--run-dir", str(run)],
                            cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step_2" / "DONE").exists():
        time.sleep(0.05)
        assert proc.poll() is None, "run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: trainer and its sandbox workers
    proc.wait()
    assert not (run / "adapters").exists(), "the run finished before the kill"

    p = populora("train", "--resume", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr[-4000:]
    a, b = _adapters(ref), _adapters(run)
    assert a.keys() == b.keys()
    for member in a:
        for k in a[member]:
            assert (a[member][k] == b[member][k]).all(), f"{member} {k} differs after resume"
    ra, rb = _final_env_state(ref), _final_env_state(run)
    assert ra["ratings"] == rb["ratings"]
    # the lineage of evolution events is identical too (no event lost or repeated)
    la = (ref / "lineage.jsonl").read_text().splitlines() if (ref / "lineage.jsonl").exists() else []
    lb = (run / "lineage.jsonl").read_text().splitlines() if (run / "lineage.jsonl").exists() else []
    strip = [json.dumps({k: v for k, v in json.loads(x).items() if k != "seconds"}) for x in la]
    stripb = [json.dumps({k: v for k, v in json.loads(x).items() if k != "seconds"}) for x in lb]
    assert strip == stripb
