"""AST-based safety and task-quality policy for model-written programs.

This is a *task-quality filter* (no randomness, clocks, I/O, processes, introspection escapes), never the
security boundary: the sandbox is. Everything is decided on the parsed AST, not by substring matching, so
``parse_input`` or a parameter named ``input`` are fine while ``import numpy.random`` or ``np.random.rand()``
are not (AZR matched dotted names against single components and missed both, docs/azr.md §10).

Rules:

1. ``import``/``from … import``: banned if **any** dotted component of the module path (and, for ``from``
   imports, of ``module.name``) is in :data:`BANNED_MODULES`; relative imports are banned.
2. Attribute chains rooted at an imported name are resolved to dotted paths and checked the same way
   (``import numpy as np; np.random.rand()`` → ``numpy.random`` → banned).
3. The builtins in :data:`BANNED_BUILTINS` are banned when used without being bound by the program itself
   (``input = 3; print(input)`` is fine; ``input()`` is not).
4. Introspection escape hatches: the names in :data:`BANNED_DUNDER_NAMES`, the attributes in
   :data:`BANNED_ATTRIBUTES`, and any identifier starting with ``__populora`` (the env's own guards).
"""

from __future__ import annotations

import ast

#: AZR's list (paper Figs. 8/10) plus process, network, file-system, clock, randomness and introspection
#: modules. Compared against every dotted component.
BANNED_MODULES: frozenset[str] = frozenset(
    {
        # AZR
        "logging", "random", "multiprocessing", "pebble", "subprocess", "threading", "datetime", "time",
        "hashlib", "hmac", "bcrypt", "calendar",
        # processes, OS, interpreter
        "os", "sys", "posix", "nt", "builtins", "importlib", "ctypes", "cffi", "signal", "resource", "gc",
        "inspect", "code", "codeop", "runpy", "pdb", "faulthandler", "atexit", "sched", "_thread",
        "_posixsubprocess", "concurrent", "asyncio", "pty", "fcntl", "termios", "tty", "mmap", "platform",
        "pwd", "grp", "getpass", "sysconfig", "site", "zipimport", "pkgutil", "tracemalloc", "trace",
        # files and serialisation
        "io", "shutil", "pathlib", "tempfile", "glob", "fnmatch", "fileinput", "pickle", "marshal", "shelve",
        "dbm", "sqlite3", "zipfile", "tarfile",
        # network
        "socket", "select", "selectors", "ssl", "urllib", "http", "ftplib", "smtplib", "requests",
        "webbrowser", "xmlrpc",
        # randomness and clocks
        "secrets", "uuid", "zoneinfo",
    }
)

#: Builtins that read the outside world, escape the namespace or are non-deterministic across processes.
BANNED_BUILTINS: frozenset[str] = frozenset(
    {
        "eval", "exec", "compile", "open", "input", "globals", "locals", "vars", "__import__", "breakpoint",
        "exit", "quit", "help", "id", "hash",
    }
)

#: Names that reach the interpreter's internals.
BANNED_DUNDER_NAMES: frozenset[str] = frozenset({"__builtins__", "__import__", "__loader__", "__spec__"})

#: Attributes used for sandbox-escape / introspection tricks (frames, globals, subclass walks).
BANNED_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "__globals__", "__subclasses__", "__code__", "__closure__", "__bases__", "__base__", "__mro__",
        "__builtins__", "__loader__", "__spec__", "__import__", "f_globals", "f_locals", "f_builtins", "f_back",
        "gi_frame", "cr_frame", "ag_frame", "tb_frame",
    }
)

_GUARD_PREFIX = "__populora"


def _banned_path(path: str) -> str | None:
    for part in path.split("."):
        if part in BANNED_MODULES:
            return part
    return None


def _bound_names(tree: ast.AST) -> set[str]:
    """Every identifier the program binds anywhere (scope-insensitive, conservative for rule 3)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
    return bound


def _import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted module path it refers to, for every import."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _attribute_path(node: ast.Attribute) -> tuple[str, list[str]] | None:
    attrs: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attrs.append(current.attr)
        current = current.value
    if isinstance(current, ast.Name):
        return current.id, list(reversed(attrs))
    return None


def check_safety(tree: ast.AST) -> str | None:
    """Return ``None`` if ``tree`` passes the policy, else a short human-readable reason."""
    aliases = _import_aliases(tree)
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hit = _banned_path(alias.name)
                if hit:
                    return f"import of banned module {alias.name!r}"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return "relative import"
            module = node.module or ""
            hit = _banned_path(module)
            if hit:
                return f"import from banned module {module!r}"
            for alias in node.names:
                if alias.name in BANNED_MODULES or alias.name in BANNED_BUILTINS:
                    return f"import of banned name {module}.{alias.name}"
        elif isinstance(node, ast.Name):
            if node.id in BANNED_DUNDER_NAMES or node.id.startswith(_GUARD_PREFIX):
                return f"use of {node.id!r}"
            if node.id in BANNED_BUILTINS and isinstance(node.ctx, ast.Load) and node.id not in bound:
                return f"use of banned builtin {node.id!r}"
        elif isinstance(node, ast.Attribute):
            if node.attr in BANNED_ATTRIBUTES or node.attr.startswith(_GUARD_PREFIX):
                return f"use of attribute {node.attr!r}"
            resolved = _attribute_path(node)
            if resolved is not None and resolved[0] in aliases:
                path = ".".join([aliases[resolved[0]], *resolved[1]])
                if _banned_path(path):
                    return f"use of banned module path {path!r}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name.startswith(_GUARD_PREFIX):
                return f"definition of {node.name!r}"
        elif isinstance(node, ast.arg) and node.arg.startswith(_GUARD_PREFIX):
            return f"parameter {node.arg!r}"
    return None
