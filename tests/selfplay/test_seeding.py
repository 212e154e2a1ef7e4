"""The seeding stage before training: the base model fills the buffers to env.seed_tasks (selfplay.seeding)."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents.generation import Completion, GenerationRequest
from populora_env import EnvConfig, parallel_env
from populora_env.policies import RandomPolicy, SeedTeacher
from populora_env.sandbox import Limits, Sandbox
from populora_env.seeds import SEED_PROGRAMS
from populora_env.tasks import TaskType
from selfplay.config import TrainConfig
from selfplay.seeding import (
    SEEDING_FILE,
    SeedingReport,
    base_model_proposer,
    request_seed,
    seed_before_training,
    seed_buffers,
)

TYPES = ("deduction", "abduction", "induction")
N = len(SEED_PROGRAMS)  # the hand-written seeds: one task per program and type in each buffer before seeding


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=1, limits=Limits(timeout_s=2.0, memory_mb=512)) as sb:
        yield sb


def _env(sandbox: Sandbox, **kw: Any) -> Any:
    defaults: dict[str, Any] = dict(num_teachers=1, num_students=1, seed=0, sandbox=sandbox)
    return parallel_env(**{**defaults, **kw})


def _seed_teacher(seed: int = 0):
    teacher = SeedTeacher(seed=seed)
    calls: list[int] = []

    def propose(prompts: Sequence[str], requests: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
        calls.append(len(prompts))
        return teacher.act(tuple(prompts), {"requests": list(requests)})

    return propose, calls


def test_valid_proposals_fill_every_buffer_to_the_target(sandbox: Sandbox) -> None:
    env = _env(sandbox)
    before = env.buffers.sizes()
    assert before == {t: N for t in TYPES}
    propose, calls = _seed_teacher()
    report = seed_buffers(env, propose, target=N + 6, budget=40, batch=4)
    assert report.reached and report.short == {} and report.warning() is None
    assert report.sizes_before == before
    assert all(n >= N + 6 for n in report.sizes_after.values()) and report.sizes_after == env.buffers.sizes()
    ded, abd, ind = (report.per_type[t] for t in TYPES)
    # one pool of programs: deduction proposals (asked first) also fill the abduction buffer
    assert ded.proposals == 6 and ded.valid == 6 and ded.added == 6 and abd.proposals == 0 and abd.added == 6
    assert ind.proposals == 6 and ind.valid == ind.added == 6
    assert calls == [6, 6]  # max(missing, batch) per call
    assert all(s.seconds > 0 for s in (ded, ind)) and ded.calls == ind.calls == 1
    # induction programs come from the (seeded) deduction/abduction pool
    programs = {t.program for b in (TaskType.DEDUCTION, TaskType.ABDUCTION) for t in env.buffers[b].tasks}
    assert {t.program for t in env.buffers[TaskType.INDUCTION].tasks} <= programs
    assert env.current_round == -1  # no round was played


def test_budget_bounds_a_base_model_that_never_proposes_a_valid_task(sandbox: Sandbox) -> None:
    env = _env(sandbox, task_types=("deduction", "induction"))
    policy = RandomPolicy(seed=1, max_length=64)
    calls: list[int] = []

    def propose(prompts: Sequence[str], requests: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
        calls.append(len(prompts))
        return policy.act(tuple(prompts))

    report = seed_buffers(env, propose, target=N + 10, budget=7, batch=3)
    assert sum(calls) == 14 and calls == [7, 7]  # budget per type, never more
    assert report.short == {"deduction": 10, "induction": 10} and not report.reached
    assert report.per_type["deduction"].reasons == {"format": 7}
    message = report.warning()
    assert message is not None
    assert f"deduction: {N}/{N + 10} tasks after 7 proposals (0 valid; most frequent rejections: format 7)" in message
    assert f"induction: {N}/{N + 10}" in message and "env.seed_max_proposals" in message


def test_base_model_proposer_addresses_the_base_as_the_env_says(sandbox: Sandbox) -> None:
    env = _env(sandbox, prompts="azr")
    seen: list[GenerationRequest] = []

    class FakeGenerator:
        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            seen.extend(requests)
            out = [Completion(i, 0, r.adapter, f"text {i}", [], [], []) for i, r in enumerate(requests)]
            random.Random(0).shuffle(out)  # completions may come back in any order
            return out

    propose = base_model_proposer(FakeGenerator(), max_new_tokens=33, temperature=1.0, top_p=0.9, seed=5)
    prompts, requests = env.seed_prompts("abduction", 3)
    assert propose(prompts, requests) == ["text 0", "text 1", "text 2"]
    assert all(r.adapter is None and r.n == 1 and r.max_new_tokens == 33 and r.top_p == 0.9 for r in seen)
    assert all(r.chat is False and r.prefix == "<think>" and r.stop == ("</answer>",) for r in seen)
    assert [r.prompt for r in seen] == list(prompts)
    assert [r.seed for r in seen] == [request_seed(5, f"base-{i}") for i in range(3)]
    assert len({r.seed for r in seen}) == 3 and request_seed(5, "base-0") != request_seed(6, "base-0")


def _inputs(loop: Any) -> tuple:
    """What the seeding stage takes from a run: its config, directory, env, generator and device."""
    return loop.cfg, loop.run_dir, loop.env, loop.generator, loop.device


def test_seed_before_training_runs_once_per_run_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    cfg = TrainConfig(model="tiny-random", progress=False)
    cfg.env.seed_tasks, cfg.env.seed_max_proposals, cfg.env.task_types = N + 3, 8, ("deduction", "abduction")
    teacher = SeedTeacher(seed=2)

    class ScriptedBase:
        """Answers like SeedTeacher, from the prompts' request infos kept by the test."""

        calls = 0

        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            ScriptedBase.calls += 1
            infos = [{"task_type": "deduction", "prefix": r.prefix} for r in requests]
            texts = teacher.act(tuple(r.prompt for r in requests), {"requests": infos})
            return [Completion(i, 0, None, t, [], [], []) for i, t in enumerate(texts)]

    def loop() -> Any:
        env = _env(sandbox, task_types=("deduction", "abduction"))
        return SimpleNamespace(cfg=cfg, env=env, run_dir=tmp_path, generator=ScriptedBase(), device="cpu")

    first = loop()
    report = seed_before_training(*_inputs(first))
    assert isinstance(report, SeedingReport) and report.reached and not report.reused
    # one call of min(budget, max(missing, 64)) = 8 proposals, all valid
    assert ScriptedBase.calls == 1 and first.env.buffers.sizes() == {"deduction": N + 8, "abduction": N + 8, "induction": N}
    saved = json.loads((tmp_path / SEEDING_FILE).read_text())
    assert saved["report"]["per_type"]["deduction"]["valid"] == 8

    again = loop()  # a restart before the first checkpoint: the saved buffers are used, nothing is generated
    reused = seed_before_training(*_inputs(again))
    assert reused is not None and reused.reused and ScriptedBase.calls == 1
    assert again.env.buffers.state_dict() == first.env.buffers.state_dict()

    cfg.env.seed_tasks = N + 4  # other settings: seeded afresh
    assert not seed_before_training(*_inputs(loop())).reused and ScriptedBase.calls == 2
    cfg.env.seed_tasks = 0
    assert seed_before_training(*_inputs(loop())) is None and ScriptedBase.calls == 2


