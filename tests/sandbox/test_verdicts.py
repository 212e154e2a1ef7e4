"""Verdicts no program can write (issue 44): the harness's work after the call depends on nothing the job can
rebind, and a program random on the input that matters never gets a paid verdict.

Against the sandbox before issue 44 (b1b0641), each of the three descriptor forgeries of ``tampering.py``
(``TracebackType.tb_frame``, ``FrameType.f_code``, ``CodeType.co_filename`` written into the type's real dict)
became a valid deduction and abduction task with the gold ``3007``, in both validation profiles, and every
colluding answer (``3007``; the inputs ``5``, ``'x'``, ``[1, 2]``) was judged correct: 12 of 12 cases. Two more
routes found while closing the class forged too: ``list.pop`` rewritten made the harness print ``3007`` for a
function returning ``[4]`` (no secret needed), and ``str.partition`` rewritten let the audit hook admit ``ctypes``.
"""

from __future__ import annotations

import dis
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populora_env import parallel_env
from populora_env.literals import literal_matches
from populora_env.sandbox import ExecJob, Limits, Sandbox, _zygote
from tests.sandbox.tampering import (
    DESCRIPTORS,
    PRELUDE,
    descriptor_forgery,
    induction_proposal,
    only_program,
    play_round,
    proposal,
)

#: Opcodes that look a name or an attribute up (in a type's dict, a module, the builtins), build a class or a
#: function, or enter a ``with`` (``__enter__``/``__exit__`` lookups): none may run after the job's code started.
LOOKUPS = {"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR", "LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL",
           "LOAD_NAME", "STORE_NAME", "DELETE_NAME", "IMPORT_NAME", "IMPORT_FROM", "IMPORT_STAR", "LOAD_BUILD_CLASS",
           "BEFORE_WITH", "LOAD_CLASSDEREF", "LOAD_DEREF", "STORE_DEREF", "MAKE_FUNCTION", "SETUP_ANNOTATIONS",
           "LOAD_ASSERTION_ERROR"}


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def test_post_call_code_reads_only_its_locals() -> None:
    """Every function the harness runs after the job's code started (``_zygote.POST_CALL``) reads its own locals
    only: no attribute, global or builtin is looked up, so no type dictionary, module or builtin the job rebound
    is consulted (what it calls was bound when the zygote started)."""
    assert set(_zygote.POST_CALL) >= {"_audit", "_plain_repr", "_send", "_finish", "_run", "_value_reply"}
    found = [(name, code.co_name, ins.opname, ins.argval) for name in _zygote.POST_CALL
             for code in _codes(getattr(_zygote, name).__code__)
             for ins in dis.get_instructions(code) if ins.opname in LOOKUPS]
    assert found == []


def test_the_route_hands_over_a_builtin_types_real_dict() -> None:
    """The primitive the threat model assumes (run here, in the test process, without writing anything): the
    mappingproxy compares its dict with the other operand, whose reflected ``__eq__`` receives the dict itself."""
    got: list = []
    grab = type("G", (), {"__eq__": got.append, "__hash__": None})
    assert (int.__dict__ == grab()) is not True
    assert type(got[-1]) is dict and got[-1]["bit_length"] is int.__dict__["bit_length"]


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with Sandbox(workers=2, limits=Limits(timeout_s=5.0, memory_mb=512)) as sb:
        yield sb


ROUTE = textwrap.dedent("""
    got = []
    G = type('G', (), {'__eq__': got.append, '__hash__': None})
    def real_dict(t):
        t.__dict__ == G()
        return got[-1]
    """)
LIST_POP = ROUTE + textwrap.dedent("""
    d = real_dict(list)
    pop = d['pop']
    RESULT = []
    def lie(self, *args):
        if len(self) == 1 and type(self[0]) is tuple and self[0][0] is RESULT:
            pop(self)
            return ('3007', -1)
        return pop(self, *args)
    def f(x):
        RESULT.append(x + 1)
        d['pop'] = lie
        import sys
        sys._clear_type_cache()
        return RESULT
    """)
