"""Scripted policies for tests, smoke runs and baselines of the game.

Each has ``act(observation, info) -> tuple[str, ...]`` with one completion per prompt of ``observation`` (the
env's ``obs[agent]``, whose ``"prompts"`` it answers, or a plain sequence of prompts such as
:meth:`~populora_env.env.PopuLoRAParallelEnv.seed_prompts` returns), guided by ``info["requests"]``:

- :class:`SeedTeacher` proposes valid tasks built from the shipped seed programs with fresh inputs, formatted
  like a model would answer;
- :class:`OracleStudent` answers every task correctly from the env's ground truth (a test tool);
- :class:`NoisyStudent` answers correctly at a given rate, else wrongly or badly formatted (scripted opponents);
- :class:`RandomPolicy` emits random printable strings (seeded): every completion is a format error.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from populora_env.literals import quiet_parse
from populora_env.seeds import SEED_PROGRAMS, SeedProgram, generate_args


def format_answer(answer: str, thought: str = "Let me work it out.") -> str:
    """Wrap ``answer`` in the ``<think>…</think><answer>…</answer>`` structure."""
    return f"<think>{thought}</think>\n<answer>\n{answer}\n</answer>"


def continue_prefix(prefix: str, answer: str | Sequence[str], thought: str = "Let me work it out.") -> str:
    """The completion that continues the response ``prefix`` of a request (``info["requests"][k]["prefix"]``) so
    that ``prefix + completion`` reads ``format_answer(answer, thought)``, or with an empty thought when the
    prefix pre-fills ``<think></think>``. ``answer`` may list equivalent answers (e.g. a proposal's blocks in
    either order: a prefix may open the input block first); the first one the prefix opens is used. If none
    is, the whole formatted first answer (the env reads the answer after the last ``<answer>``, so a pre-filled
    opening followed by it still parses)."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    for candidate in answers:
        for t in (thought, ""):
            full = format_answer(candidate, t)
            if full.startswith(prefix):
                return full[len(prefix) :]
    return format_answer(answers[0], thought)


def _prompts(observation: Mapping[str, Any] | Sequence[str]) -> Sequence[str]:
    """The prompts of an env observation (``obs[agent]["prompts"]``), or ``observation`` itself if it is a
    sequence of prompts."""
    return observation["prompts"] if isinstance(observation, Mapping) else observation


def _block(tag: str, content: str) -> str:
    return f"```{tag}\n{content.rstrip(chr(10))}\n```"


def _canonical(program: str) -> str:
    try:
        return ast.unparse(quiet_parse(program))
    except (SyntaxError, ValueError, RecursionError):
        return program


class SeedTeacher:
    """Proposes tasks from the seed programs with freshly generated inputs (never repeating itself).

    Deduction/abduction: a random seed program and a new input. Induction: the given program must be a seed
    program (true when the buffers hold only seed programs, e.g. when every teacher is a ``SeedTeacher``);
    it writes ``n_inputs`` new distinct inputs and the seed's message. An unknown program gets an answer without
    inputs (an invalid proposal).
    """

    def __init__(self, seed: int | None = None, programs: tuple[SeedProgram, ...] = SEED_PROGRAMS) -> None:
        self.rng = np.random.default_rng(seed)
        self.programs = programs
        self._by_program = {_canonical(p.program): p for p in programs}
        # never re-propose a seed's own example inputs (they are in the buffers already)
        self._used: set[tuple[str, str, str]] = {
            (tag, p.name, given) for p in programs for given in p.inputs for tag in ("deduction", "abduction")
        }

    def _fresh_args(self, seed: SeedProgram, tag: str, avoid: set[str] | None = None) -> str:
        avoid = avoid or set()
        args = generate_args(seed.arg_kinds, self.rng)
        for _ in range(100):
            if (tag, seed.name, args) not in self._used and args not in avoid:
                break
            args = generate_args(seed.arg_kinds, self.rng)
        self._used.add((tag, seed.name, args))
        return args

    def act(self, observation: Mapping[str, Any] | Sequence[str], info: Mapping[str, Any]) -> tuple[str, ...]:
        """One proposal per request of ``info["requests"]``."""
        n = len(_prompts(observation))
        out: list[str] = []
        for request in list(info.get("requests", []))[:n]:
            task_type = request.get("task_type")
            if task_type == "induction":
                out.append(self._induction(request))
            else:
                seed = self.programs[int(self.rng.integers(len(self.programs)))]
                args = self._fresh_args(seed, str(task_type))
                program, given = _block("python", seed.program), _block("input", args)
                thought = f"I reuse the {seed.name} program with a new input."
                answers = (program + "\n" + given, given + "\n" + program)
                out.append(continue_prefix(str(request.get("prefix", "")), answers, thought))
        return tuple(out) + ("",) * (n - len(out))

    def _induction(self, request: Mapping[str, Any]) -> str:
        prefix = str(request.get("prefix", ""))
        seed = self._by_program.get(_canonical(str(request.get("program", ""))))
        if seed is None:
            return continue_prefix(prefix, _block("message", "unknown program"), "I do not know this program.")
        n = int(request.get("n_inputs", 6))
        inputs: list[str] = []
        while len(inputs) < n:
            inputs.append(self._fresh_args(seed, "induction", set(inputs)))
        blocks = [_block("input", i) for i in inputs] + [_block("message", seed.message)]
        return continue_prefix(prefix, "\n".join(blocks), "Inputs that show what the program does.")


