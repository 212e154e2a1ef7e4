"""Resume of real ``tiny-random`` runs, end to end (the ``populora`` command in subprocesses).

Every interrupted or damaged run below is continued with ``populora train --resume`` and must then equal the
uninterrupted run ``tiny_run`` (conftest: 4 steps, a checkpoint after each, pruned to 2, PBT at steps 2 and 4):
the same final adapters, the same checkpoints (weights, env state with ratings, buffers and RNG, PBT state, the
loop's counters and history), the same lineage, and every TensorBoard scalar at every step exactly once with the
same value. The chains kill the run (``kill -9`` of its process group) at chosen instants of a checkpoint write
(tests/selfplay/fault_plugin.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from evaluation.report import load_scalars
from selfplay import tags
from selfplay.checkpoint import verify_checkpoint
from tests.conftest import built_once
from tests.selfplay.conftest import REF_ARGS, REPO, cli_env, populora, populora_watched

PLUGIN = str(REPO / "tests" / "selfplay" / "fault_plugin.py")
TIMED = (tags.TIME_PREFIX, tags.STEP_SECONDS)  # wall-clock values: differ between any two runs


def _weights(d: Path) -> dict[str, dict]:
    return {m.name: load_file(str(m / "adapter_model.safetensors")) for m in sorted(d.iterdir()) if m.is_dir()}


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for member in wa:
        assert wa[member].keys() == wb[member].keys()
        for k in wa[member]:
            assert (wa[member][k] == wb[member][k]).all(), f"{b}: {member} {k} differs"


def _untimed(obj):
    """``obj`` without wall-clock fields (``seconds``, ``step_seconds``, ``totals``)."""
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in ("seconds", "step_seconds", "totals")}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def _lineage(run: Path) -> list[dict]:
    return [_untimed(json.loads(ln)) for ln in (run / "lineage.jsonl").read_text().splitlines()]


def assert_equal_runs(ref: Path, run: Path, lost_checkpoint_time: tuple[int, ...] = ()) -> None:
    """``run`` (interrupted, then resumed) ended exactly where the uninterrupted ``ref`` did. ``lost_checkpoint_time``:
    steps whose run was killed after their checkpoint was in place, before its duration was logged."""
    _same_weights(ref / "adapters", run / "adapters")
    names = sorted(p.name for p in (ref / "checkpoints").iterdir())
    assert names == ["step_3", "step_4"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "damaged") == names
    for name in names:
        a, b = ref / "checkpoints" / name, run / "checkpoints" / name
        verify_checkpoint(b)
        _same_weights(a / "population", b / "population")
        for f in ("env_state.json", "pbt_state.json", "loop_state.json"):
            assert _untimed(json.loads((a / f).read_text())) == _untimed(json.loads((b / f).read_text())), f"{b / f}"
    assert _lineage(run) == _lineage(ref)
    assert len(_lineage(ref)) == 4
    # TensorBoard: each step once per tag (the resumed writer purged what the killed one logged after the checkpoint,
    # and kept what it logged up to it), with the uninterrupted run's values
    sa, sb = load_scalars(ref), load_scalars(run)
    assert sa.keys() == sb.keys()
    for tag in sa:
        steps = [s for s, _ in sa[tag]]
        if tag == tags.time("checkpoint"):  # logged after its checkpoint: lost when the kill falls in between
            steps = [s for s in steps if s not in lost_checkpoint_time]
        assert [s for s, _ in sb[tag]] == steps, tag
        if not tag.startswith(TIMED):
            assert sb[tag] == sa[tag], tag
    assert [s for s, _ in sa[tags.TEACHER_REWARD]] == [1, 2, 3, 4]


def _launch(args: list[str], kill: str | None) -> subprocess.CompletedProcess:
    """Run ``populora ARGS`` in its own session (the fault plugin kills the whole group: trainer and sandbox)."""
    env = cli_env()
    env.pop("POPULORA_TEST_KILL", None)
    if kill:
        env["POPULORA_TEST_KILL"] = kill
    return subprocess.run([sys.executable, "-m", "populora_cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=900, start_new_session=True)


def _checkpoint_entries(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def _assert_killed_at(run: Path, point: str, step: int) -> None:
    """The kill left what that instant of the write leaves."""
    names = _checkpoint_entries(run)
    tmp = [n for n in names if n.startswith(".tmp_")]
    assert len(tmp) == 1, names
    t = run / "checkpoints" / tmp[0]
    if point == "pruning":
        assert tmp[0].startswith(f".tmp_prune_step_{step - 2}_")
        assert [n for n in names if not n.startswith(".")] == [f"step_{step - 1}", f"step_{step}"]
        return
    assert tmp[0].startswith(f".tmp_step_{step}_") and f"step_{step}" not in names
    if point == "tmp_created":
        assert list(t.iterdir()) == []
    elif point == "mid_population":
        assert len([p for p in (t / "population").iterdir() if p.is_dir()]) == 2
        assert not (t / "population" / "population.json").exists() and not (t / "env_state.json").exists()
    elif point == "before_done":
        assert (t / "MANIFEST.json").is_file() and not (t / "DONE").exists()
    elif point == "after_done":
        assert (t / "DONE").read_text() == str(step)


# (kill point, checkpoint step) per run of a chain; each resume continues from the newest intact checkpoint
CHAINS = {
    "mid_population+pruning": [("mid_population", 2), ("pruning", 3)],
    "tmp_created+before_done+after_done": [("tmp_created", 2), ("before_done", 3), ("after_done", 4)],
}


@pytest.mark.parametrize("chain", [
    "mid_population+pruning",
    pytest.param("tmp_created+before_done+after_done", marks=pytest.mark.slow),
])
def test_kill_9_during_checkpoint_writes_then_resume_equals_uninterrupted(
        tiny_run: Path, tmp_path: Path, chain: str) -> None:
    run = tmp_path / "killed"
    _kill_chain(run, ["train", *REF_ARGS, "--plugins", PLUGIN, "--run-dir", str(run)], CHAINS[chain])
    assert_equal_runs(tiny_run, run, tuple(step for point, step in CHAINS[chain] if point == "pruning"))


def _kill_chain(run: Path, first: list[str], chain: list[tuple[str, int]]) -> None:
    """Run ``populora FIRST`` killed at ``chain[0]``, resume it killed at each later (point, step) of ``chain``,
    then resume it to its end; checks what each kill left and where each resume continued from."""
    resume = ["train", "--resume", str(run), "--plugins", PLUGIN, "--no-progress"]  # the run's plugin, named again
    expected_resume: int | None = None
    dropped = 0  # lineage lines the next resume must drop (written after the checkpoint it resumes from)
    for i, (point, step) in enumerate(chain):
        p = _launch(first if i == 0 else resume, f"{point}@{step}")
        assert p.returncode == -9, (point, p.returncode, p.stderr[-3000:])
        if expected_resume is not None:
            _assert_resumed(p.stderr, run, expected_resume, dropped)
        _assert_killed_at(run, point, step)
        expected_resume = step if point == "pruning" else step - 1
        lineage_steps = [json.loads(ln)["step"] for ln in (run / "lineage.jsonl").read_text().splitlines()]
        dropped = sum(s > expected_resume for s in lineage_steps)
        if i == 0:
            assert dropped == 2  # the step-2 events, logged before checkpoint 2 was killed: the drop branch runs
    p = _launch(resume, None)
    assert p.returncode == 0, p.stderr[-3000:]
    _assert_resumed(p.stderr, run, expected_resume, dropped)
    assert not [n for n in _checkpoint_entries(run) if n.startswith(".")]  # leftovers cleaned up


# every instant of a checkpoint write the fault plugin kills at, in one chain: kills during checkpoint 2's write
# (resumed from 1), then during checkpoint 3's (resumed from 2), the last while step_1 is deleted (resumed from 3)
EVERY_PHASE = [("tmp_created", 2), ("mid_population", 2), ("before_done", 3), ("after_done", 3), ("pruning", 3)]
ASYNC = ["--pipeline.max-staleness", "1", "--generation.threads", "1"]


@pytest.fixture(scope="session")
def tiny_async_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_run`` with a staleness of 1 (an asynchronous run), uninterrupted. Shared: copy it to change it."""
    def build(root: Path) -> None:
        p = populora("train", *REF_ARGS, *ASYNC, "--run-dir", str(root / "ref"))
        assert p.returncode == 0, p.stderr[-4000:]

    return built_once(tmp_path_factory, "tiny_async_run", build) / "ref"


