"""One validation style, one error line: a bad value in any section of the run configuration, given by a flag
or by a preset file, exits 2 with ``populora <cmd>: error: --<section>.<field>: <reason>`` and nothing else:
no traceback, no tyro box, no model loaded, no run directory made (the ``cli`` fixture's loader fails the test
if called). Each section checks its own fields (``validate()``); the run config adds the section's prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# One bad value per section of TrainConfig: (dotted field, flag value, JSON value, the reason every path gives).
BAD = [
    ("steps", "0", 0, "must be >= 1, got 0"),
    ("env.samples_per_task", "0", 0, "must be >= 1, got 0"),
    ("env.trueskill.beta", "0", 0, "must be > 0, got 0"),
    ("generation.top_p", "1.5", 1.5, "must be <= 1, got 1.5"),
    ("trainer.lr", "-1", -1, "must be > 0, got -1"),
    ("pbt.cull_fraction", "0.9", 0.9, "must be <= 0.5, got 0.9"),
    ("ray.trainers", "0", 0, "must be >= 1, got 0"),
]
IDS = [field for field, *_ in BAD]


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _nested(field: str, value: object) -> dict:
    *sections, name = field.split(".")
    data: dict = {name: value}
    for section in reversed(sections):
        data = {section: data}
    return data


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def _only_line(rc: int, err: str) -> str:
    """The one line of a refused command (the logging setup prints nothing before validation)."""
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err and "╭" not in err and "Error parsing" not in err, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


@pytest.fixture
def preset(tmp_path: Path):
    """Write a preset (tiny-random plus ``data``) and return its path."""

    def write(data: dict) -> str:
        path = tmp_path / "preset.json"
        path.write_text(json.dumps(_merge({"model": "tiny-random", "env": {"sandbox_workers": 1}}, data)))
        return str(path)

    return write


@pytest.mark.parametrize(("field", "flag_value", "json_value", "reason"), BAD, ids=IDS)
def test_a_bad_value_reads_the_same_from_a_flag_and_from_a_preset(cli, preset, tmp_path: Path, field: str,
                                                                   flag_value: str, json_value: object,
                                                                   reason: str) -> None:
    expected = f"populora train: error: {_flag(field)}: {reason}"
    run_dir = tmp_path / "run"
    from_flag = _only_line(*cli("train", "--preset", preset({}), "--run-dir", str(run_dir), "--dry-run",
                                _flag(field), flag_value))
    from_preset = _only_line(*cli("train", "--preset", preset(_nested(field, json_value)), "--run-dir",
                                  str(run_dir), "--dry-run"))
    assert from_flag == expected
    assert from_preset == expected
    assert not run_dir.exists()


def test_refused_before_any_work_without_dry_run(cli, preset, tmp_path: Path) -> None:
    """No run directory is made and no model loads (the ``cli`` fixture's loader fails the test if called)."""
    line = _only_line(*cli("train", "--preset", preset({}), "--run-dir", str(tmp_path / "run"),
                           "--pbt.cull-fraction", "0.9"))
    assert line == "populora train: error: --pbt.cull-fraction: must be <= 0.5, got 0.9"
    assert not (tmp_path / "run").exists()


def test_the_baseline_gives_the_same_line(cli, preset, tmp_path: Path) -> None:
    line = _only_line(*cli("baseline", "--preset", preset({}), "--run-dir", str(tmp_path / "run"), "--dry-run",
                           "--trainer.lr", "-1"))
    assert line == "populora baseline: error: --trainer.lr: must be > 0, got -1"
    line = _only_line(*cli("baseline", "--preset", preset({"trainer": {"lr": -1}}), "--run-dir",
                           str(tmp_path / "run"), "--dry-run"))
    assert line == "populora baseline: error: --trainer.lr: must be > 0, got -1"
    assert not (tmp_path / "run").exists()


def test_a_cross_field_rule_names_the_field_it_refuses(cli, preset, tmp_path: Path) -> None:
    """Rules between fields of a section (the KL coefficient without a KL mode) and between sections (vLLM
    with a model built in memory) are refused on the same line as a range."""
    line = _only_line(*cli("train", "--preset", preset({}), "--run-dir", str(tmp_path / "r"), "--dry-run",
                           "--trainer.kl-coef", "0.1"))
    assert line == "populora train: error: --trainer.kl-coef: 0.1 has no effect with kl_mode 'off'; set kl_mode"
    line = _only_line(*cli("train", "--preset", preset({"generation": {"engine": "vllm"},
                                                          "model": "random:qwen2-tiny"}),
                           "--run-dir", str(tmp_path / "r"), "--dry-run"))
    assert line.startswith("populora train: error: --generation.engine: vllm needs a model directory")
