"""Prompt sets: every registered set renders and parses for every task type and role; the response-prefix
placement rule; AZR's raw prompts; the literal-value rule; the optional leniency for a missing ``</answer>``."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from populora_env import OracleStudent, PromptTemplates, get_prompt_set, list_prompt_sets
from populora_env.config import ConfigError
from populora_env.policies import format_answer
from populora_env.prompts import LITERAL_RULE, PROMPT_KINDS, SHORT_LITERAL_RULE, prompt_kind, with_prefix
from populora_env.seeds import SEED_PROGRAMS, generate_args

SETS = list_prompt_sets()
_THOUGHTS = ("Let me work it out.", "")  # the oracle's thought, or none
#: seed programs whose text starts with ``def f(`` (a pre-filled ``def f(`` opening must fit them)
_PLAIN_SEEDS = [p for p in SEED_PROGRAMS if p.program.startswith("def f(")]


def _continue(prefix: str, *answers: str) -> str:
    """The completion after ``prefix`` that makes ``prefix + completion`` exactly a well-formatted answer, one of
    ``answers`` (equivalent layouts), with a thought or with an empty one when the prefix pre-fills
    ``<think></think>``; fails the test when the prefix opens none, i.e. when the set's prefix does not open a
    correct answer of its kind."""
    for answer in answers:
        for thought in _THOUGHTS:
            full = format_answer(answer, thought)
            if full.startswith(prefix):
                return full[len(prefix) :]
    raise AssertionError(f"prefix {prefix!r} does not open the answer {format_answer(answers[0], '')!r}")


def _block(tag: str, content: str) -> str:
    return f"```{tag}\n{content.rstrip()}\n```"


class _ExactTeacher:
    """Valid proposals continuing each request's prefix exactly (fresh inputs for seed programs)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> tuple[str, ...]:
        out = []
        for request in info["requests"]:
            if request["task_type"] == "induction":
                seed = next(p for p in SEED_PROGRAMS if p.program.strip() == request["program"].strip())
                inputs: list[str] = []
                while len(inputs) < request["n_inputs"]:
                    args = generate_args(seed.arg_kinds, self.rng)
                    if args not in inputs and args not in seed.inputs:
                        inputs.append(args)
                answer = "\n".join([_block("input", i) for i in inputs] + [_block("message", seed.message)])
                out.append(_continue(request["prefix"], answer))
            else:  # program and input, in either order (a prefix may open the input block first)
                seed = _PLAIN_SEEDS[int(self.rng.integers(len(_PLAIN_SEEDS)))]
                program, given = _block("python", seed.program), _block("input", generate_args(seed.arg_kinds, self.rng))
                out.append(_continue(request["prefix"], program + "\n" + given, given + "\n" + program))
        return tuple(out)


@pytest.mark.parametrize("name", SETS)
def test_every_prompt_set_renders_and_parses_for_every_kind(make_env: Any, name: str) -> None:
    """A correct completion of every kind, continuing the set's prefix, is well formatted, valid and correct."""
    env = make_env(prompts=name, num_teachers=3, num_students=2, tasks_per_teacher=3, samples_per_task=1)
    templates = get_prompt_set(name)
    obs, infos = env.reset(seed=1)
    kinds_seen = set()
    for teacher in env.teachers:
        assert env.observation_space(teacher).contains(obs[teacher])
        for prompt, request in zip(obs[teacher]["prompts"], infos[teacher]["requests"], strict=True):
            kind = prompt_kind("propose", request["task_type"])
            kinds_seen.add(kind)
            assert request["prefix"] == templates.prefix(kind)
            assert request["chat_template"] is templates.chat_template
            assert request["stop"] == list(templates.stop)
            if not templates.chat_template:
                assert prompt.endswith(request["prefix"])
    actions = {t: _ExactTeacher(i).act(obs[t], infos[t]) for i, t in enumerate(env.teachers)}
    obs1, _, _, _, infos1 = env.step(actions)
    for teacher in env.teachers:
        proposals = infos1[teacher]["proposals"]
        assert [(p["format_ok"], p["valid"]) for p in proposals] == [(True, True)] * 3, proposals

    oracle = OracleStudent(env)
    actions = {}
    for student in env.students:
        assert obs1[student]["prompts"] and env.observation_space(student).contains(obs1[student])
        completions = []
        for prompt, request in zip(obs1[student]["prompts"], infos1[student]["requests"], strict=True):
            kind = prompt_kind("solve", request["task_type"])
            kinds_seen.add(kind)
            assert request["prefix"] == templates.prefix(kind)
            if not templates.chat_template:
                assert prompt.endswith(request["prefix"])
            task = env.current_tasks[request["task_id"]]
            program = task.program
            if not program.startswith("def f("):  # helpers first: nest them all in an f (fits a `def f(` opening)
                program = "def f(*args):\n" + textwrap.indent(program, "    ") + "    return f(*args)\n"
            expected = {"deduction": _block("output", task.output), "abduction": _block("input", task.input),
                        "induction": _block("python", program)}[task.task_type.value]
            completion = _continue(request["prefix"], expected)
            if program == task.program:  # the scripted oracle continues the prefix the same way
                assert oracle.answer(task, request["prefix"]) == completion
            completions.append(completion)
        actions[student] = tuple(completions)
    _, _, _, _, infos2 = env.step(actions)
    attempts = [a for s in env.students for a in infos2[s]["completion_info"]]
    assert attempts and all(a["format_ok"] and a["correct"] for a in attempts), attempts
    assert kinds_seen == set(PROMPT_KINDS)


