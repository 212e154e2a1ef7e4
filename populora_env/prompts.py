"""All prompt text of the game in one replaceable dataclass.

The templates follow AZR's prompts (docs/azr.md §2–§3: ``<think>``/``<answer>`` tags, fenced ``python`` / ``input`` /
``output`` / ``message`` blocks, ``<snippet_k>`` references) but are much shorter, so that a 135M model with a
small context can read them. Replace any field to change the wording::

    from dataclasses import replace
    from populora_env import PromptTemplates, parallel_env
    env = parallel_env(prompts=replace(PromptTemplates(), solve_deduction="..."))

``PromptTemplates()`` suits chat/instruct models (the loop applies the chat template; the completion must contain
``<think>`` itself). ``PromptTemplates.r1()`` wraps every prompt in AZR's DeepSeek-R1 template for base models:
the prompt ends with ``Assistant: <think>`` and the env prepends ``response_prefix`` (``"<think>"``) to the
completion before the format check.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from populora_env.registry import Registry
from populora_env.tasks import Task, TaskType

_R1_WRAPPER = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {prompt}\nAssistant: <think>"
)

_RULES = (
    "Rules: define a function `f` with at least one parameter that returns a value; helper functions or "
    "classes may come before it; it must be deterministic (no randomness, time, printing or I/O); "
    "do not use: {banned}. Make it different from the examples."
)


@dataclass(frozen=True)
class PromptTemplates:
    """Prompt templates (``str.format`` fields in braces, literal braces doubled as ``{{ }}``; each field lists
    the placeholders it may use; :meth:`validate` checks them).

    Attributes:
        wrapper: wraps every prompt; ``{prompt}``.
        response_prefix: text the wrapped prompt ends with and the completion continues (``""`` or
            ``"<think>"``); prepended to the completion before the format check.
        propose_deduction: ``{references}``, ``{banned}``.
        propose_abduction: ``{references}``, ``{banned}``.
        propose_induction: ``{program}``, ``{n_inputs}``.
        solve_deduction: ``{program}``, ``{input}``.
        solve_abduction: ``{program}``, ``{output}``.
        solve_induction: ``{pairs}``, ``{message}``.
        reference: one reference task; ``{k}``, ``{program}``, ``{input}``, ``{output}``.
        no_references: replaces ``{references}`` when there are none.
        pair: one shown induction pair; ``{k}``, ``{input}``, ``{output}``.
        banned: the banned-word hint shown to proposers.
    """

    wrapper: str = "{prompt}"
    response_prefix: str = ""
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
        "the other half: choose inputs that reveal the behaviour.\n"
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

    PLACEHOLDERS: ClassVar[dict[str, tuple[str, ...]]] = {
        "wrapper": ("prompt",),
        "propose_deduction": ("references", "banned"),
        "propose_abduction": ("references", "banned"),
        "propose_induction": ("program", "n_inputs"),
        "solve_deduction": ("program", "input"),
        "solve_abduction": ("program", "output"),
        "solve_induction": ("pairs", "message"),
        "reference": ("k", "program", "input", "output"),
        "pair": ("k", "input", "output"),
    }

    @classmethod
    def r1(cls) -> PromptTemplates:
        """AZR's DeepSeek-R1 wrapper for base models (prompt ends with ``Assistant: <think>``)."""
        return cls(wrapper=_R1_WRAPPER, response_prefix="<think>")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field if a template uses an unknown placeholder or is not a string."""
        for f in fields(self):
            value = getattr(self, f.name)
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

    # ------------------------------------------------------------------ rendering

    def wrap(self, prompt: str) -> str:
        """Apply :attr:`wrapper`."""
        return self.wrapper.format(prompt=prompt)

    def render_references(self, references: list[Task]) -> str:
        """``<snippet_k>`` blocks for deduction/abduction proposer prompts."""
        if not references:
            return self.no_references
        return "\n".join(
            self.reference.format(k=k, program=_code(t.program), input=t.input, output=t.output)
            for k, t in enumerate(references, start=1)
        )

    def proposal(
        self, task_type: TaskType, *, references: list[Task] | None = None, program: str = "", n_inputs: int = 0
    ) -> str:
        """The wrapped proposer prompt for ``task_type``."""
        if task_type is TaskType.INDUCTION:
            body = self.propose_induction.format(program=_code(program), n_inputs=n_inputs)
        else:
            template = self.propose_deduction if task_type is TaskType.DEDUCTION else self.propose_abduction
            body = template.format(references=self.render_references(references or []), banned=self.banned)
        return self.wrap(body)

    def solver(self, task: Task) -> str:
        """The wrapped solver prompt for ``task``."""
        if task.task_type is TaskType.DEDUCTION:
            body = self.solve_deduction.format(program=_code(task.program), input=task.input)
        elif task.task_type is TaskType.ABDUCTION:
            body = self.solve_abduction.format(program=_code(task.program), output=task.output)
        else:
            pairs = "\n".join(
                self.pair.format(k=k, input=i, output=o) for k, (i, o) in enumerate(task.shown_pairs, start=1)
            )
            body = self.solve_induction.format(pairs=pairs, message=task.message or "(none)")
        return self.wrap(body)


def _code(program: str) -> str:
    return program.rstrip("\n") + "\n"


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
