"""What a reward scheme receives: everything that happened in one round, as plain read-only records.

Every field is deterministic (a function of the round's seed, the actions and the env's state) and read-only;
docs/swapping.md, "What a scheme receives", lists them all with their types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from populora_env.complexity import ProgramMetrics, program_metrics

if TYPE_CHECKING:
    from populora_env.tasks import Task


class CompletionText(str):
    """A completion's text that also carries its length in tokens: an action entry a generator builds as
    ``CompletionText(text, len(token_ids))``. It *is* the text (a ``str``): the env checks ``str(entry)``, and a
    plain ``str`` entry is as valid (its token count is then ``None``). ``num_tokens`` reaches reward schemes as
    :attr:`ProposalResult.num_tokens` / :attr:`AttemptResult.num_tokens`."""

    num_tokens: int | None

    def __new__(cls, text: str, num_tokens: int | None = None) -> CompletionText:
        obj = super().__new__(cls, text)
        obj.num_tokens = None if num_tokens is None else int(num_tokens)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (CompletionText, (str(self), self.num_tokens))


def num_tokens_of(entry: object) -> int | None:
    """The token count an action entry carries (a :class:`CompletionText`'s non-negative ``num_tokens``), else
    ``None``."""
    n = getattr(entry, "num_tokens", None) if isinstance(entry, str) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ProposalResult:
    """One teacher completion (a proposal) and its validation verdict.

    Attributes:
        agent: the teacher.
        index: position among the teacher's completions this round (aligned with its observation).
        task_type: ``"deduction"``, ``"abduction"`` or ``"induction"``.
        task_id: id of the task (the id it would have had, if invalid).
        format_ok: tags and required blocks were present.
        valid: it became a task.
        reason: rejection reason code (``None`` if valid), see :class:`populora_env.validation.Reason`.
        tamper: the sandbox defence the program tripped (its class: ``"introspection"``, ``"native"``,
            ``"type_dict"``, ``"signal"``, ``"process"``, ``"reply_forgery"``, ``"exit"``; docs/sandbox.md
            section 7.2), decided by the sandbox, never by the program; ``None`` when it tripped none. A tampering
            proposal is invalid with reason ``"tamper"``.
        task: the parsed task (program source, inputs, gold outputs, induction message) when valid, else ``None``.
        completion: the teacher's completion text as sent (``""`` for a missing or non-string entry).
        num_tokens: the completion's length in tokens (the generator's count), ``None`` when the action entry
            carried none (a plain ``str``).
    """

    agent: str
    index: int
    task_type: str
    task_id: str
    format_ok: bool
    valid: bool
    reason: str | None
    tamper: str | None = None
    task: Task | None = None
    completion: str = ""
    num_tokens: int | None = None

    @cached_property
    def metrics(self) -> ProgramMetrics | None:
        """Complexity of the task's program (AST depth, cyclomatic complexity, lines, variables:
        :func:`populora_env.complexity.program_metrics`, the diagnostics' own), ``None`` without a task. For an
        induction task the program is the buffer program the teacher was shown."""
        return None if self.task is None else program_metrics(self.task.program)


@dataclass(frozen=True)
class AttemptResult:
    """One student completion (an attempt at a task) and its verdict.

    Attributes:
        agent: the student.
        index: position among the student's completions this round (aligned with its observation).
        task_id: the task attempted.
        task_type: its type.
        teacher: the teacher whose task this is **and** who is matched with this student this round; ``None``
            for filler tasks drawn from the buffers.
        format_ok: well formatted (tags present, answer parsable).
        correct: solved.
        reason: ``None`` if correct, else a reason code (``"format"``, ``"wrong"``, ``"error"``...).
        tamper: the sandbox defence the attempt's run tripped (an abduction input whose evaluation trips one, an
            induction program), as :attr:`ProposalResult.tamper`; such an attempt is not correct, with reason
            ``"tamper"``. ``None`` when none was tripped.
        task: the task attempted (program, inputs, gold outputs, message).
        completion: the student's completion text as sent (``""`` for a missing or non-string entry).
        answer: the text between ``<answer>`` and ``</answer>`` (after the response prefix), ``None`` on a format
            error.
        program: the submitted program of an induction answer (its last fenced block), else ``None``.
        num_tokens: the completion's length in tokens, ``None`` when the action entry carried none.
    """

    agent: str
    index: int
    task_id: str
    task_type: str
    teacher: str | None
    format_ok: bool
    correct: bool
    reason: str | None
    tamper: str | None = None
    task: Task | None = None
    completion: str = ""
    answer: str | None = None
    program: str | None = None
    num_tokens: int | None = None

    @property
    def matched(self) -> bool:
        """Whether this attempt was at a task of the student's matched teacher (counts towards p̂)."""
        return self.teacher is not None


