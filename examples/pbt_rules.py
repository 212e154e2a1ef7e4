"""PBT and matchmaking rules of your own, as a plugin: a fitness, a selection rule and a PFSP weighting.

* ``recent_reward`` (fitness): the mean reward of a member's last ``window`` rounds, minus ``penalty`` times
  its TrueSkill σ (a member the ratings know little about ranks lower);
* ``worst_one`` (selection): cull only the least fit member (never a protected newborn); its parent, or both
  parents of a crossover, are drawn uniformly from the ``top`` fittest others, from the event's generator;
* ``near_even`` (matching): weight ``exp(-((p - ½) / width)²)``, a sharper preference for even pairings than
  ``variance``'s ``p(1 - p)``.

Use it:

* what each decides on a scripted population, in seconds: ``.venv/bin/populora test-selection --plugins
  examples/pbt_rules.py worst_one --fitness recent_reward`` and ``.venv/bin/populora test-matching --plugins
  examples/pbt_rules.py near_even --kwargs '{"width": 0.1}'``;
* in a run: ``.venv/bin/populora train --preset tiny --plugins examples/pbt_rules.py --pbt.selection worst_one
  --pbt.fitness recent_reward --env.matching near_even``.
"""

import math

from evolution.selection import SelectionPlan, register_fitness, register_selection
from populora_env.matching import register_matching


@register_fitness("recent_reward", defaults={"window": 3, "penalty": 0.01})
def recent_reward(rating, history, window, penalty):
    """Mean reward of the last `window` rounds minus `penalty` times sigma."""
    rewards = [h.reward for h in history[-window:] if h.reward is not None]
    return (sum(rewards) / len(rewards) if rewards else 0.0) - penalty * rating[1]


@register_selection("worst_one", defaults={"top": 2})
def worst_one(ctx, top):
    """Cull the least fit member that is not a protected newborn; parents uniform from the `top` fittest."""
    ranked = [m for m in ctx.ranked() if m not in ctx.protected]
    if not ranked:
        return SelectionPlan([], [])
    pool = [m for m in ctx.ranked(descending=True) if m != ranked[0]][:top]

    def parents(slot, arity, rng):
        return [pool[i] for i in rng.sample(len(pool), arity)]

    return SelectionPlan([ranked[0]], pool, why={ranked[0]: "the least fit"}, parents=parents)


@register_matching("near_even", defaults={"width": 0.2})
def near_even(p, width):
    """exp(-((p - 1/2) / width)^2): pairings near even odds, sharper than variance."""
    return math.exp(-(((p - 0.5) / width) ** 2))
