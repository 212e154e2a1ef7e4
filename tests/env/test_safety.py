"""The AST safety policy: banned imports, module paths, builtins and escape hatches; no substring matching."""

from __future__ import annotations

import ast

import pytest

from populora_env.safety import check_safety


def verdict(program: str) -> str | None:
    return check_safety(ast.parse(program))


@pytest.mark.parametrize(
    "program",
    [
        "import os\ndef f(x):\n    return x",
        "import os.path\ndef f(x):\n    return x",
        "from os import path\ndef f(x):\n    return x",
        "import numpy.random\ndef f(x):\n    return x",
        "from numpy import random\ndef f(x):\n    return x",
        "import numpy as np\ndef f(x):\n    return float(np.random.rand())",
        "import random\ndef f(x):\n    return random.random()",
        "from time import time\ndef f(x):\n    return time()",
        "import datetime\ndef f(x):\n    return x",
        "import secrets\ndef f(x):\n    return x",
        "import uuid\ndef f(x):\n    return str(uuid.uuid4())",
        "import subprocess\ndef f(x):\n    return x",
        "def f(x):\n    return __import__('random').random()",
        "def f(x):\n    return eval('1')",
        "def f(x):\n    exec('y = 1')\n    return x",
        "def f(x):\n    return open('/etc/passwd').read()",
        "def f(x):\n    return input()",
        "def f(x):\n    return id(x)",
        "def f(x):\n    return hash(x)",
        "def f(x):\n    return globals()",
        "def f(x):\n    return ().__class__.__base__.__subclasses__()",
        "def f(x):\n    return f.__globals__",
        "def f(x):\n    return __builtins__",
        "def f(x):\n    __populora_plain__ = 1\n    return x",
        "from . import thing\ndef f(x):\n    return x",
    ],
)
def test_banned(program: str) -> None:
    assert verdict(program) is not None


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
