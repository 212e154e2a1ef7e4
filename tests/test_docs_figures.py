"""Every measured figure of the docs says when it was measured and with which command, and that command exists.

A *stamp* is ``measured YYYY-MM-DD: `COMMAND` `` (one or more commands, each in backticks, after the colon) in
README.md or a page of docs/. This file checks:

* every stamp's date is a real date, not in the future, and each of its commands still exists as written:
  a ``populora`` sub-command with every flag it names listed by that sub-command's ``--help``; a repository script
  (``python benchmarks/…``, ``scripts/…``) that exists, with every flag one of its parser's ``add_argument``
  calls defines; a ``pytest``
  command whose paths exist, whose ``-m`` names only registered markers and whose flags pytest knows; ``bash
  FILE`` with FILE in the repository. A stamp naming anything else fails (write a command this can check);
* every figure line of the pages in :data:`STAMPED` (a duration, or a ratio ``0.73x``) has a stamp in its
  block (its paragraph, its list item or its table row), or in the heading of its section.

``test_a_stale_command_is_reported`` shows the check failing on stale commands (a renamed flag, a removed
script, an unregistered marker, a path that moved).
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import io
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STAMPED = ("README.md", "docs/testing.md")
"""Pages whose every figure line must carry a stamp (the others: every stamp they have is checked)."""

STAMP = re.compile(r"measured (?P<date>\d{4}-\d{2}-\d{2}):(?P<cmds>(?:\s*(?:,|and|then)?\s*`[^`\n]+`)+)")
FIGURE = re.compile(r"(?<!≤ )(?<!<= )(?<![\w.≤])\d+(?:\.\d+)?\s?(?:s|ms|min|h|seconds?|minutes?|hours?)\b(?![\w(])"
                    r"|(?<![\w.])\d+\.\d+\s?[x×](?!\w)")
"""A duration (``23.6 min``, ``240 s``) or a ratio (``0.73x``): what a measurement reports (``≤ 10 min`` is a
budget, not a figure)."""
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def stamps(text: str) -> list[tuple[int, str, list[str]]]:
    """``(line, date, commands)`` of every stamp in ``text``."""
    out = []
    for m in STAMP.finditer(text):
        out.append((text.count("\n", 0, m.start()) + 1, m["date"], re.findall(r"`([^`\n]+)`", m["cmds"])))
    return out


@cache
def _help(sub: str) -> str:
    """``populora SUB --help``, run in this process."""
    from populora_cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit):
        main([sub, "--help"])
    return out.getvalue()


@cache
def _script_flags(script: str) -> frozenset[str]:
    """The options a repository script's parser defines: every ``--name`` passed to an ``add_argument`` call (read
    from its source, so no script is imported; ``-h``/``--help`` included)."""
    tree = ast.parse((ROOT / script).read_text(encoding="utf-8"))
    return frozenset({"--help"} | {a.value for c in ast.walk(tree) if isinstance(c, ast.Call)
                                   and isinstance(c.func, ast.Attribute) and c.func.attr == "add_argument"
                                   for a in c.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")})


def _flags(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--") and a != "--"]


@cache
def _markers() -> frozenset[str]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    return frozenset(m.split(":")[0] for m in ini["markers"]) | {"xdist_group"}


PYTEST_FLAGS = {"-q", "-x", "-s", "-v", "-rs", "-n", "-m", "-k", "-p", "--durations", "--dist", "--junitxml",
                "--lf", "--timeout", "--count", "--maxfail"}
"""pytest options a documented test command may use (``-n``/``--dist`` are pytest-xdist's)."""


def _pytest_problems(args: list[str]) -> list[str]:
    problems, i = [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            name = a.split("=")[0]
            if name not in PYTEST_FLAGS:
                problems.append(f"pytest has no option {name} here")
            if name in ("-n", "-m", "-k", "-p", "--durations", "--dist", "--junitxml", "--maxfail") and "=" not in a:
                value = args[i + 1] if i + 1 < len(args) else ""
                if name == "-m":
                    unknown = set(re.findall(r"[A-Za-z_]\w*", value)) - {"not", "and", "or"} - _markers()
                    problems += [f"no pytest marker {u!r} (pyproject.toml)" for u in sorted(unknown)]
                i += 1
        elif not (ROOT / a.split("::")[0]).exists():
            problems.append(f"no test path {a.split('::')[0]}")
        i += 1
    return problems


def command_problems(cmd: str) -> list[str]:
    """Why ``cmd`` (a documented command) no longer exists as written; ``[]`` when it does."""
    argv = shlex.split(cmd)
    while argv and (_ENV.match(argv[0]) or argv[0] in ("/usr/bin/time", "-v", "time")):
        argv = argv[1:]
    if argv[:1] == ["timeout"]:
        argv = argv[2:]
    if not argv:
        return [f"{cmd!r}: no command"]
    prog = Path(argv[0]).name
    if prog == "populora":
        if len(argv) < 2 or argv[1].startswith("-"):
            return []  # `populora` alone / `populora --help`: the entry point itself
        text = _help(argv[1])
        if not re.search(rf"usage: populora {re.escape(argv[1])}\b", text):
            return [f"{cmd!r}: no sub-command populora {argv[1]}"]
        return [f"{cmd!r}: populora {argv[1]} --help does not list {f}" for f in _flags(argv[2:]) if f not in text]
    if prog.startswith("python"):
        argv = argv[1:]
        if argv[:2] == ["-m", "pytest"]:
            return [f"{cmd!r}: {p}" for p in _pytest_problems(argv[2:])]
        if not argv or not argv[0].endswith(".py"):
            return [f"{cmd!r}: not a command this check reads (a repository script or python -m pytest)"]
    elif prog == "pytest":
        return [f"{cmd!r}: {p}" for p in _pytest_problems(argv[1:])]
    elif prog == "bash":
        return [] if (ROOT / argv[1]).is_file() else [f"{cmd!r}: no file {argv[1]}"]
    elif not argv[0].endswith(".py"):
        return [f"{cmd!r}: not a command this check reads (populora, python SCRIPT, pytest or bash FILE)"]
    script = argv[0]
    if not (ROOT / script).is_file():
        return [f"{cmd!r}: no script {script}"]
    have = _script_flags(script)
    return [f"{cmd!r}: {script} has no option {f}" for f in _flags(argv[1:]) if f not in have]


_ITEM = re.compile(r"\s*(?:[-*]|\d+\.)\s|\|")
"""A line that starts a block of its own inside a paragraph run: a list item, or a table row."""


def _blocks(text: str) -> list[tuple[int, list[str], str]]:
    """``(first line number, lines, heading)`` of each block, with the heading of the section it is in: a
    paragraph (the lines between blank lines and headings; a code fence kept whole), a list item (with its
    continuation lines) or a table row, so that one stamp covers the figures measured together and no more."""
    out, block, start, heading, fence = [], [], 0, "", False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        boundary = not fence and (not line.strip() or line.startswith("#"))
        if block and (boundary or (not fence and _ITEM.match(line))):
            out.append((start, block, heading))
            block = []
        if boundary:
            heading = line if line.startswith("#") else heading
            continue
        if not block:
            start = n
        block.append(line)
    if block:
        out.append((start, block, heading))
    return out


def unstamped_figures(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every figure line whose block and section heading carry no stamp."""
    bad = []
    for start, lines, heading in _blocks(text):
        if STAMP.search(" ".join(lines)) or STAMP.search(heading):
            continue
        for k, line in enumerate(lines):
            if not line.startswith("```") and FIGURE.search(line):
                bad.append((start + k, line.strip()))
    return bad


# ---------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stamp_has_a_real_date_and_commands_that_exist(page: Path) -> None:
    today = datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=1)  # any time zone
    bad = []
    for line, date, cmds in stamps(page.read_text(encoding="utf-8")):
        try:
            if datetime.date.fromisoformat(date) > today:
                bad.append(f"{page.name}:{line}: {date} is in the future")
        except ValueError:
            bad.append(f"{page.name}:{line}: {date} is not a date")
        bad += [f"{page.name}:{line}: {p}" for c in cmds for p in command_problems(c)]
    assert not bad, "stale measurement stamps:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", STAMPED)
def test_every_figure_carries_a_stamp(page: str) -> None:
    bad = unstamped_figures((ROOT / page).read_text(encoding="utf-8"))
    assert not bad, (f"{page}: figures without `measured YYYY-MM-DD: `command`` in their paragraph, table or "
                     "section heading:\n" + "\n".join(f"{page}:{n}: {t}" for n, t in bad))


def test_the_stamped_pages_have_stamps() -> None:
    """The parser still finds the stamps (a changed stamp format would otherwise pass every check above)."""
    for page in STAMPED:
        assert stamps((ROOT / page).read_text(encoding="utf-8")), f"{page}: no stamp found"


@pytest.mark.parametrize("cmd, problem", [
    (".venv/bin/populora train --preset cpu-smoke --stepz 2", "does not list --stepz"),  # a renamed flag
    (".venv/bin/populora evaluate runs/x", "no sub-command populora evaluate"),  # a sub-command that went
    ("python benchmarks/no_such_benchmark.py --repeats 2", "no script benchmarks/no_such_benchmark.py"),
    ("python benchmarks/pipeline.py --repeats 2 --variantz sync", "has no option --variantz"),
    (".venv/bin/python -m pytest -q -m 'not slow and not nightly'", "no pytest marker 'nightly'"),
    (".venv/bin/python -m pytest -q tests/no_such_dir", "no test path tests/no_such_dir"),
    ("bash .ci/no_such_step", "no file .ci/no_such_step"),
    ("make test", "not a command this check reads"),
])
def test_a_stale_command_is_reported(cmd: str, problem: str) -> None:
    problems = command_problems(cmd)
    assert any(problem in p for p in problems), problems


def test_a_stale_stamp_fails_and_an_unstamped_figure_is_found() -> None:
    text = ("## Suite\n\nThe suite took 9.5 min (measured 2026-12-07: `.venv/bin/python -m pytest -q -m e2e2`).\n\n"
            "| step | time |\n|---|---|\n| install | 95 s |\n")
    (line, date, cmds), = stamps(text)
    assert (line, date, cmds) == (3, "2026-12-07", [".venv/bin/python -m pytest -q -m e2e2"])
    assert command_problems(cmds[0]) == [f"{cmds[0]!r}: no pytest marker 'e2e2' (pyproject.toml)"]
    assert unstamped_figures(text) == [(7, "| install | 95 s |")]
    assert command_problems(".venv/bin/python -m pytest -q -m e2e") == []
    assert command_problems("python benchmarks/pipeline.py --repeats 2 --variants sync,process-1+1") == []
