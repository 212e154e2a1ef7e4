"""A self-play loop whose completions are scripted, so a test knows the rewards a real step will produce.

Everything is real except the text: the env (validation and checking in the sandbox, PFSP matching, the reward
scheme), the seam (``rollouts_from_round``), the trainer (a real update of every member on ``tiny-random``) and
the PBT controller. The generator is replaced by :class:`ScriptedGenerator`, which answers every request from a
script made from the env's own observations and request infos (captured around ``env.reset``/``env.step``):

- teachers: a teacher's proposals of each task type alternate, valid first (a seed program ``def f(...)`` with a
  fresh input; induction: the given seed program's fresh inputs and message), then garbage (format error, −1);
- students: likewise, a student's attempts of each task type alternate, correct first (the env's ground truth),
  then garbage (−1), whatever ``samples_per_task`` is (one attempt per task included).

So within every member's batch of either role the rewards differ (valid vs invalid, correct vs wrong) whenever
the role has at least two completions, and within every (role, task type) of it that has two. Completions continue the request's response prefix (``infos`` carry it
when the prompt set pre-fills one): the scripted full answer is cut after that prefix.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.generation import Completion, GenerationRequest
from populora_env.policies import SeedTeacher, format_answer
from populora_env.seeds import SEED_PROGRAMS, generate_args
from selfplay.config import TrainConfig
from selfplay.loop import SelfPlayLoop

GARBAGE = "I am not sure what to write here."


def continuation(body: str, prefix: str) -> str:
    """The completion that, after ``prefix``, reads as a well-formatted answer with ``body``; garbage if no
    formatting of it starts with ``prefix``."""
    for thought in ("ok", ""):
        full = format_answer(body, thought)
        if full.startswith(prefix):
            return full[len(prefix):]
    return GARBAGE


class Script:
    """Scripted completion texts per ``(adapter, prompt)``, in the order the loop asks for them."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.inducer = SeedTeacher(seed)
        self.used: set[str] = set()
        self.plain = [p for p in SEED_PROGRAMS if p.program.startswith("def f(")]
        self.texts: dict[tuple[str | None, str], deque[str]] = {}

    def _proposal(self, request: Mapping[str, Any]) -> str:
        prefix = str(request.get("prefix", ""))
        if request["task_type"] == "induction":
            full = self.inducer.act(("p",), {"requests": [{**request, "prefix": ""}]})[0]  # the full answer
            body = full[full.index("<answer>\n") + len("<answer>\n"): full.rindex("\n</answer>")]
            return continuation(body, prefix)
        seed = self.plain[int(self.rng.integers(len(self.plain)))]
        args = generate_args(seed.arg_kinds, self.rng)
        while f"{seed.name}:{args}" in self.used:
            args = generate_args(seed.arg_kinds, self.rng)
        self.used.add(f"{seed.name}:{args}")
        program, given = f"```python\n{seed.program}```", f"```input\n{args}\n```"
        text = continuation(f"{program}\n{given}", prefix)
        return text if text != GARBAGE else continuation(f"{given}\n{program}", prefix)  # a prefix may open the input

    @staticmethod
    def _answer(task: Any, request: Mapping[str, Any]) -> str:
        kind = task.task_type.value
        if kind == "deduction":
            body = f"```output\n{task.output}\n```"
        elif kind == "abduction":
            body = f"```input\n{task.input}\n```"
        else:
            body = f"```python\n{task.program.rstrip()}\n```"
        return continuation(body, str(request.get("prefix", "")))

    def load(self, env: Any, obs: Mapping[str, Mapping[str, Any]], infos: Mapping[str, Mapping[str, Any]],
             adapter_of: Mapping[str, str]) -> None:
        """Script every active agent's completions of this phase."""
        self.texts = {}
        tasks = env.current_tasks
        for agent in sorted(obs):
            prompts = list(obs[agent]["prompts"])
            requests = list(infos.get(agent, {}).get("requests", []))
            of_type: Counter[str] = Counter()
            for prompt, request in zip(prompts, requests, strict=True):
                kind = str(request["task_type"])
                good = of_type[kind] % 2 == 0
                of_type[kind] += 1
                if agent.startswith("teacher"):
                    text = self._proposal(request) if good else GARBAGE
                else:
                    text = self._answer(tasks[request["task_id"]], request) if good else GARBAGE
                self.texts.setdefault((adapter_of[agent], prompt), deque()).append(text)


