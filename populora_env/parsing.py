"""Format check and answer extraction for completions (AZR's rules, robust to any input).

Format rule (docs/azr.md §3): a completion is well formatted iff it matches ``<think>…</think>`` then optional
whitespace then ``<answer>…</answer>`` (DOTALL, non-greedy, at the start; leading whitespace allowed, trailing
text ignored). Two documented, optional leniencies (both off in AZR):

- ``require_think=False`` (for instruct models that do not emit ``<think>``): an ``<answer>…</answer>`` pair
  anywhere suffices;
- ``require_close=False`` (the env's ``lenient_answer_close``, for small models that stop right after their
  answer's value or closing fence): the final ``</answer>`` may be missing, i.e.
  ``<think>…</think>\\s*<answer>`` (or, with ``require_think=False``, an ``<answer>`` anywhere) suffices; the
  answer then runs to the end of the text, and a code block left open there is closed by it.

The answer is the text after the **last** ``<answer>`` up to the next ``</answer>`` (to the end of the text
when there is none).

Inside the answer, payloads live in fenced blocks: ```` ```python ````, ```` ```input ````, ```` ```output ````,
```` ```message ````. Every function here accepts any object and never raises: garbage yields ``None`` /
empty results, which the callers turn into format penalties.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*([A-Za-z_][\w\-]*)?[ \t]*\r?\n(.*?)```", re.S)


@dataclass(frozen=True)
class FormattedAnswer:
    """Result of the format check.

    Attributes:
        format_ok: the completion has the required tag structure.
        answer: the extracted answer text (``""`` when ``format_ok`` is false).
    """

    format_ok: bool
    answer: str


def extract_answer(
    completion: object, *, require_think: bool = True, prefix: str = "", require_close: bool = True
) -> FormattedAnswer:
    """Check the tag structure of ``prefix + completion`` and extract the answer.

    Args:
        completion: the model's text; non-strings are format errors.
        require_think: require ``<think>…</think>`` before ``<answer>`` (AZR); ``False`` accepts a bare
            ``<answer>…</answer>``.
        prefix: the response prefix the completion continues (e.g. ``"<think>"`` for the R1 base-model
            wrapper, or a pre-filled answer opening), prepended before checking.
        require_close: require the closing ``</answer>`` (AZR); ``False`` accepts an answer that runs to the
            end of the text (a fenced block it leaves open is closed there).
    """
    if not isinstance(completion, str):
        return FormattedAnswer(False, "")
    text = prefix + completion
    if require_think:
        ok = _has_think_answer(text, require_close)
    else:
        ok = _has_answer_pair(text, 0) if require_close else "<answer>" in text
    if not ok:
        return FormattedAnswer(False, "")
    start = text.rfind("<answer>") + len("<answer>")
    end = text.find("</answer>", start)
    if end != -1:
        return FormattedAnswer(True, text[start:end])
    answer = text[start:]
    if not require_close and answer.count("```") % 2 == 1:  # the text ended inside the answer's last block
        answer = answer.rstrip() + "\n```"
    return FormattedAnswer(True, answer)


def _has_answer_pair(text: str, start: int) -> bool:
    """``<answer>…</answer>`` somewhere at or after ``start``."""
    opening = text.find("<answer>", start)
    return opening != -1 and text.find("</answer>", opening + len("<answer>")) != -1


def _has_think_answer(text: str, require_close: bool = True) -> bool:
    """AZR's ``\\s*<think>.*?</think>\\s*<answer>.*?</answer>`` (DOTALL, at the start), in linear time
    (without the final ``.*?</answer>`` when ``require_close`` is false).

    The regex engine would backtrack quadratically on degenerate completions such as
    ``"</think><answer>" * 10_000``; this scan gives the same answer: the first ``</think>`` that is followed
    (after optional whitespace) by ``<answer>`` is tried, and if no ``</answer>`` follows it, none follows a
    later one either.
    """
    body = text.lstrip()
    if not body.startswith("<think>"):
        return False
    position = len("<think>")
    while True:
        close = body.find("</think>", position)
        if close == -1:
            return False
        after = close + len("</think>")
        rest = after
        while rest < len(body) and body[rest].isspace():
            rest += 1
        if body.startswith("<answer>", rest):
            return not require_close or body.find("</answer>", rest + len("<answer>")) != -1
        position = after


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """All fenced blocks of ``text`` as ``(tag, content)``; ``tag`` is lower-cased, ``""`` when absent."""
    blocks = []
    for match in _FENCE.finditer(text):
        tag = (match.group(1) or "").lower()
        blocks.append((tag, match.group(2)))
    return blocks


def clean_code(content: str) -> str:
    """Normalise a code block: dedent, strip surrounding blank lines and trailing spaces."""
    return textwrap.dedent(content).strip("\n").rstrip() + "\n"


_PYTHON_TAGS = ("python", "py", "python3")


def first_block(text: str, tags: tuple[str, ...]) -> str | None:
    """Content of the first fenced block whose tag is in ``tags``."""
    for tag, content in fenced_blocks(text):
        if tag in tags:
            return content
    return None


def last_block(text: str, tags: tuple[str, ...] | None) -> str | None:
    """Content of the last fenced block whose tag is in ``tags`` (any tag if ``tags`` is ``None``)."""
    found = None
    for tag, content in fenced_blocks(text):
        if tags is None or tag in tags:
            found = content
    return found


@dataclass(frozen=True)
class ProposalPayload:
    """What a teacher's answer contains (fields are ``None`` when missing)."""

    program: str | None = None
    inputs: tuple[str, ...] = ()
    message: str | None = None


def parse_program_proposal(answer: str) -> ProposalPayload:
    """Deduction/abduction proposal: the first ```` ```python ```` block and the first ```` ```input ```` block."""
    program = first_block(answer, _PYTHON_TAGS)
    given = first_block(answer, ("input",))
    return ProposalPayload(
        program=None if program is None else clean_code(program),
        inputs=() if given is None else (given.strip(),),
    )


def parse_induction_proposal(answer: str) -> ProposalPayload:
    """Induction proposal: every ```` ```input ```` block (in order) and the ```` ```message ```` block
    (fallback ``<message>…</message>``)."""
    blocks = fenced_blocks(answer)
    inputs = tuple(content.strip() for tag, content in blocks if tag == "input")
    message = None
    for tag, content in blocks:
        if tag == "message":
            message = content.strip()
            break
    if message is None:
        opening = answer.find("<message>")
        closing = answer.find("</message>", opening + len("<message>")) if opening != -1 else -1
        if closing != -1:
            message = answer[opening + len("<message>") : closing].strip()
    return ProposalPayload(inputs=inputs, message=message)


def parse_output_answer(answer: str) -> str:
    """Deduction answer: the last ```` ```output ```` block, else the whole answer text (AZR's fallback)."""
    block = last_block(answer, ("output",))
    return (answer if block is None else block).strip()


def parse_input_answer(answer: str) -> str:
    """Abduction answer: the last ```` ```input ```` block, else the whole answer text (AZR's fallback)."""
    block = last_block(answer, ("input",))
    return (answer if block is None else block).strip()


def parse_program_answer(answer: str) -> str | None:
    """Induction answer: the last fenced block of any tag (AZR), ``None`` if there is none."""
    block = last_block(answer, None)
    return None if block is None else clean_code(block)
