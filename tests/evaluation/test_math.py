"""Math answer extraction and math-verify equivalence, pinned on hand-made cases and the real data files."""

from __future__ import annotations

import threading

import pytest

from evaluation import math_check
from evaluation.data import MATH_BENCHMARKS, _read_jsonl, data_file, last_boxed, load_math
from evaluation.math_check import extract_math_answer, is_equivalent, score_math


@pytest.fixture(autouse=True)
def _time_enough_for_sympy(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's timeout is wall-clock (``signal.alarm``), and a timeout reads as "not equal": on a loaded
    machine sympy passed the 5 s of ``TIMEOUT_S`` on ``1/(2n+2)`` vs ``1/(2(n+1))`` (in a suite at load 20-30).
    What these tests pin is the math, so they give sympy time enough; the setting itself is unchanged."""
    monkeypatch.setattr(math_check, "TIMEOUT_S", 120)

# --- extraction -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "benchmark", "expected"),
    [
        ("so $x = 2$ and the result is \\boxed{\\frac{1}{2}}.", None, "\\frac{1}{2}"),
        ("first \\boxed{3} then corrected: \\boxed{4}", None, "4"),  # the LAST box
        ("nested \\boxed{\\frac{\\sqrt{3}}{2}} done", None, "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{7}", None, "7"),
        ("\\boxed 5 is it", None, "5"),
        ("Adding them up, the answer is 42.", None, "42"),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", None, "\\frac{3}{4}"),
        ("The answer is 3.5 dollars.", None, "3.5 dollars"),  # a decimal point is not a sentence end
        ("Answer: 17", None, "17"),
        ("She pays 2 + 3 = 5 per day\n#### 1,234", "gsm8k", "1,234"),
        ("<think>maybe 3</think> <answer>\\boxed{9}</answer>", None, "9"),
        ("<think>...</think><answer>12</answer>", None, "12"),
        ("he has 3 apples, then 5 more, so 8 in total", "gsm8k", "8"),  # last-number fallback (GSM8K only)
        ("he has 3 apples, then 5 more, so 8 in total", "math500", None),
        ("-1,250.5 is left", "gsm8k", "-1250.5"),
        ("", None, None),
        ("no digits at all", "gsm8k", None),
    ],
)
def test_extract_answer(text: str, benchmark: str | None, expected: str | None) -> None:
    assert extract_math_answer(text, benchmark) == expected


def test_last_boxed_unbalanced_returns_none() -> None:
    assert last_boxed("\\boxed{1 + {2}") is None
    assert last_boxed("nothing boxed") is None


# --- equivalence ------------------------------------------------------------------------------------------

EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),  # fraction vs decimal
    ("\\frac{1}{2}", "1/2"),
    ("\\frac{1}{2}", "\\dfrac12"),
    ("1.6", "1.60"),
    ("18", "18.0"),
    ("27.0", "27"),  # AMC golds are floats
    ("1000", "1,000"),  # thousands separators
    ("1000", "1{,}000"),
    ("\\sqrt{2}", "1.41421356"),  # symbolic vs numeric within 6 decimals
    ("\\pi", "3.14159265358979"),
    ("2^{1009}", "2^{1009}"),
    ("\\frac{1}{2 n+2}", "\\frac{1}{2(n+1)}"),  # algebraic simplification
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),  # tuples
    ("10\\%", "0.1"),  # percentages
    ("69,84", "84, 69"),  # multiple answers, any order
    ("1,3,5", "1, 3, 5"),
    ("(1,8,19), (2,7,13), (4,5,7)", "(4,5,7),(1,8,19),(2,7,13)"),
    ("[1,2)", "[1,2)"),  # intervals
    ("x=2", "2"),  # an assignment vs its value
    ("90^\\circ", "90"),
    ("18", "\\$18"),  # currency
    ("5", "5\\text{ cm}"),  # LaTeX unit
    ("5", "5 \\mathrm{~cm}"),
    ("18", "18 dollars"),  # plain-word unit (stripped by our fallback)
    ("$\\frac{1}{2 n+2}$", "\\frac{1}{2n+2}"),  # OlympiadBench golds carry $...$
]
NOT_EQUIVALENT = [
    ("\\frac{1}{2}", "0.51"),
    ("1.6", "1.7"),
    ("3", "4"),
    ("\\sqrt{2}", "1.414"),  # too coarse
    ("69,84", "69"),  # one of two answers is not enough
    ("1,3,5", "1,3"),
    ("[1,2)", "(1,2)"),  # open vs half-open interval
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(\\frac{\\pi}{2}, 3)"),  # tuple order matters
    ("18", "eighteen dollars and 5"),
    ("2^{1009}", "2^{1008}"),
    ("x^2+1", "x^2-1"),
]


@pytest.mark.parametrize(("gold", "pred"), EQUIVALENT)
def test_equivalent_forms(gold: str, pred: str) -> None:
    assert is_equivalent(gold, pred)


@pytest.mark.parametrize(("gold", "pred"), NOT_EQUIVALENT)
def test_non_equivalent_forms(gold: str, pred: str) -> None:
    assert not is_equivalent(gold, pred)


def test_dataset_unit_may_be_omitted_or_given() -> None:
    assert is_equivalent("4", "4 km/h", unit="km/h")
    assert is_equivalent("4", "4", unit="km/h")
    assert not is_equivalent("4", "5 km/h", unit="km/h")


def test_missing_or_empty_prediction_is_wrong() -> None:
    assert not is_equivalent("3", None)
    assert not is_equivalent("3", "   ")
    assert not is_equivalent("3", "\\boxed{")  # unparseable: not equal, no exception


def test_any_of_several_golds() -> None:
    assert is_equivalent(["7", "\\frac{1}{2}"], "0.5")
    assert not is_equivalent(["7", "\\frac{1}{2}"], "0.25")


def test_equivalence_outside_the_main_thread() -> None:
    """math-verify's signal-based timeouts only work in the main thread; elsewhere they are switched off
    instead of raising."""
    out: dict[str, bool] = {}

    def work() -> None:
        out["eq"] = is_equivalent("\\frac{1}{2}", "0.5")
        out["neq"] = is_equivalent("\\frac{1}{2}", "0.6")

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert out == {"eq": True, "neq": False}


# --- real data ----------------------------------------------------------------------------------------------

EXPECTED_COUNTS = {
    "gsm8k": 1319,
    "math500": 500,
    "minerva": 272,
    "olympiadbench": 675,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
}


@pytest.mark.parametrize("bench", MATH_BENCHMARKS)
def test_math_files_load_with_golds(bench: str, data_dir) -> None:
    problems = load_math(bench, data_dir)
    assert len(problems) == EXPECTED_COUNTS[bench]
    assert len({p.task_id for p in problems}) == len(problems)
    assert all(p.question.strip() and p.answers and all(a.strip() for a in p.answers) for p in problems)
    # every gold is equivalent to itself (parses), and a gold-boxed answer scores as correct
    for p in problems[:10]:
        assert score_math(p, f"So the result is \\boxed{{{p.answers[0]}}}.").correct, p.task_id


def test_gold_answer_sources(data_dir) -> None:
    gsm = load_math("gsm8k", data_dir, limit=1)[0]
    assert gsm.answers == ["18"]  # "#### 18"
    amc = load_math("amc23", data_dir, limit=1)[0]
    assert amc.answers == ["27"]  # 27.0 in the file
    minerva = load_math("minerva", data_dir, limit=1)[0]
    assert minerva.answers == ["1.6"]  # the last \boxed{} of the solution
    oly = [p for p in load_math("olympiadbench", data_dir) if p.meta["is_multiple_answer"]][0]
    assert oly.meta["answer_type"] and oly.answers


def test_gsm8k_worked_solutions_score_full_marks(data_dir) -> None:
    """The reference worked solutions (ending in ``#### n``) are correct answers; shifted ones are not."""
    rows = list(_read_jsonl(data_file("gsm8k", data_dir)))[:100]
    problems = load_math("gsm8k", data_dir, limit=100)
    assert all(score_math(p, r["answer"]).correct for p, r in zip(problems, rows, strict=True))
    shifted = rows[1:] + rows[:1]
    wrong = sum(score_math(p, r["answer"]).correct for p, r in zip(problems, shifted, strict=True))
    assert wrong <= 2  # different problems rarely share an answer


def test_math500_solutions_match_answers(data_dir) -> None:
    rows = list(_read_jsonl(data_file("math500", data_dir)))[:60]
    problems = load_math("math500", data_dir, limit=60)
    assert all(score_math(p, r["solution"]).correct for p, r in zip(problems, rows, strict=True))
