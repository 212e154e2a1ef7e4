"""User plugins: the README's plugin example, run exactly as written (a reward scheme registered by a ``.py``
file, selected with its keyword arguments by a preset file), and the errors around plugins."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from selfplay.plugins import PluginError, load_plugin
from tests.selfplay.conftest import REPO, populora

README = (REPO / "README.md").read_text(encoding="utf-8")


def _example() -> tuple[str, str, list[str]]:
    """(my_scheme.py, my.json, command args) from the README's plugin example."""
    block = README.split("<!-- plugin-example:start -->")[1].split("<!-- plugin-example:end -->")[0]
    python = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    preset = re.search(r"```json\n(.*?)```", block, re.S).group(1)
    command = re.search(r"```bash\n(.*?)```", block, re.S).group(1).strip()
    args = shlex.split(command)
    assert args[0].endswith("populora"), command
    return python, preset, args[1:]


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    work = tmp_path_factory.mktemp("plugin")
    python, preset, args = _example()
    (work / "my_scheme.py").write_text(python)
    (work / "my.json").write_text(preset)
    run = work / "run"
    p = populora(*args, "--run-dir", str(run), cwd=work)
    assert p.returncode == 0, p.stderr[-4000:]
    return work, run, args


def test_readme_plugin_example_runs_and_the_scheme_gets_its_kwargs(example_run) -> None:
    work, run, args = example_run
    assert args[:5] == ["train", "--plugins", "my_scheme.py", "--preset", "my.json"]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["config"]["plugins"] == [str((work / "my_scheme.py").resolve())]
    assert cfg["config"]["env"]["reward_scheme"] == "gentle"
    assert cfg["config"]["env"]["reward_kwargs"] == {"invalid": -0.25}
    history = json.loads((run / "run_summary.json").read_text())["history"]
    assert len(history) == 1
    # a random model never writes a well-formatted proposal, so every teacher completion is invalid and is paid
    # exactly the scheme's `invalid` keyword argument from the preset (the built-in scheme would pay -1)
    assert history[0]["valid_rate"] == 0.0
    assert history[0]["teacher_reward"] == pytest.approx(-0.25, abs=0.0)


def test_resume_imports_the_plugin_again(example_run) -> None:
    """The run's plugin is imported on resume only when the command line names it again (a run directory from
    elsewhere cannot make ``--resume`` import code); named, the run continues with it."""
    work, run, _args = example_run
    p = populora("train", "--resume", str(run), "--steps", "2", "--no-progress", "--dry-run", cwd=work)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    plugin = str((work / "my_scheme.py").resolve())
    assert p.stderr.strip().splitlines()[-1] == (
        f"populora train: error: --resume: {run / 'config.json'} names the plugin(s) {plugin}; a run's plugins are "
        f"imported only when named on the command line: if you trust them, add --plugins {plugin}")
    p = populora("train", "--resume", str(run), "--steps", "2", "--no-progress", "--plugins", "my_scheme.py",
                 cwd=work)
    assert p.returncode == 0, p.stderr[-4000:]
    history = json.loads((run / "run_summary.json").read_text())["history"]
    assert [h["step"] for h in history] == [1, 2]
    assert history[1]["teacher_reward"] == pytest.approx(-0.25, abs=0.0)


def test_preset_naming_an_unregistered_scheme_exits_2(example_run, tmp_path: Path) -> None:
    work, _run, _args = example_run
    p = populora("train", "--preset", str(work / "my.json"), "--model", "tiny-random", "--run-dir",
                 str(tmp_path / "r"), timeout=120)
    assert p.returncode == 2
    assert "--env.reward-scheme" in p.stderr and "gentle" in p.stderr
    assert not (tmp_path / "r").exists()


def test_kwargs_the_scheme_does_not_take_exit_2(example_run, tmp_path: Path) -> None:
    work, _run, _args = example_run
    p = populora("train", "--plugins", str(work / "my_scheme.py"), "--preset", str(work / "my.json"),
                 "--env.reward-kwargs", '{"invalid": -0.25, "bonus": 1}', "--model", "tiny-random",
                 "--run-dir", str(tmp_path / "r"), timeout=120)
    assert p.returncode == 2
    assert "--env.reward-kwargs" in p.stderr and "bonus" in p.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("spec", "needle"), [("no_such_plugin_module", "not found"),
                                              ("missing_file.py", "not found")])
def test_missing_plugin_exits_2(spec: str, needle: str, tmp_path: Path) -> None:
    p = populora("train", "--plugins", spec, "--model", "tiny-random", "--run-dir", str(tmp_path / "r"),
                 timeout=120)
    assert p.returncode == 2
    assert "--plugins" in p.stderr and needle in p.stderr
    assert not (tmp_path / "r").exists()


def test_a_plugin_that_raises_names_itself(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('half-written plugin')\n")
    with pytest.raises(PluginError, match=r"broken\.py.*RuntimeError: half-written plugin"):
        load_plugin(str(bad))


def test_loading_the_same_file_twice_registers_once(tmp_path: Path) -> None:
    from populora_env import list_reward_schemes, unregister_reward_scheme

    path = tmp_path / "once.py"
    path.write_text(
        "from populora_env import register_reward_scheme\n"
        "@register_reward_scheme('once_only')\n"
        "def once_only(results):\n    return {}\n")
    try:
        first = load_plugin(str(path))
        second = load_plugin(str(path))  # a duplicate registration would raise
        assert first is second
        assert "once_only" in list_reward_schemes()
    finally:
        unregister_reward_scheme("once_only")
