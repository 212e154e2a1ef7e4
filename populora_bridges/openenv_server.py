"""The game as an OpenEnv environment server: one game per session, typed actions and observations
(``pip install -e ".[openenv]"``; docs/openenv.md).

A session (one WebSocket connection of an OpenEnv client) holds one :class:`~populora_env.PopuLoRAParallelEnv`
built with the server's settings. ``reset(seed=...)`` starts a round; an action is one agent's completions for the
current phase (:class:`GameAction`); once every agent with prompts in the phase has sent its action, the game
steps (``env.step``) and the observation (:class:`GameObservation`) holds the next prompts, the request records
(how to generate: prefix, chat template, stop strings), and after the solve step the rewards, the per-completion
rewards and the env's ``infos`` as plain data. An action's ``reward`` is the acting agent's ``rewards[agent]``.

Bounds and errors: the server binds to 127.0.0.1 unless told otherwise; it holds at most ``max_sessions`` games
at once (OpenEnv refuses one more with ``CAPACITY_REACHED``); a WebSocket message is at most
:data:`MAX_MESSAGE_BYTES`, an action at most :data:`MAX_COMPLETIONS` completions of at most
:data:`MAX_COMPLETION_CHARS` characters. An action the game cannot take (an unknown or inactive agent, one agent
twice, more completions than prompts, a step before ``reset``) is answered with an observation whose ``error``
says why, and the game is unchanged; an action that is not an object of the declared types (no ``agent`` string,
``completions`` not a list) is answered by OpenEnv's own validation error. Neither stops the server; a completion
that is not a string is, as in the game, a format error. Model-written code runs in one
:class:`~populora_env.sandbox.Sandbox` the server starts in its own process tree and shares between sessions
(its ``run`` is thread-safe), closed when the server stops.

Run it: ``.venv/bin/python -m populora_bridges.openenv_server --port 8000`` (``--help`` lists the options).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from populora_env import PopuLoRAParallelEnv, parallel_env
from populora_env.sandbox import Limits, Sandbox

MAX_COMPLETIONS = 1024
"""Most completions one action may carry (more than the game's largest phase needs is refused by the env's count
check first)."""
MAX_COMPLETION_CHARS = 65536
"""Longest completion an action may carry."""
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest WebSocket message the server reads."""
DEFAULT_HOST = "127.0.0.1"


class GameAction(Action):
    """One agent's completions for the current phase, aligned with its prompts."""

    agent: str = Field(max_length=64, description="the acting agent, e.g. 'teacher_0'")
    completions: list[Any] = Field(max_length=MAX_COMPLETIONS,
                                   description="one completion per prompt; a non-string is a format error")


class GameObservation(Observation):
    """The game after a reset or an action, as plain data."""

    phase: str = Field(default="idle", description="'propose', 'solve' or 'done'")
    round_index: int = -1
    prompts: dict[str, list[str]] = Field(default_factory=dict, description="agent -> its prompts in this phase")
    requests: dict[str, list[dict[str, Any]]] = Field(default_factory=dict,
                                                      description="agent -> one request record per prompt")
    waiting_for: list[str] = Field(default_factory=list, description="agents whose action the phase still needs")
    rewards: dict[str, float] = Field(default_factory=dict, description="after the round: rewards[agent]")
    completion_rewards: dict[str, list[float]] = Field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = Field(default_factory=dict, description="the env's infos, plain data")
    error: str | None = Field(default=None, description="why the last action was refused (the game unchanged)")


class GameState(State):
    """The session's game: its phase and round."""

    phase: str = "idle"
    round_index: int = -1


