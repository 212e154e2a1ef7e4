"""A reward scheme of your own, as a plugin: the README's ``gentle`` scheme, and one round played with it.

A reward scheme is one registered function of the round's ``RoundResults`` that returns one reward per
completion for every agent (teachers: proposals; students: attempts), in order (docs/design.md; the built-ins
are in ``populora_env/rewards.py``). ``gentle`` pays a teacher ``1 - p̂`` for a task its matched student solves
at least once, ``unsolved`` for a valid task nobody solves, and a milder ``invalid`` penalty than the built-in
scheme while proposals are still malformed.

Use it:

* every branch, scripted, in a second (no model): ``.venv/bin/populora test-scheme --plugins
  examples/reward_scheme.py gentle --kwargs '{"invalid": -0.25}'``;
* in a run: ``.venv/bin/populora train --plugins examples/reward_scheme.py --env.reward-scheme gentle
  --env.reward-kwargs '{"invalid": -0.25}' --preset tiny`` (a tiny-random model never writes a valid task, so
  such a run only reaches the ``invalid`` branch: test-scheme is how the others are checked);
* as a script, below: one round of the env with scripted policies (seed programs, correct answers).

Run it: ``.venv/bin/python examples/reward_scheme.py`` (a second or two).
"""

from populora_env import register_reward_scheme, student_reward


@register_reward_scheme("gentle")
def gentle(results, invalid=-1.0, unsolved=0.0):
    rewards = {}
    for teacher in results.teachers:
        rewards[teacher] = []
        for p in results.proposals_of(teacher):
            p_hat = results.solve_rate(p.task_id) if p.valid else None
            rewards[teacher].append(invalid if not p.valid else unsolved if not p_hat else 1.0 - p_hat)
    for student in results.students:
        rewards[student] = [student_reward(a) for a in results.attempts_of(student)]
    return rewards


if __name__ == "__main__":
    from populora_env import OracleStudent, SeedTeacher, parallel_env

    # the scheme by name, its keyword arguments checked against its signature when the env is made
    env = parallel_env(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2,
                       task_types=("deduction", "abduction"), sandbox_workers=1,
                       reward_scheme="gentle", reward_kwargs={"invalid": -0.25})
    obs, infos = env.reset(seed=0)
    teacher, oracle = SeedTeacher(seed=0), OracleStudent(env)  # valid proposals; correct answers
    obs, _, _, _, infos = env.step({a: teacher.act(obs[a], infos[a]) for a in env.agents if a.startswith("teacher")})
    # every second attempt left empty (a format error): each task is solved at half of its attempts
    answers = {a: [text if k % 2 == 0 else "" for k, text in enumerate(oracle.act(obs[a], infos[a]))]
               for a in env.agents if a.startswith("student")}
    obs, rewards, _, _, infos = env.step(answers)
    # p̂ = 0.5 for every task: gentle pays its teacher 1 - 0.5; the students +1 (right) and -1 (format error)
    print({a: infos[a]["completion_rewards"] for a in infos})
    env.close()
