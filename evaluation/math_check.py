"""Math answer extraction and equivalence (math-verify), for GSM8K, MATH-500, AIME, AMC, Minerva, OlympiadBench.

Extraction (:func:`extract_math_answer`) looks, in order, for

1. the content of an ``<answer>...</answer>`` block (R1/AZR format) — the steps below then run inside it;
2. the last ``\\boxed{...}`` (balanced braces, ``\\fbox`` too);
3. the last "final answer is X" / "the answer is X" / "answer: X";
4. the last ``#### X`` (GSM8K's own format);
5. for GSM8K only: the last number in the text.

Equivalence (:func:`is_equivalent`) is ``math_verify.verify(parse(gold), parse(pred))`` on the extracted
strings (each wrapped in ``\\boxed{}`` so math-verify reads the whole answer as one LaTeX expression), never a
string compare. Fractions, decimals, LaTeX forms, percentages, sets of multiple answers, intervals, tuples and
``\\text{}`` units are handled by math-verify; on top of it a trailing plain-word unit ("18 dollars") or the
dataset's unit (OlympiadBench) is stripped before a second try. Any math-verify exception or timeout counts as
"not equal".

math-verify's timeouts use ``signal.alarm``, which only works in the main thread: elsewhere they are switched
off (the comparison then runs without a time limit) instead of raising.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from evaluation.data import MathProblem, last_boxed

logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" warning is expected here

TIMEOUT_S = 5
"""math-verify's per-parse and per-comparison time limit (main thread only)."""

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)
_ANSWER_IS_RE = re.compile(r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)", re.IGNORECASE)
_HASHES_RE = re.compile(r"####\s*(.+)")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_TRAILING_WORDS_RE = re.compile(r"^\s*(\\?\$?\s*-?[\d,]*\.?\d+)\s*[A-Za-z][A-Za-z\s./]*$")


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _clean(answer: str) -> str:
    answer = answer.strip()
    answer = re.sub(r"(?<!\\)\$", "", answer).strip()  # $...$ math delimiters (``\$`` is kept)
    answer = re.sub(r"^\\\(|\\\)$", "", answer).strip()  # \( ... \)
    answer = re.sub(r"^\\\[|\\\]$", "", answer).strip()  # \[ ... \]
    return answer.rstrip(".").strip()


def _after_marker(text: str) -> str | None:
    matches = list(_ANSWER_IS_RE.finditer(text))
    if not matches:
        return None
    tail = matches[-1].group(1)
    tail = tail.split("\n", 1)[0]
    # stop at the end of the sentence (a period followed by a space / end), not at a decimal point
    tail = re.split(r"\.(?:\s|$)", tail, maxsplit=1)[0]
    tail = _clean(tail)
    return tail or None


def extract_math_answer(text: str, benchmark: str | None = None) -> str | None:
    """The final answer of a completion as a string, or ``None`` when there is none (see module docstring)."""
    if not text:
        return None
    tags = _ANSWER_TAG_RE.findall(text)
    if tags and tags[-1].strip():
        inner = extract_math_answer(tags[-1], benchmark)
        return inner if inner is not None else _clean(tags[-1]) or None
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return _clean(boxed)
    marked = _after_marker(text)
    if marked is not None:
        return marked
    hashes = _HASHES_RE.findall(text)
    if hashes and hashes[-1].strip():
        return _clean(hashes[-1].split("\n", 1)[0])
    if benchmark == "gsm8k":
        numbers = _NUMBER_RE.findall(text)
        if numbers:
            return numbers[-1].replace(",", "")
    return None


@lru_cache(maxsize=4096)
def _parse_cached(answer: str) -> tuple:
    return tuple(_parse(answer))


def _parse(answer: str) -> list[Any]:
    from math_verify import parse

    try:
        return parse("\\boxed{" + answer + "}", parsing_timeout=_timeout())
    except Exception:  # noqa: BLE001 - math-verify quirks: any failure means "unparseable"
        return []


def _verify(gold: list[Any], pred: list[Any]) -> bool:
    from math_verify import verify

    if not gold or not pred:
        return False
    try:
        return bool(verify(gold, pred, timeout_seconds=_timeout()))
    except BaseException as exc:  # noqa: BLE001 - timeouts and sympy errors alike mean "not equal"
        if isinstance(exc, KeyboardInterrupt):
            raise
        return False


def _without_unit(pred: str, unit: str | None) -> str | None:
    """``pred`` with a trailing unit removed, or ``None`` if there was none to remove."""
    if unit:
        bare_unit = _clean(unit).replace("\\mathrm", "").replace("\\text", "").strip("{} ")
        for candidate in (unit, _clean(unit), bare_unit):
            if candidate and pred.endswith(candidate) and len(pred) > len(candidate):
                return pred[: -len(candidate)].strip()
    m = _TRAILING_WORDS_RE.match(pred)
    if m:
        return m.group(1).strip()
    return None


def is_equivalent(gold: str | list[str], pred: str | None, unit: str | None = None) -> bool:
    """Whether ``pred`` equals (any of) ``gold`` per math-verify; ``unit`` may be omitted from ``pred``."""
    if pred is None or not pred.strip():
        return False
    golds = [gold] if isinstance(gold, str) else list(gold)
    pred = _clean(pred)
    tries = [pred]
    stripped = _without_unit(pred, unit)
    if stripped:
        tries.append(stripped)
    for g in golds:
        g_parsed = list(_parse_cached(_clean(g)))
        for p in tries:
            if _verify(g_parsed, list(_parse_cached(p))):
                return True
    return False


@dataclass
class MathScore:
    """Outcome of one math completion: the extracted answer and whether it is correct."""

    task_id: str
    extracted: str | None
    correct: bool


def score_math(problem: MathProblem, completion: str) -> MathScore:
    """Extract the answer of ``completion`` and check it against ``problem``'s gold answers."""
    extracted = extract_math_answer(completion, problem.benchmark)
    return MathScore(problem.task_id, extracted, is_equivalent(problem.answers, extracted, problem.unit))
