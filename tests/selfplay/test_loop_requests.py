"""The loop builds each generation request from the env's request info: chat template, response prefix, stop."""

from __future__ import annotations

import numpy as np

from agents.generation import Completion, GenerationRequest
from populora_env import parallel_env
from populora_env.env import PHASES
from selfplay.config import TrainConfig
from selfplay.loop import SelfPlayLoop
from selfplay.mapping import AgentMapping


class _Recorder:
    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.requests += requests
        return [Completion(i, k, r.adapter, "", [1], [], []) for i, r in enumerate(requests) for k in range(r.n)]


def _loop(env) -> tuple[SelfPlayLoop, _Recorder]:
    loop = SelfPlayLoop(TrainConfig(), run_dir=".")
    loop.step, loop.generator = 0, _Recorder()
    loop.mapping = AgentMapping.build(env.teachers, env.students)
    return loop, loop.generator


def test_requests_carry_the_prompt_sets_generation_rules() -> None:
    for name, chat, prefix in (("small", True, "<think></think>\n<answer>\n"), ("azr", False, "<think>")):
        env = parallel_env(prompts=name, num_teachers=2, num_students=1, tasks_per_teacher=3, seed=0)
        obs, infos = env.reset(seed=0)
        loop, recorder = _loop(env)
        loop._generate(obs, infos, "propose")
        assert len(recorder.requests) == 6
        for request, spec in zip(recorder.requests, [r for t in env.teachers for r in infos[t]["requests"]],
                                 strict=True):
            assert request.chat is chat and request.prefix == spec["prefix"] and request.prefix.startswith(prefix)
            assert request.stop == ("</answer>",)
        env.close()


def test_identical_prompts_with_different_prefixes_are_separate_requests() -> None:
    env = parallel_env(num_teachers=1, num_students=1, tasks_per_teacher=1, seed=0)
    loop, recorder = _loop(env)
    obs = {"student_0": {"prompts": ("same prompt",) * 3, "phase": np.int64(PHASES.index("solve"))}}
    specs = [{"prefix": "a", "chat_template": True, "stop": ["</answer>"]}] * 2 + [{"prefix": "b"}]
    completions, _, _ = loop._generate(obs, {"student_0": {"active": True, "requests": specs}}, "solve")
    assert [(r.n, r.prefix, r.stop) for r in recorder.requests] == [(2, "a", ("</answer>",)), (1, "b", ())]
    assert sorted(completions) == [("student_0", 0), ("student_0", 1), ("student_0", 2)]
    env.close()
