"""docs/vllm.md names only what exists: every repository path, every command (as tests/test_docs_figures.py reads
commands: a ``populora`` sub-command and its flags, a repository script and its options, a pytest command, ``bash
FILE``), and every test it lists by name."""

from __future__ import annotations

import re
import shlex
from importlib import metadata
from pathlib import Path

from tests.test_docs_figures import _help, command_problems

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "vllm.md"
PACKAGES = (
    "agents",
    "selfplay",
    "evolution",
    "baselines",
    "evaluation",
    "populora_cli",
    "populora_env",
    "benchmarks",
    "scripts",
    "tests",
    "configs",
    "docs",
)
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(PACKAGES)})/[\w./-]*\w)")
PROGRAMS = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv(?:-vllm)?/bin/)?(?:populora|python3?|bash|hf|nvidia-smi) "
)
"""A command line: a program this check knows, then its arguments."""
SYNOPSIS = re.compile(r"\||\.\.\.|\[|: error: ")
"""A usage synopsis (``populora train|baseline ... [--flag N]``) or an error line the page quotes, not a command
to check."""
EXTERNAL = {"nvidia-smi": "the NVIDIA driver's tool (not checkable without a GPU)"}


def _commands(text: str) -> list[str]:
    """The commands of the page: each line of a ``bash`` block (comments cut), and each inline code span that
    starts with a program this check knows."""
    found, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence == "bash":
            command = line.split(" #", 1)[0].strip()
            if PROGRAMS.match(command) and not SYNOPSIS.search(command):
                found.append(command)
        elif fence is None:
            found += [
                s for s in re.findall(r"`([^`\n]+)`", line) if PROGRAMS.match(s) and not SYNOPSIS.search(s)
            ]
    return found


def command_problem_list(command: str) -> list[str]:
    """What is wrong with one documented command (``[]`` when it exists as written)."""
    argv = shlex.split(command)
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    prog = Path(argv[0]).name
    if prog in EXTERNAL:
        return []
    if prog == "hf":  # huggingface_hub's command line, installed with the project
        scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points}
        return (
            []
            if "hf" in scripts and argv[1:2] == ["download"]
            else [f"{command!r}: not huggingface_hub's hf"]
        )
    head, _, tail = command.partition(" -- ")
    problems = command_problems(head)
    if tail:  # populora compare ... -- TRAIN FLAGS: each must be a flag of populora train
        train = _help("train")
        problems += [
            f"{command!r}: populora train --help does not list {f}"
            for f in shlex.split(tail)
            if f.startswith("--") and f not in train
        ]
    return problems


def test_every_path_the_page_names_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    paths = sorted(set(PATH.findall(text)))
    assert "configs/vllm-smoke.json" in paths and "scripts/gpu_wheels.py" in paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_command_the_page_names_exists() -> None:
    commands = _commands(PAGE.read_text(encoding="utf-8"))
    assert any(c.startswith(".venv/bin/populora compare") for c in commands)
    assert any("benchmarks/gpu_check.py" in c for c in commands) and any(
        c.startswith("hf ") for c in commands
    )
    problems = [p for c in commands for p in command_problem_list(c)]
    assert problems == []


def test_every_test_the_page_lists_exists() -> None:
    named = set(re.findall(r"`(test_\w+)`", PAGE.read_text(encoding="utf-8")))
    defined = {
        m
        for f in (ROOT / "tests").rglob("test_*.py")
        for m in re.findall(r"^def (test_\w+)", f.read_text(encoding="utf-8"), re.M)
    }
    assert len(named) >= 10 and sorted(named - defined) == []


def test_the_checks_catch_what_is_missing() -> None:
    assert command_problem_list(".venv/bin/populora compare --preset p --seeds 1 --out o -- --modle x") == [
        "'.venv/bin/populora compare --preset p --seeds 1 --out o -- --modle x': populora train --help does not "
        "list --modle"
    ]
    assert command_problem_list("hf upload x") != []
    assert command_problem_list("python scripts/gpu_wheels.py --python 3.12") != []
    assert _commands(
        "```bash\nbash scripts/install.sh --vllm  # the extra\n```\nrun `hf download a/b` and `ls`\n"
    ) == ["bash scripts/install.sh --vllm", "hf download a/b"]
    assert PATH.findall("see configs/no-such.json, runs/x and /data/configs/y") == ["configs/no-such.json"]