STR_PARTITION = ROUTE + textwrap.dedent("""
    d = real_dict(str)
    partition = d['partition']
    d['partition'] = lambda s, sep: ('x', '', '') if s.startswith(('ctypes', '_ctypes')) else partition(s, sep)
    import sys
    sys._clear_type_cache()
    import ctypes
    def f(x):
        return 3007
    """)


@pytest.mark.parametrize(("type_name", "attr"), DESCRIPTORS)
def test_the_three_descriptor_forgeries_fail_in_the_raw_sandbox(type_name: str, attr: str, box: Sandbox) -> None:
    """Issue 44's first reproduction: ``f(3)`` raises; the job rewrites a descriptor the old harness read while
    describing the exception, and sealed an "ok, 3007" reply (``match=True``). Now: an error, the job's value
    never reported, and the write is marked ``type_dict``."""
    code = descriptor_forgery(type_name, attr, "raise ValueError('no value')")
    r = box.run([ExecJob(code, "f(3)", plain=True, compare_to="3007")])[0]
    assert (r.status, r.value, r.match, r.tamper) == ("error", None, False, "type_dict"), r
    assert r.error.startswith("[during call] ValueError: no value"), r.error


def test_a_rewritten_list_method_cannot_put_a_lie_into_the_value(box: Sandbox) -> None:
    """``list.pop`` rewritten in the type's dict, found while closing the class: the old harness's value printer
    called it and printed ``3007`` as the plain value of an ``f`` that returned ``[4]``."""
    r = box.run([ExecJob(LIST_POP, "f(3)", plain=True, compare_to="3007")])[0]
    assert (r.status, r.value, r.plain, r.match, r.tamper) == ("ok", "[4]", True, False, "type_dict"), r


def test_a_rewritten_str_method_cannot_open_the_audit_hook_to_ctypes(box: Sandbox) -> None:
    """``str.partition`` rewritten: the old audit hook called it to check an import's name, and let ``ctypes``
    (raw memory, the reply's secret) in. Now the import is refused, and marked."""
    r = box.run([ExecJob(STR_PARTITION, "f(3)", plain=True)])[0]
    assert (r.status, r.tamper) == ("error", "native"), r
    assert "ImportError: import of ctypes is refused" in r.error


# ------------------------------------------------------------------------------------------ through env.step

def _env(sandbox: Sandbox, profile: str, task_types: tuple[str, ...], **kwargs) -> object:
    defaults = dict(num_teachers=1, num_students=1, validation=profile, task_types=task_types,
                    tasks_per_teacher=1, samples_per_task=3, student_fill=False, sandbox=sandbox,
                    max_program_chars=10_000, seed=0)
    defaults.update(kwargs)
    return parallel_env(**defaults)


@pytest.mark.parametrize("profile", ["strict", "azr"])
@pytest.mark.parametrize(("type_name", "attr"), DESCRIPTORS)
@pytest.mark.parametrize(("task_type", "body", "answers"), [
    ("deduction", "return [1, 2, 3][x]", ["3007"]),  # f(3) raises IndexError in plain CPython
    ("abduction", "raise ValueError('no value')", ["5", "'x'", "[1, 2]"]),  # f raises for every input
])
def test_forged_proposals_are_invalid_through_env_step(profile: str, type_name: str, attr: str, task_type: str,
                                                       body: str, answers: list[str], box: Sandbox) -> None:
    """Issue 44's second and third reproductions: valid (gold ``3007``) and every colluding answer paid before;
    now the proposal is invalid with reason ``tamper`` (class ``type_dict``), so nothing is left to collude on."""
    env = _env(box, profile, (task_type,))
    try:
        r = play_round(env, [proposal(descriptor_forgery(type_name, attr, body), "3")], {task_type: answers})
    finally:
        env.close()
    assert [(p.valid, p.reason, p.tamper) for p in r.proposals] == [(False, "tamper", "type_dict")]
    assert r.attempts == [] and r.summary["tamper"]["agents"]["teacher_0"] == {"type_dict": 1}