def _same_state_files(a: Path, b: Path) -> None:
    """Checkpoints ``a`` and ``b`` hold the same files, byte for byte; ``loop_state.json`` but for its wall-clock
    totals (and so ``MANIFEST.json`` but for that file's size and hash)."""
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()), b
    for name in files:
        x, y = (json.loads((d / name).read_text()) if name in ("loop_state.json", "MANIFEST.json")
                else (d / name).read_bytes() for d in (a, b))
        if name == "MANIFEST.json":
            x["files"].pop("loop_state.json")
            y["files"].pop("loop_state.json")
        assert _untimed(x) == _untimed(y), f"{b / name} differs from {a / name}"


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_kill_at_every_checkpoint_phase_then_resume_gives_the_uninterrupted_state_files(
        request: pytest.FixtureRequest, tmp_path: Path, mode: str) -> None:
    """Issue 48: ``kill -9`` at each instant of a checkpoint write, one after the other, each followed by a resume;
    the run (in a folder named with a space and non-ASCII characters) ends with the uninterrupted run's adapters,
    lineage and TensorBoard values and, in each checkpoint, its state files byte for byte: the env's (ratings,
    buffers, RNG), the PBT controller's, the loop's, an asynchronous run's ``pipeline_state.json`` and older
    adapter versions (its rating resets: applied or due alike)."""
    from tests.selfplay import fault_plugin

    assert tuple(point for point, _ in EVERY_PHASE) == fault_plugin.POINTS
    ref = request.getfixturevalue("tiny_run" if mode == "sync" else "tiny_async_run")
    run = tmp_path / "run dir ü 日本"
    _kill_chain(run, ["train", *REF_ARGS, *(ASYNC if mode == "async" else []), "--plugins", PLUGIN,
                      "--run-dir", str(run)], EVERY_PHASE)
    assert_equal_runs(ref, run, (3,))
    for name in ("step_3", "step_4"):
        _same_state_files(ref / "checkpoints" / name, run / "checkpoints" / name)
    assert (mode == "async") == (run / "checkpoints" / "step_4" / "pipeline_state.json").is_file()


