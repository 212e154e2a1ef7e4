"""Shipped seed tasks: 13 small hand-written programs (AZR's identity zero triplet first) and input generators.

Every seed has ten inputs; the outputs were computed in the sandbox (two runs each, as in validation) and are
re-verified by ``tests/env/test_seeds.py``. The buffers start with:

- deduction: each program with its first input;
- abduction: each program with its second input;
- induction: each program with its first ``induction_inputs`` inputs (at most ten) and its message.

``arg_kinds`` name the generators in :data:`ARG_GENERATORS`; :class:`populora_env.policies.SeedTeacher` uses
them to propose fresh inputs for the seed programs.
"""

from __future__ import annotations

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
        name='char_counts',
        program=(
            'def f(text):\n'
            '    counts = {}\n'
            '    for ch in text:\n'
            '        counts[ch] = counts.get(ch, 0) + 1\n'
            '    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))\n'
        ),
        arg_kinds=('letters',),
        message='character counts, most frequent first, ties alphabetical',
        inputs=(
            "'tjwvrwtdk'",
            "'jimnvpszjggw'",
            "'tynxitrdi'",
            "'zartc'",
            "'dixxk'",
            "'ywyluiagjxq'",
            "'xhaaifzy'",
            "'dkqpcdfzxv'",
            "'yewgvchz'",
            "'bamzzebgcrxb'",
        ),
        outputs=(
            "[('t', 2), ('w', 2), ('d', 1), ('j', 1), ('k', 1), ('r', 1), ('v', 1)]",
            "[('g', 2), ('j', 2), ('i', 1), ('m', 1), ('n', 1), ('p', 1), ('s', 1), ('v', 1), ('w', 1), ('z', 1)]",
            "[('i', 2), ('t', 2), ('d', 1), ('n', 1), ('r', 1), ('x', 1), ('y', 1)]",
            "[('a', 1), ('c', 1), ('r', 1), ('t', 1), ('z', 1)]",
            "[('x', 2), ('d', 1), ('i', 1), ('k', 1)]",
            "[('y', 2), ('a', 1), ('g', 1), ('i', 1), ('j', 1), ('l', 1), ('q', 1), ('u', 1), ('w', 1), ('x', 1)]",
            "[('a', 2), ('f', 1), ('h', 1), ('i', 1), ('x', 1), ('y', 1), ('z', 1)]",
            "[('d', 2), ('c', 1), ('f', 1), ('k', 1), ('p', 1), ('q', 1), ('v', 1), ('x', 1), ('z', 1)]",
            "[('c', 1), ('e', 1), ('g', 1), ('h', 1), ('v', 1), ('w', 1), ('y', 1), ('z', 1)]",
            "[('b', 3), ('z', 2), ('a', 1), ('c', 1), ('e', 1), ('g', 1), ('m', 1), ('r', 1), ('x', 1)]",
        ),
    ),
    SeedProgram(
        name='collatz',
        program=(
            'def f(n):\n'
            '    steps = 0\n'
            '    while n != 1 and steps < 500:\n'
            '        n = n // 2 if n % 2 == 0 else 3 * n + 1\n'
            '        steps += 1\n'
            '    return steps\n'
        ),
        arg_kinds=('posint',),
        message='number of Collatz steps to reach 1 (at most 500)',
        inputs=(
            '534889',
            '414481',
            '274571',
            '713495',
            '393175',
            '236270',
            '598794',
            '324415',
            '241397',
            '513950',
        ),
        outputs=(
            '71',
            '68',
            '176',
            '123',
            '161',
            '49',
            '203',
            '184',
            '212',
            '138',
        ),
    ),
    SeedProgram(
        name='stack_machine',
        program=(
            'class Stack:\n'
            '    def __init__(self):\n'
            '        self.items = []\n'
            '\n'
            '    def push(self, x):\n'
            '        self.items.append(x)\n'
            '\n'
            '    def pop(self):\n'
            '        return self.items.pop() if self.items else 0\n'
            '\n'
            '\n'
            'def f(ops):\n'
            '    stack = Stack()\n'
            '    for op in ops:\n'
            '        if op >= 0:\n'
            '            stack.push(op)\n'
            '        else:\n'
            '            stack.push(stack.pop() + stack.pop())\n'
            '    return stack.items\n'
        ),
        arg_kinds=('ints',),
        message='a stack: non-negative numbers are pushed, a negative number adds the top two',
        inputs=(
            '[23, 33, 15, -22, -29]',
            '[23, 16, -21]',
            '[2, -36, 21, -44, -33, 0, 8]',
            '[17, 4, 1, -1]',
            '[-38, 14, 32, 9, -50, 1]',
            '[15, -36, -49, -17]',
            '[-31, 37, -48, 39, 5, -14]',
            '[-9, -28, 8]',
            '[14, -22, -15]',
            '[-47, 35, 42, -19, -4, -38, -50]',
        ),
        outputs=(
            '[71]',
            '[39]',
            '[23, 0, 8]',
            '[17, 5]',
            '[0, 14, 41, 1]',
            '[15]',
            '[37, 44]',
            '[0, 8]',
            '[14]',
            '[77]',
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
        name='window_sums',
        program=(
            'def f(nums, k):\n'
            '    k = max(1, k)\n'
            '    return [sum(nums[i:i + k]) for i in range(len(nums) - k + 1)]\n'
        ),
        arg_kinds=('ints', 'smallint'),
        message='sums of every window of k consecutive numbers',
        inputs=(
            '[44, -38, -12, -18, -21, -28], 5',
            '[27, -25, 22, -8, -31, -6], 2',
            '[0, 19, 38, -18, -1], 0',
            '[43, -24, -21, -19, -20, -21], 3',
            '[-48, -14, -41, 10, 39, -41, -43, 26], 4',
            '[-25, 7, 46, -34, 39, 19, 6, 31], 4',
            '[-3, -35, -39, -18, -28, -47], 6',
            '[0, 14, -15, -21, 15, 44], 8',
            '[-6, -5, -47, 7], 3',
            '[20, -24, 34, -14, -37, -46], 3',
        ),
        outputs=(
            '[-45, -117]',
            '[2, -3, 14, -39, -37]',
            '[0, 19, 38, -18, -1]',
            '[-2, -64, -60, -60]',
            '[-93, -6, -33, -35, -19]',
            '[-6, 58, 70, 30, 95]',
            '[-170]',
            '[]',
            '[-58, -45]',
            '[30, -4, -17, -97]',
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
    SeedProgram(
        name='group_by_length',
        program=(
            'def f(words):\n'
            '    table = {}\n'
            '    for w in words:\n'
            '        table.setdefault(len(w), []).append(w)\n'
            '    return {k: sorted(v) for k, v in sorted(table.items())}\n'
        ),
        arg_kinds=('wordlist',),
        message='groups the words by length, each group sorted',
        inputs=(
            "['d', 'imitd', 'dijyiv', 'cr']",
            "['byyy', 'g', 'mkanqv', 'xvww', 'n']",
            "['k', 'jkq', 'jz', 'fbsrgs']",
            "['focnz', 'fqlp', 'fv', 'qc']",
            "['tb', 'rf', 'naxs']",
            "['jppefb', 'segyi', 'vmihb', 'yjuw']",
            "['p', 'u', 'h', 'zngdg', 'zz']",
            "['fnh', 'cf', 'pwwnhq']",
            "['fg', 'uo', 'ro', 'abduly']",
            "['ey', 'uuu', 'ncpdf', 'fn', 'j']",
        ),
        outputs=(
            "{1: ['d'], 2: ['cr'], 5: ['imitd'], 6: ['dijyiv']}",
            "{1: ['g', 'n'], 4: ['byyy', 'xvww'], 6: ['mkanqv']}",
            "{1: ['k'], 2: ['jz'], 3: ['jkq'], 6: ['fbsrgs']}",
            "{2: ['fv', 'qc'], 4: ['fqlp'], 5: ['focnz']}",
            "{2: ['rf', 'tb'], 4: ['naxs']}",
            "{4: ['yjuw'], 5: ['segyi', 'vmihb'], 6: ['jppefb']}",
            "{1: ['h', 'p', 'u'], 2: ['zz'], 5: ['zngdg']}",
            "{2: ['cf'], 3: ['fnh'], 6: ['pwwnhq']}",
            "{2: ['fg', 'ro', 'uo'], 6: ['abduly']}",
            "{1: ['j'], 2: ['ey', 'fn'], 3: ['uuu'], 5: ['ncpdf']}",
        ),
    ),
    SeedProgram(
        name='fib_mod',
        program=(
            'def f(n, m):\n'
            '    a, b = 0, 1\n'
            '    for _ in range(n % 200):\n'
            '        a, b = b, (a + b) % m\n'
            '    return a\n'
        ),
        arg_kinds=('posint', 'posint'),
        message='the (n mod 200)-th Fibonacci number modulo m',
        inputs=(
            '906220, 920236',
            '684335, 888689',
            '826887, 172693',
            '703757, 502524',
            '807313, 967804',
            '916477, 246769',
            '553047, 39033',
            '645007, 837445',
            '565180, 465344',
            '736396, 617630',
        ),
        outputs=(
            '6765',
            '107841',
            '104651',
            '26369',
            '373889',
            '222800',
            '23113',
            '13',
            '136048',
            '261417',
        ),
    ),
)


def seed_tasks(induction_inputs: int) -> list[Task]:
    """The initial buffer contents (see the module docstring)."""
    tasks: list[Task] = []
    for i, seed in enumerate(SEED_PROGRAMS):
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
