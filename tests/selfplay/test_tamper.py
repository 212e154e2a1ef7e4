"""Reward-hacking telemetry of the run layer (``selfplay.tamper``, the logger's ``tamper/`` tags, the samples file
and its resume), on hand-built rounds: no model, no sandbox. The env's own marking of a tampering program is
``tests/selfplay/test_tamper_run.py``'s (a scripted run through the real env).

Every tag name comes from ``selfplay.tags`` and every file name from ``selfplay.rundir``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.generation import Completion
from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundOutcome, RoundResults
from selfplay import logger, tags
from selfplay import rundir as rd
from selfplay import tamper as tp
from selfplay.config import ConfigError, TrainConfig
from selfplay.loop import StepRecord
from selfplay.mapping import AgentMapping
from selfplay.resume import truncate_tamper_samples
from selfplay.rundir import TAMPER_SAMPLES, RunDir, RunFileError, UnsafeRunFile, tamper_sample_ok

TEACHERS, STUDENTS = ("teacher_0", "teacher_1"), ("student_0", "student_1")


def _text(agent: str, index: int, step: int) -> str:
    return f"<answer>\n```python\ndef f(x):  # {agent} #{index} at step {step}\n    return x\n```\n</answer>"


def _record(step: int, marks: dict[tuple[str, int], str], mapping: AgentMapping | None = None,
            texts: dict[tuple[str, int], str] | None = None) -> StepRecord:
    """One round: each teacher 2 deduction proposals, each student 2 attempts at the first teacher's task;
    ``marks``: (agent, index) -> the defence class the env recorded (reason ``tamper``), the rest ordinary.
    ``mapping``: default one member per agent of TEACHERS and STUDENTS."""
    mapping = mapping or AgentMapping.build(TEACHERS, STUDENTS)
    teachers = tuple(a for a, role in mapping.agent_roles.items() if role == "teacher")
    students = tuple(a for a, role in mapping.agent_roles.items() if role == "student")
    proposals = tuple(ProposalResult(t, i, "deduction", f"{t}-{i}", True, (t, i) not in marks,
                                     "tamper" if (t, i) in marks else None, marks.get((t, i)))
                      for t in teachers for i in range(2))
    task = f"{teachers[0]}-0"
    attempts = tuple(AttemptResult(s, i, task, "deduction", teachers[0], True, False,
                                   "tamper" if (s, i) in marks else "wrong", marks.get((s, i)))
                     for s in students for i in range(2))
    matches = tuple(MatchResult(t, s, 0.5, 0.0, 1, 2, 0, "teacher") for t, s in zip(teachers, students, strict=False))
    results = RoundResults(step, teachers, students, proposals, attempts, matches)
    outcome = RoundOutcome(results, {a: (0.0, 0.0) for a in results.agents},
                           {a: (25.0, 8.0) for a in results.agents}, {"metrics": {}})
    texts = texts or {}
    completions = {(a, i): Completion(0, i, a, texts.get((a, i), _text(a, i, step)), [1], [1, 2], [0.0, 0.0])
                   for a in results.agents for i in range(2)}
    return StepRecord(step, outcome, completions, {}, mapping, {})


# ---------------------------------------------------------------------------------------------- the counts


def test_step_scalars_count_tampering_per_member_role_and_class() -> None:
    marks = {("teacher_0", 1): "introspection", ("student_1", 0): "signal", ("student_1", 1): "type_dict",
             ("student_0", 1): "signal"}
    out = logger.step_scalars(_record(3, marks))
    assert {t: v for t, v in out.items() if tags.parse_tamper(t)} == {
        tags.tamper("teacher_0"): 1.0, tags.tamper("teacher_1"): 0.0,
        tags.tamper("student_0"): 1.0, tags.tamper("student_1"): 2.0}
    assert {t: v for t, v in out.items() if tags.parse_tamper_class(t)} == {
        tags.tamper_class("teacher", "introspection"): 1.0, tags.tamper_class("student", "signal"): 2.0,
        tags.tamper_class("student", "type_dict"): 1.0}
    assert out[tags.TAMPER_TOTAL] == 4.0
    assert out[tags.validity("tamper")] == 1.0  # the env's reason, counted like any other


def test_the_baselines_one_member_counts_both_roles_and_the_classes_keep_them_apart() -> None:
    mapping = AgentMapping.build(("teacher_0",), ("student_0",), {"teacher_0": "azr", "student_0": "azr"})
    out = logger.step_scalars(_record(1, {("teacher_0", 0): "signal", ("student_0", 1): "signal"}, mapping))
    assert out[tags.tamper("azr")] == 2.0 and tags.tamper("teacher_0") not in out
    assert out[tags.tamper_class("teacher", "signal")] == 1.0 and out[tags.tamper_class("student", "signal")] == 1.0


def test_a_round_without_tampering_adds_zero_counts_and_changes_no_other_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's case: every member's count is logged as 0, the total too, no class tag, and every other
    scalar is what the logger gives with the telemetry switched off."""
    record = _record(2, {})
    out = logger.step_scalars(record)
    monkeypatch.setattr(logger, "tamper_scalars", lambda record: {})
    without = logger.step_scalars(record)
    added = {t: v for t, v in out.items() if t not in without}
    assert added == {**{tags.tamper(m): 0.0 for m in (*TEACHERS, *STUDENTS)}, tags.TAMPER_TOTAL: 0.0}
    assert {t: v for t, v in out.items() if t in without} == without


