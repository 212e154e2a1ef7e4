"""Unit tests of selfplay.checkpoint: the manifest, verification of every kind of damage, the choice of the
checkpoint to resume from, pruning, write failures, and ``kill -9`` at each instant of a write."""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from selfplay import checkpoint as ck
from selfplay.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    NoIntactCheckpoint,
    cleanup_partial,
    find_resumable,
    list_checkpoints,
    prune_checkpoints,
    set_aside,
    verify_checkpoint,
    write_checkpoint,
    write_text_atomic,
)
from tests.selfplay.conftest import REPO, cli_env

PAYLOAD = {
    "env_state.json": b'{"ratings": {"a": [25.0, 8.3]}}',
    "population/teacher_0/adapter_model.safetensors": bytes(range(256)) * 40,
    "population/teacher_0/optimizer.pt": b"\x00" * 1000 + b"\x01",
    "population/student_0/adapter_model.safetensors": b"student weights" * 100,
    "population/population.json": b'{"names": ["teacher_0", "student_0"]}',
}


def payload(step: int) -> dict[str, bytes]:
    """The files of a checkpoint (different per step; the JSON files stay JSON, as verification decodes them)."""
    return {k: v[:-1] + b', "step": %d}' % step if k.endswith(".json") else v + str(step).encode()
            for k, v in PAYLOAD.items()}


def writer(step: int):
    def write(d: Path) -> None:
        for rel, data in payload(step).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)

    return write