LAZY = """
import typing
_s = getattr(typing, 'sy' + 's')
_types = getattr(print.__self__, '__imp' + 'ort__')('types')
_got = []
_G = type('G', (), {'__eq__': _got.append, '__hash__': None})

def f(x):
    if x == 3:
        return 4
    _types.TracebackType.__dict__ == _G()
    _got[-1]['tb_frame'] = property(f)
    _s._clear_type_cache()
    raise ValueError('no value')
"""


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_a_program_that_forges_only_on_students_inputs_pays_no_answer(profile: str, box: Sandbox) -> None:
    """An abduction task valid on its own input (``f(3) = 4``) whose program rewrites a descriptor on any other
    input: every student input is run, trips the defence, is not correct (``tamper``), and the env voids the
    task (its proposal turns invalid, ``tamper``), as for a program that answered two runs differently."""
    env = _env(box, profile, ("abduction",))
    try:
        r = play_round(env, [proposal(LAZY, "3")], {"abduction": ["5", "'x'", "3"]})
    finally:
        env.close()
    assert [(a.correct, a.reason, a.tamper) for a in r.attempts][:2] == [(False, "tamper", "type_dict")] * 2
    assert [(p.valid, p.reason, p.tamper) for p in r.proposals] == [(False, "tamper", "type_dict")]
    assert not any(a.correct for a in r.attempts[:2])


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_induction_runs_cannot_forge_either(profile: str, box: Sandbox) -> None:
    """Induction: the teacher's inputs are run through the task's program (here one that forges off its own
    input): invalid, ``tamper``; and a student's induction program using the issue's forgery is not correct
    (``tamper``): hidden outputs never reach the job, and now its run is marked too."""
    env = _env(box, profile, ("deduction", "induction"), samples_per_task=1)
    try:
        only_program(env, LAZY)
        r = play_round(env, [induction_proposal(["5", "6", "7", "8", "9", "10"])], {})
        assert [(p.task_type, p.valid, p.reason, p.tamper) for p in r.proposals] == [
            ("induction", False, "tamper", "type_dict")]
    finally:
        env.close()
    env = _env(box, profile, ("deduction", "induction"), samples_per_task=1)
    try:
        only_program(env, "def f(x):\n    return x + 1\n")
        forger = descriptor_forgery("FrameType", "f_code", "raise ValueError('no value')")
        r = play_round(env, [induction_proposal(["5", "6", "7", "8", "9", "10"])], {"induction": [forger]})
        assert [p.valid for p in r.proposals] == [True]
        assert [(a.correct, a.reason, a.tamper) for a in r.attempts] == [(False, "tamper", "type_dict")]
    finally:
        env.close()


# ------------------------------------------------------------------------------------------ randomness

RANDOM_EVERYWHERE = """
import typing
_random = getattr(print.__self__, '__imp' + 'ort__')('ran' + 'dom')

def f(x):
    return x if _random.random() < 0.5 else -x
"""
RANDOM_OFF_ITS_INPUT = """
import typing
_random = getattr(print.__self__, '__imp' + 'ort__')('ran' + 'dom')

def f(x):
    if x == 3:
        return 4
    return 4 if _random.random() < 0.5 else 0
"""


@pytest.mark.parametrize("profile", ["strict", "azr"])
def test_the_randomness_case_never_gets_a_paid_verdict(profile: str, box: Sandbox) -> None:
    """The issue's last probe, 50 tries each: an abduction program random on every input (one answer was judged
    correct 6 times in 12), and one random only off its own input (valid, then random verdicts on students'
    inputs). The harness sees the generator move in every run that draws from it: the first is never valid, the
    second's answers are never correct (``nondeterministic``), and the env voids it."""
    env = _env(box, profile, ("abduction",), samples_per_task=2)
    paid = valid = voided = 0
    try:
        for _ in range(50):
            r = play_round(env, [proposal(RANDOM_EVERYWHERE, "3")], {"abduction": ["3", "-3"]})
            valid += sum(p.valid for p in r.proposals)
            paid += sum(a.correct for a in r.attempts)
            r = play_round(env, [proposal(RANDOM_OFF_ITS_INPUT, "3")], {"abduction": ["7", "8"]})
            assert all(a.reason == "nondeterministic" for a in r.attempts), r.attempts
            paid += sum(a.correct for a in r.attempts)
            voided += sum(p.reason == "nondeterministic" for p in r.proposals)
    finally:
        env.close()
    assert (paid, valid, voided) == (0, 0, 50)


