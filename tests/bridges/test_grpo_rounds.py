"""The TRL bridge's rounds without TRL: the reward function pays what the env pays, groups are whole rounds,
the game's metrics are logged, and a saved buffer proposes its tasks again. (TRL itself: test_trl.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from populora_bridges.grpo import BufferTeacher, StudentRounds, TeacherRounds
from populora_bridges.grpo.rounds import completion_entry, completion_text, groups
from populora_bridges.metrics import round_metrics
from populora_env import OracleStudent, RandomPolicy, SeedTeacher, parallel_env
from populora_env.policies import continue_prefix
from populora_env.sandbox import Limits, Sandbox


class Plain:
    """A tokenizer stand-in without a chat template: prompts are the observations."""

    chat_template = None


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=1, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        yield sb


def _oracle_answers(rounds: StudentRounds, k: int) -> list[str]:
    """The right answer, replayed from round ``k`` (an env of the same settings, played by hand)."""
    env = parallel_env(sandbox=rounds.sandbox, **rounds.settings)
    record = rounds.rounds[k]
    env.load_state_dict(record.state)
    env.reset(seed=record.seed)
    obs, *_r, infos = env.step({"teacher_0": record.proposal})
    return list(OracleStudent(env).act(obs["student_0"], infos["student_0"]))


def test_student_rewards_are_the_envs_for_each_group_and_metrics_are_logged(sandbox: Sandbox) -> None:
    game = StudentRounds([SeedTeacher(0)], num_generations=3, tokenizer=Plain(), sandbox=sandbox, seed=1,
                         task_types=("deduction", "abduction"))
    rows = game.play(4)
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and {r["task_type"] for r in rows} == {"deduction", "abduction"}
    right0, right2 = _oracle_answers(game, 0)[0], _oracle_answers(game, 2)[0]
    completions = [right0, "garbage", right0, right2, right2, "nope"]
    logged: dict[str, list[float]] = {}
    extra: dict[str, list] = {}
    rewards = game.reward(prompts=[rows[0]["prompt"]] * 3 + [rows[2]["prompt"]] * 3, completions=completions,
                          completion_ids=[[1]] * 6, round=[0, 0, 0, 2, 2, 2],
                          log_metric=lambda n, v: logged.setdefault(n, []).append(v),
                          log_extra=lambda c, v: extra.setdefault(c, []).extend(v))
    assert rewards == [1.0, -1.0, 1.0, 1.0, 1.0, -1.0]
    assert logged["game/pair/p_hat"] == [2 / 3, 2 / 3] and logged["game/attempts/reason/format"] == [1 / 3, 1 / 3]
    assert logged["game/mean_reward/teacher"] == [1 - 2 / 3, 1 - 2 / 3]  # 1 - p̂ for the teacher of each round
    assert extra == {"round": [0, 0, 0, 2, 2, 2], "reason": ["ok", "format", "ok", "ok", "ok", "format"]}
    with pytest.raises(ValueError, match="mix rounds"):
        game.reward(prompts=[""] * 3, completions=["a"] * 3, round=[0, 0, 1])
    with pytest.raises(ValueError, match="'round' column"):
        game.reward(prompts=[""] * 3, completions=["a"] * 3)


def test_teacher_rewards_replay_each_proposal_against_the_frozen_students(sandbox: Sandbox) -> None:
    game = TeacherRounds([OracleStudent, RandomPolicy(0)], num_generations=2, tokenizer=Plain(), sandbox=sandbox,
                         seed=0, task_types=("deduction",), samples_per_task=2)
    rows = game.play(2)
    assert len(rows) == 2 and rows[0]["prompt"] != rows[1]["prompt"]
    prefix = ""  # the chat prompt set pre-fills nothing
    valid = continue_prefix(prefix, "```python\ndef f(x):\n    return x * 3\n```\n```input\n7\n```")
    rewards = game.reward(prompts=[""] * 4, completions=[valid, "junk", valid, [{"role": "assistant",
                                                                               "content": "junk"}]],
                          round=[0, 0, 1, 1])
    assert rewards[1] == rewards[3] == -1.0  # invalid
    assert set(rewards[::2]) <= {0.0}  # the oracle solves it (1 - p̂ = 0) and random text never does (0)
    with pytest.raises(ValueError, match="num_teachers"):
        TeacherRounds([OracleStudent], num_generations=2, tokenizer=Plain(), sandbox=sandbox, num_teachers=2)


def test_a_saved_buffer_proposes_its_tasks_again_and_they_are_valid(sandbox: Sandbox) -> None:
    source = parallel_env(sandbox=sandbox, num_teachers=1, num_students=1, tasks_per_teacher=2,
                          task_types=("deduction", "abduction"))
    teacher = BufferTeacher(source.state_dict()["buffers"])
    game = StudentRounds([teacher], num_generations=2, tokenizer=Plain(), sandbox=sandbox, seed=0,
                         task_types=("deduction", "abduction"), reject_duplicates=False)
    rows = game.play(4)
    assert len(rows) == 4  # every replayed seed task is valid again
    saved = {t["program"] for items in source.state_dict()["buffers"].values() for t in items}
    assert all(any(p.strip() in r["prompt"] for p in saved) for r in rows)
    source.close()


def test_round_metrics_are_rates_over_the_rounds_records() -> None:
    summary = {"proposals": {"total": 4, "valid": 1, "reasons": {"too_long": 2, "format": 1}},
               "attempts": {"total": 2, "correct": 1, "format_errors": 1, "reasons": {"format": 1}},
               "pairs": [{"p_hat": 0.5, "outcome": "draw"}, {"p_hat": None, "outcome": "teacher"}],
               "mean_reward": {"teacher": -0.5, "student": 0.0}}
    m = round_metrics(summary)
    assert m["game/proposals/valid_rate"] == 0.25 and m["game/proposals/reason/too_long"] == 0.5
    assert m["game/proposals/reason/duplicate"] == 0.0 and m["game/attempts/correct_rate"] == 0.5
    assert m["game/pair/p_hat"] == 0.5 and m["game/pair/outcome/teacher"] == 0.5
    assert m["game/mean_reward/teacher"] == -0.5
    assert "game/attempts/correct_rate" not in round_metrics({"attempts": {"total": 0}})


def test_groups_and_completion_texts() -> None:
    assert list(groups([3, 3, 1, 1], 2)) == [(0, 3), (2, 1)]
    with pytest.raises(ValueError, match="whole groups"):
        list(groups([1, 1, 1], 2))
    assert completion_text("a") == "a" and completion_text([{"role": "assistant", "content": "b"}]) == "b"
    assert completion_text(None) == "" and completion_text([]) == ""


def test_the_generated_token_counts_reach_the_scheme(sandbox: Sandbox) -> None:
    """``completion_entry`` passes TRL's ``len(completion_ids)`` with each completion: the env's attempts carry it
    as ``num_tokens`` (what a scheme's length term reads); without ids the count is ``None``."""
    game = StudentRounds([SeedTeacher(0)], num_generations=3, tokenizer=Plain(), sandbox=sandbox, seed=1,
                         task_types=("deduction",))
    rows = game.play(1)
    right = _oracle_answers(game, 0)[0]
    game.reward(prompts=[rows[0]["prompt"]] * 3, completions=[right, "x", right], completion_ids=[[1] * 3, [1] * 4,
                [1] * 5], round=[0, 0, 0])
    assert [a.num_tokens for a in game.replay_env.last_outcome.results.attempts] == [3, 4, 5]
    assert completion_entry("text", None) == "text" and completion_entry("text", [7, 8]).num_tokens == 2
