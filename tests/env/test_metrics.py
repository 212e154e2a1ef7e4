"""Program metrics, coverage fingerprints (definitions in docs/method.md §10) and the round summary."""

from __future__ import annotations

import pytest

from populora_env.metrics import (
    CoverageTracker,
    ast_depth,
    cyclomatic_complexity,
    lines_of_code,
    program_fingerprint,
    round_summary,
    summarize,
    variable_count,
)
from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundResults

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


def _round() -> RoundResults:
    """Two teachers, two students: t0 proposes a valid deduction and a duplicate abduction, t1 a format error;
    s0 attempts t0's task twice (one right) and a filler task once, s1 nothing."""
    proposals = (
        ProposalResult("t0", 0, "deduction", "r3-t0-0", True, True, None),
        ProposalResult("t0", 1, "abduction", "r3-t0-1", True, False, "duplicate"),
        ProposalResult("t1", 0, "deduction", "r3-t1-0", False, False, "format"),
    )
    attempts = (
        AttemptResult("s0", 0, "r3-t0-0", "deduction", "t0", True, True, None),
        AttemptResult("s0", 1, "r3-t0-0", "deduction", "t0", True, False, "wrong"),
        AttemptResult("s0", 2, "seed-7", "abduction", None, False, False, "format"),
    )
    matches = (
        MatchResult("t0", "s0", 0.5, 0.5, 1, 2, 1, "draw"),
        MatchResult("t1", "s1", 0.25, None, 0, 0, 0, "teacher"),
    )
    return RoundResults(3, ("t0", "t1"), ("s0", "s1"), proposals, attempts, matches)


def test_round_summary_counts_and_means() -> None:
    rewards = {"t0": [1.0, -0.5], "t1": [-1.0], "s0": [1.0, 0.0, -1.0], "s1": []}
    coverage = CoverageTracker()
    s = round_summary(_round(), rewards, reward_scheme="populora", task_types=["deduction", "abduction"],
                      programs=[IDENTITY], signatures=["(str) -> str"], coverage=coverage,
                      ratings={"t0": {"mu": 25.0}}, buffer_sizes={"deduction": 24, "abduction": 23})
    assert (s["round"], s["reward_scheme"]) == (3, "populora")
    assert s["pairs"][0] == {"teacher": "t0", "student": "s0", "p_ts": 0.5, "p_hat": 0.5, "n_valid": 1,
                             "n_attempts": 2, "n_correct": 1, "outcome": "draw"}
    assert [p["outcome"] for p in s["pairs"]] == ["draw", "teacher"]
    assert s["proposals"] == {"total": 3, "valid": 1, "format_errors": 1,
                              "reasons": {"duplicate": 1, "format": 1},
                              "by_type": {"deduction": {"total": 2, "valid": 1}, "abduction": {"total": 1, "valid": 0}}}
    assert s["attempts"] == {"total": 3, "correct": 1, "format_errors": 1, "matched": 2,
                             "reasons": {"format": 1, "wrong": 1},
                             "by_type": {"deduction": {"total": 2, "correct": 1}, "abduction": {"total": 1, "correct": 0}}}
    assert s["metrics"]["n_programs"] == 1 and s["metrics"]["loc_mean"] == 2.0
    assert s["metrics"]["coverage_programs"] == 1 and s["metrics"]["coverage_signatures"] == 1
    assert coverage.n_programs == 1  # the run's tracker was updated
    assert s["ratings"] == {"t0": {"mu": 25.0}} and s["buffer_sizes"] == {"deduction": 24, "abduction": 23}
    # per role: the mean over every completion of the role's agents (t: 3 values, s: 3 values, s1 has none)
    assert s["mean_reward"] == {"teacher": pytest.approx(-0.5 / 3), "student": 0.0}
    empty = round_summary(RoundResults(0, ("t0",), ("s0",), (), (), ()), {"t0": [], "s0": []},
                          reward_scheme="azr", task_types=["induction"], programs=[], signatures=[],
                          coverage=CoverageTracker(), ratings={}, buffer_sizes={})
    assert empty["mean_reward"] == {"teacher": 0.0, "student": 0.0} and empty["metrics"]["ast_depth_mean"] == 0.0
