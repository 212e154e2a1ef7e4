"""Diagnostics of generated programs and of the task distribution (docs/method.md §10).

Program metrics (AST depth, cyclomatic complexity, lines of code, variable count) are defined and computed
in :mod:`populora_env.complexity` (its docstring states each measure) and re-exported here.

Distribution metrics (cumulative, kept by :class:`CoverageTracker`):

- **programs**: distinct canonical fingerprints: the AST after α-renaming every identifier the program binds
  (free names such as builtins and attributes are kept), with docstrings dropped and constants replaced by
  their type;
- **signatures**: distinct ``(input types) -> output type`` signatures of valid tasks.

Round summary (:func:`round_summary`, the env's ``infos[a]["round"]``): the pairs with ``p_ts``/``p_hat``/
``outcome``, the ratings, proposal and attempt counts (by rejection reason and by task type), the program
metrics of the round's valid deduction/abduction programs and the cumulative coverage, buffer sizes, the mean
completion reward per role (mean over every completion of the role's agents, 0.0 when there is none) and the
tampering counts per agent and per defence class (:func:`tamper_counts`).
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from populora_env.complexity import (
    ProgramMetrics,
    _parse,
    ast_depth,
    bound_variables,
    cyclomatic_complexity,
    lines_of_code,
    program_metrics,
    tree_depth,
    variable_count,
)
from populora_env.results import RoundResults

__all__ = ["ProgramMetrics", "ast_depth", "bound_variables", "cyclomatic_complexity", "lines_of_code",
           "program_metrics", "tree_depth", "variable_count"]

class _AlphaRenamer(ast.NodeTransformer):
    def __init__(self, bound: set[str]) -> None:
        self.bound = bound
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name not in self.bound:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node

    def _visit_def(self, node: Any) -> ast.AST:
        node.name = self._rename(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str) and len(body) > 1:
                node.body = body[1:]
        self.generic_visit(node)
        return node

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def
    visit_ClassDef = _visit_def

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=f"<{type(node.value).__name__}>")


def program_fingerprint(program: str) -> str | None:
    """Canonical fingerprint (16 hex chars) of a program after α-renaming, docstring and constant removal."""
    tree = _parse(program)
    if tree is None:
        return None
    try:
        return _fingerprint(tree)
    except RecursionError:
        return None


def _fingerprint(tree: ast.Module) -> str:
    tree = copy.deepcopy(tree)
    bound = bound_variables(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            tree.body = body[1:]
    renamed = _AlphaRenamer(bound).visit(tree)
    dump = ast.dump(renamed, annotate_fields=False, include_attributes=False)
    return hashlib.sha1(dump.encode()).hexdigest()[:16]


def summarize(programs: Iterable[str]) -> dict[str, float | int]:
    """Means (and maxima) of the metrics over ``programs`` (zeros when there are none)."""
    metrics = [program_metrics(p) for p in programs]
    n = len(metrics)
    out: dict[str, float | int] = {"n_programs": n}
    for field in ("ast_depth", "cyclomatic", "loc", "variables"):
        values = [getattr(m, field) for m in metrics]
        out[f"{field}_mean"] = (sum(values) / n) if n else 0.0
        out[f"{field}_max"] = max(values) if n else 0
    return out


class CoverageTracker:
    """Cumulative distinct program fingerprints and type signatures of valid proposed tasks."""

    def __init__(self) -> None:
        self._programs: list[str] = []
        self._signatures: list[str] = []
        self._program_set: set[str] = set()
        self._signature_set: set[str] = set()

    @property
    def n_programs(self) -> int:
        """Distinct program fingerprints seen so far."""
        return len(self._programs)

    @property
    def n_signatures(self) -> int:
        """Distinct type signatures seen so far."""
        return len(self._signatures)

    def update(self, programs: Iterable[str], signatures: Iterable[str]) -> dict[str, int]:
        """Add a round's valid programs and signatures; return round-level and cumulative counts."""
        round_programs: list[str] = []
        new_programs = 0
        for program in programs:
            fp = program_fingerprint(program)
            if fp is None:
                continue
            round_programs.append(fp)
            if fp not in self._program_set:
                self._program_set.add(fp)
                self._programs.append(fp)
                new_programs += 1
        round_signatures: list[str] = []
        new_signatures = 0
        for sig in signatures:
            round_signatures.append(sig)
            if sig not in self._signature_set:
                self._signature_set.add(sig)
                self._signatures.append(sig)
                new_signatures += 1
        return {
            "distinct_programs_round": len(set(round_programs)),
            "new_programs": new_programs,
            "coverage_programs": self.n_programs,
            "distinct_signatures_round": len(set(round_signatures)),
            "new_signatures": new_signatures,
            "coverage_signatures": self.n_signatures,
        }

    def state_dict(self) -> dict[str, list[str]]:
        """JSON-serialisable state."""
        return {"programs": list(self._programs), "signatures": list(self._signatures)}

    def load_state_dict(self, state: dict[str, list[str]]) -> None:
        """Inverse of :meth:`state_dict`."""
        self._programs = [str(x) for x in state.get("programs", [])]
        self._signatures = [str(x) for x in state.get("signatures", [])]
        self._program_set = set(self._programs)
        self._signature_set = set(self._signatures)


