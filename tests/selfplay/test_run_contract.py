"""PBT runs inside the loop of a real ``tiny-random`` run, as ``evolution/pbt.py`` documents it.

The CLI run ``tiny_run`` (conftest: 4 steps, PBT every 2 steps without newborn protection, two members per role)
must have replaced exactly one teacher and one student at steps 2 and 4. Its lineage lines carry the documented
fields with values that can be recomputed (the event seed, the culled member = the lower-rated one, its child =
the recorded operator applied to the recorded parents with the recorded seed); its checkpoint after the step-4
event holds the children, a fresh rating and no optimizer state for the culled members. An in-process loop with
a generator that, like vLLM, generates from its own copies of the adapters shows that culled members' copies are
refreshed before their next generation.

The TensorBoard tags of a run (engineer E's logging-contract test) and the baseline's compute matching (F2's) are
tested elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evolution.operators import get_operator
from evolution.pbt import event_seed
from selfplay.config import TrainConfig, from_dict
from tests.selfplay.conftest import REF_ARGS

LINEAGE_FIELDS = {"step", "role", "culled", "culled_rating", "parents", "parent_ratings", "operator", "family",
                  "params", "seed", "seconds", "protected_skipped", "fitness", "selection", "explore"}


@pytest.fixture(scope="module")
def run(tiny_run: Path) -> dict:
    cfg_json = json.loads((tiny_run / "config.json").read_text())
    return {
        "dir": tiny_run,
        "cfg": from_dict(TrainConfig, cfg_json["config"]),
        "roles": cfg_json["mapping"]["agent_roles"],
        "lineage": [json.loads(ln) for ln in (tiny_run / "lineage.jsonl").read_text().splitlines()],
    }


def _score(r: dict) -> float:
    return r["mu"] - 3 * r["sigma"]


def test_lineage_has_one_line_per_replacement_with_the_documented_fields(run: dict) -> None:
    lineage, roles, cfg = run["lineage"], run["roles"], run["cfg"]
    assert cfg.pbt.interval == 2 and not cfg.pbt.newborn_protection and cfg.steps == 4
    # every 2 steps, per role (sorted), exactly one of the two members is replaced
    assert [(r["step"], r["role"]) for r in lineage] == [(2, "student"), (2, "teacher"), (4, "student"),
                                                         (4, "teacher")]
    for r in lineage:
        assert set(r) == LINEAGE_FIELDS, r
        members = sorted(m for m, role in roles.items() if role == r["role"])
        op = get_operator(r["operator"])
        assert r["family"] == op.family
        assert r["culled"] in members and len(r["parents"]) == op.arity
        assert all(p in members and p != r["culled"] for p in r["parents"])
        assert r["params"] == op.resolve_params(cfg.pbt.operator_params.get(op.name, {}))
        assert r["seed"] == event_seed(cfg.seed + cfg.pbt.seed, r["step"], r["role"], r["culled"])
        assert r["protected_skipped"] == []
        assert isinstance(r["seconds"], float) and r["seconds"] >= 0
        for rating in (r["culled_rating"], *r["parent_ratings"]):
            assert set(rating) == {"mu", "sigma", "score"}
            assert math.isclose(rating["score"], _score(rating), abs_tol=1e-12)
        # the culled member is the lower-rated one (μ - 3σ; ties by name)
        assert all((_score(r["culled_rating"]), r["culled"]) < (_score(p), name)
                   for p, name in zip(r["parent_ratings"], r["parents"], strict=True))
        # the default fitness (μ - 3σ) and rule (truncation) are named with the values they ranked; no exploration
        assert r["fitness"] == {"name": "mu_minus_3sigma", "params": {}, "culled": r["culled_rating"]["score"],
                                "parents": [p["score"] for p in r["parent_ratings"]]}
        assert r["selection"] == {"name": "truncation", "params": {"elites": 0}, "why": "bottom 1 of 2 by fitness"}
        assert r["explore"] is None


def test_culled_members_have_fresh_ratings_their_child_and_no_optimizer_state(run: dict) -> None:
    """Checkpoint step_4 is written right after the step-4 event."""
    d = run["dir"] / "checkpoints" / "step_4"
    env_state = json.loads((d / "env_state.json").read_text())
    ts = run["cfg"].env.trueskill
    default = [ts.mu, ts.sigma]
    assert env_state["ratings"]["config"]["mu"] == ts.mu and env_state["ratings"]["config"]["sigma"] == ts.sigma
    events = [r for r in run["lineage"] if r["step"] == 4]
    culled = {r["culled"] for r in events}
    for agent, rating in env_state["ratings"]["ratings"].items():
        if agent in culled:
            assert rating == default, agent
        else:
            assert rating != default, agent  # a played member's rating moved, so a reset is visible
    for r in events:
        assert [r["culled_rating"]["mu"], r["culled_rating"]["sigma"]] != default

    population = d / "population"
    weights = _checkpoint_weights(population)
    for r in events:
        # the child = the recorded operator on the recorded parents (their weights are unchanged by the event),
        # with a generator seeded from the recorded seed
        child = _child(r, weights)
        assert child.keys() == weights[r["culled"]].keys()
        for k in child:
            assert torch.equal(child[k], weights[r["culled"]][k]), (r["culled"], k)
        assert not (population / r["culled"] / "optimizer.pt").exists()  # reset_optimizer
        for p in r["parents"]:
            assert (population / p / "optimizer.pt").is_file()
    pbt = json.loads((d / "pbt_state.json").read_text())
    assert (pbt["n_events"], pbt["n_replacements"], pbt["last_step"]) == (2, 4, 4)


def _module_order_key():
    """Sort key putting PEFT adapter keys in the population's order (the model's module order), which is the
    order ``LoRAPopulation.state`` hands the PBT controller; safetensors files come back sorted by name."""
    from agents.models import load_base

    base, _ = load_base("tiny-random")
    position = {name: i for i, (name, _m) in enumerate(base.named_modules())}

    def key(k: str) -> tuple[int, str]:
        return position[k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]], k

    return key


def _checkpoint_weights(population: Path, order=None) -> dict[str, dict[str, torch.Tensor]]:
    order = order or _module_order_key()
    out = {}
    for m in sorted(population.iterdir()):
        if m.is_dir():
            w = load_file(str(m / "adapter_model.safetensors"))
            out[m.name] = {k: w[k] for k in sorted(w, key=order)}
    return out


def _child(r: dict, weights: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    op = get_operator(r["operator"])
    return op(*(weights[p] for p in r["parents"]), generator=torch.Generator().manual_seed(r["seed"]),
              **op.resolve_params(r["params"]))


def test_child_is_reproducible_from_the_saved_files(run: dict) -> None:
    """From the saved files (keys sorted by name, as ``populora evolve`` loads them) the recorded operator,
    parents and seed give the run's child: the operators draw per module in name order, not key order."""
    population = run["dir"] / "checkpoints" / "step_4" / "population"
    weights = _checkpoint_weights(population, order=lambda k: k)
    for r in (r for r in run["lineage"] if r["step"] == 4):
        child = _child(r, weights)
        assert all(torch.equal(child[k], weights[r["culled"]][k]) for k in child), r["culled"]


