"""The GPU check's set-up, proven without a GPU (marker ``slow``; CI runs it after the default suite).

A GPU machine without network whose Python has only a minimal CUDA PyTorch stack gets the project's other
dependencies from the offline bundle (``scripts/gpu_wheels.py``, docs/vllm.md "The GPU check"). This test builds
such a machine's Python from CPU builds and runs the check from it:

1. ``scripts/gpu_wheels.py`` builds the bundle (wheels for this Python, and SmolLM2's tokenizer);
2. a fresh venv receives only ``gpu_wheels.PRESENT`` (and what they require), each at the version this
   environment has (torch: its CPU build), and NOT the project;
3. a copy of the repository's tracked files holds the bundle at ``gpu-bundle/``, as a researcher copies it;
4. ``benchmarks/gpu_check.py --dry`` runs from that venv to the end: its set-up finds the project's
   dependencies missing, installs the bundle with ``pip --no-index --no-deps`` into ``.gpu-site``, and every
   part passes.

A wheel missing from the bundle (a new dependency, a dependency that moved out of ``PRESENT``'s closure) fails
here, not on the first GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _present() -> tuple[str, ...]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_wheels
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return gpu_wheels.PRESENT


def _checkout(dest: Path) -> None:
    """The repository's tracked files (what a clone holds) under ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    archive = dest.parent / "checkout.tar"
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, files.decode().split("\0")):
            if (ROOT / name).is_file():
                tar.add(ROOT / name, arcname=name)
    dest.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def test_the_bundle_installs_on_a_bare_pytorch_image_and_the_dry_check_passes(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    _checkout(checkout)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    bundle = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_wheels.py",
            "--out",
            str(checkout / "gpu-bundle"),
            "--python-version",
            py,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert bundle.returncode == 0, bundle.stdout[-3000:] + bundle.stderr[-3000:]
    wheels = sorted(p.name for p in (checkout / "gpu-bundle" / "wheels").glob("*.whl"))
    assert any(w.startswith("tyro-") for w in wheels), wheels

    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=600)
    python = str(image / "bin" / "python")
    pins = [f"{name}=={metadata.version(name)}" for name in _present()]
    torch_pin = next(p for p in pins if p.startswith("torch=="))  # first, alone, as scripts/install.sh does
    for group in ([torch_pin], [p for p in pins if p != torch_pin]):
        proc = subprocess.run(
            [python, "-m", "pip", "install", "-q", *group], capture_output=True, text=True, timeout=1800
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    present = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; print([m for m in "
            "('tyro', 'trueskill', 'pettingzoo', 'populora_env') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    assert present == "[]", f"the image must lack the project and its own dependencies, has {present}"

    out = tmp_path / "out"
    check = subprocess.run(
        [python, "benchmarks/gpu_check.py", "--dry", "--steps", "1", "--out-dir", str(out)],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1800,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    setup = report["setup"]
    assert setup["status"] == "ok" and setup["missing_before"] and setup["missing_after"] == [], setup
    assert sorted(setup["installed"]) == wheels
    assert report["status"] == "passed", json.dumps(report)[-3000:]
    assert report["runs"]["population"]["status"] == "ok" and report["probe"]["status"] == "ok"
