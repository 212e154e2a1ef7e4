"""Helpers to run the ``populora`` CLI in a subprocess (the way users and scripts call it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import built_once

REPO = Path(__file__).resolve().parents[2]

# A tiny, fast, fully offline configuration: tiny-random model, 1 teacher + 2 students... kept small so a
# step takes about a second. entropy_coef > 0 makes every update move the adapters even when all rewards
# are equal (a random model never earns a non-trivial reward), so resume tests compare real training.
TINY = [
    "--model", "tiny-random", "--env.num-teachers", "2", "--env.num-students", "2", "--rank", "4", "--alpha", "8",
    "--env.tasks-per-teacher", "2", "--env.samples-per-task", "2", "--env.sandbox-workers", "1",
    "--generation.teacher-max-new-tokens", "12", "--generation.student-max-new-tokens", "8",
    "--generation.temperature", "1.0", "--trainer.entropy-coef", "0.01", "--trainer.lr", "1e-3",
    "--pbt.interval", "2", "--threads", "1", "--no-progress",
    "--pbt.min-final-age", "0",  # PBT may fire at the last step: the contract tests check events at steps 2 and 4
]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def populora(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m populora_cli.main ARGS`` and return the completed process (stdout/stderr captured)."""
    return subprocess.run([sys.executable, "-m", "populora_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(), cwd=cwd or REPO)


def populora_started(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``python -m populora_cli.main ARGS`` without waiting (stdout/stderr piped, text): independent runs
    of a test overlap. ``env``: the child's environment (default :func:`cli_env`)."""
    return subprocess.Popen([sys.executable, "-m", "populora_cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or cli_env(), cwd=REPO)


@contextmanager
def killed_on_exit(procs: Iterable[subprocess.Popen]) -> Iterator[None]:
    """Kill (and reap) whichever of ``procs`` still runs when the block exits, e.g. after a failed assertion."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def run_cli():
    return populora


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Run ``populora ARGS`` in this process with a model loader that must never be called; returns
    ``(exit status, stderr)``."""
    import agents.models
    import selfplay.members
    from populora_cli.main import main

    def no_model(*args, **kwargs):
        raise AssertionError(f"the model was loaded: load_base{args}")

    monkeypatch.setattr(agents.models, "load_base", no_model)
    monkeypatch.setattr(selfplay.members, "load_base", no_model)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            rc = main(list(args))
        except SystemExit as exc:  # tyro's own parse errors
            rc = exc.code
        return rc, capsys.readouterr().err

    return run


_WATCH = """
import json, sys
import agents.models
loads = []
real = agents.models.load_base
def watched(*args, **kwargs):
    loads.append(str(args[0] if args else kwargs.get("name")))
    return real(*args, **kwargs)
agents.models.load_base = watched
from populora_cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
print("WATCH " + json.dumps({"rc": rc, "model_loads": loads}))
sys.exit(rc)
"""


def populora_watched(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``populora ARGS`` in a subprocess whose model loader (``agents.models.load_base``) records each call;
    returns the process and the models it loaded (so a test can tell that a command exited before loading one)."""
    p = subprocess.run([sys.executable, "-c", _WATCH, *args], capture_output=True, text=True, timeout=timeout,
                       env=cli_env(), cwd=REPO)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("WATCH ")]
    assert lines, (p.returncode, p.stderr[-3000:])
    info = json.loads(lines[-1][len("WATCH "):])
    assert info["rc"] == p.returncode
    return p, info["model_loads"]


# The run shared by the end-to-end tests (tests/selfplay/test_resume.py, test_run_contract.py, test_train_smoke.py):
# 4 steps, a checkpoint after each (pruned to the newest 2), PBT events at steps 2 and 4. Without newborn
# protection each event replaces exactly one teacher and one student (two members per role), so the lineage is
# known in advance: 4 lines.
REF_ARGS = [*TINY, "--steps", "4", "--checkpoint-every", "1", "--keep-checkpoints", "2", "--pbt.no-newborn-protection"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished ``populora train REF_ARGS`` run. Shared: tests must not change it (copy it first)."""
    def build(root: Path) -> None:
        p = populora("train", *REF_ARGS, "--run-dir", str(root / "ref"))
        assert p.returncode == 0, p.stderr[-4000:]

    return built_once(tmp_path_factory, "tiny_run", build) / "ref"


# The population and baseline runs shared by tests/selfplay/test_logging_contract.py (every tag at every step, the
# report of both) and tests/selfplay/test_train_smoke.py (the baseline's one adapter): 3 steps, PBT at step 2.
ARM_STEPS = 3
ARM_DIRS = {"population": "pop", "baseline": "base"}


@pytest.fixture(scope="session")
def arm_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A population and a baseline run of ``ARM_STEPS`` steps (PBT at step 2), run side by side, and the report
    of both (``"report"``); each run's console output (stdout, then stderr) is ``<root>/<arm>.console``. Shared:
    tests must not change them (copy them first)."""
    def build(root: Path) -> None:
        procs = {arm: populora_started("train" if arm == "population" else "baseline", *TINY, "--steps",
                                       str(ARM_STEPS), "--log-samples", "1", "--run-dir", str(root / d))
                 for arm, d in ARM_DIRS.items()}
        with killed_on_exit(procs.values()):
            for arm, p in procs.items():
                out, err = p.communicate(timeout=900)
                assert p.returncode == 0, f"{arm}: {err[-4000:]}"
                (root / f"{arm}.console").write_text(out + err)  # what the user saw (test_readme_results.py)
        rep = populora("report", *(str(root / d) for d in ARM_DIRS.values()), "--out", str(root / "report"))
        assert rep.returncode == 0, rep.stderr[-3000:]

    root = built_once(tmp_path_factory, "arm_runs", build)
    return {arm: root / d for arm, d in ARM_DIRS.items()} | {"report": root / "report"}


@contextmanager
def read_only_tree(root: Path, fill: Callable[[Path], object] | None = None) -> Iterator[Path]:
    """``root`` (made here), filled by ``fill(root)``, then closed to writes: its folders mode 0555 for a normal
    user; for root (who ignores modes) a tmpfs mounted on it, filled, then remounted read-only (skipped where
    root cannot mount)."""
    root.mkdir()
    if os.geteuid() != 0:
        if fill is not None:
            fill(root)
        dirs = [root, *(p for p in root.rglob("*") if p.is_dir())]
        for d in dirs:
            d.chmod(0o555)
        try:
            yield root
        finally:
            for d in dirs:
                d.chmod(0o755)
        return
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(root)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"root cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        if fill is not None:
            fill(root)
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True, capture_output=True)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """An empty directory nobody may create entries in (:func:`read_only_tree`)."""
    with read_only_tree(tmp_path / "ro") as d:
        yield d
