"""All prompt text of the game: prompt sets, selected by name with ``env.prompts``.

A **prompt set** (:class:`PromptTemplates`) holds the six prompt templates (propose/solve × deduction/abduction/
induction, the *prompt kinds* of :data:`PROMPT_KINDS`), the wrapper around them, and how generation must treat
them:

- ``chat_template``: whether the generator applies the tokenizer's chat template (instruct models) or feeds
  the prompt text as is (base models, AZR's plain concatenation);
- one **response prefix per prompt kind** (:meth:`PromptTemplates.prefix`): text the completion continues,
  e.g. ``"<think>"`` after AZR's R1 wrapper, or a pre-filled answer opening such as
  ``"<think></think>\\n<answer>\\n```python\\ndef f("`` for a small model. The env prepends it to the completion
  before the format check, so the completion is judged as ``prefix + completion``;
- ``stop``: strings that end generation (the closing answer tag): nothing after it is ever checked.

**Where the prefix goes** (the one rule, :func:`with_prefix`, used by the env and by every generation
backend): the text generated from always ends with the prefix. With ``chat_template`` the env's observation is
the user turn and the generator appends the prefix after the chat template's assistant opening. Without it the
observation is the whole text to generate from and already ends with the prefix (the env appends it to the
wrapped prompt unless the wrapper ends with it, as the R1 wrapper ends with ``<think>``); a generator given a
raw prompt appends the prefix only where the prompt does not already end with it. Either way the prompt token
ids of a completion include the prefix.

Registered sets:

- ``"chat"`` (the default): short chat-style prompts for instruct models (the chat template applies); the
  completion must write the whole ``<think>…</think><answer>…</answer>`` structure itself.
- ``"r1"``: the ``"chat"`` prompts inside AZR's DeepSeek-R1 wrapper (:meth:`PromptTemplates.r1`).
- ``"azr"``: AZR's prompts for base models, in content (sections, constraints, reference snippets, answer
  format; docs/azr.md §2–§3) but in this project's words, inside the R1 wrapper that ends with
  ``Assistant: <think>``; no chat template; completions are checked with the ``<think>`` prefix.
- ``"small"``: for a ~100M instruct model (SmolLM2-135M), chosen by measurement (docs/prompts.md §5): short
  instructions, concrete values, the answer opening pre-filled per kind, proposals input first; meant to be
  used with ``env.lenient_answer_close``.

Every set tells proposers the literal-value rule that validation enforces (:data:`LITERAL_RULE`, shortened
to :data:`SHORT_LITERAL_RULE` in ``"small"``). Replace any
field to change the wording::

    from dataclasses import replace
    from populora_env import PromptTemplates, parallel_env
    env = parallel_env(prompts=replace(PromptTemplates(), solve_deduction="..."))
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from populora_env.registry import Registry
from populora_env.tasks import Task, TaskType

#: The six prompt kinds: ``<role>_<task type>``.
PROMPT_KINDS: tuple[str, ...] = tuple(f"{role}_{t.value}" for role in ("propose", "solve") for t in TaskType)


def prompt_kind(role: str, task_type: TaskType | str) -> str:
    """The prompt kind of ``role`` (``"propose"``/``"solve"``) and ``task_type``, e.g. ``"solve_deduction"``."""
    if role not in ("propose", "solve"):
        raise ValueError(f"role must be 'propose' or 'solve', got {role!r}")
    return f"{role}_{TaskType.parse(task_type).value}"


def with_prefix(text: str, prefix: str) -> str:
    """``text`` ending with ``prefix``: ``text`` itself if it already ends with it (or ``prefix`` is empty),
    else ``text + prefix``. The placement rule of response prefixes for raw (no chat template) prompts."""
    return text if not prefix or text.endswith(prefix) else text + prefix


_R1_WRAPPER = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {prompt}\nAssistant: <think>"
)

#: What validation accepts as an input or an output (``populora_env.literals``): call arguments that
#: ``ast.literal_eval`` reads, and return values built only from builtin literal types whose ``repr`` reads
#: back (so no ``inf``/``nan``, ``frozenset``, ``Counter``, custom objects). Braces are doubled for ``format``.
LITERAL_RULE = (
    "Inputs and outputs must be plain Python literals: numbers, strings, True/False/None, and lists, tuples, "
    "dicts and sets of them (like `[3, 1, 2], 'abc'` or `{{'a': 1}}`). Calls and names are not literals: no "
    "`range(5)`, `list(...)`, `Counter(...)`, `frozenset(...)`, `float('inf')` or `nan`, and `f` must return "
    "such a plain value too."
)

_RULES = (
    "Rules: {code_rule}; it must be deterministic (no randomness, time, printing or I/O); "
    "do not use: {banned}. Make it different from the examples. {value_rule}"
)

#: The code rule of each validation profile (``{code_rule}``; ``populora_env.validation``).
CODE_RULES: dict[str, str] = {
    "strict": "define a function `f` with at least one parameter that returns a value; helper functions or "
    "classes may come before it",
    "azr": "define exactly one function, `f`, with at least one parameter, that returns a value; no other "
    "function (not even nested inside `f`) and no class",
}

#: The value rule of the 'azr' profile (inputs are expressions evaluated once; outputs stay plain literals).
EXPRESSION_RULE = (
    "Inputs are Python expressions, evaluated once before the run (like `[3, 1, 2], 'abc'` or "
    "`list(range(5))`); `f` must return a plain Python literal value: numbers, strings, True/False/None, and "
    "lists, tuples, dicts and sets of them (no `Counter(...)`, `frozenset(...)`, `inf`, `nan` or objects)."
)


def seconds_text(timeout_s: float) -> str:
    """A time limit in words for prompts: ``2.0`` -> ``'2 seconds'``, ``0.5`` -> ``'0.5 seconds'``."""
    value = f"{timeout_s:g}"
    return f"{value} second" + ("" if value == "1" else "s")


@dataclass(frozen=True)
class PromptTemplates:
    """One prompt set (``str.format`` templates: fields in braces, literal braces doubled as ``{{ }}``; each
    template lists the placeholders it may use; :meth:`validate` checks them).

    Attributes:
        wrapper: wraps every prompt; ``{prompt}``.
        chat_template: the generator applies the tokenizer's chat template (the observation is the user turn
            and the response prefix follows the assistant opening); ``False``: the observation is the whole
            text to generate from and ends with the response prefix.
        response_prefix: the response prefix of every kind whose own ``prefix_<kind>`` is ``None``.
        prefix_propose_deduction .. prefix_solve_induction: the response prefix of one prompt kind
            (``None``: ``response_prefix``).
        stop: strings that end generation (included in the completion); ``()`` for none.
        propose_deduction: ``{references}``, ``{banned}``.
        propose_abduction: ``{references}``, ``{banned}``.
        propose_induction: ``{program}``, ``{n_inputs}``.
        solve_deduction: ``{program}``, ``{input}``.
        solve_abduction: ``{program}``, ``{output}``.
        solve_induction: ``{pairs}``, ``{message}``.
        reference: one reference task; ``{k}``, ``{program}``, ``{input}``, ``{output}``.
        no_references: replaces ``{references}`` when there are none.
        pair: one shown induction pair; ``{k}``, ``{input}``, ``{output}``.
        banned: the banned-word hint shown to proposers (:meth:`for_env` derives it from the env's validation
            profile).
        code_rule, value_rule, induction_value_rule, time_limit: the rules of the env's validation profile and
            its sandbox time limit, as the set phrases them (``{code_rule}``, ``{value_rule}`` in deduction and
            abduction proposer prompts, ``{induction_value_rule}`` in induction ones, ``{time_limit}`` in any
            proposer prompt); the defaults are the 'strict' profile's; :meth:`for_env` sets them from the env.
        derive_rules: :meth:`for_env` replaces the five fields above (``False``: the set keeps its own texts).
    """

    wrapper: str = "{prompt}"
    chat_template: bool = True
    response_prefix: str = ""
    prefix_propose_deduction: str | None = None
    prefix_propose_abduction: str | None = None
    prefix_propose_induction: str | None = None
    prefix_solve_deduction: str | None = None
    prefix_solve_abduction: str | None = None
    prefix_solve_induction: str | None = None
    stop: tuple[str, ...] = ("</answer>",)
    propose_deduction: str = (
        "Write a new Python program and one input for it. Another model will see the program and the input "
        "and must predict the output: make that hard but possible by careful reasoning.\n"
        + _RULES + "\n{references}\n"
        "Answer with <think>your plan</think><answer>\n```python\ndef f(...):\n    ...\n```\n"
        "```input\narguments for f\n```\n</answer>"
    )
    propose_abduction: str = (
        "Write a new Python program and one input for it. Another model will see the program and its output "
        "and must find an input that produces it: make that hard but possible by careful reasoning.\n"
        + _RULES + "\n{references}\n"
        "Answer with <think>your plan</think><answer>\n```python\ndef f(...):\n    ...\n```\n"
        "```input\narguments for f\n```\n</answer>"
    )
    propose_induction: str = (
        "Here is a program:\n```python\n{program}```\n"
        "Write {n_inputs} different inputs for `f` and a short message describing what it does. Another model "
        "will see half of the input/output pairs and your message and must rewrite `f` so that it reproduces "
        "the other half: choose inputs that reveal the behaviour. {induction_value_rule}\n"
        "Answer with <think>your plan</think><answer>\n```input\narguments for f\n```\n"
        "(one input block per input)\n```message\nyour description\n```\n</answer>"
    )
    solve_deduction: str = (
        "Predict the output of `f` for the input.\n```python\n{program}```\n```input\n{input}\n```\n"
        "Answer with <think>your reasoning</think><answer>\n```output\nthe value as a Python literal\n```\n"
        "</answer>"
    )
    solve_abduction: str = (
        "Find an input for which `f` returns the given output.\n```python\n{program}```\n"
        "```output\n{output}\n```\n"
        "Answer with <think>your reasoning</think><answer>\n```input\narguments for f\n```\n</answer>"
    )
    solve_induction: str = (
        "Write a Python function `f` that matches these input/output pairs and this message.\n{pairs}\n"
        "```message\n{message}\n```\n"
        "Answer with <think>your reasoning</think><answer>\n```python\ndef f(...):\n    ...\n```\n</answer>"
    )
    reference: str = (
        "<snippet_{k}>\n```python\n{program}```\n```input\n{input}\n```\n```output\n{output}\n```\n</snippet_{k}>"
    )
    no_references: str = ""
    pair: str = "```input_{k}\n{input}\n```\n```output_{k}\n{output}\n```"
    banned: str = "os, sys, random, time, datetime, subprocess, socket, threading, open, input, eval, exec, id, hash"
    code_rule: str = CODE_RULES["strict"]
    value_rule: str = LITERAL_RULE.replace("{{", "{").replace("}}", "}")
    induction_value_rule: str = LITERAL_RULE.replace("{{", "{").replace("}}", "}")
    time_limit: str = "2 seconds"
    derive_rules: bool = True

    PLACEHOLDERS: ClassVar[dict[str, tuple[str, ...]]] = {
        "wrapper": ("prompt",),
        "propose_deduction": ("references", "banned", "code_rule", "value_rule", "time_limit"),
        "propose_abduction": ("references", "banned", "code_rule", "value_rule", "time_limit"),
        "propose_induction": ("program", "n_inputs", "induction_value_rule", "time_limit"),
        "solve_deduction": ("program", "input"),
        "solve_abduction": ("program", "output"),
        "solve_induction": ("pairs", "message"),
        "reference": ("k", "program", "input", "output"),
        "pair": ("k", "input", "output"),
    }

    @classmethod
    def r1(cls) -> PromptTemplates:
        """The default prompts in AZR's DeepSeek-R1 wrapper for base models: no chat template, every prompt ends
        with ``Assistant: <think>`` and completions are checked with the ``"<think>"`` prefix."""
        return cls(wrapper=_R1_WRAPPER, chat_template=False, response_prefix="<think>")

    def for_env(self, validation: str, timeout_s: float) -> PromptTemplates:
        """This set with its rules derived from the env's actual settings (unless ``derive_rules`` is off): the
        forbidden list of the validation profile (``populora_env.validation.forbidden_hint``), its code and
        value rules, and the sandbox's time limit; so no prompt says two seconds where the sandbox allows ten,
        or forbids a word that the required answer format contains. Under 'strict' the set's own code and
        value texts stay (they are the strict rules in the set's words)."""
        from populora_env.validation import forbidden_hint

        if not self.derive_rules:
            return self
        changes: dict[str, str] = {"banned": forbidden_hint(validation), "time_limit": seconds_text(timeout_s)}
        if validation == "azr":
            changes |= {"code_rule": CODE_RULES["azr"], "value_rule": EXPRESSION_RULE,
                        "induction_value_rule": EXPRESSION_RULE}
        return replace(self, **changes)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field if a template uses an unknown placeholder or a field has the
        wrong type."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("chat_template", "derive_rules"):
                if not isinstance(value, bool):
                    raise ValueError(f"prompts.{f.name} must be a bool, got {value!r}")
                continue
            if f.name == "stop":
                if not isinstance(value, tuple) or not all(isinstance(s, str) and s for s in value):
                    raise ValueError(f"prompts.stop must be a tuple of non-empty strings, got {value!r}")
                continue
            if f.name.startswith("prefix_") and value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"prompts.{f.name} must be a str, got {type(value).__name__}")
            allowed = self.PLACEHOLDERS.get(f.name)
            if allowed is None:
                continue
            try:
                value.format(**{name: "" for name in allowed})
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"prompts.{f.name} is not a valid template (allowed placeholders: {allowed}): {exc!r}"
                ) from None

    # ------------------------------------------------------------------ prefixes

    def prefix(self, kind: str) -> str:
        """The response prefix of prompt kind ``kind`` (one of :data:`PROMPT_KINDS`)."""
        if kind not in PROMPT_KINDS:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        value = getattr(self, f"prefix_{kind}")
        return self.response_prefix if value is None else value

    def prefixes(self, role: str) -> dict[str, str]:
        """Task type (value) -> response prefix, for ``role``."""
        return {t.value: self.prefix(prompt_kind(role, t)) for t in TaskType}

    # ------------------------------------------------------------------ rendering

    def wrap(self, prompt: str) -> str:
        """Apply :attr:`wrapper`."""
        return self.wrapper.format(prompt=prompt)

    def observation(self, body: str, kind: str) -> str:
        """The observation for a prompt ``body`` of ``kind``: the wrapped body, ending with the kind's response
        prefix when the set applies no chat template (:func:`with_prefix`)."""
        wrapped = self.wrap(body)
        return wrapped if self.chat_template else with_prefix(wrapped, self.prefix(kind))

    def render_references(self, references: list[Task]) -> str:
        """Reference tasks for deduction/abduction proposer prompts (:attr:`reference` each, numbered from 1)."""
        if not references:
            return self.no_references
        return "\n".join(
            self.reference.format(k=k, program=_code(t.program), input=t.input, output=t.output)
            for k, t in enumerate(references, start=1)
        )

    def proposal(
        self, task_type: TaskType, *, references: list[Task] | None = None, program: str = "", n_inputs: int = 0
    ) -> str:
        """The proposer observation for ``task_type``."""
        if task_type is TaskType.INDUCTION:
            body = self.propose_induction.format(program=_code(program), n_inputs=n_inputs,
                                                 induction_value_rule=self.induction_value_rule,
                                                 time_limit=self.time_limit)
        else:
            template = self.propose_deduction if task_type is TaskType.DEDUCTION else self.propose_abduction
            body = template.format(references=self.render_references(references or []), banned=self.banned,
                                   code_rule=self.code_rule, value_rule=self.value_rule,
                                   time_limit=self.time_limit)
        return self.observation(body, prompt_kind("propose", task_type))

    def solver(self, task: Task) -> str:
        """The solver observation for ``task``."""
        if task.task_type is TaskType.DEDUCTION:
            body = self.solve_deduction.format(program=_code(task.program), input=task.input)
        elif task.task_type is TaskType.ABDUCTION:
            body = self.solve_abduction.format(program=_code(task.program), output=task.output)
        else:
            pairs = "\n".join(
                self.pair.format(k=k, input=i, output=o) for k, (i, o) in enumerate(task.shown_pairs, start=1)
            )
            body = self.solve_induction.format(pairs=pairs, message=task.message or "(none)")
        return self.observation(body, prompt_kind("solve", task.task_type))


