"""One agent's seat of the game as a ``gymnasium.Env``: text observation, text action (docs/gymnasium.md).

The wrapper holds a :class:`~populora_env.PopuLoRAParallelEnv` (the *game*) and plays one round per episode. The
seat's prompts are served one per step (``obs`` is the prompt, ``action`` the completion); every other active
agent acts through a policy the user passes, an object with ``act(observation, info)`` (the scripted
:class:`~populora_env.SeedTeacher`, :class:`~populora_env.OracleStudent`, :class:`~populora_env.RandomPolicy`) or
any callable ``(observation, info) -> completions``. The game advances exactly as ``env.step`` advances it:

- a teacher seat answers its ``tasks_per_teacher`` proposer prompts; then the students' policies answer and the
  round ends;
- a student seat starts after the teachers' policies have proposed; it answers its ``samples_per_task`` prompts
  per task; then the round ends. A round that gives the student no prompt (no valid task, no filler) is played
  out by the policies and the next round starts, up to :data:`MAX_EMPTY_ROUNDS`.

Rewards are the game's: 0.0 on every step but the last, and on the last the ParallelEnv's ``rewards[seat]`` (the
mean of the seat's per-completion rewards under the env's reward scheme); ``info["completion_rewards"]`` then
holds the per-completion rewards and ``info`` the rest of the env's ``infos[seat]``. ``reset(seed=s)`` restarts the
game from its initial state (the buffers and ratings it was built with) seeded with ``s``, so a seed gives the
same round (Gymnasium's determinism contract, given deterministic policies); ``reset()`` continues the game.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
from gymnasium.spaces import Text

from populora_env import PopuLoRAParallelEnv, parallel_env
from populora_env.env import PromptText

Policy = Any  # an object with act(observation, info) -> completions, or such a callable
MAX_EMPTY_ROUNDS = 100
"""Most rounds in a row a student seat may get no prompt before :meth:`SingleSeatEnv.reset` gives up."""


def _act(policy: Policy, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Sequence[object]:
    act: Callable[..., Sequence[object]] = getattr(policy, "act", policy)
    return act(observation, info)


class SingleSeatEnv(gymnasium.Env):
    """``seat`` of ``game`` as a Gymnasium environment; ``policies`` play every other agent.

    Args:
        game: the game (a :class:`~populora_env.PopuLoRAParallelEnv`), or ``None`` to build one from
            ``env_kwargs`` (``parallel_env``'s keywords). The wrapper's :meth:`close` closes it.
        seat: the agent this env is (``"teacher_0"``, ``"student_1"``...).
        policies: agent -> policy for every other agent of the game.

    Raises:
        ValueError: ``seat`` is not an agent of the game, or an other agent has no policy.
    """

    metadata = {"render_modes": []}

    def __init__(self, game: PopuLoRAParallelEnv | None = None, seat: str = "student_0",
                 policies: Mapping[str, Policy] | None = None, **env_kwargs: Any) -> None:
        self.game = game if game is not None else parallel_env(**env_kwargs)
        if seat not in self.game.possible_agents:
            raise ValueError(f"seat {seat!r} is not an agent of the game ({', '.join(self.game.possible_agents)})")
        self.seat = seat
        self.policies = dict(policies or {})
        missing = [a for a in self.game.possible_agents if a != seat and a not in self.policies]
        if missing:
            raise ValueError(f"no policy for {', '.join(missing)}: pass policies={{agent: policy}} for every agent "
                             f"but the seat {seat!r}")
        self.observation_space = self.game.observation_space(seat)["prompts"].feature_space
        if not isinstance(self.observation_space, PromptText):  # pragma: no cover - the env's own space
            raise TypeError("the game's prompt space is not a Text space")
        self.action_space: Text = self.game.action_space(seat).feature_space
        self._initial = self.game.state_dict()
        self._prompts: tuple[str, ...] = ()
        self._requests: list[dict[str, Any]] = []
        self._answers: list[object] = []
        self._infos: dict[str, dict[str, Any]] = {}
        self._obs: dict[str, dict[str, Any]] = {}
        self._rewards: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------- Gymnasium

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        """Start a round and return the seat's first prompt (``info["request"]`` says how to generate it)."""
        super().reset(seed=seed)
        if seed is not None:
            self.game.load_state_dict(self._initial)
        for _ in range(MAX_EMPTY_ROUNDS):
            self._obs, self._infos = self.game.reset(seed=seed)
            seed = None
            if self.seat in self.game.students:
                self._play_others()
            if self._load_prompts():
                return self._prompts[0], self._step_info(0)
            self._finish_round()  # the seat had nothing to answer in this round
        raise RuntimeError(f"{self.seat} got no prompt in {MAX_EMPTY_ROUNDS} rounds in a row (no valid task and no "
                           "filler: check the teachers' policies and env.student_fill)")

    def step(self, action: object) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Answer the current prompt with ``action`` (the completion text; anything else is a format error, as
        in the game). Returns the next prompt, or, after the seat's last prompt of the round, ``""`` with the
        seat's reward and ``terminated=True``."""
        if not self._prompts:
            raise RuntimeError("the episode is over (or never started): call reset() before step()")
        self._answers.append(action)
        if len(self._answers) < len(self._prompts):
            return self._prompts[len(self._answers)], 0.0, False, False, self._step_info(len(self._answers))
        actions = {**self._others(), self.seat: tuple(self._answers)}
        self._prompts = ()
        self._play(actions)
        rewards = self._finish_round()  # a teacher seat: the students answer now
        info = dict(self._infos[self.seat])
        return "", float(rewards[self.seat]), True, False, info

    def close(self) -> None:
        """Close the game (its sandbox)."""
        self.game.close()

    # -------------------------------------------------------------------------------------------- the game

    def _load_prompts(self) -> bool:
        """Take the seat's prompts of the current phase; whether it has any."""
        self._prompts = tuple(self._obs[self.seat]["prompts"])
        self._requests = list(self._infos[self.seat].get("requests", []))
        self._answers = []
        return bool(self._prompts)

    def _step_info(self, k: int) -> dict[str, Any]:
        return {"phase": self._infos[self.seat]["phase"], "round_index": self._infos[self.seat]["round_index"],
                "request": dict(self._requests[k]) if k < len(self._requests) else {}}

    def _others(self) -> dict[str, Sequence[object]]:
        """The other active agents' completions for the current phase, from their policies."""
        return {a: tuple(_act(self.policies[a], self._obs[a], self._infos[a])) for a in self.game.agents
                if a != self.seat and self._obs[a]["prompts"]}

    def _play(self, actions: Mapping[str, Sequence[object]]) -> dict[str, float]:
        obs, rewards, _terms, _truncs, infos = self.game.step(dict(actions))
        self._obs, self._infos, self._rewards = obs, infos, rewards
        return rewards

    def _play_others(self) -> None:
        """The other agents act for the current phase and the game steps."""
        self._play(self._others())

    def _finish_round(self) -> dict[str, float]:
        """Play the rest of the round without the seat; the round's rewards."""
        while self.game.phase != "done":
            self._play_others()
        return self._rewards
