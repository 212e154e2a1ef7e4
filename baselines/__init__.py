"""Baselines that reuse the env and agents layers (the single-agent Absolute Zero Reasoner)."""
