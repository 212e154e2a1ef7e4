"""PBT replacement step with a fake population and ratings: who is culled, who parents, protection, lineage."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from evolution.pbt import PBTConfig, PBTController, event_seed

from .helpers import make_state


class FakePopulation:
    def __init__(self, names):
        self.states = {n: make_state(i + 1, layers=1) for i, n in enumerate(names)}
        self.calls: list[tuple[str, str]] = []

    def state(self, name):
        self.calls.append(("state", name))
        return {k: v.clone() for k, v in self.states[name].items()}

    def load_state(self, name, state):
        self.calls.append(("load_state", name))
        assert state.keys() == self.states[name].keys()
        self.states[name] = {k: v.clone() for k, v in state.items()}

    def reset_optimizer(self, name):
        self.calls.append(("reset_optimizer", name))


ROLES = {"teacher": ["t0", "t1", "t2", "t3"], "student": ["s0", "s1", "s2", "s3"]}
# μ − 3σ: t0 = 25 − 3·1 = 22, t1 = 30 − 3 = 27, t2 = 20 − 3 = 17 (worst), t3 = 28 − 3 = 25
RATINGS = {
    "t0": (25.0, 1.0),
    "t1": (30.0, 1.0),
    "t2": (20.0, 1.0),
    "t3": (28.0, 1.0),
    "s0": (40.0, 5.0),
    "s1": (30.0, 1.0),
    "s2": (26.0, 1.0),
    "s3": (50.0, 10.0),
}  # students: s0 25, s1 27, s2 23 (worst), s3 20 (worst!)


def run(ctrl, step, pop, ratings=RATINGS, roles=ROLES):
    reset = []
    recs = ctrl.maybe_evolve(step, roles, pop, ratings, reset.append)
    return recs, reset


def test_only_fires_every_interval(tmp_path):
    ctrl = PBTController(PBTConfig(interval=10), tmp_path / "lineage.jsonl")
    pop = FakePopulation([m for ms in ROLES.values() for m in ms])
    for step in (0, 1, 9, 11):
        assert run(ctrl, step, pop) == ([], [])
    assert pop.calls == []
    assert not (tmp_path / "lineage.jsonl").exists()
    recs, _ = run(ctrl, 10, pop)
    assert len(recs) == 2
    assert run(ctrl, 10, pop) == ([], [])  # not twice at the same step (resume)


def test_lineage_is_never_appended_through_a_symbolic_link(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("untouched\n")
    (tmp_path / "lineage.jsonl").symlink_to(target)
    ctrl = PBTController(PBTConfig(interval=5), tmp_path / "lineage.jsonl")
    pop = FakePopulation([m for ms in ROLES.values() for m in ms])
    with pytest.raises(OSError, match="symbolic link"):
        run(ctrl, 5, pop)
    assert target.read_text() == "untouched\n"


def test_culls_bottom_by_mu_minus_3sigma_and_parents_from_top(tmp_path):
    path = tmp_path / "runs" / "x" / "lineage.jsonl"
    ctrl = PBTController(PBTConfig(interval=5, operators={"mutation": 1.0}), path)
    pop = FakePopulation([m for ms in ROLES.values() for m in ms])
    recs, reset = run(ctrl, 5, pop)
    by_role = {r["role"]: r for r in recs}
    assert by_role["teacher"]["culled"] == "t2"
    assert by_role["student"]["culled"] == "s3"  # high μ but high σ: μ − 3σ = 20
    assert by_role["teacher"]["parents"][0] in ("t1", "t3")  # pool = top max(2, ⌈0.25·4⌉) = 2
    assert by_role["student"]["parents"][0] in ("s1", "s0")
    assert sorted(reset) == ["s3", "t2"]
    for r in recs:
        assert r["family"] == "mutation" and len(r["parents"]) == 1
        assert r["seed"] == event_seed(0, 5, r["role"], r["culled"])
        assert r["culled_rating"]["score"] == pytest.approx(
            RATINGS[r["culled"]][0] - 3 * RATINGS[r["culled"]][1]
        )
        assert r["parent_ratings"][0]["mu"] == RATINGS[r["parents"][0]][0]
        assert r["seconds"] >= 0 and isinstance(r["params"], dict)
        assert ("load_state", r["culled"]) in pop.calls and ("reset_optimizer", r["culled"]) in pop.calls
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == recs
    # culled members were never read as parents; parents were never written
    assert not {n for c, n in pop.calls if c == "state"} & {"t2", "s3"}
    assert {n for c, n in pop.calls if c == "load_state"} == {"t2", "s3"}


def test_child_is_written_into_the_slot_and_crossover_parent_order(tmp_path):
    ctrl = PBTController(PBTConfig(interval=1, operators={"linear_0_5": 1.0}), None)
    names = ["t0", "t1", "t2", "t3"]
    pop = FakePopulation(names)
    parents_before = {n: pop.state(n) for n in names}
    roles = {"teacher": names}
    ratings = {"t0": (10.0, 1.0), "t1": (20.0, 1.0), "t2": (30.0, 1.0), "t3": (0.0, 1.0)}
    (rec,), _ = run(ctrl, 1, pop, ratings, roles)
    assert rec["culled"] == "t3" and rec["operator"] == "linear_0_5"
    assert rec["parents"] == ["t1", "t2"]  # pool = top 2, ordered so that parent 2 is the fitter
    from evolution.operators import get_operator

    expect = get_operator("linear_0_5")(
        parents_before["t1"], parents_before["t2"], generator=torch.Generator().manual_seed(rec["seed"])
    )
    assert all(torch.allclose(pop.states["t3"][k], expect[k]) for k in expect)


def test_copy_parent_control_is_a_bitwise_copy_of_a_pool_member():
    ctrl = PBTController(PBTConfig(interval=1, operators={"copy_parent": 1.0}))
    pop = FakePopulation(ROLES["teacher"])
    before = {n: pop.state(n) for n in ROLES["teacher"]}
    (rec,), _ = run(ctrl, 1, pop, roles={"teacher": ROLES["teacher"]})
    src = before[rec["parents"][0]]
    assert all(torch.equal(pop.states[rec["culled"]][k], src[k]) for k in src)


def test_newborn_protection_prevents_the_revolving_slot():
    cfg = PBTConfig(interval=1, operators={"mutation": 1.0})
    ctrl = PBTController(cfg)
    names = ["a", "b", "c", "d"]
    pop = FakePopulation(names)
    roles = {"r": names}
    ratings = {"a": (30.0, 1.0), "b": (29.0, 1.0), "c": (28.0, 1.0), "d": (27.0, 1.0)}
    (r1,), _ = run(ctrl, 1, pop, ratings, roles)
    assert r1["culled"] == "d" and r1["protected_skipped"] == []
    ratings["d"] = (25.0, 25 / 3)  # the child got a fresh rating: μ − 3σ = 0, the lowest
    (r2,), _ = run(ctrl, 2, pop, ratings, roles)
    assert r2["culled"] == "c" and r2["protected_skipped"] == ["d"]
    ratings["c"] = (25.0, 25 / 3)
    (r3,), _ = run(ctrl, 3, pop, ratings, roles)
    assert r3["culled"] == "d"  # protection lasts one event only; c is protected now
    assert r3["protected_skipped"] == ["c"]  # tie on score broken by name: c ranks lowest but is protected
    # without protection the same slot is culled every time
    ctrl2 = PBTController(PBTConfig(interval=1, operators={"mutation": 1.0}, newborn_protection=False))
    ratings2 = {"a": (30.0, 1.0), "b": (29.0, 1.0), "c": (28.0, 1.0), "d": (0.0, 1.0)}
    assert [run(ctrl2, s, pop, ratings2, roles)[0][0]["culled"] for s in (1, 2, 3)] == ["d", "d", "d"]


def test_protected_members_are_never_replaced_by_the_top_half():
    ctrl = PBTController(PBTConfig(interval=1, operators={"mutation": 1.0}))
    pop = FakePopulation(["a", "b"])
    roles = {"r": ["a", "b"]}
    ratings = {"a": (30.0, 1.0), "b": (20.0, 1.0)}
    (r1,), _ = run(ctrl, 1, pop, ratings, roles)
    assert r1["culled"] == "b" and r1["parents"] == ["a"]  # N = 2: pool of one, mutation only
    recs, _ = run(ctrl, 2, pop, ratings, roles)  # b is protected and the only bottom-half member
    assert recs == []
    (r3,), _ = run(ctrl, 3, pop, ratings, roles)
    assert r3["culled"] == "b"


def test_cull_counts():
    ctrl = PBTController(PBTConfig(cull_fraction=0.25))
    ratings = {f"m{i}": (float(i), 1.0) for i in range(12)}
    for n, expected in [(1, 0), (2, 1), (3, 1), (4, 1), (6, 2), (8, 2), (10, 3), (12, 3)]:
        members = [f"m{i}" for i in range(n)]
        culled, pool, _ = ctrl.plan("r", members, ratings)
        assert len(culled) == expected, n
        assert culled == members[:expected]  # lowest ratings
        if expected:
            assert (
                pool == sorted(set(members) - set(culled), key=lambda m: -ratings[m][0])[: max(2, -(-n // 4))]
            )
    half = PBTController(PBTConfig(cull_fraction=0.5))
    assert len(half.plan("r", ["m0", "m1", "m2"], ratings)[0]) == 1  # capped at ⌊N/2⌋


def test_crossover_needs_two_parents():
    ctrl = PBTController(PBTConfig(interval=1, operators={"dare": 1.0}))
    pop = FakePopulation(["a", "b"])
    with pytest.warns(UserWarning, match="no operator with arity"):
        recs, reset = run(ctrl, 1, pop, {"a": (1.0, 1.0), "b": (0.0, 1.0)}, {"r": ["a", "b"]})
    assert recs == [] and reset == []
    ctrl = PBTController(PBTConfig(interval=1))  # families: crossover impossible -> mutation
    for step in range(1, 6):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (rec,), _ = run(ctrl, step, pop, {"a": (1.0, 1.0), "b": (0.0, 1.0)}, {"r": ["a", "b"]})
        ctrl.protected.clear()
        assert rec["family"] == "mutation"


def test_operator_distribution_and_params():
    cfg = PBTConfig(
        interval=1, operators={"crossover": 0.5, "mutation": 0.5}, operator_params={"dare": {"p": 0.5}}
    )
    ctrl = PBTController(cfg)
    probs = {op.name: p for op, p in ctrl._candidates}
    assert probs == pytest.approx(
        {
            "svd_mutation": 0.125,
            "layer_mutation": 0.125,
            "component_mask": 0.125,
            "adaptive_noise": 0.125,
            "dare": 0.125,
            "layer_crossover": 0.125,
            "svd_crossover": 0.125,
            "extrapolate": 0.125,
        }
    )
    names = [f"m{i}" for i in range(8)]
    pop = FakePopulation(names)
    ratings = {n: (float(i), 1.0) for i, n in enumerate(names)}
    seen = {}
    for step in range(1, 41):
        ctrl.protected.clear()
        for rec in run(ctrl, step, pop, ratings, {"r": names})[0]:
            seen[rec["operator"]] = rec
            assert set(rec["parents"]) <= {"m7", "m6"}  # pool = top max(2, ⌈0.25·8⌉) = 2
            assert len(set(rec["parents"])) == len(rec["parents"])
    assert set(seen) == set(probs)  # 80 draws over 8 operators
    assert seen["dare"]["params"] == {"p": 0.5, "space": "delta"}
    assert seen["dare"]["parents"] == ["m6", "m7"]


def test_determinism_and_checkpoint_roundtrip(tmp_path):
    cfg = PBTConfig(interval=2, seed=7)
    names = [f"m{i}" for i in range(6)]
    ratings = {n: (float(i), 1.0) for i, n in enumerate(names)}

    def strip(recs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in recs]

    a, b = PBTController(cfg), PBTController(cfg)
    pa, pb = FakePopulation(names), FakePopulation(names)
    ra = run(a, 2, pa, ratings, {"r": names})[0]
    rb = run(b, 2, pb, ratings, {"r": names})[0]
    assert strip(ra) == strip(rb)
    assert all(torch.equal(pa.states[n][k], pb.states[n][k]) for n in names for k in pa.states[n])
    # checkpoint: JSON round trip, then the next event matches the uninterrupted controller
    state = json.loads(json.dumps(a.state_dict()))
    c = PBTController(cfg)
    c.load_state_dict(state)
    assert c.protected == a.protected and c.last_step == 2 and c.n_events == 1 and c.n_replacements == len(ra)
    pc = FakePopulation(names)
    pc.states = {n: {k: v.clone() for k, v in s.items()} for n, s in pa.states.items()}
    ratings[ra[0]["culled"]] = (-5.0, 8.0)  # the newborn would lose again
    assert strip(run(a, 4, pa, ratings, {"r": names})[0]) == strip(run(c, 4, pc, ratings, {"r": names})[0])
    assert c.state_dict() == a.state_dict()
    other = PBTController(PBTConfig(interval=2, seed=8))
    assert strip(run(other, 2, FakePopulation(names), ratings, {"r": names})[0]) != strip(ra)


def test_config_validation():
    with pytest.raises(ValueError, match="mixes families and operator names"):
        PBTController(PBTConfig(operators={"mutation": 0.5, "dare": 0.5}))
    with pytest.raises(ValueError, match="unknown operator 'dare2' .*operators: "):
        PBTController(PBTConfig(operators={"dare2": 1.0}))
    with pytest.raises(ValueError, match="unknown parameter"):
        PBTController(PBTConfig(operator_params={"dare": {"q": 1}}))
    with pytest.raises(ValueError, match="cull_fraction"):
        PBTController(PBTConfig(cull_fraction=0.6))
    with pytest.raises(ValueError, match="interval"):
        PBTController(PBTConfig(interval=0))
    with pytest.raises(ValueError, match="sum to 0"):
        PBTController(PBTConfig(operators={"mutation": 0.0}))
    ctrl = PBTController(PBTConfig(interval=1))
    with pytest.raises(ValueError, match="is in roles"):
        ctrl.maybe_evolve(1, {"a": ["x", "y"], "b": ["x", "z"]}, FakePopulation(["x", "y", "z"]), {}, print)
    with pytest.raises(KeyError, match="no rating"):
        ctrl.maybe_evolve(1, {"r": ["a", "b"]}, FakePopulation(["a", "b"]), {"a": (1.0, 1.0)}, lambda m: None)


def test_single_member_roles_do_not_evolve():
    ctrl = PBTController(PBTConfig(interval=1))
    pop = FakePopulation(["a"])
    assert run(ctrl, 1, pop, {"a": (1.0, 1.0)}, {"r": ["a"]}) == ([], [])


def test_no_event_closer_to_the_end_than_min_final_age(tmp_path):
    pop = FakePopulation([m for ms in ROLES.values() for m in ms])
    ctrl = PBTController(PBTConfig(interval=5), tmp_path / "lineage.jsonl", final_step=10)
    assert ctrl.min_final_age == 5
    assert [s for s in range(1, 11) if ctrl.due(s)] == [5]  # not at the last step: its children would be untrained
    assert len(run(ctrl, 5, pop)[0]) == 2 and run(ctrl, 10, pop) == ([], [])
    late = PBTController(PBTConfig(interval=3, min_final_age=5), None, final_step=10)
    assert [s for s in range(1, 11) if late.due(s)] == [3]  # step 6 would leave a child 4 steps of training
    every = PBTController(PBTConfig(interval=5, min_final_age=0), None, final_step=10)
    assert [s for s in range(1, 11) if every.due(s)] == [5, 10]
    assert [s for s in range(1, 11) if PBTController(PBTConfig(interval=5)).due(s)] == [5, 10]  # no final step
    with pytest.raises(ValueError, match="min_final_age: must be >= 0, got -1"):
        PBTController(PBTConfig(min_final_age=-1))
