"""Shipped seed tasks: 23 small hand-written programs and the input generators of their arguments.

The seeds start every buffer, so they are the students' first filler tasks, the proposers' first reference
snippets and the first programs of induction proposals. They are chosen so that a small model can work with
them from step 1 (``benchmarks/seed_solvability.py`` measures how often SmolLM2-135M solves them):

- AZR's identity zero triplet first (``f(a) = a`` with ``'Hello world'``), then three identity-like programs
  (``s.strip()``, ``abs(x)``, ``s.lower()``) whose deduction and abduction seed tasks are solved by copying the
  input or the output, what a ~100M model does when it cannot compute (measured: it copies), so a student
  can earn +1 before it has learned anything; their other inputs are not fixed points, so their induction
  tasks are real;
- 13 one-operation programs (``n + 1``, ``s.upper()``, ``len(s)``, ``max(nums)``, ``sorted(nums)``...) with
  short, small inputs: a deduction is one step of arithmetic or string work; some abductions are solved by
  copying the output (``sorted``, ``s.upper()``, the identity); an induction is one line;
- 6 multi-step programs (loops, a helper function, string building) for variety.

Every seed has ten inputs; the outputs were computed in the sandbox (two runs each, as in validation) and are
re-verified by ``tests/env/test_seeds.py``. The buffers start with:

- deduction: each program with its first input;
- abduction: each program with its second input;
- induction: each program with its first ``induction_inputs`` inputs (at most ten) and its message.

``arg_kinds`` name the generators in :data:`ARG_GENERATORS`; :class:`populora_env.policies.SeedTeacher` uses
them to propose fresh inputs for the seed programs.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from populora_env.tasks import Task, TaskType


@dataclass(frozen=True)
class SeedProgram:
    """A hand-written program with example inputs, their outputs and a one-line description."""

    name: str
    program: str
    arg_kinds: tuple[str, ...]
    message: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _word(rng: np.random.Generator, lo: int, hi: int) -> str:
    return "".join(_LETTERS[int(i)] for i in rng.integers(0, 26, size=int(rng.integers(lo, hi + 1))))


def _runs(rng: np.random.Generator) -> str:
    out = ""
    while len(out) < 10:
        out += "abcd"[int(rng.integers(4))] * int(rng.integers(1, 5))
    return out


ARG_GENERATORS: dict[str, Callable[[np.random.Generator], Any]] = {
    "text": lambda rng: " ".join(_word(rng, 3, 7) for _ in range(int(rng.integers(2, 4)))),
    "ints": lambda rng: [int(x) for x in rng.integers(-50, 51, size=int(rng.integers(3, 9)))],
    "words": lambda rng: " ".join(_word(rng, 2, 6) for _ in range(int(rng.integers(3, 7)))),
    "letters": lambda rng: _word(rng, 5, 12),
    "posint": lambda rng: int(rng.integers(1, 10**6)),
    "smallint": lambda rng: int(rng.integers(0, 10)),
    "number": lambda rng: int(rng.integers(-99, 100)),
    "bigint": lambda rng: int(rng.integers(10, 10**12)),
    "runs": _runs,
    "wordlist": lambda rng: [_word(rng, 1, 6) for _ in range(int(rng.integers(3, 7)))],
}


def generate_args(kinds: tuple[str, ...], rng: np.random.Generator) -> str:
    """A call-argument string with one freshly generated value per kind."""
    return ", ".join(repr(ARG_GENERATORS[k](rng)) for k in kinds)


# The identity seed (AZR's zero triplet, "Hello world" first): its outputs are its inputs.
_IDENTITY_IO: tuple[str, ...] = (
    "'Hello world'",
    "'zzyuxyv pcqs'",
    "'fdswpk ehbe'",
    "'hakkg lhht'",
    "'nvsm arhnjv mvmgkm'",
    "'axsfycc ldtugd qzonq'",
    "'pvfgyuk inudob utdy'",
    "'ksp icptait cbtkbs'",
    "'dcdllq mdeb'",
    "'kpes gghbb'",
)


SEED_PROGRAMS: tuple[SeedProgram, ...] = (
    SeedProgram(
        name='identity',
        program=(
            'def f(a):\n'
            '    return a\n'
        ),
        arg_kinds=('text',),
        message='returns whatever you input',
        inputs=_IDENTITY_IO,
        outputs=_IDENTITY_IO,
    ),
    SeedProgram(
        name='strip',
        program=(
            'def f(s):\n'
            '    return s.strip()\n'
        ),
        arg_kinds=('text',),
        message='the text without spaces at both ends',
        inputs=(
            "'cat'",
            "'dog'",
            "'  hi  '",
            "' sun'",
            "'moon '",
            "'  a b  '",
            "'tree'",
            "'   x'",
            "'blue sky '",
            "' ok '",
        ),
        outputs=(
            "'cat'",
            "'dog'",
            "'hi'",
            "'sun'",
            "'moon'",
            "'a b'",
            "'tree'",
            "'x'",
            "'blue sky'",
            "'ok'",
        ),
    ),
    SeedProgram(
        name='absolute',
        program=(
            'def f(x):\n'
            '    return abs(x)\n'
        ),
        arg_kinds=('number',),
        message='the number without its sign',
        inputs=(
            '7',
            '12',
            '-5',
            '0',
            '-13',
            '8',
            '-1',
            '42',
            '-30',
            '3',
        ),
        outputs=(
            '7',
            '12',
            '5',
            '0',
            '13',
            '8',
            '1',
            '42',
            '30',
            '3',
        ),
    ),
    SeedProgram(
        name='lower',
        program=(
            'def f(s):\n'
            '    return s.lower()\n'
        ),
        arg_kinds=('letters',),
        message='the text in small letters',
        inputs=(
            "'dog'",
            "'cat'",
            "'HELLO'",
            "'Python'",
            "'ABC'",
            "'mOoN'",
            "'Quick'",
            "'LAMP'",
            "'river'",
            "'GoLd'",
        ),
        outputs=(
            "'dog'",
            "'cat'",
            "'hello'",
            "'python'",
            "'abc'",
            "'moon'",
            "'quick'",
            "'lamp'",
            "'river'",
            "'gold'",
        ),
    ),
    SeedProgram(
        name='add_one',
        program=(
            'def f(n):\n'
            '    return n + 1\n'
        ),
        arg_kinds=('posint',),
        message='adds one to the number',
        inputs=(
            '7',
            '41',
            '3',
            '100',
            '58',
            '12',
            '999',
            '26',
            '5',
            '80',
        ),
        outputs=(
            '8',
            '42',
            '4',
            '101',
            '59',
            '13',
            '1000',
            '27',
            '6',
            '81',
        ),
    ),
    SeedProgram(
        name='double',
        program=(
            'def f(x):\n'
            '    return x * 2\n'
        ),
        arg_kinds=('number',),
        message='doubles the number',
        inputs=(
            '4',
            '9',
            '0',
            '1',
            '2',
            '3',
            '5',
            '6',
            '7',
            '8',
        ),
        outputs=(
            '8',
            '18',
            '0',
            '2',
            '4',
            '6',
            '10',
            '12',
            '14',
            '16',
        ),
    ),
    SeedProgram(
        name='upper',
        program=(
            'def f(s):\n'
            '    return s.upper()\n'
        ),
        arg_kinds=('letters',),
        message='the text in capital letters',
        inputs=(
            "'hello'",
            "'cat'",
            "'python'",
            "'abc'",
            "'zebra'",
            "'moon'",
            "'quick'",
            "'lamp'",
            "'river'",
            "'gold'",
        ),
        outputs=(
            "'HELLO'",
            "'CAT'",
            "'PYTHON'",
            "'ABC'",
            "'ZEBRA'",
            "'MOON'",
            "'QUICK'",
            "'LAMP'",
            "'RIVER'",
            "'GOLD'",
        ),
    ),
    SeedProgram(
        name='length',
        program=(
            'def f(s):\n'
            '    return len(s)\n'
        ),
        arg_kinds=('text',),
        message='the number of characters in the text',
        inputs=(
            "'apple'",
            "'hi there'",
            "'code'",
            "'a b c'",
            "'sunny day'",
            "'x'",
            "'hello world'",
            "'tree'",
            "'blue sky'",
            "'ok'",
        ),
        outputs=(
            '5',
            '8',
            '4',
            '5',
            '9',
            '1',
            '11',
            '4',
            '8',
            '2',
        ),
    ),
    SeedProgram(
        name='first',
        program=(
            'def f(nums):\n'
            '    return nums[0]\n'
        ),
        arg_kinds=('ints',),
        message='the first number of the list',
        inputs=(
            '[5, 2, 8]',
            '[1, 9]',
            '[-3, 4, 7, 0]',
            '[10, 20, 30]',
            '[7]',
            '[0, 6, 2]',
            '[42, 1]',
            '[-1, -2, -3]',
            '[3, 3, 4]',
            '[8, 5, 1, 9]',
        ),
        outputs=(
            '5',
            '1',
            '-3',
            '10',
            '7',
            '0',
            '42',
            '-1',
            '3',
            '8',
        ),
    ),
    SeedProgram(
        name='largest',
        program=(
            'def f(nums):\n'
            '    return max(nums)\n'
        ),
        arg_kinds=('ints',),
        message='the largest number in the list',
        inputs=(
            '[3, 9, 4]',
            '[1, 2]',
            '[-5, -2, -9]',
            '[7, 7, 1]',
            '[0, 10, 5]',
            '[12, 4, 8, 6]',
            '[-1, 0]',
            '[5]',
            '[2, 11, 3, 9]',
            '[6, 15, 14]',
        ),
        outputs=(
            '9',
            '2',
            '-2',
            '7',
            '10',
            '12',
            '0',
            '5',
            '11',
            '15',
        ),
    ),
    SeedProgram(
        name='add',
        program=(
            'def f(a, b):\n'
            '    return a + b\n'
        ),
        arg_kinds=('smallint', 'smallint'),
        message='the sum of the two numbers',
        inputs=(
            '2, 3',
            '5, 4',
            '0, 7',
            '1, 1',
            '6, 8',
            '9, 2',
            '3, 3',
            '4, 0',
            '7, 5',
            '8, 9',
        ),
        outputs=(
            '5',
            '9',
            '7',
            '2',
            '14',
            '11',
            '6',
            '4',
            '12',
            '17',
        ),
    ),
    SeedProgram(
        name='last_digit',
        program=(
            'def f(n):\n'
            '    return n % 10\n'
        ),
        arg_kinds=('bigint',),
        message='the last digit of the number',
        inputs=(
            '123',
            '58',
            '9071',
            '46',
            '3315',
            '20',
            '77',
            '1000004',
            '89',
            '642',
        ),
        outputs=(
            '3',
            '8',
            '1',
            '6',
            '5',
            '0',
            '7',
            '4',
            '9',
            '2',
        ),
    ),
    SeedProgram(
        name='count_words',
        program=(
            'def f(words):\n'
            '    return len(words)\n'
        ),
        arg_kinds=('wordlist',),
        message='how many words are in the list',
        inputs=(
            "['a', 'b']",
            "['cat', 'dog', 'fish']",
            "['x']",
            "['one', 'two', 'three', 'four']",
            "['red', 'blue', 'green']",
            "['sun', 'moon']",
            "['hi']",
            "['up', 'down', 'left', 'right', 'top']",
            "['tea', 'milk']",
            "['a', 'bb', 'ccc', 'dddd']",
        ),
        outputs=(
            '2',
            '3',
            '1',
            '4',
            '3',
            '2',
            '1',
            '5',
            '2',
            '4',
        ),
    ),
    SeedProgram(
        name='sort',
        program=(
            'def f(nums):\n'
            '    return sorted(nums)\n'
        ),
        arg_kinds=('ints',),
        message='the numbers sorted from smallest to largest',
        inputs=(
            '[3, 1, 2]',
            '[5, 4]',
            '[9, 0, 7, 1]',
            '[2, 2, 1]',
            '[10, -1, 5]',
            '[8, 6, 7, 5]',
            '[1, 2, 3]',
            '[4, -2]',
            '[0, 9, 3, 6, 2]',
            '[7, 1]',
        ),
        outputs=(
            '[1, 2, 3]',
            '[4, 5]',
            '[0, 1, 7, 9]',
            '[1, 2, 2]',
            '[-1, 5, 10]',
            '[5, 6, 7, 8]',
            '[1, 2, 3]',
            '[-2, 4]',
            '[0, 2, 3, 6, 9]',
            '[1, 7]',
        ),
    ),
    SeedProgram(
        name='reverse_text',
        program=(
            'def f(s):\n'
            '    return s[::-1]\n'
        ),
        arg_kinds=('letters',),
        message='the text backwards',
        inputs=(
            "'abc'",
            "'hello'",
            "'stop'",
            "'python'",
            "'level'",
            "'cat'",
            "'moon'",
            "'drawer'",
            "'xyz'",
            "'lamp'",
        ),
        outputs=(
            "'cba'",
            "'olleh'",
            "'pots'",
            "'nohtyp'",
            "'level'",
            "'tac'",
            "'noom'",
            "'reward'",
            "'zyx'",
            "'pmal'",
        ),
    ),
    SeedProgram(
        name='square',
        program=(
            'def f(n):\n'
            '    return n * n\n'
        ),
        arg_kinds=('number',),
        message='the number times itself',
        inputs=(
            '3',
            '5',
            '2',
            '0',
            '1',
            '4',
            '6',
            '7',
            '8',
            '9',
        ),
        outputs=(
            '9',
            '25',
            '4',
            '0',
            '1',
            '16',
            '36',
            '49',
            '64',
            '81',
        ),
    ),
    SeedProgram(
        name='is_even',
        program=(
            'def f(n):\n'
            '    return n % 2 == 0\n'
        ),
        arg_kinds=('posint',),
        message='True if the number is even, else False',
        inputs=(
            '4',
            '7',
            '10',
            '13',
            '22',
            '35',
            '100',
            '1',
            '58',
            '91',
        ),
        outputs=(
            'True',
            'False',
            'True',
            'False',
            'True',
            'False',
            'True',
            'False',
            'True',
            'False',
        ),
    ),
    SeedProgram(
        name='even_squares',
        program=(
            'def f(nums):\n'
            '    return sum(x * x for x in nums if x % 2 == 0)\n'
        ),
        arg_kinds=('ints',),
        message='sum of the squares of the even numbers',
        inputs=(
            '[40, 41, -20, 24, 32]',
            '[-23, 22, 33, 38, 25, -3, 42, 14]',
            '[39, 11, 31, 2, -18, -19]',
            '[36, 11, -8]',
            '[49, 16, -50, -45, 2, 6, -44, -24]',
            '[19, 4, 14, -1, -4, 36]',
            '[-27, 10, -6, 48]',
            '[39, 36, -19, 15, 43, 16, 36, 28]',
            '[-39, -17, -41, 15, -7, 47, 31]',
            '[37, -35, -48, 27]',
        ),
        outputs=(
            '3600',
            '3888',
            '328',
            '1360',
            '5308',
            '1524',
            '2440',
            '3632',
            '0',
            '2304',
        ),
    ),
    SeedProgram(
        name='reverse_words',
        program=(
            'def f(sentence):\n'
            '    words = sentence.split()\n'
            "    return ' '.join(reversed(words))\n"
        ),
        arg_kinds=('words',),
        message='the words in reverse order',
        inputs=(
            "'lnzp jxqlf vqpwp hsyy irxxv zd'",
            "'zwqji xwbvzb elkdbp fyzv ekxz euqsm'",
            "'dfepqr snuytn rktjo osqk flkh sigvu'",
            "'nf zajqi njm wz wjrwjv nqgs'",
            "'kv ri jyuez'",
            "'xbrvye irrvsy jieomq'",
            "'okqms gflt yyrl blsg kuv'",
            "'sjzvef eh itx fahg omqlgg lxcn'",
            "'mdtp ahpigy wze bpg nrilh nwu'",
            "'yxse fykdmb cq xksz bqzsge sv'",
        ),
        outputs=(
            "'zd irxxv hsyy vqpwp jxqlf lnzp'",
            "'euqsm ekxz fyzv elkdbp xwbvzb zwqji'",
            "'sigvu flkh osqk rktjo snuytn dfepqr'",
            "'nqgs wjrwjv wz njm zajqi nf'",
            "'jyuez ri kv'",
            "'jieomq irrvsy xbrvye'",
            "'kuv blsg yyrl gflt okqms'",
            "'lxcn omqlgg fahg itx eh sjzvef'",
            "'nwu nrilh bpg wze ahpigy mdtp'",
            "'sv bqzsge xksz cq fykdmb yxse'",
        ),
    ),
    SeedProgram(
        name='prefix_max',
        program=(
            'def f(nums):\n'
            '    best = None\n'
            '    out = []\n'
            '    for x in nums:\n'
            '        if best is None or x > best:\n'
            '            best = x\n'
            '        out.append(best)\n'
            '    return out\n'
        ),
        arg_kinds=('ints',),
        message='running maximum of the list',
        inputs=(
            '[-4, 21, -19, -18]',
            '[10, 32, -39, 22, 6]',
            '[32, 23, -29, 18, 4, -23, 10, -40]',
            '[-43, -44, -37, -23, 48, -21, -24]',
            '[5, 46, 25, 30]',
            '[18, -14, -8, -23, 35]',
            '[-32, 23, -1, -36, 45]',
            '[-31, 11, 5, -17, -37]',
            '[48, -13, -10, 43, 46, -20]',
            '[-21, 42, 46, -36]',
        ),
        outputs=(
            '[-4, 21, 21, 21]',
            '[10, 32, 32, 32, 32]',
            '[32, 32, 32, 32, 32, 32, 32, 32]',
            '[-43, -43, -37, -23, 48, 48, 48]',
            '[5, 46, 46, 46]',
            '[18, 18, 18, 18, 35]',
            '[-32, 23, 23, 23, 45]',
            '[-31, 11, 11, 11, 11]',
            '[48, 48, 48, 48, 48, 48]',
            '[-21, 42, 46, 46]',
        ),
    ),
    SeedProgram(
        name='caesar',
        program=(
            'def f(text, shift):\n'
            '    out = []\n'
            '    for ch in text:\n'
            "        if 'a' <= ch <= 'z':\n"
            '            out.append(chr((ord(ch) - 97 + shift) % 26 + 97))\n'
            '        else:\n'
            '            out.append(ch)\n'
            "    return ''.join(out)\n"
        ),
        arg_kinds=('letters', 'smallint'),
        message='shifts lowercase letters forward in the alphabet',
        inputs=(
            "'aklfqjtphlww', 8",
            "'okgfxiemca', 3",
            "'qdpshtezys', 4",
            "'hdgclr', 8",
            "'vryqrws', 5",
            "'eboobnjj', 7",
            "'osbszcryxpc', 5",
            "'cxpmrxrvlxdg', 1",
            "'ligom', 2",
            "'kwzuyjnxnbso', 4",
        ),
        outputs=(
            "'istnyrbxptee'",
            "'rnjialhpfd'",
            "'uhtwlxidcw'",
            "'ploktz'",
            "'awdvwbx'",
            "'livviuqq'",
            "'txgxehwdcuh'",
            "'dyqnsyswmyeh'",
            "'nkiqo'",
            "'oadycnrbrfws'",
        ),
    ),
    SeedProgram(
        name='digital_root',
        program=(
            'def digit_sum(n):\n'
            '    return sum(int(d) for d in str(abs(n)))\n'
            '\n'
            '\n'
            'def f(n):\n'
            '    while n >= 10:\n'
            '        n = digit_sum(n)\n'
            '    return n\n'
        ),
        arg_kinds=('bigint',),
        message='repeatedly sums the digits until one digit is left',
        inputs=(
            '387541019815',
            '872752048520',
            '535695590372',
            '278093582833',
            '940705487132',
            '827816887049',
            '39159797674',
            '825794404395',
            '621408342828',
            '884084356019',
        ),
        outputs=(
            '7',
            '5',
            '5',
            '4',
            '5',
            '5',
            '4',
            '6',
            '3',
            '2',
        ),
    ),
    SeedProgram(
        name='run_length',
        program=(
            'def f(s):\n'
            "    result = ''\n"
            '    i = 0\n'
            '    while i < len(s):\n'
            '        j = i\n'
            '        while j < len(s) and s[j] == s[i]:\n'
            '            j += 1\n'
            '        result += s[i] + str(j - i)\n'
            '        i = j\n'
            '    return result\n'
        ),
        arg_kinds=('runs',),
        message='run-length encoding: each character followed by its run length',
        inputs=(
            "'bbbbbbbb'",
            "'cccccccc'",
            "'aaaabbb'",
            "'ccaaaa'",
            "'ccccabbbb'",
            "'cccbbbb'",
            "'cbbbbcccc'",
            "'ccccaa'",
            "'aaaacc'",
            "'aaaaaa'",
        ),
        outputs=(
            "'b8'",
            "'c8'",
            "'a4b3'",
            "'c2a4'",
            "'c4a1b4'",
            "'c3b4'",
            "'c1b4c4'",
            "'c4a2'",
            "'a4c2'",
            "'a6'",
        ),
    ),
)


def seed_tasks(induction_inputs: int, hand_seeds: str = "all") -> list[Task]:
    """The initial buffer contents (see the module docstring): every seed program (``hand_seeds='all'``) or
    only the identity (``'identity'``: AZR's single zero triplet; ``EnvConfig.hand_seeds``)."""
    if hand_seeds not in ("all", "identity"):
        raise ValueError(f"hand_seeds must be 'all' or 'identity', got {hand_seeds!r}")
    tasks: list[Task] = []
    programs = SEED_PROGRAMS if hand_seeds == "all" else SEED_PROGRAMS[:1]
    for i, seed in enumerate(programs):
        tasks.append(
            Task(f"seed-deduction-{i}", TaskType.DEDUCTION, seed.program, seed.inputs[:1], seed.outputs[:1])
        )
        tasks.append(
            Task(f"seed-abduction-{i}", TaskType.ABDUCTION, seed.program, seed.inputs[1:2], seed.outputs[1:2])
        )
        n = min(induction_inputs, len(seed.inputs))
        tasks.append(
            Task(
                f"seed-induction-{i}",
                TaskType.INDUCTION,
                seed.program,
                seed.inputs[:n],
                seed.outputs[:n],
                message=seed.message,
            )
        )
    return tasks


def _docstring_nodes(tree: ast.AST) -> list[ast.Expr]:
    """The docstrings of the module, classes and functions that have other statements too."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and len(node.body) > 1:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.append(first)
    return out


def _without_docstrings(tree: ast.Module) -> str:
    for doc in _docstring_nodes(tree):
        doc.value = ast.Constant(None)  # a marker removed below, so that dumps compare bodies without it
    return ast.dump(tree).replace("Expr(value=Constant(value=None)), ", "")


def strip_comments_and_docstrings(program: str) -> str:
    """``program`` without its comments and docstrings, as AZR's seeding stores programs (docs/azr.md §7).

    Comments are removed token by token (a ``#`` inside a string is not a comment) and lines left empty by them
    are dropped; a docstring is removed when its body has other statements (a body holding only a docstring
    keeps it, so the program stays valid). Nothing is executed. The result is checked to parse into the same
    program as the input minus its docstrings; when it does not (or the program does not parse, or reads
    ``__doc__``), ``program`` is returned unchanged."""
    try:
        tree = ast.parse(program)
        lines = program.splitlines(keepends=True)
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(program).readline)
                    if tok.type == tokenize.COMMENT]
        if "__doc__" in program:
            return program
        drop: set[int] = set()
        for doc in _docstring_nodes(tree):
            start, end = doc.lineno - 1, (doc.end_lineno or doc.lineno) - 1
            before = lines[start][: doc.col_offset]
            after = lines[end][doc.end_col_offset or 0:]
            if before.strip() or after.split("#")[0].strip():  # shares a line with code: leave it
                continue
            drop.update(range(start, end + 1))
        for row, col in comments:
            line = lines[row - 1]
            kept = line[:col].rstrip()
            if not kept:
                drop.add(row - 1)
            else:
                lines[row - 1] = kept + ("\n" if line.endswith("\n") else "")
        out = "".join(line for i, line in enumerate(lines) if i not in drop)
        if _without_docstrings(ast.parse(out)) != _without_docstrings(tree):
            return program
        return out
    except (SyntaxError, ValueError, tokenize.TokenError, IndentationError, RecursionError, MemoryError):
        return program
