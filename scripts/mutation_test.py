"""Mutation testing of the math modules: apply small wrong changes one at a time, run the tests that reach them.

    .venv/bin/python scripts/mutation_test.py [--modules agents/advantages.py ...] [--jobs 2] [--list]
                                              [--json out.json] [--timeout-factor 5] [--confirm-survivors]

A *mutant* is one small edit of one AST node of a math module: an arithmetic operator swapped (``+``↔``-``,
``*``↔``/``, ``**``→``*``, ``//``→``/``), a term dropped (``a + b`` → ``a`` or ``b``, ``a * b`` → ``a`` or ``b``,
``a - b`` / ``a / b`` → ``a``, ``-x`` → ``x``), a comparison swapped (``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``,
``in``↔``not in``, ``is``↔``is not``), ``and``↔``or``, ``not x`` → ``x``, a numeric constant moved (ints ``c`` →
``c + 1``; floats ``c`` → ``c + 1``, or ``10·c`` for ``0 < |c| < 0.1``; ``True``↔``False``), or a function swapped
(``min``↔``max``, ``maximum``↔``minimum``, ``amax``↔``amin``, ``argmax``↔``argmin``, and ``.sum``↔``.mean``).
Docstrings, strings, type annotations, ``raise`` statements and ``__all__`` are left alone. A mutant is
*killed* when its tests fail (or use more than ``--timeout-factor`` × their baseline in CPU time), and
*survives* when they pass. (``mutmut`` 3 was the first choice, but it never mutates a decorated function, and
every estimator, loss mode, reward scheme and operator here is registered by a decorator.)

How it fits in ~15 minutes on 2 cores:

* one worker process per module collects the module's tests once (pytest, in a clean private copy of the
  project), runs them once with a line tracer to learn which test executes which line, and then forks one child
  per mutant. The child applies the mutant to the already imported module in place — the ``__code__`` of the
  function holding the edit is replaced by the mutated file's compiled code for it, so every reference
  (registries, ``from … import`` names) sees it; an edited module constant or default argument is re-executed
  and every function's defaults re-evaluated — and runs only the tests that execute the edited statement,
  fastest first, stopping at the first failure;
* edits of decorator arguments and class bodies, and the in-place survivors among constants and defaults, are
  rerun from a fresh import of the mutated file (forked from a process that holds the third-party imports);
* ``--confirm-survivors`` reruns a survivor on all of its module's tests (the selection is exact unless a test
  reaches the line only through a fixture shared with another test; the selected test files have none).

The per-module test lists are in :data:`TARGETS`. Prints each module's score (killed / total) and every
survivor with its line, function and edit; ``--json`` writes every mutant's result. Exit status 0 (the score is
a measurement, not a gate).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import inspect
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TARGETS: dict[str, list[str]] = {
    "agents/advantages.py": ["tests/agents/test_advantages.py"],
    "agents/losses.py": ["tests/agents/test_losses.py"],
    "populora_env/rewards.py": ["tests/env/test_rewards.py", "tests/env/test_scheme_fields.py"],
    "populora_env/matching.py": ["tests/env/test_matching.py", "tests/env/test_matching_rules.py",
                                 "tests/env/test_config_sections.py"],
    **{
        f"evolution/{name}.py": ["tests/evolution/test_lowrank.py", "tests/evolution/test_operators.py"]
        for name in ("lowrank", "gram", "factor_space", "mutations", "crossovers", "controls", "ties")
    },
}
"""Math module -> the tests that pin it (paths relative to the repository root)."""

PRELOAD = ("numpy", "torch", "pytest", "trueskill", "safetensors.torch", "transformers", "peft")
"""Third-party modules the fork server imports once (the project itself is imported only in the children)."""

IN_PROCESS = ("-p", "no:cacheprovider", "-n", "0")
"""pytest options of every in-process run: no cache, and no xdist workers (``addopts`` asks for them; this plugin
must see every test run in its own process, and a forked child must not start workers of its own)."""

_COPY_IGNORE = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc", ".pytest_cache", "runs")


# ------------------------------------------------------------------------------------------------- mutants


@dataclass
class Mutant:
    """One edit: replace ``source[start:end]`` (character offsets) by ``replacement``."""

    module: str
    index: int
    line: int
    end_line: int
    start: int
    end: int
    replacement: str
    description: str
    function: str | None  # qualname of the outermost def whose body holds the edit, else None
    function_line: int = 0  # that def's first line (its first decorator's, if decorated)
    kind: str = "slow"  # "body" (in a function body), "default" (a default argument), "constant" (a module-level
    # NAME = ... statement) are patched into the collected process; "slow" (decorator and class-level code) needs
    # a fresh import
    original: str = ""
    status: str = "pending"  # killed | survived | timeout | error
    tests_run: int = 0
    seconds: float = 0.0


_BINOP_SWAPS: dict[type, list[type]] = {
    ast.Add: [ast.Sub],
    ast.Sub: [ast.Add],
    ast.Mult: [ast.Div],
    ast.Div: [ast.Mult],
    ast.Pow: [ast.Mult],
    ast.FloorDiv: [ast.Div],
    ast.Mod: [ast.FloorDiv],
    ast.MatMult: [],
}
_CMP_SWAPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_NAME_SWAPS = {
    "min": "max",
    "max": "min",
    "minimum": "maximum",
    "maximum": "minimum",
    "amin": "amax",
    "amax": "amin",
    "argmin": "argmax",
    "argmax": "argmin",
}
_ATTR_SWAPS = {**_NAME_SWAPS, "sum": "mean", "mean": "sum"}
_OP_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Pow: "**",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}


def _line_offsets(source: str) -> list[int]:
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def _skipped_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """Line spans never mutated: docstrings, annotations, ``raise`` statements, ``__all__``."""
    spans: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            v = body[0].value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                spans.append((body[0].lineno, body[0].end_lineno or body[0].lineno))
        if isinstance(node, ast.Raise):
            spans.append((node.lineno, node.end_lineno or node.lineno))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def _annotation_nodes(tree: ast.Module) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        anns = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            anns.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            anns.append(node.returns)
        for ann in anns:
            ids.update(id(n) for n in ast.walk(ann))
    return ids


def _outer_functions(tree: ast.Module) -> list[tuple[str, int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualname, first line, node)`` of every module-level function and method (nested classes included):
    the units whose code object (or default values) a fast-path mutant replaces. The first line is the first
    decorator's, as in the function's ``co_firstlineno``."""
    out: list[tuple[str, int, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                out.append((prefix + node.name, first, node))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return out


def _classify(node: ast.AST, tree: ast.Module, functions: list) -> tuple[str, str | None, int]:
    """``(kind, function qualname, its first line)`` of an edit at ``node`` (see :attr:`Mutant.kind`)."""
    ln = node.lineno
    for qualname, first, fn in functions:
        body0, end = fn.body[0].lineno, fn.end_lineno or fn.lineno
        if body0 <= ln <= end:
            return "body", qualname, first
        defaults = [d for d in (*fn.args.defaults, *fn.args.kw_defaults) if d is not None]
        if any(d.lineno <= ln <= (d.end_lineno or d.lineno) for d in defaults):
            return "default", qualname, first
    for stmt in tree.body:
        if stmt.lineno <= ln <= (stmt.end_lineno or stmt.lineno):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and all(isinstance(t, ast.Name) for t in targets):
                return "constant", None, 0
    return "slow", None, 0


def _edits(node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """(mutated copy of ``node``, description) for every mutation of this node itself."""
    if isinstance(node, ast.BinOp):
        for new in _BINOP_SWAPS.get(type(node.op), []):
            m = copy.deepcopy(node)
            m.op = new()
            yield m, f"{_OP_SYMBOL[type(node.op)]} -> {_OP_SYMBOL[new]}"
        if isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            yield copy.deepcopy(node.left), f"drop '{_OP_SYMBOL[type(node.op)]} {ast.unparse(node.right)}'"
        if isinstance(node.op, ast.Add | ast.Mult):
            yield copy.deepcopy(node.right), f"drop '{ast.unparse(node.left)} {_OP_SYMBOL[type(node.op)]}'"
    elif isinstance(node, ast.AugAssign):
        for new in _BINOP_SWAPS.get(type(node.op), []):
            m = copy.deepcopy(node)
            m.op = new()
            yield m, f"{_OP_SYMBOL[type(node.op)]}= -> {_OP_SYMBOL[new]}="
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        yield copy.deepcopy(node.operand), "drop unary '-'" if isinstance(node.op, ast.USub) else "drop 'not'"
    elif isinstance(node, ast.BoolOp):
        m = copy.deepcopy(node)
        m.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield m, "and -> or" if isinstance(node.op, ast.And) else "or -> and"
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            new = _CMP_SWAPS.get(type(op))
            if new is not None:
                m = copy.deepcopy(node)
                m.ops[i] = new()
                yield m, f"{_OP_SYMBOL[type(op)]} -> {_OP_SYMBOL[new]}"
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            yield ast.Constant(not v), f"{v} -> {not v}"
        elif isinstance(v, int):
            yield ast.Constant(v + 1), f"{v} -> {v + 1}"
        elif isinstance(v, float):
            new = v * 10 if 0 < abs(v) < 0.1 else v + 1.0
            yield ast.Constant(new), f"{v!r} -> {new!r}"
    elif isinstance(node, ast.Name) and node.id in _NAME_SWAPS and isinstance(node.ctx, ast.Load):
        yield ast.Name(_NAME_SWAPS[node.id], ast.Load()), f"{node.id} -> {_NAME_SWAPS[node.id]}"
    elif isinstance(node, ast.Attribute) and node.attr in _ATTR_SWAPS and isinstance(node.ctx, ast.Load):
        m = copy.deepcopy(node)
        m.attr = _ATTR_SWAPS[node.attr]
        yield m, f".{node.attr} -> .{m.attr}"


def generate_mutants(module: str, source: str) -> list[Mutant]:
    """Every mutant of ``source`` (the file ``module``), in source order."""
    tree = ast.parse(source)
    offsets = _line_offsets(source)
    skipped = _skipped_spans(tree)
    annotations = _annotation_nodes(tree)
    functions = _outer_functions(tree)
    parents: dict[int, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[id(child)] = parent
    out: list[Mutant] = []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or id(node) in annotations:
            continue
        if any(a <= node.lineno <= b for a, b in skipped):
            continue
        if isinstance(node, ast.Constant) and isinstance(parents.get(id(node)), ast.JoinedStr | ast.FormattedValue):
            continue
        if isinstance(node, ast.Constant) and isinstance(parents.get(id(node)), ast.UnaryOp):
            pass  # -1.0: the constant and the sign are separate mutants
        start = offsets[node.lineno - 1] + _char_col(source, offsets, node.lineno, node.col_offset)
        end = offsets[node.end_lineno - 1] + _char_col(source, offsets, node.end_lineno, node.end_col_offset)
        original = source[start:end]
        kind, owner, owner_line = _classify(node, tree, functions)
        for new, desc in _edits(node):
            text = ast.unparse(new)
            if not isinstance(node, ast.stmt):
                text = f"({text})"
            out.append(
                Mutant(
                    module=module,
                    index=0,
                    line=node.lineno,
                    end_line=node.end_lineno or node.lineno,
                    start=start,
                    end=end,
                    replacement=text,
                    description=desc,
                    function=owner,
                    function_line=owner_line,
                    kind=kind,
                    original=original,
                )
            )
    out.sort(key=lambda m: (m.start, m.end, m.description))
    for i, m in enumerate(out):
        m.index = i
    return out


def _char_col(source: str, offsets: list[int], lineno: int, col_bytes: int) -> int:
    """AST column offsets count UTF-8 bytes; convert to characters."""
    line = source[offsets[lineno - 1] : offsets[lineno]]
    return len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))


def _statement_lines(source: str) -> dict[int, tuple[int, int]]:
    """line -> (first, last) line of the innermost statement containing it."""
    tree = ast.parse(source)
    best: dict[int, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.If | ast.For | ast.While | ast.With
            | ast.Try
        ):
            a, b = node.lineno, node.end_lineno or node.lineno
            for ln in range(a, b + 1):
                if ln not in best or (b - a) < (best[ln][1] - best[ln][0]):
                    best[ln] = (a, b)
        elif isinstance(node, ast.If | ast.While):  # the condition line(s) of a compound statement
            a, b = node.test.lineno, node.test.end_lineno or node.test.lineno
            for ln in range(a, b + 1):
                best.setdefault(ln, (node.lineno, b))
    return best


# ---------------------------------------------------------------------------- worker: fork after collection


class _LineTracer:
    """Records the lines of some files executed between :meth:`start` and :meth:`stop` (all threads)."""

    def __init__(self, filenames: dict[str, str]) -> None:
        self.names = filenames  # absolute path -> module (relative path)
        self.lines: dict[str, set[int]] = {}

    def _global(self, frame, event, arg):  # noqa: ANN001
        mod = self.names.get(frame.f_code.co_filename)
        if mod is None:
            return None
        hit = self.lines.setdefault(mod, set())
        hit.add(frame.f_lineno)

        def local(frame, event, arg):  # noqa: ANN001
            if event == "line":
                hit.add(frame.f_lineno)
            return local

        return local

    def start(self) -> None:
        self.lines = {}
        sys.settrace(self._global)
        threading.settrace(self._global)

    def stop(self) -> dict[str, list[int]]:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        return {mod: sorted(lines) for mod, lines in self.lines.items()}


def _find_code(code: types.CodeType, qualname: str, first_line: int) -> types.CodeType | None:
    """The code object ``qualname`` starting at ``first_line`` inside a module's compiled code."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname and const.co_firstlineno == first_line:
                return const
            found = _find_code(const, qualname, first_line)
            if found is not None:
                return found
    return None


def _find_function(module: types.ModuleType, qualname: str, first_line: int) -> types.FunctionType | None:
    """The live function object ``qualname`` of ``module`` (through properties, static/class methods and
    ``functools.wraps`` wrappers such as ``contextlib.contextmanager``)."""
    obj: object = module
    for part in qualname.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return None
    todo = [obj]
    while todo:
        cand = todo.pop()
        if isinstance(cand, property):
            todo += [f for f in (cand.fget, cand.fset, cand.fdel) if f is not None]
        elif isinstance(cand, staticmethod | classmethod):
            todo.append(cand.__func__)
        elif isinstance(cand, types.FunctionType):
            if cand.__code__.co_qualname == qualname and cand.__code__.co_firstlineno == first_line:
                return cand
            if hasattr(cand, "__wrapped__"):
                todo.append(cand.__wrapped__)
    return None


def _patch(mod: types.ModuleType, source: str, m: Mutant) -> bool:
    """Apply mutant ``m`` to the imported ``mod`` in place, as a fresh import of the mutated file would.

    ``body``: the outermost function's ``__code__`` becomes the mutated module's compiled code for it.
    ``constant``: the mutated module-level statement is executed in the module's namespace. For both
    ``constant`` and ``default`` every function's and method's default values are then re-evaluated from the
    mutated source (defaults are bound when a ``def`` runs). False when something cannot be located.
    """
    mutated = source[: m.start] + m.replacement + source[m.end :]
    filename = mod.__file__
    if m.kind == "body":
        new = _find_code(compile(mutated, filename, "exec"), m.function, m.function_line)
        func = _find_function(mod, m.function, m.function_line)
        if new is None or func is None:
            return False
        func.__code__ = new
        return True
    old_tree, new_tree = ast.parse(source), ast.parse(mutated)
    if m.kind == "constant":
        stmt = next((s for s in new_tree.body if s.lineno <= m.line <= (s.end_lineno or s.lineno)), None)
        if stmt is None:
            return False
        exec(compile(ast.Module([stmt], []), filename, "exec"), mod.__dict__)  # noqa: S102
    olds, news = _outer_functions(old_tree), _outer_functions(new_tree)
    if len(olds) != len(news):
        return False
    for (qualname, first, _), (_, _, fn) in zip(olds, news, strict=True):
        func = _find_function(mod, qualname, first)
        if func is None:
            continue
        try:
            defaults = [eval(compile(ast.Expression(d), filename, "eval"), mod.__dict__) for d in fn.args.defaults]
            kw = {
                a.arg: eval(compile(ast.Expression(d), filename, "eval"), mod.__dict__)
                for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
                if d is not None
            }
        except Exception:  # noqa: BLE001 - e.g. a default naming a class attribute: leave it to the slow path
            return False
        func.__defaults__ = tuple(defaults) or None
        func.__kwdefaults__ = kw or None
    return True


@dataclass
class _Target:
    """One mutated module inside a worker."""

    module: str
    mod: types.ModuleType
    source: str
    mutants: list[Mutant]
    stmt: dict[int, tuple[int, int]]


class MutationWorker:
    """pytest plugin: after collection, runs the baseline and every in-place mutant in forked children.

    A child applies its mutant to the imported module (:func:`_patch`), runs the tests that execute the edited
    statement (fastest first) and exits 1 at the first failure, 0 if they all pass.
    """

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.jobs = int(spec["jobs"])
        self.factor = float(spec["factor"])
        self.confirm = bool(spec["confirm"])
        self.out = Path(spec["out"])
        self.failed = False

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
        if report.failed:
            self.failed = True

    def _run_items(self, items: list, tracer: _LineTracer | None, stop_on_fail: bool) -> dict:
        before = set(sys.modules)
        trace: dict[str, dict[str, list[int]]] = {}
        durations: dict[str, float] = {}
        for i, item in enumerate(items):
            nxt = items[i + 1] if i + 1 < len(items) else None
            t0 = time.perf_counter()
            if tracer is not None:
                tracer.start()
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nxt)
            if tracer is not None:
                trace[item.nodeid] = tracer.stop()
            durations[item.nodeid] = time.perf_counter() - t0
            if self.failed and stop_on_fail:
                with contextlib.suppress(Exception):
                    item.session._setupstate.teardown_exact(None)
                break
        here = str(Path.cwd())
        lazy = [  # third-party modules the tests import lazily (e.g. torch.testing pulls in sympy: ~2 s)
            n for n, mod in list(sys.modules.items())
            if n not in before and not str(getattr(mod, "__file__", None) or here).startswith(here)
        ]
        return {"failed": self.failed, "trace": trace, "durations": durations, "lazy": lazy}

    def _fork(self, items: list, patch: tuple[_Target, Mutant] | None, tracer: _LineTracer | None = None,
              result: Path | None = None) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 3
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            if patch is not None:
                code = 4
                target, mutant = patch
                if not _patch(target.mod, target.source, mutant):
                    os._exit(5)  # could not patch: the driver runs it from a fresh import
            out = self._run_items(items, tracer, stop_on_fail=patch is not None)
            if result is not None:
                result.write_text(json.dumps(out))
            code = 1 if out["failed"] else 0
        finally:
            os._exit(code)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session) -> bool:  # noqa: ANN001
        import importlib

        t_start = time.perf_counter()
        items = list(session.items)
        by_id = {it.nodeid: it for it in items}
        targets = []
        for module, indices in self.spec["indices"].items():
            mod = importlib.import_module(module[: -len(".py")].replace("/", "."))
            source = Path(mod.__file__).read_text()
            keep = set(indices)
            mutants = [m for m in generate_mutants(module, source) if m.index in keep]
            targets.append(_Target(module, mod, source, mutants, _statement_lines(source)))
        names = ", ".join(t.module for t in targets)

        base_json = self.out.with_suffix(".baseline.json")
        tracer = _LineTracer({t.mod.__file__: t.module for t in targets})
        _, status = os.waitpid(self._fork(items, None, tracer, base_json), 0)
        base = json.loads(base_json.read_text()) if base_json.exists() else None
        if os.waitstatus_to_exitcode(status) != 0 or base is None or base["failed"]:
            self.out.write_text(json.dumps({"error": f"the tests of {names} fail without any mutant"}))
            return True
        trace, durations = base["trace"], base["durations"]
        for t in targets:
            if not any(lines.get(t.module) for lines in trace.values()):
                self.out.write_text(json.dumps({"error": f"no test executed {t.mod.__file__}"}))
                return True
        _warm(base["lazy"])  # imported once here, not in every child
        n_mut = sum(len(t.mutants) for t in targets)
        _log(f"{names}: baseline {sum(durations.values()):.1f} s for {len(items)} tests (traced); "
             f"{n_mut} mutants patched in place")
        everything = sorted(by_id, key=lambda n: durations.get(n, 0.0))

        results: dict[str, dict[int, dict]] = {t.module: {} for t in targets}
        pending = [(t, m) for t in targets for m in t.mutants]
        running: dict[int, tuple[_Target, Mutant, float, list[str], float]] = {}
        done_n = 0
        try:
            while pending or running:
                while pending and len(running) < self.jobs:
                    t, m = pending.pop(0)
                    if m.kind == "body":
                        sel = _select(m, {n: lines.get(t.module, []) for n, lines in trace.items()}, t.stmt)
                    else:
                        sel = list(everything)
                    if not sel:
                        results[t.module][m.index] = {"status": "survived", "tests_run": 0, "seconds": 0.0}
                        continue
                    sel.sort(key=lambda n: durations.get(n, 0.0))
                    limit = 10.0 + self.factor * sum(durations.get(n, 0.0) for n in sel)
                    running[self._fork([by_id[n] for n in sel], (t, m))] = (t, m, time.monotonic(), sel, limit)
                time.sleep(0.005)
                for pid in list(running):
                    t, m, t0, sel, limit = running[pid]
                    got, status = _poll_child(pid, _over_limit(pid, t0, limit))
                    if not got:
                        continue
                    del running[pid]
                    secs = results[t.module].get(m.index, {}).get("seconds", 0.0) + time.monotonic() - t0
                    code = None if status is None else os.waitstatus_to_exitcode(status)
                    if code == 0 and self.confirm and len(sel) < len(everything):  # rerun on every test
                        results[t.module][m.index] = {"seconds": secs}
                        limit = 10.0 + self.factor * sum(durations.values())
                        running[self._fork([by_id[n] for n in everything], (t, m))] = (
                            t, m, time.monotonic(), everything, limit)
                        continue
                    if code is None:
                        res = {"status": "timeout"}
                    elif code == 0:
                        # a constant or default survivor is confirmed by the driver from a fresh import
                        res = {"status": "survived" if m.kind == "body" else "unconfirmed"}
                    elif code == 1:
                        res = {"status": "killed"}
                    elif code == 5:
                        res = {"status": "unpatched"}
                    else:
                        res = {"status": "killed", "note": f"child exit {code}"}  # e.g. it does not compile
                    res.update(tests_run=len(sel), seconds=secs)
                    results[t.module][m.index] = res
                    done_n += 1
                    if done_n % 100 == 0:
                        _log(f"  {done_n}/{n_mut} done, {time.perf_counter() - t_start:.0f} s")
        finally:
            _kill_all(running)
        self.out.write_text(json.dumps({"results": results, "lazy": base["lazy"]}))
        return True


def _select(m: Mutant, per_test: dict[str, list[int]], stmt: dict[int, tuple[int, int]]) -> list[str]:
    """Tests that executed any line of the statement(s) holding the edit."""
    first, last = m.line, m.end_line
    for ln in range(m.line, m.end_line + 1):
        a, b = stmt.get(ln, (ln, ln))
        first, last = min(first, a), max(last, b)
    return [t for t, lines in per_test.items() if any(first <= ln <= last for ln in lines)]


_TICK = os.sysconf("SC_CLK_TCK")


def _poll_child(pid: int, over_limit: bool) -> tuple[int, int | None]:
    """``waitpid(pid, WNOHANG)``; a child still running when ``over_limit`` (checked just before) is killed
    (SIGKILL) and reaped. Returns ``(0, 0)`` while it runs, else ``(pid, wait status)``, the status ``None`` when
    killed."""
    got, status = os.waitpid(pid, os.WNOHANG)
    if not got and over_limit:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return pid, None
    return got, status


def _over_limit(pid: int, t0: float, limit: float) -> bool:
    """Whether a child used more than ``limit`` CPU seconds (CPU, not wall: a loaded machine must not turn slow
    runs into "timeouts"), or 20x that in wall time (a run that sleeps)."""
    if time.monotonic() - t0 > 20 * limit:
        return True
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return time.monotonic() - t0 > limit
    return (int(fields[11]) + int(fields[12])) / _TICK > limit  # utime + stime


def _kill_all(running: dict) -> None:
    """SIGKILL and reap the forked children still running (on an error or SIGTERM)."""
    for pid in list(running):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        running.pop(pid, None)


def _sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _warm(names: list[str]) -> None:
    """Import third-party modules ahead of the forks (a failing one is skipped)."""
    for name in names:
        with contextlib.suppress(Exception):
            __import__(name)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def worker_main(spec_path: Path) -> int:
    """``--worker SPEC.json``: run in a clean copy of the project (cwd); collects the tests once."""
    import torch

    torch.set_num_threads(1)
    spec = json.loads(spec_path.read_text())
    plugin = MutationWorker(spec)
    return int(pytest.main(["-q", "-s", *IN_PROCESS, *spec["tests"]], plugins=[plugin]))


# ----------------------------------------------------------------- driver: slow path for import-time mutants


def _project_files() -> list[str] | None:
    """Tracked and untracked-but-not-ignored files (``git ls-files``), or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def _make_copy(files: list[str] | None) -> Path:
    """A private copy of the project (what git would ship: no virtualenvs, caches or runs) in a temp directory."""
    repo = Path(tempfile.mkdtemp(prefix="mutation_")) / "repo"
    if files is None:
        shutil.copytree(ROOT, repo, ignore=_COPY_IGNORE, symlinks=True)
        return repo
    for f in files:
        dst = repo / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst)
    return repo


def _fresh_child(workdir: Path, tests: list[str]) -> int:
    """Fork; the child imports the project from ``workdir`` (the parent never imported it) and runs pytest -x."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        os.chdir(workdir)
        sys.path.insert(0, str(workdir))
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        code = int(pytest.main(["-x", "-q", "-s", *IN_PROCESS, *tests]))
    finally:
        os._exit(code)


_SLOW_BASELINE: dict[tuple[str, ...], float] = {}


def run_slow(module: str, mutants: list[Mutant], source: str, pool: list[Path], factor: float) -> None:
    """Mutants that need a fresh import (decorator and class-level code, and the confirmation of in-place
    survivors of module constants and defaults): the mutated file is written into a private copy and imported
    fresh in a forked child (one copy per job) that runs all of the module's tests."""
    if not mutants:
        return
    tests = TARGETS[module]
    if tuple(tests) not in _SLOW_BASELINE:
        t0 = time.monotonic()
        _, status = os.waitpid(_fresh_child(pool[0], tests), 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{module}: the tests fail in a fresh copy without any mutant")
        _SLOW_BASELINE[tuple(tests)] = time.monotonic() - t0
    base = _SLOW_BASELINE[tuple(tests)]
    limit = 30.0 + factor * base
    _log(f"{module}: {len(mutants)} mutants imported fresh (baseline {base:.1f} s)")
    pending = list(mutants)
    running: dict[int, tuple[Mutant, Path, float]] = {}
    free = list(pool)
    try:
        while pending or running:
            while pending and free:
                m, wd = pending.pop(0), free.pop()
                (wd / module).write_text(source[: m.start] + m.replacement + source[m.end :])
                running[_fresh_child(wd, tests)] = (m, wd, time.monotonic())
            time.sleep(0.01)
            for pid in list(running):
                m, wd, t_start = running[pid]
                got, status = _poll_child(pid, time.monotonic() - t_start > limit)
                if not got:
                    continue
                del running[pid]
                (wd / module).write_text(source)
                free.append(wd)
                m.seconds, m.tests_run = time.monotonic() - t_start, -1
                if status is None:
                    m.status = "timeout"
                else:
                    m.status = "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
    finally:
        _kill_all(running)


# --------------------------------------------------------------------------------------------------- main


def _killed(m: Mutant) -> bool:
    return m.status in ("killed", "timeout")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", nargs="*", default=list(TARGETS), help="math modules to mutate (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run in parallel")
    ap.add_argument("--timeout-factor", type=float, default=5.0,
                    help="a run is killed after this x its tests' baseline time, in CPU seconds (+10 s)")
    ap.add_argument("--list", action="store_true", help="only list the mutants")
    ap.add_argument("--json", type=Path, default=None, help="write every mutant's result here")
    ap.add_argument("--confirm-survivors", action="store_true",
                    help="rerun a survivor on all of its module's tests, not only those executing its line")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # clean up children and copies when stopped
    if args.worker is not None:
        return worker_main(args.worker)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        print(f"unknown module(s) {unknown}; known: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.timeout_factor <= 0:
        print("--jobs must be >= 1 and --timeout-factor > 0", file=sys.stderr)
        return 2
    if args.list:
        for mod in args.modules:
            for m in generate_mutants(mod, (ROOT / mod).read_text()):
                where = m.function or m.kind
                print(f"{mod}:{m.line} [{where}] {m.description}   {m.original[:60]!r} -> {m.replacement[:60]!r}")
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t_start, cpu0 = time.perf_counter(), _cpu_total()
    _log(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, jobs {args.jobs}")
    files = _project_files()
    clean = _make_copy(files)
    pool = [_make_copy(files) for _ in range(args.jobs)]
    results: dict[str, list[Mutant]] = {}
    groups: dict[tuple[str, ...], list[str]] = {}
    for mod in args.modules:  # modules pinned by the same tests share one worker (one collection, one baseline)
        groups.setdefault(tuple(TARGETS[mod]), []).append(mod)
    try:
        for tests, mods in groups.items():
            sources = {mod: (clean / mod).read_text() for mod in mods}
            for mod in mods:
                results[mod] = generate_mutants(mod, sources[mod])
            spec_path = clean.parent / f"worker_{abs(hash(tests))}.json"
            out = spec_path.with_suffix(".out.json")
            spec = {
                "tests": list(tests), "jobs": args.jobs, "factor": args.timeout_factor,
                "confirm": args.confirm_survivors, "out": str(out),
                "indices": {mod: [m.index for m in results[mod] if m.kind != "slow"] for mod in mods},
            }
            spec_path.write_text(json.dumps(spec))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
            worker = subprocess.Popen(cmd, cwd=clean, env={**os.environ, "PYTHONPATH": str(clean)},
                                      stdout=subprocess.DEVNULL)
            try:
                worker.wait()
            finally:
                if worker.poll() is None:
                    worker.terminate()
                    worker.wait()
            got = json.loads(out.read_text()) if out.exists() else {"error": "the worker wrote nothing"}
            if "error" in got:
                raise SystemExit(f"{', '.join(mods)}: {got['error']}")
            if "torch" not in sys.modules:
                for name in PRELOAD:  # the fork server of the slow path: third-party imports once, never the project
                    __import__(name)
                sys.modules["torch"].set_num_threads(1)
            _warm(got.get("lazy", []))
            for mod in mods:
                for m in results[mod]:
                    r = got["results"][mod].get(str(m.index))
                    if r is not None:
                        m.status, m.tests_run, m.seconds = r["status"], r.get("tests_run", 0), r.get("seconds", 0.0)
                again = [m for m in results[mod] if m.kind == "slow" or m.status in ("unpatched", "unconfirmed")]
                run_slow(mod, again, sources[mod], pool, args.timeout_factor)
                k = sum(_killed(m) for m in results[mod])
                _log(f"  {mod}: killed {k}/{len(results[mod])} ({100 * k / max(len(results[mod]), 1):.1f} %), "
                     f"{time.perf_counter() - t_start:.0f} s so far")
    finally:
        for wd in [clean, *pool]:
            shutil.rmtree(wd.parent, ignore_errors=True)
    wall, cpu = time.perf_counter() - t_start, _cpu_total() - cpu0

    print("\n| module | mutants | killed | of which timeouts | survived | score |")
    print("|---|---:|---:|---:|---:|---:|")
    tot = killed = 0
    for mod, mutants in results.items():
        n, k = len(mutants), sum(_killed(m) for m in mutants)
        to = sum(m.status == "timeout" for m in mutants)
        tot, killed = tot + n, killed + k
        print(f"| {mod} | {n} | {k} | {to} | {n - k} | {100 * k / max(n, 1):.1f} % |")
    print(f"| **total** | {tot} | {killed} | | {tot - killed} | {100 * killed / max(tot, 1):.1f} % |")
    print(f"\n{wall / 60:.1f} min wall, {cpu / 60:.1f} min CPU (all processes) with --jobs {args.jobs}; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print("\nsurviving mutants (module:line [function] edit):")
    for mod, mutants in results.items():
        for m in mutants:
            if not _killed(m):
                note = "no test executes it" if m.tests_run == 0 else m.status
                print(f"  {mod}:{m.line} [{m.function or m.kind}] {m.description}   "
                      f"{m.original[:70]!r} -> {m.replacement[:70]!r}  ({note})")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(m) for ms in results.values() for m in ms], indent=1))
    return 0


def _cpu_total() -> float:
    """CPU seconds of this process and its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
