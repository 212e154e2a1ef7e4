"""Reward registry and the built-in schemes, pinned on hand-made round results."""

from __future__ import annotations

import pytest

from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundResults
from populora_env.rewards import (
    compute_rewards,
    get_reward_scheme,
    list_reward_schemes,
    register_reward_scheme,
    unregister_reward_scheme,
)


def make_results(correct_by_task: dict[str, list[bool]], invalid: int = 0) -> RoundResults:
    """One teacher, one student; each valid task gets the listed attempts; plus ``invalid`` bad proposals;
    plus one filler attempt (correct) that must not count towards p̂."""
    proposals = [
        ProposalResult("teacher_0", i, "deduction", task_id, True, True, None)
        for i, task_id in enumerate(correct_by_task)
    ]
    proposals += [
        ProposalResult("teacher_0", len(proposals) + j, "abduction", f"bad{j}", j % 2 == 0, False, "error")
        for j in range(invalid)
    ]
    attempts = []
    for task_id, outcomes in correct_by_task.items():
        for ok in outcomes:
            attempts.append(AttemptResult("student_0", len(attempts), task_id, "deduction", "teacher_0", True, ok,
                                          None if ok else "wrong"))
    attempts.append(AttemptResult("student_0", len(attempts), "seed-deduction-0", "deduction", None, True, True, None))
    attempts.append(AttemptResult("student_0", len(attempts), "seed-deduction-0", "deduction", None, False, False,
                                  "format"))
    match = MatchResult("teacher_0", "student_0", 0.5, None, len(correct_by_task), 0, 0, "draw")
    return RoundResults(0, ("teacher_0",), ("student_0",), tuple(proposals), tuple(attempts), (match,))


def test_registry() -> None:
    assert {"populora", "azr"} <= set(list_reward_schemes())
    with pytest.raises(ValueError, match="already registered"):
        register_reward_scheme("populora")(lambda results: {})
    with pytest.raises(ValueError, match="unknown reward scheme"):
        get_reward_scheme("nope")

    @register_reward_scheme("test_zero")
    def zero(results: RoundResults) -> dict[str, list[float]]:
        return {a: [0.0] * results.n_completions(a) for a in results.agents}

    try:
        assert get_reward_scheme("test_zero") is zero
    finally:
        unregister_reward_scheme("test_zero")
    assert "test_zero" not in list_reward_schemes()


def test_populora_values() -> None:
    results = make_results({"all": [True] * 4, "none": [False] * 4, "quarter": [True, False, False, False]},
                           invalid=2)
    rewards = compute_rewards(get_reward_scheme("populora"), results)
    assert rewards["teacher_0"] == [0.0, 0.0, 0.75, -1.0, -1.0]
    assert rewards["student_0"] == [1.0] * 4 + [-0.5] * 4 + [1.0, -0.5, -0.5, -0.5] + [1.0, -1.0]
    assert results.solve_rate("quarter") == 0.25 and results.solve_rate("seed-deduction-0") is None


def test_azr_values_and_extreme_flag() -> None:
    results = make_results({"all": [True] * 4, "none": [False] * 4, "quarter": [True, False, False, False]},
                           invalid=1)
    scheme = get_reward_scheme("azr")
    assert compute_rewards(scheme, results)["teacher_0"] == [0.0, 0.0, 0.75, -1.0]
    assert compute_rewards(scheme, results, {"extreme_reward": -0.5})["teacher_0"] == [-0.5, -0.5, 0.75, -1.0]
    assert compute_rewards(scheme, results)["student_0"] == compute_rewards(
        get_reward_scheme("populora"), results)["student_0"]


def test_compute_rewards_rejects_malformed_scheme_output() -> None:
    results = make_results({"a": [True]})
    with pytest.raises(ValueError, match="completions"):
        compute_rewards(lambda r: {"teacher_0": [], "student_0": []}, results)
    with pytest.raises(ValueError, match="unknown agents"):
        compute_rewards(lambda r: {"ghost": []}, results)
    with pytest.raises(ValueError, match="non-finite"):
        compute_rewards(lambda r: {"teacher_0": [float("nan")], "student_0": [0.0] * 3}, results)
    with pytest.raises(ValueError, match="mapping"):
        compute_rewards(lambda r: [1.0], results)


def test_a_bool_or_a_string_reward_is_refused_naming_the_scheme() -> None:
    """A bool is an int to Python, yet never a reward; a string is not a number. The error names the scheme by
    its ``name`` attribute, else its function name, else its type."""
    results = make_results({"a": [True]})

    class Named:
        name = "named_scheme"

        def __call__(self, r):
            return {"teacher_0": [True], "student_0": [0.0] * 3}

    class Anonymous:
        def __call__(self, r):
            return {"teacher_0": ["0.5"], "student_0": [0.0] * 3}

    def plain_function(r):
        return {"teacher_0": [0.0], "student_0": [0.0, False, 0.0]}

    with pytest.raises(ValueError, match=r"'named_scheme' returned True \(bool\) as a reward for teacher_0"):
        compute_rewards(Named(), results)
    with pytest.raises(ValueError, match=r"'Anonymous' returned '0.5' \(str\) as a reward for teacher_0"):
        compute_rewards(Anonymous(), results)
    with pytest.raises(ValueError, match=r"'plain_function' returned False \(bool\) as a reward for student_0"):
        compute_rewards(plain_function, results)
    assert compute_rewards(lambda r: {"teacher_0": [1], "student_0": [0.5, 0, -1]}, results)["student_0"] == [
        0.5, 0.0, -1.0]
