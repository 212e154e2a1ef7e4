"""benchmarks/gpu_check.py: ``--dry`` runs the GPU check's path end to end on CPU with a small random shape
(slow: two training runs in subprocesses; 379 s measured on 2 cores at load ~9), and bad arguments exit 2 first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_bad_model_arguments_exit_2(tmp_path):
    for model, message in (
        ("random:no-such-shape", "unknown random shape"),
        (str(tmp_path / "missing"), "neither a local directory nor random:<shape>"),
    ):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--model", model, "--out-dir", str(tmp_path)],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()
    # --backend is the deprecated spelling of --engine (the generation engine): accepted with one warning line
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--backend", "hf", "--model", "random:no-such-shape",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "unknown random shape" in proc.stderr, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if "deprecated" in ln] == [
        "gpu_check.py --backend is deprecated and will be removed in the next release: use --engine"]


@pytest.mark.slow
def test_dry_run_on_a_random_shape_end_to_end(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--model", "random:qwen2-tiny", "--steps", "1", "--out-dir",
         str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "passed" and report["args"]["run_model"] == "random:qwen2-tiny"
    assert report["vllm_checks"]["status"] == "skipped"  # random shapes have no directory for vLLM
    for arm in ("population", "baseline"):
        run = report["runs"][arm]
        assert run["status"] == "ok" and run["engine"] == "hf" and len(run["step_seconds"]) == 1
    assert len(report["runs"]["population"]["members"]) == 8
    assert report["population_vs_baseline_step_time"] > 0
    assert report["fused_multi_lora"]["status"] == "not built"
