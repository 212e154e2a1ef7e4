"""Game-level reward semantics with scripted policies, and a long random-policy soak."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import pytest

from populora_env import OracleStudent, RandomPolicy, SeedTeacher
from populora_env.policies import format_answer

from .helpers import play_round


class PartialStudent:
    """Answers sample ``j`` of a task correctly iff ``j < k(task)``, with ``k`` a fixed function of the task id;
    wrong answers are well formatted. Its intended solve rate per task is ``k / samples``."""

    def __init__(self, env: Any, samples: int) -> None:
        self.env, self.samples, self.oracle = env, samples, OracleStudent(env)

    def n_correct(self, task_id: str) -> int:
        return zlib.crc32(task_id.encode()) % (self.samples + 1)

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        out = []
        for request in info["requests"]:
            task = self.env.current_tasks[request["task_id"]]
            if request["sample"] < self.n_correct(request["task_id"]):
                out.append(self.oracle.answer(task))
            elif task.task_type.value == "induction":
                out.append(format_answer("```python\ndef f(*args):\n    return 'no idea'\n```"))
            elif task.task_type.value == "abduction":
                out.append(format_answer("```input\n'surely wrong', -1, -2, -3\n```"))
            else:
                out.append(format_answer("```output\n'surely wrong'\n```"))
        return tuple(out)


def teachers_of(env: Any) -> dict[str, SeedTeacher]:
    return {a: SeedTeacher(seed=10 + i) for i, a in enumerate(env.teachers)}


def test_seed_teachers_with_oracle_students(make_env: Any) -> None:
    env = make_env(num_teachers=3, num_students=2, tasks_per_teacher=3, samples_per_task=2)
    teachers, students = teachers_of(env), {a: OracleStudent(env) for a in env.students}
    for _ in range(3):
        out = play_round(env, teachers, students)
        _, rewards, _, _, infos = out["step2"]
        for teacher in env.teachers:
            assert [c["valid"] for c in infos[teacher]["completion_info"]] == [True] * 3
            assert infos[teacher]["completion_rewards"] == [0.0] * 3 and rewards[teacher] == 0.0
        for student in env.students:
            assert infos[student]["completion_rewards"] == [1.0] * len(out["step1"][0][student]["prompts"])
            assert rewards[student] == 1.0
        for pair in infos["teacher_0"]["round"]["pairs"]:
            assert pair["p_hat"] == 1.0 and pair["outcome"] == "student"
    assert all(env.ratings.mu(s) > 25.0 for s in env.students)
    assert all(env.ratings.mu(t) < 25.0 for t in env.teachers)


def test_seed_teachers_with_random_students(make_env: Any) -> None:
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=3)
    students = {a: RandomPolicy(seed=i) for i, a in enumerate(env.students)}
    out = play_round(env, teachers_of(env), students)
    _, rewards, _, _, infos = out["step2"]
    for teacher in env.teachers:
        assert infos[teacher]["completion_rewards"] == [0.0] * 3
    for student in env.students:
        assert set(infos[student]["completion_rewards"]) == {-1.0} and rewards[student] == -1.0
    assert all(p["p_hat"] == 0.0 for p in infos["teacher_0"]["round"]["pairs"])


@pytest.mark.parametrize("scheme", ["populora", "azr", "azr_code"])
def test_teacher_rewards_follow_the_solve_rate(make_env: Any, scheme: str) -> None:
    samples = 4
    kwargs: dict[str, Any] = {"reward_scheme": "azr" if scheme.startswith("azr") else "populora"}
    if scheme == "azr_code":
        kwargs["reward_kwargs"] = {"extreme_reward": -0.5}
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=samples, **kwargs)
    teachers = teachers_of(env)
    partial = {a: PartialStudent(env, samples) for a in env.students}
    seen_rates: set[float] = set()
    for _ in range(4):
        out = play_round(env, teachers, partial)
        _, _, _, _, infos = out["step2"]
        for teacher in env.teachers:
            for info, reward in zip(infos[teacher]["completion_info"], infos[teacher]["completion_rewards"],
                                    strict=True):
                assert info["valid"]
                p_hat = partial["student_0"].n_correct(info["task_id"]) / samples  # the policy's own plan
                assert info["p_hat"] == p_hat
                seen_rates.add(p_hat)
                if scheme == "populora":
                    expected = 0.0 if p_hat == 0 else 1.0 - p_hat
                else:
                    extreme = -0.5 if scheme == "azr_code" else 0.0
                    expected = 1.0 - p_hat if 0 < p_hat < 1 else extreme
                assert reward == pytest.approx(expected)
        for student in env.students:
            for info, reward in zip(infos[student]["completion_info"], infos[student]["completion_rewards"],
                                    strict=True):
                assert info["format_ok"]
                assert reward == (1.0 if info["correct"] else -0.5)
    assert len(seen_rates & {0.25, 0.5, 0.75}) >= 2 and seen_rates & {0.0, 1.0}  # the mix really was mixed


def test_pairs_report_solve_rate_over_the_teachers_valid_tasks(make_env: Any) -> None:
    samples = 4
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=samples)
    partial = {a: PartialStudent(env, samples) for a in env.students}
    out = play_round(env, teachers_of(env), partial)
    infos = out["step2"][4]
    for pair in infos["teacher_0"]["round"]["pairs"]:
        tasks = [c["task_id"] for c in infos[pair["teacher"]]["completion_info"] if c["valid"]]
        expected = sum(partial["student_0"].n_correct(t) for t in tasks) / (samples * len(tasks))
        assert pair["p_hat"] == pytest.approx(expected)
        want = "student" if expected > pair["p_ts"] else "teacher" if expected < pair["p_ts"] else "draw"
        assert pair["outcome"] == want


def test_student_fill_tops_up_idle_students(make_env: Any) -> None:
    env = make_env(num_teachers=1, num_students=3, tasks_per_teacher=2, samples_per_task=2)
    obs, _ = env.reset()
    obs, _, _, _, infos = env.step({})  # every proposal is a format error
    for student in env.students:
        reqs = infos[student]["requests"]
        assert len(reqs) == 4 and {r["source"] for r in reqs} == {"fill"} and {r["teacher"] for r in reqs} == {None}
    no_fill = make_env(num_teachers=1, num_students=3, tasks_per_teacher=2, samples_per_task=2, student_fill=False)
    no_fill.reset()
    obs, _, _, _, infos = no_fill.step({})
    assert all(obs[s]["prompts"] == () and not infos[s]["active"] for s in no_fill.students)
    _, rewards, _, _, infos = no_fill.step({})
    assert rewards["student_0"] == 0.0 and infos["student_0"]["completion_rewards"] == []
    assert infos["teacher_0"]["round"]["pairs"][0]["p_hat"] is None
    assert infos["teacher_0"]["round"]["pairs"][0]["outcome"] == "student"


def test_valid_proposals_enter_the_buffers_and_references(make_env: Any) -> None:
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=1)
    before = dict(env.buffers.sizes())
    out = play_round(env, teachers_of(env), {a: OracleStudent(env) for a in env.students})
    after = out["step2"][4]["teacher_0"]["round"]["buffer_sizes"]
    assert sum(after.values()) == sum(before.values()) + 6
    for teacher in env.teachers:
        for info in out["step1"][4][teacher]["proposals"]:
            task = env.buffers.find(info["task_id"])
            assert task is not None, info["task_id"]
            assert (task.task_type.value, task.teacher, task.round) == (info["task_type"], teacher, 0)


def test_one_thousand_random_rounds(make_env: Any) -> None:
    # no shared sandbox: the env would start its own on the first program it must run
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2, sandbox=None)
    policies = {a: RandomPolicy(seed=i, max_length=400) for i, a in enumerate(env.possible_agents)}
    for _ in range(1000):
        out = play_round(env, policies, policies)
        _, rewards, terminations, _, infos = out["step2"]
        assert all(terminations.values())
        for agent in env.possible_agents:
            assert infos[agent]["completion_rewards"] and set(infos[agent]["completion_rewards"]) == {-1.0}
            assert rewards[agent] == -1.0
    # what keeps 1000 rounds fast, checked as an event rather than a wall-clock bound: garbage never reaches the
    # sandbox (format errors are decided by parsing alone)
    assert env._own_sandbox is None


class StructuredGarbage:
    """Well-tagged completions with random Python-ish fragments inside the blocks: reaches parsing,
    the safety policy and sometimes the sandbox."""

    FRAGMENTS = ["def f(x):\n    return ", "x", "(", ")", "[", "]", "{", "}", ":", ",", " + ", " * ", "1", "'a'",
                 "\n    ", "import os\n", "lambda y: y", "for i in x:", "while True:", "yield", "None", "f(x)",
                 "class A:", "__import__", "**", "-", ".real", "if x else", "0.5", "b'\\x00'", "\\", "```", "'''"]

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def junk(self) -> str:
        n = int(self.rng.integers(0, 25))
        return "".join(self.FRAGMENTS[int(i)] for i in self.rng.integers(0, len(self.FRAGMENTS), size=n))

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        out = []
        for _ in observation["prompts"]:
            blocks = [f"```{tag}\n{self.junk()}\n```" for tag in
                      self.rng.choice(["python", "input", "output", "message", ""], size=int(self.rng.integers(0, 8)))]
            out.append(format_answer("\n".join(blocks)))
        return tuple(out)


def test_structured_garbage_never_raises(make_env: Any) -> None:
    env = make_env(num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=2, timeout_s=0.5)
    policies = {a: StructuredGarbage(seed=i) for i, a in enumerate(env.possible_agents)}
    for _ in range(40):
        out = play_round(env, policies, policies)
        _, _, terminations, _, infos = out["step2"]
        assert all(terminations.values())
        for agent in env.possible_agents:
            assert all(r in (-1.0, -0.5, 0.0, 1.0) or 0.0 <= r <= 1.0 for r in infos[agent]["completion_rewards"])


class _Scripted:
    """Gives the same completion to every prompt."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(self.text for _ in info["requests"])


