"""Complexity of one program (host-side, ``ast`` only): the measures the run's diagnostics
(:mod:`populora_env.metrics`, docs/method.md §10) and reward schemes (``ProposalResult.metrics``) share.

- **AST depth**: max node depth of ``ast.parse(program)`` (Module = 1, child = parent + 1 over
  ``ast.iter_child_nodes``);
- **cyclomatic complexity**: McCabe per function = 1 + decision points (``If``, ``For``/``AsyncFor``,
  ``While``, ``IfExp``, each ``ExceptHandler``, each comprehension and each of its ``if`` clauses, each
  ``match`` case, ``BoolOp`` adds ``len(values) − 1``); the program's value is the sum over its functions
  (nested functions and methods count as functions of their own);
- **lines of code**: non-blank lines that are not comment-only;
- **variable count**: distinct identifiers bound in the program: ``Name`` in Store context (assignments, loop,
  comprehension, ``with … as`` and walrus targets), function parameters, ``except … as`` names and ``match``
  captures; function and class names excluded.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from populora_env.literals import quiet_parse

_DECISIONS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.match_case)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _parse(program: str) -> ast.Module | None:
    try:
        return quiet_parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def tree_depth(tree: ast.AST) -> int:
    """Maximum node depth of ``tree`` (root = 1), computed without recursion."""
    best = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        best = max(best, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return best


def ast_depth(program: str) -> int:
    """Maximum node depth of the program's AST (Module = 1); 0 if it does not parse."""
    tree = _parse(program)
    return 0 if tree is None else tree_depth(tree)


def _decisions(node: ast.AST) -> int:
    """Decision points inside ``node``, not descending into nested functions."""
    count = 0
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, _FUNCTIONS):
            continue
        if isinstance(child, _DECISIONS):
            count += 1
        elif isinstance(child, ast.comprehension):
            count += 1 + len(child.ifs)
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
        stack.extend(ast.iter_child_nodes(child))
    return count


def cyclomatic_complexity(program: str) -> int:
    """Sum over functions of McCabe complexity (see the module docstring); 0 if it does not parse."""
    tree = _parse(program)
    if tree is None:
        return 0
    return sum(1 + _decisions(node) for node in ast.walk(tree) if isinstance(node, _FUNCTIONS))


def lines_of_code(program: str) -> int:
    """Non-blank lines that are not comment-only."""
    return sum(1 for line in program.splitlines() if line.strip() and not line.strip().startswith("#"))


def bound_variables(tree: ast.AST) -> set[str]:
    """Identifiers bound as variables (see the module docstring)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
    return names


def variable_count(program: str) -> int:
    """Number of distinct bound variable names; 0 if it does not parse."""
    tree = _parse(program)
    return 0 if tree is None else len(bound_variables(tree))


@dataclass(frozen=True)
class ProgramMetrics:
    """The four structural metrics of one program."""

    ast_depth: int
    cyclomatic: int
    loc: int
    variables: int


def program_metrics(program: str) -> ProgramMetrics:
    """All structural metrics of ``program``."""
    return ProgramMetrics(
        ast_depth=ast_depth(program),
        cyclomatic=cyclomatic_complexity(program),
        loc=lines_of_code(program),
        variables=variable_count(program),
    )