@pytest.mark.parametrize(("code", "drew"), [
    ("import random\ndef f(x):\n    return random.random() < 2", True),
    ("import random\ndef f(x):\n    return random.choice([x, x])", True),
    ("import random\ndef f(x):\n    random.seed(1)\n    return random.random() < 2", True),  # strict: see docs
    ("import random\ndef f(x):\n    return random.Random().random() < 2", True),
    ("import random\ndef f(x):\n    return random.SystemRandom().random() < 2", True),
    ("import os\ndef f(x):\n    return len(os.urandom(x))", True),
    ("import secrets\ndef f(x):\n    return len(secrets.token_hex(x))", True),
    ("import uuid\ndef f(x):\n    return len(str(uuid.uuid4()))", True),
    ("import time\ndef f(x):\n    return time.perf_counter_ns() > 0", True),
    ("import time\ndef f(x):\n    return time.localtime().tm_year > 2000", True),
    ("import datetime\ndef f(x):\n    return datetime.datetime.now().year > 2000", True),
    ("import datetime\ndef f(x):\n    return datetime.date.today().year > 2000", True),
    ("import random\ndef f(x):\n    return random.Random(x).random() < 2", False),
    ("import time\ndef f(x):\n    return time.strftime('%Y', time.gmtime(x))", False),
    ("import datetime\ndef f(x):\n    return str(datetime.date(2020, 1, x))", False),
    ("def f(x):\n    return sorted({'b', 'a', str(x)})", False),
])
def test_the_sandbox_reports_every_draw_of_randomness_and_read_of_the_clock(code: str, drew: bool,
                                                                           box: Sandbox) -> None:
    r = box.run([ExecJob(code, "f(3)", plain=True)])[0]
    assert r.status == "ok" and r.tamper is None, r
    assert r.entropy is drew, (code, r)


# ------------------------------------------------------------------------------------------ the property

#: What ``f`` does besides the perturbation, for an ``int`` input (``{k}`` a small constant): values, and inputs
#: on which it raises.
BODIES = ["return x * {k} + 1", "return sorted([x, {k}, -x])", "return [1, 2, 3, 4][x]", "return {{'v': x, 'k': {k}}}",
          "return (x, x // ({k} - x))", "raise ValueError(x)", "return str(x) * ({k} % 3)"]
#: The perturbations: ordinary (none), tampering (kind ``tamper``) and random or time-dependent (``random``).
PERTURBATIONS = {
    "none": ("ordinary", "", ""),
    "junk_type_dict_entry": ("tamper", "list.__dict__ == _G()\n_got[-1]['populora_probe'] = 1\n", ""),
    "caught_frame_probe": ("tamper", "", "try:\n    _s._getframe()\nexcept ValueError:\n    pass\n"),
    "random_decides": ("random", "_random = _imp('ran' + 'dom')\n", "if _random.random() < 0.5:\n    return -1\n"),
    "random_off_its_input": ("random", "_random = _imp('ran' + 'dom')\n",
                             "if x != {x} and _random.random() < 0.5:\n    return -1\n"),
    "clock_decides": ("random", "_time = _imp('ti' + 'me')\n", "if _time.perf_counter_ns() % 2:\n    return -1\n"),
    "clock_through_datetime": ("random", "_dt = _imp('date' + 'time')\n",
                               "if _dt.datetime.now().microsecond % 2:\n    return -1\n"),
}
REFERENCE_DRIVER = """
def _ref(v):
    try:
        r = f(v)
    except BaseException as e:
        return 'EXC ' + type(e).__name__
    return 'VAL ' + repr(r)
print(_ref({x}))
print(_ref({a}))
"""


