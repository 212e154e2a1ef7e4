"""Host-side handling of model text is total: whatever a policy writes, ``env.step`` returns a verdict.

Property tests (``hypothesis``) drive ``env.step`` for every task type and both roles with generated hostile
completions (huge literals, deep nesting, odd unicode, NUL, long lines, partial tags, fragments of the expected
structure) and assert the documented outcome: no exception; a completion without the tag structure is a
``format`` verdict; a student's completion is correct only when well formatted; every reward is one of the
scheme's values. The host functions that parse, canonicalise, compare and print model text are driven directly
too. A seeded fuzz run of a few thousand random completions closes the file (a few tens of seconds).

Regressions of issue 20: a teacher program with an integer literal of thousands of hex digits made
``canonical_program`` raise (``ast.unparse``, Python's int-to-text limit); a student's abduction answer with one
made ``parse_call_args`` raise; ``literals.same_value`` raised on such values. Each killed a run, and again on
``--resume`` (the same seeded completion).
"""

from __future__ import annotations

import ast
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populora_env import OracleStudent, SeedTeacher, parallel_env
from populora_env.literals import (
    ArgsError,
    canonical_form,
    literal_equal,
    literal_value,
    parse_call_args,
    parse_expression,
    safe_unparse,
    same_value,
    type_signature,
    with_heap_padding,
)
from populora_env.parsing import (
    extract_answer,
    parse_induction_proposal,
    parse_input_answer,
    parse_output_answer,
    parse_program_answer,
    parse_program_proposal,
)
from populora_env.sandbox import Limits, Sandbox
from populora_env.tasks import TaskType
from populora_env.validation import Reason, canonical_program, check_program, task_key

HUGE_HEX = "0x" + "f" * 5000
HUGE_DEC = "9" * 5000
FRAGMENTS = [
    HUGE_HEX, HUGE_DEC, "-" + HUGE_HEX, "1e999", "-1e999", "1j", "[" * 300 + "]" * 300, "(" * 300, "{" * 200,
    "[[" * 60 + "1" + "]]" * 60, "x" * 20_000, "\x00", "\ud800", "\udfff", "\u202e", "\u200b", "\ufeff", "😀" * 50,
    "\r\n", "\t", "\\", "'", '"', '"""', "'''", "<think>", "</think>", "<answer>", "</answer>", "<message>",
    "</message>", "```", "```python\n", "```input\n", "```output\n", "```message\n", "```py\n", "def f(x):\n",
    "    return x\n", "    return " + HUGE_HEX + "\n", "lambda: 0", "f(", ")", ",", "=", "**", "*", "None", "True",
    "nan", "inf", "__populora_plain__", "__builtins__", "import os\n", "0" * 4400, "b'\\x00'", "{1: 2}", "set()",
]


def hostile_text() -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40))
    return st.lists(pieces, max_size=12).map("".join)