def _plain(value: Any) -> Any:
    """``value`` as JSON data (numpy scalars and tuples included)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


class GameEnvironment(Environment):
    """One session's game; ``settings`` are ``parallel_env``'s keywords, ``sandbox`` the server's."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, sandbox: Any, settings: Mapping[str, Any]) -> None:
        super().__init__()
        self.game: PopuLoRAParallelEnv = parallel_env(sandbox=sandbox, **dict(settings))
        self._obs: dict[str, Any] = {}
        self._infos: dict[str, Any] = {}
        self._pending: dict[str, list[Any]] = {}
        self._state = GameState(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GameObservation:
        """Start a round (``seed`` re-seeds the game's generator; buffers and ratings persist in the session)."""
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            return GameObservation(error=f"seed must be a non-negative integer, got {seed!r}")
        self._obs, self._infos = self.game.reset(seed=seed)
        self._pending = {}
        self._state = GameState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, phase=self.game.phase,
                                round_index=self.game.current_round)
        return self._observation()

    def step(self, action: GameAction, timeout_s: float | None = None, **kwargs: Any) -> GameObservation:
        """Record ``action``; step the game once every agent of the phase has acted."""
        problem = self._refusal(action)
        if problem is not None:
            return self._observation(error=problem)
        self._pending[action.agent] = list(action.completions)
        if self._waiting_for():
            return self._observation()
        actions, self._pending = self._pending, {}
        self._obs, rewards, _terms, _truncs, self._infos = self.game.step(actions)
        self._state.step_count += 1
        self._state.phase, self._state.round_index = self.game.phase, self.game.current_round
        done = self.game.phase == "done"
        return self._observation(rewards=rewards if done else None, reward=rewards[action.agent] if done else None)

    @property
    def state(self) -> GameState:
        """The session's episode id, steps taken, phase and round."""
        return self._state

    def close(self) -> None:
        """Nothing of the session outlives it; the shared sandbox belongs to the server."""

    def _refusal(self, action: Any) -> str | None:
        """Why the game cannot take ``action`` now, or ``None``."""
        if not isinstance(action, GameAction):
            return f"an action is a GameAction, got {type(action).__name__}"
        if self.game.phase not in ("propose", "solve"):
            return "no round in progress: call reset() first"
        if action.agent not in self.game.possible_agents:
            return f"unknown agent {action.agent!r} (agents: {', '.join(self.game.possible_agents)})"
        expected = len(self._obs[action.agent]["prompts"])
        if not expected:
            return f"{action.agent} has no prompt in the {self.game.phase} phase"
        if action.agent in self._pending:
            return f"{action.agent} already acted in this phase"
        if len(action.completions) > expected:
            return f"{len(action.completions)} completions for {expected} prompts"
        if any(isinstance(c, str) and len(c) > MAX_COMPLETION_CHARS for c in action.completions):
            return f"a completion is longer than {MAX_COMPLETION_CHARS} characters"
        return None

    def _waiting_for(self) -> list[str]:
        return [a for a in self.game.possible_agents if self._obs.get(a, {}).get("prompts") and a not in self._pending]

    def _observation(self, error: str | None = None, rewards: Mapping[str, float] | None = None,
                     reward: float | None = None) -> GameObservation:
        phase = self.game.phase
        done = phase == "done"
        prompts = {a: list(o["prompts"]) for a, o in self._obs.items() if o["prompts"]} if not done else {}
        return GameObservation(
            done=done, reward=reward, phase=phase, round_index=self.game.current_round, prompts=prompts,
            requests={a: _plain(self._infos[a]["requests"]) for a in prompts},
            waiting_for=self._waiting_for() if not done else [], rewards=dict(rewards or {}),
            completion_rewards={a: list(i["completion_rewards"]) for a, i in self._infos.items()} if done else {},
            infos=_plain(self._infos) if done else {}, error=error)


def create_app(max_sessions: int = 8, sandbox_workers: int = 2, timeout_s: float = 2.0, memory_mb: int = 512,
               **settings: Any):
    """The FastAPI app: OpenEnv's routes over :class:`GameEnvironment` sessions sharing one sandbox (started
    here, closed at the app's shutdown). ``settings``: ``parallel_env``'s keywords for every session's game."""
    sandbox = Sandbox(workers=sandbox_workers, limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb))
    settings = {**settings, "timeout_s": timeout_s}
    parallel_env(sandbox=sandbox, **settings).close()  # a bad setting fails here, before the server starts
    app = create_fastapi_app(lambda: GameEnvironment(sandbox, settings), GameAction, GameObservation,
                             max_concurrent_envs=max_sessions)
    app.router.on_shutdown.append(sandbox.close)
    app.state.sandbox = sandbox
    return app


class SessionEndGuard:
    """ASGI wrapper: a WebSocket session whose client has gone ends quietly. OpenEnv 0.3.0 closes the socket
    after its client closed it and lets starlette's ``WebSocketDisconnect`` escape (uvicorn then logs a
    traceback per session); that error at the end of a session is its normal end, anything else propagates."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


def serve(host: str = DEFAULT_HOST, port: int = 8000, **kwargs: Any) -> None:
    """Run the server until interrupted (SIGINT/SIGTERM stop it cleanly); prints ``listening on HOST:PORT`` once
    bound (``port=0``: a free port)."""
    import uvicorn

    app = create_app(**kwargs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    print(f"listening on {host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(SessionEndGuard(app), ws_max_size=MAX_MESSAGE_BYTES, log_level="warning", lifespan="on")
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn shuts down gracefully, then re-raises the signal here
        signal.signal(sig, lambda *_: sys.exit(0))
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    """``python -m populora_bridges.openenv_server``: the options, then :func:`serve`."""
    parser = argparse.ArgumentParser(description="The PopuLoRA game as an OpenEnv server (one game per session).")
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed at start)")
    parser.add_argument("--max-sessions", type=int, default=8, help="games held at once (default 8)")
    parser.add_argument("--sandbox-workers", type=int, default=2, help="workers of the shared sandbox")
    parser.add_argument("--settings", type=json.loads, default={},
                        help='parallel_env keywords as JSON, e.g. \'{"num_teachers": 1, "num_students": 1}\'')
    args = parser.parse_args(argv)
    if not isinstance(args.settings, dict):
        parser.error("--settings: a JSON object of parallel_env keywords")
    try:
        serve(args.host, args.port, max_sessions=args.max_sessions, sandbox_workers=args.sandbox_workers,
              **args.settings)
    except ValueError as exc:  # a bad setting: one line, exit 2
        parser.error(str(exc))


if __name__ == "__main__":
    main()
