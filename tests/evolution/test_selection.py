"""PBT fitness and selection registries (evolution/selection.py) driven through the controller: the built-in
fitness values, tournament and t-test decisions, elites, plugin rules, learning-rate exploration, the recorded
rounds across a checkpoint, and the one-line errors of bad names and kwargs."""

from __future__ import annotations

import json

import pytest

from evolution.pbt import PBTConfig, PBTController, round_stats
from evolution.selection import (
    RoundStat,
    SelectionPlan,
    get_fitness,
    register_fitness,
    register_selection,
    unregister_fitness,
    unregister_selection,
)
from populora_env.checks import ConfigError
from populora_env.results import MatchResult

from .test_pbt import RATINGS, ROLES, FakePopulation, run

TEACHERS = {"teacher": ROLES["teacher"]}


def _history(ctrl: PBTController, rewards: dict[str, list[float]]) -> None:
    for step in range(max(len(v) for v in rewards.values())):
        ctrl.observe(
            step + 1, {m: RoundStat(step + 1, None, v[step]) for m, v in rewards.items() if step < len(v)}
        )


def test_builtin_fitness_values_and_windows() -> None:
    hist = [RoundStat(1, 1.0, 0.5), RoundStat(2, None, None), RoundStat(3, 0.5, -1.0), RoundStat(4, 0.0, 1.0)]
    assert get_fitness("mu_minus_3sigma")((25.0, 2.0), hist) == 19.0
    assert get_fitness("mu")((25.0, 2.0), hist) == 25.0
    # (1 + 0.5 + 0) / 3, the round without a pairing left out
    assert get_fitness("win_rate")((25.0, 2.0), hist) == pytest.approx(0.5)
    assert get_fitness("win_rate")((25.0, 2.0), hist, window=2) == 0.25  # the last two rounds: 0.5 and 0
    assert get_fitness("mean_reward")((25.0, 2.0), hist, window=2) == 0.0  # (-1 + 1) / 2
    assert get_fitness("mean_reward")((25.0, 2.0), [], prior=-0.25) == -0.25
    with pytest.raises(ValueError, match="window=0 must be in 1..64"):
        get_fitness("win_rate")((25.0, 2.0), hist, window=0)


def test_round_stats_count_wins_draws_and_mean_rewards() -> None:
    matches = [
        MatchResult("t0", "s0", 0.5, 1.0, 2, 4, 4, "student"),
        MatchResult("t1", "s0", 0.5, 0.5, 2, 4, 2, "draw"),
    ]
    stats = round_stats(
        7,
        matches,
        {"t0": (1.0, 0.0), "s0": (0.5,), "t1": ()},
        {"T0": ["t0"], "S0": ["s0"], "T1": ["t1"], "X": ["x"]},
    )
    assert stats == {
        "T0": RoundStat(7, 0.0, 0.5),
        "S0": RoundStat(7, 0.75, 0.5),
        "T1": RoundStat(7, 0.5, None),
        "X": RoundStat(7, None, None),
    }


def test_tournament_culls_only_members_a_fitter_one_beats_and_repeats_itself(tmp_path) -> None:
    cfg = PBTConfig(interval=1, selection="tournament", operators={"mutation": 1.0}, newborn_protection=False)
    a, b = PBTController(cfg), PBTController(cfg)
    recs = [
        {k: v for k, v in r.items() if k != "seconds"}
        for r in run(a, 1, FakePopulation(ROLES["teacher"]), roles=TEACHERS)[0]
    ]
    again = run(b, 1, FakePopulation(ROLES["teacher"]), roles=TEACHERS)[0]
    assert recs == [{k: v for k, v in r.items() if k != "seconds"} for r in again]  # the event's draws repeat
    for r in recs:
        assert r["selection"]["name"] == "tournament" and r["selection"]["why"].startswith(
            "lost a binary tournament"
        )
        assert (r["fitness"]["parents"][0], r["parents"][0]) > (r["fitness"]["culled"], r["culled"])
        assert r["fitness"]["name"] == "mu_minus_3sigma"
    assert len(recs) == 1  # at most n = round(0.25 * 4) = 1; at step 1 t2 (the least fit) lost its tournament
    plans = {tuple(a.plan("teacher", ROLES["teacher"], RATINGS, step)[0]) for step in range(1, 40)}
    assert ("t1",) not in plans  # the fittest never loses a tournament
    assert len(plans) > 1  # the opponents are drawn: different events cull differently