def tamper_counts(results: RoundResults) -> dict[str, Any]:
    """The round's tampering (``docs/sandbox.md`` section 7.2): ``total``, and per agent (every agent, teachers
    from their proposals, students from their attempts) how many of its completions tripped each defence class,
    ``{"teacher_0": {"introspection": 1}, "student_0": {}}``."""
    agents: dict[str, Counter] = {a: Counter() for a in results.agents}
    for record in (*results.proposals, *results.attempts):
        if record.tamper is not None:
            agents.setdefault(record.agent, Counter())[record.tamper] += 1
    return {"total": sum(sum(c.values()) for c in agents.values()),
            "agents": {a: dict(sorted(c.items())) for a, c in agents.items()}}


def round_summary(
    results: RoundResults,
    completion_rewards: Mapping[str, Sequence[float]],
    *,
    reward_scheme: str,
    task_types: Sequence[str],
    programs: Sequence[str],
    signatures: Sequence[str],
    coverage: CoverageTracker,
    ratings: Mapping[str, Any],
    buffer_sizes: Mapping[str, int],
) -> dict[str, Any]:
    """The summary of one round (see the module docstring), as plain JSON-able data.

    Args:
        results: the round's records (proposals, attempts, matches).
        completion_rewards: agent -> its completion rewards of the round.
        reward_scheme: the reward scheme's name.
        task_types: the task types in play (``"deduction"``...), the order of the ``by_type`` entries.
        programs: the programs of the round's valid deduction/abduction tasks (the program metrics' input).
        signatures: the type signatures of the round's valid tasks.
        coverage: the run's cumulative tracker, updated here with ``programs`` and ``signatures``.
        ratings: the ratings' summary after the round (``Ratings.summary()``).
        buffer_sizes: tasks per buffer after the round.
    """
    proposals, attempts = results.proposals, results.attempts
    reasons = Counter(p.reason for p in proposals if p.reason is not None)
    attempt_reasons = Counter(a.reason for a in attempts if a.reason is not None)
    metrics: dict[str, Any] = dict(summarize(programs))
    metrics.update(coverage.update(programs, signatures))

    def role_mean(agents: Sequence[str]) -> float:
        values = [v for a in agents for v in completion_rewards[a]]
        return float(sum(values) / len(values)) if values else 0.0

    return {
        "round": results.round,
        "reward_scheme": reward_scheme,
        "pairs": [
            {
                "teacher": m.teacher, "student": m.student, "p_ts": m.p_ts, "p_hat": m.p_hat,
                "n_valid": m.n_valid, "n_attempts": m.n_attempts, "n_correct": m.n_correct, "outcome": m.outcome,
            }
            for m in results.matches
        ],
        "ratings": dict(ratings),
        "proposals": {
            "total": len(proposals),
            "valid": sum(p.valid for p in proposals),
            "format_errors": sum(not p.format_ok for p in proposals),
            "reasons": dict(sorted(reasons.items())),
            "by_type": {
                t: {"total": sum(p.task_type == t for p in proposals),
                    "valid": sum(p.task_type == t and p.valid for p in proposals)}
                for t in task_types
            },
        },
        "attempts": {
            "total": len(attempts),
            "correct": sum(a.correct for a in attempts),
            "format_errors": sum(not a.format_ok for a in attempts),
            "matched": sum(a.matched for a in attempts),
            "reasons": dict(sorted(attempt_reasons.items())),
            "by_type": {
                t: {"total": sum(a.task_type == t for a in attempts),
                    "correct": sum(a.task_type == t and a.correct for a in attempts)}
                for t in task_types
            },
        },
        "tamper": tamper_counts(results),
        "metrics": metrics,
        "buffer_sizes": dict(buffer_sizes),
        "mean_reward": {"teacher": role_mean(results.teachers), "student": role_mean(results.students)},
    }
