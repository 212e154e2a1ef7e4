"""The package layout: one job per top-level package, imports pointing down only, every package shipped.

Layers, bottom to top (``docs/design.md``)::

    populora_env  <  agents, evolution  <  baselines  <  selfplay  <  evaluation  <  populora_cli

A module may import project packages of a strictly lower layer only (agents and evolution, on the same layer,
do not import each other), so the graph between top-level packages has no cycle and no upward arrow, and
nothing imports the composition root. Every ``import`` statement counts, including those inside functions.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "populora_env": 0,
    "agents": 1,
    "evolution": 1,
    "baselines": 2,
    "selfplay": 3,
    "evaluation": 4,
    "populora_cli": 5,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, top in _imports(path):
                if top in LAYERS and top != package:
                    edges.setdefault((package, top), []).append(f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_imports_point_down_only() -> None:
    bad = [f"{src} -> {dst} ({', '.join(where[:3])})" for (src, dst), where in _edges().items()
           if LAYERS[dst] >= LAYERS[src]]
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_no_cycle_between_top_level_packages() -> None:
    graph: dict[str, set[str]] = {p: set() for p in LAYERS}
    for src, dst in _edges():
        graph[src].add(dst)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join([*trail, node, nxt])
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for p in LAYERS:
        if p not in state:
            visit(p, [])


def test_the_graph_checker_sees_upward_and_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import agents.models\n\ndef f():\n    from selfplay.loop import SelfPlayLoop\n")
    assert [top for _line, top in _imports(module)] == ["agents", "selfplay"]


@pytest.mark.parametrize("name", ["config", "loop", "run", "checkpoint", "logger", "cli", "report", "evaluation"])
def test_agents_holds_learning_only(name: str) -> None:
    assert not (ROOT / "agents" / f"{name}.py").exists() and not (ROOT / "agents" / name).is_dir(), (
        f"agents/{name} belongs to the run layer, evaluation or the command line, not to learning")


def test_pyproject_ships_every_package() -> None:
    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools_cfg["packages"])
    found = set(find_packages(str(ROOT), include=[f"{p}*" for p in LAYERS]))
    assert found <= listed, f"packages not shipped: {sorted(found - listed)}"
    assert setuptools_cfg["package-dir"]["selfplay.presets"] == "configs"
    assert listed - found == {"selfplay.presets"}, f"listed but missing: {sorted(listed - found - {'selfplay.presets'})}"


def test_no_top_level_package_is_called_populora() -> None:
    # an unrelated PyPI project owns the import name ``populora``
    assert not (ROOT / "populora").exists() and not (ROOT / "populora.py").exists()
