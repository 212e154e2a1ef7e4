"""Swapped PBT selection and matching rules in real ``tiny-random`` runs from the command line (issue 51's
done-when): a tournament-selection run with learning-rate exploration and a uniform-matching run each name their
rules in config.json and lineage.jsonl, and each, killed with ``kill -9`` in the middle of its step-2 checkpoint
and resumed, ends exactly where its uninterrupted run ends (weights, checkpoints, lineage, TensorBoard).
``populora list`` names the rules with their kwargs; ``populora test-selection`` / ``test-matching`` report a
plugin's decisions or its failure in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from selfplay import tags
from tests.selfplay.conftest import REF_ARGS, populora
from tests.selfplay.test_resume import PLUGIN, TIMED, _launch, _lineage, _same_weights, _untimed

RUNS = {
    "tournament": ["--pbt.selection", "tournament", "--pbt.lr-explore", "perturb"],
    "uniform": ["--env.matching", "uniform", "--env.matching-random", "0.25"],
}


def _same_run(ref: Path, run: Path) -> None:
    from evaluation.report import load_scalars

    _same_weights(ref / "adapters", run / "adapters")
    for name in ("step_3", "step_4"):
        a, b = ref / "checkpoints" / name, run / "checkpoints" / name
        _same_weights(a / "population", b / "population")
        for f in ("env_state.json", "pbt_state.json", "loop_state.json"):
            assert _untimed(json.loads((a / f).read_text())) == _untimed(json.loads((b / f).read_text())), (
                b / f
            )
    assert _lineage(run) == _lineage(ref)
    sa, sb = load_scalars(ref), load_scalars(run)
    assert sa.keys() == sb.keys()
    for tag in sa:
        if not tag.startswith(TIMED) and tag != tags.time("checkpoint"):
            assert sb[tag] == sa[tag], tag


@pytest.mark.e2e
@pytest.mark.parametrize("rule", list(RUNS))
def test_swapped_rule_run_names_it_and_resumes_after_kill_9_exactly(tmp_path: Path, rule: str) -> None:
    args = [*REF_ARGS, *RUNS[rule]]
    ref = tmp_path / "ref"
    p = populora("train", *args, "--run-dir", str(ref))
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = json.loads((ref / "config.json").read_text())["config"]
    lineage = [json.loads(ln) for ln in (ref / "lineage.jsonl").read_text().splitlines()]
    assert lineage, "no replacement: the rule did nothing in the run"
    if rule == "tournament":
        assert cfg["pbt"]["selection"] == "tournament" and cfg["pbt"]["lr_explore"] == "perturb"
        for r in lineage:
            assert r["selection"]["name"] == "tournament" and "binary tournament" in r["selection"]["why"]
            e = r["explore"]  # the parent's scale times 0.8 or 1.2 (a step-2 child can parent at step 4)
            assert any(e["lr_scale"] == pytest.approx(e["parent_lr_scale"] * f) for f in (0.8, 1.2))
            assert r["explore"]["lr"] == pytest.approx(cfg["trainer"]["lr"] * r["explore"]["lr_scale"])
        # a step-2 child trained at step 3 with its own learning rate: its optimizer in checkpoint step_3 says so
        for r in (r for r in lineage if r["step"] == 2):
            opt = torch.load(
                ref / "checkpoints" / "step_3" / "population" / r["culled"] / "optimizer.pt",
                weights_only=True,
            )
            assert all(g["lr"] == pytest.approx(r["explore"]["lr"]) for g in opt["param_groups"])
    else:
        assert cfg["env"]["matching"] == "uniform" and cfg["env"]["matching_random"] == 0.25
        assert all(r["selection"]["name"] == "truncation" for r in lineage)
    run = tmp_path / "killed"
    p = _launch(["train", *args, "--plugins", PLUGIN, "--run-dir", str(run)], "mid_population@2")
    assert p.returncode == -9, p.stderr[-3000:]
    p = _launch(["train", "--resume", str(run), "--plugins", PLUGIN, "--no-progress"], None)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed {run} from checkpoint step 1" in p.stderr
    _same_run(ref, run)


def test_list_shows_fitness_selection_and_matching_rules_with_their_kwargs() -> None:
    p = populora("list", "selections")
    assert p.returncode == 0, p.stderr
    assert "truncation(elites=0)" in p.stdout and "tournament(elites=0)" in p.stdout
    assert "ttest(elites=0, alpha=0.05, metric='reward', window=5)" in p.stdout
    p = populora("list", "fitness")
    assert "win_rate(window=5, prior=0.5)" in p.stdout and "mu_minus_3sigma" in p.stdout
    p = populora("list", "matchings")
    assert all(name in p.stdout for name in ("variance", "hard", "linear", "uniform"))
    assert "--env.matching NAME" in p.stdout


PLUGIN_RULES = '''
from evolution.selection import SelectionPlan, register_fitness, register_selection
from populora_env.matching import register_matching


@register_fitness("last_reward_test", defaults={"prior": 0.0})
def last_reward(rating, history, prior):
    """The last round's mean reward."""
    return history[-1].reward if history and history[-1].reward is not None else prior


@register_selection("worst_only_test")
def worst_only(ctx):
    """Cull the least fit member; its parent is the fittest."""
    ranked = ctx.ranked()
    return SelectionPlan([ranked[0]], [ranked[-1]], why={ranked[0]: "the least fit"})


@register_selection("raises_test")
def raises(ctx):
    """A broken rule."""
    raise RuntimeError("boom")


@register_matching("square_test", defaults={"k": 2.0})
def square(p, k):
    """p ** k."""
    return p ** k
'''


def test_testers_report_a_plugin_rule_and_fail_in_one_line(tmp_path: Path) -> None:
    plugin = tmp_path / "rules.py"
    plugin.write_text(PLUGIN_RULES)
    p = populora(
        "test-selection", "--plugins", str(plugin), "worst_only_test", "--fitness", "last_reward_test"
    )
    assert p.returncode == 0, p.stderr
    assert "event 1: culled m0" in p.stdout and "m0: the least fit; mutation parent m5" in p.stdout
    p = populora("test-selection", "--plugins", str(plugin), "raises_test")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert "populora test-selection: error: raises_test: event 1: RuntimeError: boom at " in p.stderr
    p = populora("test-matching", "--plugins", str(plugin), "square_test", "--kwargs", '{"k": 3}')
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines()[2:]}
    assert int(rows["s_strong"][-1]) > int(rows["s_weak"][-1])  # p^3 favours the strong student
    p = populora("test-matching", "square_test", "--plugins", str(plugin), "--kwargs", '{"k": "x"}')
    assert (
        p.returncode == 2
        and "--kwargs: matching 'square_test': parameter k='x' is not a valid float" in p.stderr
    )
    p = populora("test-selection", "nope")
    assert p.returncode == 2 and "NAME: unknown selection rule 'nope'; known: " in p.stderr


def test_train_refuses_an_unknown_rule_in_one_line() -> None:
    p = populora("train", *REF_ARGS, "--pbt.selection", "nope", "--dry-run")
    assert p.returncode == 2 and "--pbt.selection: unknown selection rule 'nope'" in p.stderr, p.stderr
    p = populora("train", *REF_ARGS, "--env.matching", "hardest", "--dry-run")
    assert p.returncode == 2 and "--env.matching: unknown matching 'hardest'" in p.stderr, p.stderr
