"""``populora compare`` end to end on the tiny-random model: every arm x seed run launched as an ordinary
``populora train|baseline`` process, the comparison written; a compare killed with SIGKILL takes its runs
down with it and the next call resumes them; a call on complete runs launches nothing. Plus the refusals
(exit 2 before any run starts) and ``--from``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TINY_PRESET = {
    "_comment": "tests: the smallest run of both arms (tiny-random, 2 steps, a few tokens, one thread)",
    "model": "tiny-random", "steps": 2, "rank": 4, "alpha": 8, "threads": 1, "checkpoint_every": 1,
    "env": {"num_teachers": 2, "num_students": 2, "tasks_per_teacher": 2, "samples_per_task": 2,
            "sandbox_workers": 1},
    "generation": {"teacher_max_new_tokens": 8, "student_max_new_tokens": 6, "temperature": 1.0, "threads": 1},
    "trainer": {"entropy_coef": 0.01, "lr": 0.001},
    "pbt": {"interval": 2},
}
ARM_DIRS = ["population-s0", "population-s1", "baseline-s0", "baseline-s1"]


def tiny_preset(path: Path) -> Path:
    path.write_text(json.dumps(TINY_PRESET))
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def compare_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "populora_cli.main", "compare", *args]


def populora_compare(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(compare_cmd(*args), capture_output=True, text=True, timeout=timeout, env=cli_env(),
                          cwd=REPO)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


def check_comparison(out: Path, launched: list[str]) -> dict:
    data = json.loads((out / "compare.json").read_text())
    assert sorted(data["launched"]) == sorted(launched)
    assert data["excluded"] == {}
    for arm in ("population", "baseline"):
        assert [r["seed"] for r in data["runs"][arm]] == [0, 1]
        assert all(r["steps"] == 2 for r in data["runs"][arm])
    # tiny-random writes no valid task: every reward is a format error's -1 at every step of every run, so the
    # comparison labels the metrics as carrying no signal instead of drawing intervals around constants
    assert data["no_signal"]["teacher_reward"] == {"value": -1.0, "runs": 4}
    assert "teacher_reward" not in data["metrics"] and "teacher_reward" not in data["curves"]
    md = (out / "compare.md").read_text()
    assert "- teacher reward: -1 in all 4 runs — carries no signal" in md and "teacher reward: final" not in md
    for name in ARM_DIRS:  # ordinary run directories: the run's own report was written
        assert (out / name / "run_summary.json").is_file() and (out / name / "report" / "summary.md").is_file()
    return data


@pytest.mark.e2e  # four runs, killed and resumed: CI's end-to-end tier; the two-arm test below keeps compare end to end in the default suite
def test_compare_end_to_end_killed_resumed_idempotent(tmp_path: Path) -> None:
    preset = tiny_preset(tmp_path / "tiny.json")
    out = tmp_path / "cmp"
    args = ["--preset", str(preset), "--seeds", "2", "--parallel", "2", "--reps", "200", "--out", str(out)]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(compare_cmd(*args), stdout=log, stderr=subprocess.STDOUT, env=cli_env(), cwd=REPO)
    deadline = time.monotonic() + 600
    # kill -9 as soon as a run has started for real (its config.json is written after set-up): it is unfinished
    while time.monotonic() < deadline and not any((out / n / "config.json").is_file() for n in ARM_DIRS):
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    log.close()
    text = (tmp_path / "first.log").read_text()
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)", text)]
    assert pids, text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "a run outlived the killed compare"
    unfinished = [n for n in ARM_DIRS if (out / n / "config.json").is_file()
                  and not (out / n / "run_summary.json").is_file()]
    assert unfinished

    second = populora_compare(*args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for name in unfinished:
        assert f"{name}: unfinished, resuming" in second.stdout
        assert f"--resume {out / name}" in (out / "logs" / f"{name}.log").read_text()
    launched = [ln.split(":")[0].strip() for ln in second.stdout.splitlines()
                if ln.endswith(": new run") or ln.endswith(": unfinished, resuming")]
    check_comparison(out, launched)

    stamps = {n: (out / n / "run_summary.json").stat().st_mtime_ns for n in ARM_DIRS}
    third = populora_compare(*args)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "0 run(s) to launch, 4 complete" in third.stdout
    assert "started" not in third.stdout
    check_comparison(out, [])
    assert stamps == {n: (out / n / "run_summary.json").stat().st_mtime_ns for n in ARM_DIRS}

    # --from: the same runs, compared without launching anything
    again = populora_compare("--from", *(str(out / n) for n in ARM_DIRS), "--out", str(tmp_path / "from"),
                             "--reps", "200")
    assert again.returncode == 0, again.stderr[-3000:]
    a = json.loads((out / "compare.json").read_text())
    b = json.loads((tmp_path / "from" / "compare.json").read_text())
    assert a["metrics"] == b["metrics"] and a["curves"] == b["curves"] and a["no_signal"] == b["no_signal"]


def _compare_in_process(*args: str) -> int:
    from populora_cli.main import main

    return main(["compare", *args])


@pytest.mark.parametrize("args, message", [
    (["--seeds", "2"], "--preset: required"),
    (["--preset", "cpu-smoke"], "--seeds: required"),
    (["--preset", "cpu-smoke", "--seeds", "2", "--arms", "population,nobody"], "--arms"),
    (["--preset", "cpu-smoke", "--seeds", "2", "--parallel", "0"], "--parallel"),
    (["--preset", "cpu-smoke", "--seeds", "2", "--ray-address", "x:1"], "--ray-address: needs --backend ray"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--tail", "0"], "--tail"),
    (["--from", "/nonexistent/run"], "is not a directory"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--arm", "a=nobody"], "KIND one of population, baseline"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--arm", "a b=population"], "NAME matching"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--arm", "a=population --seed 3"], "may not set"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--arm", "a=population", "--arm", "a=baseline"], "share a name"),
    (["--preset", "cpu-smoke", "--seeds", "1", "--arm", "a=population", "--arms", "baseline"], "give either --arms or --arm"),
])
def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                              message: str) -> None:
    assert _compare_in_process(*args, "--out", str(tmp_path / "o")) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_bad_train_flag_gives_train_s_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The arm's own refusal (``populora train --dry-run`` in a subprocess) reads as compare's line, the same
    ``--field: reason`` as train's, the arm after it."""
    preset = tiny_preset(tmp_path / "tiny.json")
    assert _compare_in_process("--preset", str(preset), "--seeds", "1", "--arms", "population",
                               "--out", str(tmp_path / "o"), "--", "--trainer.lr", "-1") == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == ["populora compare: error: --trainer.lr: must be > 0, got -1 "
                     "(the population arm's configuration is refused)"]
    assert not (tmp_path / "o").exists()


