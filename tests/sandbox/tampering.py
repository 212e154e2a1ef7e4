"""Teacher and student programs that tamper with the sandbox, shared by ``test_verdicts.py`` (issue 44: forging a
verdict) and ``test_tamper.py`` (issue 52: every defence class named), and a scripted round through ``env.step``.

Every program here passes both validation profiles' static policies (``strict`` and ``azr``: one function, no
class statement, no lambda; banned modules and names reached through ``typing.sys`` and ``print.__self__``), so it
reaches the sandbox through the env's real path. ``ROUTE`` is the primitive of issue 44: comparing a builtin type's
``__dict__`` (a mappingproxy) with an object whose ``__eq__`` receives the other operand hands that object the
type's real, writable dict.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

#: Reaches ``sys``, ``os``, ``__import__`` through names no policy bans, and the real dict of a builtin type:
#: ``real_dict(T)`` is spelled ``(T.__dict__ == _G(), _got[-1])[1]`` (no def, no lambda).
PRELUDE = """
import typing
_s = getattr(typing, 'sy' + 's')
_b = print.__self__
_imp = getattr(_b, '__imp' + 'ort__')
_os = _s.modules['o' + 's']
_types = _imp('types')
_got = []
_G = type('G', (), {'__eq__': _got.append, '__hash__': None})
"""

#: The old protocol's sealed "ok, 3007, plain" frame (before issue 44); a flush of the type attribute cache (a dict
#: written behind the type's back keeps its version tag, so a cached lookup would still find the old entry).
FORGED = """
_body = bytes([0, 1]) + (4).to_bytes(4, 'big') + b'3007' + (0).to_bytes(4, 'big')
_frame = len(_body).to_bytes(4, 'big') + _body
_hmac = _imp('hm' + 'ac')
_tbget = _types.TracebackType.__dict__['tb_frame'].__get__
"""
FLUSH = "_s._clear_type_cache()\n"


def descriptor_forgery(type_name: str, attr: str, plain_body: str) -> str:
    """Issue 44's forgery: ``f`` is also the getter of a descriptor the harness read after the call
    (``TracebackType.tb_frame``, ``FrameType.f_code``, ``CodeType.co_filename``), written into the type's real
    dict; called by the harness, it climbs to the frame holding the reply's token, seals an "ok, 3007" reply and
    exits. Called with anything else, ``f`` runs ``plain_body`` (which raises: plain CPython's answer is an
    exception). Against the sandbox before issue 44 (b1b0641) each such program became a valid task with gold
    ``3007``."""
    body = textwrap.indent(textwrap.dedent(plain_body).strip(), "        ")
    head = textwrap.dedent(f"""
        _T = getattr(_types, '{type_name}')
        _T.__dict__ == _G()
        _d = _got[-1]
        _orig = _d['{attr}']

        def f(x):
            if type(x) is not _T:
        """)
    tail = ("    try:\n        raise KeyError(x)\n    except KeyError as e:\n        start = _tbget(e.__traceback__)\n"
            + textwrap.indent(climb("start", "_frame"), "    ")
            + f"\n    return _orig.__get__(x)\n\n_d['{attr}'] = property(f)\n")
    return PRELUDE + FORGED + head + body + "\n" + tail + FLUSH


def climb(start: str, frame: str) -> str:
    """Statements that walk from the frame ``start`` up to the one whose locals hold the reply's token, write the
    reply ``frame`` sealed with it and exit (what the forgeries of issues 39 and 44 did once they had a frame)."""
    return textwrap.dedent(f"""
        fr = {start}
        while fr is not None:
            loc = getattr(fr, 'f_lo' + 'cals')
            if 'token' in loc:
                _os.write(3, _hmac.new(loc['token'], {frame}, 'sha256').digest() + {frame})
                _os._exit(0)
            fr = getattr(fr, 'f_ba' + 'ck')
        """).strip("\n")


#: The three descriptors issue 44 found, as (type name in ``types``, attribute).
DESCRIPTORS = [("TracebackType", "tb_frame"), ("FrameType", "f_code"), ("CodeType", "co_filename")]


def think(answer: str) -> str:
    return f"<think>ok</think>\n<answer>\n{answer}\n</answer>"


def proposal(program: str, given: str) -> str:
    """A deduction/abduction proposal completion."""
    return think(f"```python\n{program}```\n```input\n{given}\n```")


def induction_proposal(inputs: list[str], message: str = "find f") -> str:
    blocks = "\n".join(f"```input\n{i}\n```" for i in inputs)
    return think(f"{blocks}\n```message\n{message}\n```")


def answer(task_type: str, text: str) -> str:
    """A student's completion: an output (deduction), an input (abduction) or a program (induction)."""
    block = {"deduction": "output", "abduction": "input", "induction": "python"}[task_type]
    return think(f"```{block}\n{text}\n```")