def test_elites_are_never_culled() -> None:
    ctrl = PBTController(
        PBTConfig(
            interval=1, selection="tournament", selection_kwargs={"elites": 3}, newborn_protection=False
        )
    )
    culled = {m for step in range(1, 60) for m in ctrl.plan("teacher", ROLES["teacher"], RATINGS, step)[0]}
    assert culled == {"t2"}  # t1, t3, t0 are the three fittest


def test_ttest_needs_a_significant_difference() -> None:
    cfg = PBTConfig(interval=1, selection="ttest", selection_kwargs={"window": 4}, newborn_protection=False)
    ctrl = PBTController(cfg)
    same = [0.1, -0.1, 0.2, 0.0]
    _history(ctrl, {m: same for m in ROLES["teacher"]})
    assert all(ctrl.plan("teacher", ROLES["teacher"], RATINGS, s)[0] == [] for s in range(1, 20))
    ctrl = PBTController(cfg)
    _history(ctrl, {"t0": same, "t1": same, "t2": [-0.9, -1.0, -0.8, -0.95], "t3": [0.9, 1.0, 0.95, 0.85]})
    culled = {m for s in range(1, 30) for m in ctrl.plan("teacher", ROLES["teacher"], RATINGS, s)[0]}
    assert "t3" not in culled and "t2" in culled
    chosen, _ = ctrl.select(
        next(s for s in range(1, 30) if ctrl.plan("teacher", ROLES["teacher"], RATINGS, s)[0]),
        "teacher",
        ROLES["teacher"],
        RATINGS,
    )
    assert all("Welch's t-test" in chosen.why[m] for m in chosen.culled)


