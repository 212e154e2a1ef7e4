"""Helpers to run the ``populora`` CLI in a subprocess (the way users and scripts call it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture
def run_cli():
    return populora
