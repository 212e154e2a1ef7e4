"""Multi-step determinism with a fixed seed, and exact resumption from ``state_dict``."""

from __future__ import annotations

import json
from typing import Any

from gymnasium.utils.env_checker import data_equivalence

from populora_env import OracleStudent, RandomPolicy, SeedTeacher

from .helpers import play_round
from .test_game import PartialStudent


class MixedStudents:
    """student_0 answers by plan (partially right), student_1 is an oracle, student_2 is random."""

    def __init__(self, env: Any, seed: int) -> None:
        self.policies = {
            "student_0": PartialStudent(env, env.config.samples_per_task),
            "student_1": OracleStudent(env),
            "student_2": RandomPolicy(seed=seed),
        }

    def __getitem__(self, agent: str) -> Any:
        return self.policies[agent]

    def __contains__(self, agent: object) -> bool:
        return agent in self.policies


def run(env: Any, rounds: int, seed: int) -> list[dict[str, Any]]:
    teachers = {a: SeedTeacher(seed=seed + i) for i, a in enumerate(env.teachers)}
    teachers["teacher_2"] = RandomPolicy(seed=seed)  # one teacher produces garbage
    students = MixedStudents(env, seed)
    return [play_round(env, teachers, students) for _ in range(rounds)]


def make(make_env: Any, seed: int | None) -> Any:
    return make_env(num_teachers=3, num_students=3, tasks_per_teacher=3, samples_per_task=2, seed=seed)


def test_same_seed_same_everything_over_several_rounds(make_env: Any) -> None:
    a = run(make(make_env, 7), rounds=4, seed=1)
    b = run(make(make_env, 7), rounds=4, seed=1)
    assert data_equivalence(a, b, exact=True)
    assert a == b


def test_different_seed_differs(make_env: Any) -> None:
    a = run(make(make_env, 7), rounds=3, seed=1)
    b = run(make(make_env, 8), rounds=3, seed=1)
    assert a != b


def test_reset_seed_reseeds(make_env: Any) -> None:
    env_a, env_b = make(make_env, None), make(make_env, None)
    obs_a, infos_a = env_a.reset(seed=123)
    obs_b, infos_b = env_b.reset(seed=123)
    assert obs_a == obs_b and infos_a == infos_b


def test_state_dict_round_trip_restores_identical_behaviour(make_env: Any) -> None:
    original = make(make_env, 11)
    run(original, rounds=3, seed=2)
    state = json.loads(json.dumps(original.state_dict()))  # must be JSON-serialisable

    restored = make(make_env, 999)  # different seed: everything must come from the state
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.current_round == original.current_round
    for agent in original.possible_agents:
        assert restored.conservative_skill(agent) == original.conservative_skill(agent)

    continued = run(original, rounds=3, seed=5)
    resumed = run(restored, rounds=3, seed=5)
    assert data_equivalence(continued, resumed, exact=True)
    assert original.state_dict() == restored.state_dict()


def test_reset_rating(make_env: Any) -> None:
    env = make(make_env, 0)
    run(env, rounds=2, seed=0)
    assert env.ratings.mu("student_1") != 25.0
    env.reset_rating("student_1")
    assert env.ratings.mu("student_1") == 25.0 and env.conservative_skill("student_1") == 0.0
