"""Checking of student answers in the sandbox: semantics per task type and resistance to reward hacking."""

from __future__ import annotations

from typing import Any

from populora_env.checking import AnswerChecker, AttemptOutcome, CheckConfig
from populora_env.tasks import Task, TaskType
from populora_env.validation import Reason

from .helpers import think

PROGRAM = "def f(a, b):\n    return [x * b for x in a]\n"
DEDUCTION = Task("d", TaskType.DEDUCTION, PROGRAM, ("[1, 2], 3",), ("[3, 6]",))
ABDUCTION = Task("a", TaskType.ABDUCTION, PROGRAM, ("[1, 2], 3",), ("[3, 6]",))
INDUCTION = Task(
    "i", TaskType.INDUCTION, "def f(x):\n    return x * 2\n", ("1", "2", "3", "4"), ("2", "4", "6", "8"), "doubles"
)


def check(sandbox: Any, task: Task, completion: object, **config: Any) -> AttemptOutcome:
    return AnswerChecker(CheckConfig(**config)).check([task], [completion], sandbox)[0]


def test_deduction(sandbox: Any) -> None:
    assert check(sandbox, DEDUCTION, think("```output\n[3, 6]\n```")).correct
    assert check(sandbox, DEDUCTION, think("[3.0, 6]")).correct  # Python value equality, fallback to the text
    wrong = check(sandbox, DEDUCTION, think("```output\n[3, 7]\n```"))
    assert wrong.format_ok and not wrong.correct and wrong.reason is Reason.WRONG
    unparsable = check(sandbox, DEDUCTION, think("the output is [3, 6]"))
    assert not unparsable.format_ok and unparsable.reason is Reason.FORMAT
    expression = check(sandbox, DEDUCTION, think("```output\n[3] + [6]\n```"))
    assert expression.format_ok and expression.reason is Reason.NOT_LITERAL


def test_abduction_accepts_any_preimage(sandbox: Any) -> None:
    assert check(sandbox, ABDUCTION, think("```input\n[1, 2], 3\n```")).correct
    assert check(sandbox, ABDUCTION, think("```input\n[3, 6], 1\n```")).correct
    assert check(sandbox, ABDUCTION, think("```input\na=[1, 2], b=3\n```")).correct
    assert check(sandbox, ABDUCTION, think("```input\n[1], 3\n```")).reason is Reason.WRONG
    assert check(sandbox, ABDUCTION, think("```input\n1, 3\n```")).reason is Reason.ERROR
    assert check(sandbox, ABDUCTION, think("```input\n1, 2)\n```")).reason is Reason.FORMAT


def test_induction_must_reproduce_all_hidden_outputs(sandbox: Any) -> None:
    assert check(sandbox, INDUCTION, think("```python\ndef f(x):\n    return x + x\n```")).correct
    # matches the shown pairs only
    partial = "```python\ndef f(x):\n    return {1: 2, 2: 4}.get(x, 0)\n```"
    assert check(sandbox, INDUCTION, think(partial)).reason is Reason.WRONG
    # structural failures of the student's program
    assert check(sandbox, INDUCTION, think("```python\ndef g(x):\n    return x\n```")).reason is Reason.NO_F
    assert check(sandbox, INDUCTION, think("```python\ndef f(x) return x\n```")).reason is Reason.FORMAT
    assert check(sandbox, INDUCTION, think("no code")).reason is Reason.FORMAT
    banned = "```python\nimport os\ndef f(x):\n    return x * 2\n```"
    assert check(sandbox, INDUCTION, think(banned)).reason is Reason.BANNED
    loop = "```python\ndef f(x):\n    while True:\n        pass\n```"
    assert check(sandbox, INDUCTION, think(loop), timeout_s=0.3).reason is Reason.TIMEOUT


def test_always_equal_objects_do_not_fool_the_check(sandbox: Any) -> None:
    hack = "class Yes:\n    def __eq__(self, other):\n        return True\n"
    program = "```python\n" + hack + "def f(x):\n    return Yes()\n```"
    assert not check(sandbox, INDUCTION, think(program)).correct
    sneaky_int = "```python\nclass I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(0)\n```"
    assert not check(sandbox, INDUCTION, think(sneaky_int)).correct
    out = check(sandbox, DEDUCTION, think("```output\ntype('Y', (), {'__eq__': lambda s, o: True})()\n```"))
    assert not out.correct and out.reason is Reason.NOT_LITERAL


def test_identical_answers_are_checked_once_but_reported_per_attempt(sandbox: Any) -> None:
    class CountingSandbox:
        def __init__(self, inner: Any) -> None:
            self.inner, self.jobs = inner, 0

        def run(self, jobs: list[Any]) -> list[Any]:
            self.jobs += len(jobs)
            return self.inner.run(jobs)

    counting = CountingSandbox(sandbox)
    answers = [think("```input\n[1, 2], 3\n```")] * 5 + [think("```input\n[0], 1\n```")]
    outs = AnswerChecker(CheckConfig()).check([ABDUCTION] * 6, answers, counting)
    assert [o.correct for o in outs] == [True] * 5 + [False]
    assert counting.jobs == 4  # two distinct answers, each run twice (the determinism check)
    # deduction compares two literals on the host: no job at all
    answers = [think("```output\n[3, 6]\n```")] * 5 + [think("```output\n[0]\n```")]
    outs = AnswerChecker(CheckConfig()).check([DEDUCTION] * 6, answers, counting)
    assert [o.correct for o in outs] == [True] * 5 + [False]
    assert counting.jobs == 4