def test_a_program_random_on_other_inputs_has_its_task_voided(make_env: Any) -> None:
    """An abduction teacher whose ``f`` answers its own input (3) deterministically and every other input with a
    value that changes from process to process: validation passes (two runs of its input agree), but a
    student's pre-image gives two different values in its two runs, so the task is voided: its proposal counts as
    invalid (reason ``nondeterministic``, -1), it leaves the buffers, and its attempts are out of p-hat. It cannot
    set its own solve rate."""
    env = make_env(num_teachers=1, num_students=1, task_types=("abduction",), tasks_per_teacher=1,
                   samples_per_task=2, student_fill=False, reward_scheme="azr", validation="azr")
    program = "def f(x):\n    if x == 3:\n        return 9\n    return id(object()) % 10 ** 9\n"
    teacher = _Scripted(format_answer(f"```python\n{program}```\n```input\n3\n```"))
    student = _Scripted(format_answer("```input\n4\n```"))
    out = play_round(env, {"teacher_0": teacher}, {"student_0": student})
    _, rewards, _, _, infos = out["step2"]
    (proposal,) = env.last_outcome.results.proposals
    assert (proposal.valid, proposal.reason) == (False, "nondeterministic")
    assert env.last_outcome.rewards["teacher_0"] == (-1.0,)
    assert [a.reason for a in env.last_outcome.results.attempts] == ["nondeterministic"] * 2
    assert env.buffers.find(proposal.task_id) is None
    assert infos["teacher_0"]["round"]["pairs"][0]["p_hat"] is None  # no valid task of this teacher left
    assert infos["teacher_0"]["completion_info"][0]["valid"] is False
