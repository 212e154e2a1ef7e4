"""evaluation.compare on fabricated run directories: what counts as complete, the per-metric scores a run
gives (final / gain over its last and first steps), the blocks of compare.json and the files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.compare import State, compare_runs, read_run, summarize
from evaluation.compare.write import render_markdown


def fake_run(root: Path, arm: str, seed: int, valid: list[float], steps_total: int | None = None,
             summary: bool = True, evals: dict[str, float] | None = None) -> Path:
    """A run directory as the training loop leaves it: config.json, run_summary.json (history of valid_rate,
    solve_rate constant 0.5), optionally a complete eval/results.json."""
    d = root / f"{arm}-s{seed}"
    d.mkdir(parents=True)
    steps = len(valid) if steps_total is None else steps_total
    (d / "config.json").write_text(json.dumps({
        "name": d.name, "arm": arm,
        "config": {"seed": seed, "preset": "tiny.json", "steps": steps,
                   "env": {"reward_scheme": "azr" if arm == "baseline" else "populora"}}}))
    if summary:
        hist = [{"step": i + 1, "valid_rate": v, "solve_rate": 0.5, "teacher_reward": None}
                for i, v in enumerate(valid)]
        (d / "run_summary.json").write_text(json.dumps({"steps": len(valid), "history": hist}))
    if evals is not None:
        (d / "eval").mkdir()
        (d / "eval" / "results.json").write_text(json.dumps({
            "complete": True,
            "benchmarks": {b: {"population_mean": v, "best": {"member": "m", "score": v}} for b, v in evals.items()},
            "aggregates": {"code": {"population_mean": sum(evals.values()) / len(evals)}, "math": None}}))
    return d


def test_states(tmp_path: Path) -> None:
    assert read_run(tmp_path / "nothing").state is State.ABSENT
    (tmp_path / "empty").mkdir()
    assert read_run(tmp_path / "empty").state is State.ABSENT
    (tmp_path / "setup").mkdir()
    (tmp_path / "setup" / "seeding.json").write_text("{}")
    assert read_run(tmp_path / "setup").state is State.UNSTARTED
    assert read_run(fake_run(tmp_path, "population", 0, [0.1], summary=False)).state is State.UNFINISHED
    # a summary of an earlier, shorter session (2 of 4 steps) is not complete
    assert read_run(fake_run(tmp_path, "population", 1, [0.1, 0.2], steps_total=4)).state is State.UNFINISHED
    done = read_run(fake_run(tmp_path, "baseline", 0, [0.1, 0.2]))
    assert done.state is State.COMPLETE and done.arm == "baseline" and done.seed == 0 and done.steps_done == 2


def test_summary_blocks_by_hand(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path, "population", 0, [0.0, 0.2, 0.4, 0.6], evals={"humaneval": 0.2, "gsm8k": 0.1}),
        fake_run(tmp_path, "population", 1, [0.2, 0.2, 0.6, 0.8], evals={"humaneval": 0.4, "gsm8k": 0.1}),
        fake_run(tmp_path, "baseline", 0, [0.1, 0.1, 0.1, 0.1], evals={"humaneval": 0.1, "gsm8k": 0.0}),
        fake_run(tmp_path, "baseline", 1, [0.3, 0.3, 0.1, 0.1], evals={"humaneval": 0.3, "gsm8k": 0.2}),
        fake_run(tmp_path, "population", 2, [0.5], steps_total=4),  # unfinished: excluded
    ]
    res = summarize([read_run(r) for r in runs], tail=2, reps=500, seed=0)
    assert list(res["excluded"]) == [str(runs[4])]
    final = res["metrics"]["valid_rate"]["final"]
    # final = mean of the last 2 steps: population 0.5 and 0.7, baseline 0.1 and 0.1
    assert [v for (v,) in final["arms"]["population"]["scores"]] == pytest.approx([0.5, 0.7])
    assert final["arms"]["population"]["mean"]["point"] == pytest.approx(0.6)
    assert final["difference"]["point"] == pytest.approx(0.5)
    # every population run above every baseline run
    assert final["probability_of_improvement"]["point"] == pytest.approx(1.0)
    assert final["probability_of_improvement"]["low"] == pytest.approx(1.0)
    # gain = last 2 minus first 2: population 0.4 and 0.5, baseline 0.0 and -0.2
    gain = res["metrics"]["valid_rate"]["gain"]
    assert [v for (v,) in gain["arms"]["baseline"]["scores"]] == pytest.approx([0.0, -0.2])
    assert gain["difference"]["point"] == pytest.approx(0.45 - (-0.1))
    # difference interval: population resamples give 0.5/0.6/0.7 (0.4/0.45/0.5 gain) ...: final's is [0.4, 0.6]
    assert (final["difference"]["low"], final["difference"]["high"]) == pytest.approx((0.4, 0.6))
    # a metric no run logged is absent, with a note; teacher_reward was always None
    assert "teacher_reward" not in res["metrics"] and "no run logged teacher_reward" in res["notes"]
    # solve_rate was 0.5 at every step of every complete run: no signal, so no interval and no P(improvement)
    assert res["no_signal"] == {"solve_rate": {"value": 0.5, "runs": 4}}
    assert "solve_rate" not in res["metrics"] and "solve_rate" not in res["curves"]
    # curves: step 3 has population values 0.4 and 0.6
    c = res["curves"]["valid_rate"]["population"]
    assert c["steps"] == [1, 2, 3, 4] and c["mean"][2] == pytest.approx(0.5) and c["runs"] == [2, 2, 2, 2]
    # eval: per benchmark, AZR's aggregate row, and the stratified aggregate over the common benchmarks
    ev = res["eval"]
    assert set(ev["benchmarks"]) == {"humaneval", "gsm8k", "aggregate/code"}
    assert ev["benchmarks"]["humaneval"]["arms"]["population"]["mean"]["point"] == pytest.approx(0.3)
    assert ev["aggregate"]["benchmarks"] == ["gsm8k", "humaneval"]
    assert ev["aggregate"]["arms"]["population"]["mean"]["point"] == pytest.approx((0.1 + 0.3) / 2)
    assert ev["aggregate"]["difference"]["point"] == pytest.approx(0.2 - 0.15)
    # PoI averaged over the two benchmarks: gsm8k (0.1, 0.1 vs 0.0, 0.2): 2 wins of 4 -> 0.5;
    # humaneval (0.2, 0.4 vs 0.1, 0.3): 3 of 4 -> 0.75
    assert ev["aggregate"]["probability_of_improvement"]["point"] == pytest.approx((0.5 + 0.75) / 2)
    assert any("different reward schemes" in n for n in res["notes"])


def test_compare_runs_writes_files(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / "runs", arm, s, [0.1 * s, 0.2, 0.3]) for arm in ("population", "baseline")
            for s in range(2)]
    files = compare_runs(runs, tmp_path / "out", tail=1, reps=200)
    names = sorted(f.name for f in files)
    assert names == ["compare.json", "compare.md", "curves.png", "final.png"]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "teachers' valid rate: final" in md and "![curves.png](curves.png)" in md
    assert "- solve rate (matched tasks): 0.5 in all 4 runs — carries no signal" in md
    assert "solve rate (matched tasks): final" not in md
    assert " with 2 seeds per arm it understates the uncertainty" in md  # the runs' own count, not a constant
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert data["metrics"]["valid_rate"]["final"]["difference"]["point"] == pytest.approx(0.0)
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_comparison_whose_metrics_never_moved_says_so(tmp_path: Path) -> None:
    """Runs whose every metric is constant (what tiny-random runs give) report no interval at all: the table is
    replaced by the statement that no metric varied, and each metric is labelled as carrying no signal."""
    runs = [fake_run(tmp_path, arm, s, [0.0, 0.0, 0.0]) for arm in ("population", "baseline") for s in range(2)]
    res = summarize([read_run(r) for r in runs], tail=1, reps=100, seed=0)
    assert res["metrics"] == {} and res["curves"] == {}
    assert res["no_signal"] == {"valid_rate": {"value": 0.0, "runs": 4}, "solve_rate": {"value": 0.5, "runs": 4}}
    md = render_markdown(res, [])
    assert "No metric varied over the runs: none carries a signal." in md
    assert "- teachers' valid rate: 0 in all 4 runs — carries no signal" in md
    assert "P(population > baseline)" not in md
    res = summarize([read_run(r) for r in runs[:1]], tail=1, reps=100, seed=0)  # one run is no exception
    assert set(res["no_signal"]) == {"valid_rate", "solve_rate"}
