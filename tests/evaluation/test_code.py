"""Code benchmarks: canonical solutions pass, empty and broken ones fail, evalplus semantics hold.

The default suite checks fixed slices (first 15-20 problems) plus hand-made special cases; the full
164/378-problem runs are marked ``slow``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluation import _harness
from evaluation.code import canonical_programs
from evaluation.data import (
    BenchmarkUnavailable,
    EvalDataError,
    canonical_name,
    load_code,
    load_humaneval,
    parse_benchmarks,
)
from evaluation.prompting import code_prompt, extract_code, program_for
from evaluation.samples import score_samples

SLICE = 15


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _base_only_cheat(problem) -> str:
    """The canonical solution on base inputs, ``None`` everywhere else: passes base, fails plus."""
    base = json.dumps(problem.base_input)
    ep = problem.entry_point
    return (
        problem.reference_program + f"\nimport json as _j\n_orig_{ep} = {ep}\n_BASE = _j.loads({base!r})\n"
        f"def {ep}(*args):\n"
        f"    return _orig_{ep}(*args) if _j.loads(_j.dumps(list(args), default=list)) in _BASE else None\n"
    )


# --- data ------------------------------------------------------------------------------------------------


def test_benchmark_names() -> None:
    assert parse_benchmarks("HumanEval, he+,mbpp_plus,gsm8k,gsm8k") == [
        "humaneval",
        "humaneval+",
        "mbpp+",
        "gsm8k",
    ]
    with pytest.raises(BenchmarkUnavailable, match="no offline source"):
        canonical_name("livecodebench")
    with pytest.raises(ValueError, match="unknown benchmark"):
        canonical_name("nope")


def test_missing_data_file_names_file_and_flag(tmp_path: Path) -> None:
    with pytest.raises(EvalDataError, match=r"MbppPlus-v0\.2\.0\.jsonl\.gz.*--data-dir"):
        load_code("mbpp+", tmp_path)


def test_loaders(data_dir) -> None:
    assert len(load_humaneval()) == 164
    he_plus = load_code("humaneval+", data_dir)
    mbpp = load_code("mbpp+", data_dir)
    assert len(he_plus) == 164 and len(mbpp) == 378
    assert sum(len(p.base_input) for p in he_plus) == 1570
    assert sum(len(p.plus_input) for p in mbpp) == 39841
    assert {p.atol for p in he_plus} == {0.0, 1e-6, 1e-4}
    assert next(p for p in mbpp if p.task_id == "Mbpp/793").plus_input == []  # stored as {} upstream


def test_mbpp_inputs_get_their_python_types() -> None:
    assert _harness.mbpp_deserialize_inputs("Mbpp/2", [[[3, 4], [5, 4]]]) == [[(3, 4), (5, 4)]]
    assert _harness.mbpp_deserialize_inputs("Mbpp/252", [["1+2j"]]) == [[1 + 2j]]
    assert _harness.mbpp_deserialize_inputs("Mbpp/580", [[[1, [2, 3]]]]) == [((1, (2, 3)),)]
    assert _harness.mbpp_deserialize_inputs("Mbpp/115", [[[[1], []]]]) == [[[{1}, {}]]]  # evalplus quirk
    assert _harness.mbpp_deserialize_inputs("Mbpp/3", [[1]]) == [[1]]


# --- comparison semantics (pure functions on trusted values) -----------------------------------------------


def test_outputs_match_semantics() -> None:
    m = _harness.outputs_match
    assert m("humaneval", "f", [1], 0.1 + 0.2, 0.3, 0)  # floats: atol 1e-6 enforced even when atol = 0
    assert not m("humaneval", "f", [1], 0.3001, 0.3, 0)
    assert m("humaneval", "f", [1], [1.0, 2.0000001], [1.0, 2.0], 0)
    assert not m("humaneval", "f", [1], (1.0, 2.0), [1.0, 2.0], 0)  # types must match on the tolerant path
    assert not m("humaneval", "f", [1], 1, 2, 0)
    assert not m("humaneval", "f", [1], float("nan"), float("nan"), 0)
    assert m("humaneval", "f", [1], 1.00005, 1.0, 1e-4)  # task atol
    assert m("humaneval", "find_zero", [[-6, 11, -6, 1]], 1.0, 2.0, 1e-4)  # any root passes
    assert not m("humaneval", "find_zero", [[-6, 11, -6, 1]], 1.5, 1.0, 1e-4)
    assert m("mbpp", "similar_elements", [(1, 2), (2, 1)], (2, 1), (1, 2), 0)  # set equality
    assert m("mbpp", "check_str", ["a"], "match-object", True, 0)  # "not None" oracle
    assert not m("mbpp", "check_str", ["a"], None, True, 0)
    assert m("mbpp", "sum_div", [7], 0, 1, 0)
    assert m("mbpp", "are_equivalent", [1, 2], False, True, 0)
    assert _harness.allclose([1.0, [2.0]], [1.0, [2.0 + 1e-9]], 1e-6)
    assert not _harness.allclose([1.0], [1.0, 2.0], 1e-6)


# --- prompts and code extraction -----------------------------------------------------------------------------


def test_extract_code_and_program() -> None:
    p = load_humaneval(1)[0]
    answer = f"Sure!\n```python\nimport math\n\ndef {p.entry_point}(numbers, threshold):\n    return False\n```\nDone."
    code = extract_code(answer, p.entry_point)
    assert code.startswith("import math") and "Done" not in code
    program = program_for(p, answer, "answer")
    assert program.startswith(p.prompt) and program.rstrip().endswith("return False")
    body = "    return True\n"
    assert program_for(p, f"```\n{body}```", "answer") == p.prompt + body  # a body continues the prompt
    assert program_for(p, body, "completion") == p.prompt + body
    assert program_for(p, "x = 1", "solution") == "x = 1"
    assert "```python" in code_prompt(p) and p.prompt.strip() in code_prompt(p)


# --- sandboxed scoring ----------------------------------------------------------------------------------------


def test_humaneval_slice_canonical_empty_broken(tmp_path: Path, evaluator) -> None:
    problems = load_humaneval(20)
    canon = _write(
        tmp_path / "c.jsonl", [{"task_id": p.task_id, "completion": p.canonical_solution} for p in problems]
    )
    empty = _write(tmp_path / "e.jsonl", [{"task_id": p.task_id, "completion": ""} for p in problems])
    broken_rows = [{"task_id": p.task_id, "completion": p.canonical_solution} for p in problems]
    broken_rows[3]["completion"] = "    return None\n"
    broken = _write(tmp_path / "b.jsonl", broken_rows)
    assert score_samples(canon, "humaneval", limit=20, evaluator=evaluator)["pass@1"] == 1.0
    assert score_samples(empty, "humaneval", limit=20, evaluator=evaluator)["pass@1"] == 0.0
    out = tmp_path / "results.jsonl"
    s = score_samples(broken, "humaneval", limit=20, evaluator=evaluator, results_path=out)
    assert s["pass@1"] == pytest.approx(19 / 20) and s["n"] == 20
    outcomes = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["task_id"] for o in outcomes if not o["passed"]] == [problems[3].task_id]
    assert "AssertionError" in outcomes[3]["result"]  # the exception line, not a traceback frame


@pytest.mark.parametrize("bench", ["humaneval+", "mbpp+"])
def test_evalplus_slice_canonical_empty_broken(bench: str, tmp_path: Path, data_dir, evaluator) -> None:
    problems = load_code(bench, data_dir, limit=SLICE)
    rows = [{"task_id": p.task_id, "solution": p.reference_program} for p in problems]
    s = score_samples(_write(tmp_path / "c.jsonl", rows), bench, data_dir, limit=SLICE, evaluator=evaluator)
    assert s == {
        "benchmark": bench,
        "pass@1": 1.0,
        "n": SLICE,
        "n_samples": SLICE,
        "passed": SLICE,
        "base_pass@1": 1.0,
    }

    empty = [{"task_id": p.task_id, "completion": ""} for p in problems]
    s = score_samples(_write(tmp_path / "e.jsonl", empty), bench, data_dir, limit=SLICE, evaluator=evaluator)
    assert s["pass@1"] == 0.0 and s["base_pass@1"] == 0.0

    # one solution that only knows the base inputs: passes "base", fails "plus"
    rows[2] = {"task_id": problems[2].task_id, "solution": _base_only_cheat(problems[2])}
    s = score_samples(_write(tmp_path / "b.jsonl", rows), bench, data_dir, limit=SLICE, evaluator=evaluator)
    assert s["pass@1"] == pytest.approx((SLICE - 1) / SLICE)
    assert s["base_pass@1"] == 1.0


def test_per_test_time_limit_and_load_failures(data_dir, evaluator) -> None:
    p = load_code("humaneval+", data_dir, limit=1)[0]  # has_close_elements: microseconds per test
    slow_once = p.reference_program + (
        "\n_o = has_close_elements\n_n = [0]\n"
        "def has_close_elements(numbers, threshold):\n"
        "    _n[0] += 1\n"
        "    if _n[0] == 3:\n"
        "        import time; time.sleep(1.5)\n"  # over max(1 s, 4 x canonical)
        "    return _o(numbers, threshold)\n"
    )
    hang_at_import = "while True:\n    pass\n"
    noisy = p.reference_program + "\nprint('x' * 10_000_000)\n"  # stdout is swallowed, not an output limit
    t = time.perf_counter()
    r_slow, r_hang, r_noisy, r_syntax = evaluator.evaluate(
        [p] * 4, [slow_once, hang_at_import, noisy, "def ("]
    )
    assert time.perf_counter() - t < 60
    assert not r_slow.passed and "timeout on test 2" in r_slow.reason and r_slow.tests_passed == 2
    assert not r_hang.passed and "timeout while executing the program's top level" in r_hang.reason
    assert r_noisy.passed
    assert not r_syntax.passed and "SyntaxError" in r_syntax.reason


_HANG_UNDER_A_HOST_IGNORING_SIGINT = """
import json, sys
from evaluation.code import CodeEvaluator
from evaluation.data import SHIPPED_DATA_DIR, load_code
p = load_code("humaneval+", SHIPPED_DATA_DIR, limit=1)[0]
with CodeEvaluator(workers=1, cache_dir=sys.argv[1], max_task_s=5.0) as ev:
    (r,) = ev.evaluate([p], ["while True:\\n    pass\\n"])
