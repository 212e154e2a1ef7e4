"""Play one round of the game by hand: the PettingZoo loop a learner of your own drives.

One round is one episode of two steps (docs/design.md, "One episode = one round"): the teachers propose
tasks, the sandbox validates them, then the matched students attempt each valid task and everyone is paid.
Here one teacher proposes one deduction task (a program and an input) and one student predicts the output
twice, once right and once wrong. Every completion is text, exactly what a language model would write.

Run it: ``.venv/bin/python examples/play_one_round.py`` (a second or two; no model, no torch).
"""

from populora_env import parallel_env
from populora_env.policies import continue_prefix

# The env's settings are EnvConfig's fields (docs/env.md lists them all); the rest keep their defaults.
env = parallel_env(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=2,
                   task_types=("deduction",), sandbox_workers=1)
obs, infos = env.reset(seed=0)  # obs["teacher_0"]["prompts"]: one proposer prompt per completion expected

# Step 1, propose. A completion continues the request's response prefix (the prompt set may pre-fill
# "<think>" or an answer opening): continue_prefix writes the rest of <think>...</think><answer>...</answer>.
request = infos["teacher_0"]["requests"][0]
task = "```python\ndef f(x):\n    return 2 * x + 1\n```\n```input\n20\n```"
obs, rewards, terms, truncs, infos = env.step({"teacher_0": [continue_prefix(request["prefix"], task)]})
print("proposal:", infos["teacher_0"]["proposals"][0])  # valid, with its task id and type

# Step 2, solve. The student has one prompt per attempt (samples_per_task of them): f(20) is 41.
answers = [continue_prefix(r["prefix"], f"```output\n{guess}\n```")
           for r, guess in zip(infos["student_0"]["requests"], (41, 40), strict=True)]
obs, rewards, terms, truncs, infos = env.step({"student_0": answers})

# Rewards: per agent the mean over its completions; per completion in infos. The built-in 'populora'
# scheme pays the student +1 (right) and -0.5 (wrong), the teacher 1 - p̂ = 0.5 (solved half the time).
print("rewards:", rewards)
print("per completion:", {a: infos[a]["completion_rewards"] for a in infos})
print("the pair:", infos["student_0"]["round"]["pairs"])
env.close()
