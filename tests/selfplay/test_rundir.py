"""Unit tests of selfplay.rundir: the checks on a run directory made before any work starts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from selfplay.rundir import (
    RUN_ENTRIES,
    RunDirError,
    check_resume_dir,
    os_error_line,
    prepare_new_run_dir,
    run_entries,
)
from tests.selfplay.conftest import REPO


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` with its type, size, mtime (ns) and content."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                         p.read_bytes() if p.is_file() else None)
    return out


def test_new_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "run"
    assert prepare_new_run_dir(target) == target
    assert target.is_dir() and list(target.iterdir()) == []  # the write probe is gone


def test_empty_directory_is_accepted(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert prepare_new_run_dir(run) == run and list(run.iterdir()) == []


def test_non_empty_directory_that_is_no_run_is_refused_untouched(tmp_path: Path) -> None:
    """E.g. ``--run-dir ~`` by mistake, or a link to a home directory: nothing is written into it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    (home / ".bashrc").write_text("mine too")
    link = tmp_path / "link"
    link.symlink_to(home)
    before = snapshot(tmp_path)
    for target in (home, link):
        with pytest.raises(RunDirError) as info:
            prepare_new_run_dir(target)
        assert str(info.value) == (f"run directory {target} is not empty and holds no run (.bashrc, notes.txt): a "
                                   "new run needs a new or empty directory; choose another --run-dir")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("entry", [*RUN_ENTRIES, "events.out.tfevents.1.host.2.0"])
def test_directory_holding_a_run_is_refused_untouched(tmp_path: Path, entry: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if "." in entry:
        (run / entry).write_text("{}")
    else:
        (run / entry).mkdir()
        (run / entry / "x").write_text("old")
    before = snapshot(tmp_path)
    with pytest.raises(RunDirError) as info:
        prepare_new_run_dir(run)
    assert str(info.value) == (f"run directory {run} already holds a run ({entry}); continue it with --resume {run}, "
                               "or choose another --run-dir")
    assert snapshot(tmp_path) == before
    assert run_entries(run) == [entry]


def test_run_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("x")
    with pytest.raises(RunDirError, match=f"^run directory {tmp_path / 'run'} exists and is not a directory$"):
        prepare_new_run_dir(tmp_path / "run")


def test_run_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match=f"^cannot create run directory .*: {tmp_path / 'f'} is not a directory$"):
        prepare_new_run_dir(tmp_path / "f" / "sub" / "run")
    assert (tmp_path / "f").read_text() == "x"


def test_run_dir_under_an_unwritable_directory(read_only_dir: Path) -> None:
    with pytest.raises(RunDirError, match=f"^cannot create run directory {read_only_dir / 'run'}: "):
        prepare_new_run_dir(read_only_dir / "run")


def test_unwritable_existing_directory(read_only_dir: Path) -> None:
    with pytest.raises(RunDirError, match=f"^cannot write in run directory {read_only_dir}: "):
        prepare_new_run_dir(read_only_dir)


def test_resume_dir_checks(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="is not a directory"):
        check_resume_dir(tmp_path / "missing")
    with pytest.raises(RunDirError, match="config.json not found"):
        check_resume_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert check_resume_dir(tmp_path) == tmp_path


def test_os_error_line() -> None:
    assert os_error_line(OSError(28, "No space left on device", "/x/y")) == "No space left on device: /x/y"
    assert os_error_line(OSError(28, "No space left on device")) == "No space left on device"


# ------------------------------------------------------------------------------------ one module names the files

LIBRARY = ("agents", "baselines", "evaluation", "evolution", "populora_cli", "populora_env", "selfplay")
RUN_FILES = re.compile(r"(?<![\w.-])(run_summary\.json|lineage\.jsonl|config\.json|config_history\.jsonl"
                       r"|tamper_samples\.jsonl)(?!\w)"
                       r"|(?<![\w.-])checkpoints/|^checkpoints$")


def _named_run_files(path: Path) -> list[tuple[int, str]]:
    """``(line, string)`` of every string literal in ``path`` that names a run directory's file, documentation
    (a bare string statement: module, class, function and attribute docstrings) left out; f-string parts count."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return sorted((n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  and RUN_FILES.search(n.value))


def test_the_run_files_are_named_in_one_library_module() -> None:
    """``run_summary.json``, ``lineage.jsonl``, ``config.json``, ``config_history.jsonl``, ``tamper_samples.jsonl`` and
    ``checkpoints/`` appear as string literals in ``selfplay/rundir.py`` only (every reader and writer takes the
    names from there; messages too). One other literal is a different file of the same name: a Hugging Face model directory's
    ``config.json``, named once, as ``agents.model_names.HF_CONFIG`` (torch-free: the run config checks model directories)."""
    found = {str(f.relative_to(REPO)): hits for pkg in LIBRARY for f in sorted((REPO / pkg).rglob("*.py"))
             if (hits := _named_run_files(f))}
    assert sorted(v for _, v in found.pop("selfplay/rundir.py")) == sorted(
        ["config.json", "run_summary.json", "lineage.jsonl", "config_history.jsonl", "tamper_samples.jsonl",
         "checkpoints"])
    models = found.pop("agents/model_names.py", [])
    assert [v for _, v in models] == ["config.json"]
    assert "HF_CONFIG = \"config.json\"" in (REPO / "agents/model_names.py").read_text().splitlines()[models[0][0] - 1]
    assert found == {}


def test_the_scan_sees_literals_messages_and_f_strings(tmp_path: Path) -> None:
    """The scan above is not vacuous: it finds each way a name can be written."""
    f = tmp_path / "m.py"
    f.write_text('"""Docs name config.json freely."""\nA = "config.json"\nB = f"{x} lineage.jsonl torn"\n'
                 'C = root / "checkpoints"\nD = "checkpoints/step_1"\nE = "adapter_config.json"\n'
                 'F = "run_summary.json.tmp"\nG = "lineage.jsonl_notes"\n')
    assert [n for n, _ in _named_run_files(f)] == [2, 3, 4, 5, 7]
