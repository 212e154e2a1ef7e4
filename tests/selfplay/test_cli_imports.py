"""A command line that is only parsed imports no torch, transformers or Ray: ``--help`` of every sub-command, a
flag tyro cannot parse and a value the configuration refuses return before any of them loads (they load when
the work starts). Each case runs in a fresh interpreter, which reports the heavy modules it imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.selfplay.conftest import REPO, cli_env

HEAVY = ("torch", "transformers", "ray", "peft", "vllm")

_PROBE = f"HEAVY = {HEAVY!r}\n" + """
import contextlib, io, json, sys
from populora_cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:
        rc = exc.code
print(json.dumps({"rc": rc, "heavy": sorted(m for m in HEAVY if m in sys.modules)}))
"""


def imported(*argv: str) -> tuple[int, list[str]]:
    p = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120,
                       env=cli_env(), cwd=REPO)
    assert p.returncode in (0, 2), p.stderr[-3000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return info["rc"], info["heavy"]


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["train", "--help"],
    ["baseline", "--help"],
    ["eval", "--help"],
    ["evolve", "--help"],
    ["report", "--help"],
    ["compare", "--help"],
    ["train", "--trainer.lr", "abc"],  # tyro cannot parse it
    ["train", "--no-such-flag", "1"],
    ["train", "--trainer.lr", "-1"],  # parsed, refused by validation
    ["train", "--pbt.interval", "0"],
    ["train", "--env.num-teachers", "0"],
    ["baseline", "--steps", "0"],
    ["train", "--trainer.advantage", "nope"],  # a registry's name refused from its shipped names
    ["train", "--trainer.loss-agg-mode", "nope"],
    ["train", "--trainer.role-weighting", "nope"],
    ["train", "--trainer.kl-estimator", "k9"],
    ["train", "--pbt.operators", '{"nope": 1.0}'],
    ["train", "--pbt.operator-params", '{"nope": {}}'],
    ["train", "--env.reward-scheme", "nope"],
])
def test_a_bare_parse_imports_no_torch(argv: list[str]) -> None:
    rc, heavy = imported(*argv)
    assert rc == (0 if argv[-1] == "--help" else 2)
    assert heavy == [], f"populora {' '.join(argv)} imported {heavy}"
