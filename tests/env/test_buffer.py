"""Task buffers: dedup, FIFO cap keeping the newest, reference sampling, newest-first solver sampling."""

from __future__ import annotations

import numpy as np
import pytest

from populora_env.buffer import TaskBuffer, TaskBuffers
from populora_env.seeds import SEED_PROGRAMS, seed_tasks
from populora_env.tasks import Task, TaskType


def task(i: int, round_: int = 0, program: str = "def f(x):\n    return x\n") -> Task:
    return Task(f"t{i}", TaskType.DEDUCTION, program, (str(i),), (str(i),), round=round_)


def test_dedup_by_canonical_program_and_input() -> None:
    buf = TaskBuffer(TaskType.DEDUCTION, cap=10)
    assert buf.add(task(1))
    reformatted = Task("t9", TaskType.DEDUCTION, "def f(x):  # same\n    return (x)\n", ("1",), ("1",))
    assert not buf.add(reformatted)
    assert buf.add(task(2))
    assert len(buf) == 2
    with pytest.raises(ValueError):
        buf.add(Task("x", TaskType.ABDUCTION, "def f(x):\n    return x\n", ("1",), ("1",)))


def test_fifo_cap_keeps_the_newest() -> None:
    buf = TaskBuffer(TaskType.DEDUCTION, cap=3)
    for i in range(5):
        buf.add(task(i, round_=i))
    assert [t.task_id for t in buf.tasks] == ["t2", "t3", "t4"]
    assert buf.add(task(0, round_=9))  # evicted keys are free again


def test_references_without_replacement() -> None:
    buf = TaskBuffer(TaskType.DEDUCTION, cap=100)
    for i in range(10):
        buf.add(task(i))
    refs = buf.sample_references(4, np.random.default_rng(0))
    assert len(refs) == 4 and len({t.task_id for t in refs}) == 4
    assert len(buf.sample_references(50, np.random.default_rng(0))) == 10
    assert buf.sample_references(0, np.random.default_rng(0)) == []


def test_newest_first() -> None:
    buf = TaskBuffer(TaskType.DEDUCTION, cap=100)
    for i in range(9):
        buf.add(task(i, round_=i // 3))  # rounds 0, 0, 0, 1, 1, 1, 2, 2, 2
    rng = np.random.default_rng(0)
    picked = buf.newest_first(4, rng)
    assert {t.task_id for t in picked[:3]} == {"t6", "t7", "t8"} and picked[3].round == 1
    excluded = buf.newest_first(3, rng, exclude={"t6", "t7"})
    assert excluded[0].task_id == "t8" and all(t.round == 1 for t in excluded[1:])


def test_seed_buffers_and_state_round_trip() -> None:
    buffers = TaskBuffers(cap=100, seeds=seed_tasks(6))
    assert buffers.sizes() == {t.value: len(SEED_PROGRAMS) for t in TaskType}
    identity = buffers[TaskType.DEDUCTION].tasks[0]
    assert identity.input == "'Hello world'" and identity.output == "'Hello world'"
    assert all(len(t.inputs) == 6 for t in buffers[TaskType.INDUCTION].tasks)
    source = buffers.program_source(np.random.default_rng(0))
    assert source.task_type in (TaskType.DEDUCTION, TaskType.ABDUCTION)
    copy = TaskBuffers(cap=100)
    copy.load_state_dict(buffers.state_dict())
    assert copy.state_dict() == buffers.state_dict()
    assert copy.find("seed-induction-3") == buffers.find("seed-induction-3")
