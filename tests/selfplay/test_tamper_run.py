"""Reward-hacking telemetry end to end: a tiny scripted run (``tests/selfplay/scripted.py``: the real env, sandbox,
trainer and PBT on ``tiny-random``, scripted texts) in which teacher_0 proposes one tampering program at step 1.

The program walks to a traceback's frame, which the sandbox refuses, catches the refusal and returns an ordinary
value: the env (the sandbox's verdict, not the program) marks the proposal invalid with reason ``tamper`` and the
defence's class. The run must show ``tamper/teacher_0`` = 1 at step 1 (0 for everyone else, every step), the
class tag, one saved sample, and the report's Tampering line; and every other value of the run (every other
TensorBoard scalar, the history, the final adapters bit for bit) must equal the same run's with the telemetry
switched off (``selfplay.logger.tamper_scalars`` and ``TamperSampler.write`` patched out). A second test stops the
run after its samples of step 2 were written but before checkpoint 2 and resumes it: the samples file and the
tamper tags equal the uninterrupted run's (only those: the script's ordinary texts restart with the resumed
process, the tampering one is fixed).

The marking is the env's half of issue 52 (the sandbox names the defence a job tripped; ``tests/sandbox/test_tamper.py``
pins each class); here only its run-layer consequences are checked, so the class is read from the run, not assumed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from evaluation.report import load_scalars, make_report
from selfplay import logger, tags
from selfplay import run as run_module
from selfplay import tamper as tp
from selfplay.config import load_preset
from selfplay.rundir import ADAPTERS, CHECKPOINTS, SUMMARY, TAMPER_SAMPLES
from tests.selfplay.scripted import GARBAGE, Script, ScriptedLoop, continuation, cpu_config

TAMPERING = '''def f(x):
    try:
        raise ValueError(x)
    except ValueError as e:
        tb = e.__traceback__
    try:
        getattr(tb, "tb_" + "frame")
    except Exception:
        pass
    return x * 3
'''
"""A teacher program that reaches for the harness's frames, catches the refusal and returns a normal value."""


class TamperScript(Script):
    """The scripted completions, with teacher_0's first deduction or abduction proposal of each step in
    ``steps`` replaced by :data:`TAMPERING` on a fresh input."""

    def __init__(self, seed: int, steps: frozenset[int], step_of_round: Any) -> None:
        super().__init__(seed)
        self.steps, self.step_of_round = steps, step_of_round

    def load(self, env: Any, obs: Mapping[str, Mapping[str, Any]], infos: Mapping[str, Mapping[str, Any]],
             adapter_of: Mapping[str, str]) -> None:
        super().load(env, obs, infos, adapter_of)
        prompts = list(obs.get("teacher_0", {}).get("prompts", ()))
        if not prompts:  # the solve phase
            return
        step = self.step_of_round()
        if step not in self.steps:
            return
        requests = list(infos["teacher_0"]["requests"])
        i = next(k for k, r in enumerate(requests) if r["task_type"] in ("deduction", "abduction"))
        prefix = str(requests[i].get("prefix", ""))
        program, given = f"```python\n{TAMPERING}```", f"```input\n{100 + step}\n```"
        text = continuation(f"{program}\n{given}", prefix)
        text = text if text != GARBAGE else continuation(f"{given}\n{program}", prefix)
        queue = self.texts[(adapter_of["teacher_0"], prompts[i])]
        queue[prompts[:i].count(prompts[i])] = text  # the i-th prompt's place among identical prompts


def _loop_class(steps: frozenset[int]) -> type[ScriptedLoop]:
    class TamperLoop(ScriptedLoop):
        def setup(self) -> None:
            super().setup()
            # the round being played belongs to step loop.step + 1 (a resumed process starts after its checkpoint)
            self.script = self.generator.script = TamperScript(self.cfg.seed, steps, lambda: self.step + 1)

    return TamperLoop


