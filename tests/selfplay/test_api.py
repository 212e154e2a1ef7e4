"""The Python API's configuration handling (``populora_cli.api``) and the command's output levels
(``populora_cli.logs``). The API's runs are tests/test_examples.py's (examples/train_from_python.py, which holds
the README's API example)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from populora_cli.api import prepare, resolve_config
from populora_cli.logs import DEFAULT, QUIET, VERBOSE, take_verbosity
from selfplay.config import ConfigError, TrainConfig, load_preset, to_dict
from tests.selfplay.conftest import REPO, cli_env


def test_a_preset_with_settings_is_the_preset_with_those_fields_changed() -> None:
    cfg = resolve_config("tiny", steps=3, trainer={"lr": 0.01}, env={"num_students": 3})
    expected = to_dict(load_preset("tiny"))
    expected["steps"], expected["trainer"]["lr"], expected["env"]["num_students"] = 3, 0.01, 3
    assert to_dict(cfg) == expected


def test_a_dict_setting_replaces_the_default_and_a_section_merges() -> None:
    cfg = resolve_config("tiny", pbt={"operators": {"dare": 1.0}}, env={"reward_kwargs": {"x": 1}})
    assert cfg.pbt.operators == {"dare": 1.0}  # not merged into the default's families
    assert cfg.pbt.interval == load_preset("tiny").pbt.interval  # the section's other fields kept
    assert cfg.env.reward_kwargs == {"x": 1} and cfg.env.num_students == 2
    assert resolve_config("tiny", env={"trueskill": {"mu": 30.0}}).env.trueskill.sigma == pytest.approx(25 / 3)


def test_a_dict_and_a_train_config_are_configurations_too() -> None:
    base = load_preset("tiny")
    assert to_dict(resolve_config(base, seed=4)) == {**to_dict(base), "seed": 4}
    assert resolve_config({"steps": 2, "_comment": "ignored"}).steps == 2
    assert resolve_config().preset == "cpu-smoke"  # the command's default


def test_a_bad_setting_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config("tiny", trainer={"lrr": 1.0})
    assert err.value.field == "trainer.lrr" and err.value.reason.startswith("unknown field")
    with pytest.raises(ConfigError) as err:
        resolve_config("tiny", steps="3")
    assert err.value.field == "steps"
    cfg = resolve_config("tiny", trainer={"lr": -1.0})  # a refused value is found by prepare (validate)
    with pytest.raises(ConfigError, match="must be > 0"):
        prepare(cfg, "population")


def test_prepare_names_the_run_and_transforms_the_baseline() -> None:
    cfg, assignment = prepare(resolve_config("tiny"), "population")
    assert (cfg.name, assignment) == ("tiny-population-s0", None)
    cfg, assignment = prepare(resolve_config("tiny", seed=2), "baseline")
    assert cfg.name == "tiny-baseline-s2" and assignment == {"teacher_0": "azr", "student_0": "azr"}
    assert (cfg.env.num_teachers, cfg.env.reward_scheme, cfg.evolution) == (1, "azr", False)
    resumed, assignment = prepare(TrainConfig(resume=Path("runs/x")), "baseline")  # a resumed run: as saved
    assert resumed.env.reward_scheme == "populora" and assignment is None and resumed.name is None


def test_verbose_and_quiet_are_taken_out_of_any_command_line() -> None:
    assert take_verbosity(["train", "--quiet", "--steps", "2"]) == (["train", "--steps", "2"], QUIET)
    assert take_verbosity(["--verbose", "eval", "runs/x"]) == (["eval", "runs/x"], VERBOSE)
    assert take_verbosity(["train"]) == (["train"], DEFAULT)
    # after '--' the flags belong to the runs compare launches
    assert take_verbosity(["compare", "--", "--quiet"]) == (["compare", "--", "--quiet"], DEFAULT)


_LEVELS = """
import json, logging, sys, warnings
from populora_cli.logs import configure
configure(int(sys.argv[1]))
shown = []
for module in ("transformers.modeling_utils", "selfplay.run"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("deprecated", FutureWarning, "x.py", 1, module=module)
    shown.append(bool(caught))
print(json.dumps({"warnings": shown, "tensorboard_info": logging.getLogger("tensorboard").isEnabledFor(20),
                  "run_info": logging.getLogger("selfplay.run").isEnabledFor(20),
                  "bars_off": __import__("os").environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"}))
"""


@pytest.mark.parametrize(("level", "expected"), [
    (DEFAULT, {"warnings": [False, True], "tensorboard_info": False, "run_info": True, "bars_off": True}),
    (VERBOSE, {"warnings": [True, True], "tensorboard_info": True, "run_info": True, "bars_off": False}),
    (QUIET, {"warnings": [False, True], "tensorboard_info": False, "run_info": False, "bars_off": True}),
])
def test_output_levels(level: int, expected: dict) -> None:
    """Default: a library's deprecation warning and INFO lines hidden, the project's shown, loading bars off;
    --verbose: everything; --quiet: not even the project's INFO lines."""
    env = {k: v for k, v in cli_env().items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    p = subprocess.run([sys.executable, "-c", _LEVELS, str(level)], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == expected


@pytest.mark.parametrize("call, match", [
    (lambda: __import__("populora_cli.api").api.train(plugins="my_plugin.py"),
     r"train\(\): plugins must be a list .*got str 'my_plugin.py' \(write plugins=\['my_plugin.py'\]\)"),
    (lambda: __import__("populora_cli.api").api.baseline("tiny", plugins=[3]), r"baseline\(\): plugins .* an item int 3"),
    (lambda: __import__("populora_cli.api").api.train(config=12), r"train\(\): config must be a preset name .* got int 12"),
    (lambda: __import__("populora_cli.api").api.train("tiny", report="no"), r"train\(\): report must be True or False"),
    (lambda: resolve_config(3.5), r"resolve_config\(\): config must be .* got float 3.5"),
    (lambda: resolve_config({1: 2}), r"resolve_config\(\): config: a dict's keys must be field names"),
    (lambda: __import__("populora_cli.api").api.compare("runs/a", out="x"), r"compare\(\): runs must be a list .*write runs="),
    (lambda: __import__("populora_cli.api").api.compare(["runs/a"], out=5), r"compare\(\): out must be a directory"),
    (lambda: __import__("populora_cli.api").api.compare(["runs/a"], out="x", tail="3"), r"compare\(\): tail must be an int"),
    (lambda: __import__("populora_cli.api").api.compare(["runs/a"], out="x", reps=0), r"compare\(\): reps must be >= 1, got 0"),
    (lambda: __import__("populora_cli.api").api.compare(["runs/a"], out="x", eval_score="mean"),
     r"compare\(\): eval_score must be one of population_mean, best, weakest, got 'mean'"),
])
def test_the_api_checks_its_arguments_at_the_door(call, match: str, tmp_path: Path, monkeypatch) -> None:
    """A wrong type is one error naming the argument (issue 48: ``plugins='my_plugin.py'`` was read as the
    plugins ``m``, ``y``, ...; ``config=12`` raised from inside), raised before any work: nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((TypeError, ValueError), match=match):
        call()
    assert list(tmp_path.iterdir()) == []


def test_run_arm_checks_its_configuration() -> None:
    from populora_cli.api import run_arm

    with pytest.raises(TypeError, match=r"run_arm\(\): cfg must be a TrainConfig .* got dict"):
        run_arm(None, {"steps": 2}, "population")  # type: ignore[arg-type]


def test_the_api_names_survive_importing_every_command_module() -> None:
    """``from populora_cli import train, baseline, compare`` gives the API's functions even after the CLI's own
    modules were imported (a submodule named like an API function would replace it on the package: the compare
    command's module was ``populora_cli/compare.py`` until issue 48). Run in a fresh interpreter: this process may
    have imported them already, in any order."""
    code = (
        "import importlib, pkgutil, populora_cli, populora_cli.api as api\n"
        "for m in pkgutil.iter_modules(populora_cli.__path__):\n"
        "    importlib.import_module('populora_cli.' + m.name)\n"
        "from populora_cli import baseline, compare, train\n"
        "assert (train, baseline, compare) == (api.train, api.baseline, api.compare), (train, baseline, compare)\n"
        "clash = sorted(set(populora_cli.__all__) & {m.name for m in pkgutil.iter_modules(populora_cli.__path__)})\n"
        "assert not clash, clash\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
