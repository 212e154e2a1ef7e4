"""Every rejection reason of proposal validation, produced by a crafted proposal, through the real sandbox."""

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
    task_key,
)

from .helpers import think


def proposal(program: str, given: str) -> str:
    return think(f"```python\n{program}\n```\n```input\n{given}\n```")


def validate_one(sandbox: Any, completion: object, task_type: TaskType = TaskType.DEDUCTION,
                 known: frozenset[str] = frozenset(), **config: Any) -> ProposalOutcome:
    request = ProposalRequest("teacher_0", 0, task_type, "t-0", 0, _identity_task() if task_type is TaskType.INDUCTION else None)
    return ProposalValidator(ValidationConfig(**config)).validate([request], [completion], sandbox, known)[0]


def _identity_task() -> Task:
    seed = SEED_PROGRAMS[0]
    return Task("seed-deduction-0", TaskType.DEDUCTION, seed.program, seed.inputs[:1], seed.outputs[:1])


def test_valid_deduction_gets_its_output_from_the_sandbox(sandbox: Any) -> None:
    out = validate_one(sandbox, proposal("def f(a, b):\n    return sorted(a)[::-1] + [b]", "[3, 1, 2], 'x'"))
    assert out.valid and out.reason is None and out.format_ok
    assert out.task is not None and out.task.outputs == ("[3, 2, 1, 'x']",)
    assert out.task.inputs == ("[3, 1, 2], 'x'",)
    assert out.signature == "(list[int], str) -> list[int|str]"


def test_auxiliary_functions_and_classes_are_allowed(sandbox: Any) -> None:
    program = (
        "class Acc:\n    def __init__(self):\n        self.total = 0\n    def add(self, v):\n        self.total += v\n\n"
        "def helper(v):\n    return v * 2\n\n"
        "def f(xs):\n    acc = Acc()\n    for x in xs:\n        acc.add(helper(x))\n    return acc.total"
    )
    out = validate_one(sandbox, proposal(program, "[1, 2, 3]"))
    assert out.valid and out.task is not None and out.task.output == "12"


CASES: list[tuple[Reason, str]] = [
    (Reason.FORMAT, "random garbage without tags"),
    (Reason.FORMAT, think("no blocks here")),
    (Reason.FORMAT, think("```python\ndef f(x):\n    return x\n```")),
    (Reason.PARSE_ERROR, proposal("def f(x)\n    return x", "1")),
    (Reason.PARSE_ERROR, proposal("def f(x):\n    return x", "1, 2)")),
    (Reason.NO_F, proposal("def g(x):\n    return x", "1")),
    (Reason.NO_F, proposal("def f():\n    return 1", "")),
    (Reason.BANNED, proposal("import os\ndef f(x):\n    return x", "1")),
    (Reason.BANNED, proposal("import random\ndef f(x):\n    return random.random() + x", "1")),
    (Reason.BANNED, proposal("import time\ndef f(x):\n    return time.time() + x", "1")),
    (Reason.BANNED, proposal("def f(x):\n    return id(x)", "1")),
    (Reason.BANNED, proposal("def f(x):\n    return hash(x)", "'a'")),
    (Reason.NOT_LITERAL, proposal("def f(x):\n    return x", "[1] * 3")),
    (Reason.NOT_LITERAL, proposal("def f(x):\n    return object()", "1")),
    (Reason.NOT_LITERAL, proposal("def f(x):\n    return float('nan')", "1")),
    (Reason.NOT_LITERAL, proposal("class Yes:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return Yes()", "1")),
    (Reason.ERROR, proposal("def f(x):\n    return 1 / x", "0")),
    (Reason.ERROR, proposal("def f(x):\n    raise StopIteration", "0")),
    (Reason.ERROR, proposal("def f(x):\n    raise SystemExit(0)", "0")),
    (Reason.ERROR, proposal("def f(x, y):\n    return x", "1")),
    (Reason.TIMEOUT, proposal("def f(x):\n    while True:\n        x += 1", "0")),
    (Reason.MEMORY, proposal("def f(x):\n    return len([0] * (10 ** 9))", "0")),
    (Reason.OUTPUT_TOO_LARGE, proposal("def f(x):\n    return 'a' * 5000", "0")),
    (Reason.TOO_LONG, proposal("def f(x):\n    return x\n" + "# padding\n" * 500, "0")),
]


@pytest.mark.parametrize(("reason", "completion"), CASES, ids=[f"{r.value}-{i}" for i, (r, _) in enumerate(CASES)])
def test_each_reason(sandbox: Any, reason: Reason, completion: str) -> None:
    out = validate_one(sandbox, completion, timeout_s=0.5)
    assert not out.valid and out.task is None
    assert out.reason is reason, (out.reason, out.detail)
    assert out.detail
    assert out.format_ok == (reason is not Reason.FORMAT)


def test_nondeterminism_missed_by_the_ast_policy_is_caught_by_two_runs(sandbox: Any) -> None:
    # object() addresses: nothing banned, but the value differs between two separate runs.
    out = validate_one(sandbox, proposal("def f(x):\n    return repr(object()) + x", "'a'"))
    assert out.reason is Reason.NONDETERMINISTIC, (out.reason, out.detail)
    # iteration order of a set of objects hashed by address
    program = (
        "class Box:\n    def __init__(self, v):\n        self.v = v\n\n"
        "def f(n):\n    boxes = {Box(i) for i in range(n)}\n    return [b.v for b in boxes]"
    )
    out = validate_one(sandbox, proposal(program, "40"))
    assert out.reason is Reason.NONDETERMINISTIC, (out.reason, out.detail)