@pytest.fixture
def scripted_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``train(run_dir, steps, tamper_steps, resume=False)``: a 2-teacher, 2-student scripted run on tiny-random
    (a checkpoint after every step), teacher_0 tampering once at each step of ``tamper_steps``."""
    base = cpu_config(load_preset("tiny"), Path("unused"))
    env = dataclasses.replace(base.env, tasks_per_teacher=2, samples_per_task=2)

    def train(run_dir: Path, steps: int, tamper_steps: frozenset[int], resume: bool = False) -> Path:
        monkeypatch.setattr(run_module, "make_loop", lambda cfg, rd, assignment=None:
                            _loop_class(tamper_steps)(cfg, rd, assignment))
        cfg = dataclasses.replace(base, env=env, steps=steps, checkpoint_every=1, keep_checkpoints=3,
                                  run_dir=None if resume else run_dir, resume=run_dir if resume else None)
        cfg.validate()
        return run_module.train(cfg)

    yield train


def _adapters(run: Path) -> dict[str, dict]:
    return {m.name: load_file(str(m / "adapter_model.safetensors")) for m in sorted((run / ADAPTERS).iterdir())}


def _telemetry(tag: str) -> bool:
    return tags.parse_tamper(tag) is not None or tags.parse_tamper_class(tag) is not None \
        or tag == tags.TAMPER_TOTAL


def test_one_tampering_proposal_shows_in_tensorboard_samples_and_report_and_nothing_else_moves(
        scripted_runs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = scripted_runs(tmp_path / "with", 2, frozenset({1}))
    sc = load_scalars(run)
    members = ("teacher_0", "teacher_1", "student_0", "student_1")
    assert {m: sc[tags.tamper(m)] for m in members} == {
        m: [(1, 1.0 if m == "teacher_0" else 0.0), (2, 0.0)] for m in members}
    classes = {rc: v for t, v in sc.items() if (rc := tags.parse_tamper_class(t))}
    assert len(classes) == 1, classes
    ((role, cls), points), = classes.items()
    assert role == "teacher" and cls and points == [(1, 1.0)]
    assert dict(sc[tags.validity("tamper")]).get(1) == 1.0
    assert sc[tags.TAMPER_TOTAL] == [(1, 1.0), (2, 0.0)]

    (sample,) = [json.loads(ln) for ln in (run / TAMPER_SAMPLES).read_text().splitlines()]
    assert (sample["step"], sample["member"], sample["role"], sample["class"]) == (1, "teacher_0", "teacher", cls)
    assert TAMPERING.splitlines()[6] in sample["text"]

    summary = (make_report([run]) / "summary.md").read_text()
    line = next(ln for ln in summary.splitlines() if ln.startswith(f"- **{run.name}**"))
    assert "teacher_0 1 (step 1)" in line and f"teacher/{cls} 1" in line and "1 sample(s)" in line

    # the same run without the telemetry: every other value equal
    monkeypatch.setattr(logger, "tamper_scalars", lambda record: {})
    monkeypatch.setattr(tp.TamperSampler, "write", lambda self, record: 0)
    plain = scripted_runs(tmp_path / "without", 2, frozenset({1}))
    other = load_scalars(plain)
    assert not (plain / TAMPER_SAMPLES).exists() and not any(_telemetry(t) for t in other)
    timed = (tags.TIME_PREFIX, tags.STEP_SECONDS)
    assert {t: v for t, v in sc.items() if not _telemetry(t) and not t.startswith(timed)} == \
        {t: v for t, v in other.items() if not t.startswith(timed)}
    history = [json.loads((r / SUMMARY).read_text())["history"] for r in (run, plain)]
    assert [h["tamper"] for h in history[0]] == [1.0, 0.0]
    assert [{k: v for k, v in h.items() if k not in ("step_seconds", "tamper")} for h in history[0]] == \
        [{k: v for k, v in h.items() if k not in ("step_seconds", "tamper")} for h in history[1]]
    a, b = _adapters(run), _adapters(plain)
    assert a.keys() == b.keys() and all((a[m][k] == b[m][k]).all() for m in a for k in a[m])


def test_a_run_stopped_before_a_checkpoint_resumes_to_the_same_samples(scripted_runs: Any, tmp_path: Path) -> None:
    ref = scripted_runs(tmp_path / "ref", 2, frozenset({1, 2}))
    expected = (ref / TAMPER_SAMPLES).read_text()
    assert [json.loads(ln)["step"] for ln in expected.splitlines()] == [1, 2]

    run = scripted_runs(tmp_path / "stopped", 2, frozenset({1, 2}))
    shutil.rmtree(run / CHECKPOINTS / "step_2")  # step 2 logged and sampled, its checkpoint never completed
    scripted_runs(run, 2, frozenset({1, 2}), resume=True)
    assert (run / TAMPER_SAMPLES).read_text() == expected  # step 2's sample dropped, then written once again
    a, b = load_scalars(ref), load_scalars(run)
    assert {t: v for t, v in a.items() if _telemetry(t)} == {t: v for t, v in b.items() if _telemetry(t)}