def test_no_job_carries_the_expected_output(sandbox: Any) -> None:
    """The hidden outputs stay on the host: no job's code, call or compare_to holds them."""
    seen: list[Any] = []

    class Recording:
        def run(self, jobs: list[Any]) -> list[Any]:
            seen.extend(jobs)
            return sandbox.run(jobs)

    secret = Task("s", TaskType.INDUCTION, "def f(x):\n    return x * 7919\n", ("1", "2"), ("7919", "15838"), "m")
    abduct = Task("t", TaskType.ABDUCTION, "def f(x):\n    return x * 7919\n", ("3",), ("23757",))
    outs = AnswerChecker(CheckConfig()).check(
        [secret, abduct], [think("```python\ndef f(x):\n    return x * 7919\n```"), think("```input\n3\n```")],
        Recording())
    assert [o.correct for o in outs] == [True, True]
    assert seen and all(job.compare_to is None for job in seen)
    for job in seen:
        for text in (job.code, job.call):
            assert "15838" not in text and "23757" not in text


def test_require_think_false(sandbox: Any) -> None:
    bare = "<answer>\n```output\n[3, 6]\n```\n</answer>"
    assert not check(sandbox, DEDUCTION, bare).format_ok
    assert check(sandbox, DEDUCTION, bare, require_think=False).correct


class CountingSandbox:
    """Counts jobs and batches sent to a real sandbox."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.jobs, self.batches = inner, 0, 0

    def run(self, jobs: list[Any]) -> list[Any]:
        self.jobs += len(jobs)
        self.batches += 1
        return self.inner.run(jobs)


def test_wrong_induction_programs_cost_one_execution(sandbox: Any) -> None:
    counting = CountingSandbox(sandbox)
    right = think("```python\ndef f(x):\n    return 2 * x\n```")
    wrong = think("```python\ndef f(x):\n    return x\n```")
    outs = AnswerChecker(CheckConfig()).check([INDUCTION, INDUCTION], [right, wrong], counting)
    assert [o.correct for o in outs] == [True, False]
    assert counting.batches == 2 and counting.jobs == 2 + 1  # both first pairs, then the right one's last pair


def test_abduction_answers_run_twice_and_a_disagreement_is_nondeterministic(sandbox: Any) -> None:
    """A program deterministic on its teacher's input but random elsewhere: the student's pre-image is run
    twice, like the teacher's own input was, and two different values (or a value and a failure) make the
    verdict ``nondeterministic``; a deterministic program keeps its verdicts."""
    random_elsewhere = Task("r", TaskType.ABDUCTION, "import random\ndef f(x):\n    if x == 3:\n        return 9\n"
                            "    return random.random()\n", ("3",), ("9",))
    out = check(sandbox, random_elsewhere, think("```input\n4\n```"))
    assert (out.correct, out.reason) == (False, Reason.NONDETERMINISTIC), out
    # fails only in the second run (the heap padding binds a global): a value and a failure
    flaky = Task("k", TaskType.ABDUCTION, "def f(x):\n    if x != 3 and '__populora_pad__' in globals():\n"
                 "        raise ValueError\n    return 9\n", ("3",), ("9",))
    out = check(sandbox, flaky, think("```input\n4\n```"))
    assert (out.correct, out.reason) == (False, Reason.NONDETERMINISTIC), out
    assert check(sandbox, random_elsewhere, think("```input\n3\n```")).correct  # its own input: 9 twice
    assert check(sandbox, ABDUCTION, think("```input\n[1, 2], 3\n```")).correct


def test_shadowed_builtins_do_not_fool_the_plain_data_guard(sandbox: Any) -> None:
    hack = (
        "```python\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
        "type = lambda v: int\nlist = Yes\nany = lambda xs: True\n\ndef f(x):\n    return Yes()\n```"
    )
    out = check(sandbox, INDUCTION, think(hack))
    assert not out.correct and out.reason is Reason.NOT_LITERAL


class _ForgingSandbox:
    """Runs the real sandbox, then rewrites every reply as a job that forged its own frame would:
    ``match=True`` with a value of its choice (code under test can write a reply frame itself)."""

    def __init__(self, inner: Any, value: str | None) -> None:
        self.inner, self.value = inner, value

    def run(self, jobs: Any) -> list[Any]:
        import dataclasses

        return [dataclasses.replace(r, status="ok", match=True, value=self.value) for r in self.inner.run(jobs)]


def test_a_forged_match_without_the_right_value_does_not_pay(sandbox: Any) -> None:
    wrong = think("```python\ndef f(x):\n    return 0\n```")
    assert not check(_ForgingSandbox(sandbox, "0"), INDUCTION, wrong).correct
    assert not check(_ForgingSandbox(sandbox, None), INDUCTION, wrong).correct
    assert not check(_ForgingSandbox(sandbox, "[3, 7]"), ABDUCTION, think("```input\n[1], 3\n```")).correct
    # the honest path still pays: the reported value equals the expected literal on the host
    assert check(sandbox, INDUCTION, think("```python\ndef f(x):\n    return x + x\n```")).correct