def _program(body: str, perturbation: str, k: int, x: int, descriptor: int | None) -> str:
    if descriptor is not None:  # issue 44's forgery around the body
        return descriptor_forgery(*DESCRIPTORS[descriptor], body.format(k=k))
    _, module, prefix = PERTURBATIONS[perturbation]
    lines = textwrap.indent(prefix.format(x=x) + body.format(k=k), "    ")
    return PRELUDE + module + "\ndef f(x):\n" + lines + "\n"


def _reference(program: str, x: int, a: int) -> tuple[str, str]:
    """``f(x)`` and ``f(a)`` (``VAL <repr>`` or ``EXC <type>``) in a fresh ``python -I``, no harness in it."""
    out = subprocess.run([sys.executable, "-I", "-c", program + REFERENCE_DRIVER.format(x=x, a=a)],
                         capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, (out.returncode, out.stdout, out.stderr[-2000:])
    return lines[0], lines[1]


CASES = dict(body=st.sampled_from(BODIES), perturbation=st.sampled_from(sorted(PERTURBATIONS)),
             descriptor=st.one_of(st.none(), st.sampled_from(range(len(DESCRIPTORS)))), k=st.integers(1, 5),
             x=st.integers(0, 5), a=st.integers(0, 5), task_type=st.sampled_from(["deduction", "abduction"]),
             profile=st.sampled_from(["strict", "azr"]))
QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=16, deadline=None, derandomize=True, suppress_health_check=QUIET)
@given(**CASES)
def test_verdicts_are_plain_cpythons_or_the_proposal_is_invalid(box: Sandbox, **case) -> None:
    """The property that decides issue 44: for a teacher program P (ordinary code, issue 44's descriptor
    forgeries, type-dict writes, caught frame probes, randomness and the clock), its input x and a student's
    answer a, run through ``env.step`` in both profiles: the validity, the gold output and the abduction verdict
    are what P's source gives in a fresh ``python -I`` (run twice: a program that differs between the two has no
    single answer), or the proposal is invalid; ordinary programs are valid exactly when plain CPython returns a
    value. (16 cases by default; ``test_the_property_at_length``, marked slow, runs 300.)"""
    _check_property(box, **case)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=QUIET)
@given(**CASES)
def test_the_property_at_length(box: Sandbox, **case) -> None:
    _check_property(box, **case)


def _check_property(box: Sandbox, body: str, perturbation: str, descriptor: int | None, k: int, x: int, a: int,
                    task_type: str, profile: str) -> None:
    program = _program(body, perturbation, k, x, descriptor)
    kind = "tamper" if descriptor is not None else PERTURBATIONS[perturbation][0]
    refs = [_reference(program, x, a), _reference(program, x, a)]
    env = _env(box, profile, (task_type,), samples_per_task=1, reject_duplicates=False)
    try:
        r = play_round(env, [proposal(program, str(x))], {"abduction": [str(a)], "deduction": ["0"]})
    finally:
        env.close()
    (p,) = r.proposals
    task = next(iter(r.tasks.values()), None)
    if p.valid:  # the gold is plain CPython's answer, every time
        assert task is not None and all(ref[0] == "VAL " + task.outputs[0] for ref in refs), (program, p, refs)
    if kind == "ordinary":
        assert p.valid == refs[0][0].startswith("VAL "), (program, p, refs)
    elif kind == "tamper":
        assert (p.valid, p.reason) == (False, "tamper"), (program, p, refs)
    elif perturbation != "random_off_its_input":  # it draws on every input: never valid
        assert (p.valid, p.reason) == (False, "nondeterministic"), (program, p, refs)
    if task is None or task_type != "abduction":
        return
    (attempt,) = r.attempts
    gold = task.outputs[0]
    truth = [ref[1] for ref in refs]
    if attempt.correct:  # paid only what plain CPython answers, every time
        assert all(t.startswith("VAL ") and literal_matches(t[4:], gold) for t in truth), (program, attempt, truth)
    elif kind == "ordinary":
        assert not (truth[0].startswith("VAL ") and literal_matches(truth[0][4:], gold)), (program, attempt, truth)
