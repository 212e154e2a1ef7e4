"""A reward scheme that pays a teacher for novelty: ``bonus`` for a valid task whose program is new, i.e. its
structure (:func:`populora_env.program_fingerprint`: names and constants abstracted) matches no program in the
buffers before the round (``RoundResults.buffers``, the earlier rounds' tasks) nor an earlier proposal of the
round; the ``populora`` rewards otherwise.

Use it: ``.venv/bin/populora test-scheme --plugins examples/novelty_scheme.py novelty``.
Run it: ``.venv/bin/python examples/novelty_scheme.py`` (the test-scheme table).
"""

from populora_env import SchemeRewards, program_fingerprint, register_reward_scheme
from populora_env.rewards import populora_rewards


@register_reward_scheme("novelty")
def novelty(results, bonus=0.5):
    rewards = populora_rewards(results)
    seen = {program_fingerprint(t.program) for tasks in results.buffers.values() for t in tasks}
    terms = {"novelty_bonus": {}}
    for teacher in results.teachers:
        values = []
        for p in results.proposals_of(teacher):
            new = p.task is not None and program_fingerprint(p.task.program) not in seen
            seen.add(program_fingerprint(p.task.program) if p.task is not None else None)
            values.append(bonus if new else 0.0)
        terms["novelty_bonus"][teacher] = values
        rewards[teacher] = [r + v for r, v in zip(rewards[teacher], values, strict=True)]
    return SchemeRewards(rewards, terms)


if __name__ == "__main__":
    from populora_cli.plugin_check import scheme_table

    for row in scheme_table(novelty, {}):
        print(*row, sep=" | ")
