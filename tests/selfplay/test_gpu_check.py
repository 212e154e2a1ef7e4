"""benchmarks/gpu_check.py: ``--dry`` runs the GPU check's path end to end on CPU with a small random shape and
writes every field the GPU run fills; bad arguments exit 2 first; the set-up installs the carried bundle's wheels
where a dependency is missing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
RUN_FIELDS = {"status", "seconds", "timeout_s", "command", "log", "arm", "preset", "model", "engine", "run_dir",
              "step_seconds", "last_step_seconds", "median_step_seconds", "setup_seconds", "totals_seconds",
              "peak_gpu_memory_gib", "members", "evolution_events", "plan"}
PROBE_FIELDS = {"status", "seconds", "model", "device", "dtype", "rank", "trainer", "prompt", "load_seconds",
                "updates", "flex", "first_call_seconds", "estimate_within_20_percent", "cuda_kernels",
                "flex_vs_tree_grad_rel_diff"}
UPDATE_FIELDS = {"attention", "completion_tokens", "seconds", "passes", "skipped", "largest_pass_tokens",
                 "measured_gib", "estimate_gib", "measured_over_estimate", "kernels_used"}


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


@pytest.mark.e2e  # both arms and the probe: CI's end-to-end tier (and CI's set-up step runs --dry to the end too)
def test_dry_run_writes_every_field_the_gpu_run_fills(tmp_path):
    """One step of each arm on ``random:qwen2-tiny`` and the probe, the vLLM checks left out (tested in CI's vLLM
    step): every field of the GPU run's JSON is there, with CPU values where CPU measures them."""
    report_dir = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--model", "random:qwen2-tiny", "--steps", "1", "--skip-checks",
         "--out-dir", str(tmp_path / "out"), "--report-dir", str(report_dir)],
        capture_output=True, text=True, cwd=ROOT, timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((report_dir / "gpu_check.json").read_text())
    assert (report_dir / "summary.txt").is_file()
    assert report["status"] == "passed" and report["format_version"] == 2 and report["setup"]["status"] == "not needed"
    for arm in ("population", "baseline"):
        run = report["runs"][arm]
        assert RUN_FIELDS <= set(run), RUN_FIELDS - set(run)
        assert run["status"] == "ok" and run["engine"] == "hf" and len(run["step_seconds"]) == 1
        assert run["plan"]["status"] == "ok" and run["plan"]["gpu_gib"] == 80.0 and run["plan"]["peak_gib"] > 0
        assert run["peak_gpu_memory_gib"] is None and run["plan"]["measured_peak_gib"] is None  # CPU: not measured
    assert len(report["runs"]["population"]["members"]) == 8
    assert report["population_vs_baseline_step_time"] > 0
    probe = report["probe"]
    assert PROBE_FIELDS <= set(probe), PROBE_FIELDS - set(probe)
    assert probe["status"] == "ok" and probe["estimate_within_20_percent"] is True
    assert [u["completion_tokens"] for u in probe["updates"]] == [16, 32, 64]
    for u in probe["updates"]:
        assert UPDATE_FIELDS <= set(u) and u["kernels_used"] == {"block-mask": 16} and u["passes"] >= 2
    assert probe["flex"]["status"] == "skipped" and probe["cuda_kernels"] is None
    assert report["fused_multi_lora"]["status"] == "not built"


def _wheel(path: Path, name: str) -> Path:
    """A minimal pure-Python wheel of module ``name`` (what gpu_wheels.py puts in the bundle)."""
    whl = path / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 7\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return whl


def test_setup_installs_the_bundles_wheels_where_a_module_is_missing(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    bundle, site = tmp_path / "gpu-bundle", tmp_path / "site"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "cache").mkdir()
    monkeypatch.setattr(gc, "NEEDED", ("populora_fake_dep",))
    monkeypatch.delenv("POPULORA_CACHE", raising=False)
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    rec = gc.setup(bundle, site)  # no wheels: one line saying where they come from
    assert rec["status"] == "failed" and "copy gpu-bundle here" in rec["reason"]
    _wheel(bundle / "wheels", "populora_fake_dep")
    rec = gc.setup(bundle, site)
    assert rec["status"] == "ok" and rec["installed"] == ["populora_fake_dep-0.1-py3-none-any.whl"]
    assert rec["missing_after"] == [] and (site / "populora_fake_dep" / "__init__.py").is_file()
    assert sys.path[0] == str(site) and str(site) in __import__("os").environ["PYTHONPATH"].split(":")
    assert __import__("os").environ["POPULORA_CACHE"] == str(bundle / "cache")
    sys.modules.pop("populora_fake_dep", None)
