"""The reward scheme shown in README.md ("Write a reward scheme") runs as written and drives rounds of the env,
paying what its text says: ``1 − p̂`` for a task the matched student solves at least once, ``unsolved`` for
one nobody solves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from populora_env import SeedTeacher, unregister_reward_scheme

from .helpers import play_round
from .test_game import PartialStudent

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    region = text.split("<!-- plugin-example:start -->", 1)[1].split("<!-- plugin-example:end -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", region, re.S)
    assert len(blocks) == 1, "the README region must hold exactly one python block"
    return blocks[0]


def test_example_is_short() -> None:
    assert len(readme_example().strip().splitlines()) < 25


def test_readme_scheme_runs_in_the_env(make_env: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)  # our own README code, not model output
    try:
        samples = 4
        env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=samples,
                       reward_scheme="gentle", reward_kwargs={"invalid": -0.25, "unsolved": -0.1})
        teachers = {a: SeedTeacher(seed=i) for i, a in enumerate(env.teachers)}
        students = {a: PartialStudent(env, samples) for a in env.students}
        seen = set()
        for _ in range(3):
            infos = play_round(env, teachers, students)["step2"][4]
            assert infos["teacher_0"]["round"]["reward_scheme"] == "gentle"
            for teacher in env.teachers:
                student = next(p["student"] for p in infos[teacher]["round"]["pairs"] if p["teacher"] == teacher)
                for info, reward in zip(infos[teacher]["completion_info"], infos[teacher]["completion_rewards"],
                                        strict=True):
                    assert info["valid"], info  # seed programs with fresh inputs
                    p_hat = students[student].n_correct(info["task_id"]) / samples
                    assert reward == pytest.approx(1.0 - p_hat if p_hat > 0 else -0.1)
                    seen.add(p_hat > 0)
        assert seen == {True, False}  # both branches were reached
    finally:
        unregister_reward_scheme("gentle")