def _code(program: str) -> str:
    return program.rstrip("\n") + "\n"


# ------------------------------------------------------------------ "azr": AZR's prompts for base models

_AZR_CODE_RULES = (
    "### Requirements for the code\n"
    "- Rule for the code: {code_rule}\n"
    "- `f` takes at least one parameter and returns a value\n"
    "- `f` is deterministic\n"
    "- Working out the result should require tracking state across several data transformations: a long chain "
    "of reasoning steps\n"
    "- Stay away from: random functions or values, dates and times, input/output (files, network), printing or "
    "logging, any outside state\n"
    "- It must run in well under {time_limit} on an ordinary CPU\n"
    "- Put every import at the very top; the snippet ends with the `return` of `f`\n"
    "- Do not write the test input into the snippet: it belongs in the input block\n"
    "### Requirements for the input\n"
    "- Exactly one test input\n"
    "- Separate several arguments with commas\n"
    "- Put quotes around string arguments\n"
    "- {value_rule}\n"
    "### Format\n"
    "The snippet goes in a ```python block, the input in an ```input block:\n"
    "```python\ndef f(name: str, scores: dict):\n    # the logic\n    return result\n```\n"
    "```input\n'Mira', {{'math': 17, 'art': 12}}\n```\n"
)

_AZR_JUDGING = (
    "### How your submission is judged\n"
    "- It runs: the code must execute on your input\n"
    "- Difficulty: {difficulty} Aim for algorithmic depth or intricate logic: for instance data-structure "
    "classes (trees, heaps, stacks, queues, graphs) or involved control flow (dynamic programming, recursion, "
    "divide and conquer, greedy search, backtracking)\n"
    "- Creativity: the code must be clearly different from the reference snippets\n"
    "- Forbidden: {{banned}}\n\n"
    "First make a careful plan: how will your snippet be hard, new and different from the references? Then "
    "write the final snippet and its input.\n\n"
    "### Reference code snippets\n{{references}}\n"
)