def test_tiny_random_run_seeds_once_warns_and_trains(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """End to end with the real base model (tiny-random never writes a valid proposal): the seeding stage
    spends its budget, warns naming the types, and the run trains; a resumed run does not seed again."""
    from selfplay.config import GenerationConfig
    from selfplay.run import train

    run = tmp_path / "seeded"
    env = EnvConfig(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2, sandbox_workers=1,
                    task_types=("deduction", "induction"), seed_tasks=N + 1, seed_max_proposals=2)
    cfg = TrainConfig(model="tiny-random", rank=4, alpha=8, steps=1, progress=False, run_dir=run, env=env,
                      generation=GenerationConfig(teacher_max_new_tokens=12, student_max_new_tokens=8,
                                                  temperature=1.0),
                      checkpoint_every=1, evolution=False)
    cfg.validate()
    with caplog.at_level(logging.INFO, logger="selfplay.seeding"):
        train(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "selfplay.seeding"]
    assert len(warnings) == 1 and "the base model did not fill every buffer" in warnings[0]
    assert f"deduction: {N}/{N + 1} tasks after 2 proposals (0 valid" in warnings[0] and f"induction: {N}/{N + 1}" in warnings[0]
    saved = json.loads((run / SEEDING_FILE).read_text())
    report = saved["report"]
    assert report["short"] == {"deduction": 1, "induction": 1}
    assert {t: s["proposals"] for t, s in report["per_type"].items()} == {"deduction": 2, "induction": 2}
    assert (run / "checkpoints" / "step_1").is_dir()
    mtime = (run / SEEDING_FILE).stat().st_mtime_ns

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="selfplay.seeding"):
        train(dataclasses.replace(cfg, steps=2, resume=run))
    assert not [r for r in caplog.records if r.name == "selfplay.seeding"]
    assert (run / SEEDING_FILE).stat().st_mtime_ns == mtime
    assert json.loads((run / "run_summary.json").read_text())["steps"] == 2


