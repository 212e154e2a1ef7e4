"""Shared fixtures of the game's tests: one warm sandbox for the whole session and small envs on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from populora_env import PopuLoRAParallelEnv, parallel_env
from populora_env.sandbox import Limits, Sandbox


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """A 2-worker sandbox shared by the tests (envs built on it do not close it)."""
    with Sandbox(workers=2, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        yield sb


@pytest.fixture
def make_env(sandbox: Sandbox) -> Iterator[Callable[..., PopuLoRAParallelEnv]]:
    """Factory of small envs on the shared sandbox; closed at the end of the test."""
    made: list[PopuLoRAParallelEnv] = []

    def factory(**kwargs: Any) -> PopuLoRAParallelEnv:
        defaults: dict[str, Any] = dict(
            num_teachers=2, num_students=2, tasks_per_teacher=3, samples_per_task=2, seed=0, sandbox=sandbox
        )
        defaults.update(kwargs)
        env = parallel_env(**defaults)
        made.append(env)
        return env

    yield factory
    for env in made:
        env.close()