def entries(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory with complete checkpoints step_1 and step_2."""
    for s in (1, 2):
        write_checkpoint(tmp_path, s, writer(s), keep=0)
    return tmp_path


# ------------------------------------------------------------------------------------------ writing


def test_checkpoint_holds_the_files_a_manifest_and_done(tmp_path: Path) -> None:
    final = write_checkpoint(tmp_path, 7, writer(7), keep=0)
    assert final == tmp_path / "checkpoints" / "step_7"
    assert entries(tmp_path) == ["step_7"]  # no temporary directory left
    for rel, data in payload(7).items():
        assert (final / rel).read_bytes() == data
    assert (final / "DONE").read_text() == "7"
    manifest = json.loads((final / "MANIFEST.json").read_text())
    assert manifest["step"] == 7 and manifest["version"] == 1 and manifest["format"] == "populora-checkpoint"
    assert manifest["files"] == {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                                 for rel, data in payload(7).items()}
    assert verify_checkpoint(final) == 7


def test_rewriting_a_step_replaces_it(run: Path) -> None:
    def other(d: Path) -> None:
        (d / "env_state.json").write_text("{}")

    write_checkpoint(run, 2, other, keep=0)
    assert entries(run) == ["step_1", "step_2"]
    assert (run / "checkpoints/step_2/env_state.json").read_text() == "{}"
    assert not (run / "checkpoints/step_2/population").exists()
    assert verify_checkpoint(run / "checkpoints/step_2") == 2


@pytest.mark.parametrize(("keep", "left"), [(2, ["step_3", "step_4"]), (1, ["step_4"]), (3, ["step_2", "step_3", "step_4"]),
                                            (0, ["step_1", "step_2", "step_3", "step_4"])])
def test_pruning_keeps_the_newest(tmp_path: Path, keep: int, left: list[str]) -> None:
    for s in (1, 2, 3, 4):
        write_checkpoint(tmp_path, s, writer(s), keep=keep)
    assert entries(tmp_path) == left
    for name in left:
        verify_checkpoint(tmp_path / "checkpoints" / name)


def test_pruning_counts_only_complete_checkpoints(run: Path) -> None:
    (run / "checkpoints/step_9").mkdir()  # no DONE: not a checkpoint, not counted, not deleted
    assert prune_checkpoints(run, 1) == [run / "checkpoints/step_1"]
    assert entries(run) == ["step_2", "step_9"]


def test_write_failure_removes_the_temporary_directory_and_keeps_the_earlier_checkpoints(run: Path) -> None:
    def full_disk(d: Path) -> None:
        (d / "env_state.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointWriteError) as info:
        write_checkpoint(run, 3, full_disk, keep=1)
    err = info.value
    assert err.errno == errno.ENOSPC
    assert str(err).startswith(f"cannot write checkpoint {run / 'checkpoints' / 'step_3'}: No space left on device")
    assert "\n" not in str(err)
    assert isinstance(err.__cause__, OSError)
    assert entries(run) == ["step_1", "step_2"]  # nothing pruned, no temporary directory
    assert verify_checkpoint(run / "checkpoints/step_2") == 2


def test_torch_full_disk_error_is_reported_as_a_full_disk(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.save on a full disk raises RuntimeError("... unexpected pos ..."), not OSError: the free space tells
    def torch_save(d: Path) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(ck, "free_bytes", lambda path: 4096)
    with pytest.raises(CheckpointWriteError) as info:
        write_checkpoint(run, 3, torch_save)
    assert info.value.errno == errno.ENOSPC
    assert "no space left on the device (RuntimeError: [enforce fail" in str(info.value)
    assert "0.0 MiB free there" in str(info.value)
    assert entries(run) == ["step_1", "step_2"]

    monkeypatch.setattr(ck, "free_bytes", lambda path: 10 << 30)  # plenty of space: not called a full disk
    with pytest.raises(CheckpointWriteError) as info:
        write_checkpoint(run, 3, torch_save)
    assert info.value.errno == errno.EIO
    assert "no space" not in str(info.value) and "RuntimeError: [enforce fail" in str(info.value)


def test_interrupt_removes_the_temporary_directory_and_propagates(run: Path) -> None:
    def interrupted(d: Path) -> None:
        (d / "env_state.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(run, 3, interrupted)
    assert entries(run) == ["step_1", "step_2"]


def test_checkpoint_folder_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the folder should be")
    with pytest.raises(CheckpointWriteError, match="cannot write checkpoint"):
        write_checkpoint(tmp_path, 1, writer(1))


def test_write_text_atomic_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.mkdir()  # the rename onto a directory fails
    with pytest.raises(OSError):
        write_text_atomic(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    write_text_atomic(tmp_path / "ok.json", "{}")
    assert (tmp_path / "ok.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "ok.json"]


# ------------------------------------------------------------------------------------- verification

ADAPTER = "population/teacher_0/adapter_model.safetensors"


def _halve(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


DAMAGE = {
    # name: (how, the file the error must name, words of the reason)
    "half env_state": (lambda d: _halve(d / "env_state.json"), "env_state.json", "bytes"),
    "0-byte adapter": (lambda d: (d / ADAPTER).write_bytes(b""), ADAPTER, "0 bytes"),
    "same size, other bytes": (lambda d: _flip(d / ADAPTER), ADAPTER, "SHA-256"),
    "missing file": (lambda d: (d / "population/teacher_0/optimizer.pt").unlink(),
                     "population/teacher_0/optimizer.pt", "missing"),
    "directory instead of file": (lambda d: ((d / "env_state.json").unlink(), (d / "env_state.json").mkdir()),
                                  "env_state.json", "not a regular file"),
    "no DONE": (lambda d: (d / "DONE").unlink(), "DONE", "never completed"),
    "empty DONE": (lambda d: (d / "DONE").write_text(""), "DONE", "expected 2"),
    "no manifest": (lambda d: (d / "MANIFEST.json").unlink(), "MANIFEST.json", "cannot be verified"),
    "half manifest": (lambda d: _halve(d / "MANIFEST.json"), "MANIFEST.json", "unreadable"),
    "manifest of another step": (
        lambda d: (d / "MANIFEST.json").write_text(
            (d / "MANIFEST.json").read_text().replace('"step": 2', '"step": 1')),
        "MANIFEST.json", "for step 1"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_verify_names_the_damaged_file(run: Path, case: str) -> None:
    damage, rel, words = DAMAGE[case]
    d = run / "checkpoints/step_2"
    verify_checkpoint(d)
    damage(d)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(d)
    assert info.value.path == d / rel
    assert info.value.checkpoint == d
    assert words in info.value.reason
    assert str(d / rel) in str(info.value)

    # resume falls back to the newest intact checkpoint and says which file was damaged
    found = find_resumable(run)
    assert (found.step, found.path) == (1, run / "checkpoints/step_1")
    assert [e.path for e in found.skipped] == [d / rel]


def test_unreadable_file_is_damage(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = run / "checkpoints/step_2"
    real = ck.file_digest

    def digest(p: Path):
        if p.name == "optimizer.pt":
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real(p)

    monkeypatch.setattr(ck, "file_digest", digest)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(d)
    assert info.value.path == d / "population/teacher_0/optimizer.pt"
    assert info.value.reason == "unreadable (Permission denied)"


def test_files_outside_the_manifest_are_ignored(run: Path) -> None:
    (run / "checkpoints/step_2/notes.txt").write_text("added later")
    assert verify_checkpoint(run / "checkpoints/step_2") == 2


def test_no_intact_checkpoint_names_every_damaged_file(run: Path) -> None:
    _halve(run / "checkpoints/step_2/env_state.json")
    (run / "checkpoints/step_1" / ADAPTER).write_bytes(b"")
    with pytest.raises(NoIntactCheckpoint) as info:
        find_resumable(run)
    msg = str(info.value)
    assert str(run / "checkpoints/step_2/env_state.json") in msg
    assert str(run / "checkpoints/step_1" / ADAPTER) in msg
    assert [e.checkpoint.name for e in info.value.damaged] == ["step_2", "step_1"]


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    assert find_resumable(tmp_path) is None
    (tmp_path / "checkpoints/.tmp_step_1_123").mkdir(parents=True)  # a leftover is not a checkpoint
    assert find_resumable(tmp_path) is None
    assert cleanup_partial(tmp_path) == [tmp_path / "checkpoints/.tmp_step_1_123"]
    assert entries(tmp_path) == []


def test_set_aside_moves_damaged_checkpoints_out_of_the_list(run: Path) -> None:
    write_checkpoint(run, 3, writer(3), keep=0)
    (run / "checkpoints/step_3/env_state.json").write_text("")
    found = find_resumable(run)
    assert found.step == 2
    moved = set_aside(run, [e.checkpoint for e in found.skipped])
    assert moved == [run / "checkpoints/damaged/step_3"]
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]
    # the same step damaged again later replaces the earlier copy
    write_checkpoint(run, 3, writer(3), keep=0)
    (run / "checkpoints/step_3/DONE").unlink()
    set_aside(run, [run / "checkpoints/step_3"])
    assert not (run / "checkpoints/damaged/step_3/DONE").exists()
    # with keep=1 the next checkpoint prunes step_1 and step_2, never counting the damaged one
    write_checkpoint(run, 3, writer(3), keep=1)
    assert entries(run) == ["damaged", "step_3"]


# --------------------------------------------------------------------------------- kill at any moment

KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from selfplay import checkpoint as ck
    from test_checkpoint import writer

    run, point = Path(sys.argv[1]), sys.argv[2]
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    write = writer(3)
    if point == "tmp_created":
        write = die
    elif point == "mid_write":
        def write(d):
            (d / "env_state.json").write_text("{{}}")
            (d / "population").mkdir()
            die()
    elif point == "before_done":
        ck._mark_done = die
    elif point == "after_done":
        ck._publish = die
    elif point == "pruning":
        def remove_half(path):
            files = sorted(p for p in path.rglob("*") if p.is_file())
            for p in files[: len(files) // 2]:
                p.unlink()
            die()
        ck._remove_tree = remove_half
    ck.write_checkpoint(run, 3, write, keep=2)
    sys.exit("not killed")
""")

