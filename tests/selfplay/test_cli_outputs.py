"""An output that would write into a command's own inputs (:mod:`populora_cli.outputs`): one line, exit 2, before
anything is written or any model loads — ``evolve --out`` against ``--parents``, ``report --out`` against the
runs, ``eval --out-dir`` against the run, baseline and adapters, ``eval --results`` against ``--samples``,
``compare --from ... --out`` against the runs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from populora_cli.outputs import overlap


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` and a digest of each file: what a refused command must leave as it was."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """Two adapter-like folders and two run-like folders, a samples file, under ``tmp_path/in`` (the
    check comes before any of them is read, so their contents need not be real)."""
    root = tmp_path / "in"
    for d in ("a", "b", "run1", "run2"):
        (root / d).mkdir(parents=True)
        (root / d / "adapter_model.safetensors").write_bytes(d.encode())
        (root / d / "config.json").write_text("{}")
    (root / "samples.jsonl").write_text('{"task_id": "HumanEval/0", "completion": "pass"}\n')
    return root


# (argv with {root} for the inputs' folder, the line's message after "populora CMD: error: ")
CASES = {
    "evolve is a parent": (
        ["evolve", "--op", "ties", "--parents", "{root}/a", "{root}/b", "--out", "{root}/b"],
        "--out {root}/b is --parents {root}/b",
    ),
    "evolve inside a parent": (
        ["evolve", "--op", "ties", "--parents", "{root}/a", "{root}/b", "--out", "{root}/a/child"],
        "--out {root}/a/child is inside --parents {root}/a",
    ),
    "evolve contains a parent": (
        ["evolve", "--op", "ties", "--parents", "{root}/a", "{root}/b", "--out", "{root}"],
        "--out {root} contains --parents {root}/a",
    ),
    "evolve, a parent spelt with ..": (
        ["evolve", "--op", "dare", "--parents", "{root}/a", "--out", "{root}/b/../a"],
        "--out {root}/b/../a is --parents {root}/a",
    ),
    "report is a run": (
        ["report", "{root}/run1", "{root}/run2", "--out", "{root}/run2"],
        "--out {root}/run2 is RUNS {root}/run2",
    ),
    "report inside a run": (
        ["report", "{root}/run1", "--out", "{root}/run1/checkpoints"],
        "--out {root}/run1/checkpoints is inside RUNS {root}/run1",
    ),
    "report contains a run": (
        ["report", "{root}/run1", "--out", "{root}"],
        "--out {root} contains RUNS {root}/run1",
    ),
    "eval is the run": (
        ["eval", "{root}/run1", "--out-dir", "{root}/run1", "--benchmarks", "humaneval"],
        "--out-dir {root}/run1 is RUN_DIR {root}/run1",
    ),
    "eval inside the baseline": (
        [
            "eval",
            "{root}/run1",
            "--baseline",
            "{root}/run2",
            "--out-dir",
            "{root}/run2/eval/../adapters",
            "--benchmarks",
            "humaneval",
        ],
        "--out-dir {root}/run2/eval/../adapters is inside --baseline {root}/run2",
    ),
    "eval is an adapter": (
        ["eval", "--adapters", "{root}/a", "{root}/b", "--out-dir", "{root}/b", "--benchmarks", "humaneval"],
        "--out-dir {root}/b is --adapters {root}/b",
    ),
    "eval results are the samples": (
        [
            "eval",
            "--samples",
            "{root}/samples.jsonl",
            "--benchmark",
            "humaneval",
            "--results",
            "{root}/samples.jsonl",
        ],
        "--results {root}/samples.jsonl is --samples {root}/samples.jsonl",
    ),
    "compare is a run": (
        ["compare", "--from", "{root}/run1", "{root}/run2", "--out", "{root}/run1"],
        "--out {root}/run1 is --from {root}/run1",
    ),
    "compare inside a run": (
        ["compare", "--from", "{root}/run1", "--out", "{root}/run1/cmp"],
        "--out {root}/run1/cmp is inside --from {root}/run1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_output_in_the_inputs_is_refused_in_one_line_before_anything_is_written(
    cli, inputs: Path, case: str
) -> None:
    argv, message = CASES[case]
    before = _tree(inputs)
    rc, err = cli(*(a.format(root=inputs) for a in argv))
    cmd = argv[0]
    assert rc == 2, err
    out_flag = message.split()[0]
    assert err.strip() == (
        f"populora {cmd}: error: {message.format(root=inputs)}; nothing was written: choose "
        f"another {out_flag}"
    )
    assert _tree(inputs) == before


def test_the_inputs_own_output_folders_and_a_layout_that_holds_its_inputs_are_allowed(tmp_path: Path) -> None:
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    args = {"out_flag": "--out", "input_flag": "RUNS"}
    assert overlap(run / "report", [run], own=("report",), **args) is None  # report's default
    assert overlap(run / "report" / "v2", [run], own=("report",), **args) is None
    assert overlap(run / "reports", [run], own=("report",), **args) is not None  # a name, not a prefix
    assert overlap(other, [run], **args) is None
    assert overlap(tmp_path, [run], may_contain=True, **args) is None  # compare --preset's layout
    assert overlap(tmp_path, [run], **args) == (
        f"--out {tmp_path} contains RUNS {run}; nothing was written: choose another --out"
    )
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    assert (
        overlap(link, [run], **args)
        == f"--out {link} is RUNS {run}; nothing was written: choose another --out"
    )


def test_the_python_api_compare_refuses_an_out_inside_a_run(inputs: Path) -> None:
    from populora_cli.api import compare

    before = _tree(inputs)
    with pytest.raises(ValueError, match=r"^out .*/run1/cmp is inside run .*/run1; nothing was written"):
        compare([inputs / "run1"], inputs / "run1" / "cmp")
    assert _tree(inputs) == before