def test_refused_preset_and_foreign_run_dir_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    assert _compare_in_process("--preset", "no-such-preset", "--seeds", "1", "--out", str(out)) == 2
    assert "configuration is refused" in capsys.readouterr().err
    # a directory holding another seed's run where population-s0 belongs: refused, nothing launched
    preset = tiny_preset(tmp_path / "tiny.json")
    (out / "population-s0").mkdir(parents=True)
    (out / "population-s0" / "config.json").write_text(json.dumps(
        {"arm": "population", "config": {"seed": 5, "preset": str(preset), "steps": 2}}))
    assert _compare_in_process("--preset", str(preset), "--seeds", "1", "--arms", "population",
                               "--out", str(out)) == 2
    assert "holds another run: seed 5 (expected 0)" in capsys.readouterr().err
    assert not (out / "logs").exists()


def test_missing_rliable_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rliable", None)
    monkeypatch.setitem(sys.modules, "rliable.metrics", None)
    assert _compare_in_process("--preset", "cpu-smoke", "--seeds", "1", "--out", str(tmp_path / "o")) == 2
    assert "need rliable" in capsys.readouterr().err


def test_a_run_killed_during_set_up_is_set_aside(tmp_path: Path) -> None:
    from populora_cli.compare_command import Job, set_aside_unstarted

    run = tmp_path / "population-s0"
    run.mkdir()
    (run / "seeding.json").write_text("{}")  # written during set-up, before config.json
    moved = set_aside_unstarted(tmp_path, [Job("population", 0, run)])
    assert len(moved) == 1 and not run.exists()
    kept = list((tmp_path / ".unstarted").iterdir())
    assert len(kept) == 1 and (kept[0] / "seeding.json").is_file()


