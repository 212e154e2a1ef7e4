"""The 'azr' validation profile (EnvConfig.validation = "azr"): AZR's rules, through the real sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from populora_env.seeds import SEED_PROGRAMS
from populora_env.tasks import Task, TaskType
from populora_env.validation import (
    ProposalOutcome,
    ProposalRequest,
    ProposalValidator,
    Reason,
    ValidationConfig,
    check_program_azr,
    forbidden_hint,
)

from .helpers import think


def proposal(program: str, given: str) -> str:
    return think(f"```python\n{program}\n```\n```input\n{given}\n```")


def run(sandbox: Any, completions: list[str], task_type: TaskType = TaskType.DEDUCTION, profile: str = "azr",
        **config: Any) -> list[ProposalOutcome]:
    source = None
    if task_type is TaskType.INDUCTION:
        seed = SEED_PROGRAMS[0]
        source = Task("seed-deduction-0", TaskType.DEDUCTION, seed.program, seed.inputs[:1], seed.outputs[:1])
    requests = [ProposalRequest("teacher_0", i, task_type, f"t-{i}", 0, source) for i in range(len(completions))]
    cfg = ValidationConfig(profile=profile, **config)
    return ProposalValidator(cfg).validate(requests, completions, sandbox)


def test_expression_inputs_are_evaluated_in_the_sandbox_and_kept_as_repr(sandbox: Any) -> None:
    (out,) = run(sandbox, [proposal("def f(xs, s):\n    return sum(xs), s", "list(range(4)), 'ab' * 2")])
    assert out.valid, out.detail
    assert out.task is not None and out.task.inputs == ("[0, 1, 2, 3], 'abab'",) and out.task.outputs == ("(6, 'abab')",)
    strict = run(sandbox, [proposal("def f(xs, s):\n    return sum(xs), s", "list(range(4)), 'ab' * 2")],
                 profile="strict")[0]
    assert not strict.valid and strict.reason is Reason.NOT_LITERAL


def test_bad_inputs_are_rejected(sandbox: Any) -> None:
    outs = run(sandbox, [
        proposal("def f(x):\n    return x", "1 / 0"),
        proposal("def f(x):\n    return x", "iter([1])"),
        proposal("def f(x):\n    return x", "__import__('os')"),
        proposal("def f(x):\n    return x", "x=1"),
    ])
    assert [o.reason for o in outs] == [Reason.ERROR, Reason.NOT_LITERAL, Reason.BANNED, Reason.PARSE_ERROR]


def test_exactly_one_def_and_a_single_function_is_renamed_to_f(sandbox: Any) -> None:
    renamed, helper, klass, nested = run(sandbox, [
        proposal("def g(n):\n    return n + 1 if n < 3 else g(n - 1)", "5"),
        proposal("def h(n):\n    return n\ndef f(n):\n    return h(n)", "5"),
        proposal("class A:\n    pass\ndef f(n):\n    return n", "5"),
        proposal("def f(n):\n    def g(m):\n        return m\n    return g(n)", "5"),
    ])
    assert renamed.valid and renamed.task is not None and renamed.task.program.startswith("def f(n):")
    assert "f(n - 1)" in renamed.task.program and renamed.task.outputs == ("3",)
    assert [o.reason for o in (helper, klass, nested)] == [Reason.NO_F] * 3
    assert run(sandbox, [proposal("def h(n):\n    return n\ndef f(n):\n    return h(n)", "5")],
               profile="strict")[0].valid  # the strict profile allows helpers
    assert check_program_azr("def g(x):\n    return f\n", 4000).reason is Reason.NO_F  # the rename would rebind f


def test_azr_ban_list_with_dotted_entries_as_paths(sandbox: Any) -> None:
    outs = run(sandbox, [
        proposal("import os\ndef f(x):\n    return os.sep + x", "'a'"),  # allowed by AZR's list
        proposal("import os.path\ndef f(x):\n    return x", "'a'"),
        proposal("from random import choice\ndef f(x):\n    return x", "'a'"),
        proposal("def f(x):\n    return eval(x)", "'1'"),
    ])
    assert outs[0].valid, outs[0].detail
    assert [o.reason for o in outs[1:]] == [Reason.BANNED] * 3


def test_still_two_runs_and_size_limits(sandbox: Any) -> None:
    nondet, big = run(sandbox, [
        proposal("def f(x):\n    return id(object()) % 1000 + x", "1"),
        proposal("def f(x):\n    return x", "'" + "a" * 50 + "'"),
    ], max_input_chars=20)
    assert nondet.reason is Reason.NONDETERMINISTIC and big.reason is Reason.TOO_LONG


def induction(inputs: list[str], message: str) -> str:
    blocks = "\n".join(f"```input\n{i}\n```" for i in inputs)
    return think(f"{blocks}\n```message\n{message}\n```")


def test_induction_needs_a_message_and_evaluates_its_inputs(sandbox: Any) -> None:
    inputs = [f"'w' * {k}" for k in range(1, 7)]
    ok, silent = run(sandbox, [induction(inputs, "repeats"), induction(inputs, "")], TaskType.INDUCTION,
                     induction_inputs=6)
    assert ok.valid, ok.detail
    assert ok.task is not None and ok.task.inputs[0] == "'w'" and ok.task.message == "repeats"
    assert not silent.valid and silent.reason is Reason.FORMAT


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_the_forbidden_hint_lists_calls_not_words_of_the_answer_format(profile: str) -> None:
    hint = forbidden_hint(profile)
    assert "input()" in hint and ", input," not in hint and " id," not in hint.replace("id()", "")