def _azr_proposer(goal: str, difficulty: str) -> str:
    return (
        "## Task: write a new Python code snippet and one input "
        "that goes with it\n\n" + goal + "\n\n" + _AZR_CODE_RULES + _AZR_JUDGING.format(difficulty=difficulty)
    )


_AZR_PROPOSE_INDUCTION = (
    "## Task: give {n_inputs} inputs for the code snippet below that produce varied outputs, and a "
    "message about the snippet\n\n"
    "Using the code snippet below, design {n_inputs} inputs that can be plugged into it to produce a "
    "diverse set of outputs. Some of your inputs, with the outputs they produce, will be shown to a test "
    "subject who must deduce the code; you may also leave them a message to help. Think of it as an I.Q. "
    "test.\n\n"
    "### Requirements for the inputs\n"
    "- {n_inputs} valid inputs for the snippet\n"
    "- In each input, separate several arguments with commas\n"
    "- Put quotes around string arguments\n"
    "- Wrap every input in its own ```input block\n"
    "- {induction_value_rule}\n"
    "- The snippet must run on each input in well under {time_limit}\n"
    "### Requirements for the message\n"
    "- Wrap the message in a ```message block\n"
    "- It can take any form: a coding question, or a plain-language instruction saying what the snippet "
    "does\n"
    "- It must not contain the snippet\n"
    "### Format\n"
    "```input\n'Mira', {{'math': 17, 'art': 12}}\n```\n"
    "```input\n'Tom', {{'math': 9, 'art': 20}}\n```\n"
    "```message\nwhat the snippet does\n```\n"
    "### How your submission is judged\n"
    "- It runs: the snippet must execute on every one of your inputs\n"
    "- Coverage: together the inputs and outputs span the snippet's behaviour, enough to deduce the code\n"
    "- Creativity: the inputs are clearly different from one another\n"
    "- Together, the inputs and the message should challenge the test subject without being impossible\n\n"
    "First make a careful plan: understand the snippet, then say how your inputs cover it well and why they "
    "are challenging and varied. Then write the inputs, each in an ```input block, and the message in a "
    "```message block.\n\n"
    "### Code snippet\n```python\n{program}f(<your input is plugged in here>)\n```\n"
)

