"""Play examples/play_one_round.py's round through OpenEnv: a local game server and its client.

The server (``populora_bridges.openenv_server``) holds one game per session on 127.0.0.1; the client
(``populora_bridges.openenv_client.GameClient``) resets it, sends the teacher's proposal and the student's two
answers as typed actions, and reads the rewards from the observations: the same round, the same rewards
(student [1.0, -0.5], teacher [0.5]) as the env driven directly.

Run it: ``.venv/bin/python examples/openenv_round.py`` (needs ``pip install -e ".[openenv]"``; seconds).
"""

import json
import subprocess
import sys

from populora_bridges.openenv_client import GameAction, GameClient
from populora_env.policies import continue_prefix

SETTINGS = dict(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=2,
                task_types=["deduction"])
server = subprocess.Popen([sys.executable, "-m", "populora_bridges.openenv_server", "--port", "0",
                           "--sandbox-workers", "1", "--settings", json.dumps(SETTINGS)],
                          stdout=subprocess.PIPE, text=True)
try:
    address = server.stdout.readline().split()[-1]  # "listening on 127.0.0.1:PORT"
    with GameClient(base_url=f"http://{address}").sync() as env:
        obs = env.reset(seed=0).observation
        prefix = obs.requests["teacher_0"][0]["prefix"]
        task = "```python\ndef f(x):\n    return 2 * x + 1\n```\n```input\n20\n```"
        obs = env.step(GameAction(agent="teacher_0", completions=[continue_prefix(prefix, task)])).observation
        answers = [continue_prefix(r["prefix"], f"```output\n{guess}\n```")
                   for r, guess in zip(obs.requests["student_0"], (41, 40), strict=True)]
        result = env.step(GameAction(agent="student_0", completions=answers))
        print("rewards:", result.observation.rewards)
        print("per completion:", result.observation.completion_rewards)
        print("the pair:", result.observation.infos["student_0"]["round"]["pairs"])
finally:
    server.terminate()
    server.wait(timeout=60)