def _assert_resumed(stderr: str, run: Path, step: int, dropped: int) -> None:
    assert f"resumed {run} from checkpoint step {step}" in stderr, stderr[-3000:]
    line = f"lineage: dropped {dropped} line(s) written after checkpoint step {step}"
    assert (line in stderr) == (dropped > 0), stderr[-3000:]


def test_lineage_truncation_keeps_the_lines_up_to_the_checkpoint(tmp_path: Path) -> None:
    """Resuming from checkpoint 2 keeps the lineage lines of steps <= 2 and drops later ones, a line cut short by
    a kill included (unit level; the chains above run it end to end)."""
    from selfplay.resume import truncate_lineage

    lines = [json.dumps({"step": s, "role": r}) for s, r in ((2, "student"), (2, "teacher"), (4, "teacher"))]
    path = tmp_path / "lineage.jsonl"
    path.write_text("\n".join(lines) + '\n\n{"step": 4, "role": "stu')
    truncate_lineage(tmp_path, 4)  # nothing after step 4 that parses: only the broken line goes
    assert path.read_text() == "\n".join(lines) + "\n"
    truncate_lineage(tmp_path, 2)
    assert path.read_text() == "\n".join(lines[:2]) + "\n"
    mtime = path.stat().st_mtime_ns
    truncate_lineage(tmp_path, 3)  # nothing to drop: the file is not rewritten
    assert path.stat().st_mtime_ns == mtime
    truncate_lineage(tmp_path, 1)
    assert path.read_text() == ""


def _resumable_dir(run: Path) -> Path:
    """A run directory as a run killed before its first checkpoint leaves it: ``config.json`` written."""
    from selfplay.config import TrainConfig, to_dict

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps({"name": run.name, "config": to_dict(TrainConfig())}))
    return run


def test_resume_without_a_checkpoint_drops_the_whole_lineage(tmp_path: Path) -> None:
    """A run killed before its first checkpoint restarts from step 0: lineage lines it wrote would be repeated."""
    from selfplay.config import TrainConfig
    from selfplay.resume import resume_point

    run = _resumable_dir(tmp_path / "run")
    (run / "lineage.jsonl").write_text(json.dumps({"step": 2, "role": "teacher"}) + "\n")
    (run / "checkpoints" / ".tmp_step_3_99").mkdir(parents=True)  # the write the kill interrupted
    with resume_point(TrainConfig(resume=run)) as point:
        assert (point.run_dir, point.resuming, point.checkpoint) == (run, True, None)
    assert (run / "lineage.jsonl").read_text() == ""
    assert list((run / "checkpoints").iterdir()) == []


