"""Per-role trainer settings from the command line (docs/swapping.md, "Per-role trainer settings"): a run with
teachers on one estimator and learning rate and students on another records both in config.json, each member's
optimizer ran at its role's learning rate and each row's advantage came from its role's estimator; the baseline
refuses a per-role learning rate in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.selfplay.conftest import populora

PLUGIN = """
import json
from pathlib import Path

from agents.advantages import get_advantage, register_advantage

LOG = Path(__file__).with_name("calls.jsonl")


def recording(name, base):
    def estimator(rewards, response_mask, group_ids, *, scope_ids=None, token_rewards=None, tag: str = ""):
        roles = sorted({s[0] for s in scope_ids or []})
        with LOG.open("a") as f:
            f.write(json.dumps({"estimator": name, "tag": tag, "rows": len(rewards), "roles": roles}) + "\\n")
        return get_advantage(base)(rewards, response_mask, group_ids, scope_ids=scope_ids,
                                   token_rewards=token_rewards)
    return estimator


register_advantage("test_only_teacher_est")(recording("teacher", "grpo"))
register_advantage("test_only_student_est")(recording("student", "rloo"))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("roles")
    (work / "estimators.py").write_text(PLUGIN)
    run = work / "run"
    p = populora(
        "train",
        "--preset",
        "scripted",
        "--plugins",
        str(work / "estimators.py"),
        "--steps",
        "1",
        "--trainer.teacher.advantage",
        "test_only_teacher_est",
        "--trainer.teacher.lr",
        "0.003",
        "--trainer.teacher.advantage-kwargs",
        '{"tag": "proposer"}',
        "--trainer.student.advantage",
        "test_only_student_est",
        "--trainer.student.lr",
        "0.0002",
        "--run-dir",
        str(run),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def test_config_json_records_what_each_role_used(run: Path) -> None:
    roles = json.loads((run / "config.json").read_text())["trainer_roles"]
    assert roles["teacher"]["advantage"] == "test_only_teacher_est" and roles["teacher"]["lr"] == 0.003
    assert roles["teacher"]["advantage_kwargs"] == {"tag": "proposer"}
    assert roles["student"]["advantage"] == "test_only_student_est" and roles["student"]["lr"] == 0.0002
    assert roles["student"]["clip_eps_low"] == roles["teacher"]["clip_eps_low"] == 0.2  # the shared value


def test_each_member_s_optimizer_ran_at_its_role_s_lr(run: Path) -> None:
    step = run / "checkpoints" / "step_1" / "population"
    for member, lr in (("teacher_1", 0.003), ("student_2", 0.0002)):  # the learners (configs/scripted.json)
        state = torch.load(step / member / "optimizer.pt", weights_only=True)
        assert [g["lr"] for g in state["param_groups"]] == [lr], member


def test_each_row_s_advantage_came_from_its_role_s_estimator(run: Path) -> None:
    calls = [json.loads(line) for line in (run.parent / "calls.jsonl").read_text().splitlines()]
    assert {c["estimator"] for c in calls} == {"teacher", "student"}
    for c in calls:
        assert c["roles"] == [c["estimator"]], c  # every row it saw was its role's
        assert c["tag"] == ("proposer" if c["estimator"] == "teacher" else "")


def test_help_lists_the_per_role_flags() -> None:
    p = populora("train", "--help", timeout=120)
    assert p.returncode == 0
    for flag in (
        "--trainer.teacher.lr",
        "--trainer.student.advantage",
        "--trainer.teacher.clip-eps-high",
        "--trainer.student.is-correction",
        "--trainer.teacher.advantage-kwargs",
    ):
        assert flag in p.stdout, flag


def test_the_baseline_refuses_a_per_role_learning_rate_in_one_line() -> None:
    p = populora("baseline", "--preset", "tiny", "--trainer.student.lr", "0.001", "--dry-run", timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.student.lr" in lines[0] and "one optimizer" in lines[0], p.stderr
    p = populora(
        "baseline", "--preset", "tiny", "--trainer.teacher.advantage", "grpo", "--dry-run", timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["trainer"]["teacher"]["advantage"] == "grpo"