def test_tag_parsers_tell_members_from_classes() -> None:
    assert tags.parse_tamper(tags.tamper("teacher_0")) == "teacher_0"
    assert tags.parse_tamper(tags.tamper_class("student", "signal")) is None
    assert tags.parse_tamper_class(tags.tamper_class("student", "signal")) == ("student", "signal")
    assert tags.parse_tamper_class(tags.tamper("teacher")) is None  # a member named like a role stays a member
    assert tags.parse_tamper_class("tamper/judge/signal") is None and tags.parse_tamper(tags.TAMPER_TOTAL) is None


# --------------------------------------------------------------------------------------------- the samples


def _lines(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / TAMPER_SAMPLES).read_text().splitlines()]


def _config(run: Path, steps: int = 10) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / rd.CONFIG).write_text(json.dumps({"name": run.name, "config": {"steps": steps}}))
    return run


STEPS_MARKS = {  # teacher_0 tampers 3 times over the steps, student_1 once, teacher_1 never
    1: {("teacher_0", 0): "introspection", ("student_1", 1): "signal"},
    2: {("teacher_0", 0): "type_dict", ("teacher_0", 1): "introspection"},
    3: {("teacher_0", 1): "signal"},
}


def test_the_first_k_of_each_member_are_saved_with_step_and_class(tmp_path: Path) -> None:
    run = _config(tmp_path / "run")
    sampler = tp.TamperSampler(run, 2)
    written = [sampler.write(_record(s, marks)) for s, marks in STEPS_MARKS.items()]
    assert written == [2, 1, 0]  # teacher_0's third (step 2, index 1) and fourth are past K = 2
    lines = _lines(run)
    assert [(r["step"], r["member"], r["role"], r["index"], r["class"]) for r in lines] == [
        (1, "teacher_0", "teacher", 0, "introspection"), (1, "student_1", "student", 1, "signal"),
        (2, "teacher_0", "teacher", 0, "type_dict")]
    assert lines[0]["text"] == _text("teacher_0", 0, 1) and lines[0]["truncated"] is False
    assert lines[1]["task_id"] == "teacher_0-0" and lines[1]["agent"] == "student_1"
    assert all(tamper_sample_ok(r, 10) for r in lines)
    assert RunDir(run).tamper_samples() == lines


def test_no_limit_writes_no_file_and_a_long_text_is_cut_and_kept_as_data(tmp_path: Path) -> None:
    run = _config(tmp_path / "run")
    assert tp.TamperSampler(run, 0).write(_record(1, STEPS_MARKS[1])) == 0
    assert not (run / TAMPER_SAMPLES).exists()
    hostile = "```\n\x1b[2J\u202e" + "import os; os.system('x')\n" * 2000  # escapes, bidi, shell: stays a string
    tp.TamperSampler(run, 5).write(_record(1, {("teacher_0", 0): "exit"}, texts={("teacher_0", 0): hostile}))
    raw = (run / TAMPER_SAMPLES).read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1  # one line, escapes only
    (rec,) = _lines(run)
    assert rec["text"] == hostile[:tp.MAX_TAMPER_TEXT] and rec["truncated"] is True


def test_resume_drops_the_samples_after_the_checkpoint_and_the_replay_writes_the_same_file(tmp_path: Path) -> None:
    """A run stopped (or killed) after any step, resumed from the checkpoint of an earlier step, ends with the
    uninterrupted run's file: no sample lost, none twice, K still counted over the whole run."""
    ref = _config(tmp_path / "ref")
    sampler = tp.TamperSampler(ref, 2)
    for s, marks in STEPS_MARKS.items():
        sampler.write(_record(s, marks))
    expected = (ref / TAMPER_SAMPLES).read_bytes()
    for checkpoint in (0, 1, 2, 3):
        run = _config(tmp_path / f"killed-{checkpoint}")
        sampler = tp.TamperSampler(run, 2)
        for s, marks in STEPS_MARKS.items():  # the killed session wrote every step...
            sampler.write(_record(s, marks))
        with open(run / TAMPER_SAMPLES, "a") as f:
            f.write('{"step": 4, "member": "teach')  # ...and was killed in the middle of a line
        truncate_tamper_samples(run, checkpoint)
        sampler = tp.TamperSampler(run, 2)  # the resumed session counts what the file holds
        for s, marks in STEPS_MARKS.items():
            if s > checkpoint:
                sampler.write(_record(s, marks))
        assert (run / TAMPER_SAMPLES).read_bytes() == expected, checkpoint


