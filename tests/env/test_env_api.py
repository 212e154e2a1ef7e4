"""PettingZoo conformance, the obs/action/infos contract, argument validation and robustness to bad actions."""

from __future__ import annotations

import dataclasses
import re
import string
import warnings
from typing import Any

import numpy as np
import pettingzoo
import pytest
from gymnasium.spaces import Dict, Discrete, Sequence, Text
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test
from pettingzoo.utils.conversions import parallel_to_aec

from populora_env import ENV_ID, OracleStudent, PopuLoRAParallelEnv, RandomPolicy, SeedTeacher, parallel_env
from populora_env import env as aec_env
from populora_env.env import PHASES
from populora_env.policies import continue_prefix
from populora_env.sandbox import Sandbox

from .helpers import play_round


def test_parallel_api_test_with_zero_warnings(make_env: Any) -> None:
    env = make_env(num_teachers=3, num_students=2, tasks_per_teacher=2, samples_per_task=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_api_test(env, num_cycles=50)


#: What PettingZoo's AEC api_test says about any text env (its spaces are not Box/Discrete, its observations
#: not arrays); every other warning fails the test.
TEXT_ENV_WARNINGS = {
    "Observation is not a NumPy array",
    "Observation space for each agent probably should be gymnasium.spaces.box or gymnasium.spaces.discrete",
    "Action space for each agent probably should be gymnasium.spaces.box or gymnasium.spaces.discrete",
}


def test_aec_api_test_through_parallel_to_aec(sandbox: Any) -> None:
    env = parallel_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2, seed=0, sandbox=sandbox)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api_test(parallel_to_aec(env), num_cycles=10)
    assert {str(w.message) for w in caught} <= TEXT_ENV_WARNINGS
    env.close()


def test_parallel_seed_test(sandbox: Any) -> None:
    parallel_seed_test(lambda: parallel_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2,
                                            seed=0, sandbox=sandbox))


def test_aec_seed_test(sandbox: Any) -> None:
    seed_test(lambda: aec_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2, seed=0,
                              sandbox=sandbox), num_cycles=10)


def test_aec_conversion_plays_a_round(make_env: Any, sandbox: Any) -> None:
    aec = aec_env(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=1, seed=0, sandbox=sandbox)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aec.reset(seed=0)
        turns = []
        for agent in aec.agent_iter(max_iter=20):
            _obs, _reward, terminated, truncated, _info = aec.last()
            turns.append((agent, terminated, truncated))
            aec.step(None if terminated or truncated else aec.action_space(agent).sample())
    # two phases x two agents, then each agent's terminal turn (PettingZoo's conversion), and nothing more
    assert turns == [("teacher_0", False, False), ("student_0", False, False), ("teacher_0", False, False),
                     ("student_0", False, False), ("student_0", True, False), ("teacher_0", True, False)]


def test_registered_with_pettingzoo(sandbox: Any) -> None:
    env = pettingzoo.make("parallel", ENV_ID, num_teachers=1, num_students=1, sandbox=sandbox)
    assert isinstance(env.unwrapped, PopuLoRAParallelEnv)
    env.close()


def test_spaces_are_memoised_text_spaces(make_env: Any) -> None:
    env = make_env()
    for agent in env.possible_agents:
        assert env.observation_space(agent) is env.observation_space(agent)
        assert env.action_space(agent) is env.action_space(agent)
        obs_space = env.observation_space(agent)
        assert isinstance(obs_space, Dict) and set(obs_space) == {"prompts", "phase"}
        assert isinstance(obs_space["prompts"], Sequence) and isinstance(obs_space["prompts"].feature_space, Text)
        assert obs_space["phase"] == Discrete(len(PHASES))
        text = env.action_space(agent).feature_space
        assert text.min_length == 0 and set(text.character_set) == set(string.printable)