def test_huge_output_is_rejected_not_truncated(sandbox: Any) -> None:
    out = validate_one(sandbox, proposal("def f(n):\n    return list(range(n))", "400"), max_output_chars=1000)
    assert out.reason is Reason.OUTPUT_TOO_LARGE and out.task is None
    small = validate_one(sandbox, proposal("def f(n):\n    return list(range(n))", "10"), max_output_chars=1000)
    assert small.valid and small.task is not None and small.task.output == repr(list(range(10)))


def test_duplicates(sandbox: Any) -> None:
    program, given = "def f(x):\n    return x + 1", "1"
    key = task_key(TaskType.DEDUCTION, program + "\n# a comment\n", ["1"])
    out = validate_one(sandbox, proposal(program, given), known=frozenset({key}))
    assert out.reason is Reason.DUPLICATE
    assert validate_one(sandbox, proposal(program, given), known=frozenset({key}), reject_duplicates=False).valid
    # within one round: the second identical proposal is the duplicate
    requests = [ProposalRequest("teacher_0", k, TaskType.DEDUCTION, f"t-{k}", 0) for k in range(2)]
    outs = ProposalValidator(ValidationConfig()).validate(requests, [proposal(program, given)] * 2, sandbox)
    assert outs[0].valid and outs[1].reason is Reason.DUPLICATE


def test_induction_proposals(sandbox: Any) -> None:
    inputs = "\n".join(f"```input\n'w{i}'\n```" for i in range(8))
    out = validate_one(sandbox, think(inputs + "\n```message\nidentity\n```"), TaskType.INDUCTION, induction_inputs=6)
    assert out.valid and out.task is not None
    assert out.task.inputs == tuple(f"'w{i}'" for i in range(2, 8))  # the last six are kept
    assert out.task.outputs == out.task.inputs and out.task.message == "identity"
    assert out.task.program == SEED_PROGRAMS[0].program

    few = "\n".join("```input\n'same'\n```" for _ in range(6)) + "\n```input\n'other'\n```"
    out = validate_one(sandbox, think(few), TaskType.INDUCTION, induction_inputs=6)
    assert out.reason is Reason.TOO_FEW_INPUTS
    out = validate_one(sandbox, think("```message\nhi\n```"), TaskType.INDUCTION)
    assert out.reason is Reason.FORMAT
    bad = "\n".join(f"```input\n{i}, {i}\n```" for i in range(6))  # f takes one argument
    out = validate_one(sandbox, think(bad), TaskType.INDUCTION, induction_inputs=6)
    assert out.reason is Reason.ERROR


def test_garbage_completions_never_raise(sandbox: Any) -> None:
    from populora_env.policies import RandomPolicy

    policy = RandomPolicy(seed=3, max_length=500)
    requests = [ProposalRequest("t", k, TaskType.DEDUCTION, f"t-{k}", 0) for k in range(50)]
    outs = ProposalValidator(ValidationConfig()).validate(requests, [policy.sample() for _ in range(50)], sandbox)
    assert all(o.reason is Reason.FORMAT for o in outs)


def test_deeply_nested_programs_and_answers_never_crash(make_env: Any) -> None:
    env = make_env(num_teachers=1, num_students=1, tasks_per_teacher=3, samples_per_task=1,
                   task_types=("deduction",))
    programs = [
        "def f(x):\n    return " + "+".join(["x"] * 1300),
        "def f(x):\n    return x" + ".real" * 700,
        "def f(x):\n    return x\n",
    ]
    inputs = ["1", "1", "-" * 900 + "1"]
    obs, _ = env.reset()
    teacher = tuple(proposal(p, i) for p, i in zip(programs, inputs, strict=True))
    obs, _, _, _, infos = env.step({"teacher_0": teacher})
    reasons = [p["reason"] for p in infos["teacher_0"]["proposals"]]
    assert reasons[:2] == ["too_long", "too_long"] and reasons[2] in ("parse_error", "not_literal")
    deep = think("```output\n" + "+".join(["1"] * 1500) + "\n```")
    nested = think("```output\n" + "-" * 1500 + "1\n```")
    answers = (deep, nested) + ("",) * max(0, len(obs["student_0"]["prompts"]) - 2)
    _, rewards, _, _, infos = env.step({"student_0": answers[: len(obs["student_0"]["prompts"])]})
    assert all(r in (-1.0, -0.5) for r in infos["student_0"]["completion_rewards"])


def test_failing_first_runs_skip_the_second_run(sandbox: Any) -> None:
    class Counting:
        def __init__(self) -> None:
            self.jobs = 0

        def run(self, jobs: list[Any]) -> list[Any]:
            self.jobs += len(jobs)
            return sandbox.run(jobs)

    counting = Counting()
    requests = [ProposalRequest("t", k, TaskType.DEDUCTION, f"t-{k}", 0) for k in range(2)]
    completions = [proposal("def f(x):\n    return 1 / x", "0"), proposal("def f(x):\n    return x", "5")]
    outs = ProposalValidator(ValidationConfig()).validate(requests, completions, counting)
    assert [o.reason for o in outs] == [Reason.ERROR, None]
    assert counting.jobs == 3  # two first runs, one second run