_AZR_SOLVE_DEDUCTION = (
    "# Task: deduce the output of a Python code snippet from the code and an input\n"
    "Given the code snippet and the input below, think step by step, then give the output that the snippet "
    "produces when the input is plugged in, inside ```output tags. If the output is a string, put it in "
    "quotes; if the function returns several values, wrap them in a tuple.\n\n"
    "# Code snippet\n```python\n{program}```\n\n"
    "# Input\n```input\n{input}\n```\n\n"
    "# Example answer\n```output\n{{'math': 17, 'art': 12}}\n```\n"
)

_AZR_SOLVE_ABDUCTION = (
    "# Task: give one possible input of a Python code snippet from the code and its output\n"
    "Given the code snippet and the output below, think step by step, then give one input that produces "
    "this output, inside ```input tags. Put string arguments in quotes and separate several arguments with "
    "commas.\n\n"
    "# Code snippet\n```python\n{program}```\n\n"
    "# Output\n```output\n{output}\n```\n\n"
    "# Answer format\n```input\narg1, arg2, ...\n```\n"
    "# Example answer\n```input\n'Mira', {{'math': 17, 'art': 12}}\n```\n"
)

_AZR_SOLVE_INDUCTION = (
    "# Task: deduce the function that produced the outputs from the inputs\n"
    "Given a set of input/output pairs and a message describing the function, think step by step and work "
    "out a general code snippet that produces the hidden outputs from the hidden inputs, like the code that "
    "generated these pairs. Check your function against each pair in turn and revise it until it fits. "
    "Your final code snippet, in ```python tags, is what gets evaluated.\n\n"
    "# Requirements for the code\n"
    "- Call the entry function `f` (`def f(...): ...`); nested definitions inside `f` are fine\n"
    "- `f` takes at least one parameter, returns a value and is deterministic\n"
    "- Stay away from: random functions or values, dates and times, input/output, printing or logging, any "
    "outside state\n"
    "- Put every import and class definition at the very top; the snippet ends with the `return` of `f`\n\n"
    "# Input and output pairs\n{pairs}\n\n"
    "# Message\n```message\n{message}\n```\n\n"
    "# Example answer\n```python\ndef f(a):\n    return a\n```\n\n"
    "Call your entry function `f`!"
)


