"""The ``populora`` command: the composition root.

It sits on top of every other package and chooses what to compose — a population run or the AZR baseline
(:mod:`baselines.azr` gives the config transform and the agent assignment), evaluation, the report, the
weight-space operators on saved adapters. Nothing imports this package.
"""
