"""The Gymnasium single-seat wrapper: gymnasium's env checker passes, and a round played through one seat pays
exactly what the ParallelEnv pays for the same completions."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populora_bridges import SingleSeatEnv
from populora_env import OracleStudent, PopuLoRAParallelEnv, RandomPolicy, SeedTeacher, parallel_env
from populora_env.policies import continue_prefix
from populora_env.sandbox import Limits, Sandbox

SETTINGS = dict(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2,
                task_types=("deduction", "abduction"))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=1, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        yield sb


def _game(sandbox: Sandbox) -> PopuLoRAParallelEnv:
    return parallel_env(sandbox=sandbox, **SETTINGS)


class HalfRight:
    """A student that answers its even-numbered prompts right and the odd ones with a wrong output."""

    def __init__(self, game: PopuLoRAParallelEnv) -> None:
        self.oracle = OracleStudent(game)

    def act(self, observation, info):
        right = self.oracle.act(observation, info)
        wrong = [continue_prefix(r["prefix"], "```output\n'no'\n```") for r in info["requests"]]
        return tuple(r if k % 2 == 0 else w for k, (r, w) in enumerate(zip(right, wrong, strict=True)))


def _policies(game: PopuLoRAParallelEnv) -> dict:
    return {"teacher_0": SeedTeacher(1), "teacher_1": SeedTeacher(2), "student_0": HalfRight(game),
            "student_1": HalfRight(game)}


def _parallel_round(game: PopuLoRAParallelEnv, seed: int) -> tuple[dict, dict]:
    """One round of the ParallelEnv itself, every agent acting through its policy."""
    policies = _policies(game)
    obs, infos = game.reset(seed=seed)
    for _ in range(2):
        actions = {a: policies[a].act(obs[a], infos[a]) for a in game.agents if obs[a]["prompts"]}
        obs, rewards, _te, _tr, infos = game.step(actions)
    return rewards, infos


@pytest.mark.parametrize("seat", ["teacher_1", "student_0"])
def test_a_round_through_one_seat_pays_what_the_parallel_env_pays(sandbox: Sandbox, seat: str) -> None:
    want_rewards, want_infos = _parallel_round(_game(sandbox), seed=3)
    game = _game(sandbox)
    policies = _policies(game)
    env = SingleSeatEnv(game, seat, {a: p for a, p in policies.items() if a != seat})
    obs, info = env.reset(seed=3)
    steps, terminated, reward = 0, False, None
    while not terminated:
        assert env.observation_space.contains(obs) and obs  # one prompt per step
        single = {"prompts": (obs,)}
        answer = policies[seat].act(single, {"requests": [info["request"]]})[0]
        if seat.startswith("student") and steps % 2 == 1:  # HalfRight's pattern, one prompt at a time
            answer = continue_prefix(info["request"]["prefix"], "```output\n'no'\n```")
        obs, reward, terminated, truncated, info = env.step(answer)
        assert not truncated
        steps += 1
    assert steps == len(want_infos[seat]["completion_rewards"]) > 0
    assert reward == want_rewards[seat]
    assert info["completion_rewards"] == want_infos[seat]["completion_rewards"]
    assert info["round"]["pairs"] == want_infos[seat]["round"]["pairs"]
    assert len(set(info["completion_rewards"])) > 1 or seat.startswith("teacher")  # the round pays both ways


def test_gymnasiums_env_checker_passes_without_a_warning(sandbox: Sandbox) -> None:
    game = _game(sandbox)
    env = SingleSeatEnv(game, "teacher_0", {"teacher_1": RandomPolicy(0), "student_0": OracleStudent(game),
                                            "student_1": OracleStudent(game)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    assert [str(w.message) for w in caught] == []


def test_a_seat_without_policies_for_the_others_is_refused_naming_them(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError, match="no policy for teacher_0, student_1"):
        SingleSeatEnv(_game(sandbox), "student_0", {"teacher_1": RandomPolicy(0)})
    with pytest.raises(ValueError, match="seat 'judge' is not an agent"):
        SingleSeatEnv(_game(sandbox), "judge", {})


def test_a_non_string_action_is_a_format_error_not_a_crash(sandbox: Sandbox) -> None:
    game = parallel_env(sandbox=sandbox, num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=1,
                        task_types=("deduction",))
    teacher = SeedTeacher(0)
    env = SingleSeatEnv(game, "student_0", {"teacher_0": lambda o, i: teacher.act(o, i)})  # any callable
    env.reset(seed=0)
    _obs, reward, terminated, _tr, info = env.step(12345)
    assert terminated and reward == -1.0 and info["completion_info"][0]["reason"] == "format"
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("late")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(st.one_of(st.text(max_size=300), st.none(), st.integers(), st.binary(max_size=20),
                                  st.just("<think>x</think><answer>\n```output\n41\n```\n</answer>")),
                        min_size=2, max_size=2))
def test_any_action_is_scored_never_raised(sandbox: Sandbox, actions: list) -> None:
    game = parallel_env(sandbox=sandbox, num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=2,
                        task_types=("deduction",))
    env = SingleSeatEnv(game, "student_0", {"teacher_0": SeedTeacher(0)})
    env.reset(seed=0)
    for k, action in enumerate(actions):
        _obs, reward, terminated, _tr, info = env.step(action)
        assert terminated == (k == 1)
    assert set(info["completion_rewards"]) <= {1.0, -0.5, -1.0} and reward == sum(info["completion_rewards"]) / 2


def test_the_gymnasium_bridge_imports_no_torch() -> None:
    code = ("import sys, populora_bridges, populora_bridges.metrics, populora_bridges.grpo.rounds\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
