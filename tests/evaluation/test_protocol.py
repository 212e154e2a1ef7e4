"""The evaluation protocol: per-benchmark budgets (AZR's on GPU), avg@k over sampled answers next to greedy
pass@1, and AZR's aggregate rows with the weakest member against the baseline — pinned on hand-made answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.data import load_math
from evaluation.prompting import math_prompt
from evaluation.runner import (
    EvalConfig,
    parse_budgets,
    resolve_budgets,
    resolve_profile,
    resolve_samples,
    run_eval,
    sample_seed,
)
from evaluation.scores import aggregate_rows, markdown_tables, summarize_benchmark, tensorboard_scalars
from populora_cli.eval import eval_main
from tests.evaluation.test_runner import _fake_run

# ------------------------------------------------------------------------------------------- budgets


def test_budgets_default_to_azr_on_gpu_and_stay_small_on_cpu() -> None:
    benches = ["humaneval+", "mbpp+", "aime24", "gsm8k"]
    cfg = EvalConfig(run_dir="r")
    assert resolve_profile(cfg, "cuda") == "gpu" and resolve_profile(cfg, "cuda:1") == "gpu"
    assert resolve_profile(cfg, "cpu") == "cpu"
    assert resolve_profile(EvalConfig(run_dir="r", budget_profile="gpu"), "cpu") == "gpu"
    # code: evalplus' 768 new tokens (AZR's HumanEval+/MBPP+ numbers); math: AZR's 16,000
    assert resolve_budgets(cfg, benches, "gpu") == {"humaneval+": 768, "mbpp+": 768, "aime24": 16000, "gsm8k": 16000}
    assert resolve_budgets(cfg, benches, "cpu") == dict.fromkeys(benches, 512)
    assert resolve_samples(cfg, "gpu") == 16 and resolve_samples(cfg, "cpu") == 0
    assert resolve_samples(EvalConfig(run_dir="r", samples_per_problem=4), "cpu") == 4


def test_budget_overrides_most_specific_first() -> None:
    benches = ["humaneval+", "mbpp+", "aime24", "gsm8k"]
    cfg = EvalConfig(run_dir="r", max_new_tokens=1000, max_new_tokens_math=2000, budgets="AIME2024=32768")
    assert resolve_budgets(cfg, benches, "gpu") == {"humaneval+": 1000, "mbpp+": 1000, "aime24": 32768, "gsm8k": 2000}
    cfg = EvalConfig(run_dir="r", max_new_tokens_code=300, budgets="mbpp+=64")
    assert resolve_budgets(cfg, benches, "gpu") == {"humaneval+": 300, "mbpp+": 64, "aime24": 16000, "gsm8k": 16000}
    assert parse_budgets(" aime24=7, he+=9 ,") == {"aime24": 7, "humaneval+": 9}


@pytest.mark.parametrize(("fields", "message"), [
    ({"budgets": "aime24"}, "not NAME=N"),
    ({"budgets": "aime24=many"}, "is not an integer"),
    ({"budgets": "aime24=0"}, "aime24 must be >= 1"),
    ({"budgets": "aime26=10"}, "unknown benchmark 'aime26'"),
    ({"samples_per_problem": -1}, "must be >= 0, got -1"),
    ({"sample_top_p": 0.0}, "must be > 0, got 0"),
    ({"sample_temperature": 0.0}, "must be > 0, got 0"),
    ({"sample_temperature": 101.0}, "must be <= 100, got 101"),
    ({"budget_profile": "tpu"}, "must be one of auto, gpu, cpu, got 'tpu'"),
    ({"device": "gpu"}, "must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ({"engine": "tgi"}, "must be one of auto, hf, vllm"),
    ({"math_template": "boxed"}, "must be one of auto, r1, chat, got 'boxed'"),
    ({"chunk_size": 0}, "must be >= 1, got 0"),
    ({"limit": 0}, "must be >= 1, got 0"),
    ({"threads": -1}, "must be >= 0, got -1"),
    ({"max_new_tokens_math": 0}, "must be >= 1, got 0"),
    ({"sampled_benchmarks": "aime24,livecodebench"}, "LiveCodeBench has no offline source"),
])
def test_bad_settings_are_refused_before_any_work(fields: dict, message: str, tmp_path: Path, capsys) -> None:
    """One line per bad value, naming the flag: ``populora eval: error: --FIELD: reason`` (train's format)."""
    from populora_env.config import ConfigError

    (name, value), = fields.items()
    with pytest.raises(ConfigError) as exc:
        EvalConfig(run_dir=str(tmp_path), **fields).validate()
    assert exc.value.field == name and message in exc.value.reason
    flag = f"--{name.replace('_', '-')}"
    assert eval_main([str(tmp_path), flag, str(value)]) == 2  # the run directory does not exist: checked first
    err = capsys.readouterr().err
    assert err.startswith(f"populora eval: error: {flag}: ") and message in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------- avg@k


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return _fake_run(tmp_path_factory.mktemp("runs"), "pop", ["student_0", "teacher_0"])


def test_avg_at_k_next_to_greedy_pass_at_1(run: Path, data_dir, monkeypatch, tmp_path: Path) -> None:
    """A scripted generator: greedy answers are right for student_0 and the base model; of the k = 4 sampled
    answers to problem i, student_0 gets the first i + 1 right, teacher_0 none, the base model all. So on two
    problems avg@4 is (1/4 + 2/4) / 2 = 0.375 for student_0, 0 for teacher_0 and 1 for the base."""
    from agents.generation import Completion, HFGenerator

    problems = load_math("aime24", data_dir, limit=2)
    index_of = {math_prompt(p): i for i, p in enumerate(problems)}
    seen = []

    def right(i: int) -> str:
        return f"The answer is \\boxed{{{problems[i].answers[0]}}}."

    calls: list[set[float]] = []

    def fake(self, requests):
        calls.append({r.temperature for r in requests})
        out = []
        for r_index, r in enumerate(requests):
            i = index_of.get(r.prompt)
            if i is None:  # gsm8k
                out += [Completion(r_index, s, r.adapter, "\\boxed{-1}", [], [], []) for s in range(r.n)]
                continue
            seen.append(r)
            for s in range(r.n):
                greedy = r.temperature == 0.0
                if r.adapter is None:
                    ok = True
                elif r.adapter == "student_0":
                    ok = greedy or s < i + 1
                else:
                    ok = False
                out.append(Completion(r_index, s, r.adapter, right(i) if ok else "\\boxed{-1}", [], [], []))
        return out

    monkeypatch.setattr(HFGenerator, "generate", fake)
    results = run_eval(EvalConfig(run_dir=str(run), benchmarks="aime24,gsm8k", limit=2, data_dir=str(data_dir),
                                  samples_per_problem=4, out_dir=str(tmp_path / "eval"), tensorboard=False,
                                  max_new_tokens=16))
    rec = results["benchmarks"]["aime24"]
    assert rec["members"] == {"student_0": 1.0, "teacher_0": 0.0} and rec["base"] == 1.0
    sampled = rec["avg@k"]
    assert (sampled["k"], sampled["temperature"], sampled["top_p"]) == (4, 0.6, 0.95)
    assert sampled["members"] == {"student_0": pytest.approx(0.375), "teacher_0": 0.0} and sampled["base"] == 1.0
    assert sampled["population_mean"] == pytest.approx(0.1875)
    assert sampled["weakest"] == {"member": "teacher_0", "score": 0.0}
    assert "avg@k" not in results["benchmarks"]["gsm8k"]  # not a sampled benchmark
    assert results["sampling"] == {"k": 4, "temperature": 0.6, "top_p": 0.95, "benchmarks": ["aime24"]}

    # the requests: greedy n = 1, then n = 4 at T 0.6 / top-p 0.95, the same seed for every entry of a problem
    sampled_requests = [r for r in seen if r.temperature > 0]
    assert {(r.n, r.temperature, r.top_p) for r in sampled_requests} == {(4, 0.6, 0.95)}
    assert len(sampled_requests) == 2 * 3  # two problems x (two members + base)
    assert calls == [{0.0}, {0.6}, {0.0}]  # aime24 greedy, aime24 sampled (one call), gsm8k greedy
    for r in sampled_requests:
        assert r.seed == sample_seed(0, "aime24", index_of[r.prompt])
    assert sample_seed(0, "aime24", 0) != sample_seed(0, "aime24", 1) != sample_seed(0, "aime25", 1)

    out = tmp_path / "eval"
    md = (out / "results.md").read_text()
    assert "## avg@k over sampled answers (%; temperature 0.6, top-p 0.95)" in md
    assert "| aime24 | 4 | 18.8 | 37.5 (student_0) | 0.0 (teacher_0) | 100.0 | – | 50.0 |" in md
    assert "| entry | pass@1 (%) | avg@4 (%) |" in md and "| student_0 | 100.0 | 37.5 |" in md
    rows = [json.loads(line) for line in (out / "generations" / "aime24.jsonl").read_text().splitlines()]
    sampled_rows = [r for r in rows if r["decoding"] == "sampled"]
    assert len(rows) == 2 * 3 + 2 * 3 * 4 and len(sampled_rows) == 24
    mine = [r["passed"] for r in sampled_rows if r["entry"] == "member:student_0"]
    assert mine == [True, False, False, False, True, True, False, False]
    assert [r["sample"] for r in sampled_rows if r["entry"] == "member:student_0"] == [0, 1, 2, 3] * 2
    tags = tensorboard_scalars(results)
    assert tags["eval/aime24/avg@4/student_0"] == pytest.approx(0.375) and tags["eval/aime24/student_0"] == 1.0


def test_gpu_profile_budgets_reach_the_generator(run: Path, data_dir, monkeypatch, tmp_path: Path) -> None:
    from agents.generation import Completion, HFGenerator

    budgets: dict[tuple[str, float], set[int]] = {}
    from evaluation.prompting import EVALPLUS_INSTRUCTION

    code = {EVALPLUS_INSTRUCTION: "humaneval+"}

    def fake(self, requests):
        for r in requests:
            kind = "code" if any(k in r.prompt for k in code) else "math"
            budgets.setdefault((kind, r.temperature), set()).add(r.max_new_tokens)
        return [Completion(i, s, r.adapter, "no", [], [], []) for i, r in enumerate(requests) for s in range(r.n)]

    monkeypatch.setattr(HFGenerator, "generate", fake)
    results = run_eval(EvalConfig(run_dir=str(run), benchmarks="humaneval+,amc23", limit=1, data_dir=str(data_dir),
                                  budget_profile="gpu", out_dir=str(tmp_path / "e"), tensorboard=False,
                                  include_base=False))
    assert budgets == {("code", 0.0): {768}, ("math", 0.0): {16000}, ("math", 0.6): {16000}}
    assert results["budgets"] == {"humaneval+": 768, "amc23": 16000} and results["budget_profile"] == "gpu"
    assert results["benchmarks"]["amc23"]["avg@k"]["k"] == 16  # the gpu profile samples 16 answers


# ------------------------------------------------------------------------------------------- aggregates


def _bench(members: dict[str, float], base: float, baseline: float) -> dict:
    return summarize_benchmark(10, members, base=base, baseline={"azr": baseline}, baseline_run="runs/azr")


HAND_MADE = {
    "humaneval": _bench({"a": 1.0, "b": 0.0}, 0.9, 0.9),  # not in AZR's tables: ignored
    "humaneval+": _bench({"a": 0.5, "b": 0.3}, 0.2, 0.4),
    "mbpp+": _bench({"a": 0.7, "b": 0.5}, 0.4, 0.6),
    "gsm8k": _bench({"a": 0.0, "b": 1.0}, 0.9, 0.9),  # not in AZR's tables: ignored
    "aime24": _bench({"a": 0.1, "b": 0.3}, 0.0, 0.2),
    "math500": _bench({"a": 0.5, "b": 0.9}, 0.2, 0.4),
}


def test_aggregate_rows_on_hand_made_results() -> None:
    rows = aggregate_rows(HAND_MADE, "runs/azr")
    code, math, overall = rows["code"], rows["math"], rows["overall"]
    # code = mean(HE+, MBPP+): a 0.6, b 0.4, base 0.3, azr 0.5
    assert code["members"] == {"a": pytest.approx(0.6), "b": pytest.approx(0.4)}
    assert code["base"] == pytest.approx(0.3) and code["baseline"]["score"] == pytest.approx(0.5)
    assert code["benchmarks"] == ["humaneval+", "mbpp+"] and code["missing"] == ["livecodebench"]
    # math = mean(AIME24, MATH500): a 0.3, b 0.6, base 0.1, azr 0.3
    assert math["members"] == {"a": pytest.approx(0.3), "b": pytest.approx(0.6)}
    assert math["base"] == pytest.approx(0.1) and math["baseline"]["score"] == pytest.approx(0.3)
    assert math["missing"] == ["aime25", "amc23", "minerva", "olympiadbench"]
    # overall = (code + math) / 2: a 0.45, b 0.5, base 0.2, azr 0.4
    assert overall["members"] == {"a": pytest.approx(0.45), "b": pytest.approx(0.5)}
    assert overall["base"] == pytest.approx(0.2) and overall["baseline"]["score"] == pytest.approx(0.4)
    assert overall["population_mean"] == pytest.approx(0.475)
    assert overall["weakest"] == {"member": "a", "score": pytest.approx(0.45)}
    assert overall["best"] == {"member": "b", "score": pytest.approx(0.5)}
    # the weakest member against the baseline, per row
    assert overall["vs_baseline"] == {"weakest": pytest.approx(0.05), "population_mean": pytest.approx(0.075),
                                      "best": pytest.approx(0.1)}
    assert code["vs_baseline"]["weakest"] == pytest.approx(-0.1) and math["vs_baseline"]["weakest"] == pytest.approx(0.0)
    assert code["weakest"]["member"] == "b" and math["weakest"]["member"] == "a"


def test_aggregate_rows_in_markdown_and_tensorboard() -> None:
    results = {"run": "runs/x", "model": "m", "benchmarks": HAND_MADE, "aggregates": aggregate_rows(HAND_MADE, "r")}
    md = markdown_tables(results)
    assert "## AZR's aggregate rows (greedy pass@1, %)" in md
    assert ("| overall | 47.5 | 50.0 (b) | 45.0 (a) | 20.0 | 40.0 | +5.0 | humaneval+, mbpp+, aime24, math500 "
            "(missing: livecodebench, aime25, amc23, minerva, olympiadbench) |") in md
    assert "| code | 50.0 | 60.0 (a) | 40.0 (b) | 30.0 | 50.0 | -10.0 |" in md
    assert "| entry | code | math | overall |" in md and "| a | 60.0 | 30.0 | 45.0 |" in md
    assert "| baseline `azr` | 50.0 | 30.0 | 40.0 |" in md and "| base model | 30.0 | 10.0 | 20.0 |" in md
    tags = tensorboard_scalars(results)
    assert tags["eval/aggregate/overall/weakest"] == pytest.approx(0.45)
    assert tags["eval/aggregate/math/b"] == pytest.approx(0.6)
    assert tags["eval/aggregate/code/baseline/azr"] == pytest.approx(0.5)


def test_aggregates_with_one_family_only() -> None:
    rows = aggregate_rows({"gsm8k": HAND_MADE["gsm8k"], "mbpp+": HAND_MADE["mbpp+"]})
    assert rows["math"] is None and rows["overall"] is None
    assert rows["code"]["members"] == {"a": 0.7, "b": 0.5} and rows["code"]["benchmarks"] == ["mbpp+"]
    assert rows["code"]["vs_baseline"]["weakest"] == pytest.approx(-0.1)
    no_baseline = {"aime24": summarize_benchmark(5, {"a": 0.2})}
    assert aggregate_rows(no_baseline)["math"]["vs_baseline"] == {"weakest": None, "population_mean": None,
                                                                 "best": None}
