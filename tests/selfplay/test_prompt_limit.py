"""AZR's prompt-length rule in a run (``generation.max_prompt_tokens``): prompts over the limit are never
generated, the run goes on, every dropped prompt is counted per role in TensorBoard and in a log line, and what
stands for it is a format error in the game and is not trained on."""

from __future__ import annotations

from evaluation.report import load_scalars
from selfplay import tags
from tests.selfplay.conftest import TINY


def test_a_run_drops_long_prompts_counts_them_and_goes_on(run_cli, tmp_path):
    run = tmp_path / "run"
    p = run_cli("train", *TINY, "--steps", "2", "--generation.max-prompt-tokens", "1", "--run-dir", str(run),
                "--pbt.interval", "5", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    sc = load_scalars(run)

    def at(tag):
        return dict(sc.get(tag, ()))

    teachers = at(tags.dropped_prompts("teacher"))
    students = at(tags.dropped_prompts("student"))
    assert teachers == {1: 4.0, 2: 4.0}  # 2 teachers x 2 tasks: every prompt is longer than one token
    assert set(students) == {1, 2} and all(v > 0 for v in students.values())
    assert at(tags.validity("format")) == {1: 4.0, 2: 4.0}  # the empty proposals: format errors
    assert at(tags.STUDENT_FORMAT_RATE) == {1: 0.0, 2: 0.0}
    assert not any(tags.parse_member(t) and tags.parse_member(t)[1] == "loss" for t in sc)  # nothing trained on
    lines = [ln for ln in p.stderr.splitlines() if "prompt(s) longer than 1 tokens before generation" in ln]
    assert len(lines) == 2 and all("and 4 teacher prompt(s)" in ln for ln in lines), p.stderr[-2000:]
