"""Task types and the task record shared by buffers, prompts, checking and rewards.

A task is AZR's triplet (program, input, output), generalised to several I/O pairs for induction:

- **deduction** (AZR ``code_o``): the student sees the program and one input and predicts the output;
- **abduction** (AZR ``code_i``): the student sees the program and the gold output and gives *any* input that
  yields it;
- **induction** (AZR ``code_f``): the student sees the first half of the I/O pairs plus the teacher's message and
  writes a program ``f`` that must reproduce *all* hidden (second-half) outputs.

Inputs are stored as canonical call-argument strings (``"[1, 2], 'a'"``: what goes between the parentheses
of ``f(...)``), outputs as the ``repr`` string of ``f``'s value, exactly as computed in the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class TaskType(StrEnum):
    """The three AZR task types (values are the strings used in configs and infos)."""

    DEDUCTION = "deduction"
    ABDUCTION = "abduction"
    INDUCTION = "induction"

    @classmethod
    def parse(cls, value: TaskType | str) -> TaskType:
        """Return the task type named by ``value``; ``ValueError`` naming the valid values otherwise."""
        if isinstance(value, TaskType):
            return value
        try:
            return cls(str(value))
        except ValueError:
            valid = ", ".join(t.value for t in cls)
            raise ValueError(f"unknown task type {value!r}; valid: {valid}") from None


@dataclass(frozen=True)
class Task:
    """One verified task.

    Attributes:
        task_id: unique id (``"seed-<type>-<n>"`` for shipped seeds, ``"r<round>-<teacher>-<k>"`` for proposals).
        task_type: what the student has to do.
        program: Python source defining the entry function ``f``.
        inputs: canonical call-argument strings; one for deduction/abduction, ``n`` for induction.
        outputs: ``repr`` strings of ``f(*input)`` aligned with ``inputs`` (computed in the sandbox).
        message: the teacher's natural-language hint (induction only).
        teacher: the agent that proposed it (``None`` for seeds).
        round: the round in which it was proposed (``-1`` for seeds).
    """

    task_id: str
    task_type: TaskType
    program: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    message: str = ""
    teacher: str | None = None
    round: int = -1

    @property
    def input(self) -> str:
        """The (first) input: the one input of a deduction/abduction task."""
        return self.inputs[0]

    @property
    def output(self) -> str:
        """The (first) output: the one output of a deduction/abduction task."""
        return self.outputs[0]

    @property
    def n_shown(self) -> int:
        """Number of I/O pairs shown to an induction student (the first half, AZR's ``n // 2``)."""
        return len(self.inputs) // 2

    @property
    def shown_pairs(self) -> list[tuple[str, str]]:
        """I/O pairs shown to the induction student."""
        k = self.n_shown
        return list(zip(self.inputs[:k], self.outputs[:k], strict=True))

    @property
    def hidden_pairs(self) -> list[tuple[str, str]]:
        """I/O pairs the induction student's program must reproduce."""
        k = self.n_shown
        return list(zip(self.inputs[k:], self.outputs[k:], strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (used by ``state_dict``)."""
        return {
            "task_id": self.task_id,
            "task_type": self.task_type.value,
            "program": self.program,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "message": self.message,
            "teacher": self.teacher,
            "round": self.round,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        """Inverse of :meth:`to_dict`."""
        return cls(
            task_id=str(data["task_id"]),
            task_type=TaskType.parse(data["task_type"]),
            program=str(data["program"]),
            inputs=tuple(str(x) for x in data["inputs"]),
            outputs=tuple(str(x) for x in data["outputs"]),
            message=str(data.get("message", "")),
            teacher=data.get("teacher"),
            round=int(data.get("round", -1)),
        )