# point -> (checkpoint resumed from, what the kill left in checkpoints/ besides step_<n>)
KILL_POINTS = {
    "tmp_created": (2, "empty temporary directory"),
    "mid_write": (2, "half-written temporary directory"),
    "before_done": (2, "temporary directory without DONE"),
    "after_done": (2, "complete temporary directory not yet renamed"),
    "pruning": (3, "half-deleted old checkpoint under a temporary name"),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_kill_9_during_a_checkpoint_write(run: Path, point: str) -> None:
    p = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(tests=str(Path(__file__).parent)), str(run), point],
                       capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=120)
    assert p.returncode == -9, (p.returncode, p.stderr[-2000:])
    resumed_from, _left = KILL_POINTS[point]
    leftovers = [n for n in entries(run) if n.startswith(".tmp_")]
    assert len(leftovers) == 1, entries(run)
    tmp = run / "checkpoints" / leftovers[0]
    # the kill happened where it was meant to
    if point == "tmp_created":
        assert list(tmp.iterdir()) == []
    elif point == "mid_write":
        assert sorted(x.name for x in tmp.iterdir()) == ["env_state.json", "population"]
    elif point == "before_done":
        assert (tmp / "MANIFEST.json").is_file() and not (tmp / "DONE").exists()
    elif point == "after_done":
        assert (tmp / "DONE").read_text() == "3" and not (run / "checkpoints/step_3").exists()
    else:
        assert tmp.name.startswith(".tmp_prune_step_1_") and not (run / "checkpoints/step_1").exists()
        assert (run / "checkpoints/step_3/DONE").is_file()

    found = find_resumable(run)
    assert found.step == resumed_from and found.skipped == ()
    assert cleanup_partial(run) == [tmp]
    expected = ["step_2", "step_3"] if point == "pruning" else ["step_1", "step_2"]
    assert entries(run) == expected
    for name in expected:
        verify_checkpoint(run / "checkpoints" / name)
    # the run goes on: the next checkpoint is written and pruned as usual
    write_checkpoint(run, 4, writer(4), keep=2)
    assert entries(run) == [expected[-1], "step_4"]


