"""What a reward scheme receives beyond ids and verdicts (docs/swapping.md, "What a scheme receives"): the parsed
task, the completion texts and token counts, the program complexity, the attempt's answer and induction program,
the ratings before the round and the buffers before its proposals; and named reward terms."""

from __future__ import annotations

import pytest

from populora_env import (
    CompletionText,
    OracleStudent,
    RoundResults,
    SchemeRewards,
    SeedTeacher,
    parallel_env,
    program_metrics,
    register_reward_scheme,
    unregister_reward_scheme,
)
from populora_env.rewards import RewardSchemeError, compute_rewards

SEEN: list[RoundResults] = []


@register_reward_scheme("test_only_record")
def _record(results: RoundResults) -> dict[str, list[float]]:
    SEEN.append(results)
    from populora_env.rewards import populora_rewards

    return populora_rewards(results)


@pytest.fixture(autouse=True, scope="module")
def _unregister():
    yield
    unregister_reward_scheme("test_only_record")


def _env(**kw):
    return parallel_env(
        num_teachers=1,
        num_students=1,
        tasks_per_teacher=3,
        samples_per_task=2,
        sandbox_workers=1,
        task_types=("deduction", "abduction", "induction"),
        **kw,
    )


def _round(env, wrap, oracle_every: int = 2):
    """One round: seed-program proposals, correct answers at every ``oracle_every``-th attempt (others empty);
    each completion passed through ``wrap(text, k)``."""
    obs, infos = env.reset(seed=3)
    teacher, oracle = SeedTeacher(seed=1), OracleStudent(env)
    proposals = teacher.act(obs["teacher_0"], infos["teacher_0"])
    obs, _, _, _, infos = env.step({"teacher_0": [wrap(t, k) for k, t in enumerate(proposals)]})
    answers = oracle.act(obs["student_0"], infos["student_0"])
    answers = [wrap(t if k % oracle_every == 0 else "", k) for k, t in enumerate(answers)]
    env.step({"student_0": answers})
    return env.last_outcome, proposals, answers


def test_a_scheme_sees_the_task_texts_tokens_complexity_answers_ratings_and_buffers() -> None:
    env = _env(reward_scheme="test_only_record")
    try:
        _round(env, lambda t, k: t)  # a first round: its tasks are in the buffers before the second
        ratings = dict(env.last_outcome.ratings)
        SEEN.clear()
        outcome, proposals, answers = _round(env, lambda t, k: CompletionText(t, 10 + k))
    finally:
        env.close()
    results = SEEN[-1]
    assert results is outcome.results
    valid = [p for p in results.proposals if p.valid]
    assert valid and {p.task_type for p in valid} == {"deduction", "abduction", "induction"}
    for p in results.proposals:
        assert p.completion == proposals[p.index] and type(p.completion) is str
        assert p.num_tokens == 10 + p.index
    for p in valid:
        assert p.task is not None and p.task.task_id == p.task_id and p.task.inputs and p.task.outputs
        assert p.metrics == program_metrics(p.task.program) and p.metrics.ast_depth > 1 and p.metrics.loc >= 2
    induction = next(p for p in valid if p.task_type == "induction")
    assert induction.task.message and len(induction.task.inputs) == env.config.induction_inputs
    assert [a.completion for a in results.attempts] == answers
    for a in results.attempts:
        assert a.num_tokens == 10 + a.index and a.task is not None and a.task.task_id == a.task_id
        if a.correct:
            assert a.answer is not None and a.answer.strip()
            assert (a.program is not None) == (a.task_type == "induction")
        else:
            assert a.answer is None and a.program is None  # the empty completions: format errors
    assert any(a.program and "def f" in a.program for a in results.attempts)
    assert dict(results.ratings_before) == ratings  # what the first round left, before this round's update
    assert dict(results.ratings_before) != outcome.ratings
    this_round = {p.task_id for p in valid}
    in_buffers = {t.task_id for tasks in results.buffers.values() for t in tasks}
    assert not this_round & in_buffers and any(t.round == 0 for ts in results.buffers.values() for t in ts)
    assert any(t.round == -1 for ts in results.buffers.values() for t in ts)  # the seeds
    with pytest.raises(TypeError):
        results.buffers["deduction"] = ()  # read-only


def test_token_counts_leave_every_reward_and_verdict_as_plain_text_gives_them() -> None:
    """A ``CompletionText`` is its text: the same round with and without token counts pays the same."""
    outs = []
    for wrap in (lambda t, k: t, lambda t, k: CompletionText(t, 7)):
        env = _env()
        try:
            outs.append(_round(env, wrap)[0])
        finally:
            env.close()
    plain, counted = outs
    assert plain.rewards == counted.rewards and plain.summary == counted.summary
    assert [p.valid for p in plain.results.proposals] == [p.valid for p in counted.results.proposals]
    assert {p.num_tokens for p in plain.results.proposals} == {None}
    assert {a.num_tokens for a in counted.results.attempts} == {7}


def test_named_terms_reach_the_round_summary_and_are_checked() -> None:
    def scheme(results, bad=False):
        rewards = {a: [0.0] * results.n_completions(a) for a in results.agents}
        n = results.n_completions("teacher_0")
        terms = {
            "bonus": {"teacher_0": [1.0] * (n + bad)},
            "penalty": {"student_0": [-0.5] * results.n_completions("student_0")},
        }
        return SchemeRewards(rewards, terms)

    env = _env(reward_scheme=scheme)
    try:
        outcome = _round(env, lambda t, k: t)[0]
        assert outcome.summary["reward_terms"] == {"bonus": {"teacher": 1.0}, "penalty": {"student": -0.5}}
        with pytest.raises(RewardSchemeError, match="term 'bonus'"):
            compute_rewards(scheme, outcome.results, {"bad": True})
    finally:
        env.close()
    env = _env()
    try:
        assert "reward_terms" not in _round(env, lambda t, k: t)[0].summary  # a plain scheme: nothing added
    finally:
        env.close()