def test_seed_tasks_is_validated() -> None:
    from selfplay.config import ConfigError

    for fields, message in [({"seed_tasks": 5000, "buffer_cap": 100}, "env.seed_tasks: must be <= buffer_cap (100)"),
                            ({"seed_tasks": -1}, "env.seed_tasks: must be >= 0, got -1"),
                            ({"seed_max_proposals": 1.5}, "env.seed_max_proposals: must be an int")]:
        cfg = TrainConfig(model="tiny-random", env=EnvConfig(**fields))
        with pytest.raises(ConfigError, match=re.escape(message)):
            cfg.validate()


def _buffers_bytes(env: Any) -> bytes:
    return json.dumps(env.buffers.state_dict(), sort_keys=True).encode()


def test_both_arms_of_a_seed_share_one_seeding(sandbox: Sandbox, tmp_path: Path) -> None:
    """The population arm seeds; the baseline arm of the same seed (other agent counts and reward scheme) reuses
    the shared result byte for byte without generating; another seed or another task-shaping setting seeds
    afresh. The seeded programs are stored without comments and docstrings."""
    from baselines.azr import azr_config

    cfg = TrainConfig(model="tiny-random", progress=False, run_dir=tmp_path / "pop")
    cfg.env.seed_tasks, cfg.env.seed_max_proposals, cfg.env.task_types = N + 3, 8, ("deduction", "abduction")
    teacher = SeedTeacher(seed=2)

    class CommentingBase:
        """Answers like SeedTeacher, each program with a comment and a docstring added."""

        calls = 0

        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            CommentingBase.calls += 1
            infos = [{"task_type": "deduction", "prefix": r.prefix} for r in requests]
            texts = teacher.act(tuple(r.prompt for r in requests), {"requests": infos})
            texts = [t.replace("):\n", '):\n    """Says what f does."""\n    # a comment\n', 1) for t in texts]
            return [Completion(i, 0, None, t, [], [], []) for i, t in enumerate(texts)]

    def loop(c: TrainConfig, name: str) -> Any:
        env = _env(sandbox, task_types=c.env.task_types, num_teachers=c.env.num_teachers,
                   num_students=c.env.num_students)
        return SimpleNamespace(cfg=c, env=env, run_dir=tmp_path / name, generator=CommentingBase(), device="cpu")

    population = loop(cfg, "pop")
    assert not seed_before_training(*_inputs(population)).reused and CommentingBase.calls == 1
    seeded = [t for t in population.env.buffers[TaskType.DEDUCTION].tasks if t.task_id.startswith("base-")]
    assert len(seeded) == 8 and all("#" not in t.program and '"""' not in t.program for t in seeded)
    baseline_cfg = azr_config(cfg)
    assert (baseline_cfg.env.num_teachers, baseline_cfg.env.reward_scheme) == (1, "azr")
    baseline = loop(baseline_cfg, "base")
    report = seed_before_training(*_inputs(baseline))
    assert report is not None and report.reused and CommentingBase.calls == 1
    assert _buffers_bytes(baseline.env) == _buffers_bytes(population.env)
    assert (tmp_path / "base" / SEEDING_FILE).is_file()  # the run keeps its own copy
    other_seed = dataclasses.replace(cfg, seed=1)
    assert not seed_before_training(*_inputs(loop(other_seed, "pop-s1"))).reused and CommentingBase.calls == 2


def test_tiny_random_arms_start_from_byte_identical_buffers(tmp_path: Path) -> None:
    """With the real tiny-random base model and the seeding stage on (AZR's identity-only hand seeds): the
    population arm and the baseline arm of one seed start training from byte-identical buffers."""
    from baselines.azr import azr_config, azr_mapping
    from selfplay.config import GenerationConfig
    from selfplay.loop import SelfPlayLoop

    env = EnvConfig(num_teachers=2, num_students=2, tasks_per_teacher=2, samples_per_task=2, sandbox_workers=1,
                    task_types=("deduction", "abduction"), seed_tasks=3, seed_max_proposals=2,
                    hand_seeds="identity")
    cfg = TrainConfig(model="tiny-random", rank=4, alpha=8, steps=1, progress=False, env=env,
                      generation=GenerationConfig(teacher_max_new_tokens=12, student_max_new_tokens=8,
                                                  temperature=1.0))
    starts = {}
    for arm, arm_cfg, assignment in (("population", cfg, None), ("baseline", azr_config(cfg), azr_mapping())):
        loop = SelfPlayLoop(dataclasses.replace(arm_cfg, run_dir=tmp_path / arm), tmp_path / arm, assignment)
        loop.setup()
        try:
            report = seed_before_training(*_inputs(loop))
            assert report is not None and report.reused == (arm == "baseline")
            starts[arm] = _buffers_bytes(loop.env)
        finally:
            loop.env.close()
    assert starts["population"] == starts["baseline"]
    first = json.loads(starts["population"])
    hand = [t["task_id"] for items in first.values() for t in items if t["task_id"].startswith("seed-")]
    assert sorted(hand) == ["seed-abduction-0", "seed-deduction-0", "seed-induction-0"]  # the identity only