def test_a_plugin_rule_and_fitness_drive_the_event_and_are_recorded(tmp_path) -> None:
    @register_fitness("neg_sigma_test")
    def neg_sigma(rating, history):
        """minus sigma"""
        return -rating[1]

    @register_selection("cull_first_test", defaults={"who": "t0"})
    def cull_first(ctx, who):
        """cull who, parent the fittest"""
        return SelectionPlan([who], [ctx.ranked(descending=True)[0]], why={who: f"named {who}"})

    try:
        ctrl = PBTController(
            PBTConfig(
                interval=1,
                fitness="neg_sigma_test",
                selection="cull_first_test",
                selection_kwargs={"who": "t3"},
                operators={"mutation": 1.0},
            ),
            tmp_path / "lineage.jsonl",
        )
        recs, reset = run(ctrl, 1, FakePopulation(ROLES["teacher"]), roles=TEACHERS)
        line = json.loads((tmp_path / "lineage.jsonl").read_text())
        assert reset == ["t3"] and recs[0]["parents"] == ["t0"]  # sigma 1 for all: ties by name
        assert line["selection"] == {"name": "cull_first_test", "params": {"who": "t3"}, "why": "named t3"}
        assert line["fitness"]["name"] == "neg_sigma_test" and line["fitness"]["culled"] == -1.0

        @register_selection("broken_test")
        def broken(ctx):
            """culls a stranger"""
            return SelectionPlan(["nobody"], ["t0"])

        with pytest.raises(ValueError, match="inconsistent plan"):
            run(
                PBTController(PBTConfig(interval=1, selection="broken_test")),
                1,
                FakePopulation(ROLES["teacher"]),
                roles=TEACHERS,
            )
    finally:
        for name in ("cull_first_test", "broken_test"):
            try:
                unregister_selection(name)
            except KeyError:
                pass
        unregister_fitness("neg_sigma_test")


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        ({"selection": "nope"}, "selection", "unknown selection rule 'nope'; known: "),
        ({"fitness": "nope"}, "fitness", "unknown fitness 'nope'; known: "),
        ({"selection_kwargs": {"alpha": 0.1}}, "selection_kwargs", "got unknown parameter(s) ['alpha']"),
        ({"fitness": "win_rate", "fitness_kwargs": {"window": "5"}}, "fitness_kwargs", "is not a valid int"),
        ({"lr_explore": "perturb", "lr_factors": ()}, "lr_factors", "needs at least one factor"),
        ({"lr_explore": "resample", "lr_range": (2.0, 1.0)}, "lr_range", "low > high"),
    ],
)
def test_bad_names_and_kwargs_name_the_field(settings: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        PBTConfig(**settings).validate()
    assert exc.value.field == field and message in exc.value.reason


@pytest.mark.parametrize("mode", ["perturb", "resample"])
def test_lr_exploration_draws_a_recorded_scale_that_survives_a_checkpoint(tmp_path, mode: str) -> None:
    cfg = PBTConfig(interval=1, lr_explore=mode, operators={"mutation": 1.0})
    ctrl = PBTController(cfg, tmp_path / "lineage.jsonl", base_lr={"teacher": 1e-4, "student": 2e-4})
    recs, _ = run(ctrl, 1, FakePopulation([m for ms in ROLES.values() for m in ms]))
    assert recs
    for r in recs:
        e = r["explore"]
        assert e["mode"] == mode and e["parent_lr_scale"] == 1.0
        if mode == "perturb":
            assert e["lr_scale"] in (0.8, 1.2)
        else:
            assert 0.5 <= e["lr_scale"] <= 2.0
        assert e["lr"] == pytest.approx({"teacher": 1e-4, "student": 2e-4}[r["role"]] * e["lr_scale"])
        assert ctrl.lr_scale[r["culled"]] == e["lr_scale"]
    restored = PBTController(cfg)
    shared = restored.lr_scale  # the trainer holds this dict: restored in place
    restored.load_state_dict(json.loads(json.dumps(ctrl.state_dict())))
    assert restored.lr_scale is shared and shared == ctrl.lr_scale
    off = PBTController(PBTConfig(interval=1, operators={"mutation": 1.0}))
    assert all(
        r["explore"] is None for r in run(off, 1, FakePopulation([m for ms in ROLES.values() for m in ms]))[0]
    )
    assert off.lr_scale == {}


def test_recorded_rounds_are_checkpointed_capped_and_dropped_with_the_culled_slot() -> None:
    ctrl = PBTController(PBTConfig(interval=1, operators={"mutation": 1.0}, newborn_protection=False))
    for step in range(1, 71):
        ctrl.observe(step, {m: RoundStat(step, 0.5, float(step)) for m in ROLES["teacher"]})
    assert [h.step for h in ctrl.history["t0"]] == list(range(7, 71))  # the last 64
    state = json.loads(json.dumps(ctrl.state_dict()))
    assert state["version"] == 2
    other = PBTController(PBTConfig(interval=1))
    other.load_state_dict(state)
    assert other.history == ctrl.history
    old = {k: v for k, v in state.items() if k not in ("history", "lr_scale")} | {"version": 1}
    other.load_state_dict(old)  # a checkpoint written before rounds were recorded
    assert other.history == {} and other.lr_scale == {}
    recs, _ = run(ctrl, 1, FakePopulation(ROLES["teacher"]), roles=TEACHERS)
    assert recs and all(r["culled"] not in ctrl.history for r in recs)


def test_welch_p_is_scipys_without_scipy() -> None:
    """The t-test rule's p-value equals scipy's Welch test (scipy comes with the test extra's rliable; the rule
    itself does not need it)."""
    import random

    from evolution.selection import welch_p

    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.gauss(0.0, 1.0) for _ in range(rng.randint(2, 10))]
        b = [rng.gauss(rng.uniform(-2, 2), rng.uniform(0.1, 3)) for _ in range(rng.randint(2, 10))]
        assert welch_p(a, b) == pytest.approx(float(stats.ttest_ind(a, b, equal_var=False).pvalue), abs=1e-12)
    assert welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0 and welch_p([1.0, 1.0], [2.0, 2.0]) == 0.0