class ScriptedGenerator:
    """A generation backend that returns the script's texts (token ids from the real tokenizer).

    The env judges the full text; the token ids the trainer learns from are its first ``max_tokens`` (at most
    the request's ``max_new_tokens``): a tiny model's update costs one full-vocabulary logit row per completion
    token, and the tests need the batch's shape (how many completions of which role and type, with which
    rewards), not its lengths. Records every request it served (``requests``: ``(phase, GenerationRequest)``), so
    tests can compare the generation budgets of two arms.
    """

    def __init__(self, tokenizer: Any, script: Script, max_tokens: int = 8) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.max_tokens = max_tokens
        self.phase = "propose"
        self.requests: list[tuple[str, GenerationRequest]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out: list[Completion] = []
        for r_index, req in enumerate(requests):
            self.requests.append((self.phase, req))
            prompt_ids = list(self.tokenizer(str(req.prompt))["input_ids"])
            for s in range(req.n):
                text = self.script.texts[(req.adapter, req.prompt)].popleft()
                ids = list(self.tokenizer(text)["input_ids"])[: min(req.max_new_tokens, self.max_tokens)]
                out.append(Completion(r_index, s, req.adapter, text, prompt_ids, ids, [0.0] * len(ids)))
        return out

    def refresh(self, names: Sequence[str] | None = None) -> None:
        return None


class ScriptedLoop(SelfPlayLoop):
    """:class:`SelfPlayLoop` with the scripted generator and a count of trainer updates per member and step."""

    def setup(self) -> None:
        super().setup()
        self.script = Script(self.cfg.seed)
        self.generator = ScriptedGenerator(self.tokenizer, self.script)
        self.updates: Counter[str] = Counter()
        self.batches: dict[str, list] = {}
        env, trainer = self.env, self.trainer
        reset, step, update = env.reset, env.step, trainer.update
        adapter_of = self.mapping.agent_to_member

        def scripted_reset(*args: Any, **kwargs: Any):
            obs, infos = reset(*args, **kwargs)
            self.generator.phase = "propose"
            self.script.load(env, obs, infos, adapter_of)
            self.updates.clear()
            self.batches = {}
            return obs, infos

        def scripted_step(actions: Any):
            out = step(actions)
            if any(o["prompts"] for o in out[0].values()):  # the solve phase's prompts
                self.generator.phase = "solve"
                self.script.load(env, out[0], out[4], adapter_of)
            return out

        def counted_update(member: str, rollouts: Sequence[Any]):
            self.updates[member] += 1
            self.batches[member] = list(rollouts)
            return update(member, rollouts)

        env.reset, env.step, trainer.update = scripted_reset, scripted_step, counted_update


def cpu_config(cfg: TrainConfig, run_dir: Path) -> TrainConfig:
    """A preset's run configuration made runnable on this CPU with ``tiny-random``: every budget (teachers,
    students, proposals, samples, task types, token limits) and the trainer's objective (estimator, loss, lr)
    kept as the preset sets them; only where things run changes (CPU, HF backend, two sandbox workers) and how
    the update is laid out (no activation checkpointing, micro-batches of 64: the same gradient), and no seeding
    stage before the first step (the GPU presets' base-model seeding is ``tests/selfplay/test_seeding.py``'s)."""
    env = dataclasses.replace(cfg.env, sandbox_workers=min(cfg.env.sandbox_workers, 2), seed_tasks=0)
    generation = dataclasses.replace(cfg.generation, engine="hf")
    trainer = dataclasses.replace(cfg.trainer, gradient_checkpointing=False, micro_batch_size=64)
    return dataclasses.replace(cfg, model="tiny-random", dtype="float32", device="cpu", env=env,
                               generation=generation, trainer=trainer, run_dir=run_dir, progress=False, threads=1)