def _azr() -> PromptTemplates:
    """AZR's prompts (docs/azr.md §2–§3) in this project's words, inside the R1 wrapper, for base models.

    Differences from AZR's text, on purpose: the difficulty sentences are the right way round (AZR's code has
    them swapped between the deduction and abduction proposers), the time limit is this project's sandbox
    limit (``{time_limit}``, filled from ``env.timeout_s``) rather than AZR's fixed 10 s, and proposers are told
    the code and value rules of the env's validation profile (``{code_rule}``, ``{value_rule}``)."""
    propose_deduction = _azr_proposer(
        "Using the reference snippets below as examples, design a new and original Python code snippet whose "
        "output takes deep algorithmic reasoning to work out from its input. Submit the snippet together with "
        "one test input: the input is plugged into the snippet to produce an output, and a test subject is "
        "then shown the snippet and the input and must deduce the output. Think of it as an I.Q. test.",
        "predicting the output from your code and your input should be hard.",
    )
    propose_abduction = _azr_proposer(
        "Using the reference snippets below as examples, design a new and original Python code snippet from "
        "whose output it takes deep algorithmic reasoning to work back to an input. Submit the snippet "
        "together with one test input: the input is plugged into the snippet to produce an output, and a test "
        "subject is then shown the snippet and that output and must come up with any input that produces it. "
        "Think of it as an I.Q. test.",
        "finding an input from your code and the output it produces should be hard.",
    )
    return PromptTemplates(
        wrapper=_R1_WRAPPER,
        chat_template=False,
        response_prefix="<think>",
        propose_deduction=propose_deduction,
        propose_abduction=propose_abduction,
        propose_induction=_AZR_PROPOSE_INDUCTION,
        solve_deduction=_AZR_SOLVE_DEDUCTION,
        solve_abduction=_AZR_SOLVE_ABDUCTION,
        solve_induction=_AZR_SOLVE_INDUCTION,
    )


