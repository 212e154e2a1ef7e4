"""A learner of your own against the env: tabular REINFORCE, no model, no torch, no part of this project's
trainer. It shows the seam the design promises (docs/design.md, "One episode = one round"): the env hands out
prompts and takes completions, rewards come back per completion, and what produces the text is yours.

The policies choose among fixed candidate completions with a softmax over learned preferences:

* the teacher picks one of four proposals: three valid deduction tasks and one that fails validation (it
  raises on its own input), so it should learn to stop proposing the invalid one;
* the student, given a task, picks one of three answers: the right output, a wrong one, or text without the
  answer tags (a format error), so it should learn to answer right.

Each choice is one completion; after the round, ``infos[agent]["completion_rewards"]`` gives the reward of
each completion in order, and the update is REINFORCE with a running-mean baseline,
``theta[a] += lr * (r - b) * (onehot(a) - softmax(theta))``. Swap the tables for a language model and the
candidates for sampled text and this is the whole training loop.

Run it: ``.venv/bin/python examples/own_learner.py`` (about 40 rounds, a few seconds).
"""

import numpy as np

from populora_env import parallel_env
from populora_env.policies import continue_prefix

ROUNDS, LR = 40, 0.5
PROGRAMS = {  # program -> (input, output): the teacher's valid candidates, and the student's answer key
    "def f(x):\n    return 2 * x + 1": ("20", "41"),
    "def f(s):\n    return s[::-1]": ("'abc'", "'cba'"),
    "def f(xs):\n    return sorted(xs)[-1]": ("[3, 9, 4]", "9"),
}
INVALID = "def f(x):\n    return x / 0"  # raises on its input: validation rejects it
PROPOSALS = [f"```python\n{p}\n```\n```input\n{inp}\n```" for p, (inp, _) in PROGRAMS.items()]
PROPOSALS.append(f"```python\n{INVALID}\n```\n```input\n1\n```")


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max())
    return z / z.sum()


def answers_for(program: str) -> list[str]:
    """The student's three candidates for a task: the right output, a wrong one, a badly formatted one."""
    right = PROGRAMS.get(program.strip(), ("", "None"))[1]
    return [f"```output\n{right}\n```", "```output\n0\n```", "I think it is 41."]


def main() -> dict[str, float]:
    rng = np.random.default_rng(0)
    teacher = np.zeros(len(PROPOSALS))  # preferences over the four proposals
    student = np.zeros(3)  # preferences over (right, wrong, badly formatted), shared by every task
    baseline = {"teacher_0": 0.0, "student_0": 0.0}
    env = parallel_env(num_teachers=1, num_students=1, tasks_per_teacher=2, samples_per_task=2,
                       task_types=("deduction",), sandbox_workers=1, reject_duplicates=False)
    for episode in range(ROUNDS):
        obs, infos = env.reset(seed=episode)
        # propose: one choice per prompt; the prefix is what the prompt set pre-fills of the answer
        picks = {"teacher_0": [rng.choice(len(PROPOSALS), p=softmax(teacher)) for _ in obs["teacher_0"]["prompts"]]}
        texts = [continue_prefix(r["prefix"], PROPOSALS[k])
                 for r, k in zip(infos["teacher_0"]["requests"], picks["teacher_0"], strict=True)]
        obs, _, _, _, infos = env.step({"teacher_0": texts})
        # solve: the student's prompt shows the program; its task is looked up by id instead of parsed
        requests = infos["student_0"]["requests"]
        picks["student_0"] = [rng.choice(3, p=softmax(student)) for _ in requests]
        texts = [continue_prefix(r["prefix"], answers_for(env.current_tasks[r["task_id"]].program)[k])
                 for r, k in zip(requests, picks["student_0"], strict=True)]
        obs, rewards, terms, truncs, infos = env.step({"student_0": texts})
        # learn: REINFORCE per completion, rewards aligned with the agent's completions of the round
        for agent, theta in (("teacher_0", teacher), ("student_0", student)):
            for k, r in zip(picks[agent], infos[agent]["completion_rewards"], strict=True):
                theta += LR * (r - baseline[agent]) * (np.eye(len(theta))[k] - softmax(theta))
                baseline[agent] += 0.1 * (r - baseline[agent])
    env.close()
    learned = {"P(teacher proposes the invalid task)": float(softmax(teacher)[-1]),
               "P(student answers right)": float(softmax(student)[0])}
    for what, p in learned.items():  # both start at 1/4 and 1/3
        print(f"{what}: {p:.2f}")
    return learned


if __name__ == "__main__":
    main()
