"""Resume = the run's own configuration (``selfplay.config_changes``): a setting that differs from the run's
``config.json`` is refused before any model loads, listing each difference; structural ones are refused even with
``--override``; an accepted ``--override`` is recorded in ``config_history.jsonl`` at the resumed step, written into
``config.json`` and shown by the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from selfplay.config import ConfigError, TrainConfig, from_dict, to_dict
from selfplay.config_changes import (
    HISTORY_NAME,
    check_changes,
    config_diff,
    drop_retired,
    plan_resume,
    read_history,
)
from tests.selfplay.conftest import populora, populora_watched


@pytest.fixture
def run(tiny_run: Path, tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    return d


def _refused(run: Path, *flags: str) -> str:
    p, loads = populora_watched("train", "--resume", str(run), "--no-progress", *flags, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert loads == []  # refused before any model loaded
    assert not (run / HISTORY_NAME).exists()
    return p.stderr.strip().splitlines()[-1]


def test_changed_seed_and_lr_are_refused_listing_both(run: Path) -> None:
    line = _refused(run, "--seed", "5", "--trainer.lr", "0.01")
    assert line == ("populora train: error: --resume: differs from the run's config.json: --seed 0 -> 5; --trainer.lr "
                    "0.001 -> 0.01. A resumed run keeps its own configuration; to change it and record the change, add "
                    "--override seed trainer.lr")


def test_another_preset_is_refused_listing_what_it_changes(run: Path) -> None:
    line = _refused(run, "--preset", "cpu-smoke")
    # cpu-smoke's model, rank and alpha differ from the tiny run's: structural, so nothing can make this resume
    assert line.startswith("populora train: error: --resume: cannot change what the checkpoint is shaped by (")
    assert '--model "tiny-random" -> "smollm2-135m"' in line and "--rank 4 -> 8" in line and "--alpha 8 -> 16" in line


@pytest.mark.parametrize("flags", [("--rank", "8"), ("--model", "smollm2-135m"), ("--env.num-students", "3")])
def test_structural_changes_are_refused_even_with_override(run: Path, flags: tuple[str, str]) -> None:
    field = flags[0][2:].replace("-", "_")
    line = _refused(run, *flags, "--override", field)
    assert "cannot change what the checkpoint is shaped by" in line and flags[0] in line


def test_override_naming_no_field_and_override_without_resume_exit_2(run: Path, tmp_path: Path) -> None:
    assert _refused(run, "--seed", "5", "--override", "sed").endswith("--override: 'sed' is not a configuration field")
    p = populora("train", "--override", "seed", "--run-dir", str(tmp_path / "new"), "--dry-run", timeout=120)
    assert p.returncode == 2 and "--override: only with --resume" in p.stderr


def test_override_is_accepted_recorded_and_reported(run: Path) -> None:
    p = populora("train", "--resume", str(run), "--no-progress", "--seed", "5", "--trainer.lr", "0.002",
                 "--steps", "5", "--override", "seed", "trainer.lr", timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    history = read_history(run)
    assert [(h["step"], h["field"], h["old"], h["new"]) for h in history] == [
        (4, "seed", 0, 5), (4, "steps", 4, 5), (4, "trainer.lr", 0.001, 0.002)]
    for h in history:
        assert f"resume: {h['field']} changed from {json.dumps(h['old'])} to {json.dumps(h['new'])} after step 4" \
            in p.stderr
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert (cfg["seed"], cfg["steps"], cfg["trainer"]["lr"]) == (5, 5, 0.002)  # what the run trains with now
    summary = (run / "report" / "summary.md").read_text()
    assert "## Configuration changes" in summary and "| 4 | `trainer.lr` | `0.001` | `0.002` |" in summary
    # resuming again without flags is the run's own (changed) configuration: nothing differs, nothing recorded
    again = populora("train", "--resume", str(run), "--no-progress", "--dry-run", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["seed"] == 5 and len(read_history(run)) == 3


def test_check_changes_in_process() -> None:
    """The same rules for a Python caller of ``selfplay.run.train`` (which calls ``check_changes`` itself)."""
    old = to_dict(TrainConfig(model="tiny-random"))
    new = to_dict(TrainConfig(model="tiny-random", steps=20, progress=False, run_dir=Path("elsewhere"), seed=3))
    assert config_diff(old, old) == []
    with pytest.raises(ConfigError, match=r"--seed 0 -> 3\. .* add --override seed$"):
        check_changes(old, new)
    assert check_changes(old, new, ["--seed"]) == [("seed", 0, 3), ("steps", 12, 20)]  # progress/run_dir: unrecorded
    sectioned = to_dict(TrainConfig(model="tiny-random", seed=3, trainer=TrainConfig().trainer.__class__(lr=0.5)))
    assert [c[0] for c in check_changes(old, sectioned, ["trainer", "seed"])] == ["seed", "trainer.lr"]
    with pytest.raises(ConfigError, match="cannot change"):
        check_changes(old, to_dict(TrainConfig(model="tiny-random", target_modules=("q_proj",))), ["target_modules"])


def test_a_field_added_since_the_run_was_written_is_no_difference(run: Path) -> None:
    """A run written before a field existed resumes with the field's default, without --override."""
    saved = json.loads((run / "config.json").read_text())
    del saved["config"]["trainer"]["max_nonfinite_updates"]
    (run / "config.json").write_text(json.dumps(saved))
    p = populora("train", "--resume", str(run), "--no-progress", "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["trainer"]["max_nonfinite_updates"] == 3


def test_a_retired_field_in_an_old_config_json_is_dropped_on_resume(run: Path) -> None:
    """``env.max_completion_chars`` was removed: a run whose config.json still carries it resumes (the CLI and
    ``selfplay.resume`` read the saved configuration through ``drop_retired``); a preset naming it is refused."""
    saved = json.loads((run / "config.json").read_text())
    saved["config"]["env"]["max_completion_chars"] = 16384  # as every config.json written before the removal
    (run / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"^env\.max_completion_chars: unknown field"):
        from_dict(TrainConfig, saved["config"])  # a preset carrying it: a clear error naming the field
    dropped = drop_retired(saved["config"])
    assert "max_completion_chars" not in dropped["env"] and "max_completion_chars" in saved["config"]["env"]
    assert dropped["env"] == {k: v for k, v in saved["config"]["env"].items()
                              if k != "max_completion_chars"}
    cfg = from_dict(TrainConfig, {**dropped, "resume": str(run)})
    plan = plan_resume(cfg)
    assert plan.changes == [] and plan.saved.run.path == run
    p = populora("train", "--resume", str(run), "--no-progress", "--dry-run", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "max_completion_chars" not in json.loads(p.stdout)["env"]
