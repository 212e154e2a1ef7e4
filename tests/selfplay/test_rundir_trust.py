"""A run directory from someone else (``selfplay.rundir``'s trust model): reading it with ``populora report``,
``eval``, ``compare`` or ``--resume`` never runs its code, never exhausts the stack, never loops on its values and
never writes outside it. Every case is a crafted directory in a temporary folder; the end-to-end resume cases copy
the shared ``tiny_run`` first."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from selfplay.checkpoint import (
    CheckpointError,
    NoIntactCheckpoint,
    find_resumable,
    verify_checkpoint,
    write_checkpoint,
    write_manifest,
)
from selfplay.config import TrainConfig, to_dict
from selfplay.rundir import (
    LOCK_NAME,
    RunDir,
    RunDirError,
    UnsafeRunFile,
    check_resume_dir,
    run_lock,
    write_text_atomic,
)
from tests.selfplay.conftest import REPO, cli_env, populora, populora_watched
from tests.selfplay.test_checkpoint import writer

DEEP = "[" * 100_000 + "]" * 100_000


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed) with its type, size, mtime (ns) and content."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                         p.read_bytes() if p.is_file() and not p.is_symlink() else None)
    return out


def _resumable(run: Path, **config) -> Path:
    """A run directory as a run killed before its first checkpoint leaves it: ``config.json`` only."""
    run.mkdir(parents=True, exist_ok=True)
    cfg = to_dict(TrainConfig(model="tiny-random", **config))
    (run / "config.json").write_text(json.dumps({"name": run.name, "arm": "population", "config": cfg}))
    return run


# ------------------------------------------------------------------------------------------ bounded JSON


@pytest.mark.parametrize("name", ["config.json", "run_summary.json", "eval/results.json"])
def test_a_deeply_nested_json_file_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(DEEP)
    run = RunDir(tmp_path)
    read = {"config.json": run.config, "run_summary.json": run.summary, "eval/results.json": run.eval_results}[name]
    with pytest.raises(UnsafeRunFile, match=f"^{tmp_path / name}: nests deeper than 100 levels$"):
        read()


def test_a_deeply_nested_lineage_line_is_refused_naming_it_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "lineage.jsonl").write_text('{"step": 1, "role": "teacher"}\n' + DEEP + "\n")
    with pytest.raises(UnsafeRunFile, match=rf"^{tmp_path / 'lineage.jsonl'}, line 2: nests deeper"):
        RunDir(tmp_path).lineage()
    (tmp_path / "lineage.jsonl").write_text('{"a": ' * 101 + "1" + "}" * 101)  # within json's own limit
    with pytest.raises(UnsafeRunFile):
        RunDir(tmp_path).lineage()


def test_report_on_a_deep_config_json_exits_2_naming_it(tmp_path: Path) -> None:
    from tests.evaluation.test_report import _write_run_c

    run = _write_run_c(tmp_path)
    (run / "config.json").write_text(DEEP)
    p = populora("report", str(run), timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        f"populora report: error: RUNS: {run / 'config.json'}: nests deeper than 100 levels")
    assert not (run / "report").exists()


# ------------------------------------------------------------------------------------ lineage: steps, linear


def test_lineage_records_with_steps_out_of_range_are_skipped_with_a_note(tmp_path: Path) -> None:
    """A step of -1e15 made the report's retention loop run for ever; NaN, strings, bools, floats and steps past
    the configured ``steps`` are skipped too, each counted in one note; a torn line in another."""
    _resumable(tmp_path, steps=12)
    good = [{"step": 4, "role": "teacher", "culled": "teacher_2", "operator": "dare"},
            {"step": 12, "role": "student", "culled": "student_1", "operator": "dare"}]
    bad = [-1, -10**15, 13, 10**30, 4.0, "4", True, None]
    lines = [json.dumps(r) for r in good] + [json.dumps({"step": s, "role": "teacher", "culled": "x"}) for s in bad]
    lines += ['{"step": NaN, "role": "teacher"}', '{"step": -Infinity}', '{"role": "teacher"}', '{"step": 5, "ro']
    (tmp_path / "lineage.jsonl").write_text("\n".join(lines) + "\n")
    run = RunDir(tmp_path)
    assert run.lineage() == good
    assert run.notes == ["1 malformed line(s) in lineage.jsonl skipped (a write in progress?).",
                         "11 record(s) of lineage.jsonl without an integer step in 0..12 skipped."]


def test_retention_of_a_crafted_lineage_ends_and_shares_duplicate_children(tmp_path: Path) -> None:
    """``children`` over the report's run C with its lineage repeated 2,000 times and a record at step -1e15:
    the same children as once, repeated (a quadratic or step-by-step walk would not finish in the test's time)."""
    from evaluation.report import load_run
    from evaluation.report.numerics import children
    from tests.evaluation.test_report import LINEAGE_C, _write_run_c

    run = _write_run_c(tmp_path)
    once = [(c.step, c.role, c.slot, c.operator, c.culled_rank, c.ranks) for c in children(load_run(run))]
    crafted = [{"step": -10**15, "role": "teacher", "culled": "teacher_2", "operator": "dare"}] + LINEAGE_C * 2000
    (run / "lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in crafted))
    data = load_run(run)
    got = [(c.step, c.role, c.slot, c.operator, c.culled_rank, c.ranks) for c in children(data)]
    assert got == once * 2000
    assert any("1 record(s) of lineage.jsonl without an integer step" in n for n in data.notes)


# --------------------------------------------------------------------------------------- links: report


def _report_run(tmp_path: Path) -> tuple[Path, Path]:
    from tests.evaluation.test_report import _write_run_c

    runs = tmp_path / "runs"
    runs.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious")
    return _write_run_c(runs), outside


def test_report_replaces_a_planted_file_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    from evaluation.report import make_report

    run, outside = _report_run(tmp_path)
    (run / "report").mkdir()
    for name in ("ratings.png", "solve_rate.png", "summary.md", "figures.json", ".summary.md.tmp"):
        (run / "report" / name).symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    out = make_report([run])
    assert snapshot(outside) == before
    for name in ("ratings.png", "summary.md", "figures.json"):  # written (run C logs no solve rate)
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


@pytest.mark.parametrize("planted", ["report", "config.json", "events"])
def test_report_refuses_a_link_out_of_the_run_and_writes_nothing_outside(tmp_path: Path, planted: str) -> None:
    run, outside = _report_run(tmp_path)
    if planted == "report":  # the report would write its 14 files into outside/
        (run / "report").symlink_to(outside)
    elif planted == "config.json":  # the report would read a file from outside the run
        (outside / "config.json").write_text("{}")
        (run / "config.json").unlink()
        (run / "config.json").symlink_to(outside / "config.json")
    else:
        (run / "events.out.tfevents.0.elsewhere").symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    p = populora("report", str(run), timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(f"populora report: error: RUNS: {run}/") and ("symbolic link" in line), line
    assert snapshot(outside) == before


def test_compare_and_eval_refuse_links_out_of_the_run(tmp_path: Path) -> None:
    from evaluation.compare import read_run
    from evaluation.runner import _adapter_dirs

    run, outside = _report_run(tmp_path)
    (run / "run_summary.json").symlink_to(outside / "victim.txt")
    with pytest.raises(UnsafeRunFile, match="run_summary.json: is a symbolic link out of the run directory"):
        read_run(run)
    (run / "adapters").mkdir()
    (outside / "member").mkdir()
    (outside / "member" / "adapter_config.json").write_text("{}")
    (run / "adapters" / "member").symlink_to(outside / "member")
    with pytest.raises(UnsafeRunFile, match="adapters/member: is a symbolic link out of the run directory"):
        _adapter_dirs(RunDir(run))


def test_compare_from_a_crafted_run_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from populora_cli.compare_command import compare_main

    run = _resumable(tmp_path / "run")
    (run / "run_summary.json").write_text(DEEP)
    assert compare_main(["--from", str(run), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"populora compare: error: {run / 'run_summary.json'}: nests deeper than 100 levels")


def test_eval_output_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    from evaluation.progress import ResultLog

    run, outside = _report_run(tmp_path)
    (run / "eval").symlink_to(outside)
    with pytest.raises(UnsafeRunFile, match="eval: is a symbolic link"):
        RunDir(run).subdir("eval", create=False)
    (run / "eval").unlink()
    (run / "eval" / "generations").mkdir(parents=True)
    (run / "eval" / "generations" / "humaneval.jsonl").symlink_to(outside / "victim.txt")
    log = ResultLog(run / "eval", {"common": {}})
    log.begin()
    with pytest.raises(UnsafeRunFile, match="humaneval.jsonl: is a symbolic link"):
        log.append("humaneval", [{"entry": "member:a", "task_id": "t"}])
    assert (outside / "victim.txt").read_text() == "precious"


def test_atomic_writes_never_write_through_a_planted_temporary_name(tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("precious")
    for i in range(50):  # whatever random name the temporary file gets, nothing planted is opened
        (tmp_path / f".config.json.tmp{i:012x}").symlink_to(tmp_path / "victim")
    (tmp_path / "config.json").symlink_to(tmp_path / "victim")
    write_text_atomic(tmp_path / "config.json", "{}")
    assert (tmp_path / "victim").read_text() == "precious"
    assert not (tmp_path / "config.json").is_symlink() and (tmp_path / "config.json").read_text() == "{}"


# -------------------------------------------------------------------------------- links: the run's writers


def test_a_linked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    run = _resumable(tmp_path / "run")
    (tmp_path / "victim").write_text("precious")
    (run / LOCK_NAME).symlink_to(tmp_path / "victim")
    with pytest.raises(RunDirError, match=r"\.lock is a symbolic link"), run_lock(run):
        pass
    with pytest.raises(RunDirError, match=r"\.lock is a symbolic link"):
        check_resume_dir(run)
    assert (tmp_path / "victim").read_text() == "precious"


def test_resume_refuses_a_linked_checkpoints_folder_and_keeps_its_leftovers(tmp_path: Path) -> None:
    from selfplay.resume import resume_point

    run = _resumable(tmp_path / "run")
    outside = tmp_path / "outside"
    (outside / ".tmp_step_3_99").mkdir(parents=True)  # resume removes the leftovers of interrupted writes
    (run / "checkpoints").symlink_to(outside)
    with pytest.raises(RunDirError, match=r"checkpoints is a symbolic link"):
        with resume_point(TrainConfig(model="tiny-random", resume=run)):
            pass
    assert (outside / ".tmp_step_3_99").is_dir()


def test_checkpoint_files_and_step_folders_that_are_links_are_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_checkpoint(run, 1, writer(1), keep=0)
    d = write_checkpoint(run, 2, writer(2), keep=0)
    (tmp_path / "env.json").write_bytes((d / "env_state.json").read_bytes())
    (d / "env_state.json").unlink()
    (d / "env_state.json").symlink_to(tmp_path / "env.json")  # same bytes, same hash: still refused
    found = find_resumable(run)
    assert found.step == 1 and "symbolic link" in found.skipped[0].reason
    (run / "checkpoints" / "step_9").symlink_to(run / "checkpoints" / "step_1")  # not a checkpoint at all
    assert find_resumable(run).step == 1
    manifest = json.loads((d / "MANIFEST.json").read_text())
    manifest["files"]["../../outside"] = {"size": 0, "sha256": "0" * 64}
    (d / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="'../../outside', which is not a path inside the checkpoint"):
        verify_checkpoint(d)


# ------------------------------------------------------------------------------------- new runs, plugins


def test_train_into_a_non_empty_directory_that_is_no_run_exits_2_writing_nothing(cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(home)
    before = snapshot(tmp_path)
    rc, err = cli("train", "--model", "tiny-random", "--run-dir", str(link), "--no-progress")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"populora train: error: run directory {link} is not empty and holds no run (notes.txt): a new run needs a "
        "new or empty directory; choose another --run-dir")
    assert snapshot(tmp_path) == before


def test_resume_never_imports_a_plugin_the_command_line_did_not_name(cli, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    plugin = tmp_path / "evil.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run = _resumable(tmp_path / "run", plugins=(str(plugin),))
    rc, err = cli("train", "--resume", str(run), "--dry-run")
    assert rc == 2 and not marker.exists()
    assert err.strip().splitlines()[-1] == (
        f"populora train: error: --resume: {run / 'config.json'} names the plugin(s) {plugin}; a run's plugins are "
        f"imported only when named on the command line: if you trust them, add --plugins {plugin}")
    rc, err = cli("train", "--resume", str(run), "--dry-run", "--plugins", str(plugin))  # named: imported
    assert rc == 0 and marker.read_text() == "ran", err[-2000:]


@pytest.mark.parametrize(("text", "key"), [('{"model": "tiny-random", "seed": 1, "seed": 2}', "seed"),
                                           ('{"model": "tiny-random", "trainer": {"lr": 0.1, "lr": 0.2}}', "lr")])
def test_a_preset_with_a_duplicate_key_exits_2_naming_it(cli, tmp_path: Path, text: str, key: str) -> None:
    preset = tmp_path / "p.json"
    preset.write_text(text)
    rc, err = cli("train", "--preset", str(preset), "--run-dir", str(tmp_path / "run"), "--dry-run")
    assert rc == 2 and not (tmp_path / "run").exists()
    assert err.strip().splitlines()[-1] == (
        f"populora train: error: --preset: {preset} holds the key {key!r} twice in one object")


def test_resume_reads_config_json_once(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line reads and compares the saved configuration; ``selfplay.resume`` uses what it read."""
    import selfplay.rundir

    run = _resumable(tmp_path / "run")
    reads: list[Path] = []
    real = selfplay.rundir.read_json

    def counted(path, *args, **kwargs):
        reads.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(selfplay.rundir, "read_json", counted)
    with pytest.raises(AssertionError, match="the model was loaded"):  # past resume_point: the loop sets up
        cli("train", "--resume", str(run), "--no-progress")
    assert reads.count(run / "config.json") == 1


# ----------------------------------------------------------------------------------- checkpoint contents

_MARKER_PICKLE = """
import os, pickle, sys
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
with open(sys.argv[1], "wb") as f:
    pickle.dump({"torch_rng": Evil()}, f)
"""


def _crafted_pickle(path: Path, marker: Path) -> None:
    """A pickle whose loading would create ``marker``."""
    subprocess.run([sys.executable, "-c", _MARKER_PICKLE, str(path), str(marker)], check=True)


def _checkpoint_dir(tmp_path: Path, loop_state: dict, legacy_rng: bytes | None = None) -> Path:
    d = tmp_path / "checkpoints" / "step_4"
    d.mkdir(parents=True)
    (d / "loop_state.json").write_text(json.dumps(loop_state))
    if legacy_rng is not None:
        (d / "torch_rng.pt").write_bytes(legacy_rng)
    write_manifest(d, 4)
    (d / "DONE").write_text("4")
    return d


def _loop_state() -> dict:
    import random

    import numpy as np
    import torch

    from selfplay.resume import _np_state_to_json

    return {"step": 4, "totals": {"time/update": 1.5}, "history": [{"step": 4}], "python_rng": repr(random.getstate()),
            "numpy_rng": _np_state_to_json(np.random.get_state()),
            "torch_rng": torch.get_rng_state().numpy().tobytes().hex()}


@pytest.mark.parametrize(("field", "value"), [
    ("step", "1; rm"), ("step", 3), ("step", True), ("totals", {"time/x": "NaN"}), ("history", [1]),
    ("python_rng", "garbage"), ("python_rng", "(3, (1, 2), None)"), ("python_rng", "(" * 5000 + ")" * 5000),
    ("python_rng", "x" * 100_000), ("python_rng", "__import__('os').system('true')"),
    ("numpy_rng", ["MT19937", [1, 2, 3], 0, 0, 0.0]), ("numpy_rng", ["MT19937", [-1] * 624, 0, 0, 0.0]),
    ("numpy_rng", "short"), ("torch_rng", "zz"), ("torch_rng", "00" * 16), ("torch_rng", None),
])
def test_crafted_loop_state_values_are_a_checkpoint_error_naming_the_field(tmp_path: Path, field: str, value) -> None:
    from selfplay.resume import read_loop_state

    state = _loop_state()
    if value is None:
        del state[field]
    else:
        state[field] = value
    d = _checkpoint_dir(tmp_path, state)
    with pytest.raises(CheckpointError) as info:
        read_loop_state(d)
    assert info.value.path == d / "loop_state.json" and info.value.reason.startswith(f"field {field!r}: ")
    with pytest.raises(NoIntactCheckpoint, match=f"loop_state.json: field '{field}'"):  # the only one: none left
        find_resumable(tmp_path, check=read_loop_state)


@pytest.mark.parametrize("names", [["../../outside"], ["/abs"], ["linked"], "teacher_0", [1], ["missing"]])
def test_member_names_that_lead_out_of_the_checkpoint_are_refused(tmp_path: Path, names) -> None:
    """``population/population.json`` names the member folders the population loads: none may be elsewhere."""
    from selfplay.resume import check_checkpoint

    d = _checkpoint_dir(tmp_path, _loop_state())
    (d / "population" / "teacher_0").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (d / "population" / "linked").symlink_to(tmp_path / "elsewhere")
    (d / "population" / "population.json").write_text(json.dumps({"names": ["teacher_0"]}))
    check_checkpoint(d)
    (d / "population" / "population.json").write_text(json.dumps({"names": names}))
    with pytest.raises(CheckpointError, match="'names' is not a list of the member folders beside it"):
        check_checkpoint(d)


def test_the_loop_state_round_trips_and_the_legacy_torch_rng_file_still_resumes(tmp_path: Path) -> None:
    """A checkpoint written before the torch RNG state moved into ``loop_state.json`` (``torch_rng.pt``) is read
    with ``weights_only=True``: the same state as the JSON one."""
    import io

    import torch

    from selfplay.resume import read_loop_state

    state = _loop_state()
    new = read_loop_state(_checkpoint_dir(tmp_path / "new", state))
    assert torch.equal(new.torch_rng, torch.get_rng_state()) and new.step == 4 and new.totals == {"time/update": 1.5}
    buf = io.BytesIO()
    torch.save({"torch_rng": torch.get_rng_state()}, buf)
    del state["torch_rng"]
    old = read_loop_state(_checkpoint_dir(tmp_path / "old", state, legacy_rng=buf.getvalue()))
    assert torch.equal(old.torch_rng, new.torch_rng) and old.python_rng == new.python_rng


def test_a_crafted_legacy_pickle_never_runs_whatever_the_environment_says(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    state = _loop_state()
    del state["torch_rng"]
    d = _checkpoint_dir(tmp_path, state, legacy_rng=b"")
    _crafted_pickle(d / "torch_rng.pt", marker)
    write_manifest(d, 4)
    code = ("import sys; from pathlib import Path; from selfplay.resume import read_loop_state\n"
            "try:\n    read_loop_state(Path(sys.argv[1]))\nexcept Exception as e:\n    print(type(e).__name__, e)")
    env = {**cli_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    p = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    assert p.stdout.startswith(f"CheckpointError {d / 'torch_rng.pt'}: not a torch RNG state saved by this project "
                               "(UnpicklingError: "), p.stdout
    assert not marker.exists()


@pytest.fixture
def crafted_copy(tiny_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    return run


def test_resume_with_crafted_loop_states_exits_2_naming_them_before_the_model_loads(crafted_copy: Path) -> None:
    run = crafted_copy
    for step in (3, 4):
        d = run / "checkpoints" / f"step_{step}"
        state = json.loads((d / "loop_state.json").read_text())
        state["step"] = "1; rm"
        (d / "loop_state.json").write_text(json.dumps(state))
        write_manifest(d, step)  # the hashes match: only the values give it away
    p, loads = populora_watched("train", "--resume", str(run), "--no-progress", timeout=300)
    assert p.returncode == 2 and loads == [] and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    for step in (3, 4):
        assert f"{run}/checkpoints/step_{step}/loop_state.json: field 'step': holds '1; rm', expected {step}" in last


def test_resume_with_crafted_pickles_exits_2_naming_them_and_never_runs_them(
        crafted_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns torch's restricted loader off where a caller does not ask
    for it: every load of a run directory's files asks, so the pickle is refused (the checkpoint is damaged, named)
    and its ``__reduce__`` never runs, before any model loads."""
    run = crafted_copy
    marker = run.parent / "ran"
    targets = {step: run / f"checkpoints/step_{step}/population/teacher_0/optimizer.pt" for step in (3, 4)}
    for step, target in targets.items():
        _crafted_pickle(target, marker)
        write_manifest(run / f"checkpoints/step_{step}", step)  # the hashes match: only the contents give it away
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    p, loads = populora_watched("train", "--resume", str(run), "--no-progress", timeout=300)
    assert p.returncode == 2 and loads == [] and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"populora train: error: {run / 'checkpoints'}: no intact checkpoint to resume from (")
    for target in targets.values():
        assert f"{target}: not a tensor file this project writes (UnpicklingError: refused by torch's weights-only " \
               "loader: " in last, last
    assert not marker.exists()


def test_the_tensorboard_event_file_has_a_name_nobody_can_plant_in_advance(tmp_path: Path) -> None:
    """TensorBoard's own name (time, host, pid, counter) can be guessed and its writer follows links; the run's
    writer adds a random token, so two writers in the same second and process still get names no one knew."""
    from selfplay.logger import tensorboard_writer

    names: list[str] = []
    for _ in range(2):
        writer = tensorboard_writer(tmp_path)
        writer.add_scalar("x", 1.0, 0)
        writer.close()
        names += [p.name for p in tmp_path.iterdir() if p.name not in names]
    assert len(names) == 2 and all(n.startswith("events.out.tfevents.") for n in names)
    tokens = [n.rsplit(".", 1)[1] for n in names]
    assert tokens[0] != tokens[1] and all(len(t) == 16 and int(t, 16) >= 0 for t in tokens)
