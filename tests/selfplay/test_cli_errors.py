"""Bad input exits with status 2 and one line naming the problem, before any work starts: no model is loaded
(``agents.models.load_base`` is replaced by one that fails the test) and no run directory is created or touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.selfplay.conftest import TINY, populora, populora_watched


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("populora ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "0"], "--steps"),
        (["--model", "/nonexistent/path/to/model"], "--model"),
        (["--model", "./missing-model.gguf"], "--model"),
        (["--env.timeout-s", "-1"], "--env.timeout-s"),
        (["--env.samples-per-task", "0"], "--env.samples-per-task"),
        (["--env.reward-scheme", "no-such-scheme"], "--env.reward-scheme"),
        (["--env.task-types", "deduction", "guessing"], "--env.task-types"),
        (["--trainer.advantage", "no-such-estimator"], "--trainer.advantage"),
        (["--trainer.advantage-kwargs", '{"foo": 1}'], "--trainer.advantage-kwargs: estimator "
         "'reinforce_pp_baseline' takes no keyword argument 'foo'"),
        (["--preset", "no-such-preset"], "--preset"),
        (["--env.num-teachers", "0"], "--env.num-teachers"),
    ],
)
def test_bad_value_exits_2_naming_the_field(cli, args: list[str], needle: str, tmp_path: Path) -> None:
    rc, err = cli("train", "--run-dir", str(tmp_path / "run"), *args)
    assert rc == 2, err[-2000:]
    assert _one_error_line(err).startswith(f"populora train: error: {needle}"), err[-2000:]
    assert not (tmp_path / "run").exists()


def test_unparseable_flag_exits_2(tmp_path: Path) -> None:
    # the real entry point, in a subprocess that records model loads
    p, model_loads = populora_watched("train", "--steps", "many", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert p.returncode == 2
    assert "--steps" in p.stderr
    assert model_loads == [] and not (tmp_path / "run").exists()


def test_resume_of_a_non_run_exits_2(cli, tmp_path: Path) -> None:
    rc, err = cli("train", "--resume", str(tmp_path))
    assert rc == 2
    assert _one_error_line(err) == (f"populora train: error: --resume: {tmp_path / 'config.json'} not found "
                                    f"(is {tmp_path} a run directory?)")


def test_unknown_command_exits_2() -> None:
    p = populora("fly", timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == ("populora fly: error: unknown command (choose one of: train, baseline, report, eval, "
                                "evolve, compare, list, test-scheme, test-estimator, test-selection, test-matching)")
    p = populora("trian", timeout=60)
    assert p.returncode == 2 and p.stderr.strip().endswith("; did you mean train?")


def test_help_documents_the_flags() -> None:
    p = populora("train", "--help", timeout=120)
    assert p.returncode == 0
    for flag in ("--preset", "--steps", "--run-dir", "--model", "--resume", "--env.samples-per-task",
                 "--trainer.advantage"):
        assert flag in p.stdout, flag


# ------------------------------------------------------------------------------------------- run directory


def _snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                         p.read_bytes() if p.is_file() else None)
    return out


def test_existing_run_without_resume_exits_2_and_touches_nothing(tiny_run: Path) -> None:
    before = _snapshot(tiny_run)
    p, model_loads = populora_watched("train", *TINY, "--steps", "2", "--run-dir", str(tiny_run), timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    line = _one_error_line(p.stderr)
    assert line.startswith(f"populora train: error: run directory {tiny_run} already holds a run (config.json, ")
    assert line.endswith(f"continue it with --resume {tiny_run}, or choose another --run-dir")
    assert model_loads == []
    assert _snapshot(tiny_run) == before


def test_existing_run_named_by_name_and_baseline_into_a_run(cli, tiny_run: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # --name NAME runs in runs/NAME under the working directory
    (tmp_path / "runs" / "mine" / "checkpoints").mkdir(parents=True)
    rc, err = cli("train", *TINY, "--name", "mine")
    assert rc == 2 and "run directory runs/mine already holds a run (checkpoints)" in _one_error_line(err)
    before = _snapshot(tiny_run)
    rc, err = cli("baseline", *TINY, "--run-dir", str(tiny_run))
    assert rc == 2 and f"run directory {tiny_run} already holds a run" in _one_error_line(err)
    assert _snapshot(tiny_run) == before


def test_run_dir_that_is_a_file_exits_2(cli, tmp_path: Path) -> None:
    (tmp_path / "run").write_text("x")
    rc, err = cli("train", *TINY, "--run-dir", str(tmp_path / "run"))
    assert rc == 2
    assert _one_error_line(err) == f"populora train: error: run directory {tmp_path / 'run'} exists and is not a directory"
    assert (tmp_path / "run").read_text() == "x"


def test_run_dir_under_a_file_exits_2(cli, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    rc, err = cli("train", *TINY, "--run-dir", str(tmp_path / "f" / "run"))
    assert rc == 2
    assert _one_error_line(err) == (f"populora train: error: cannot create run directory {tmp_path / 'f' / 'run'}: "
                                    f"{tmp_path / 'f'} is not a directory")


def test_run_dir_under_an_unwritable_directory_exits_2(cli, read_only_dir: Path) -> None:
    rc, err = cli("train", *TINY, "--run-dir", str(read_only_dir / "run"))
    assert rc == 2
    assert _one_error_line(err).startswith(
        f"populora train: error: cannot create run directory {read_only_dir / 'run'}: "), err
