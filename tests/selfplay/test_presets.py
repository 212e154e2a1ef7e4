"""Every shipped preset (``configs/*.json``, shipped as ``selfplay.presets``) loads, validates, carries every value
of its file into the config, and ``populora train|baseline --preset P --dry-run`` exits 0 printing it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baselines.azr import azr_config
from populora_cli.main import ARMS, main
from selfplay.config import list_presets, load_preset, to_dict
from tests.selfplay.conftest import REPO

CONFIGS = REPO / "configs"


def _leaves(d: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, (*path, k))
        else:
            yield (*path, k), v


def test_every_preset_file_ships() -> None:
    assert list_presets() == sorted(p.stem for p in CONFIGS.glob("*.json"))
    assert {"cpu-smoke", "paper-4t4s", "azr-baseline"} <= set(list_presets())


def test_presets_are_found_in_a_checkout_that_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout on sys.path without ``pip install`` (benchmarks/gpu_check.py on a bare GPU image) has no package
    ``selfplay.presets``: the presets are read from its ``configs/`` (the bare-image test failed on this)."""
    import selfplay.config as config

    def not_installed(package: str):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(config.resources, "files", not_installed)
    assert list_presets() == sorted(p.stem for p in CONFIGS.glob("*.json"))
    assert load_preset("vllm-smoke").preset == "vllm-smoke"


@pytest.mark.parametrize("name", list_presets())
def test_preset_loads_validates_and_applies_every_value(name: str) -> None:
    cfg = load_preset(name)
    cfg.validate()
    assert cfg.preset == name
    raw = {k: v for k, v in json.loads((CONFIGS / f"{name}.json").read_text()).items() if not k.startswith("_")}
    loaded = to_dict(cfg)
    leaves = list(_leaves(raw))
    assert len(leaves) >= len(raw)
    for path, value in leaves:
        got: Any = loaded
        for key in path:
            got = got[key]
        assert got == value, (name, ".".join(path), got, value)


@pytest.mark.parametrize("name", list_presets())
@pytest.mark.parametrize("cmd", sorted(ARMS))
def test_dry_run_prints_the_preset(name: str, cmd: str, capsys: pytest.CaptureFixture, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([cmd, "--preset", name, "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    cfg = load_preset(name)
    if cmd == "baseline":
        cfg = azr_config(cfg)
    assert printed == to_dict(dataclasses.replace(cfg, name=f"{name}-{ARMS[cmd]}-s{cfg.seed}"))
    assert list(tmp_path.iterdir()) == []  # a dry run creates no run directory
