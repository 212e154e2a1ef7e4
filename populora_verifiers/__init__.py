"""The game as a verifiers environment package, on verifiers' v1 (multi-agent) API (``pip install -e
".[verifiers]"``; docs/verifiers.md). One of the bridges (:mod:`populora_bridges`), a top-level package of its
own because verifiers' loader imports an environment by its id as a top-level module name.

verifiers 0.4.0 ships only its newer API, ``verifiers.v1`` (an ``Env`` declares its roles as ``AgentConfig``
fields and plays an episode in ``run(task, agents)``; ``finalize(task, episode)`` judges the finished episode).
This package is a verifiers taskset package: its id is ``populora-verifiers`` (verifiers imports
``populora_verifiers``) and it exports the taskset, the env and their configs, so verifiers' own loader builds
it::

    import verifiers.v1 as vf
    config = vf.resolve_env_config({"taskset": {"id": "populora-verifiers"}})
    env = vf.load_environment(config)

A task is one round of a one-teacher, one-student game (``parallel_env(**settings)``, fresh per episode and reset
with the task's seed, so an episode is reproducible from its task); its prompt is the teacher's first proposer
prompt. :meth:`PopuLoRAEnv.run` plays the round with the two roles' agents: ``teacher`` answers each proposer
prompt, the game validates the proposals, ``student`` answers each solver prompt (one agent run per prompt,
``trace.info["index"]`` its position). :meth:`PopuLoRAEnv.finalize` is the rubric: it replays the round with the
traces' replies through ``env.step`` (the sandbox checks each one) and records on every trace the env's reward
(``populora``, the env's reward scheme: the teacher's 1 − p̂ / 0 / −1, the student's +1 / −0.5 / −1), its verdict
(``trace.info``) and the round's metrics (p̂, pair outcome, reasons: :func:`populora_bridges.metrics.round_metrics`,
``game/...`` names), so an episode holds both roles' traces with per-role rewards and the population score.
A scripted episode (traces whose ``root_reply`` is the completion) is scored by ``finalize`` alone, with no model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig

from populora_bridges.metrics import round_metrics
from populora_env import PopuLoRAParallelEnv, parallel_env

ENV_ID = "populora-verifiers"
FIXED = {"num_teachers": 1, "num_students": 1}
REWARD = "populora"


class PopuLoRATasksetConfig(vf.TasksetConfig):
    """The rounds: ``settings`` (``parallel_env`` keywords; one teacher and one student are fixed), how many
    ``rounds`` the taskset holds and the ``seed`` their reset seeds derive from."""

    settings: dict[str, Any] = {"tasks_per_teacher": 1, "samples_per_task": 2, "sandbox_workers": 1}
    rounds: int = 64
    seed: int = 0


class PopuLoRAData(vf.TaskData):
    """A round: ``info`` holds its ``round`` index and reset ``seed``."""

    info: dict[str, Any] = {}


class PopuLoRATask(vf.Task[PopuLoRAData, vf.State, vf.TaskConfig]):
    """One round of the game."""


class PopuLoRATaskset(vf.Taskset[PopuLoRATask, PopuLoRATasksetConfig]):
    """``rounds`` rounds, each a fresh game reset with its own seed; a task's prompt is the proposer prompt."""

    def game(self) -> PopuLoRAParallelEnv:
        """A fresh game with the taskset's settings."""
        clash = sorted(set(self.config.settings) & set(FIXED))
        if clash:
            raise ValueError(f"{', '.join(clash)}: fixed by the environment ({FIXED})")
        return parallel_env(**{**self.config.settings, **FIXED})

    def round_seed(self, k: int) -> int:
        """The reset seed of round ``k``: a 31-bit function of the taskset's seed and ``k``."""
        return int(np.random.SeedSequence([self.config.seed, k]).generate_state(1)[0] & 0x7FFFFFFF)

    def load(self) -> Iterator[PopuLoRATask]:
        game = self.game()
        try:
            for k in range(self.config.rounds):
                seed = self.round_seed(k)
                obs, _infos = game.reset(seed=seed)
                yield PopuLoRATask(PopuLoRAData(name=f"round-{k}", prompt=obs["teacher_0"]["prompts"][0],
                                                info={"round": k, "seed": seed}), self.config.task)
        finally:
            game.close()


def _role() -> vf.AgentConfig:
    """A role's default: verifiers' plain chat loop (no tools, no code execution), run locally."""
    return vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig())


class PopuLoRAEnvConfig(vf.EnvConfig):
    """The two roles of the game."""

    teacher: vf.AgentConfig = _role()
    student: vf.AgentConfig = _role()


def _indexed(traces: Sequence[vf.Trace]) -> list[vf.Trace]:
    """Traces in prompt order (``trace.info["index"]``; completion order where it is missing)."""
    return sorted(traces, key=lambda t: int(t.info.get("index", 0)))


class PopuLoRAEnv(vf.Env[PopuLoRAEnvConfig]):
    """The teacher–student round: agents play it in :meth:`run`, :meth:`finalize` pays it through ``env.step``."""

    async def run(self, task: PopuLoRATask, agents: vf.Agents) -> None:
        game = self.taskset.game()
        try:
            obs, infos = game.reset(seed=int(task.data.info["seed"]))
            teacher = await self._answer(task, agents.teacher, obs["teacher_0"]["prompts"])
            obs, *_rest, infos = game.step({"teacher_0": tuple(t.last_reply for t in teacher)})
            await self._answer(task, agents.student, obs["student_0"]["prompts"])
        finally:
            game.close()

    @staticmethod
    async def _answer(task: PopuLoRATask, agent: vf.Agent, prompts: Sequence[str]) -> list[vf.Trace]:
        """One agent run per prompt (a task minted with that prompt), each trace marked with its index."""
        traces = await asyncio.gather(*(agent.run(task.with_data(prompt=p)) for p in prompts))
        for k, trace in enumerate(traces):
            trace.info["index"] = k
        return list(traces)

    async def finalize(self, task: PopuLoRATask, episode: vf.Episode) -> None:
        score_episode(self.taskset, task, episode)


def score_episode(taskset: PopuLoRATaskset, task: PopuLoRATask, episode: vf.Episode) -> dict[str, list[float]]:
    """Replay ``task``'s round with the episode's replies and record the env's rewards, verdicts and metrics on
    its traces; returns the per-completion rewards by role. Traces beyond the round's prompts get no reward."""
    teacher = _indexed(episode.by_agent.get("teacher", []))
    student = _indexed(episode.by_agent.get("student", []))
    game = taskset.game()
    try:
        game.reset(seed=int(task.data.info["seed"]))
        game.step({"teacher_0": tuple(t.last_reply for t in teacher)})
        *_rest, infos = game.step({"student_0": tuple(t.last_reply for t in student)})
    finally:
        game.close()
    metrics = round_metrics(infos["teacher_0"]["round"])
    out = {}
    for role, agent, traces in (("teacher", "teacher_0", teacher), ("student", "student_0", student)):
        rewards, verdicts = infos[agent]["completion_rewards"], infos[agent]["completion_info"]
        for trace, reward, verdict in zip(traces, rewards, verdicts, strict=False):
            trace.record_reward(REWARD, reward)
            trace.info["verdict"] = verdict
            trace.record_metrics(metrics)
        out[role] = list(rewards)
    return out


__all__ = ["PopuLoRAEnv", "PopuLoRAEnvConfig", "PopuLoRATaskset", "PopuLoRATasksetConfig"]
