"""Checking of student answers. Programs run in the sandbox; every comparison with a hidden answer happens on
the host, and no expected value is ever sent to a sandbox job.

Per task type (AZR semantics, docs/azr.md §5):

- **deduction**: the answer (last ```` ```output ```` block, else the whole answer) must parse as an expression,
  else it is a format error (or, with ``unparseable_is_format_error=False`` as in AZR, a wrong answer with
  reason ``parse_error``; likewise for the two parse failures below); it must be a Python literal, else it is wrong (``not_literal``: an arbitrary
  expression could build an object whose ``__eq__`` always says yes). The host compares the two literal
  values, ``<gold output> == <answer>`` (Python value equality: ``1 == 1.0``, dict order irrelevant); nothing
  runs in the sandbox.
- **abduction**: the answer (last ```` ```input ```` block, else the whole answer) must parse as an argument
  list (format error otherwise) of literals (``not_literal`` otherwise). The sandbox runs the teacher's program
  on it **twice**, as validation ran it on the teacher's own input (two processes, the second with its heap
  shifted), and returns ``repr(f(answer))`` (``f``'s value must be plain data); the host parses it as a literal
  and compares it with the gold output; **any** pre-image counts. Two runs that disagree (values, or one failing)
  make the verdict ``nondeterministic``: the program is not a function of its input there, so the answer cannot
  be judged, and the env then voids the task (its proposal counts as invalid, it leaves the buffers), so a
  program random on every input but its own cannot set its own solve rate.
- **induction**: the answer's last fenced block must parse as Python (format error otherwise), define ``f``
  and pass the safety policy (``no_f`` / ``banned`` otherwise: AZR never filtered solver programs). The sandbox
  runs it once per hidden input, in a fresh process each, and returns the value; it is correct only if **all**
  hidden outputs equal the returned values, compared on the host.

A run that trips a sandbox defence is never correct (reason ``tamper``, with the defence's class), even if the
program caught the refusal and returned the right value; a run that draws randomness is ``nondeterministic``
(``docs/sandbox.md`` section 7.3). An abduction answer's runs are the teacher's program: the env voids its task
for either verdict, as for two runs that disagree.

Threat model (``docs/sandbox.md`` §7): a job's reply is the job's own word. The job never holds the expected
value (the program, the call and the input are all it gets), so the only way to a "correct" verdict is to return
the right value; a program that forges its reply frame must still guess the hidden output.

Identical answers to the same task are checked once (students often repeat themselves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from populora_env import defaults
from populora_env.checks import check_bool, check_int
from populora_env.literals import (
    ArgsError,
    literal_matches,
    literal_value,
    parse_call_args,
    parse_expression,
    same_value,
    with_heap_padding,
)
from populora_env.parsing import extract_answer, parse_input_answer, parse_output_answer, parse_program_answer
from populora_env.sandbox import ExecJob, ExecResult
from populora_env.tasks import Task, TaskType
from populora_env.validation import (
    Reason,
    check_program,
    check_response_prefixes,
    check_timeout,
    failure_reason,
)


@dataclass(frozen=True)
class AttemptOutcome:
    """Verdict on one student completion.

    Attributes:
        format_ok: tag structure present and the answer parsable (a format error earns the format penalty).
        correct: the answer solves the task.
        reason: ``None`` if correct, else a :class:`Reason` (``format``, ``wrong``, ``not_literal``, ``error``,
            ``timeout``, ``memory``, ``no_f``, ``banned``, ``too_long``...).
        detail: short explanation.
        tamper: the sandbox defence the attempt's run tripped (reason ``tamper``), ``None`` otherwise.
    """

    format_ok: bool
    correct: bool
    reason: Reason | None
    detail: str = ""
    tamper: str | None = None


@dataclass(frozen=True)
class CheckConfig:
    """Settings of answer checking."""

    require_think: bool = defaults.REQUIRE_THINK
    response_prefix: str = ""
    response_prefixes: Mapping[str, str] = field(default_factory=dict)
    lenient_answer_close: bool = defaults.LENIENT_ANSWER_CLOSE
    max_program_chars: int = defaults.MAX_PROGRAM_CHARS
    timeout_s: float | None = None
    unparseable_is_format_error: bool = True
    """An answer inside well-formed tags whose payload does not parse is a format error (reason ``format``);
    ``False`` (AZR) makes it a well-formatted wrong answer (reason ``parse_error``)."""

    def validate(self) -> None:
        """Check every setting; raise :class:`~populora_env.checks.ConfigError` naming the first bad one."""
        for name in ("require_think", "lenient_answer_close", "unparseable_is_format_error"):
            check_bool(name, getattr(self, name))
        check_response_prefixes(self.response_prefix, self.response_prefixes)
        check_int("max_program_chars", self.max_program_chars, 1)
        check_timeout(self.timeout_s)

    def prefix_for(self, task_type: TaskType) -> str:
        """The response prefix of answers to ``task_type`` tasks (``response_prefixes`` by task-type value,
        else ``response_prefix``), prepended to the completion before the format check."""
        return self.response_prefixes.get(task_type.value, self.response_prefix)


class AnswerChecker:
    """Checks a round's student completions in (at most) two batched sandbox calls: the first job of every
    distinct answer (both runs of an abduction answer), then the remaining hidden pairs of induction programs
    that passed their first pair (a wrong or looping program costs one execution, not one per hidden pair)."""

    def __init__(self, config: CheckConfig) -> None:
        config.validate()
        self.config = config

    def check(self, tasks: Sequence[Task], completions: Sequence[object], sandbox: Any) -> list[AttemptOutcome]:
        """Verdicts for ``completions[i]`` as answers to ``tasks[i]``."""
        outcomes: list[AttemptOutcome | None] = [None] * len(tasks)
        groups: dict[tuple[str, str], list[tuple[ExecJob, str]]] = {}  # (task_id, answer key) -> jobs, outputs
        twice: set[tuple[str, str]] = set()  # abduction answers: both runs go in the first batch
        waiting: list[tuple[int, tuple[str, str]]] = []
        for slot, (task, completion) in enumerate(zip(tasks, completions, strict=True)):
            prepared = self._prepare(task, completion)
            if isinstance(prepared, AttemptOutcome):
                outcomes[slot] = prepared
                continue
            answer_key, task_jobs = prepared
            key = (task.task_id, answer_key)
            groups.setdefault(key, task_jobs)
            if task.task_type is TaskType.ABDUCTION:
                twice.add(key)
            waiting.append((slot, key))
        keys = list(groups)
        batch = [job for k in keys for job, _ in groups[k][: 2 if k in twice else 1]]
        ran: list[ExecResult] = sandbox.run(batch) if batch else []
        verdicts: dict[tuple[str, str], AttemptOutcome] = {}
        rest_jobs: list[ExecJob] = []
        rest_of: dict[tuple[str, str], tuple[int, int]] = {}
        at = 0
        for key in keys:
            jobs = groups[key]
            if key in twice:
                verdicts[key] = _twice_verdict(ran[at], ran[at + 1], jobs[0])
                at += 2
                continue
            verdict = _verdict([ran[at]], jobs[:1])
            at += 1
            if verdict.correct and len(jobs) > 1:
                rest_of[key] = (len(rest_jobs), len(jobs) - 1)
                rest_jobs.extend(job for job, _ in jobs[1:])
            else:
                verdicts[key] = verdict
        rest: list[ExecResult] = sandbox.run(rest_jobs) if rest_jobs else []
        for key, (start, count) in rest_of.items():
            verdicts[key] = _verdict(rest[start : start + count], groups[key][1:])
        for slot, key in waiting:
            outcomes[slot] = verdicts[key]
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    def answer_parts(self, task: Task, completion: object) -> tuple[str | None, str | None]:
        """What a completion answered, as :meth:`check` parses it: the text inside ``<answer>…</answer>`` (``None``
        on a format error) and, for an induction task, the submitted program (its last fenced block, ``None``
        if there is none). Host-side parsing only; nothing runs."""
        cfg = self.config
        formatted = extract_answer(
            completion, require_think=cfg.require_think, prefix=cfg.prefix_for(task.task_type),
            require_close=not cfg.lenient_answer_close,
        )
        if not formatted.format_ok:
            return None, None
        program = parse_program_answer(formatted.answer) if task.task_type is TaskType.INDUCTION else None
        return formatted.answer, program

    def _prepare(self, task: Task, completion: object) -> AttemptOutcome | tuple[str, list[tuple[ExecJob, str]]]:
        """The verdict, when the host can give it alone, else the answer's key and its jobs, each with the
        expected output that stays on the host."""
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
            if literal_matches(canonical, task.output):  # two literals: compared here, no job needed
                return AttemptOutcome(True, True, None, "")
            return AttemptOutcome(True, False, Reason.WRONG, "value differs")
        if task.task_type is TaskType.ABDUCTION:
            text = parse_input_answer(answer)
            try:
                args = parse_call_args(text)
            except ArgsError as exc:
                if exc.kind == "parse_error":
                    return self._unparseable("answer is not an argument list")
                return AttemptOutcome(True, False, Reason.NOT_LITERAL, exc.detail)
            call = f"f({args.canonical})"
            first = ExecJob(code=task.program, call=call, timeout_s=timeout, plain=True)
            second = ExecJob(code=with_heap_padding(task.program), call=call, timeout_s=timeout, plain=True)
            return args.canonical, [(first, task.output), (second, task.output)]
        program = parse_program_answer(answer)
        if program is None:
            return AttemptOutcome(False, False, Reason.FORMAT, "answer has no fenced code block")
        checked = check_program(program, cfg.max_program_chars, require_params=False)
        if checked.reason is Reason.PARSE_ERROR:
            return self._unparseable(checked.detail)
        if checked.reason is not None:
            return AttemptOutcome(True, False, checked.reason, checked.detail)
        jobs = [(ExecJob(code=program, call=f"f({inp})", timeout_s=timeout, plain=True), out)
                for inp, out in task.hidden_pairs]
        return program, jobs

    def _unparseable(self, detail: str) -> AttemptOutcome:
        """The verdict on a well-tagged answer whose payload does not parse (``CheckConfig``'s switch)."""
        if self.config.unparseable_is_format_error:
            return AttemptOutcome(False, False, Reason.FORMAT, detail)
        return AttemptOutcome(True, False, Reason.PARSE_ERROR, detail)


def _verdict(results: Sequence[ExecResult], jobs: Sequence[tuple[ExecJob, str]]) -> AttemptOutcome:
    """Correct iff every run returned a value equal (on the host, as literals) to its expected output.

    ``result.value`` is the job's claim: the job never saw the expected output, so a claim equal to it is the
    right answer, however the job produced its reply. Literal values are builtins only, so this ``==`` runs no
    model code.
    """
    for result, (_, expected) in zip(results, jobs, strict=True):
        failed = failure_reason(result)
        if failed is not None:
            return AttemptOutcome(True, False, failed[0], failed[1], tamper=result.tamper)
        if result.value is None or not literal_matches(result.value, expected):
            return AttemptOutcome(True, False, Reason.WRONG, "value differs")
    return AttemptOutcome(True, True, None, "")


def _twice_verdict(first: ExecResult, second: ExecResult, job: tuple[ExecJob, str]) -> AttemptOutcome:
    """An abduction answer's verdict from its two runs: ``tamper`` when either tripped a sandbox defence,
    ``nondeterministic`` when either drew randomness or they disagree (a value and a failure, two different
    values, two different kinds of failure), else the verdict of the first."""
    for run in (first, second):
        if run.tamper is not None:
            return AttemptOutcome(True, False, Reason.TAMPER,
                                  f"the program tripped a sandbox defence ({run.tamper})", tamper=run.tamper)
    if first.entropy or second.entropy:
        return AttemptOutcome(True, False, Reason.NONDETERMINISTIC, "the program drew randomness")
    failed, again = failure_reason(first), failure_reason(second)
    if (failed is None) != (again is None):
        return AttemptOutcome(True, False, Reason.NONDETERMINISTIC, "one of two runs of the program failed")
    if failed is not None and again is not None:
        if failed[0] is not again[0]:
            return AttemptOutcome(True, False, Reason.NONDETERMINISTIC, "two runs failed differently")
        return AttemptOutcome(True, False, failed[0], failed[1])
    if first.value is None or second.value is None or not same_value(first.value, second.value):
        return AttemptOutcome(True, False, Reason.NONDETERMINISTIC, "two runs returned different values")
    return _verdict([first], [job])
