"""Program metrics and coverage fingerprints (definitions in docs/method.md §10)."""

from __future__ import annotations

from populora_env.metrics import (
    CoverageTracker,
    ast_depth,
    cyclomatic_complexity,
    lines_of_code,
    program_fingerprint,
    summarize,
    variable_count,
)

IDENTITY = "def f(a):\n    return a\n"
BRANCHY = """
# comment line

def helper(v):
    return v if v > 0 else -v


def f(xs, k):
    total = 0
    for x in xs:
        if x > k and x % 2 == 0 or x == 7:
            total += helper(x)
    try:
        ratio = total / k
    except ZeroDivisionError as err:
        ratio = 0
    return [y for y in xs if y] , ratio
"""


def test_ast_depth() -> None:
    # Module(1) > FunctionDef(2) > Return(3) > Name(4) > Load(5)
    assert ast_depth(IDENTITY) == 5
    assert ast_depth("x = (") == 0


def test_cyclomatic_complexity() -> None:
    assert cyclomatic_complexity(IDENTITY) == 1
    # helper: 1 + IfExp = 2; f: 1 + For + If + BoolOp(or: 1) + BoolOp(and: 1) + ExceptHandler
    #    + comprehension + its if = 8
    assert cyclomatic_complexity(BRANCHY) == 2 + 8


def test_lines_of_code_and_variables() -> None:
    assert lines_of_code(IDENTITY) == 2
    assert lines_of_code(BRANCHY) == 12
    assert variable_count(IDENTITY) == 1
    # v, xs, k, total, x, ratio, err, y
    assert variable_count(BRANCHY) == 8


def test_fingerprint_alpha_renaming() -> None:
    a = "def f(nums):\n    '''doc'''\n    total = 0  # c\n    for n in nums:\n        total += n * 2\n    return total\n"
    b = "def f(xs):\n    acc = 0\n    for v in xs:\n        acc += v * 3\n    return acc\n"
    c = "def f(xs):\n    acc = 0\n    for v in xs:\n        acc -= v * 3\n    return acc\n"
    d = "def f(xs):\n    return len(xs)\n"
    e = "def f(xs):\n    return sum(xs)\n"
    assert program_fingerprint(a) == program_fingerprint(b)
    assert len({program_fingerprint(p) for p in (a, c, d, e)}) == 4
    assert program_fingerprint("def (") is None


def test_coverage_is_cumulative() -> None:
    tracker = CoverageTracker()
    first = tracker.update([IDENTITY, IDENTITY.replace("a", "b")], ["(str) -> str"])
    assert first["distinct_programs_round"] == 1 and first["coverage_programs"] == 1
    second = tracker.update([BRANCHY], ["(str) -> str", "(list[int], int) -> tuple[float|list[int]]"])
    assert second["new_programs"] == 1 and second["coverage_programs"] == 2
    assert second["new_signatures"] == 1 and second["coverage_signatures"] == 2
    restored = CoverageTracker()
    restored.load_state_dict(tracker.state_dict())
    assert restored.update([IDENTITY], [])["new_programs"] == 0


def test_summarize() -> None:
    s = summarize([IDENTITY, BRANCHY])
    assert s["n_programs"] == 2 and s["cyclomatic_max"] == 10 and s["loc_mean"] == 7.0
    assert summarize([])["n_programs"] == 0
