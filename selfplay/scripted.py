"""Scripted opponents: agents of a run whose completions come from a scripted policy instead of their adapter.

Why: a run of a tiny model never writes a valid task, so a new reward scheme, estimator or rule shows only its
invalid branch. With ``scripted.teachers = N`` the first ``N`` teachers propose the env's seed programs with
fresh inputs (:class:`populora_env.SeedTeacher`: valid tasks); with ``scripted.students = N`` the first ``N``
students answer like :class:`populora_env.NoisyStudent` (correct with probability ``scripted.correct``, else
wrong, a ``scripted.format_errors`` share of those badly formatted). The env treats their completions as any
other (validation, checking, rewards, ratings, buffers); the trainer never sees them: only the learners'
rollouts are updated on.

Reproducibility: each round's policies are drawn afresh from the run's seed, the step, the phase and the agent
(:func:`selfplay.loop.derive_seed`), so a resumed run scripts what the uninterrupted one did. Each scripted
completion's token ids are its text's tokens (what reward schemes read as ``num_tokens``), with log-probs 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from populora_env.checks import check_int, check_number
from populora_env.policies import NoisyStudent, SeedTeacher

CompletionId = tuple[str, int]


@dataclass
class ScriptedConfig:
    """Scripted opponents (docs/swapping.md, "Scripted opponents"); the default scripts nobody."""

    teachers: int = 0
    """How many teachers (the first ones: teacher_0, ...) propose scripted seed-program tasks (all valid)."""
    students: int = 0
    """How many students (the first ones) answer like a noisy oracle (correct, wrong, badly formatted)."""
    correct: float = 0.5
    """Probability that a scripted student's attempt is correct."""
    format_errors: float = 0.2
    """Share of a scripted student's wrong attempts that are badly formatted (the rest: well formatted, wrong)."""

    def validate(self, num_teachers: int = 1 << 20, num_students: int = 1 << 20) -> None:
        """Check every setting (counts within the env's agents); raise ``ConfigError`` naming the first bad one."""
        check_int("teachers", self.teachers, 0, num_teachers)
        check_int("students", self.students, 0, num_students)
        check_number("correct", self.correct, low=0.0, high=1.0)
        check_number("format_errors", self.format_errors, low=0.0, high=1.0)

    @property
    def active(self) -> bool:
        """Whether any agent is scripted."""
        return bool(self.teachers or self.students)


class ScriptedOpponents:
    """The scripted agents of a run and their completions (module docstring).

    Args:
        cfg: the ``scripted`` section.
        teachers, students: the env's agents of each role, in order.
        seed_of: ``(step_index, phase, agent) -> seed`` of a round's policy.
        tokenize: text -> token ids (the run's tokenizer).
    """

    def __init__(
        self,
        cfg: ScriptedConfig,
        teachers: Sequence[str],
        students: Sequence[str],
        seed_of: Callable[[int, str, str], int],
        tokenize: Callable[[str], list[int]],
    ) -> None:
        self.cfg = cfg
        self.teachers = tuple(teachers[: cfg.teachers])
        self.students = tuple(students[: cfg.students])
        self.agents = frozenset(self.teachers + self.students)
        self._seed_of, self._tokenize = seed_of, tokenize

    def texts(
        self,
        env: Any,
        agent: str,
        observation: Mapping[str, Any],
        info: Mapping[str, Any],
        step_index: int,
        phase: str,
    ) -> tuple[str, ...]:
        """The scripted agent's completions of this phase, one per prompt of its observation."""
        seed = self._seed_of(step_index, phase, agent)
        if agent in self.teachers:
            return SeedTeacher(seed=seed).act(observation, info)
        return NoisyStudent(env, self.cfg.correct, self.cfg.format_errors, seed=seed).act(observation, info)

    def completions(
        self,
        env: Any,
        obs: Mapping[str, Mapping[str, Any]],
        infos: Mapping[str, Mapping[str, Any]],
        step_index: int,
        phase: str,
    ) -> dict[CompletionId, Any]:
        """Every scripted agent's completions of this phase as the generator's records
        (:class:`agents.generation.Completion`), keyed like the loop's."""
        from agents.generation import Completion

        out: dict[CompletionId, Any] = {}
        for agent in sorted(self.agents & set(obs)):
            prompts = list(obs[agent]["prompts"])
            if not prompts:
                continue
            for k, text in enumerate(
                self.texts(env, agent, obs[agent], infos.get(agent, {}), step_index, phase)
            ):
                ids = self._tokenize(text)
                out[(agent, k)] = Completion(
                    request_index=-1,
                    sample_index=0,
                    adapter=None,
                    text=text,
                    prompt_token_ids=[],
                    token_ids=ids,
                    logprobs=[0.0] * len(ids),
                )
        return out

    def learners_only(self, batches: Mapping[str, list]) -> dict[str, list]:
        """The members' rollouts without the scripted agents' (``Rollout.meta["agent"]``): what is trained on."""
        out = {}
        for member, rollouts in batches.items():
            kept = [r for r in rollouts if r.meta.get("agent") not in self.agents]
            if kept:
                out[member] = kept
        return out
