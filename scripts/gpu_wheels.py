"""Gather what a GPU machine without network lacks into one git-ignored folder, ``gpu-bundle/`` (run it on a
machine with network, in the project's ``.venv``; then copy the folder into the checkout on the GPU machine).

    python scripts/gpu_wheels.py [--out gpu-bundle] [--limit-mb 55] [--python-version 3.12]

For a GPU machine whose Python already has a CUDA PyTorch stack (a minimal PyTorch image: torch,
transformers, peft, tensorboard, pytest, hypothesis, numpy...; ``PRESENT``) but no network to install the rest
from. The bundle stays small (``--limit-mb``) so it can be copied with the checkout. This script:

1. computes the project's runtime dependencies (``pyproject.toml`` ``[project] dependencies``, markers
   evaluated for Linux x86-64 and ``--python-version``) and their dependencies, transitively, from the
   metadata of the packages installed in THIS environment;
2. removes those the image already has: the closure, computed the same way, of the packages it is assumed to
   ship (``PRESENT``) — so neither torch nor anything CUDA is ever downloaded;
3. ``pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux...`` each remaining
   distribution at the version installed here (the one the test suite runs with), into ``<out>/wheels``;
   a distribution published as an sdist only is built here with ``pip wheel`` and kept only if the wheel is
   pure Python (``*-none-any.whl``);
4. copies SmolLM2's tokenizer (3.5 MB: the tokenizer of ``random:<shape>`` models, ``agents.models``) to
   ``<out>/cache/models/``, so ``POPULORA_CACHE=$PWD/<out>/cache`` finds it there;
5. prints the folder's size (exit 1 above ``--limit-mb``) and the command to run on the GPU machine
   (``benchmarks/gpu_check.py`` installs the wheels itself, ``pip --no-index``, where its dependencies are
   missing: docs/vllm.md). tests/selfplay/test_gpu_setup.py builds such an image's venv from CPU builds and runs the
   check's ``--dry`` from the bundle.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PRESENT = ("torch", "transformers", "peft", "tensorboard", "pytest", "hypothesis", "numpy", "matplotlib", "requests",
           "cloudpickle", "python-dateutil", "six", "pyparsing", "safetensors", "tqdm", "filelock", "sympy")
"""What a minimal CUDA PyTorch image is assumed to ship (with their own dependencies); a bundle that brought them
again would shadow the image's builds (matplotlib against its numpy). Where an image lacks one, install it there
or remove it from this list before building the bundle."""
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64")


def _environment(python_version: str) -> dict[str, str]:
    env = default_environment()
    env.update(python_version=python_version, python_full_version=f"{python_version}.0",
               sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
               implementation_name="cpython", platform_python_implementation="CPython", os_name="posix")
    return env


def _applies(req: Requirement, env: dict[str, str], extras: frozenset[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(env | {"extra": e}) for e in (extras or {""}))


def closure(roots: list[Requirement], env: dict[str, str]) -> dict[str, str]:
    """canonical name -> installed version, for ``roots`` and everything they require (installed here)."""
    seen: dict[str, str] = {}
    stack = [(r, frozenset(r.extras)) for r in roots if _applies(r, env, frozenset())]
    missing = []
    while stack:
        req, extras = stack.pop()
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        if name in seen and not extras:
            continue
        seen[name] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            if _applies(sub, env, extras):
                stack.append((sub, frozenset(sub.extras)))
    if missing:
        print(f"not installed here (skipped): {', '.join(sorted(set(missing)))}", file=sys.stderr)
    return seen


def project_requirements() -> list[Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(line) for line in data["project"]["dependencies"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-bundle")
    parser.add_argument("--limit-mb", type=float, default=55.0)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--dry", action="store_true", help="print the list, download nothing")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version must look like 3.12 (got {args.python_version!r})")

    env = _environment(args.python_version)
    present = closure([Requirement(n) for n in PRESENT], env)
    needed = {n: v for n, v in closure(project_requirements(), env).items() if n not in present}
    print(f"in the image already (closure of {', '.join(PRESENT)}): {len(present)} distributions")
    print(f"to bring: {len(needed)}: " + ", ".join(f"{n}=={v}" for n, v in sorted(needed.items())))
    if args.dry:
        return 0

    wheels = args.out / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", args.python_version, "--implementation", "cp", "-d", str(wheels)]
    for plat in PLATFORMS:
        download += ["--platform", plat]
    built = []
    for name, version in sorted(needed.items()):
        pin = f"{name}=={version}"
        if subprocess.run([*download, pin], capture_output=True).returncode == 0:
            continue
        # no wheel published (an sdist only): build it here; only a pure-Python wheel is valid there
        before = set(wheels.iterdir())
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), pin],
                       check=True, capture_output=True)
        for whl in set(wheels.iterdir()) - before:
            if not whl.name.endswith("-none-any.whl"):
                whl.unlink()
                raise SystemExit(f"{pin}: no CPython {args.python_version} wheel and the sdist builds {whl.name}")
            built.append(whl.name)
    if built:
        print(f"built here from sdists (pure Python): {', '.join(built)}")

    from agents.models import _smollm2_tokenizer_dir

    tok = _smollm2_tokenizer_dir()
    dest = args.out / "cache" / "models" / tok.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tok, dest)

    files = sorted(p for p in args.out.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files) / 2**20
    for p in sorted(wheels.iterdir()):
        print(f"  {p.stat().st_size / 2**20:6.2f} MB  {p.name}")
    print(f"{args.out}: {len(files)} files, {size:.1f} MB (limit {args.limit_mb} MB)")
    print(f"copy {args.out.name}/ (git-ignored) into the checkout on the GPU machine and run, from the repository "
          "root (the check installs the wheels itself, into .gpu-site, and finds the tokenizer in the bundle):\n"
          "  HF_HUB_OFFLINE=1 python3 benchmarks/gpu_check.py --model random:qwen2.5-coder-7b "
          "--out-dir runs/gpu_check")
    return 1 if size > args.limit_mb else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
