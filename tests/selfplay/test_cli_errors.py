"""Bad configuration exits with status 2 and a message naming the field, before any work starts."""

from __future__ import annotations

import time

import pytest

from tests.selfplay.conftest import populora


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "0"], "--steps"),
        (["--model", "/nonexistent/path/to/model"], "--model"),
        (["--model", "./missing-model.gguf"], "--model"),
        (["--env.timeout-s", "-1"], "--env.timeout-s"),
        (["--env.samples-per-task", "0"], "--env.samples-per-task"),
        (["--env.reward-scheme", "no-such-scheme"], "--env.reward-scheme"),
        (["--env.task-types", "deduction", "guessing"], "--env.task-types"),
        (["--trainer.advantage", "no-such-estimator"], "--trainer.advantage"),
        (["--preset", "no-such-preset"], "--preset"),
        (["--env.num-teachers", "0"], "--env.num-teachers"),
    ],
)
def test_bad_value_exits_2_naming_the_field(args: list[str], needle: str, tmp_path) -> None:
    t0 = time.perf_counter()
    p = populora("train", "--run-dir", str(tmp_path / "run"), *args, timeout=120)
    elapsed = time.perf_counter() - t0
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert needle in p.stderr, p.stderr[-2000:]
    # nothing was started: no run directory, and no model load (that alone takes longer than this)
    assert not (tmp_path / "run").exists()
    assert elapsed < 60


def test_unparseable_flag_exits_2(tmp_path) -> None:
    p = populora("train", "--steps", "many", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert p.returncode == 2
    assert "--steps" in p.stderr


def test_resume_of_a_non_run_exits_2(tmp_path) -> None:
    p = populora("train", "--resume", str(tmp_path), timeout=120)
    assert p.returncode == 2
    assert "--resume" in p.stderr


def test_unknown_command_exits_2() -> None:
    p = populora("fly", timeout=60)
    assert p.returncode == 2
    assert "unknown command" in p.stderr


def test_help_documents_the_flags() -> None:
    p = populora("train", "--help", timeout=120)
    assert p.returncode == 0
    for flag in ("--preset", "--steps", "--run-dir", "--model", "--resume", "--env.samples-per-task",
                 "--trainer.advantage"):
        assert flag in p.stdout, flag