def test_resume_point_truncates_the_samples(tmp_path: Path) -> None:
    """Through the one entry a resumed run goes through: a run killed before its first checkpoint restarts from
    step 0 and keeps no sample."""
    from selfplay.config import to_dict
    from selfplay.resume import resume_point

    run = tmp_path / "run"
    run.mkdir()
    (run / rd.CONFIG).write_text(json.dumps({"name": run.name, "config": to_dict(TrainConfig())}))
    tp.TamperSampler(run, 2).write(_record(1, STEPS_MARKS[1]))
    assert len(_lines(run)) == 2
    with resume_point(TrainConfig(resume=run)) as point:
        assert point.checkpoint is None
    assert (run / TAMPER_SAMPLES).read_text() == ""


def test_the_file_stops_growing_at_what_its_readers_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line that would take the file past the reader's bound is not written (nor counted), and a resumed sampler,
    reading the file back, decides the same."""
    run = _config(tmp_path / "run")
    one = len(tp.TamperSampler(run, 9).lines(_record(1, {("teacher_0", 0): "signal"}))[0])
    monkeypatch.setattr(tp, "MAX_TAMPER_BYTES", 2 * one + 10)
    sampler = tp.TamperSampler(run, 9)
    long_text = {("teacher_1", 0): "x" * 500}
    assert sampler.write(_record(1, {("teacher_0", 0): "signal", ("teacher_1", 0): "signal"}, texts=long_text)) == 1
    assert sampler.saved == {"teacher_0": 1}
    assert sampler.write(_record(2, {("teacher_0", 0): "signal"})) == 1  # a short one still fits
    assert tp.TamperSampler(run, 9).write(_record(3, {("teacher_0", 0): "signal"})) == 0
    assert os.path.getsize(run / TAMPER_SAMPLES) <= 2 * one + 10


def test_the_writer_refuses_a_planted_link(tmp_path: Path) -> None:
    run = _config(tmp_path / "run")
    target = tmp_path / "elsewhere.txt"
    target.write_text("")
    (run / TAMPER_SAMPLES).symlink_to(target)
    with pytest.raises(UnsafeRunFile):
        tp.TamperSampler(run, 2).write(_record(1, STEPS_MARKS[1]))  # the reader refuses the link out first
    assert target.read_text() == ""


# ---------------------------------------------------------------------------------------------- the reader


GOOD = {"step": 1, "member": "teacher_0", "agent": "teacher_0", "role": "teacher", "index": 0,
        "task_type": "deduction", "task_id": "t", "class": "signal", "text": "def f(x): ...", "truncated": False}


@pytest.mark.parametrize("bad", [
    {**GOOD, "step": True}, {**GOOD, "step": 11}, {**GOOD, "step": -1}, {**GOOD, "index": -1},
    {**GOOD, "member": 7}, {**GOOD, "class": "x" * 300}, {**GOOD, "truncated": 0}, {**GOOD, "extra": 1},
    {k: v for k, v in GOOD.items() if k != "text"}, ["not", "an", "object"], 3,
])
def test_the_reader_skips_what_a_run_never_writes_with_a_note(tmp_path: Path, bad: object) -> None:
    run = _config(tmp_path / "run")
    (run / TAMPER_SAMPLES).write_text(json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n{torn\n")
    reader = RunDir(run)
    assert reader.tamper_samples() == [GOOD]
    assert reader.notes == [f"2 line(s) of {TAMPER_SAMPLES} that are not a sample with a step in 0..10 skipped."]


def test_the_reader_refuses_deep_json_large_files_and_links_out(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run = _config(tmp_path / "run")
    (run / TAMPER_SAMPLES).write_text("[" * 200 + "]" * 200 + "\n")
    with pytest.raises(UnsafeRunFile, match="nests deeper"):
        RunDir(run).tamper_samples()
    (run / TAMPER_SAMPLES).write_text(json.dumps(GOOD) + "\n")
    monkeypatch.setattr(rd, "MAX_TAMPER_BYTES", 10)
    with pytest.raises(RunFileError, match="more than the 10"):
        RunDir(run).tamper_samples()
    monkeypatch.undo()
    (run / TAMPER_SAMPLES).unlink()
    (tmp_path / "outside.jsonl").write_text(json.dumps(GOOD) + "\n")
    (run / TAMPER_SAMPLES).symlink_to(tmp_path / "outside.jsonl")
    with pytest.raises(UnsafeRunFile, match="symbolic link out of the run directory"):
        RunDir(run).tamper_samples()


# ---------------------------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("value", [-1, 1001, True])
def test_a_bad_tamper_samples_setting_names_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match="tamper_samples"):
        TrainConfig(tamper_samples=value).validate()  # type: ignore[arg-type]
