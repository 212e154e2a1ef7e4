"""A reward scheme that reads the whole game: a teacher bonus for the complexity of its program, a student
penalty for the length of its answer in tokens, on top of the built-in ``populora`` rewards.

A valid proposal earns ``bonus`` × its program's cyclomatic complexity (``ProposalResult.metrics``, the measures
the run's ``programs/`` diagnostics use); every attempt costs ``penalty`` per token of its completion
(``AttemptResult.num_tokens``: the generator's count, which a run passes with each completion). The scheme
returns :class:`~populora_env.SchemeRewards` naming both terms, so a run logs ``rewards/teacher/complexity_bonus``
and ``rewards/student/length_penalty`` (docs/swapping.md).

Use it: ``.venv/bin/populora test-scheme --plugins examples/complexity_scheme.py complexity`` (every branch,
scripted, no model), or in a seconds-long run against scripted opponents: ``.venv/bin/populora train --plugins
examples/complexity_scheme.py --preset scripted --env.reward-scheme complexity``.
Run it: ``.venv/bin/python examples/complexity_scheme.py`` (the test-scheme table).
"""

from populora_env import SchemeRewards, register_reward_scheme
from populora_env.rewards import populora_rewards


@register_reward_scheme("complexity")
def complexity(results, bonus=0.05, penalty=0.002):
    rewards = populora_rewards(results)
    terms = {"complexity_bonus": {}, "length_penalty": {}}
    for t in results.teachers:
        terms["complexity_bonus"][t] = [
            bonus * p.metrics.cyclomatic if p.metrics else 0.0 for p in results.proposals_of(t)
        ]
    for s in results.students:
        terms["length_penalty"][s] = [-penalty * (a.num_tokens or 0) for a in results.attempts_of(s)]
    for term in terms.values():
        for agent, values in term.items():
            rewards[agent] = [r + v for r, v in zip(rewards[agent], values, strict=True)]
    return SchemeRewards(rewards, terms)


if __name__ == "__main__":
    from populora_cli.plugin_check import scheme_table

    for row in scheme_table(complexity, {}):
        print(*row, sep=" | ")
