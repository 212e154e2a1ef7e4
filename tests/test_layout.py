"""The package layout: one job per top-level package, imports pointing down only, every package shipped.

Layers, bottom to top (``docs/design.md``)::

    populora_env  <  agents, evolution, populora_bridges  <  selfplay, populora_verifiers  <  baselines,
    evaluation, populora_bridges.grpo  <  populora_cli

``populora_bridges`` (the Gymnasium and OpenEnv bridges, the game's metrics for trainers) needs only the game;
``populora_verifiers`` (the verifiers bridge, a top-level package because verifiers imports an environment by a
top-level name) uses it; ``populora_bridges.grpo`` (the TRL bridge) needs the learning stack and the run
directory, so it is a unit of its own above the run layer. Nothing in the project imports the bridges (users do).

A module may import project packages of a strictly lower layer only (agents and evolution, on the same layer,
do not import each other, nor do baselines and evaluation), so the graph between top-level packages has no
cycle and no upward arrow, and nothing imports the composition root. Every ``import`` statement counts,
including those inside functions.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "populora_env": 0,
    "agents": 1,
    "evolution": 1,
    "selfplay": 2,
    "baselines": 3,
    "evaluation": 3,
    "populora_cli": 4,
    "populora_bridges": 1,
    "populora_verifiers": 2,
}
# Subpackages that are a unit of the layer graph of their own (a higher layer than their package's).
SUBPACKAGE_LAYERS = {"populora_bridges.grpo": 3}
UNITS = {**LAYERS, **SUBPACKAGE_LAYERS}
# The bridges: for users; only a bridge may import another (the composition root is imported by nothing).
BRIDGES = ("populora_bridges", "populora_bridges.grpo", "populora_verifiers")


def _unit(dotted: str) -> str:
    """The layer unit of a dotted module name: its subpackage of :data:`SUBPACKAGE_LAYERS`, else its top-level
    package."""
    return next((sub for sub in SUBPACKAGE_LAYERS if dotted == sub or dotted.startswith(sub + ".")),
                dotted.split(".")[0])


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, layer unit) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, _unit(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, _unit(node.module)))
    return out


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = _unit(".".join(path.relative_to(ROOT).with_suffix("").parts))
            for line, target in _imports(path):
                if target in UNITS and target != source:
                    edges.setdefault((source, target), []).append(f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_imports_point_down_only() -> None:
    bad = [f"{src} -> {dst} ({', '.join(where[:3])})" for (src, dst), where in _edges().items()
           if UNITS[dst] >= UNITS[src] and not (src.startswith(dst + ".") or dst.startswith(src + "."))]
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_nothing_imports_the_composition_root_and_only_bridges_import_bridges() -> None:
    bad = [f"{src} -> {dst} ({', '.join(where[:3])})" for (src, dst), where in _edges().items()
           if dst == "populora_cli" or (dst in BRIDGES and src not in BRIDGES)]
    assert not bad, "imports of a unit only users import:\n" + "\n".join(bad)


def test_the_unit_of_a_module_is_its_registered_subpackage() -> None:
    assert _unit("populora_bridges.grpo.students") == "populora_bridges.grpo"
    assert _unit("populora_bridges.single_seat") == "populora_bridges"
    assert _unit("populora_bridges.grpox") == "populora_bridges" and _unit("selfplay.loop") == "selfplay"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt):], node, nxt] if nxt in trail else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*trail, node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_no_cycle_between_top_level_packages() -> None:
    graph: dict[str, set[str]] = {p: set() for p in UNITS}
    for src, dst in _edges():
        graph[src].add(dst)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def _modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` under ``root`` (a package is its ``__init__.py``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _file_imports(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (file ``path``) imports, by every import statement, those
    inside functions included. ``import a.b.c`` imports the longest of ``a.b.c``, ``a.b``, ``a`` that is a
    module; ``from p import x`` imports module ``p.x`` when there is one, else ``p``; relative imports are
    resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                prefixes = (".".join(parts[:k]) for k in range(len(parts), 0, -1))
                found = next((m for m in prefixes if m in modules), None)
                if found is not None:
                    out.add(found)
        elif isinstance(node, ast.ImportFrom):
            levels = package.split(".")
            base = levels[: len(levels) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    out.add(f"{source}.{alias.name}")
                elif source in modules:
                    out.add(source)
    out.discard(name)
    return out


def _file_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    modules = _modules(root, packages)
    return {name: _file_imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle_between_files() -> None:
    """No file imports itself through others (a cycle between files works only by the order of imports, or by
    moving an import into a function, and makes both files one unit): the module-level graph of every file of
    the project's packages, every import statement counted."""
    graph = _file_graph(ROOT, LAYERS)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk found the project
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


def test_the_file_graph_sees_cycles_through_functions_and_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from pkg.sub.c import C\n")
    (tmp_path / "pkg" / "a.py").write_text("import os\n\ndef f():\n    from pkg.sub import b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from .. import a\nimport pkg.sub.c\n")
    (tmp_path / "pkg" / "sub" / "c.py").write_text("from . import C2\nC = 1\n")
    graph = _file_graph(tmp_path, ["pkg"])
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub": {"pkg.sub.c"},
                     "pkg.sub.b": {"pkg.a", "pkg.sub.c"}, "pkg.sub.c": {"pkg.sub"}}
    assert _find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (tmp_path / "pkg" / "a.py").write_text("import os\n")
    assert _find_cycle(_file_graph(tmp_path, ["pkg"])) == ["pkg.sub", "pkg.sub.c", "pkg.sub"]
    (tmp_path / "pkg" / "sub" / "c.py").write_text("C = 1\n")
    assert _find_cycle(_file_graph(tmp_path, ["pkg"])) is None


def test_the_graph_checker_sees_upward_and_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import agents.models\n\ndef f():\n    from selfplay.loop import SelfPlayLoop\n")
    assert [top for _line, top in _imports(module)] == ["agents", "selfplay"]


# Files whose every function reads on one screen (issues 24, 35, 44 and 45): the whole library, every package the
# project ships (every package of LAYERS), the sandbox's single-source worker files included: no exemption.
SHORT_FUNCTION_FILES = tuple(sorted(p.relative_to(ROOT).as_posix()
                                    for package in LAYERS for p in (ROOT / package).rglob("*.py")))
MAX_FUNCTION_LINES = 80


def _long_functions(path: Path) -> list[str]:
    """``name (N lines)`` for every function or method of ``path`` longer than ``MAX_FUNCTION_LINES``."""
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES]


@pytest.mark.parametrize("relpath", SHORT_FUNCTION_FILES)
def test_no_function_over_80_lines(relpath: str, tmp_path: Path) -> None:
    assert not _long_functions(ROOT / relpath), f"{relpath}: split {_long_functions(ROOT / relpath)}"
    long = tmp_path / "long.py"
    long.write_text("class A:\n    def f(self):\n" + "        x = 1\n" * MAX_FUNCTION_LINES)
    assert _long_functions(long) == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]  # the walk sees methods


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