class OracleStudent:
    """Answers every assigned task correctly using the env's ground truth (``env.current_tasks``)."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def answer(self, task: Any, prefix: str = "") -> str:
        """The correct completion for ``task``, continuing the response ``prefix``."""
        kind = task.task_type.value
        if kind == "deduction":
            return continue_prefix(prefix, _block("output", task.output))
        if kind == "abduction":
            return continue_prefix(prefix, _block("input", task.input))
        return continue_prefix(prefix, _block("python", task.program))

    def act(self, observation: Mapping[str, Any] | Sequence[str], info: Mapping[str, Any]) -> tuple[str, ...]:
        """One correct answer per request."""
        tasks = self.env.current_tasks
        n = len(_prompts(observation))
        out = []
        for request in list(info.get("requests", []))[:n]:
            task = tasks.get(request.get("task_id"))
            out.append("" if task is None else self.answer(task, str(request.get("prefix", ""))))
        return tuple(out) + ("",) * (n - len(out))


class RandomPolicy:
    """Random printable strings of random length (seeded). Never well formatted in practice."""

    def __init__(self, seed: int | None = None, max_length: int = 256, charset: str = string.printable) -> None:
        if max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {max_length}")
        self.rng = np.random.default_rng(seed)
        self.max_length = max_length
        self._chars = np.array(list(charset))

    def sample(self) -> str:
        """One random string."""
        n = int(self.rng.integers(0, self.max_length + 1))
        return "".join(self._chars[self.rng.integers(0, len(self._chars), size=n)])

    def act(
        self, observation: Mapping[str, Any] | Sequence[str], info: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        """One random string per prompt."""
        return tuple(self.sample() for _ in _prompts(observation))


class NoisyStudent:
    """A scripted student that is right at a given rate: each attempt is :class:`OracleStudent`'s correct answer
    with probability ``correct``, else a wrong one, and of those a ``format_errors`` share is a format error
    (a completion without the answer structure), the rest well formatted but wrong (deduction: an output that is not the gold one;
    abduction: ``None`` as the input; induction: a program that returns ``None``). Draws come from ``seed``."""

    def __init__(self, env: Any, correct: float = 0.5, format_errors: float = 0.2, seed: int | None = None) -> None:
        for name, value in (("correct", correct), ("format_errors", format_errors)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.oracle = OracleStudent(env)
        self.correct, self.format_errors = correct, format_errors
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def wrong(task: Any, prefix: str = "") -> str:
        """A well formatted answer to ``task`` that is not the correct one."""
        kind = task.task_type.value
        if kind == "deduction":
            return continue_prefix(prefix, _block("output", "None" if task.output != "None" else "0"))
        if kind == "abduction":
            return continue_prefix(prefix, _block("input", "None"))
        return continue_prefix(prefix, _block("python", "def f(*args):\n    return None"))

    def act(self, observation: Mapping[str, Any] | Sequence[str], info: Mapping[str, Any]) -> tuple[str, ...]:
        """One answer per request: correct, wrong or a format error, drawn per attempt."""
        tasks = self.oracle.env.current_tasks
        n = len(_prompts(observation))
        out = []
        for request in list(info.get("requests", []))[:n]:
            task, prefix = tasks.get(request.get("task_id")), str(request.get("prefix", ""))
            right, malformed = self.rng.random() < self.correct, self.rng.random() < self.format_errors
            if task is None or (not right and malformed):
                out.append("I do not know.")
            else:
                out.append(self.oracle.answer(task, prefix) if right else self.wrong(task, prefix))
        return tuple(out) + ("",) * (n - len(out))
