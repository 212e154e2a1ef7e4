"""``populora eval`` shows progress, keeps every scored answer when stopped, and a second call resumes; the
command line is tyro over EvalConfig (run mode) and SamplesArgs (samples mode)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agents.generation import Completion, HFGenerator
from evaluation import runner
from evaluation.data import load_math
from evaluation.progress import SettingsMismatch
from evaluation.runner import EvalConfig, run_eval
from populora_cli.eval import eval_main
from tests.evaluation.test_runner import _fake_run


class Killed(Exception):
    """Stands for a kill in the middle of an evaluation."""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return _fake_run(tmp_path_factory.mktemp("runs"), "pop", ["student_0", "teacher_0"])


def _scripted(problems, calls: list[list[tuple]], fail_at: int | None = None):
    """A generator that answers problem i right for student_0 when i is even, the base always, teacher_0
    never; it raises :class:`Killed` on call number ``fail_at``."""
    index = {p.question.strip(): i for i, p in enumerate(problems)}

    def fake(self, requests):
        if fail_at is not None and len(calls) + 1 == fail_at:
            raise Killed
        calls.append([(r.adapter, index[next(q for q in index if q in r.prompt)]) for r in requests])
        out = []
        for j, r in enumerate(requests):
            i = calls[-1][j][1]
            right = r.adapter is None or (r.adapter == "student_0" and i % 2 == 0)
            out.append(Completion(j, 0, r.adapter, f"\\boxed{{{problems[i].answers[0] if right else -7}}}",
                                  [], [], []))
        return out

    return fake


def _cfg(run: Path, data_dir, out: Path, **kw) -> EvalConfig:
    return EvalConfig(run_dir=str(run), benchmarks="gsm8k", limit=4, data_dir=str(data_dir), out_dir=str(out),
                      tensorboard=False, chunk_size=1, **kw)


def test_a_killed_eval_keeps_its_rows_and_the_next_call_resumes(run, data_dir, tmp_path, monkeypatch) -> None:
    problems = load_math("gsm8k", data_dir, limit=4)
    # uninterrupted reference
    calls: list[list[tuple]] = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, calls))
    whole = run_eval(_cfg(run, data_dir, tmp_path / "whole", progress=False))
    assert len(calls) == 4 and all(len(c) == 3 for c in calls)  # one call per problem (chunk 1), 3 entries
    # killed during the third call: the rows of the first two problems are on disk
    calls = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, calls, fail_at=3))
    out = tmp_path / "killed"
    with pytest.raises(Killed):
        run_eval(_cfg(run, data_dir, out, progress=False))
    rows = [json.loads(x) for x in (out / "generations" / "gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3 and {r["task_id"] for r in rows} == {p.task_id for p in problems[:2]}
    assert not (out / "results.json").exists()  # no benchmark finished: nothing to summarise yet
    # the next call generates only what is missing and ends with the uninterrupted results
    calls = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, calls))
    resumed = run_eval(_cfg(run, data_dir, out, progress=False))
    assert sorted({i for c in calls for _, i in c}) == [2, 3]
    assert resumed["benchmarks"] == whole["benchmarks"]
    assert resumed["benchmarks"]["gsm8k"]["members"] == {"student_0": 0.5, "teacher_0": 0.0}
    assert len((out / "generations" / "gsm8k.jsonl").read_text().splitlines()) == 4 * 3
    # a torn last line (killed mid-write) is skipped, and what follows it still reads back
    with (out / "generations" / "gsm8k.jsonl").open("a") as fh:
        fh.write('{"entry": "member:stud')
    problems5 = load_math("gsm8k", data_dir, limit=5)
    calls = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems5, calls))
    again = run_eval(EvalConfig(**{**_cfg(run, data_dir, out, progress=False).__dict__, "limit": 5}))
    assert sorted({i for c in calls for _, i in c}) == [4]  # a larger --limit generates the new problem only
    assert again["benchmarks"]["gsm8k"]["n"] == 5
    assert again["benchmarks"]["gsm8k"]["members"]["student_0"] == pytest.approx(3 / 5)


def test_other_settings_are_refused_before_loading_and_restart_starts_afresh(run, data_dir, tmp_path, monkeypatch,
                                                                               capsys) -> None:
    problems = load_math("gsm8k", data_dir, limit=4)
    calls: list[list[tuple]] = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, calls))
    out = tmp_path / "e"
    run_eval(_cfg(run, data_dir, out, progress=False, max_new_tokens=32))
    loads: list[str] = []
    real = runner._load_population
    monkeypatch.setattr(runner, "_load_population", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    with pytest.raises(SettingsMismatch, match="budget"):
        run_eval(_cfg(run, data_dir, out, progress=False, max_new_tokens=64))
    assert loads == []  # refused before any model loaded
    argv = [str(run), "--benchmarks", "gsm8k", "--limit", "4", "--data-dir", str(data_dir), "--out-dir", str(out),
            "--no-tensorboard", "--no-progress", "--max-new-tokens", "64", "--chunk-size", "1"]
    capsys.readouterr()
    assert eval_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("populora eval: error:") and "--restart" in err and "budget" in err
    calls.clear()
    assert eval_main([*argv, "--restart"]) == 0
    assert len(calls) == 4  # everything generated again
    assert json.loads((out / "progress.json").read_text())["settings"]["benchmarks"]["gsm8k"]["budget"] == 64


def test_progress_bars_per_entry_and_benchmark(run, data_dir, tmp_path, monkeypatch, capsys) -> None:
    problems = load_math("gsm8k", data_dir, limit=4)
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, []))
    run_eval(_cfg(run, data_dir, tmp_path / "p", progress=True))
    err = capsys.readouterr().err
    for label in ("student_0", "teacher_0", "base"):
        assert f"gsm8k {label}" in err
    assert "4/4" in err and "problem/s" in err


def test_cli_is_tyro_over_evalconfig(run, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        eval_main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--baseline", "--benchmarks", "--limit", "--data-dir", "--engine", "--math-template",
                 "--restart", "--no-progress", "--no-tensorboard", "--budgets", "--samples-per-problem"):
        assert flag in text, flag
    assert eval_main([]) == 2
    assert "give a run directory" in capsys.readouterr().err
    if importlib.util.find_spec("vllm") is None:  # where vLLM is installed this would start an engine
        assert eval_main([str(run), "--engine", "vllm", "--device", "cpu", "--benchmarks", "gsm8k"]) == 2
        assert "vLLM is not installed" in capsys.readouterr().err


def test_the_old_backend_spelling_is_the_engine_for_one_release(run, data_dir, tmp_path, monkeypatch, caplog,
                                                                capsys) -> None:
    """``--backend`` (``EvalConfig(backend=...)``) is the deprecated spelling of ``--engine``: it sets the engine and
    warns once, in one line naming the new flag; a progress file written under the old name still resumes."""
    from populora_env import checks

    monkeypatch.setattr(checks, "_WARNED", set())
    with caplog.at_level("WARNING", logger="populora_env.checks"):
        assert EvalConfig(run_dir="r", backend="hf").engine == "hf"
        assert EvalConfig(run_dir="r", backend="vllm").engine == "vllm"
        assert EvalConfig(run_dir="r", engine="vllm").engine == "vllm"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "--backend" in warned[0] and "use --engine" in warned[0], warned
    assert "backend" not in EvalConfig(run_dir="r", backend="hf").__dict__  # not a field: results record "engine"
    if importlib.util.find_spec("vllm") is None:  # the old flag reaches the engine check like the new one
        assert eval_main([str(run), "--backend", "vllm", "--device", "cpu", "--benchmarks", "gsm8k"]) == 2
        assert "vLLM is not installed" in capsys.readouterr().err
    problems = load_math("gsm8k", data_dir, limit=2)
    calls: list[list[tuple]] = []
    monkeypatch.setattr(HFGenerator, "generate", _scripted(problems, calls))
    out = tmp_path / "old"
    first = run_eval(EvalConfig(**{**_cfg(run, data_dir, out, progress=False).__dict__, "limit": 1}))
    assert first["engine"] == "hf" and "backend" not in first
    progress = json.loads((out / "progress.json").read_text())  # as an earlier release wrote it
    common = progress["settings"]["common"]
    common["backend"] = common.pop("engine")
    (out / "progress.json").write_text(json.dumps(progress))
    calls.clear()
    resumed = run_eval(EvalConfig(**{**_cfg(run, data_dir, out, progress=False).__dict__, "limit": 2}))
    assert sorted({i for c in calls for _, i in c}) == [1]
    assert json.loads((out / "progress.json").read_text())["settings"]["common"].get("backend") is None
    assert resumed["benchmarks"]["gsm8k"]["n"] == 2


def test_hf_generation_on_cpu_uses_the_threads_setting(run, data_dir, tmp_path, monkeypatch) -> None:
    import torch

    problems = load_math("gsm8k", data_dir, limit=4)
    inner = _scripted(problems, [])
    during: list[int] = []

    def spy(self, requests):
        during.append(torch.get_num_threads())
        return inner(self, requests)

    monkeypatch.setattr(HFGenerator, "generate", spy)
    before = torch.get_num_threads()
    run_eval(_cfg(run, data_dir, tmp_path / "t", progress=False, threads=1))
    assert during and set(during) == {1}
    assert torch.get_num_threads() == before  # restored afterwards
