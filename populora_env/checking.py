"""Checking of student answers. Every comparison of values happens in the sandbox.

Per task type (AZR semantics, docs/azr.md §5):

- **deduction**: the answer (last ```` ```output ```` block, else the whole answer) must parse as an expression,
  else it is a format error (or, with ``unparseable_is_format_error=False`` as in AZR, a wrong answer with
  reason ``parse_error``; likewise for the two parse failures below); it must be a Python literal, else it is wrong (``not_literal``: an arbitrary
  expression could build an object whose ``__eq__`` always says yes). The sandbox evaluates
  ``<gold output> == <answer>`` (Python value equality: ``1 == 1.0``, dict order irrelevant).
- **abduction**: the answer (last ```` ```input ```` block, else the whole answer) must parse as an argument
  list (format error otherwise) of literals (``not_literal`` otherwise). The sandbox runs the program on it and
  compares ``f(answer) == <gold output>``; **any** pre-image counts. ``f``'s value must be plain data.
- **induction**: the answer's last fenced block must parse as Python (format error otherwise), define ``f``
  and pass the safety policy (``no_f`` / ``banned`` otherwise: AZR never filtered solver programs). The sandbox
  runs it once per hidden pair, in a fresh process each; it is correct only if **all** hidden outputs match.

Identical answers to the same task are checked once (students often repeat themselves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from populora_env.literals import (
    PLAIN_GUARD,
    PLAIN_HELPER,
    ArgsError,
    literal_value,
    parse_call_args,
    parse_expression,
)
from populora_env.parsing import extract_answer, parse_input_answer, parse_output_answer, parse_program_answer
from populora_env.sandbox import ExecJob, ExecResult
from populora_env.tasks import Task, TaskType
from populora_env.validation import Reason, check_program, failure_reason


@dataclass(frozen=True)
class AttemptOutcome:
    """Verdict on one student completion.

    Attributes:
        format_ok: tag structure present and the answer parsable (a format error earns the format penalty).
        correct: the answer solves the task.
        reason: ``None`` if correct, else a :class:`Reason` (``format``, ``wrong``, ``not_literal``, ``error``,
            ``timeout``, ``memory``, ``no_f``, ``banned``, ``too_long``...).
        detail: short explanation.
    """

    format_ok: bool
    correct: bool
    reason: Reason | None
    detail: str = ""


@dataclass(frozen=True)
class CheckConfig:
    """Settings of answer checking."""

    require_think: bool = True
    response_prefix: str = ""
    response_prefixes: Mapping[str, str] = field(default_factory=dict)
    lenient_answer_close: bool = False
    max_program_chars: int = 4000
    timeout_s: float | None = None
    unparseable_is_format_error: bool = True
    """An answer inside well-formed tags whose payload does not parse is a format error (reason ``format``);
    ``False`` (AZR) makes it a well-formatted wrong answer (reason ``parse_error``)."""

    def prefix_for(self, task_type: TaskType) -> str:
        """The response prefix of answers to ``task_type`` tasks (``response_prefixes`` by task-type value,
        else ``response_prefix``), prepended to the completion before the format check."""
        return self.response_prefixes.get(task_type.value, self.response_prefix)


class AnswerChecker:
    """Checks a round's student completions in (at most) two batched sandbox calls: the first job of every
    distinct answer, then the remaining hidden pairs of induction programs that passed their first pair (a
    wrong or looping program costs one execution, not one per hidden pair)."""

    def __init__(self, config: CheckConfig) -> None:
        self.config = config

    def check(self, tasks: Sequence[Task], completions: Sequence[object], sandbox: Any) -> list[AttemptOutcome]:
        """Verdicts for ``completions[i]`` as answers to ``tasks[i]``."""
        outcomes: list[AttemptOutcome | None] = [None] * len(tasks)
        groups: dict[tuple[str, str], list[ExecJob]] = {}  # (task_id, answer key) -> its jobs
        waiting: list[tuple[int, tuple[str, str]]] = []
        for slot, (task, completion) in enumerate(zip(tasks, completions, strict=True)):
            prepared = self._prepare(task, completion)
            if isinstance(prepared, AttemptOutcome):
                outcomes[slot] = prepared
                continue
            answer_key, task_jobs = prepared
            key = (task.task_id, answer_key)
            groups.setdefault(key, task_jobs)
            waiting.append((slot, key))
        keys = list(groups)
        first: list[ExecResult] = sandbox.run([groups[k][0] for k in keys]) if keys else []
        verdicts: dict[tuple[str, str], AttemptOutcome] = {}
        rest_jobs: list[ExecJob] = []
        rest_of: dict[tuple[str, str], tuple[int, int]] = {}
        for key, result in zip(keys, first, strict=True):
            jobs = groups[key]
            verdict = _verdict([result], jobs[:1])
            if verdict.correct and len(jobs) > 1:
                rest_of[key] = (len(rest_jobs), len(jobs) - 1)
                rest_jobs.extend(jobs[1:])
            else:
                verdicts[key] = verdict
        rest: list[ExecResult] = sandbox.run(rest_jobs) if rest_jobs else []
        for key, (start, count) in rest_of.items():
            verdicts[key] = _verdict(rest[start : start + count], groups[key][1:])
        for slot, key in waiting:
            outcomes[slot] = verdicts[key]
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    def _prepare(self, task: Task, completion: object) -> AttemptOutcome | tuple[str, list[ExecJob]]:
        cfg = self.config
        formatted = extract_answer(
            completion, require_think=cfg.require_think, prefix=cfg.prefix_for(task.task_type),
            require_close=not cfg.lenient_answer_close,
        )
        if not formatted.format_ok:
            return AttemptOutcome(False, False, Reason.FORMAT, "no <think>…</think><answer>…</answer> structure")
        answer = formatted.answer
        timeout = cfg.timeout_s
        if task.task_type is TaskType.DEDUCTION:
            text = parse_output_answer(answer)
            canonical = parse_expression(text)
            if canonical is None:
                return self._unparseable("answer is not a Python expression")
            ok, _ = literal_value(canonical)
            if not ok:
                return AttemptOutcome(True, False, Reason.NOT_LITERAL, "answer is not a Python literal")
            return canonical, [ExecJob(code="", call=task.output, compare_to=canonical, timeout_s=timeout)]
        if task.task_type is TaskType.ABDUCTION:
            text = parse_input_answer(answer)
            try:
                args = parse_call_args(text)
            except ArgsError as exc:
                if exc.kind == "parse_error":
                    return self._unparseable("answer is not an argument list")
                return AttemptOutcome(True, False, Reason.NOT_LITERAL, exc.detail)
            call = f"{PLAIN_GUARD}(f({args.canonical}))"
            job = ExecJob(code=task.program + PLAIN_HELPER, call=call, compare_to=task.output, timeout_s=timeout)
            return args.canonical, [job]
        program = parse_program_answer(answer)
        if program is None:
            return AttemptOutcome(False, False, Reason.FORMAT, "answer has no fenced code block")
        checked = check_program(program, cfg.max_program_chars, require_params=False)
        if checked.reason is Reason.PARSE_ERROR:
            return self._unparseable(checked.detail)
        if checked.reason is not None:
            return AttemptOutcome(True, False, checked.reason, checked.detail)
        code = program + PLAIN_HELPER
        jobs = [
            ExecJob(code=code, call=f"{PLAIN_GUARD}(f({inp}))", compare_to=out, timeout_s=timeout)
            for inp, out in task.hidden_pairs
        ]
        return program, jobs

    def _unparseable(self, detail: str) -> AttemptOutcome:
        """The verdict on a well-tagged answer whose payload does not parse (``CheckConfig``'s switch)."""
        if self.config.unparseable_is_format_error:
            return AttemptOutcome(False, False, Reason.FORMAT, detail)
        return AttemptOutcome(True, False, Reason.PARSE_ERROR, detail)


def _same_value_on_host(result: ExecResult, job: ExecJob) -> bool:
    """Host-side confirmation of a sandbox ``match``: the reported value and the expected one are both plain
    literals and equal. Code under test can forge its own reply frame (the sandbox cannot stop a job from
    writing one), so a forged ``match=True`` alone must not pay; forging the right *value* would require
    knowing the hidden answer. Literal values are builtins only, so this ``==`` runs no model code."""
    if result.value is None or job.compare_to is None:
        return False
    ok_value, value = literal_value(result.value)
    ok_expected, expected = literal_value(job.compare_to)
    try:
        return bool(ok_value and ok_expected and value == expected)
    except RecursionError:
        return False


def _verdict(results: Sequence[ExecResult], jobs: Sequence[ExecJob]) -> AttemptOutcome:
    for result, job in zip(results, jobs, strict=True):
        failed = failure_reason(result)
        if failed is not None:
            return AttemptOutcome(True, False, failed[0], failed[1])
        if result.match is not True or not _same_value_on_host(result, job):
            return AttemptOutcome(True, False, Reason.WRONG, "value differs")
    return AttemptOutcome(True, True, None, "")
