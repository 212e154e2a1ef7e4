"""Every parse error of every sub-command is ONE line on stderr, ``populora CMD: error: FLAG: REASON``, exit 2,
with a hint where one helps; and output cut off by a closed pipe ends without a traceback.

The table holds bad command lines per sub-command (unknown and misspelt flags, values of the wrong type,
missing values, invalid choices, stray values, missing required arguments) and the exact line each gives.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from tests.selfplay.conftest import REPO, cli_env

BAD = [
    # train / baseline: tyro
    (["train", "--trainer.lr", "abc"], "populora train: error: --trainer.lr: expected a number, got 'abc'"),
    (["train", "--trainer.lrr", "1e-3"], "populora train: error: --trainer.lrr: unknown flag (did you mean --trainer.lr?)"),
    (["train", "--evolution", "false"],
     "populora train: error: --evolution: a switch takes no value (got 'false'): use --no-evolution"),
    (["train", "--evolution=true"], "populora train: error: --evolution: a switch takes no value (got 'true'): use --evolution"),
    (["train", "--pbt.newborn-protection", "no"], "populora train: error: --pbt.newborn-protection: a switch takes "
     "no value (got 'no'): use --pbt.no-newborn-protection"),
    (["train", "--generation.backend", "tgi"],
     "populora train: error: --generation.backend: invalid choice 'tgi' (choose from hf, vllm)"),
    (["train", "--steps"], "populora train: error: --steps: expected a value"),
    (["train", "--steps", "1", "2"], "populora train: error: --steps: unexpected extra value '2'"),
    (["train", "--trainer.betas", "0.9"], "populora train: error: --trainer.betas: expected 2 values"),
    (["train", "--trainer.norm-len", "x"], "populora train: error: --trainer.norm-len: expected an int or None, got 'x'"),
    (["train", "--env.reward-kwargs", "{"], "populora train: error: --env.reward-kwargs: expected a JSON object, "
     "got '{' (Expecting property name enclosed in double quotes at character 1)"),
    (["train", "--env.reward-kwargs", "[1]"], "populora train: error: --env.reward-kwargs: expected a JSON object, got '[1]'"),
    (["train", "--preset"], "populora train: error: --preset: expected one argument"),
    (["train", "-x"], "populora train: error: -x: unknown flag"),
    (["baseline", "--sead", "1"], "populora baseline: error: --sead: unknown flag (did you mean --seed?)"),
    (["baseline", "--progress", "0"], "populora baseline: error: --progress: a switch takes no value (got '0'): "
     "use --no-progress"),
    # eval: tyro, run mode and samples mode
    (["eval", "runs/x", "--limit", "x"], "populora eval: error: --limit: expected an int or None, got 'x'"),
    (["eval", "runs/x", "--benchmark", "gsm8k"], "populora eval: error: --benchmark: unknown flag (did you mean "
     "--benchmarks?)"),
    (["eval", "runs/x", "--device", "tpu", "--no-progres"], "populora eval: error: --no-progres: unknown flag (did "
     "you mean --no-progress?)"),
    (["eval", "--samples", "s.jsonl"], "populora eval: error: --benchmark: required"),
    (["eval", "--samples", "s.jsonl", "--benchmark"], "populora eval: error: --benchmark: expected a value"),
    # evolve, report: tyro
    (["evolve", "--op", "ties"], "populora evolve: error: --parents, --out: required"),
    (["evolve", "--op", "ties", "--parents", "a", "--out", "b", "--seed", "-"],
     "populora evolve: error: --seed: expected an int, got '-'"),
    (["evolve", "--opp", "ties"], "populora evolve: error: --opp: unknown flag (did you mean --op?)"),
    (["report"], "populora report: error: RUNS: required (give one or more run directories)"),
    (["report", "runs/x", "--smoothing", "high"], "populora report: error: --smoothing: expected a number, got 'high'"),
    (["report", "runs/x", "--outt", "y"], "populora report: error: --outt: unknown flag (did you mean --out?)"),
    (["report", "/nonexistent/run"], "populora report: error: RUNS: run directory /nonexistent/run does not exist"),
    # list, test-scheme, test-estimator: tyro
    (["list", "everything"], "populora list: error: kind: invalid choice 'everything' (choose from benchmarks, "
     "estimators, fitness, losses, matchings, models, operators, presets, schemes, selections)"),
    (["test-selection"], "populora test-selection: error: name: required"),
    (["test-matching", "variance", "--random-share", "lots"], "populora test-matching: error: --random-share: "
     "expected a number, got 'lots'"),
    (["list", "--plugin", "x.py"], "populora list: error: --plugin: unknown flag (did you mean --plugins?)"),
    (["test-scheme"], "populora test-scheme: error: name: required"),
    (["test-scheme", "populora", "--kwargs", "nope"], "populora test-scheme: error: --kwargs: expected a JSON "
     "object, got 'nope' (Expecting value at character 0)"),
    (["test-estimator", "grpo", "--kwarg", "{}"], "populora test-estimator: error: --kwarg: unknown flag (did you "
     "mean --kwargs?)"),
    # compare: argparse
    (["compare", "--seeds", "x"], "populora compare: error: --seeds: expected an int, got 'x'"),
    (["compare", "--paralel", "2"], "populora compare: error: --paralel: unknown flag (did you mean --parallel?)"),
    (["compare", "--preset", "cpu-compare"], "populora compare: error: --out: required"),
    (["compare", "--out", "x", "--backend", "slurm"],
     "populora compare: error: --backend: invalid choice: 'slurm' (choose from 'local', 'ray')"),
    (["compare", "--out", "x", "--from"], "populora compare: error: --from: expected at least one argument"),
    (["compare", "--out", "x", "--tail", "0", "--from", "r"], "populora compare: error: --tail: must be >= 1, got 0"),
]


@pytest.mark.parametrize(("argv", "line"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_command_line_is_one_line(cli, argv: list[str], line: str) -> None:
    rc, err = cli(*argv)
    assert rc == 2
    assert err.splitlines() == [line], err


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["compare", "--help"]])
def test_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    """``populora --help | head``: the reader is gone before the help is written; no traceback, and the exit
    status of a process killed by SIGPIPE (128 + 13), as the shells expect (argparse's help, compare's, drops
    the failed write itself and exits 0)."""
    p = subprocess.Popen([sys.executable, "-m", "populora_cli.main", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=cli_env(), cwd=REPO)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == (0 if argv[0] == "compare" else 141)
    assert err == ""


def test_compare_help_says_95_percent() -> None:
    from populora_cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = out.getvalue()
    assert "95 % bootstrap" in " ".join(out.split()) and "%%" not in out


def test_without_tyro_s_hook_its_box_is_squeezed_to_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """tyro's parse-error hook is private (tyro._errors): where a tyro lacks it, its error box, caught from
    stderr, still becomes one line."""
    import tyro._errors

    from populora_cli.main import EvolveArgs
    from populora_cli.parsing import UsageError, parse

    monkeypatch.delattr(tyro._errors, "on_parse_error")
    with pytest.raises(UsageError) as err:
        parse(EvolveArgs, ["--op", "ties", "--parents", "a", "--out", "b", "--seed", "x"], "populora evolve")
    assert str(err.value) == "--seed: expected an int, got 'x'"
