"""A role whose advantages are all zero in a step: the trainer's ``advantage_abs_max/<role>``, the TensorBoard
flag ``charts/zero_advantage/<role>`` at every step, and one log warning per role per run."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

from agents.trainer import _role_advantages
from selfplay import tags
from selfplay.logger import TensorBoardLogger, step_scalars, zero_advantage_scalars
from tests.selfplay.test_logging_contract import _population_record


class _Row:
    def __init__(self, role: str) -> None:
        self.meta = {"role": role}


def test_role_advantages_take_the_largest_magnitude_over_each_roles_tokens() -> None:
    adv = torch.tensor([[0.0, 0.0, 5.0], [0.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # row 0's 5.0 is padding
    out = _role_advantages([_Row("teacher"), _Row("student"), _Row("teacher")], adv, mask)
    assert out == {"advantage_abs_max/teacher": 0.0, "advantage_abs_max/student": 2.0}


def test_the_flag_is_one_only_when_every_member_of_the_role_had_none() -> None:
    members = {
        "t0": {"advantage_abs_max/teacher": 0.0},
        "t1": {"advantage_abs_max/teacher": 0.0},
        "s0": {"advantage_abs_max/student": 0.0},
        "s1": {"advantage_abs_max/student": 0.3},
    }
    assert zero_advantage_scalars(members) == {
        tags.zero_advantage("teacher"): 1.0,
        tags.zero_advantage("student"): 0.0,
    }
    assert zero_advantage_scalars({"t0": {"loss": 1.0}}) == {}  # no update of a role: no flag


def _record(step: int, teacher_max: float) -> object:
    record = _population_record()
    metrics = {m: dict(mm) for m, mm in record.member_metrics.items()}
    for m in metrics:
        role = "teacher" if m.startswith("teacher") else "student"
        metrics[m][f"advantage_abs_max/{role}"] = teacher_max if role == "teacher" else 1.0
    return dataclasses.replace(record, step=step, member_metrics=metrics)


def test_the_run_warns_once_per_role_and_logs_the_flag_every_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = TensorBoardLogger(str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="selfplay.logger"):
            flags = [
                logger.log_step(_record(step, v))[tags.zero_advantage("teacher")]
                for step, v in ((1, 0.5), (2, 0.0), (3, 0.0), (4, 0.0))
            ]
    finally:
        logger.close()
    assert flags == [0.0, 1.0, 1.0, 1.0]
    warned = [r.getMessage() for r in caplog.records if "advantage is zero" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("step 2: every teacher advantage is zero")
    assert step_scalars(_record(5, 0.0))[tags.zero_advantage("student")] == 0.0
