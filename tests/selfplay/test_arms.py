"""The two arms differ only in who proposes and who judges: each claim of docs/usage.md's compute-matching paragraph.

1. The resolved configurations (``populora train|baseline --preset P --dry-run``) are equal but for the agent
   counts, the reward scheme (and its keyword arguments), evolution and the run's name — the trainer section (estimator included) for
   every shipped preset, and for the GPU pair ``paper-4t4s`` / ``azr-baseline``.
2. Per step (a real step with scripted completions, ``tests/selfplay/scripted.py``): the baseline's single
   adapter makes exactly ``tasks_per_teacher`` proposals, as each population teacher does, and
   ``samples_per_task`` attempts at each of its tasks (its teacher's valid tasks, topped up with buffer tasks
   to ``tasks_per_teacher``), as each population student does; every adapter takes exactly one update per
   step, in optimizer steps of ``trainer.mini_batch_size`` rollouts (one step over the whole batch when it is
   unset), so with mini-batches the baseline, whose batch holds both roles, takes the steps of one teacher and
   one student together; every generation request carries the same token limits and sampling settings in both arms.
3. The estimator's scoping is the same: the baseline's batch is whitened per role × task type exactly as its
   proposer half and its solver half would be as two population members (roles never share a scope).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from baselines.azr import azr_config, azr_mapping
from populora_cli.main import main
from selfplay.config import list_presets, load_preset
from selfplay.rollouts import whitening_scopes
from tests.selfplay.scripted import ScriptedLoop, cpu_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GPU_PAIR = ("paper-4t4s", "azr-baseline")
CPU_PRESETS = [p for p in list_presets() if p.startswith("cpu-")]
ARM_FIELDS = {"name", "env.num_teachers", "env.num_students", "env.reward_scheme", "env.reward_kwargs", "evolution"}
"""The only resolved settings allowed to differ between ``populora train`` and ``populora baseline`` (the reward
scheme's keyword arguments go with the scheme: ``azr-baseline`` sets AZR's code's ``extreme_reward``)."""


def _resolved(command: str, preset: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([command, "--preset", preset, "--dry-run"]) == 0
    return json.loads(out.getvalue())


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and not k.endswith("kwargs"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _differing(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    fa, fb = _flat(a), _flat(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)}


# ------------------------------------------------------------------------------ 1. resolved configs


@pytest.mark.parametrize("preset", list_presets())
def test_train_and_baseline_resolve_the_same_trainer(preset: str) -> None:
    population, baseline = _resolved("train", preset), _resolved("baseline", preset)
    assert population["trainer"] == baseline["trainer"]
    assert population["trainer"]["advantage"] == "reinforce_pp_baseline"  # the paper's estimator, both arms
    assert baseline["trainer"]["role_weighting"] == "balanced"  # the single adapter's roles share its update
    # the baseline drops a preset's scripted opponents (its opponent is itself; docs/swapping.md)
    assert {k for k in _differing(population, baseline) if not k.startswith("scripted.")} <= ARM_FIELDS
    assert all(not v for k, v in _flat(baseline).items() if k.startswith("scripted.") and k.endswith(("teachers", "students")))
    assert baseline["env"]["reward_scheme"] == "azr" and baseline["evolution"] is False
    assert (baseline["env"]["num_teachers"], baseline["env"]["num_students"]) == (1, 1)


def test_gpu_recipe_and_its_baseline_differ_only_by_arm() -> None:
    population, baseline = _resolved("train", GPU_PAIR[0]), _resolved("baseline", GPU_PAIR[1])
    assert population["trainer"] == baseline["trainer"]
    for arm in (population, baseline):  # issue 22's settings of the first GPU run
        assert arm["trainer"]["advantage"] == "reinforce_pp_baseline"
        assert arm["trainer"]["role_weighting"] == "balanced"
        assert arm["env"]["validation"] == "azr" and arm["env"]["buffer_cap"] == 16384
        assert arm["env"]["hand_seeds"] == "identity"
        assert arm["pbt"]["min_final_age"] is None  # = pbt.interval: no event in the last interval
    assert _differing(population, baseline) <= ARM_FIELDS | {"preset"}


def test_one_flag_changes_the_estimator_of_both_arms() -> None:
    for command in ("train", "baseline"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([command, "--trainer.advantage", "grpo", "--dry-run"]) == 0
        assert json.loads(out.getvalue())["trainer"]["advantage"] == "grpo"


# ------------------------------------------------------------------------- 2 and 3. one real step


def _step(preset: str, arm: str, run_dir: Path) -> tuple[ScriptedLoop, Any]:
    torch.set_num_threads(1)
    cfg = cpu_config(load_preset(preset), run_dir)
    assignment = None
    if arm == "baseline":
        cfg, assignment = azr_config(cfg), azr_mapping()
    loop = ScriptedLoop(cfg, run_dir, assignment)
    loop.setup()
    try:
        record = loop.train_step()
    finally:
        loop.env.close()
    return loop, record


@pytest.fixture(scope="module", params=CPU_PRESETS)
def arms(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One real step of each arm of a CPU preset: ``(preset, {arm: (loop, record)})``."""
    preset = request.param
    root = tmp_path_factory.mktemp(preset)
    return preset, {arm: _step(preset, arm, root / arm) for arm in ("population", "baseline")}


def _count(record: Any, agent: str) -> int:
    return sum(1 for a, _ in record.completions if a == agent)


def test_proposals_and_attempts_per_adapter_are_one_teacher_and_one_student(arms: tuple[str, dict]) -> None:
    preset, steps = arms
    env_cfg = load_preset(preset).env
    for arm, (_loop, record) in steps.items():
        results = record.outcome.results
        assert any(p.valid for p in results.proposals), arm
        for teacher in results.teachers:
            assert _count(record, teacher) == env_cfg.tasks_per_teacher, (arm, teacher)
        for student in results.students:
            matched = [m.teacher for m in results.matches if m.student == student]
            assert len(matched) == 1, (arm, student, matched)  # one teacher per student (equal counts)
            valid = sum(p.valid for p in results.proposals_of(matched[0]))
            tasks = max(valid, env_cfg.tasks_per_teacher) if env_cfg.student_fill else valid
            assert _count(record, student) == env_cfg.samples_per_task * tasks, (arm, student, valid)
            matched_attempts = sum(a.matched for a in results.attempts_of(student))
            assert matched_attempts == env_cfg.samples_per_task * valid, (arm, student)
    loop, record = steps["baseline"]
    (batch,) = loop.batches.values()  # the single adapter trains on exactly those completions
    roles = Counter(r.meta["role"] for r in batch)
    assert roles == {"teacher": env_cfg.tasks_per_teacher, "student": _count(record, "student_0")}


def test_every_adapter_takes_one_update_per_step_in_equal_mini_batches(arms: tuple[str, dict]) -> None:
    preset, steps = arms
    trainer = load_preset(preset).trainer
    role_steps: dict[str, dict[frozenset, float]] = {}
    for arm, (loop, record) in steps.items():
        assert dict(loop.updates) == dict.fromkeys(loop.mapping.members, 1), arm
        for member, batch in loop.batches.items():
            mini = trainer.mini_batch_size or len(batch)
            num_steps = record.member_metrics[member]["num_steps"]
            assert num_steps == trainer.epochs * math.ceil(len(batch) / mini), (arm, member, len(batch))
            role_steps.setdefault(arm, {})[frozenset(r.meta["role"] for r in batch)] = num_steps
    pop, (base,) = role_steps["population"], role_steps["baseline"].values()
    if trainer.mini_batch_size is None:
        assert base == trainer.epochs  # one step over its whole batch, as every population member takes
    else:  # as many rollouts per optimizer step: the steps of one teacher and one student together
        assert base == pop[frozenset({"teacher"})] + pop[frozenset({"student"})]


def test_same_token_limits_and_sampling_in_both_arms(arms: tuple[str, dict]) -> None:
    preset, steps = arms
    settings = {arm: {(phase, r.max_new_tokens, r.temperature, r.top_p) for phase, r in loop.generator.requests}
                for arm, (loop, _) in steps.items()}
    assert settings["population"] == settings["baseline"]
    g = load_preset(preset).generation
    assert {(p, n) for p, n, _, _ in settings["baseline"]} == {("propose", g.teacher_max_new_tokens),
                                                              ("solve", g.student_max_new_tokens)}


def test_the_baselines_roles_each_get_half_of_its_gradient(arms: tuple[str, dict]) -> None:
    """On the baseline's real batch of a scripted step: with every advantage 1 and every completion token's
    log-prob the same parameter theta, dL/dtheta splits into one sum per role; with the preset's trainer
    section (balanced) each role's sum is half of the whole, whatever its token count."""
    from agents.losses import policy_loss
    from agents.weighting import role_loss_weights

    preset, steps = arms
    trainer = load_preset(preset).trainer
    (batch,) = steps["baseline"][0].batches.values()
    roles = [r.meta["role"] for r in batch]
    lengths = [len(r.completion_ids) for r in batch]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(max(lengths))] for n in lengths])
    tokens = {role: sum(n for n, r in zip(lengths, roles, strict=True) if r == role) for role in ("teacher", "student")}

    def shares(weights: torch.Tensor | None) -> dict[str, float]:
        theta = torch.zeros((), requires_grad=True)
        grads = {}
        for role in tokens:
            lp = theta.expand_as(mask).clone()
            adv = torch.tensor([[float(r == role)] for r in roles]).expand_as(mask)
            out = policy_loss(lp, lp.detach(), adv, mask, loss_agg_mode=trainer.loss_agg_mode,
                              token_weights=weights)
            grads[role] = float(torch.autograd.grad(out.loss, theta)[0])
        return {role: g / sum(grads.values()) for role, g in grads.items()}

    balanced = shares(role_loss_weights(roles, mask, trainer.role_weighting, trainer.loss_agg_mode, None))
    assert balanced == pytest.approx({"teacher": 0.5, "student": 0.5}, abs=1e-6)
    # the same measurement of a plain token mean gives each role its share of the tokens
    n = sum(tokens.values())
    assert shares(None) == pytest.approx({role: k / n for role, k in tokens.items()}, abs=1e-6)


def test_the_baseline_is_scoped_like_two_members(arms: tuple[str, dict]) -> None:
    _, steps = arms
    for arm, (loop, _) in steps.items():
        for member, batch in loop.batches.items():
            for role in {r.meta["role"] for r in batch}:
                rows = [r for r in batch if r.meta["role"] == role]
                alone = whitening_scopes([(r.meta["role"], r.meta["task_type"]) for r in rows])
                assert [r.scope for r in rows] == alone, (arm, member, role)
                assert all(scope[0] == role for scope in alone)
    (batch,) = steps["baseline"][0].batches.values()
    assert {r.meta["role"] for r in batch} == {"teacher", "student"}