print(json.dumps({"status": r.status, "reason": r.reason}))
"""


def test_the_watchdog_stops_a_hang_when_the_host_ignores_sigint(tmp_path: Path) -> None:
    """A host started with SIGINT ignored (a background job of a non-interactive shell) hands SIG_IGN to its
    children, and under SIG_IGN ``_thread.interrupt_main`` does nothing: the top level's 4 s limit then went
    unenforced and the job ran to its wall clock (the 131 s of the test above, once, in a full suite). The
    sandbox's zygote starts with SIGINT at its default, so the verdict is the watchdog's (max_task_s=5 makes
    the job's own wall clock 20 s, the verdict a plain "timeout" without the fix)."""
    p = subprocess.run([sys.executable, "-c", _HANG_UNDER_A_HOST_IGNORING_SIGINT, str(tmp_path)], capture_output=True,
                       text=True, timeout=600, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.splitlines()[-1])
    assert result["status"] == "ok" and "timeout while executing the program's top level" in result["reason"], result


def test_float_tolerance_and_special_oracles(data_dir, evaluator) -> None:
    he = {p.task_id: p for p in load_code("humaneval+", data_dir, limit=33)}
    mbpp = {p.task_id: p for p in load_code("mbpp+", data_dir, limit=1)}
    trunc = he["HumanEval/2"]  # truncate_number returns floats, atol 0 -> 1e-6
    close = trunc.prompt + "    return number % 1.0 + 1e-9\n"
    far = trunc.prompt + "    return number % 1.0 + 1e-3\n"
    fz = he["HumanEval/32"]  # find_zero: judged by |poly(xs, out)| <= atol (any root passes, see above)
    tighter = fz.reference_program.replace("tol = 0, 1e-5", "tol = 0, 1e-9")  # Newton, other stop
    assert tighter != fz.reference_program
    constant = fz.prompt + "    return 0.0\n"
    sim = mbpp["Mbpp/2"]  # similar_elements: compared as sets
    reordered = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n"
    canonical = (
        fz.reference_program
    )  # evalplus 0.3.1 fails it (a bug in its oracle); the intended oracle passes it
    results = evaluator.evaluate(
        [trunc, trunc, fz, fz, fz, sim], [close, far, canonical, tighter, constant, reordered]
    )
    assert [r.passed for r in results] == [True, False, True, True, False, True], [r.reason for r in results]


def test_samples_errors(tmp_path: Path, evaluator) -> None:
    with pytest.raises(FileNotFoundError, match="samples file"):
        score_samples(tmp_path / "none.jsonl", "humaneval")
    bad = _write(tmp_path / "unknown.jsonl", [{"task_id": "HumanEval/999", "completion": ""}])
    with pytest.raises(ValueError, match="not in humaneval"):
        score_samples(bad, "humaneval", evaluator=evaluator)
    partial = _write(tmp_path / "partial.jsonl", [{"task_id": "HumanEval/0", "completion": ""}])
    with pytest.raises(ValueError, match="163 problem"):
        score_samples(partial, "humaneval", evaluator=evaluator)
    (tmp_path / "garbage.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="garbage.jsonl:1"):
        score_samples(tmp_path / "garbage.jsonl", "humaneval")


def test_multiple_samples_per_task_average(tmp_path: Path, evaluator) -> None:
    problems = load_humaneval(2)
    rows = []
    for p in problems:
        rows.append({"task_id": p.task_id, "completion": p.canonical_solution})
        rows.append({"task_id": p.task_id, "completion": "    return None\n"})
    s = score_samples(_write(tmp_path / "m.jsonl", rows), "humaneval", limit=2, evaluator=evaluator)
    assert s["pass@1"] == 0.5 and s["n"] == 2 and s["n_samples"] == 4 and s["passed"] == 0


# --- full runs (slow) -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("bench", ["humaneval", "humaneval+", "mbpp+"])
def test_full_canonical_solutions(bench: str, data_dir, evaluator) -> None:
    """Every canonical solution passes its own benchmark (MBPP+ upstream: 0.997 with evalplus itself, see
    evaluation/evaldata/SOURCES.md; the task ids that fail here, if any, are printed and must stay below that rate)."""
    problems = load_code(bench, data_dir)
    t = time.perf_counter()
    results = evaluator.evaluate(problems, canonical_programs(problems))
    failed = [(r.task_id, r.reason) for r in results if not r.passed]
    print(
        f"{bench}: {len(problems) - len(failed)}/{len(problems)} canonical pass in {time.perf_counter() - t:.0f} s; failed: {failed}"
    )
    assert len(failed) <= (1 if bench == "mbpp+" else 0), failed
    empty = evaluator.evaluate(problems, [p.prompt for p in problems])
    assert not any(r.passed for r in empty)


def test_callers_sandbox_with_small_reply_cap_uses_live_mode(data_dir, tmp_path: Path) -> None:
    """With a caller's sandbox whose reply cap is too small to ship expected outputs, every task is checked
    in "live" mode (the reference runs in the same job) and the verdicts do not change."""
    from evaluation.code import CodeEvaluator
    from populora_env.sandbox import Limits, Sandbox

    problems = load_code("humaneval+", data_dir, limit=5)
    broken = [p.prompt + "    return None\n" for p in problems]
    with Sandbox(workers=2, limits=Limits(timeout_s=10.0, memory_mb=1024)) as box:  # max_output_chars 100k
        ev = CodeEvaluator(box, cache_dir=tmp_path)
        gts = ev.ground_truth(problems)
        assert all(gt.outputs is None and gt.live_reason for gt in gts.values())
        assert [r.passed for r in ev.evaluate(problems, canonical_programs(problems))] == [True] * 5
        assert [r.passed for r in ev.evaluate(problems, broken)] == [False] * 5


def test_candidate_values_cross_to_the_judge_unchanged() -> None:
    """A candidate's output reaches the judge job as the same value (repr + ``restricted_eval``, no ``eval``),
    or as a type-strict digest when too long; whatever is not plain data equals nothing."""
    from collections import Counter, OrderedDict, deque

    values = [1, -2.5, float("inf"), 1 + 2j, "s\x00\ud800", b"\x00", None, True, [1, (2, 3)], {1, 2},
              frozenset({"a"}), {"k": [1]}, Counter({"a": 2, (1, 2): 1}), OrderedDict([("b", 1), ("a", 2)]),
              deque([1, 2]), 10**6000, list(range(60_000))]
    for value in values:
        entry = _harness.encode_output(value)
        back = _harness.decode_output(entry)
        assert back == value and (entry.get("r") is None or type(back) is type(value)), (value, entry)
    assert "h" in _harness.encode_output(10**6000) and "h" in _harness.encode_output(list(range(60_000)))
    assert _harness.decode_output(_harness.encode_output(10**6000)) != 10**6000 + 1
    assert _harness.decode_output(_harness.encode_output(list(range(60_000)))) != list(range(1, 60_001))

    class Liar:
        def __eq__(self, other):
            return True

    assert _harness.encode_output(Liar()) == {"x": "Liar"}
    assert _harness.decode_output({"x": "Liar"}) != 1
    for hostile in ("__import__('os').system('true')", "(1).__class__", "f(1)", "[x for x in ()]", "a.b"):
        assert _harness.decode_output({"r": hostile}) != 0
        with pytest.raises(ValueError):
            _harness.restricted_eval(hostile)
