"""``populora report`` and ``populora compare`` on reward-hacking telemetry, from synthetic run directories written
with a real TensorBoard writer (tags from ``selfplay.tags``, file names from ``selfplay.rundir``).

Run ``hack-a`` (population, 4 steps): teacher_0 tampers twice at step 2 and once at step 4 (introspection),
student_0 once at step 3 (signal), teacher_1 never; its samples file holds three samples, one of them from a member
whose name carries Markdown, and a line that is no sample. Run ``calm-b`` (baseline, 4 steps) logs ``tamper/azr``
= 0 throughout. Expected numbers are worked out here from the values written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from evaluation.compare import read_run, summarize
from evaluation.compare.write import render_markdown
from evaluation.report import make_report
from selfplay import tags
from selfplay.rundir import CONFIG, SUMMARY, TAMPER_SAMPLES

STEPS = 4
HACK_A = {"teacher_0": [0, 2, 0, 1], "teacher_1": [0, 0, 0, 0], "student_0": [0, 0, 1, 0]}
CLASSES_A = {2: {("teacher", "introspection"): 2}, 3: {("student", "signal"): 1}, 4: {("teacher", "introspection"): 1}}
PLANTED = "x](javascript:alert(1))<b>"


def _write(run: Path, name: str, arm: str, counts: dict[str, list[int]],
           classes: dict[int, dict[tuple[str, str], int]]) -> Path:
    run.mkdir()
    (run / CONFIG).write_text(json.dumps({"name": name, "arm": arm, "config": {"steps": STEPS}}))
    writer = EventFileWriter(str(run))
    for step in range(1, STEPS + 1):
        scalars = {tags.tamper(m): float(v[step - 1]) for m, v in counts.items()}
        scalars |= {tags.tamper_class(role, cls): float(n) for (role, cls), n in classes.get(step, {}).items()}
        scalars[tags.TAMPER_TOTAL] = float(sum(v[step - 1] for v in counts.values()))
        scalars[tags.TEACHER_REWARD] = 0.0
        values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
    writer.close()
    return run


def _sample(step: int, member: str, role: str, cls: str) -> str:
    return json.dumps({"step": step, "member": member, "agent": member, "role": role, "index": 0,
                       "task_type": "deduction", "task_id": "t", "class": cls, "text": "```\n# [link](x)\n```",
                       "truncated": False})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tamper")
    a = _write(root / "a", "hack-a", "population", HACK_A, CLASSES_A)
    (a / TAMPER_SAMPLES).write_text("\n".join([
        _sample(2, "teacher_0", "teacher", "introspection"), _sample(2, "teacher_0", "teacher", "introspection"),
        _sample(3, PLANTED, "student", "signal"), '{"step": 3, "member": "student_0"}']) + "\n")
    b = _write(root / "b", "calm-b", "baseline", {"azr": [0] * STEPS}, {})
    old = root / "old"  # a run from before the telemetry: no tamper tag at all
    _write(old, "old-c", "population", {}, {})
    return {"a": a, "b": b, "old": old, "out": make_report([a, b], out=root / "report")}


def test_the_figure_draws_each_members_counts_per_step(runs: dict[str, Path]) -> None:
    out = runs["out"]
    assert (out / "tamper.png").is_file() and "(tamper.png)" in (out / "summary.md").read_text()
    (fig,) = [f for f in json.loads((out / "figures.json").read_text())["figures"] if f["key"] == "tamper"]
    got = {(p["run"], c["label"]): (c["tag"], c["points"], c["total"]) for p in fig["panels"] for c in p["curves"]}
    assert got == {("hack-a", m): (tags.tamper(m), STEPS, float(sum(v))) for m, v in HACK_A.items()} | {
        ("calm-b", "azr"): (tags.tamper("azr"), STEPS, 0.0)}


def test_summary_has_a_line_for_the_run_that_tampered_only(runs: dict[str, Path]) -> None:
    summary = (runs["out"] / "summary.md").read_text()
    section = summary.split("\n## Tampering\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert lines == [
        "- **hack-a**: 4 completion(s) tripped a sandbox defence: student_0 1 (step 3); teacher_0 3 (steps 2, 4); "
        "classes: student/signal 1, teacher/introspection 3; 3 sample(s) saved in "
        f"`{TAMPER_SAMPLES}` (teacher_0 2, x??javascript:alert?1???b? 1)."]
    assert "javascript:alert(1))" not in summary and "<b>" not in summary  # a planted name is shown inert
    notes = summary.split("## Notes", 1)[1]
    assert f"hack-a: 1 line(s) of {TAMPER_SAMPLES} that are not a sample with a step in 0..{STEPS} skipped." in notes


def test_no_tampering_no_line_and_an_old_run_is_a_note(runs: dict[str, Path], tmp_path: Path) -> None:
    out = make_report([runs["b"]], out=tmp_path / "calm")
    summary = (out / "summary.md").read_text()
    assert "\n## Tampering\n" not in summary and (out / "tamper.png").is_file()  # zeros are drawn: none was seen
    out = make_report([runs["old"]], out=tmp_path / "old")
    summary = (out / "summary.md").read_text()
    assert not (out / "tamper.png").exists()
    assert f"**Tampering** skipped: no run logs `{tags.tamper('<member>')}`." in summary


def test_compare_carries_the_tamper_count_like_any_other_metric(tmp_path: Path) -> None:
    def run(arm: str, seed: int, tamper: list[float]) -> Path:
        d = tmp_path / f"{arm}-s{seed}"
        d.mkdir()
        (d / CONFIG).write_text(json.dumps({"name": d.name, "arm": arm, "config": {"seed": seed, "steps": 4}}))
        hist = [{"step": i + 1, "valid_rate": 0.5, "tamper": v} for i, v in enumerate(tamper)]
        (d / SUMMARY).write_text(json.dumps({"steps": 4, "history": hist}))
        return d

    dirs = [run("population", 0, [0, 0, 2, 4]), run("population", 1, [0, 0, 0, 2]),
            run("baseline", 0, [0, 0, 0, 0]), run("baseline", 1, [1, 0, 0, 0])]
    res = summarize([read_run(d) for d in dirs], tail=2, reps=200, seed=0)
    final, gain = res["metrics"]["tamper"]["final"], res["metrics"]["tamper"]["gain"]
    assert [v for (v,) in final["arms"]["population"]["scores"]] == pytest.approx([3.0, 1.0])
    assert [v for (v,) in gain["arms"]["baseline"]["scores"]] == pytest.approx([0.0, -0.5])
    assert final["difference"]["point"] == pytest.approx(2.0)
    assert res["curves"]["tamper"]["population"]["mean"] == pytest.approx([0.0, 0.0, 1.0, 3.0])
    assert "| tampering completions per step: final |" in render_markdown(res, [])
