"""The GPU path fails in one line before any work (selfplay/requirements.py): a GPU preset without CUDA, the vLLM
engine without vLLM, a hub model that is neither local nor cached on a machine without network."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import time

import pytest

from selfplay.config import ConfigError, load_preset
from selfplay.requirements import check_runtime, hub_model_problem
from tests.selfplay.conftest import REPO, cli_env

NOT_CACHED = "populora-tests/not-a-cached-model"
_find_spec = importlib.util.find_spec


def _one_line(err: str, cmd: str = "train") -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"populora {cmd}: error: "), err[-2000:]
    return lines[0]


def test_gpu_preset_without_cuda_is_one_line_naming_cuda(cli, monkeypatch):
    """``paper-4t4s`` (device cuda, vLLM engine) where no GPU is visible: exit 2, one line naming CUDA (and vLLM
    where it is missing too), before the model loads (the fixture's loader refuses to be called)."""
    import torch

    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: False
    )  # a CUDA build on a GPU machine sees none either
    rc, err = cli("train", "--preset", "paper-4t4s", "--steps", "1", "--run-dir", "/nonexistent/run")
    line = _one_line(err)
    assert rc == 2 and line.startswith("populora train: error: --device: cuda needs a ")
    assert "--device cpu" in line
    assert ("vLLM is not installed" in line) == (importlib.util.find_spec("vllm") is None)
    assert "Traceback" not in err


def test_vllm_engine_without_vllm_is_one_line(cli, monkeypatch):
    """``--generation.engine vllm`` in an environment without vLLM: exit 2, the install command in one line."""
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else _find_spec(name, *a)
    )
    rc, err = cli(
        "train",
        "--preset",
        "cpu-smoke",
        "--generation.engine",
        "vllm",
        "--steps",
        "1",
        "--run-dir",
        "/nonexistent/run",
    )
    line = _one_line(err)
    assert rc == 2 and line.startswith("populora train: error: --generation.engine: vllm is not installed")
    assert "scripts/install.sh --vllm" in line and "--generation.engine hf" in line


def test_cuda_build_missing_and_device_index_are_named(monkeypatch):
    """The three CUDA problems, each its own reason: a CPU-only build, no visible GPU, an index past the count."""
    import torch

    cfg = dataclasses.replace(load_preset("cpu-smoke"), device="cuda")
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=r"needs a CUDA build of PyTorch; this one is .* \(CPU only\)"):
        check_runtime(cfg)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a visible NVIDIA GPU"):
        check_runtime(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="cuda:1: this machine has 1 GPU"):
        check_runtime(dataclasses.replace(cfg, device="cuda:1"))
    check_runtime(dataclasses.replace(cfg, device="cuda:0"))  # one GPU, index 0: nothing missing
    check_runtime(dataclasses.replace(cfg, device="cpu"))


def test_uncached_hub_model_offline_fails_fast_in_one_line(tmp_path, monkeypatch):
    """A hub id not in the cache with ``HF_HUB_OFFLINE=1``, through the command: exit 2 within seconds, one line
    saying how to bring the weights, no hub retries, no run directory."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    t0 = time.perf_counter()
    p = _run(
        cli_env(), "train", "--preset", "cpu-smoke", "--model", NOT_CACHED, "--run-dir", str(tmp_path / "run")
    )
    took = time.perf_counter() - t0
    line = _one_line(p.stderr)
    assert p.returncode == 2 and line.startswith(
        f"populora train: error: --model: {NOT_CACHED!r} is not a local"
    )
    assert f"hf download {NOT_CACHED} --local-dir DIR" in line and "--model DIR" in line
    assert "HF_HUB_OFFLINE is set" in line
    assert took < 60, f"{took:.0f} s: the check must not wait on the hub"  # 15 s of imports at load 13
    assert not (tmp_path / "run").exists()


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "populora_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )


def test_cached_hub_model_is_accepted_and_read_offline(tmp_path, monkeypatch):
    """A hub id whose ``config.json`` is in the cache passes; with the hub unreachable the process is switched to
    ``HF_HUB_OFFLINE=1`` so the loaders read the cache without retrying."""
    snap = tmp_path / "hub" / "models--org--cached" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--cached" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # recorded, so the switch to 1 below is undone after the test
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refuses the connection: the hub is unreachable
    t0 = time.perf_counter()  # without the offline flag, an unreachable hub: refused after one connection try
    assert "the Hugging Face hub cannot be reached" in (hub_model_problem("org/uncached") or "")
    assert time.perf_counter() - t0 < 10 and os.environ["HF_HUB_OFFLINE"] == "0"
    assert hub_model_problem("org/cached") is None
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert "HF_HUB_OFFLINE is set" in (hub_model_problem("org/uncached") or "")
    for local in ("smollm2-135m", "tiny-random", "random:qwen2-tiny", str(tmp_path)):
        assert hub_model_problem(local) is None


def test_compare_refuses_a_gpu_preset_without_cuda_in_one_line(run_cli, tmp_path, monkeypatch):
    """``populora compare`` of the GPU pair where no GPU is visible: one line naming the first arm, nothing
    launched."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # compare's own process: a fresh torch sees no GPU
    p = run_cli(
        "compare",
        "--preset",
        "paper-4t4s",
        "--baseline-preset",
        "azr-baseline",
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "cmp"),
        timeout=600,
    )
    line = _one_line(p.stderr, "compare")
    assert p.returncode == 2 and line.startswith("populora compare: error: --device: cuda needs a ")
    assert line.endswith("(the population arm)") and not (tmp_path / "cmp").exists()
