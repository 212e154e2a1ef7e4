"""Evaluation prompts: math as the adapters were trained (the R1 wrapper of a raw prompt set; the chat variant
for the base model), code in evalplus' shape (pre-filled ```python fence), and the answer rebuilt for scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.generation import Completion, GenerationRequest, HFGenerator
from agents.generation.hf import prompt_text
from evaluation.data import load_humaneval, load_math
from evaluation.math_check import extract_math_answer
from evaluation.prompting import (
    CODE_FENCE,
    EVALPLUS_INSTRUCTION,
    EVALPLUS_RESPONSE,
    MATH_INSTRUCTION,
    R1_NEXT_TURN,
    PromptSpec,
    code_spec,
    math_spec,
    program_for,
)
from evaluation.runner import EvalConfig, run_eval
from populora_env.prompts import get_prompt_set
from tests.evaluation.test_runner import _fake_run


@pytest.fixture(scope="module")
def tokenizer():
    from agents.models import load_base

    return load_base("tiny-random")[1]


def _request(spec: PromptSpec) -> GenerationRequest:
    return GenerationRequest("m", spec.prompt, chat=spec.chat, prefix=spec.prefix, stop=spec.stop)


def test_math_r1_template_is_the_azr_sets_text(data_dir, tokenizer) -> None:
    problem = load_math("gsm8k", data_dir, limit=1)[0]
    azr = get_prompt_set("azr")
    spec = math_spec(problem, "r1")
    assert spec.prompt == azr.wrap(problem.question.strip()) and not spec.chat and spec.prefix == "<think>"
    assert spec.stop == ("</answer>", R1_NEXT_TURN)
    text, templated = prompt_text(tokenizer, _request(spec))
    assert not templated and text.endswith(f"User: {problem.question.strip()}\nAssistant: <think>")
    assert "<|im_start|>" not in text and MATH_INSTRUCTION not in text
    # the answer keeps the closing tag (part of the format) and loses a next turn; extraction reads the tag
    answer = spec.answer(" 3 + 4 = 7 </think> <answer>\\boxed{7}</answer>")
    assert answer.endswith("</answer>") and extract_math_answer(answer) == "7"
    assert spec.answer(" so 7 </think> <answer>7</answer>\nUser:") == " so 7 </think> <answer>7</answer>"
    assert extract_math_answer(spec.answer("I think <answer>12</answer>")) == "12"


def test_math_chat_template_for_the_base(data_dir, tokenizer) -> None:
    problem = load_math("gsm8k", data_dir, limit=1)[0]
    spec = math_spec(problem, "chat")
    assert spec.chat and spec.prefix == "" and spec.stop == () and spec.prompt.endswith(MATH_INSTRUCTION)
    text, templated = prompt_text(tokenizer, _request(spec))
    assert templated and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="math template must be one of"):
        math_spec(problem, "boxed")


def test_code_evalplus_chat_shape(tokenizer) -> None:
    problem = load_humaneval(1)[0]
    spec = code_spec(problem, chat_template=True)
    assert spec.prompt == f"{EVALPLUS_INSTRUCTION}\n```\n{problem.prompt.strip()}\n```\n"
    assert "\n```\n" in spec.stop and "\nif __name__" in spec.stop
    text, templated = prompt_text(tokenizer, _request(spec))
    assert templated and text.endswith(f"<|im_start|>assistant\n{EVALPLUS_RESPONSE}\n```python\n")
    body = problem.prompt + problem.canonical_solution
    answer = spec.answer(body + "\n```\n")  # the closing fence is a stop string: removed, the fence re-opened
    assert answer == CODE_FENCE + body
    assert program_for(problem, answer, spec.mode) == problem.prompt + "\n" + body
    cut = spec.answer(body + "\nif __name__")  # evalplus' end strings are cut off the code
    assert cut == CODE_FENCE + body


def test_code_direct_completion_without_chat_template() -> None:
    problem = load_humaneval(1)[0]
    spec = code_spec(problem, chat_template=False)
    assert spec.prompt == problem.prompt and not spec.chat and spec.mode == "completion"
    assert "\ndef " in spec.stop and spec.answer("    return 1\ndef ") == "    return 1"
    assert program_for(problem, spec.answer("    return 1\n"), spec.mode) == problem.prompt + "    return 1\n"


_STOPS = ("</answer>", R1_NEXT_TURN)


@given(st.text(max_size=60), st.sampled_from(("", *_STOPS)))
def test_answer_strips_only_a_trailing_next_turn(body: str, stop: str) -> None:
    """Whatever the model wrote, the answer is the text with at most one trailing strip string removed, and
    the closing answer tag (a stop string that is part of the format) is never removed."""
    spec = PromptSpec("q", chat=False, stop=_STOPS, strip=(R1_NEXT_TURN,), head="H")
    answer = spec.answer(body + stop)
    if stop == R1_NEXT_TURN:
        assert answer == "H" + body
    elif body.endswith(R1_NEXT_TURN) and not stop:
        assert answer == "H" + body[: -len(R1_NEXT_TURN)]
    else:
        assert answer == "H" + body + stop


def _set_prompts(run: Path, prompts: str, mapping: dict | None = None) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["config"] = {"env": {"prompts": prompts}}
    if mapping:
        cfg["mapping"] = mapping
    (run / "config.json").write_text(json.dumps(cfg))


def test_run_trained_on_azr_prompts_is_asked_in_r1_and_the_base_in_chat(tmp_path, data_dir, monkeypatch) -> None:
    run = _fake_run(tmp_path, "azr-run", ["student_0", "teacher_0"])
    _set_prompts(run, "azr", {"agent_to_member": {"teacher_0": "teacher_0", "student_0": "student_0"},
                              "agent_roles": {"teacher_0": "teacher", "student_0": "student"}})
    problems = load_math("gsm8k", data_dir, limit=2)
    seen: list[GenerationRequest] = []

    def fake(self, requests):
        seen.extend(requests)
        out = []
        for i, r in enumerate(requests):
            gold = next(p.answers[0] for p in problems if p.question.strip() in r.prompt)
            if r.adapter == "student_0":  # the R1 format: the answer in the tag, then a next turn
                text = f" adding up </think> <answer>{gold}</answer>\nUser:"
            elif r.adapter == "teacher_0":
                text = " no idea </think> <answer>-1</answer>"
            else:
                text = f"The total is \\boxed{{{gold}}}."
            out.append(Completion(i, 0, r.adapter, text, [], [], []))
        return out

    monkeypatch.setattr(HFGenerator, "generate", fake)
    results = run_eval(EvalConfig(run_dir=str(run), benchmarks="gsm8k", limit=2, data_dir=str(data_dir),
                                  tensorboard=False, progress=False))
    members = [r for r in seen if r.adapter is not None]
    base = [r for r in seen if r.adapter is None]
    assert members and all(not r.chat and r.prefix == "<think>" and "</answer>" in r.stop for r in members)
    assert all(r.prompt.startswith("A conversation between User and Assistant") for r in members)
    assert base and all(r.chat and r.prompt.endswith(MATH_INSTRUCTION) for r in base)
    assert results["prompts"]["math"] == {"members": "r1", "baseline": None, "base": "chat"}
    rec = results["benchmarks"]["gsm8k"]
    assert rec["members"] == {"student_0": 1.0, "teacher_0": 0.0} and rec["base"] == 1.0
    # the students are the headline: the teacher's 0 is only in the secondary rows
    assert rec["population_mean"] == 1.0 and rec["weakest"] == {"member": "student_0", "score": 1.0}
    assert rec["all_members"]["population_mean"] == 0.5
    rows = [json.loads(x) for x in (run / "eval" / "generations" / "gsm8k.jsonl").read_text().splitlines()]
    assert {r["answer"] for r in rows if r["entry"] == "member:student_0"} == {
        f" adding up </think> <answer>{p.answers[0]}</answer>" for p in problems}
