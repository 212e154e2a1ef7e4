"""``populora evolve`` on saved PEFT adapters: a child that PEFT loads, and clear errors on mismatches."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.selfplay.conftest import populora


def _save_members(tmp_path: Path, rank: int, names: tuple[str, ...]) -> list[Path]:
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    base, _tok = load_base("tiny-random")
    pop = LoRAPopulation(base, list(names), rank=rank, alpha=2 * rank, seed=0)
    out = []
    for i, n in enumerate(names):
        randomize_member(pop, n, std=0.05, seed=i)
        out.append(pop.save(n, tmp_path / f"r{rank}_{n}"))
    return out


def test_evolve_ties_writes_a_loadable_child(tmp_path: Path) -> None:
    a, b = _save_members(tmp_path, 4, ("p1", "p2"))
    child = tmp_path / "child"
    p = populora("evolve", "--op", "ties", "--parents", str(a), str(b), "--out", str(child),
                 "--param", "density=0.5", "--seed", "3", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    sa, sc = load_file(str(a / "adapter_model.safetensors")), load_file(str(child / "adapter_model.safetensors"))
    assert sa.keys() == sc.keys()
    assert all(sa[k].shape == sc[k].shape and sa[k].dtype == sc[k].dtype for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # a real child, not a copy

    from peft import PeftModel

    from agents.models import load_base

    base, _ = load_base("tiny-random")
    PeftModel.from_pretrained(base, str(child))  # loads as an ordinary PEFT adapter

    record = json.loads((child / "provenance.json").read_text())  # how it was made, next to its PEFT files
    assert record["operator"] == "ties" and record["family"] == "crossover" and record["seed"] == 3
    assert [p["path"] for p in record["parents"]] == [str(a), str(b)]
    for parent, entry in zip((a, b), record["parents"], strict=True):
        assert entry["sha256"]["adapter_model.safetensors"] == hashlib.sha256(
            (parent / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert record["params"] == {"density": 0.5} and record["resolved_params"]["density"] == 0.5
    assert record["command"].startswith(f"populora evolve --op ties --parents {a} {b} --out OUT --param "
                                        "density=0.5 --seed 3")

    # the child is scored as a bare adapter directory (no run around it), on the base its config names
    e = populora("eval", "--adapters", str(child), "--benchmarks", "humaneval,gsm8k", "--limit", "1",
                 "--no-progress", timeout=600)
    assert e.returncode == 0, e.stderr[-3000:]
    results = json.loads((child / "eval" / "results.json").read_text())
    assert results["complete"] and results["run"] is None and results["adapters"] == {"child": str(child)}
    assert set(results["benchmarks"]) == {"humaneval", "gsm8k"}
    assert "child" in results["benchmarks"]["humaneval"]["members"], results["benchmarks"]["humaneval"]


def test_evolve_rank_mismatch_exits_2_naming_it(tmp_path: Path) -> None:
    (a,) = _save_members(tmp_path, 4, ("p1",))
    (b,) = _save_members(tmp_path, 8, ("p2",))
    p = populora("evolve", "--op", "linear_0_5", "--parents", str(a), str(b), "--out", str(tmp_path / "c"),
                 timeout=300)
    assert p.returncode == 2
    assert "rank" in p.stderr or " r " in p.stderr or "r=" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "c").exists()


def test_evolve_unknown_operator_exits_2(tmp_path: Path) -> None:
    (a,) = _save_members(tmp_path, 4, ("p1",))
    p = populora("evolve", "--op", "no_such_op", "--parents", str(a), "--out", str(tmp_path / "c"), timeout=300)
    assert p.returncode == 2
    assert "no_such_op" in p.stderr
