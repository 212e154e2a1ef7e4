"""Scripted opponents (``configs/scripted.json``, the ``scripted`` section; docs/swapping.md): a seconds-long
``populora train`` in which valid tasks, tasks solved at every attempt, at some and at none, correct and wrong
answers all occur, the learners train as usual and the scripted agents are never trained on; and the complexity
example scheme's two terms in its TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.report.loading import load_scalars
from selfplay import tags
from selfplay.config import TrainConfig, load_preset
from selfplay.scripted import ScriptedConfig
from tests.selfplay.conftest import populora

STEPS = 3


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("scripted") / "run"
    p = populora(
        "train",
        "--preset",
        "scripted",
        "--plugins",
        "examples/complexity_scheme.py",
        "--env.reward-scheme",
        "complexity",
        "--run-dir",
        str(run),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def _series(sc, tag: str) -> dict[int, float]:
    return dict(sc.get(tag, []))


def test_a_scripted_run_reaches_every_solve_rate(scripted_run: Path) -> None:
    sc = load_scalars(scripted_run)
    counts = {k: sum(_series(sc, t).values()) for k, t in tags.P_HAT_COUNTS.items()}
    assert counts["zero"] > 0 and counts["partial"] > 0 and counts["one"] > 0, (
        counts
    )  # p̂ = 0, 0 < p̂ < 1, p̂ = 1
    assert all(v > 0 for v in _series(sc, tags.VALID_RATE).values())
    correct = _series(sc, tags.STUDENT_CORRECT_RATE)
    assert len(correct) == STEPS and all(0.0 < v < 1.0 for v in correct.values())  # correct and wrong answers
    assert any(v < 1.0 for v in _series(sc, tags.STUDENT_FORMAT_RATE).values())  # and format errors
    # its time (seconds on 2 cores) is measured in docs/swapping.md, never asserted: timing decides no test


def test_the_learners_train_and_the_scripted_agents_do_not(scripted_run: Path) -> None:
    sc = load_scalars(scripted_run)
    for learner in ("teacher_1", "student_2"):
        assert len(_series(sc, tags.member(learner, "loss"))) == STEPS, learner
    for scripted in ("teacher_0", "student_0", "student_1"):
        assert not _series(sc, tags.member(scripted, "loss")), scripted  # played and rated, never updated
        assert _series(sc, tags.member(scripted, "mu"))


def test_the_complexity_scheme_s_terms_are_in_tensorboard(scripted_run: Path) -> None:
    sc = load_scalars(scripted_run)
    bonus = _series(sc, tags.reward_term("teacher", "complexity_bonus"))
    penalty = _series(sc, tags.reward_term("student", "length_penalty"))
    assert len(bonus) == len(penalty) == STEPS
    assert all(v > 0 for v in bonus.values()) and all(v < 0 for v in penalty.values())


def test_scripted_settings_are_checked() -> None:
    cfg = load_preset("scripted")
    assert cfg.scripted == ScriptedConfig(teachers=1, students=2, correct=0.5, format_errors=0.2)
    with pytest.raises(ValueError, match=r"^scripted.students: must be <= 3"):
        TrainConfig(**{**cfg.__dict__, "scripted": ScriptedConfig(students=4)}).validate()
    with pytest.raises(ValueError, match=r"^scripted.correct: must be <= 1"):
        TrainConfig(**{**cfg.__dict__, "scripted": ScriptedConfig(correct=1.5)}).validate()


@pytest.mark.e2e  # two more runs and a resume (about a minute of the default suite; issue 45): CI's e2e tier
def test_a_resumed_scripted_run_scripts_what_the_uninterrupted_one_did(
    scripted_run: Path, tmp_path: Path
) -> None:
    """The scripted policies are drawn per round from the run's seed: stopped after step 2 and resumed, the run
    gives the uninterrupted run's history and TensorBoard values."""
    run = tmp_path / "run"
    common = ["--plugins", "examples/complexity_scheme.py", "--no-progress"]
    p = populora(
        "train",
        "--preset",
        "scripted",
        *common,
        "--env.reward-scheme",
        "complexity",
        "--steps",
        "2",
        "--checkpoint-every",
        "1",
        "--run-dir",
        str(run),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    p = populora("train", "--resume", str(run), *common, "--steps", str(STEPS), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]

    def values(path: Path) -> list[dict]:
        history = json.loads((path / "run_summary.json").read_text())["history"]
        return [{k: v for k, v in h.items() if k != "step_seconds"} for h in history]

    assert values(run) == values(scripted_run)
    mine, theirs = load_scalars(run), load_scalars(scripted_run)
    for tag in (
        *tags.P_HAT_COUNTS.values(),
        tags.reward_term("teacher", "complexity_bonus"),
        tags.reward_term("student", "length_penalty"),
        tags.member("teacher_1", "loss"),
    ):
        assert _series(mine, tag) == _series(theirs, tag), tag
