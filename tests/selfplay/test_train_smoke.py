"""End-to-end runs of ``populora train`` / ``populora baseline`` on the tiny random model (subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.selfplay.conftest import populora


def test_train_smoke_writes_everything(tiny_run: Path, tmp_path: Path) -> None:
    run = tiny_run  # conftest: populora train REF_ARGS (4 steps, a checkpoint after each, keep 2)
    assert list(run.glob("events.out.tfevents.*")), "no TensorBoard events"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_3", "step_4"]
    assert (run / "checkpoints" / "step_4" / "DONE").read_text() == "4"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"] == "population" and cfg["model"] == "tiny-random" and cfg["name"] == run.name
    assert cfg["config"]["steps"] == 4 and cfg["config"]["keep_checkpoints"] == 2
    members = sorted(d.name for d in (run / "adapters").iterdir())
    assert members == ["student_0", "student_1", "teacher_0", "teacher_1"]
    for m in members:
        assert (run / "adapters" / m / "adapter_config.json").is_file()
    assert (run / "report" / "summary.md").is_file()
    assert list((run / "report").glob("*.png"))
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["steps"] == 4
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp")]  # no temporary leftovers

    # the report command renders from the finished run into another folder
    out = tmp_path / "rep"
    p = populora("report", str(run), "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    md = (out / "summary.md").read_text()
    assert f"from 1 run(s): `{run.name}` ({run})" in md and "| last step | 4 |" in md


def test_baseline_smoke_one_adapter(arm_runs: dict[str, Path]) -> None:
    run = arm_runs["baseline"]  # conftest: populora baseline TINY (3 steps), exit 0; shared with the logging contract
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["arm"] == "baseline"
    assert cfg["config"]["env"]["reward_scheme"] == "azr"
    assert [d.name for d in (run / "adapters").iterdir()] == ["azr"]
