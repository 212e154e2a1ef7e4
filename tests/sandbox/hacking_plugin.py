"""Test plugin (``populora train --plugins tests/sandbox/hacking_plugin.py``): the policy's completions are reward
hacks, scripted from the env's own observations, and every round's verdicts are written out for the test.

* teachers: every deduction/abduction proposal is a "checked-mode" program (``tests/sandbox/test_reward_hacking.py``):
  ``f(x) = 3x`` during validation, and while a student's answer is checked, whatever value the check expects;
  induction proposals are a seed program's fresh inputs (so induction tasks exist);
* students: every induction answer is a frame-walking program that returns the hidden output it finds; every
  abduction and deduction answer is wrong.

With ``POPULORA_TEST_HACK_MODE=forge`` the policy forges and colludes instead (``tests/sandbox/test_gold_forgery.py``):
every deduction/abduction proposal is a teacher program of the forgery corpus on the input 3 (its ``f`` really
returns 4, it tries to make the sandbox report 3007), and every answer is the one the forgery would pay: ``3007``
for a deduction task, ``3006`` (a pre-image of 3007 under the true ``x + 1``) for an abduction task. Each
forged task's stored gold output is written out too.

``POPULORA_TEST_HACK_OUT`` names the JSON-lines file: one line per round with every attempt's verdict and
reward and every valid proposal's solve rate and reward.
"""

from __future__ import annotations

import json
import os
from collections import deque

from populora_env.policies import SeedTeacher
from selfplay import loop as _loop
from tests.sandbox.test_gold_forgery import forging_programs
from tests.sandbox.test_reward_hacking import _checked_mode_teacher, _student
from tests.selfplay.scripted import GARBAGE, ScriptedGenerator, continuation

_OUT = os.environ.get("POPULORA_TEST_HACK_OUT")
_FORGE = os.environ.get("POPULORA_TEST_HACK_MODE") == "forge"


class HackScript:
    def __init__(self, seed: int) -> None:
        self.inducer = SeedTeacher(seed)
        self.counter = 0
        self.texts: dict = {}
        self.forged: dict = {}  # task id -> stored gold output, for each forged task a student meets

    def load(self, env, obs, infos, adapter_of) -> None:
        self.texts = {}
        for agent in sorted(obs):
            for prompt, request in zip(obs[agent]["prompts"], infos.get(agent, {}).get("requests", []), strict=True):
                kind, prefix = str(request["task_type"]), str(request.get("prefix", ""))
                if agent.startswith("teacher"):
                    if kind == "induction":
                        full = self.inducer.act(("p",), {"requests": [{**request, "prefix": ""}]})[0]
                        body = full[full.index("<answer>\n") + len("<answer>\n"): full.rindex("\n</answer>")]
                    else:
                        self.counter += 1
                        if _FORGE:
                            forgeries = forging_programs(stored_first=True)
                            program = f"```python\n{forgeries[(self.counter - 1) % len(forgeries)]}```"
                            given = "```input\n3\n```"
                        else:
                            program = f"```python\n{_checked_mode_teacher('frame_walk')}```"
                            given = f"```input\n{self.counter}\n```"
                        text = continuation(f"{program}\n{given}", prefix)
                        if text == GARBAGE:  # a prompt set whose prefix opens the input
                            text = continuation(f"{given}\n{program}", prefix)
                        self.texts.setdefault((adapter_of[agent], prompt), deque()).append(text)
                        continue
                elif _FORGE and kind != "induction":  # the answer its own forgery would pay
                    task = env.current_tasks[request["task_id"]]
                    if task.teacher == "teacher_0" and "_frame" in task.program:
                        self.forged[request["task_id"]] = list(task.outputs)
                    body = "```output\n3007\n```" if kind == "deduction" else "```input\n3006\n```"
                elif kind == "induction":
                    body = f"```python\n{_student('frame_walk')}```"
                elif kind == "abduction":
                    body = "```input\n-777\n```"
                else:
                    body = "```output\n'surely wrong'\n```"
                text = continuation(body, prefix)
                self.texts.setdefault((adapter_of[agent], prompt), deque()).append(text)


def _record(env, script: HackScript) -> None:
    outcome = env.last_outcome
    if outcome is None or not _OUT:
        return
    res = outcome.results
    attempts = [{"agent": a.agent, "task_type": a.task_type, "correct": a.correct, "reason": a.reason,
                 "teacher": a.teacher, "reward": outcome.rewards[a.agent][a.index]} for a in res.attempts]
    proposals = [{"agent": p.agent, "task_id": p.task_id, "task_type": p.task_type, "valid": p.valid, "reason": p.reason,
                  "p_hat": res.solve_rate(p.task_id), "reward": outcome.rewards[p.agent][p.index]}
                 for p in res.proposals]
    with open(_OUT, "a") as fh:
        fh.write(json.dumps({"round": res.round, "attempts": attempts, "proposals": proposals,
                             "forged_gold": script.forged}) + "\n")
    script.forged = {}


_setup = _loop.SelfPlayLoop.setup


def _hacked_setup(self) -> None:
    _setup(self)
    script = HackScript(self.cfg.seed)
    self.generator = ScriptedGenerator(self.tokenizer, script)
    env, adapter_of = self.env, self.mapping.agent_to_member
    reset, step = env.reset, env.step

    def scripted_reset(*args, **kwargs):
        obs, infos = reset(*args, **kwargs)
        self.generator.phase = "propose"
        script.load(env, obs, infos, adapter_of)
        return obs, infos

    def scripted_step(actions):
        out = step(actions)
        if any(o["prompts"] for o in out[0].values()):
            self.generator.phase = "solve"
            script.load(env, out[0], out[4], adapter_of)
        else:
            _record(env, script)
        return out

    env.reset, env.step = scripted_reset, scripted_step


_loop.SelfPlayLoop.setup = _hacked_setup
