"""The PBT controller against the real ``agents.population.LoRAPopulation`` on a tiny Llama (integration)."""

from __future__ import annotations

import json

import pytest
import torch

from agents.population import LoRAPopulation, randomize_member
from evolution.operators import get_operator
from evolution.pbt import PBTConfig, PBTController

from .helpers import tiny_llama


def test_replacement_step_on_a_lora_population(tmp_path):
    base = tiny_llama()
    names = ["t0", "t1", "t2", "t3", "s0", "s1"]
    pop = LoRAPopulation(base, names, rank=4, alpha=8, seed=0)
    for n in names:
        randomize_member(pop, n, std=0.05)
    before = {n: pop.state(n) for n in names}
    for n in ("t0", "t3"):
        pop.optimizer(n)  # create optimizers: the child's must be reset
    ratings = {
        "t0": (20.0, 1.0),
        "t1": (30.0, 1.0),
        "t2": (28.0, 1.0),
        "t3": (26.0, 1.0),
        "s0": (25.0, 2.0),
        "s1": (24.0, 1.0),
    }
    reset = []
    ctrl = PBTController(PBTConfig(interval=2, operators={"svd_crossover": 1.0}), tmp_path / "lineage.jsonl")
    assert (
        ctrl.maybe_evolve(1, {"teacher": names[:4], "student": names[4:]}, pop, ratings, reset.append) == []
    )
    # two students: the pool of one survivor cannot feed a crossover, so that role is skipped with a warning
    with pytest.warns(UserWarning, match="role 'student': no operator with arity <= 1"):
        recs = ctrl.maybe_evolve(2, {"teacher": names[:4], "student": names[4:]}, pop, ratings, reset.append)
    assert len(recs) == 1
    rec = recs[0]
    assert (
        rec["role"] == "teacher" and rec["culled"] == "t0" and rec["parents"] == ["t2", "t1"]
    )  # pool: t1, t2
    assert reset == ["t0"]
    expect = get_operator("svd_crossover")(
        before["t2"], before["t1"], generator=torch.Generator().manual_seed(rec["seed"])
    )
    after = pop.state("t0")
    assert all(torch.equal(after[k], expect[k]) for k in expect)
    assert not pop.has_optimizer("t0") and pop.has_optimizer("t3")
    for n in ("t1", "t2", "t3"):
        assert all(torch.equal(pop.state(n)[k], before[n][k]) for k in before[n])
    lines = [json.loads(x) for x in (tmp_path / "lineage.jsonl").read_text().splitlines()]
    assert [x["culled"] for x in lines] == [r["culled"] for r in recs]
    # the child serves: a forward pass with it active works and differs from its parents'
    ids = torch.arange(8).unsqueeze(0)
    with torch.no_grad():
        pop.activate("t0")
        out_child = pop.model(ids).logits
        pop.activate("t1")
        out_parent = pop.model(ids).logits
    assert torch.isfinite(out_child).all() and not torch.allclose(out_child, out_parent)
