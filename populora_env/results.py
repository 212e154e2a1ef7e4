"""What a reward scheme receives: everything that happened in one round, as plain read-only records."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


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
    """

    agent: str
    index: int
    task_type: str
    task_id: str
    format_ok: bool
    valid: bool
    reason: str | None
    tamper: str | None = None


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
    """Everything a reward scheme may use. Treat as read-only."""

    round: int
    teachers: tuple[str, ...]
    students: tuple[str, ...]
    proposals: tuple[ProposalResult, ...]
    attempts: tuple[AttemptResult, ...]
    matches: tuple[MatchResult, ...]

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
