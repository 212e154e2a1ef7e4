"""The OpenEnv client of the game server (:mod:`populora_bridges.openenv_server`; docs/openenv.md).

``GameClient(base_url)`` is an OpenEnv ``EnvClient`` (async; ``.sync()`` gives the blocking one): ``reset(seed=)``
and ``step(GameAction(agent=..., completions=[...]))`` return a ``StepResult`` whose ``observation`` is a
:class:`~populora_bridges.openenv_server.GameObservation`. One client is one session, one game on the server.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from populora_bridges.openenv_server import GameAction, GameObservation, GameState


class GameClient(EnvClient[GameAction, GameObservation, GameState]):
    """A session of the game server."""

    def _step_payload(self, action: GameAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GameObservation]:
        observation = GameObservation(**payload.get("observation", {}), done=bool(payload.get("done", False)),
                                      reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done")))

    def _parse_state(self, payload: dict[str, Any]) -> GameState:
        return GameState(**payload)


__all__ = ["GameAction", "GameClient", "GameObservation", "GameState"]
