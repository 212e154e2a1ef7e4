"""``populora compare --backend ray`` on the session's one-machine cluster (head + 2 fake nodes): one Ray task
per run starts the ordinary ``populora train|baseline`` command on a node; the comparison is written, and a
second call launches nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_compare import ARM_DIRS, check_comparison, populora_compare, tiny_preset

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.e2e]  # a compare of four runs: CI's end-to-end tier


def test_compare_on_ray(ray_cluster, tmp_path: Path) -> None:
    _, address = ray_cluster
    preset = tiny_preset(tmp_path / "tiny.json")
    out = tmp_path / "cmp"
    args = ["--preset", str(preset), "--seeds", "2", "--backend", "ray", "--ray-address", address,
            "--reps", "200", "--out", str(out)]
    first = populora_compare(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # one task per run, with the CPUs its threads need (the preset's 1 thread, within the nodes' 4 CPUs)
    assert first.stdout.count("submitted") == 4 and first.stdout.count("num_cpus=1, num_gpus=0") == 4
    for name in ARM_DIRS:
        assert "(ray task)" in (out / "logs" / f"{name}.log").read_text()
    check_comparison(out, ARM_DIRS)
    second = populora_compare(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 run(s) to launch, 4 complete" in second.stdout and "submitted" not in second.stdout
    assert json.loads((out / "compare.json").read_text())["launched"] == []