def test_azr_prompts_are_raw_r1_prompts_ending_with_think(make_env: Any) -> None:
    env = make_env(prompts="azr", num_teachers=3, num_students=2, tasks_per_teacher=3, samples_per_task=2)
    obs, infos = env.reset(seed=0)
    teachers = {t: _ExactTeacher(i) for i, t in enumerate(env.teachers)}
    emitted = [p for t in env.teachers for p in obs[t]["prompts"]]
    obs1, _, _, _, infos1 = env.step({t: teachers[t].act(obs[t], infos[t]) for t in env.teachers})
    emitted += [p for s in env.students for p in obs1[s]["prompts"]]
    assert len(emitted) > 9
    for prompt in emitted:
        assert prompt.startswith("A conversation between User and Assistant.")
        assert prompt.endswith("\nAssistant: <think>") and not prompt.endswith("<think><think>")
    for info in [infos[t] for t in env.teachers] + [infos1[s] for s in env.students]:
        assert all(r["prefix"] == "<think>" and r["chat_template"] is False for r in info["requests"])
    # AZR's sections: reference snippets, requirements, judging criteria, the banned words
    deduction = next(p for t in env.teachers for p, r in zip(obs[t]["prompts"], infos[t]["requests"], strict=True)
                     if r["task_type"] == "deduction")
    for section in ("### Requirements for the code", "### Requirements for the input", "### Format",
                    "### How your submission is judged", "### Reference code snippets", "<snippet_1>", "subprocess"):
        assert section in deduction


def test_chat_sets_leave_the_prefix_to_the_generator(make_env: Any) -> None:
    env = make_env(prompts="small")
    obs, infos = env.reset(seed=0)
    for teacher in env.teachers:
        for prompt, request in zip(obs[teacher]["prompts"], infos[teacher]["requests"], strict=True):
            assert request["chat_template"] is True and request["prefix"].startswith("<think></think>\n<answer>\n")
            assert not prompt.endswith(request["prefix"])  # the user turn; the prefix follows the assistant opening
    small = get_prompt_set("small")
    assert small.prefix("propose_deduction").endswith("```input\n")  # proposals give the input first
    assert small.prefix("solve_deduction").endswith("```output\n")


def test_every_set_tells_proposers_the_literal_rule(make_env: Any) -> None:
    rules = (LITERAL_RULE.format(), SHORT_LITERAL_RULE, SHORT_LITERAL_RULE.replace("what `f` returns", "the outputs"))
    for name in SETS:
        env = make_env(prompts=name, task_types=("deduction", "abduction", "induction"))
        obs, _ = env.reset(seed=0)
        for teacher in env.teachers:
            for prompt in obs[teacher]["prompts"]:
                assert any(rule in prompt for rule in rules), (name, prompt)
                assert "plain Python literals" in prompt and "`range(5)`" in prompt


def test_prefix_rule_and_r1_kept() -> None:
    assert with_prefix("User: x\nAssistant: <think>", "<think>") == "User: x\nAssistant: <think>"
    assert with_prefix("question", "<think>") == "question<think>"
    assert with_prefix("question", "") == "question"
    r1 = PromptTemplates.r1()
    assert r1.chat_template is False and r1.wrapper.endswith("Assistant: <think>")
    assert all(r1.prefix(k) == "<think>" for k in PROMPT_KINDS)
    assert get_prompt_set("r1") == r1
    chat = get_prompt_set("chat")
    assert chat.chat_template and all(chat.prefix(k) == "" for k in PROMPT_KINDS)
    assert all(get_prompt_set(n).stop == ("</answer>",) for n in SETS)
    with pytest.raises(ValueError, match="prompt kind"):
        chat.prefix("solve_everything")
    with pytest.raises(ValueError, match="role"):
        prompt_kind("judge", "deduction")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("chat_template", "yes", "chat_template"), ("stop", ["</answer>"], "stop"), ("stop", ("",), "stop"),
     ("prefix_solve_deduction", 3, "prefix_solve_deduction"), ("solve_deduction", "{nope}", "solve_deduction")],
)
def test_bad_prompt_sets_are_rejected(make_env: Any, field: str, value: Any, match: str) -> None:
    bad = replace(PromptTemplates(), **{field: value})
    with pytest.raises(ValueError, match=match):
        bad.validate()
    with pytest.raises(ConfigError, match=match):
        make_env(prompts=bad)


def test_missing_answer_close_is_accepted_only_when_lenient(make_env: Any) -> None:
    """The documented leniency (``lenient_answer_close``): ``…```\\n`` then EOS without ``</answer>``."""
    for lenient in (False, True):
        env = make_env(prompts="small", lenient_answer_close=lenient, num_teachers=1, num_students=1,
                       tasks_per_teacher=1, task_types=("deduction",), samples_per_task=1)
        obs, infos = env.reset(seed=0)
        (request,) = infos["teacher_0"]["requests"]
        full = _continue(request["prefix"], "```input\n41\n```\n```python\ndef f(x):\n    return x + 1\n```")
        unclosed = full[: full.rindex("</answer>")]
        obs1, _, _, _, infos1 = env.step({"teacher_0": (unclosed,)})
        (proposal,) = infos1["teacher_0"]["proposals"]
        assert (proposal["format_ok"], proposal["valid"]) == (lenient, lenient)
        (student_request, *_) = infos1["student_0"]["requests"]
        task = env.current_tasks[student_request["task_id"]]
        answer = _continue(student_request["prefix"], _block("output", task.output))
        answer = answer[: answer.rindex("</answer>")]
        _, _, _, _, infos2 = env.step({"student_0": (answer,) * len(obs1["student_0"]["prompts"])})
        (attempt, *_) = infos2["student_0"]["completion_info"]
        assert (attempt["format_ok"], attempt["correct"]) == (lenient, lenient)
    with pytest.raises(ConfigError, match="lenient_answer_close"):
        make_env(lenient_answer_close="yes")
