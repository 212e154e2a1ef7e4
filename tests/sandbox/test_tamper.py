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
    ORDINARY,
    PRELUDE,
    TRIPS,
    induction_proposal,
    only_program,
    ordinary_program,
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


@pytest.mark.parametrize("then", ["return x + 1", "_os._exit(0)"])
def test_a_frame_the_job_begins_is_a_reply_forgery_whatever_follows(then: str, box: Sandbox) -> None:
    """A job writes a seal's worth of bytes and a frame length the harness's reply never fills, then returns
    (the harness's sealed reply follows its bytes) or exits: the channel closes on an incomplete frame, which is
    the job's writing (``reply_forgery``), not an exit without a reply. (The CI run of 2026-12-07 met the
    returning case by chance: ``b'3007'`` followed by the harness's seal read as a length under the cap.)"""
    code = PRELUDE + textwrap.dedent(f"""
        def f(x):
            _os.write(3, bytes(32) + (1000).to_bytes(4, 'big'))
            {then}
        """)
    r = box.run([ExecJob(code, "f(3)", plain=True)])[0]
    assert (r.status, r.tamper) == ("crashed", "reply_forgery"), r


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
