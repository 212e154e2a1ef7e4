"""Score one scripted episode of the game through verifiers, and check it against the env itself.

verifiers' own loader builds the environment from its id (``populora-verifiers``, verifiers' v1
multi-agent API); an episode holds a ``teacher`` trace per proposer prompt and a ``student`` trace per solver
prompt. Here both roles' completions are scripted (no model server): the teacher proposes the deduction task of
examples/play_one_round.py, the student answers it right and then wrong, and the environment's ``finalize`` (its
rubric: the env's sandbox and reward scheme) records each trace's reward. The same completions sent to
``env.step`` directly give the same rewards.

Run it: ``.venv/bin/python examples/verifiers_round.py`` (needs ``pip install -e ".[verifiers]"``; seconds).
"""

import asyncio

import verifiers.v1 as vf

from populora_env.policies import continue_prefix

SETTINGS = {"tasks_per_teacher": 1, "samples_per_task": 2, "task_types": ["deduction"], "sandbox_workers": 1}
config = vf.resolve_env_config({"taskset": {"id": "populora-verifiers", "settings": SETTINGS,
                                            "rounds": 1}})
env = vf.load_environment(config)
task = next(iter(env.taskset))

proposal = continue_prefix("", "```python\ndef f(x):\n    return 2 * x + 1\n```\n```input\n20\n```")
answers = [continue_prefix("", f"```output\n{guess}\n```") for guess in (41, 40)]
traces = [vf.Trace(task=vf.TraceTask(type="PopuLoRATask", data=task.data),
                   agent=vf.AgentInfo(config=getattr(config, role), name=role), root_reply=text, info={"index": k})
          for role, texts in (("teacher", [proposal]), ("student", answers)) for k, text in enumerate(texts)]
episode = vf.Episode(task=vf.TraceTask(type="PopuLoRATask", data=task.data), traces=traces)
asyncio.run(env.finalize(task, episode))
print("verifiers:", {t.agent.name: [u.rewards["populora"].score for u in episode.by_agent[t.agent.name]]
                     for t in episode.traces})
print("p_hat:", episode.traces[0].metrics["game/pair/p_hat"])

game = env.taskset.game()  # the same round, played with env.step
game.reset(seed=task.data.info["seed"])
game.step({"teacher_0": [proposal]})
*_, infos = game.step({"student_0": answers})
print("env.step:", {"teacher": infos["teacher_0"]["completion_rewards"],
                    "student": infos["student_0"]["completion_rewards"]})
game.close()