def wrapped(body: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Hostile text inside (or half inside) the tag structure, so it reaches the payload parsers."""
    return st.tuples(st.sampled_from(["", "```python\n", "```input\n", "```output\n"]), body,
                     st.sampled_from(["", "```", "```\n```input\n1\n```"]), st.booleans()).map(
        lambda t: f"<think>x</think><answer>{t[0]}{t[1]}{t[2]}" + ("</answer>" if t[3] else ""))


completions = st.one_of(hostile_text(), wrapped(hostile_text()))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=256)) as sb:
        yield sb


def _env(sandbox: Sandbox, **kw: Any) -> Any:
    # 1 teacher x 3 tasks covers deduction, abduction and induction every round; 2 samples per task
    defaults: dict[str, Any] = dict(num_teachers=1, num_students=1, tasks_per_teacher=3, samples_per_task=2,
                                    seed=0, sandbox=sandbox)
    defaults.update(kw)
    return parallel_env(**defaults)


REWARDS = {-1.0, -0.5, 0.0, 1.0}  # populora: format penalty, wrong, teacher outcomes, correct


def _check_outcome(out: Any, env: Any) -> None:
    obs, rewards, terms, truncs, infos = out
    for agent, reward in rewards.items():
        assert isinstance(reward, float) and math.isfinite(reward), (agent, reward)
    for student in env.students:
        for info in infos[student]["completion_info"]:
            assert not info["correct"] or info["format_ok"], info
            if not info["format_ok"]:
                assert info["reason"] == Reason.FORMAT.value, info
        for r in infos[student]["completion_rewards"]:
            assert math.isfinite(r)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(teacher=st.lists(completions, min_size=3, max_size=3))
def test_hostile_teacher_completions(sandbox: Sandbox, teacher: list[str]) -> None:
    env = _env(sandbox)
    obs, infos = env.reset()
    out = env.step({"teacher_0": tuple(teacher)})
    for proposal in out[4]["teacher_0"]["proposals"]:
        assert isinstance(proposal["valid"], bool)
        if not proposal["format_ok"]:
            assert proposal["reason"] == Reason.FORMAT.value and not proposal["valid"]
    done = env.step({"student_0": ("x",) * len(out[0]["student_0"]["prompts"])})
    _check_outcome(done, env)
    env.close()


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(student=st.lists(completions, min_size=6, max_size=6))
def test_hostile_student_completions(sandbox: Sandbox, student: list[str]) -> None:
    env = _env(sandbox)
    obs, infos = env.reset()
    mid = env.step({"teacher_0": SeedTeacher(seed=1).act(obs["teacher_0"], infos["teacher_0"])})
    kinds = {r["task_type"] for r in mid[4]["student_0"]["requests"]}
    assert kinds == {"deduction", "abduction", "induction"}  # every task type gets the hostile answers
    out = env.step({"student_0": tuple(student)})
    _check_outcome(out, env)
    env.close()


# --- the host functions, directly ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.one_of(hostile_text(), st.text()))
def test_host_functions_are_total(text: str) -> None:
    for prefix in ("", "<think>"):
        extract_answer(text, prefix=prefix)
        extract_answer(text, require_think=False, require_close=False)
    parse_output_answer(text), parse_input_answer(text), parse_program_answer(text)
    parse_program_proposal(text), parse_induction_proposal(text)
    try:
        args = parse_call_args(text)
        assert isinstance(args.canonical, str)
        type_signature(args.values, None)
    except ArgsError as exc:
        assert exc.kind in ("parse_error", "not_literal")
    expr = parse_expression(text)
    assert expr is None or isinstance(expr, str)
    ok, value = literal_value(text)
    if ok:
        try:
            canonical_form(value)
        except RecursionError:
            pass
    assert isinstance(literal_equal(text, text), bool)
    assert same_value(text, text) is True
    assert isinstance(same_value(text, "1"), bool)
    checked = check_program(text, 100_000)
    if checked.tree is not None:
        assert isinstance(canonical_program(checked.tree), str)
    assert isinstance(task_key(TaskType.INDUCTION, text, [text]), str)
    with_heap_padding(text)


def test_issue_20_regressions() -> None:
    program = f"def f(x):\n    return x + {HUGE_HEX}\n"
    checked = check_program(program, 100_000)
    assert checked.reason is None
    key = canonical_program(checked.tree)
    assert "__int_0x" in key and key != canonical_program(check_program(program.replace("f" * 5000, "e" * 5000),
                                                                       100_000).tree)
    with pytest.raises(ArgsError) as err:
        parse_call_args(HUGE_HEX)
    assert err.value.kind == "not_literal"
    with pytest.raises(ArgsError):
        parse_call_args(f"[1, {HUGE_HEX}], 2")
    assert same_value(HUGE_HEX, HUGE_HEX) and not same_value(HUGE_HEX, HUGE_HEX + "0")
    assert not same_value(f"{{{HUGE_HEX}, 1}}", f"{{1, {HUGE_HEX}0}}")  # sorting by repr used to raise
    assert literal_equal(HUGE_HEX, HUGE_HEX) and not literal_equal(HUGE_HEX, "1")
    assert safe_unparse(ast.parse(f"{HUGE_HEX}\n").body[0]).startswith("__int_0x")


def test_huge_literals_through_env_step(sandbox: Sandbox) -> None:
    """The issue's completions, through the env: a teacher program with a huge hex literal is validated (or
    rejected) and an abduction answer with one is a wrong answer, and the round ends normally."""
    env = _env(sandbox)
    obs, infos = env.reset()
    teacher = SeedTeacher(seed=3).act(obs["teacher_0"], infos["teacher_0"])
    huge = (f"<think>x</think><answer>\n```python\ndef f(x):\n    return x * 2 + ({HUGE_HEX} > 0)\n```\n"
            f"```input\n3\n```\n</answer>")
    requests = infos["teacher_0"]["requests"]
    teacher = tuple(huge if r["task_type"] != "induction" else t for r, t in zip(requests, teacher, strict=True))
    out = env.step({"teacher_0": teacher})
    proposals = out[4]["teacher_0"]["proposals"]
    assert any(p["valid"] for p in proposals)
    oracle = OracleStudent(env)
    answers = []
    for r in out[4]["student_0"]["requests"]:
        task = env.current_tasks[r["task_id"]]
        if task.task_type.value == "abduction":
            answers.append(f"<think>x</think><answer>\n```input\n{HUGE_HEX}\n```\n</answer>")
        elif task.task_type.value == "deduction":
            answers.append(f"<think>x</think><answer>\n```output\n{HUGE_HEX}\n```\n</answer>")
        else:
            answers.append(oracle.answer(task))
    done = env.step({"student_0": tuple(answers)})
    _check_outcome(done, env)
    for info in done[4]["student_0"]["completion_info"]:
        if info["task_type"] in ("abduction", "deduction"):  # a literal the host cannot print: not a literal
            assert (info["correct"], info["format_ok"], info["reason"]) == (False, True, "not_literal"), info
    env.close()


def test_seeded_fuzz_of_random_completions(sandbox: Sandbox) -> None:
    """A few thousand random completions (a fixed seed: the same ones on every machine), teachers and
    students, through ``env.step``: no exception, only documented verdicts."""
    rng = random.Random(20)
    alphabet = FRAGMENTS + ["a", "1", " ", "\n", "(", "[", "'", ":", "return", "f(x)"]

    def sample() -> str:
        body = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 10)))
        shape = rng.randrange(4)
        if shape == 0:
            return body
        block = rng.choice(["```python\n", "```input\n", "```output\n", "```message\n", ""])
        close = rng.choice(["```", ""]) + rng.choice(["</answer>", ""])
        return f"<think>{rng.choice(alphabet)}</think><answer>{block}{body}{close}"

    env = _env(sandbox, num_teachers=4, num_students=2, tasks_per_teacher=6, samples_per_task=4)
    seen = 0
    for round_ in range(40):
        obs, infos = env.reset()
        teachers = {}
        for i, t in enumerate(env.teachers):
            if round_ % 2 and i == 0:  # keep valid tasks flowing to the students
                teachers[t] = SeedTeacher(seed=round_).act(obs[t], infos[t])
            else:
                teachers[t] = tuple(sample() for _ in obs[t]["prompts"])
            seen += len(obs[t]["prompts"])
        out = env.step(teachers)
        students = {s: tuple(sample() for _ in out[0][s]["prompts"]) for s in env.students}
        seen += sum(len(v) for v in students.values())
        _check_outcome(env.step(students), env)
    env.close()
    assert seen >= 2000
