"""The TRL bridge: both examples train 2 GRPO steps on tiny-random, and what TRL recorded is the game's.

For every completion TRL scored (its completions tables, ``completions/*.parquet``), this test replays the round
itself with ``populora_env`` alone (the saved state and seed, the teacher's proposal, the completions) and
compares the env's per-completion rewards with the reward TRL received, value for value; the trained adapter's
LoRA B matrices (zero at PEFT's init) are no longer zero; and the game's metrics are in TRL's log history.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from populora_env import OracleStudent, get_prompt_set, parallel_env
from tests.bridges.marks import extra_marks
from tests.test_examples import run_example

# Each example trains 2 steps (about a minute on 2 loaded cores): slow, run by CI's bridges step (docs/testing.md).
pytestmark = [*extra_marks("trl", ("trl", "peft", "datasets", "pandas")), pytest.mark.slow]

STUDENT_GAME = dict(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=4, student_fill=False,
                    task_types=("deduction",), prompts="small", lenient_answer_close=True, sandbox_workers=1)


def teacher_game() -> dict:
    small = get_prompt_set("small")
    prompts = replace(small, prefix_propose_induction=small.prefix_propose_induction
                      + "1\n```\n```input\n2\n```\n```message\n")
    return dict(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=2, task_types=("induction",),
                hand_seeds="identity", induction_inputs=2, max_message_chars=10, prompts=prompts,
                lenient_answer_close=True, sandbox_workers=1)


def scored(out: Path, column: str) -> list[tuple[int, list[str], list[float]]]:
    """(round, completions, rewards) of every GRPO group TRL scored, from its completions tables."""
    import pandas as pd

    groups = []
    for table in sorted((out / "completions").glob("completions_*.parquet")):
        df = pd.read_parquet(table)
        for start in range(0, len(df), 4):
            block = df.iloc[start:start + 4]
            assert block["round"].nunique() == 1
            groups.append((int(block["round"].iloc[0]), list(block["completion"]), list(block[column])))
    assert len(groups) == 4  # 2 steps x 2 prompts of 4 generations
    return groups


def assert_trained(out: Path, metrics: tuple[str, ...]) -> None:
    from safetensors.torch import load_file

    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert max(float(v.abs().max()) for k, v in weights.items() if ".lora_B." in k) > 0  # zero at PEFT's init
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = {k for row in history for k in row}
    assert set(metrics) <= logged, sorted(set(metrics) - logged)


def test_trl_students_pays_what_the_env_pays_and_trains_the_adapter(tmp_path: Path) -> None:
    out = tmp_path / "students"
    printed = json.loads(run_example("trl_students.py", str(out)).strip().splitlines()[-1])
    assert printed["steps"] == 2
    rounds = json.loads((out / "rounds.json").read_text())
    env = parallel_env(**STUDENT_GAME)
    seen = set()
    try:
        for k, completions, trl_rewards in scored(out, "populora_student"):
            env.load_state_dict(rounds[k]["state"])
            env.reset(seed=rounds[k]["seed"])
            env.step({"teacher_0": tuple(rounds[k]["proposal"])})
            *_rest, infos = env.step({"student_0": tuple(completions)})
            assert infos["student_0"]["completion_rewards"] == trl_rewards
            seen.update(trl_rewards)
    finally:
        env.close()
    assert len(seen) > 1  # the groups were not all paid alike: GRPO had a signal
    assert_trained(out, ("game/attempts/reason/format", "game/attempts/correct_rate", "game/pair/p_hat",
                         "game/pair/outcome/teacher", "game/proposals/valid_rate", "rewards/populora_student/mean"))


def test_trl_teachers_pays_what_the_env_pays_and_trains_the_adapter(tmp_path: Path) -> None:
    out = tmp_path / "teachers"
    printed = json.loads(run_example("trl_teachers.py", str(out)).strip().splitlines()[-1])
    assert printed["steps"] == 2
    rounds = json.loads((out / "rounds.json").read_text())
    env = parallel_env(**teacher_game())
    student = OracleStudent(env)
    seen = set()
    try:
        for k, completions, trl_rewards in scored(out, "populora_teacher"):
            for completion, trl_reward in zip(completions, trl_rewards, strict=True):
                env.load_state_dict(rounds[k]["state"])
                env.reset(seed=rounds[k]["seed"])
                obs, *_rest, infos = env.step({"teacher_0": (completion,)})
                answers = {"student_0": student.act(obs["student_0"], infos["student_0"])}
                *_done, infos = env.step(answers)
                assert infos["teacher_0"]["completion_rewards"] == [trl_reward]
                seen.add(trl_reward)
    finally:
        env.close()
    assert seen == {-1.0, 0.0}  # invalid proposals and valid ones the oracle solves (1 - p̂ = 0)
    assert_trained(out, ("game/proposals/valid_rate", "game/proposals/reason/too_long", "game/pair/p_hat",
                         "game/pair/outcome/student", "rewards/populora_teacher/mean"))


def test_frozen_run_members_and_a_saved_buffer_play_in_the_bridge(tmp_path: Path) -> None:
    from populora_bridges.grpo import BufferTeacher, RunMembers, StudentRounds, TeacherRounds
    from populora_cli import train
    from populora_env.policies import continue_prefix

    run = train("tiny", steps=2, run_dir=str(tmp_path / "run")).run_dir
    members = RunMembers(run, ["teacher_0", "student_0"])
    last = RunMembers(run, ["student_0"], checkpoint=2)
    assert members.members == ["teacher_0", "student_0"] and last.members == ["student_0"]
    with pytest.raises(ValueError, match="unknown member"):
        members.policy("student_9")

    game = TeacherRounds([members.policy("student_0")], num_generations=2, tokenizer=members.parts.tokenizer,
                         task_types=("deduction",), samples_per_task=2, sandbox_workers=1)
    game.play(1)
    valid = continue_prefix("", "```python\ndef f(x):\n    return x + 1\n```\n```input\n4\n```")
    assert game.reward(prompts=["", ""], completions=[valid, "junk"], round=[0, 0]) == [0.0, -1.0]  # p̂ = 0
    game.close()

    students = StudentRounds([members.policy("teacher_0")], num_generations=2, tokenizer=members.parts.tokenizer,
                             task_types=("deduction",), sandbox_workers=1)
    with pytest.raises(ValueError, match="gave the trained agent no prompt"):
        students.dataset(2)  # a tiny-random teacher never proposes a valid task
    students.close()

    saved = BufferTeacher.from_env_state(Path(run) / "checkpoints" / "step_2" / "env_state.json")
    assert sum(len(v) for v in saved.tasks.values()) > 0