def test_every_observation_is_in_its_space_with_its_dtypes(make_env: Any) -> None:
    """The prompts are a tuple of str, the phase an np.int64 naming info["phase"], in every phase of a round
    (PettingZoo's harness checks the dtype of a Dict observation's "observation" key only: this checks ours)."""
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2)
    teachers = {a: SeedTeacher(seed=i) for i, a in enumerate(env.teachers)}
    students = {a: OracleStudent(env) for a in env.students}
    out = play_round(env, teachers, students)
    rounds = [(out["reset"]["obs"], out["reset"]["infos"]), (out["step1"][0], out["step1"][4]),
              (out["step2"][0], out["step2"][4])]
    for (obs, infos), phase in zip(rounds, PHASES, strict=True):
        assert set(obs) == set(env.possible_agents)
        for agent, o in obs.items():
            space = env.observation_space(agent)
            assert space.contains(o), (phase, agent)
            assert isinstance(o["prompts"], tuple) and all(type(p) is str for p in o["prompts"])
            assert isinstance(o["phase"], np.int64) and o["phase"].dtype == space["phase"].dtype
            assert PHASES[o["phase"]] == phase == infos[agent]["phase"]
            assert len(o["prompts"]) == len(infos[agent]["requests"]) and bool(o["prompts"]) == infos[agent]["active"]


def test_a_valid_task_with_non_ascii_text_gives_an_observation_in_the_space(make_env: Any) -> None:
    """A valid program may quote any Unicode; the student's prompt then holds it, and the space contains it."""
    env = make_env(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=1,
                   task_types=("deduction",), require_think=False)
    _, infos = env.reset()
    proposal = '```python\ndef f(a):\n    return a + "é→✓"\n```\n```input\n"x"\n```'
    obs, _, _, _, infos = env.step({"teacher_0": (continue_prefix(infos["teacher_0"]["requests"][0]["prefix"],
                                                                   proposal),)})
    assert infos["teacher_0"]["proposals"][0]["valid"]
    assert any("é→✓" in p for p in obs["student_0"]["prompts"])
    assert env.observation_space("student_0").contains(obs["student_0"])
    assert not env.observation_space("student_0")["prompts"].feature_space.contains(7)


