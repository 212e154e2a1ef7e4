"""No untrained children at the end (issue 22): a 4-step tiny-random run with pbt.interval 2 evolves at step 2
only (not at its last step, 4), so every member has trained at least 2 steps when the final checkpoint is written.
(It was a 10-step run with interval 5: the same rule at the same ratio, in 40 % of the steps; issue 45.)"""

from __future__ import annotations

import json
from pathlib import Path

from evolution.pbt import PBTConfig
from populora_env.config import EnvConfig
from selfplay.config import GenerationConfig, TrainConfig


def test_a_run_ends_with_no_member_younger_than_the_interval(tmp_path: Path) -> None:
    from selfplay.run import train

    run = tmp_path / "run"
    env = EnvConfig(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=1, sandbox_workers=1,
                    task_types=("deduction", "abduction"))
    cfg = TrainConfig(model="tiny-random", rank=4, alpha=8, steps=4, threads=1, progress=False, run_dir=run,
                      env=env, pbt=PBTConfig(interval=2),
                      generation=GenerationConfig(teacher_max_new_tokens=8, student_max_new_tokens=6,
                                                  temperature=1.0),
                      checkpoint_every=2, keep_checkpoints=1)
    cfg.validate()
    train(cfg)
    records = [json.loads(line) for line in (run / "lineage.jsonl").read_text().splitlines()]
    assert records and {r["step"] for r in records} == {2}  # it did evolve, and not at the last step (4)
    born = {r["culled"]: r["step"] for r in records}
    members = sorted(d.name for d in (run / "adapters").iterdir())
    ages = {m: cfg.steps - born.get(m, 0) for m in members}
    assert min(ages.values()) >= cfg.pbt.interval, ages
    assert (run / "checkpoints" / "step_4").is_dir()
