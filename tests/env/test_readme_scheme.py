"""The custom reward scheme shown in README.md runs as written and drives a round of the env."""

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
    region = text.split("<!-- custom-reward-example:start -->", 1)[1].split("<!-- custom-reward-example:end -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", region, re.S)
    assert len(blocks) == 1, "the README region must hold exactly one python block"
    return blocks[0]


def test_example_is_short() -> None:
    assert len(readme_example().strip().splitlines()) < 25


def test_readme_scheme_runs_in_the_env(make_env: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)  # our own README code, not model output
    try:
        namespace["env"].close()
        samples = 4
        env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=samples,
                       reward_scheme="peaked", reward_kwargs={"invalid": -1.0})
        teachers = {a: SeedTeacher(seed=i) for i, a in enumerate(env.teachers)}
        students = {a: PartialStudent(env, samples) for a in env.students}
        for _ in range(2):
            infos = play_round(env, teachers, students)["step2"][4]
            assert infos["teacher_0"]["round"]["reward_scheme"] == "peaked"
            for teacher in env.teachers:
                for info, reward in zip(infos[teacher]["completion_info"], infos[teacher]["completion_rewards"],
                                        strict=True):
                    p_hat = students["student_0"].n_correct(info["task_id"]) / samples
                    assert reward == pytest.approx(1.0 - abs(2.0 * p_hat - 1.0))
    finally:
        unregister_reward_scheme("peaked")
