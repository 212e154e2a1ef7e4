"""Task buffers, one per task type (AZR's ``input`` / ``output`` / ``problem`` buffers, docs/azr.md §7).

- They start from the shipped seed tasks and receive **every** valid proposal, whatever its reward (AZR).
- Deduplicated by the canonical (type, program, inputs) key.
- Capped FIFO: when full, the **oldest** entries are evicted, so new programs always get in (AZR's cap kept the
  oldest and silently dropped new programs).
- Proposer prompts get K references drawn uniformly without replacement from the type's buffer; an induction
  prompt gets one program drawn from the union of the deduction and abduction buffers.
- Students' filler tasks are drawn newest first (most recent round first, random order within a round).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from populora_env.tasks import Task, TaskType
from populora_env.validation import task_key


class TaskBuffer:
    """Insertion-ordered, deduplicated, FIFO-capped list of tasks of one type."""

    def __init__(self, task_type: TaskType, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"buffer cap must be >= 1, got {cap}")
        self.task_type = task_type
        self.cap = cap
        self._tasks: list[Task] = []
        self._keys: dict[str, str] = {}  # key -> task_id
        self._key_of: dict[str, str] = {}  # task_id -> key

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    @property
    def tasks(self) -> tuple[Task, ...]:
        """All tasks, oldest first."""
        return tuple(self._tasks)

    def add(self, task: Task) -> bool:
        """Append ``task`` unless its key is already present; evict the oldest beyond the cap."""
        if task.task_type is not self.task_type:
            raise ValueError(f"a {task.task_type.value} task cannot go into the {self.task_type.value} buffer")
        key = task_key(task.task_type, task.program, task.inputs)
        if key in self._keys:
            return False
        self._tasks.append(task)
        self._keys[key] = task.task_id
        self._key_of[task.task_id] = key
        while len(self._tasks) > self.cap:
            old = self._tasks.pop(0)
            self._keys.pop(self._key_of.pop(old.task_id), None)
        return True

    def remove(self, task_id: str) -> bool:
        """Drop the task with ``task_id`` (and its key) if present; whether it was."""
        key = self._key_of.pop(task_id, None)
        if key is None:
            return False
        self._keys.pop(key, None)
        self._tasks = [t for t in self._tasks if t.task_id != task_id]
        return True

    def sample_references(self, k: int, rng: np.random.Generator) -> list[Task]:
        """``min(k, len)`` tasks uniformly without replacement, in buffer order."""
        n = min(k, len(self._tasks))
        if n <= 0:
            return []
        picks = sorted(int(i) for i in rng.choice(len(self._tasks), size=n, replace=False))
        return [self._tasks[i] for i in picks]

    def newest_first(self, k: int, rng: np.random.Generator, exclude: Iterable[str] = ()) -> list[Task]:
        """Up to ``k`` tasks, most recent round first, random order within a round, skipping ``exclude`` ids."""
        excluded = set(exclude)
        out: list[Task] = []
        i = len(self._tasks) - 1
        while i >= 0 and len(out) < k:
            current = self._tasks[i].round
            j = i
            while j >= 0 and self._tasks[j].round == current:
                j -= 1
            group = [t for t in self._tasks[j + 1 : i + 1] if t.task_id not in excluded]
            out.extend(group[int(o)] for o in rng.permutation(len(group)))
            i = j
        return out[:k]

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-serialisable contents."""
        return [t.to_dict() for t in self._tasks]

    def load_list(self, items: list[dict[str, Any]]) -> None:
        """Replace the contents with ``items`` (from :meth:`to_list`)."""
        self._tasks.clear()
        self._keys.clear()
        self._key_of.clear()
        for item in items:
            self.add(Task.from_dict(item))


class TaskBuffers:
    """The three buffers of the game (shared by the whole population)."""

    def __init__(self, cap: int, seeds: Iterable[Task] = ()) -> None:
        self.buffers = {t: TaskBuffer(t, cap) for t in TaskType}
        for task in seeds:
            self.buffers[task.task_type].add(task)

    def __getitem__(self, task_type: TaskType) -> TaskBuffer:
        return self.buffers[task_type]

    def __contains__(self, key: object) -> bool:
        return any(key in b for b in self.buffers.values())

    def add(self, task: Task) -> bool:
        """Add ``task`` to its type's buffer."""
        return self.buffers[task.task_type].add(task)

    def remove(self, task_id: str) -> bool:
        """Drop the task with ``task_id`` from every buffer holding it; whether one did."""
        return any([b.remove(task_id) for b in self.buffers.values()])

    def program_source(self, rng: np.random.Generator) -> Task:
        """One task drawn uniformly from the deduction ∪ abduction buffers (the program for an induction
        proposal)."""
        pool = self.buffers[TaskType.DEDUCTION].tasks + self.buffers[TaskType.ABDUCTION].tasks
        if not pool:
            raise RuntimeError("no program available for induction: deduction and abduction buffers are empty")
        return pool[int(rng.integers(len(pool)))]

    def find(self, task_id: str) -> Task | None:
        """The task with ``task_id`` if it is still in a buffer."""
        for buffer in self.buffers.values():
            for task in buffer.tasks:
                if task.task_id == task_id:
                    return task
        return None

    def sizes(self) -> dict[str, int]:
        """Number of tasks per type."""
        return {t.value: len(b) for t, b in self.buffers.items()}

    def state_dict(self) -> dict[str, list[dict[str, Any]]]:
        """JSON-serialisable contents of every buffer."""
        return {t.value: b.to_list() for t, b in self.buffers.items()}

    def load_state_dict(self, state: dict[str, list[dict[str, Any]]]) -> None:
        """Inverse of :meth:`state_dict`."""
        for t, buffer in self.buffers.items():
            buffer.load_list(state.get(t.value, []))
