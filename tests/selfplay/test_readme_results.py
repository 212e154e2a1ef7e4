"""The README's commands after the main job work verbatim, in the README's order, as a new user runs them.

The main job itself (SmolLM2-135M, 9 steps, 5-7 min) and the baseline's are too long for the suite: the shared
tiny-random population and baseline runs (conftest's ``arm_runs``) are copied to the paths the README's
commands name (``runs/cpu-smoke-population-s0``, ``runs/cpu-smoke-baseline-s0``) in a fresh working directory,
and every README command that reads them runs there as written: the resume, the report of one run and of both,
the evaluation with and without the baseline. The one change: ``populora eval`` gets ``--max-new-tokens 16``
(a tiny-random model never stops, so the CPU budget of 512 tokens per answer would take minutes; the README's
own flags are all kept). Each command's output holds no ``Warning`` line and no raw JSON object, and the fresh
runs ended with a summary saying where the run is and what to run next.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from tests.selfplay.conftest import populora
from tests.test_readme import readme_commands

RUNS = {"population": "runs/cpu-smoke-population-s0", "baseline": "runs/cpu-smoke-baseline-s0"}
JSON_BLOB = re.compile(r"\{\s*\"")


def _clean(output: str, what: str) -> None:
    """No warning, no raw JSON object: the user sees step lines and sentences."""
    warnings = [ln for ln in output.splitlines() if "Warning" in ln]
    assert not warnings, f"{what}: {warnings}"
    blobs = [ln for ln in output.splitlines() if JSON_BLOB.search(ln)]
    assert not blobs, f"{what}: {blobs}"


def after_main_job() -> list[str]:
    """The README's commands on the main job's runs, in the README's order (the baseline command included)."""
    cmds = [c for _, c in readme_commands()]
    first = cmds.index(".venv/bin/populora train --resume runs/cpu-smoke-population-s0")
    return [c for c in cmds[first:] if "runs/cpu-smoke-" in c or c == ".venv/bin/populora baseline"]


def test_the_commands_after_the_main_job_run_verbatim(arm_runs: dict[str, Path], tmp_path: Path) -> None:
    cmds = after_main_job()
    assert [shlex.split(c)[1] for c in cmds] == ["train", "report", "eval", "baseline", "report", "eval"], cmds
    # the baseline run is made before any command that reads it
    assert all("cpu-smoke-baseline-s0" not in c for c in cmds[:cmds.index(".venv/bin/populora baseline")])
    for arm, path in RUNS.items():
        shutil.copytree(arm_runs[arm], tmp_path / path)
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[0] == ".venv/bin/populora", cmd  # every README command names the venv's command
        if argv[1] == "baseline":  # the main job's baseline: its tiny-random stand-in was copied above
            continue
        extra = ["--max-new-tokens", "16"] if argv[1] == "eval" else []
        p = populora(*argv[1:], *extra, cwd=tmp_path)
        assert p.returncode == 0, f"{cmd}\n{p.stderr[-3000:]}"
        _clean(p.stdout + p.stderr, cmd)
    assert (tmp_path / RUNS["population"] / "eval" / "results.json").is_file()


def test_a_tiny_run_prints_its_steps_and_a_summary_without_warnings(arm_runs: dict[str, Path]) -> None:
    for arm in RUNS:
        output = (arm_runs[arm].parent / f"{arm}.console").read_text()
        _clean(output, arm)
        assert "Loading weights" not in output and "No path found" not in output
        lines = output.splitlines()
        assert any(re.search(r"step 3/3 \| valid", ln) for ln in lines), output[-2000:]
        assert any(ln.startswith("finished: 3 steps") for ln in lines), output[-2000:]
        assert f"run directory: {arm_runs[arm]}" in lines
        assert any(f"eval {arm_runs[arm]} --benchmarks" in ln for ln in lines)  # the next command to try
