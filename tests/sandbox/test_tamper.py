"""Every attempt to reach the verifier's machinery is named (issue 52): a run that trips a sandbox defence carries
the defence's class (``ExecResult.tamper``), decided by the harness and the fork server, never by the job; the env
makes a teacher's tampering program invalid and a student's tampering answer not correct, with reason ``tamper``;
and ordinary code is never marked.

The classes (``docs/sandbox.md`` section 7.2), each tripped by a program that passes both validation profiles'
static policies and, where the defence refuses something, catches the refusal and returns a normal value
(``tampering.TRIPS``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populora_env import parallel_env
from populora_env.sandbox import TAMPER_CLASSES, ExecJob, Limits, Sandbox
from tests.sandbox.tampering import (
    PRELUDE,
    TRIPS,
    induction_proposal,
    only_program,
    play_round,
    proposal,
    tripping_program,
)

#: The status a tripping job ends with: it went on after the refusal, or it broke its own reply, or its process.
STATUS = {"reply_forgery": "crashed", "exit": "crashed"}


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with Sandbox(workers=2, limits=Limits(timeout_s=5.0, memory_mb=512)) as sb:
        yield sb


def test_every_class_is_tripped_by_the_corpus() -> None:
    assert tuple(TRIPS) == TAMPER_CLASSES


@pytest.mark.parametrize("trip", list(TRIPS))
def test_each_class_is_named_even_when_the_refusal_is_caught(trip: str, box: Sandbox) -> None:
    r = box.run([ExecJob(tripping_program(trip), "f(3)", plain=True)])[0]
    assert (r.status, r.tamper) == (STATUS.get(trip, "ok"), trip), r
    if r.status == "ok":
        assert (r.value, r.plain) == ("4", True)  # the value is what f returned: only the mark tells


CLEAR_ATTEMPTS = {
    "exits": "_os._exit(0)",
    "writes_a_reply": "_os.write(3, b'\\x00' * 64)",
    "marks_itself_otherwise": "_os.kill(-(2 ** 30 + 7), 0)",
    "sends_a_clock_mark": "_os.kill(-(2 ** 30), 0)",
}


@pytest.mark.parametrize("after", list(CLEAR_ATTEMPTS), ids=list(CLEAR_ATTEMPTS))
def test_a_job_cannot_clear_or_replace_its_mark(after: str, box: Sandbox) -> None:
    """The fork server records a refusal before the job sees it: whatever the job does next (exit, break its
    reply, send marks of its own, which only add to its record), its result names the defence it tripped first."""
    code = tripping_program("introspection", returns="x + 1") + textwrap.dedent(f"""
        def g(x):
            f(x)
            {CLEAR_ATTEMPTS[after]}
            return x + 1
        """)
    r = box.run([ExecJob(code, "g(3)", plain=True)])[0]
    assert r.tamper == "introspection", r


def test_a_refusal_in_a_thread_is_named(box: Sandbox) -> None:
    code = PRELUDE + textwrap.dedent("""
        import threading
        def probe():
            try:
                _s._getframe()
            except ValueError:
                pass
        def f(x):
            t = threading.Thread(target=probe)
            t.start()
            t.join()
            return x
        """)
    r = box.run([ExecJob(code, "f(3)", plain=True)])[0]
    assert (r.status, r.value, r.tamper) == ("ok", "3", "introspection"), r


# ------------------------------------------------------------------------------------------ through env.step

def _env(sandbox: Sandbox, profile: str, task_types: tuple[str, ...], per_teacher: int, samples: int) -> object:
    return parallel_env(num_teachers=1, num_students=1, validation=profile, task_types=task_types,
                        tasks_per_teacher=per_teacher, samples_per_task=samples, student_fill=False,
                        sandbox=sandbox, max_program_chars=10_000, seed=0)


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_a_teachers_tampering_program_is_invalid_with_its_class(profile: str, box: Sandbox) -> None:
    env = _env(box, profile, ("deduction",), len(TRIPS), 1)
    try:
        r = play_round(env, [proposal(tripping_program(trip), "3") for trip in TRIPS])
    finally:
        env.close()
    assert [(p.valid, p.reason, p.tamper) for p in r.proposals] == [(False, "tamper", t) for t in TRIPS]
    assert r.summary["tamper"] == {"total": len(TRIPS), "agents": {"teacher_0": {t: 1 for t in sorted(TRIPS)},
                                                                    "student_0": {}}}
    assert r.summary["proposals"]["reasons"] == {"tamper": len(TRIPS)}


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_a_students_abduction_input_that_trips_a_defence_is_not_correct(profile: str, box: Sandbox) -> None:
    """Each task's program is valid on its own input (``f(3) = 4``) and trips a defence only on the input
    ``'probe'``: the student's answer ``'probe'`` is not correct, reason ``tamper`` with the class, and the env
    voids the task (the program is not what plain CPython runs on that input)."""
    env = _env(box, profile, ("abduction",), len(TRIPS), 1)
    programs = [tripping_program(trip, when="x == 'probe'", returns="4 if x == 3 else 0") for trip in TRIPS]
    try:
        r = play_round(env, [proposal(p, "3") for p in programs], {"abduction": ["'probe'"]})
    finally:
        env.close()
    assert [(a.correct, a.reason, a.tamper) for a in r.attempts] == [(False, "tamper", t) for t in TRIPS]
    assert [(p.valid, p.reason, p.tamper) for p in r.proposals] == [(False, "tamper", t) for t in TRIPS]
    assert r.summary["tamper"]["agents"]["student_0"] == {t: 1 for t in sorted(TRIPS)}


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_a_students_tampering_induction_program_is_not_correct(profile: str, box: Sandbox) -> None:
    """The student's program trips the defence (catching the refusal) and then computes the right values: not
    correct, reason ``tamper`` with the class; the task (the teacher's) stays valid."""
    env = _env(box, profile, ("deduction", "induction"), 1, len(TRIPS))
    try:
        only_program(env, "def f(x):\n    return x + 1\n")
        r = play_round(env, [induction_proposal(["5", "6", "7", "8", "9", "10"])],
                       {"induction": [tripping_program(trip) for trip in TRIPS]})
    finally:
        env.close()
    assert [p.valid for p in r.proposals] == [True]
    assert [(a.correct, a.reason, a.tamper) for a in r.attempts] == [(False, "tamper", t) for t in TRIPS]


# ------------------------------------------------------------------------------------------ no false alarm

#: Ordinary code, one snippet per kind the issue lists: each defines what it needs and leaves an expression of
#: ``x`` (an int) in ``EXPR``; a program is a few of them, and ``f(x)`` returns the list of their values.
ORDINARY = {
    "class_eq_repr": ("class P:\n    def __init__(self, v):\n        self.v = v\n    def __eq__(self, o):\n"
                      "        return isinstance(o, P) and o.v == self.v\n    def __hash__(self):\n"
                      "        return hash(self.v)\n    def __repr__(self):\n        return f'P({self.v})'\n",
                      "[repr(P(x)), P(x) == P(x), len({P(x), P(x)})]"),
    "exceptions": ("def _safe(v):\n    try:\n        return 10 // (v - 2)\n    except ZeroDivisionError as e:\n"
                   "        try:\n            raise ValueError(str(e)) from e\n        except ValueError as err:\n"
                   "            return str(err.__cause__)\n", "_safe(x)"),
    "recursion": ("def _fib(n):\n    return n if n < 2 else _fib(n - 1) + _fib(n - 2)\n", "_fib(x % 15)"),
    "generators": ("def _gen(n):\n    for i in range(n):\n        yield i * i\n", "sum(_gen(x)) + next(iter(_gen(3)))"),
    "closures": ("def _adder(k):\n    def add(v):\n        return v + k\n    return add\n", "_adder(x)(3)"),
    "seeded_random": ("import random\n", "random.Random(x).randint(0, 100)"),
    "math": ("import math\n", "[math.gcd(x, 12), math.isqrt(x * x + 1), round(math.sin(x), 6)]"),
    "itertools": ("import itertools\n", "list(itertools.accumulate(range(x)))[:5]"),
    "collections": ("from collections import Counter, OrderedDict, deque, namedtuple\nPt = namedtuple('Pt', 'a b')\n",
                    "[Counter('abca' * x).most_common(1), list(deque(range(x), maxlen=2)), Pt(x, 1).a]"),
    "re": ("import re\n", "re.findall(r'\\d+', f'a{x}b{x * 7}c')"),
    "json": ("import json\n", "json.loads(json.dumps({'k': [x, None, True]}))"),
    "functools": ("import functools\n@functools.lru_cache(maxsize=None)\ndef _sq(v):\n    return v * v\n",
                  "[functools.reduce(lambda a, b: a * b, range(1, x + 2)), _sq(x)]"),
    "dataclasses": ("import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass D:\n    a: int\n    b: str = 'z'\n",
                    "[repr(D(x)), dataclasses.asdict(D(x)), D(x) == D(x)]"),
    "typing_enum": ("import enum, typing\nT = typing.TypeVar('T')\nColor = enum.Enum('Color', 'RED GREEN')\n",
                    "[Color(x % 2 + 1).name, typing.Optional[int] == typing.Union[int, None]]"),
    "sorting_and_strings": ("", "[sorted(str(x * 7919), reverse=True), f'{x:>4}|{x / 3:.2f}', 'ab'.center(x)]"),
}


def ordinary_program(kinds: list[str]) -> str:
    """A program made of the snippets ``kinds``; ``f(x)`` returns their values."""
    head = "".join(ORDINARY[k][0] for k in kinds)
    return head + "\ndef f(x):\n    return [" + ", ".join(ORDINARY[k][1] for k in kinds) + "]\n"


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(ORDINARY)), min_size=1, max_size=5, unique=True),
       x=st.integers(min_value=0, max_value=9))
def test_ordinary_programs_are_never_marked(kinds: list[str], x: int, box: Sandbox) -> None:
    """The issue's corpus of ordinary programs: classes with ``__eq__``/``__repr__``, exceptions raised and
    caught, recursion, generators, closures, ``random`` with a seed, ``math``, ``itertools``, ``collections``
    (``namedtuple`` included), ``re``, ``json``, ``functools``, ``dataclasses``, ``typing``/``enum`` (which ask for
    their caller's frame): no run is ``tamper``, none draws randomness. ``benchmarks/tamper_false_alarms.py``
    runs the larger corpora (the env's seed programs, HumanEval+ and MBPP+) and prints the counts of
    ``docs/sandbox.md``."""
    r = box.run([ExecJob(ordinary_program(kinds), f"f({x})")])[0]
    assert r.tamper is None and not r.entropy, (kinds, x, r)
    assert r.status in ("ok", "error"), r
