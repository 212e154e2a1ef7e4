"""One builder for a run's parts (``selfplay.parts``, ``selfplay.members``): the local loop's set-up goes through
it, every process that holds members builds them with the same calls (so a Ray shard's members start bitwise where the local run's do),
and an option added to the builder reaches a run without any other edit (the Ray side: tests/ray/test_backend.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from agents.trainer import TrainerConfig
from populora_env.config import EnvConfig
from selfplay.config import TrainConfig
from selfplay.members import build_members
from selfplay.parts import build_parts
from tests.selfplay.conftest import REPO, TINY, populora

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PLUGIN = str(REPO / "tests" / "selfplay" / "builder_plugin.py")
CFG = TrainConfig(model="tiny-random", rank=4, alpha=8, threads=1, seed=5,
                  env=EnvConfig(num_teachers=2, num_students=2, sandbox_workers=1),
                  trainer=TrainerConfig(lr=1e-3))


def test_build_parts_gives_the_local_run_every_part(tmp_path: Path) -> None:
    parts = build_parts(CFG, tmp_path, None, tmp_path / "lineage.jsonl")
    try:
        assert parts.mapping.members == ["teacher_0", "teacher_1", "student_0", "student_1"]
        assert parts.generator.population is parts.population is parts.trainer.population
        assert parts.backend is None and parts.tokenizer is not None
        assert parts.pbt is not None and parts.pbt.lineage_path == tmp_path / "lineage.jsonl"
        assert parts.env.config == CFG.env
        no_evolution = build_parts(dataclasses.replace(CFG, evolution=False), tmp_path, None, tmp_path / "x")
        assert no_evolution.pbt is None
        no_evolution.env.close()
    finally:
        parts.env.close()


def test_a_members_parts_are_the_same_in_every_process() -> None:
    """What a trainer shard and an engine build for a member (each in its own process, after the same
    ``prepare_process``) is bitwise what the local run builds for it: the same adapter from the same calls."""
    whole = build_members(CFG, ["teacher_0", "student_0", "student_1"], generator=True, trainer=True)
    shard = build_members(CFG, ["student_0"], trainer=True)
    engine = build_members(CFG, ["student_0", "student_1"], generator=True)
    assert shard.generator is None and shard.trainer is not None
    assert engine.trainer is None and engine.generator is not None
    want = whole.population.state("student_0")
    for got in (shard.population.state("student_0"), engine.population.state("student_0")):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert any(v.abs().sum() > 0 for v in want.values())  # a real, initialised adapter


def test_an_option_added_to_the_builder_reaches_a_local_run(tmp_path: Path) -> None:
    """The plugin adds an option to ``selfplay.members.build_members`` and edits nothing else; the local run's generator and
    trainer get it (one build, in the run's own process, for every member)."""
    run = tmp_path / "run"
    p = populora("train", *TINY, "--steps", "1", "--generation.batch-size", "4", "--plugins", PLUGIN,
                 "--run-dir", str(run), timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    lines = [json.loads(x) for x in (run / "builder_option.jsonl").read_text().splitlines()]
    option = {"seed": 0, "batch_size": 4}
    assert lines == [{"pid": lines[0]["pid"], "members": ["teacher_0", "teacher_1", "student_0", "student_1"],
                      "parts": {"generator": option, "trainer": option}}]
