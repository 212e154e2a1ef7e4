"""The report's evolution section names the fitness, selection rule and exploration that decided the run's
replacements, as its lineage.jsonl records them (issue 51)."""

from __future__ import annotations

from evaluation.report.summary import _rules


def test_the_rules_of_a_lineage_are_named_with_kwargs_and_counted() -> None:
    lineage = [
        {
            "fitness": {"name": "mu_minus_3sigma", "params": {}},
            "selection": {"name": "tournament", "params": {"elites": 1}},
            "explore": {"mode": "perturb", "lr_scale": 0.8},
        },
        {
            "fitness": {"name": "mu_minus_3sigma", "params": {}},
            "selection": {"name": "tournament", "params": {"elites": 1}},
            "explore": None,
        },
    ]
    assert _rules(lineage) == (
        'fitness mu_minus_3sigma ×2, selection tournament {"elites": 1} ×2, explore perturb ×1'
    )
    assert _rules([{"step": 2, "operator": "dare"}]) == ""  # a lineage written before the rules were recorded