def test_resume_point_decides_once_and_holds_the_lock(tmp_path: Path) -> None:
    """A new run's directory is created and locked (the lock file names the command; tests/selfplay/test_run_lock.py
    runs the second writer it refuses); a new run in a directory that holds one is refused; a resumed one is
    checked and continues from step 0 when it has no checkpoint."""
    from selfplay.config import TrainConfig
    from selfplay.resume import resume_point
    from selfplay.rundir import RunDirError, lock_holder

    new = tmp_path / "new"
    with resume_point(TrainConfig(run_dir=new), command="baseline") as point:
        assert (point.run_dir, point.resuming, point.checkpoint) == (new, False, None)
        assert new.is_dir() and list(new.iterdir()) == [new / ".lock"]
        assert '"command": "baseline"' in (new / ".lock").read_text()
    assert lock_holder(new) is None
    run = _resumable_dir(tmp_path / "old")
    with pytest.raises(RunDirError, match="already holds a run"):
        with resume_point(TrainConfig(run_dir=run)):
            pass
    with resume_point(TrainConfig(resume=run)) as point:
        assert point.resuming and point.checkpoint is None


# ------------------------------------------------------------------------------------- damaged checkpoints


def _halve(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


@pytest.mark.parametrize(("damaged", "damage"), [
    ("env_state.json", _halve),
    # the same path end to end; every kind of damage is covered fast in test_checkpoint.py
    pytest.param("population/teacher_1/adapter_model.safetensors", lambda p: p.write_bytes(b""),
                 marks=pytest.mark.slow),
])
def test_damaged_newest_checkpoint_is_named_and_the_intact_one_used(
        tiny_run: Path, tmp_path: Path, damaged: str, damage) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    bad = run / "checkpoints" / "step_4" / damaged
    damage(bad)
    p = populora("train", "--resume", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"checkpoint step_4 is damaged, skipped: {bad}: " in p.stderr
    assert f"resumed {run} from checkpoint step 3" in p.stderr
    assert "lineage: dropped 2 line(s) written after checkpoint step 3" in p.stderr  # the step-4 events
    assert "Traceback" not in p.stderr
    assert (run / "checkpoints" / "damaged" / "step_4" / damaged).is_file()  # set aside, not used, not counted
    assert_equal_runs(tiny_run, run)


def test_no_intact_checkpoint_exits_2_naming_the_files_before_loading_the_model(
        tiny_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    _halve(run / "checkpoints/step_4/env_state.json")
    (run / "checkpoints/step_3/population/student_0/adapter_model.safetensors").write_bytes(b"")
    p, model_loads = populora_watched("train", "--resume", str(run), "--no-progress")
    assert p.returncode == 2, p.stderr[-3000:]
    assert model_loads == []
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"populora train: error: {run / 'checkpoints'}: no intact checkpoint to resume from (")
    assert str(run / "checkpoints/step_4/env_state.json") in last
    assert str(run / "checkpoints/step_3/population/student_0/adapter_model.safetensors") in last
    assert "Traceback" not in p.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_3", "step_4"]


# ------------------------------------------------------------------------------------------ full disk


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 900 KiB tmpfs: room for a run's first checkpoint (~600 KiB with optimizer states), not a second.
    Needs root (or CAP_SYS_ADMIN): skipped elsewhere; tests/selfplay/test_checkpoint.py covers a full disk by an
    injected ENOSPC on every machine."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=900k", "tmpfs", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_disk_full_during_a_checkpoint_exits_2_and_the_run_resumes_after(
        tiny_run: Path, small_tmpfs: Path) -> None:
    run = small_tmpfs / "run"
    p = populora("train", *REF_ARGS, "--run-dir", str(run))
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.lower().startswith(f"populora train: error: cannot write checkpoint {run / 'checkpoints/step_2'}: "
                                   "no space left on"), last
    assert last.endswith(f"; continue it with --resume {run}"), last
    # the last good checkpoint survived, and no temporary directory was left
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    verify_checkpoint(run / "checkpoints" / "step_1")
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp")]
    # with room again the run continues from step 1 and ends where the uninterrupted one did
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True)
    p = populora("train", "--resume", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed {run} from checkpoint step 1" in p.stderr
    assert_equal_runs(tiny_run, run)
