"""Baselines that reuse the self-play loop (the single-agent Absolute Zero Reasoner): a run configuration and
an agent -> adapter mapping that ``selfplay`` trains like any other; only the CLI imports this package."""