@dataclass(frozen=True)
class MatchResult:
    """One teacher–student pair of the round.

    Attributes:
        p_ts: expected student-win probability at matching time.
        p_hat: the student's solve rate over the teacher's valid tasks (``None`` if there was none).
        outcome: ``"student"``, ``"teacher"`` or ``"draw"``.
    """

    teacher: str
    student: str
    p_ts: float
    p_hat: float | None
    n_valid: int
    n_attempts: int
    n_correct: int
    outcome: str


@dataclass(frozen=True)
class RoundResults:
    """Everything a reward scheme may use. Treat as read-only.

    Attributes:
        ratings_before: ``(mu, sigma)`` of every agent before this round's rating update (what matching saw).
        buffers: task type -> the buffer's tasks before this round's proposals entered (earlier rounds' valid
            tasks and the seeds, oldest first), for novelty and diversity terms.
    """

    round: int
    teachers: tuple[str, ...]
    students: tuple[str, ...]
    proposals: tuple[ProposalResult, ...]
    attempts: tuple[AttemptResult, ...]
    matches: tuple[MatchResult, ...]
    ratings_before: Mapping[str, tuple[float, float]] = field(default_factory=_empty, compare=False)
    buffers: Mapping[str, tuple[Task, ...]] = field(default_factory=_empty, compare=False)

    @property
    def agents(self) -> tuple[str, ...]:
        """Teachers then students."""
        return self.teachers + self.students

    @cached_property
    def _by_agent(self) -> dict[str, tuple]:
        grouped: dict[str, list] = {a: [] for a in self.agents}
        for p in self.proposals:
            grouped.setdefault(p.agent, []).append(p)
        for a in self.attempts:
            grouped.setdefault(a.agent, []).append(a)
        return {k: tuple(sorted(v, key=lambda r: r.index)) for k, v in grouped.items()}

    @cached_property
    def _solve_rates(self) -> dict[str, float]:
        counts: dict[str, list[int]] = {}
        for a in self.attempts:
            if a.teacher is None:
                continue
            c = counts.setdefault(a.task_id, [0, 0])
            c[0] += int(a.correct)
            c[1] += 1
        return {task: correct / total for task, (correct, total) in counts.items()}

    def proposals_of(self, teacher: str) -> tuple[ProposalResult, ...]:
        """The teacher's proposals in completion order."""
        return tuple(r for r in self._by_agent.get(teacher, ()) if isinstance(r, ProposalResult))

    def attempts_of(self, student: str) -> tuple[AttemptResult, ...]:
        """The student's attempts in completion order."""
        return tuple(r for r in self._by_agent.get(student, ()) if isinstance(r, AttemptResult))

    def n_completions(self, agent: str) -> int:
        """How many completions ``agent`` produced this episode (teachers: proposals; students: attempts)."""
        return len(self._by_agent.get(agent, ()))

    def solve_rate(self, task_id: str) -> float | None:
        """p̂ of a task: fraction of correct attempts by the matched student; ``None`` if never attempted."""
        return self._solve_rates.get(task_id)

    def match_of(self, teacher: str) -> MatchResult | None:
        """The pair the teacher was in."""
        for m in self.matches:
            if m.teacher == teacher:
                return m
        return None


@dataclass(frozen=True)
class RoundOutcome:
    """A finished round: what happened (:class:`RoundResults`), what everyone was paid, and the summary.

    This is the typed record a training loop learns from (``env.last_outcome`` after the solve step): every
    completion is identified by ``(agent, index)``, its position in the agent's observation of its phase, so
    rewards, verdicts and the loop's own completions are joined by that id, never by list position.

    Attributes:
        results: the round's proposals, attempts and matches.
        rewards: per agent, one reward per completion, indexed like the agent's records
            (``rewards[agent][record.index]``).
        ratings: ``(mu, sigma)`` of every agent after the round's rating update.
        summary: the ``infos[a]["round"]`` dictionary (counts, metrics, buffer sizes) for logging.
    """

    results: RoundResults
    rewards: dict[str, tuple[float, ...]]
    ratings: dict[str, tuple[float, float]]
    summary: dict

    def reward(self, agent: str, index: int) -> float:
        """The reward of completion ``index`` of ``agent``."""
        return self.rewards[agent][index]
