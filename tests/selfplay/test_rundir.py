"""Unit tests of selfplay.rundir: the checks on a run directory made before any work starts."""

from __future__ import annotations

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


def test_empty_or_unrelated_directory_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    prepare_new_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


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