# ------------------------------------------------------------------ "small": measured for SmolLM2-135M

_OPEN = "<think></think>\n<answer>\n"


#: The literal-value rule in the few words a ~100M model can use (the ``small`` set).
SHORT_LITERAL_RULE = (
    "The input and what `f` returns must be plain Python literals (numbers, strings, True/False/None, lists, "
    "tuples, dicts, sets), not calls like `range(5)` or `Counter(...)`."
)


def _small() -> PromptTemplates:
    """Prompts for a ~100M instruct model, chosen by measurement (docs/prompts.md §5, benchmarks/format_rates.py).

    Short instructions; the answer opening pre-filled per kind after the assistant's opening (the model never
    opened ``<answer>`` by itself); concrete values instead of placeholder text (``arguments for f`` was copied
    literally). Proposals give the input *first*, then the function (the parser takes the first python and
    the first input block in either order): after writing a function the model wandered into prose or an
    ``output`` block and never wrote the input. Solver prompts show one worked answer: without it fewer
    answers were well formatted (its values get copied, which is formatted but wrong). A solver's induction
    answer starts ``def f(``: helper functions go inside ``f``. The model rarely writes ``</answer>``: use the
    set with ``env.lenient_answer_close`` (docs/prompts.md §4)."""
    example = "```python\ndef f(nums, k):\n    return [x * k for x in nums if x > 0]\n```"
    rules = "`f` takes at least one argument and returns a value; no imports, randomness, printing or input(). "

    def proposer(task: str) -> str:
        return (
            "Write a new Python function `f` and one input for it. " + task + " " + rules + "{value_rule}"
            + "\nGive the input first, then the function, like this:\n<answer>\n```input\n[3, -1, 4], 2\n```\n"
            + example + "\n</answer>\n{references}\nNow write a different input and function."
        )

    return PromptTemplates(
        chat_template=True,
        prefix_propose_deduction=_OPEN + "```input\n",
        prefix_propose_abduction=_OPEN + "```input\n",
        prefix_propose_induction=_OPEN + "```input\n",
        prefix_solve_deduction=_OPEN + "```output\n",
        prefix_solve_abduction=_OPEN + "```input\n",
        prefix_solve_induction=_OPEN + "```python\ndef f(",
        value_rule=SHORT_LITERAL_RULE,
        induction_value_rule=SHORT_LITERAL_RULE.replace("what `f` returns", "the outputs"),
        propose_deduction=proposer("Another model will see `f` and the input and must predict what `f` returns."),
        propose_abduction=proposer(
            "Another model will see `f` and what it returns, and must find an input that gives it."
        ),
        propose_induction=(
            "Here is a Python function:\n```python\n{program}```\n"
            "Write {n_inputs} different inputs for `f`, each in its own ```input block, then a ```message block "
            "saying in a few words what `f` does. {induction_value_rule}"
            + "\nFor example, for `def f(a, b): return a + b` and 4 inputs:\n<answer>\n"
            "```input\n1, 2\n```\n```input\n-5, 7\n```\n```input\n10, 0\n```\n```input\n3, 3\n```\n"
            "```message\nadds the two numbers\n```\n</answer>"
        ),
        solve_deduction=(
            "What does `f` return for this input?\n```python\n{program}```\n```input\n{input}\n```\n"
            "Answer with the value in an ```output block, for example:\n<answer>\n```output\n[6, 8]\n```\n</answer>"
        ),
        solve_abduction=(
            "Find an input for which `f` returns this output.\n```python\n{program}```\n"
            "```output\n{output}\n```\n"
            "Answer with the arguments of `f` in an ```input block, for example:\n<answer>\n"
            "```input\n[3, -1, 4], 2\n```\n</answer>"
        ),
        solve_induction=(
            "Write a Python function `f` that returns these outputs for these inputs.\n{pairs}\n"
            "Hint: {message}\n"
            "Answer with the function in a ```python block, for example:\n<answer>\n" + example + "\n</answer>"
        ),
        reference="Another example:\n```input\n{input}\n```\n```python\n{program}```",
    )


# ------------------------------------------------------------------ the prompt-set registry

_PROMPT_SETS: Registry[PromptTemplates] = Registry("prompt set")


def register_prompt_set(name: str, templates: PromptTemplates) -> PromptTemplates:
    """Register ``templates`` under ``name`` so that ``env.prompts = name`` (preset or flag) selects it."""
    if not isinstance(templates, PromptTemplates):
        raise TypeError(f"a prompt set must be a PromptTemplates, got {type(templates).__name__}")
    templates.validate()
    return _PROMPT_SETS.add(name, templates)


def unregister_prompt_set(name: str) -> PromptTemplates:
    """Remove a registered prompt set."""
    return _PROMPT_SETS.remove(name)


def get_prompt_set(name: str) -> PromptTemplates:
    """The prompt set registered as ``name`` (:class:`~populora_env.registry.UnknownEntryError` if none)."""
    return _PROMPT_SETS.get(name)


def list_prompt_sets() -> list[str]:
    """Registered prompt-set names, sorted."""
    return _PROMPT_SETS.names()


register_prompt_set("chat", PromptTemplates())
register_prompt_set("r1", PromptTemplates.r1())
register_prompt_set("azr", _azr())
register_prompt_set("small", _small())