def test_contract_of_a_round(make_env: Any) -> None:
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=2)
    teachers = {a: SeedTeacher(seed=i) for i, a in enumerate(env.teachers)}
    students = {a: OracleStudent(env) for a in env.students}
    out = play_round(env, teachers, students)

    obs, infos = out["reset"]["obs"], out["reset"]["infos"]
    assert set(obs) == set(infos) == set(env.possible_agents)
    for agent in env.possible_agents:
        info = infos[agent]
        assert info["phase"] == "propose" and len(info["requests"]) == len(obs[agent]["prompts"])
        assert env.observation_space(agent).contains(obs[agent])
    types = [t.value for t in env.task_types]
    for i, teacher in enumerate(env.teachers):
        assert infos[teacher]["active"] and len(obs[teacher]["prompts"]) == 3
        # task types in turn over task_types, starting at (round + teacher index)
        assert [r["task_type"] for r in infos[teacher]["requests"]] == [types[(i + k) % len(types)] for k in range(3)]
        groups = [r["group"] for r in infos[teacher]["requests"]]
        assert len(set(groups)) == len(groups)
    for student in env.students:
        assert obs[student]["prompts"] == () and not infos[student]["active"]

    obs1, rew1, term1, trunc1, infos1 = out["step1"]
    assert rew1 == dict.fromkeys(env.possible_agents, 0.0)
    assert not any(term1.values()) and not any(trunc1.values())
    for teacher in env.teachers:
        assert obs1[teacher]["prompts"] == () and infos1[teacher]["phase"] == "solve" and not infos1[teacher]["active"]
        assert [p["valid"] for p in infos1[teacher]["proposals"]] == [True] * 3
    # PFSP pairs every teacher with one student; a student gets its matched teachers' valid tasks x 2 samples
    matched = {s: infos1[s]["matched_teachers"] for s in env.students}
    assert sorted(t for ts in matched.values() for t in ts) == sorted(env.teachers)
    assert {t: infos1[t]["matched_student"] for t in env.teachers} == {t: s for s, ts in matched.items() for t in ts}
    for student in env.students:
        reqs = infos1[student]["requests"]
        assert [r["task_id"] for r in reqs] == [f"r0-{t}-{k}" for t in matched[student] for k in range(3) for _ in "ab"]
        assert len(reqs) == len(obs1[student]["prompts"]) and infos1[student]["active"] == bool(reqs)
        assert env.observation_space(student).contains(obs1[student])
        for k in range(0, len(reqs), 2):  # samples of one task are consecutive and share prompt and group
            assert obs1[student]["prompts"][k] == obs1[student]["prompts"][k + 1]
            assert reqs[k]["group"] == reqs[k + 1]["group"] and reqs[k]["task_id"] == reqs[k + 1]["task_id"]
        assert len({r["group"] for r in reqs}) == len(reqs) // 2

    obs2, rew2, term2, trunc2, infos2 = out["step2"]
    assert all(term2.values()) and not any(trunc2.values()) and env.agents == []
    assert set(obs2) == set(rew2) == set(infos2) == set(env.possible_agents)
    for agent in env.possible_agents:
        info = infos2[agent]
        assert info["phase"] == "done"
        n = len((out["reset"]["obs"] if agent in env.teachers else obs1)[agent]["prompts"])
        assert len(info["completion_rewards"]) == len(info["completion_info"]) == n
        assert rew2[agent] == pytest.approx(sum(info["completion_rewards"]) / n)
        assert info["round"] is infos2["teacher_0"]["round"]
    summary = infos2["teacher_0"]["round"]
    assert {p["teacher"] for p in summary["pairs"]} == set(env.teachers)
    assert all({"p_ts", "p_hat", "outcome"} <= set(p) for p in summary["pairs"])
    assert set(summary["ratings"]) == set(env.possible_agents)
    assert {"ast_depth_mean", "cyclomatic_mean", "loc_mean", "variables_mean", "coverage_programs",
            "coverage_signatures"} <= set(summary["metrics"])

    with pytest.raises(RuntimeError):
        env.step({})


def test_step_before_reset_raises(make_env: Any) -> None:
    with pytest.raises(RuntimeError):
        make_env().step({})


@pytest.mark.parametrize(
    "actions",
    [
        {},
        None,
        "not a dict",
        {"teacher_0": None, "teacher_1": 5},
        {"teacher_0": "one bare string", "teacher_1": [None, b"bytes", 3.0, ["nested"]]},
        {"teacher_0": ("",) * 100, "student_0": ("x",), "ghost": ("y",)},
    ],
)
def test_bad_actions_become_format_errors(make_env: Any, actions: Any) -> None:
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2)
    env.reset()
    _, _, _, _, infos = env.step(actions)
    for teacher in env.teachers:
        assert [p["reason"] for p in infos[teacher]["proposals"]] == ["format", "format"]
    _, rewards, _, _, infos = env.step(actions)
    assert all(v == -1.0 for a in env.possible_agents for v in infos[a]["completion_rewards"])
    assert all(r == -1.0 for r in rewards.values())


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_teachers": 0}, "num_teachers"),
        ({"num_students": "4"}, "num_students"),
        ({"tasks_per_teacher": 0}, "tasks_per_teacher"),
        ({"samples_per_task": 1.5}, "samples_per_task"),
        ({"task_types": ()}, "task_types"),
        ({"task_types": "deduction"}, "task_types"),
        ({"task_types": ("deduction", "sorting")}, "task_types"),
        ({"task_types": ("deduction", "deduction")}, "task_types"),
        ({"reward_scheme": "nope"}, "reward_scheme"),
        ({"reward_scheme": 3}, "reward_scheme"),
        ({"reward_kwargs": [1]}, "reward_kwargs"),
        ({"references_k": -1}, "references_k"),
        ({"induction_inputs": 1}, "induction_inputs"),
        ({"buffer_cap": 0}, "buffer_cap"),
        ({"student_fill": 1}, "student_fill"),
        ({"require_think": "yes"}, "require_think"),
        ({"max_output_chars": 0}, "max_output_chars"),
        ({"render_mode": "human"}, "render_mode"),
        ({"seed": -1}, "seed"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"memory_mb": 1}, "memory_mb"),
        ({"limits": {"timeout_s": -1}}, "limits"),
        ({"limits": 5}, "limits"),
        ({"sandbox": object()}, "sandbox"),
        ({"trueskill": {"bogus": 1}}, "trueskill"),
        ({"prompts": "text"}, "prompts"),
        # nested and bounded values, checked before any work
        ({"trueskill": {"mu": "x"}}, "trueskill.mu"),
        ({"trueskill": {"sigma": 0.0}}, "trueskill.sigma"),
        ({"trueskill": {"beta": float("nan")}}, "trueskill.beta"),
        ({"trueskill": {"draw_probability": 1.0}}, "trueskill.draw_probability"),
        ({"reward_kwargs": {"no_such_key": 1}}, "reward_kwargs"),
        ({"reward_scheme": "azr", "reward_kwargs": {"invalid": -1}}, "reward_kwargs"),
        ({"timeout_s": 1e308}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"memory_mb": 10**9}, "memory_mb"),
        ({"num_students": 10**6}, "num_students"),
        ({"num_teachers": 1000, "num_students": 1000}, "num_students"),
        ({"samples_per_task": 10**6}, "samples_per_task"),
        ({"sandbox_workers": 10**5}, "sandbox_workers"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name)):
        parallel_env(**kwargs)


