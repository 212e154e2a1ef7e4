"""AZR-compatible switches of the env: how an unparseable student answer is classified (and so rewarded)."""

from __future__ import annotations

from typing import Any

import pytest

from populora_env.checking import AnswerChecker, CheckConfig
from populora_env.config import ConfigError, EnvConfig
from populora_env.policies import SeedTeacher, continue_prefix
from populora_env.tasks import Task, TaskType
from populora_env.validation import Reason

from .helpers import think

PROGRAM = "def f(a, b):\n    return [x * b for x in a]\n"
DEDUCTION = Task("d", TaskType.DEDUCTION, PROGRAM, ("[1, 2], 3",), ("[3, 6]",))
ABDUCTION = Task("a", TaskType.ABDUCTION, PROGRAM, ("[1, 2], 3",), ("[3, 6]",))
INDUCTION = Task("i", TaskType.INDUCTION, "def f(x):\n    return x * 2\n", ("1", "2", "3", "4"), ("2", "4", "6", "8"))

# well-tagged answers whose payload does not parse, one per task type
UNPARSEABLE = [
    (DEDUCTION, think("the output is [3, 6]")),
    (ABDUCTION, think("```input\n1, 2)\n```")),
    (INDUCTION, think("```python\ndef f(x) return x\n```")),
]


@pytest.mark.parametrize(("task", "answer"), UNPARSEABLE, ids=["deduction", "abduction", "induction"])
def test_unparseable_answer_is_a_format_error_by_default_and_wrong_under_azr(sandbox: Any, task: Task,
                                                                              answer: str) -> None:
    strict = AnswerChecker(CheckConfig()).check([task], [answer], sandbox)[0]
    assert (strict.format_ok, strict.correct, strict.reason) == (False, False, Reason.FORMAT)
    azr = AnswerChecker(CheckConfig(unparseable_is_format_error=False)).check([task], [answer], sandbox)[0]
    assert (azr.format_ok, azr.correct, azr.reason) == (True, False, Reason.PARSE_ERROR)


@pytest.mark.parametrize("answer", ["no tags at all", think("no fenced block")])
def test_missing_structure_stays_a_format_error_under_azr(sandbox: Any, answer: str) -> None:
    """AZR's format check needs the tags, and its induction check a fenced block: both stay −1."""
    checker = AnswerChecker(CheckConfig(unparseable_is_format_error=False))
    out = checker.check([INDUCTION], [answer], sandbox)[0]
    assert not out.format_ok and out.reason is Reason.FORMAT


def test_parseable_answers_do_not_depend_on_the_switch(sandbox: Any) -> None:
    answers = [think("```output\n[3, 6]\n```"), think("```output\n[3, 7]\n```"), think("```output\n[3] + [6]\n```")]
    strict = AnswerChecker(CheckConfig()).check([DEDUCTION] * 3, answers, sandbox)
    azr = AnswerChecker(CheckConfig(unparseable_is_format_error=False)).check([DEDUCTION] * 3, answers, sandbox)
    assert strict == azr
    assert [o.reason for o in azr] == [None, Reason.WRONG, Reason.NOT_LITERAL]


class _Garbler:
    """Answers every task with a well-tagged but unparseable output block."""

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> tuple[str, ...]:
        requests = list(info.get("requests", []))[: len(observation["prompts"])]
        return tuple(continue_prefix(str(r.get("prefix", "")), "```output\n[1, 2\n```") for r in requests)


@pytest.mark.parametrize(("switch", "reward", "reason", "format_ok"),
                         [("format", -1.0, "format", False), ("wrong", -0.5, "parse_error", True)])
def test_env_rewards_follow_the_switch(make_env: Any, switch: str, reward: float, reason: str,
                                       format_ok: bool) -> None:
    """Through the env and the built-in schemes: −1 by default, AZR's −0.5 with unparseable_answer='wrong'."""
    for scheme in ("populora", "azr"):
        env = make_env(task_types=("deduction",), unparseable_answer=switch, reward_scheme=scheme,
                       require_think=True)
        obs, infos = env.reset()
        teacher = SeedTeacher(seed=1)
        obs, _, _, _, infos = env.step({a: teacher.act(obs[a], infos[a]) for a in env.teachers})
        garbler = _Garbler()
        env.step({a: garbler.act(obs[a], infos[a]) for a in env.students})
        attempts = env.last_outcome.results.attempts
        assert attempts, "the seed teacher's tasks reach the students"
        assert {(a.format_ok, a.reason) for a in attempts} == {(format_ok, reason)}
        assert {r for s in env.students for r in env.last_outcome.rewards[s]} == {reward}
        summary = env.last_outcome.summary["attempts"]
        assert summary["format_errors"] == (0 if format_ok else len(attempts))


def test_unparseable_answer_is_validated() -> None:
    with pytest.raises(ConfigError, match="unparseable_answer"):
        EnvConfig(unparseable_answer="lenient").validate()
    EnvConfig(unparseable_answer="wrong").validate()