def test_pruned_to_keep_and_summary(run: dict) -> None:
    d = run["dir"]
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step_3", "step_4"]  # --keep-checkpoints 2
    summary = json.loads((d / "run_summary.json").read_text())
    assert summary["steps"] == 4
    assert [h["step"] for h in summary["history"]] == [1, 2, 3, 4]
    assert summary["members"] == ["teacher_0", "teacher_1", "student_0", "student_1"]


# --------------------------------------------------------------------------------- in-process: refresh


class CopyingGenerator:
    """Wraps the run's generator; like vLLM it generates from its own copy of each adapter, taken when the loop
    calls ``refresh``. Records every generation from a copy that differs from the population's live weights."""

    def __init__(self, inner, population) -> None:
        self.inner, self.population = inner, population
        self.copies = {n: population.state(n) for n in population.names}
        self.refreshes: list[list[str]] = []
        self.stale: list[str] = []

    def refresh(self, names=None) -> None:
        names = list(self.population.names if names is None else names)
        self.refreshes.append(sorted(names))
        for n in names:
            self.copies[n] = self.population.state(n)
        self.inner.refresh(names)

    def generate(self, requests):
        for name in sorted({r.adapter for r in requests}):
            live = self.population.state(name)
            if any(not torch.equal(live[k], self.copies[name][k]) for k in live):
                self.stale.append(name)
        return self.inner.generate(requests)