def test_reward_kwargs_matching_the_scheme_are_accepted() -> None:
    env = parallel_env(num_teachers=1, num_students=1, reward_scheme="azr", reward_kwargs={"extreme_reward": -0.5})
    assert env.config.reward_kwargs == {"extreme_reward": -0.5}


def test_env_is_built_from_its_config_alone() -> None:
    from populora_env.config import EnvConfig

    cfg = EnvConfig(num_teachers=2, num_students=3, samples_per_task=5, induction_inputs=10, reject_duplicates=False)
    env = parallel_env(cfg)
    assert env.config == cfg
    assert env.possible_agents == ["teacher_0", "teacher_1", "student_0", "student_1", "student_2"]
    # the env reads its config where it needs a setting: no field is mirrored onto the env (``prompts`` is the
    # resolved PromptTemplates of the ``prompts`` name, not a copy of it)
    assert set(vars(env)) & {f.name for f in dataclasses.fields(EnvConfig)} == {"prompts"}
    assert not isinstance(env.prompts, str)
    # keyword overrides apply on top of a config without changing it
    env2 = parallel_env(cfg, samples_per_task=2)
    assert env2.config.samples_per_task == 2 and cfg.samples_per_task == 5


def test_render_ansi(make_env: Any) -> None:
    env = make_env(render_mode="ansi")
    env.reset()
    env.step({})
    text = env.render()
    assert isinstance(text, str) and "round 0" in text and "teacher_0" in text
    assert make_env().render() is None


def test_own_sandbox_is_started_lazily_and_closed() -> None:
    env = parallel_env(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=1, seed=0)
    random_policy = RandomPolicy(seed=0)
    obs, infos = env.reset()
    env.step({a: random_policy.act(obs[a]) for a in env.agents})
    assert env._own_sandbox is None  # garbage needs no execution
    obs, infos = env.reset()
    env.step({"teacher_0": SeedTeacher(seed=0).act(obs["teacher_0"], infos["teacher_0"])})
    own = env._own_sandbox
    assert isinstance(own, Sandbox) and own.run_one("def f(x):\n    return x", call="f(2)").value == "2"
    env.close()
    assert env._own_sandbox is None


def test_shared_sandbox_is_not_closed(sandbox: Any) -> None:
    env = parallel_env(num_teachers=1, num_students=1, sandbox=sandbox)
    env.close()
    assert sandbox.run_one("def f(x):\n    return x", call="f(2)").value == "2"
