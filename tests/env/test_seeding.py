"""The env's seeding API: proposer prompts and validation outside a round (no ratings, no rounds, no rewards)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from populora_env.policies import RandomPolicy, SeedTeacher
from populora_env.tasks import TaskType

from .helpers import think


def _ratings(env: Any) -> dict[str, tuple[float, float]]:
    return {a: (env.ratings[a].mu, env.ratings[a].sigma) for a in env.possible_agents}


def test_seed_prompts_are_round_prompts_without_a_round(make_env: Any) -> None:
    env = make_env(prompts="azr", references_k=2, induction_inputs=10)
    ratings, sizes = _ratings(env), env.buffers.sizes()
    prompts, requests = env.seed_prompts("deduction", 3)
    assert len(prompts) == len(requests) == 3
    assert [r["task_id"] for r in requests] == ["base-0", "base-1", "base-2"]
    for prompt, request in zip(prompts, requests, strict=True):
        assert request["task_type"] == "deduction" and len(request["reference_task_ids"]) == 2
        assert request["chat_template"] is False and request["prefix"] == "<think>" and request["stop"]
        assert prompt.endswith("Assistant: <think>")
    prompts, requests = env.seed_prompts(TaskType.INDUCTION, 2)
    assert [r["task_id"] for r in requests] == ["base-3", "base-4"]
    assert all(r["n_inputs"] == 10 and r["program"] in p for p, r in zip(prompts, requests, strict=True))
    # nothing but the RNG moved
    assert env.current_round == -1 and env.phase == "idle"
    assert _ratings(env) == ratings and env.buffers.sizes() == sizes


def test_valid_seed_proposals_fill_the_buffers(make_env: Any) -> None:
    env = make_env()
    teacher = SeedTeacher(seed=3)
    before = env.buffers.sizes()
    prompts, requests = env.seed_prompts("deduction", 4)
    records = env.add_seed_proposals(requests, teacher.act(prompts, {"requests": requests}))
    assert [r["valid"] for r in records] == [True] * 4
    # one pool for deduction and abduction (AZR's seed set serves both)
    assert all(r["added"] == ["deduction", "abduction"] for r in records)
    after = env.buffers.sizes()
    assert after["deduction"] == before["deduction"] + 4 and after["abduction"] == before["abduction"] + 4
    seeded = [t for t in env.buffers[TaskType.DEDUCTION].tasks if t.task_id.startswith("base-")]
    assert len(seeded) == 4 and all(t.round == -1 for t in seeded)
    copies = [t for t in env.buffers[TaskType.ABDUCTION].tasks if t.task_id.startswith("base-")]
    assert [(t.program, t.inputs, t.outputs) for t in copies] == [(t.program, t.inputs, t.outputs) for t in seeded]

    prompts, requests = env.seed_prompts("induction", 3)
    records = env.add_seed_proposals(requests, teacher.act(prompts, {"requests": requests}))
    assert [r["valid"] for r in records] == [True] * 3 and all(r["added"] == ["induction"] for r in records)
    assert env.buffers.sizes()["induction"] == before["induction"] + 3
    # the seeded buffers are part of the env's state (a checkpoint holds them)
    state = json.loads(json.dumps(env.state_dict()))
    fresh = make_env()
    fresh.load_state_dict(state)
    assert fresh.buffers.sizes() == env.buffers.sizes()


def test_only_types_in_play_share_the_pool(make_env: Any) -> None:
    env = make_env(task_types=("deduction", "induction"))
    prompts, requests = env.seed_prompts("deduction", 2)
    records = env.add_seed_proposals(requests, SeedTeacher(seed=5).act(prompts, {"requests": requests}))
    assert [r["added"] for r in records] == [["deduction"], ["deduction"]]


def test_invalid_and_duplicate_seed_proposals_are_not_added(make_env: Any) -> None:
    env = make_env(reject_duplicates=False)  # seeds are de-duplicated whatever this switch says
    sizes = env.buffers.sizes()
    prompts, requests = env.seed_prompts("abduction", 3)
    records = env.add_seed_proposals(requests, RandomPolicy(seed=0).act(prompts))
    assert [(r["valid"], r["format_ok"], r["reason"], r["added"]) for r in records] == [(False, False, "format", [])] * 3
    assert env.buffers.sizes() == sizes

    seed = env.buffers[TaskType.ABDUCTION].tasks[0]  # a task already in the buffer, proposed again
    same = think(f"```python\n{seed.program}```\n```input\n{seed.input}\n```")
    prompts, requests = env.seed_prompts("abduction", 2)
    records = env.add_seed_proposals(requests, [same, same])
    assert [r["reason"] for r in records] == ["duplicate", "duplicate"]
    assert env.buffers.sizes() == sizes


def test_seeding_api_refuses_misuse(make_env: Any) -> None:
    env = make_env()
    prompts, requests = env.seed_prompts("deduction", 1)
    with pytest.raises(ValueError, match="1 seed requests"):
        env.add_seed_proposals(requests, [])
    with pytest.raises(ValueError, match="unknown seed request 'r0-teacher_0-0'"):
        env.add_seed_proposals([{"task_id": "r0-teacher_0-0"}], [""])
    env.add_seed_proposals(requests, [""])
    with pytest.raises(ValueError, match="unknown seed request 'base-0'"):  # answered already
        env.add_seed_proposals(requests, [""])
    with pytest.raises(ValueError, match="unknown task type"):
        env.seed_prompts("translation", 1)
    env.reset()
    with pytest.raises(RuntimeError, match="between rounds"):
        env.seed_prompts("deduction", 1)