def test_plan_threads_and_commands(tmp_path: Path) -> None:
    """cores // K threads per run where the preset leaves them to torch (0) or asks for more; the preset's own
    count where it fits; a new run's command names preset, seed and run directory, an unfinished one --resume."""
    from populora_cli.compare_command import plan

    configs = {"population": {"threads": 0, "generation": {"threads": 1}},
               "baseline": {"threads": 8, "generation": {"threads": 0}, "device": "cuda"}}
    unfinished = tmp_path / "baseline-s0"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps(
        {"arm": "baseline", "config": {"seed": 0, "preset": "p.json", "steps": 2}}))
    jobs, skipped = plan(tmp_path, ["population", "baseline"], {"population": "p.json", "baseline": "p.json"},
                         [0], ["--steps", "2"], configs.__getitem__, threads=3)
    assert skipped == []
    pop, base = jobs
    assert pop.argv[3:] == ["train", "--preset", "p.json", "--seed", "0", "--run-dir", str(tmp_path / "population-s0"),
                            "--no-progress", "--threads", "3", "--steps", "2"]
    assert (pop.resume, pop.num_cpus, pop.num_gpus) == (False, 3, 0)
    assert base.argv[3:] == ["baseline", "--resume", str(unfinished), "--no-progress", "--threads", "3",
                             "--generation.threads", "3"]
    assert (base.resume, base.num_cpus, base.num_gpus) == (True, 3, 1)
    vllm = {"threads": 0, "generation": {"threads": 1, "engine": "vllm"}}  # the resolved config's engine
    jobs, _ = plan(tmp_path / "v", ["population"], {"population": "p.json"}, [0], [], {"population": vllm}.__getitem__,
                   threads=3)
    assert jobs[0].num_gpus == 1


def test_arms_with_their_own_flags_plan_labelled_runs(tmp_path: Path) -> None:
    """``--arm NAME=KIND FLAGS``: the arm's runs are ``NAME-s<seed>``, labelled ``--arm NAME``, with its flags after
    the preset's and before compare's extra flags; an arm named by its kind is launched as before."""
    from populora_cli.compare_command import Arm, parse_arm, plan

    arms = [parse_arm("async=population --pipeline.max-staleness 1"), parse_arm("population=population")]
    assert arms == [Arm("async", "population", ("--pipeline.max-staleness", "1")), Arm("population", "population")]
    config = {"threads": 1, "generation": {"threads": 1}}
    jobs, _ = plan(tmp_path, arms, {"async": "p.json", "population": "p.json"}, [0], ["--steps", "2"],
                   lambda arm: config, threads=1)
    assert jobs[0].argv[3:] == ["train", "--preset", "p.json", "--seed", "0", "--run-dir", str(tmp_path / "async-s0"),
                                "--arm", "async", "--no-progress", "--pipeline.max-staleness", "1", "--steps", "2"]
    assert jobs[1].argv[3:] == ["train", "--preset", "p.json", "--seed", "0", "--run-dir",
                                str(tmp_path / "population-s0"), "--no-progress", "--steps", "2"]


def test_compare_takes_the_staleness_as_an_arm_override(tmp_path: Path) -> None:
    """Two arms of the population, staleness 1 against 0: both run, each under its own name; the comparison reports
    the first minus the second."""
    preset = tiny_preset(tmp_path / "tiny.json")
    out = tmp_path / "cmp"
    p = populora_compare("--preset", str(preset), "--seeds", "1", "--parallel", "2", "--reps", "100", "--out", str(out),
                         "--arm", "async=population --pipeline.max-staleness 1", "--arm", "sync=population")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    assert (data["treatment"], data["reference"]) == ("async", "sync")
    assert sorted(data["runs"]) == ["async", "sync"]
    assert data["no_signal"]["teacher_reward"]["runs"] == 2  # one run per arm, both constant (tiny-random)
    assert "# async vs sync over seeds" in (out / "compare.md").read_text()  # no metric varied: no table
    for name, staleness in (("async-s0", 1), ("sync-s0", 0)):
        record = json.loads((out / name / "config.json").read_text())
        assert (record["arm"], record["arm_kind"]) == (name.split("-")[0], "population")
        assert record["config"]["pipeline"]["max_staleness"] == staleness