#: One way to trip each defence class, written to pass both profiles' static policies (module ``_s``, ``_os``,
#: ``_imp``, ``_G``/``_got`` from :data:`PRELUDE`), catching the refusal and going on where there is one.
TRIPS = {
    "introspection": "try:\n    _s._getframe()\nexcept ValueError:\n    pass",
    "native": "try:\n    _imp('mar' + 'shal').loads(b'\\xe3')\nexcept ImportError:\n    pass",
    "type_dict": "list.__dict__ == _G()\n_got[-1]['populora_probe'] = 1",
    "signal": "try:\n    _imp('sig' + 'nal').signal(14, print)\nexcept OSError:\n    pass",
    "process": "try:\n    _os.fork()\nexcept OSError:\n    pass",
    "reply_forgery": "_os.write(3, b'3007')",
    "exit": "_os._exit(0)",
}


def tripping_program(trip: str, when: str = "True", returns: str = "x + 1") -> str:
    """``f(x)`` trips ``TRIPS[trip]`` when ``when`` holds (an expression of ``x``), then returns ``returns``."""
    body = textwrap.indent(TRIPS[trip], "        ")
    return PRELUDE + f"\ndef f(x):\n    if {when}:\n{body}\n    return {returns}\n"


def only_program(env: Any, program: str) -> None:
    """Empty ``env``'s buffers and play a deduction round proposing ``program`` on 3, so that it is the only
    program an induction proposal can be given (the env's task types: deduction, then induction)."""
    from populora_env.tasks import TaskType

    for task_type in (TaskType.DEDUCTION, TaskType.ABDUCTION):
        for task in list(env.buffers[task_type].tasks):
            env.buffers.remove(task.task_id)
    r = play_round(env, [proposal(program, "3")], {"deduction": ["4"]})
    assert [p.valid for p in r.proposals] == [True], r.proposals


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


@dataclass
class Round:
    """One scripted round's records (``env.last_outcome``) and the tasks the student met."""

    proposals: list[Any]
    attempts: list[Any]
    summary: dict[str, Any]
    tasks: dict[str, Any]


def play_round(env: Any, proposals: list[str], answers: dict[str, list[str]] | None = None,
               default_answer: str = "0") -> Round:
    """Reset ``env`` (one teacher, one student), propose ``proposals``, answer every task the student meets with
    ``answers[task_type]`` (in order; samples_per_task answers each) or ``default_answer``."""
    answers = answers or {}
    _, infos = env.reset()
    n = len(infos["teacher_0"]["requests"])
    assert len(proposals) == n, (len(proposals), n)
    _, _, _, _, infos = env.step({"teacher_0": tuple(proposals)})
    given: list[str] = []
    used: dict[str, int] = {}
    tasks = {}
    for request in infos["student_0"]["requests"]:
        task_type = request["task_type"]
        tasks[request["task_id"]] = env.current_tasks[request["task_id"]]
        pool = answers.get(task_type, [default_answer])
        k = used.get(task_type, 0)
        used[task_type] = k + 1
        given.append(answer(task_type, pool[k % len(pool)]))
    env.step({"student_0": tuple(given)})
    outcome = env.last_outcome
    return Round(list(outcome.results.proposals), list(outcome.results.attempts), outcome.summary, tasks)
