"""End to end: ``populora eval`` on a tiny fake run (tiny-random base, two saved adapters, a baseline run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.data import load_code, load_humaneval, load_math
from evaluation.runner import EvalConfig, run_eval
from evaluation.scores import markdown_tables, summarize_benchmark, tensorboard_scalars
from populora_cli.eval import eval_main


def _fake_run(root: Path, name: str, members: list[str], seed: int = 0) -> Path:
    import copy

    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    model, _ = load_base("tiny-random")
    pop = LoRAPopulation(copy.deepcopy(model), members, rank=4, alpha=8, seed=seed)
    run = root / name
    for m in members:
        randomize_member(pop, m, std=0.5, seed=seed)
        pop.save(m, run / "adapters" / m)
    (run / "config.json").write_text(
        json.dumps({"name": name, "model": "tiny-random", "rank": 4, "alpha": 8})
    )
    (run / "checkpoints" / "step_7").mkdir(parents=True)
    (run / "checkpoints" / "step_7" / "DONE").write_text("7")  # complete: eval's step is the newest complete one
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return _fake_run(root, "pop", ["student_0", "teacher_0"]), _fake_run(root, "azr", ["azr"], seed=1)


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_run_eval_tiny_population(runs, data_dir, monkeypatch) -> None:
    """Real generation (tiny-random: gibberish, so every score is 0): checks the plumbing, one mixed generate
    call per benchmark, and every output file."""
    from agents.generation import HFGenerator

    run, baseline = runs
    calls: list[set] = []
    real_generate = HFGenerator.generate

    def spy(self, requests):
        calls.append({r.adapter for r in requests})
        assert all(r.temperature == 0.0 for r in requests)
        return real_generate(self, requests)

    monkeypatch.setattr(HFGenerator, "generate", spy)
    cfg = EvalConfig(
        run_dir=str(run),
        baseline=str(baseline),
        benchmarks="humaneval,mbpp+,gsm8k",
        limit=2,
        data_dir=str(data_dir),
        max_new_tokens=8,
    )
    results = run_eval(cfg)
    # the baseline fits (same base, rank, alpha, targets): one population, one call per benchmark
    assert calls == [{"student_0", "teacher_0", "bl-azr", None}] * 3
    assert set(results["benchmarks"]) == {"humaneval", "mbpp+", "gsm8k"}
    for bench, rec in results["benchmarks"].items():
        assert rec["n"] == 2
        assert set(rec["members"]) == {"student_0", "teacher_0"}
        # gibberish scores 0 everywhere; ties go to the name (best: max, weakest: min of (score, name))
        assert rec["members"] == {"student_0": 0.0, "teacher_0": 0.0}
        assert rec["population_mean"] == 0.0
        assert rec["best"] == {"member": "teacher_0", "score": 0.0}
        assert rec["weakest"] == {"member": "student_0", "score": 0.0}
        assert rec["base"] == 0.0
        assert rec["baseline"]["members"] == {"azr": 0.0} and rec["baseline"]["score"] == 0.0
        assert ("base_pass@1" in rec) == (bench == "mbpp+")
    assert results["step"] == 7 and results["complete"] is True
    out = run / "eval"
    assert json.loads((out / "results.json").read_text())["benchmarks"] == results["benchmarks"]
    md = (out / "results.md").read_text()
    assert "| humaneval | 2 |" in md and "baseline `azr`" in md and "base model" in md
    rows = [json.loads(line) for line in (out / "generations" / "gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and {r["entry"] for r in rows} == {
        "member:student_0",
        "member:teacher_0",
        "baseline:azr",
        "base:base",
    }
    scalars = _scalars(run)
    for tag in (
        "eval/humaneval/student_0",
        "eval/gsm8k/teacher_0",
        "eval/mbpp+/population_mean",
        "eval/gsm8k/base",
        "eval/humaneval/baseline/azr",
    ):
        assert scalars[tag][-1][0] == 7, tag
    assert scalars["eval/humaneval/student_0"][-1][1] == pytest.approx(
        results["benchmarks"]["humaneval"]["members"]["student_0"]
    )


def test_answers_are_scored_per_entry(runs, data_dir, monkeypatch, tmp_path) -> None:
    """A stub generator answers correctly for one member only: the scores must follow the entries exactly."""
    from agents.generation import Completion, HFGenerator

    run, _ = runs
    he = {p.task_id: p for p in load_humaneval(2)}
    gsm = load_math("gsm8k", data_dir, limit=2)
    by_prompt = {}
    from evaluation.prompting import code_spec, math_spec

    for p in he.values():  # the completion continues evalplus' pre-filled ```python fence and closes it
        by_prompt[code_spec(p, chat_template=True).prompt] = f"{p.prompt}{p.canonical_solution}\n```\n"
    for p in gsm:
        by_prompt[math_spec(p, "chat").prompt] = f"So the total is \\boxed{{{p.answers[0]}}}."

    def fake(self, requests):
        out = []
        for i, r in enumerate(requests):
            text = by_prompt[r.prompt] if r.adapter == "student_0" else "I do not know. The answer is 3.14159"
            out.append(Completion(i, 0, r.adapter, text, [], [], []))
        return out

    monkeypatch.setattr(HFGenerator, "generate", fake)
    results = run_eval(
        EvalConfig(
            run_dir=str(run),
            benchmarks="humaneval,gsm8k",
            limit=2,
            data_dir=str(data_dir),
            out_dir=str(tmp_path / "eval"),
            tensorboard=False,
            step=3,
        )
    )
    for bench in ("humaneval", "gsm8k"):
        rec = results["benchmarks"][bench]
        assert rec["members"] == {"student_0": 1.0, "teacher_0": 0.0}
        assert rec["best"] == {"member": "student_0", "score": 1.0}
        assert rec["weakest"] == {"member": "teacher_0", "score": 0.0}
        assert rec["population_mean"] == 0.5 and rec["base"] == 0.0 and rec["baseline"] is None
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["step"] == 3


def test_cli_refuses_livecodebench(runs, capsys) -> None:
    run, _ = runs
    assert eval_main([str(run), "--benchmarks", "humaneval,livecodebench"]) == 2
    err = capsys.readouterr().err
    assert "LiveCodeBench has no offline source" in err


def test_cli_missing_data_names_data_dir(runs, tmp_path, capsys) -> None:
    run, _ = runs
    assert eval_main([str(run), "--benchmarks", "gsm8k", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "gsm8k.test.jsonl" in err and "--data-dir" in err


def test_cli_samples_json(tmp_path, data_dir, capsys) -> None:
    probs = load_code("humaneval+", data_dir, limit=3)
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": p.task_id, "completion": p.canonical_solution if i else ""}) + "\n"
            for i, p in enumerate(probs)
        )
    )
    code = eval_main(
        [
            "--samples",
            str(samples),
            "--benchmark",
            "humaneval,humaneval+",
            "--limit",
            "3",
            "--json",
            "--data-dir",
            str(data_dir),
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"benchmark": "humaneval", "pass@1": pytest.approx(2 / 3), "n": 3},
        {"benchmark": "humaneval+", "pass@1": pytest.approx(2 / 3), "n": 3},
    ]


def test_results_tables_and_tags() -> None:
    rec = summarize_benchmark(
        10, {"a": 0.2, "b": 0.4}, base=0.1, baseline={"azr": 0.3}, baseline_run="runs/azr"
    )
    assert rec["population_mean"] == pytest.approx(0.3)
    assert rec["best"] == {"member": "b", "score": 0.4} and rec["weakest"] == {"member": "a", "score": 0.2}
    assert rec["baseline"] == {"score": 0.3, "run": "runs/azr", "members": {"azr": 0.3}, "students": None}
    assert rec["headline"] == "members" and rec["all_members"]["population_mean"] == pytest.approx(0.3)
    results = {"run": "runs/x", "model": "m", "benchmarks": {"gsm8k": rec}}
    md = markdown_tables(results)
    assert "| gsm8k | 10 | 30.0 | 40.0 (b) | 20.0 (a) | 10.0 | 30.0 |" in md
    tags = tensorboard_scalars(results)
    assert tags == {
        "eval/gsm8k/a": 0.2,
        "eval/gsm8k/b": 0.4,
        "eval/gsm8k/population_mean": pytest.approx(0.3),
        "eval/gsm8k/base": 0.1,
        "eval/gsm8k/best": 0.4,
        "eval/gsm8k/weakest": 0.2,
        "eval/gsm8k/baseline/azr": 0.3,
    }


def test_students_are_the_headline_rows() -> None:
    """Teachers never train as solvers: the population rows (mean, best, weakest) are over the students, every
    member stays in the secondary table and in the per-entry table."""
    members = {"teacher_0": 0.9, "teacher_1": 0.0, "student_0": 0.2, "student_1": 0.4}
    rec = summarize_benchmark(10, members, base=0.1, baseline={"azr": 0.3}, baseline_run="runs/azr",
                              students=["student_0", "student_1"], baseline_students=["azr"])
    assert rec["headline"] == "students" and rec["students"] == ["student_0", "student_1"]
    assert rec["population_mean"] == pytest.approx(0.3)
    assert rec["best"] == {"member": "student_1", "score": 0.4}
    assert rec["weakest"] == {"member": "student_0", "score": 0.2}
    assert rec["all_members"]["population_mean"] == pytest.approx(0.375)
    assert rec["all_members"]["best"] == {"member": "teacher_0", "score": 0.9}
    assert rec["all_members"]["weakest"] == {"member": "teacher_1", "score": 0.0}
    assert rec["members"] == members and rec["baseline"]["score"] == 0.3
    md = markdown_tables({"run": "runs/x", "model": "m", "benchmarks": {"gsm8k": rec}})
    assert "| benchmark | n | students: mean | best | weakest | base | baseline |" in md
    assert "| gsm8k | 10 | 30.0 | 40.0 (student_1) | 20.0 (student_0) | 10.0 | 30.0 |" in md
    assert "## All members (teachers included" in md and "| gsm8k | 10 | 37.5 | 90.0 (teacher_0) | 0.0 (teacher_1) |" in md
    assert "| student_0 (student) | 20.0 |" in md and "| teacher_0 | 90.0 |" in md and "**students mean**" in md
    tags = tensorboard_scalars({"benchmarks": {"gsm8k": rec}})
    assert tags["eval/gsm8k/population_mean"] == pytest.approx(0.3)
    assert tags["eval/gsm8k/all_members/population_mean"] == pytest.approx(0.375)
    assert tags["eval/gsm8k/all_members/best"] == 0.9
