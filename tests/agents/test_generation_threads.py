"""The one generation-threads switch, and the ``populora`` command's passive OpenMP wait policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agents.generation.threads import generation_threads

ROOT = Path(__file__).resolve().parents[2]


def test_sets_the_count_on_cpu_and_restores_it_even_on_error():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with generation_threads(target, "cpu") as n:
        assert n == target == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), generation_threads(target, "cpu"):
        raise RuntimeError("generation failed")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("threads", "device"), [(0, "cpu"), (1, "cuda"), (3, "cuda")])
def test_zero_or_another_device_leaves_the_count_alone(threads, device):
    before = torch.get_num_threads()
    with generation_threads(threads, device) as n:
        assert n == before == torch.get_num_threads()


def _cli_env(extra: dict[str, str]) -> str:
    code = ("import sys, os; import populora_cli.main; assert 'torch' not in sys.modules; "
            "import torch; print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"PYTHONPATH": str(ROOT)} | extra
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_cli_sets_a_passive_wait_policy_before_torch_loads_and_keeps_the_users():
    assert _cli_env({}) == "PASSIVE"
    assert _cli_env({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
