"""The AST safety policy: banned imports, module paths, builtins and escape hatches; no substring matching."""

from __future__ import annotations

import ast

import pytest

from populora_env.safety import check_safety


def verdict(program: str) -> str | None:
    return check_safety(ast.parse(program))


@pytest.mark.parametrize(
    ("program", "offender"),
    [
        ("import os\ndef f(x):\n    return x", "os"),
        ("import os.path\ndef f(x):\n    return x", "os.path"),
        ("from os import path\ndef f(x):\n    return x", "os"),
        ("import numpy.random\ndef f(x):\n    return x", "numpy.random"),
        ("from numpy import random\ndef f(x):\n    return x", "numpy.random"),
        ("import numpy as np\ndef f(x):\n    return float(np.random.rand())", "numpy.random.rand"),
        ("import random\ndef f(x):\n    return random.random()", "random"),
        ("from time import time\ndef f(x):\n    return time()", "time"),
        ("import datetime\ndef f(x):\n    return x", "datetime"),
        ("import secrets\ndef f(x):\n    return x", "secrets"),
        ("import uuid\ndef f(x):\n    return str(uuid.uuid4())", "uuid"),
        ("import subprocess\ndef f(x):\n    return x", "subprocess"),
        ("def f(x):\n    return __import__('random').random()", "__import__"),
        ("def f(x):\n    return eval('1')", "eval"),
        ("def f(x):\n    exec('y = 1')\n    return x", "exec"),
        ("def f(x):\n    return open('/etc/passwd').read()", "open"),
        ("def f(x):\n    return input()", "input"),
        ("def f(x):\n    return id(x)", "id"),
        ("def f(x):\n    return hash(x)", "hash"),
        ("def f(x):\n    return globals()", "globals"),
        ("def f(x):\n    return ().__class__.__base__.__subclasses__()", "__subclasses__"),
        ("def f(x):\n    return f.__globals__", "__globals__"),
        ("def f(x):\n    return __builtins__", "__builtins__"),
        ("def f(x):\n    __populora_plain__ = 1\n    return x", "__populora_plain__"),
        ("from . import thing\ndef f(x):\n    return x", "relative import"),
    ],
)
def test_banned(program: str, offender: str) -> None:
    reason = verdict(program)
    assert reason is not None and offender in reason, reason  # rejected, and for the construct at fault


@pytest.mark.parametrize(
    "program",
    [
        "def parse_input(s):\n    return s\ndef f(x):\n    return parse_input(x)",
        "def f(input):\n    return input + 1",
        "def f(x):\n    id = 3\n    return x + id",
        "import math\nfrom collections import Counter\ndef f(x):\n    return math.floor(len(Counter(x)))",
        "import numpy as np\ndef f(x):\n    return int(np.sum(np.array(x)))",
        "class Node:\n    def __init__(self, v):\n        self.v = v\n    def __eq__(self, o):\n        return True\n"
        "def f(x):\n    return Node(x).v",
        "def f(x):\n    timestamp = 'time'\n    return timestamp",
        "def f(x):\n    if __name__ == '__main__':\n        return 1\n    return 2",
    ],
)
def test_allowed(program: str) -> None:
    assert verdict(program) is None