# ------------------------------------------------------------------------------------- final adapters


class _Population:
    """Just what ``save_adapters`` uses: member names and ``save(name, directory)``; fails on ``fail_on``."""

    def __init__(self, names: list[str], fail_on: str | None = None) -> None:
        self.names, self.fail_on = names, fail_on

    def save(self, name: str, directory: Path) -> None:
        if name == self.fail_on:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        directory.mkdir(parents=True)
        (directory / "adapter_model.safetensors").write_text(f"new {name}")


class _Loop:
    def __init__(self, population: _Population) -> None:
        self.population = population


def test_final_adapters_are_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selfplay import run as run_mod
    from selfplay.checkpoint import WriteFailed

    adapters = tmp_path / "adapters"
    (adapters / "old").mkdir(parents=True)
    (adapters / "old" / "adapter_model.safetensors").write_text("old")
    monkeypatch.setattr(run_mod, "free_bytes", lambda path: 0)  # a full disk
    with pytest.raises(WriteFailed) as info:
        run_mod.save_adapters(_Loop(_Population(["a", "b"], fail_on="b")), adapters)
    assert str(info.value).startswith(f"cannot write the final adapters {adapters}: no space left on the device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapters"]  # no temporary directory left
    assert (adapters / "old" / "adapter_model.safetensors").read_text() == "old"  # the earlier ones untouched

    run_mod.save_adapters(_Loop(_Population(["a", "b"])), adapters)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapters"]
    assert sorted(p.name for p in adapters.iterdir()) == ["a", "b"]  # replaced as a whole
    assert (adapters / "b" / "adapter_model.safetensors").read_text() == "new b"
