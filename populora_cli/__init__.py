"""The ``populora`` command, and the Python API it runs.

It sits on top of every other package and chooses what to compose — a population run or the AZR baseline
(:mod:`baselines.azr` gives the config transform and the agent assignment), evaluation, the report, the
weight-space operators on saved adapters. Nothing in the project imports this package; users do, for the API
(:mod:`populora_cli.api`)::

    from populora_cli import train, baseline, compare
"""

from populora_cli.api import Comparison, Run, baseline, compare, train

__all__ = ["Comparison", "Run", "baseline", "compare", "train"]