def test_culled_members_are_refreshed_in_the_generator_and_their_ratings_reset(tmp_path: Path) -> None:
    import tyro

    from selfplay.config import load_preset
    from selfplay.loop import SelfPlayLoop

    cfg = tyro.cli(TrainConfig, default=load_preset("cpu-smoke"), args=[a for a in REF_ARGS if a != "--no-progress"])
    cfg = dataclasses.replace(cfg, progress=False)
    cfg.validate()
    threads = torch.get_num_threads()
    loop = SelfPlayLoop(cfg, tmp_path)
    loop.setup()
    try:
        gen = loop.generator = CopyingGenerator(loop.generator, loop.population)
        records = []
        for _ in range(3):
            before = len(gen.refreshes)
            before_states = {n: loop.population.state(n) for n in loop.population.names}
            records.append(loop.train_step())
            calls = gen.refreshes[before:]
            rec = records[-1]
            updated = sorted(rec.member_metrics)
            assert updated == sorted(loop.population.names)  # every member had rollouts
            if rec.step == 2:
                culled = sorted(e["culled"] for e in rec.evolution)
                assert len(culled) == 2
                assert calls == [updated, culled]
                for name in culled:
                    # the evolution replaced the weights, and the generator's copy is the child
                    live = loop.population.state(name)
                    assert any(not torch.equal(live[k], before_states[name][k]) for k in live)
                    assert all(torch.equal(live[k], gen.copies[name][k]) for k in live)
                    # the env gave its agent a fresh rating; the round had moved it
                    ts = loop.env.ratings.config
                    assert (loop.env.ratings.mu(name), loop.env.ratings.sigma(name)) == (ts.mu, ts.sigma)
                    assert rec.outcome.ratings[name] != (ts.mu, ts.sigma)
            else:
                assert rec.evolution == [] and calls == [updated]
        assert gen.stale == []  # no generation (steps 1-3) used a stale copy: step 3 generated from the children
    finally:
        loop.env.close()
        torch.set_num_threads(threads)


@pytest.mark.parametrize("engine", ["generate", "loop"])
def test_generation_hf_engine_reaches_the_generator_and_a_step_runs(tmp_path: Path, engine: str) -> None:
    """``generation.hf_engine`` picks the HF backend's path for the run (``loop`` by default), and a step plays
    through either one."""
    import tyro

    from selfplay.config import load_preset
    from selfplay.loop import SelfPlayLoop

    args = [a for a in REF_ARGS if a != "--no-progress"] + ["--generation.hf-engine", engine]
    cfg = dataclasses.replace(tyro.cli(TrainConfig, default=load_preset("cpu-smoke"), args=args), progress=False)
    cfg.validate()
    assert TrainConfig().generation.hf_engine == "loop"
    threads = torch.get_num_threads()
    loop = SelfPlayLoop(cfg, tmp_path)
    loop.setup()
    try:
        assert loop.generator.engine == engine
        record = loop.train_step()
        assert sorted(record.member_metrics) == sorted(loop.population.names)
    finally:
        loop.env.close()
        torch.set_num_threads(threads)
