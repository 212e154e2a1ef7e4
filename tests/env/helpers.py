"""Helpers to play rounds of the game with scripted policies in tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Policy(Protocol):
    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]: ...


def play_round(env: Any, teachers: Mapping[str, Policy], students: Mapping[str, Policy]) -> dict[str, Any]:
    """Play one full round; return every dict the env returned, by phase."""
    obs, infos = env.reset()
    reset_out = {"obs": obs, "infos": infos}
    actions = {a: teachers[a].act(obs[a], infos[a]) for a in env.agents if a in teachers}
    step1 = env.step(actions)
    obs1, _, _, _, infos1 = step1
    actions = {a: students[a].act(obs1[a], infos1[a]) for a in env.agents if a in students}
    step2 = env.step(actions)
    return {"reset": reset_out, "step1": step1, "step2": step2}


def think(answer: str) -> str:
    """A well-formatted completion around ``answer``."""
    return f"<think>ok</think>\n<answer>\n{answer}\n</answer>"
