"""The verifiers bridge: verifiers' own loader builds the environment, and a scripted episode is scored with
both roles' rewards equal to what ``env.step`` pays for the same completions."""

from __future__ import annotations

import asyncio
import json

from populora_env.policies import continue_prefix
from tests.bridges.marks import extra_marks
from tests.test_examples import run_example

pytestmark = extra_marks("verifiers", ("verifiers",))

SETTINGS = {"tasks_per_teacher": 1, "samples_per_task": 3, "task_types": ["abduction"], "sandbox_workers": 1}


def test_the_verifiers_example_scores_both_roles_as_the_env_does() -> None:
    out = dict(line.split(": ", 1) for line in run_example("verifiers_round.py").splitlines())
    scored = json.loads(out["verifiers"].replace("'", '"'))
    assert scored == json.loads(out["env.step"].replace("'", '"')) == {"teacher": [0.5], "student": [1.0, -0.5]}
    assert float(out["p_hat"]) == 0.5


def test_an_episode_with_garbage_and_a_missing_reply_is_paid_by_the_env() -> None:
    import verifiers.v1 as vf

    from populora_env import parallel_env

    config = vf.resolve_env_config({"taskset": {"id": "populora-verifiers", "settings": SETTINGS, "rounds": 2,
                                                "seed": 7}})
    env = vf.load_environment(config)
    assert type(env).__name__ == "PopuLoRAEnv" and type(config).__name__ == "PopuLoRAEnvConfig"
    tasks = list(env.taskset)
    assert [t.data.info["round"] for t in tasks] == [0, 1] and tasks[0].data.prompt != tasks[1].data.prompt
    task = tasks[1]
    proposal = continue_prefix("", ("```python\ndef f(a, b):\n    return a * b\n```\n```input\n3, 4\n```"))
    replies = {"teacher": [proposal], "student": [continue_prefix("", "```input\n2, 6\n```"), "garbage"]}
    traces = [vf.Trace(task=vf.TraceTask(type="PopuLoRATask", data=task.data),
                       agent=vf.AgentInfo(config=getattr(config, role), name=role), root_reply=text,
                       info={"index": k})
              for role, texts in replies.items() for k, text in enumerate(texts)]
    episode = vf.Episode(task=vf.TraceTask(type="PopuLoRATask", data=task.data), traces=traces)
    asyncio.run(env.finalize(task, episode))

    game = parallel_env(num_teachers=1, num_students=1, **SETTINGS)  # the same round, by hand
    game.reset(seed=task.data.info["seed"])
    game.step({"teacher_0": [proposal]})
    *_, infos = game.step({"student_0": replies["student"]})  # the third attempt is missing: a format error
    game.close()
    paid = {role: [t.rewards["populora"].score for t in episode.by_agent[role]] for role in replies}
    assert paid["teacher"] == infos["teacher_0"]["completion_rewards"] == [1 - 1 / 3]
    assert paid["student"] == infos["student_0"]["completion_rewards"][:2] == [1.0, -1.0]
    verdicts = [t.info["verdict"]["reason"] for t in episode.by_agent["student"]]
    assert verdicts == [None, "format"]
    assert episode.traces[0].metrics["game/pair/p_hat"] == 1 / 3
