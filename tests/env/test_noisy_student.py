"""``NoisyStudent``, the scripted opponents' student: correct at its rate, else wrong, a share of those badly
formatted, as the env's own checker judges them."""

from __future__ import annotations

import pytest

from populora_env import NoisyStudent, SeedTeacher, parallel_env


def _verdicts(**kw) -> list[tuple[bool, bool]]:
    env = parallel_env(
        num_teachers=1, num_students=1, tasks_per_teacher=3, samples_per_task=4, sandbox_workers=1
    )
    try:
        obs, infos = env.reset(seed=0)
        obs, _, _, _, infos = env.step(
            {"teacher_0": SeedTeacher(seed=0).act(obs["teacher_0"], infos["teacher_0"])}
        )
        env.step({"student_0": NoisyStudent(env, seed=1, **kw).act(obs["student_0"], infos["student_0"])})
        return [(a.correct, a.format_ok) for a in env.last_outcome.results.attempts]
    finally:
        env.close()


def test_the_rates_decide_correct_wrong_and_malformed_answers() -> None:
    assert set(_verdicts(correct=1.0)) == {(True, True)}
    assert set(_verdicts(correct=0.0, format_errors=0.0)) == {(False, True)}
    assert set(_verdicts(correct=0.0, format_errors=1.0)) == {(False, False)}
    mixed = _verdicts(correct=0.5, format_errors=0.5)
    assert {(True, True), (False, True), (False, False)} <= set(mixed)
    assert mixed == _verdicts(correct=0.5, format_errors=0.5)  # seeded


def test_a_rate_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="correct must be in"):
        NoisyStudent(None, correct=1.5)
