"""The library's documentation states what and why, never how long something took on some machine.

A time measured on a machine (``took ~170 ms``, ``prefill 40 vs 50 s``) is stale the day after and true of one
host only: it belongs in docs/results.md, next to the date, the commit and the command that measured it. This
scans every docstring (module, class, function, and the attribute docstrings of config dataclasses) and every
comment of the library packages for a number followed by a unit of time. A time that is a setting rather than
a measurement (a limit, a timeout, a default, a budget, a cap) may stand: the sentence around it says so with
one of :data:`SETTING_WORDS` and reports no measurement (:data:`MEASURED`: "Off by default: 313 vs 296 ms on
this machine" is a measurement).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("agents", "selfplay", "evolution", "populora_env", "evaluation", "baselines", "populora_cli")

TIME = re.compile(r"(?<![\w.])~?\d+(?:[.,]\d+)?(?:\s*[-–]\s*~?\d+(?:[.,]\d+)?)?\s*"
                  r"(?:ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|hours?)\b(?!\()")
"""A number (or a range) and a unit of time; ``min(`` is the function, not minutes."""
SETTING_WORDS = re.compile(r"limit|timeout|default|budget|deadline|\bcap\b|max\(|min\(", re.IGNORECASE)
"""Words that make a time a setting (a limit, a timeout, a default...) rather than a measurement."""
MEASURED = re.compile(r"measured|\btook\b|faster|slower|\bvs\b|median|benchmarks/|on this|machine|\d-core|"
                      r"\bcores?\b|dev box|\bprobe|\bcosts?\b", re.IGNORECASE)
"""Words that say a sentence reports a measurement."""


def _sentence(text: str, at: int) -> str:
    """The sentence (or clause) of ``text`` around position ``at``: bounded by ". ", "; " or a blank line."""
    starts = [m.end() for m in re.finditer(r"[.;]\s|\n\s*\n", text[:at])]
    end = re.search(r"[.;]\s|\n\s*\n", text[at:])
    return text[starts[-1] if starts else 0: at + end.start() if end else len(text)]


def _measured_times(text: str) -> list[str]:
    """The times in ``text`` whose sentence does not say they are a setting, or reports a measurement."""
    return [m.group(0) for m in TIME.finditer(text)
            if not SETTING_WORDS.search(sentence := _sentence(text, m.start())) or MEASURED.search(sentence)]


def _documentation(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring (any string statement) and every run of comment lines of ``path``."""
    source = path.read_text(encoding="utf-8")
    out = [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
           if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    run: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if run and tok.start[0] != run[-1][0] + 1:
                out.append((run[0][0], "\n".join(t for _, t in run)))
                run = []
            run.append((tok.start[0], tok.string.lstrip("#").strip()))
    if run:
        out.append((run[0][0], "\n".join(t for _, t in run)))
    return out


def _offenders(paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{line}: {', '.join(times)}"
            for p in paths for line, text in _documentation(p) if (times := _measured_times(text))]


@pytest.mark.parametrize("package", LIBRARY)
def test_no_docstring_or_comment_quotes_a_measured_time(package: str) -> None:
    bad = _offenders(sorted((ROOT / package).rglob("*.py")))
    assert not bad, ("times measured on a machine belong in docs/results.md (a limit or a default may stay: say "
                     "so in its sentence):\n" + "\n".join(bad))


def test_the_scan_finds_measurements_and_spares_settings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Fast.\n\nOn this CPU the prefill took ~170 ms; the step 40 vs 50 s."""\n\n'
                      "class C:\n    x: float = 2.0\n"
                      '    """Wall-clock limit per job, 2 s (AZR: 10 s)."""\n\n'
                      "def f():\n"
                      '    """Width ``2 min(c, W - c)``; a default of 3 s; runs 1.5-2 min on 2 cores."""\n'
                      '    """Off by default: the step took 313 vs 296 ms (benchmarks/x.py)."""\n'
                      "    # decoding 8 rows took 313 ms here,\n    # quiet machine\n    return 1\n",
                      encoding="utf-8")
    assert [line.split(": ", 1)[1] for line in _offenders([module])] == ["~170 ms, 50 s", "1.5-2 min",
                                                                         "296 ms", "313 ms"]
