"""The logging contract: what a run writes to TensorBoard, and what ``populora report`` draws from it.

Two layers, every tag name taken from ``selfplay.tags`` (never retyped, so a renamed tag fails here):

1. ``step_scalars`` on hand-built typed rounds (a population round and a baseline round) — exact values:
   solve rate on matched attempts with fillers apart, the teacher × student pair counts, validity counts,
   per-role rewards and lengths, and per-role entropy from the trainer's ``entropy/<role>`` (for the baseline's
   single member, not its mixed ``entropy``);
2. real ``tiny-random`` runs through the CLI (``populora train`` and ``populora baseline``, 3 steps, PBT at
   step 2): every tag the README and the report rely on (and every member's rollout/trainer mismatch and
   tamper count) is written at every step with plausible values and
   counts that match the round (proposals = proposing teachers × tasks_per_teacher; matched attempts = valid
   tasks × samples_per_task), and ``populora report`` on both runs draws the teacher × student matrix, the
   retention figure and, for the baseline, proposer and solver entropy as two curves.

A random tiny model never writes a valid task in 3 steps, so in layer 2 the matched solve rate and the program
complexity tags are checked for consistency (logged exactly when there is something to measure); their values
are pinned in layer 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agents.generation import Completion
from evaluation.report import load_run, load_scalars
from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundOutcome, RoundResults
from selfplay import tags
from selfplay.logger import step_scalars
from selfplay.loop import StepRecord
from selfplay.mapping import AgentMapping
from selfplay.run import HISTORY_KEYS
from selfplay.rundir import TAMPER_SAMPLES
from tests.selfplay.conftest import ARM_STEPS

STEPS = ARM_STEPS
RATE_TAGS = (tags.SOLVE_RATE, tags.FILLER_SOLVE_RATE, tags.STUDENT_FORMAT_RATE, tags.VALID_RATE,
             tags.FRAC_REWARD_ZERO_STD)


# ----------------------------------------------------------------------------- 1. hand-built rounds


def _completion(n_tokens: int) -> Completion:
    return Completion(0, 0, None, "x", [1, 2], list(range(n_tokens)), [0.0] * n_tokens)


def _population_record() -> StepRecord:
    """teacher_0: a valid deduction and a format error; teacher_1: two valid tasks. teacher_0 is matched with
    student_1 (2 attempts at its one valid task, 1 correct) and teacher_1 with student_0 (2 × 2 attempts,
    all correct); student_1 also makes one filler attempt (wrong) and one malformed matched attempt."""
    proposals = (
        ProposalResult("teacher_0", 0, "deduction", "a", True, True, None),
        ProposalResult("teacher_0", 1, "abduction", "b", False, False, "format"),
        ProposalResult("teacher_1", 0, "abduction", "c", True, True, None),
        ProposalResult("teacher_1", 1, "deduction", "d", True, True, None),
    )
    attempts = (
        AttemptResult("student_1", 0, "a", "deduction", "teacher_0", True, True, None),
        AttemptResult("student_1", 1, "a", "deduction", "teacher_0", False, False, "format"),
        AttemptResult("student_1", 2, "z", "induction", None, True, False, "wrong"),
        *(AttemptResult("student_0", i, "cd"[i // 2], "abduction" if i < 2 else "deduction", "teacher_1", True,
                        True, None) for i in range(4)),
    )
    matches = (
        MatchResult("teacher_0", "student_1", 0.5, 0.5, 1, 2, 1, "draw"),
        MatchResult("teacher_1", "student_0", 0.5, 1.0, 2, 4, 4, "student"),
    )
    results = RoundResults(1, ("teacher_0", "teacher_1"), ("student_0", "student_1"), proposals, attempts, matches)
    rewards = {"teacher_0": (0.5, -1.0), "teacher_1": (0.0, 0.0), "student_0": (1.0,) * 4,
               "student_1": (1.0, -1.0, -0.5)}
    ratings = {a: (25.0 + i, 8.0) for i, a in enumerate(results.agents)}
    outcome = RoundOutcome(results, rewards, ratings, {"metrics": {}})
    lengths = {"teacher_0": (10, 30), "teacher_1": (20, 20), "student_0": (4, 4, 4, 4), "student_1": (2, 6, 7)}
    completions = {(a, i): _completion(n) for a, ns in lengths.items() for i, n in enumerate(ns)}
    mapping = AgentMapping.build(results.teachers, results.students)
    metrics = {
        "teacher_0": {"entropy": 1.0, "entropy/teacher": 1.0},
        "teacher_1": {"entropy": 3.0, "entropy/teacher": 3.0},
        "student_0": {"entropy": 0.5, "entropy/student": 0.5},
        "student_1": {"entropy": 1.5, "entropy/student": 1.5},
    }
    return StepRecord(1, outcome, completions, {}, mapping, metrics)


def test_step_scalars_of_a_population_round() -> None:
    out = step_scalars(_population_record())
    assert out[tags.SOLVE_RATE] == 5 / 6  # matched attempts only: 1 + 4 correct of 2 + 4
    assert out[tags.FILLER_SOLVE_RATE] == 0.0  # the one filler attempt, apart
    assert out[tags.STUDENT_FORMAT_RATE] == 6 / 7
    assert out[tags.VALID_RATE] == 0.75
    assert out[tags.valid_rate("deduction")] == 1.0 and out[tags.valid_rate("abduction")] == 0.5
    assert out[tags.validity("valid")] == 3 and out[tags.validity("format")] == 1
    assert {t: v for t, v in out.items() if tags.parse_pair(t)} == {
        tags.pair("teacher_0", "student_1", "attempts"): 2, tags.pair("teacher_0", "student_1", "correct"): 1,
        tags.pair("teacher_1", "student_0", "attempts"): 4, tags.pair("teacher_1", "student_0", "correct"): 4,
    }
    assert out[tags.TEACHER_REWARD] == pytest.approx(-0.5 / 4)
    assert out[tags.STUDENT_REWARD] == pytest.approx(3.5 / 7)
    assert out[tags.response_length("teacher")] == 20 and out[tags.response_length("student")] == 31 / 7
    assert out[tags.entropy("teacher")] == 2.0 and out[tags.entropy("student")] == 1.0
    assert out[tags.member("teacher_1", "conservative")] == 26.0 - 24.0
    assert out[tags.member("student_1", "reward")] == pytest.approx(-0.5 / 3)


def test_step_scalars_split_the_baselines_roles() -> None:
    """One member plays teacher_0 and student_0: per-role tags come from its per-role metrics, never from
    the member's mixed entropy."""
    proposals = (ProposalResult("teacher_0", 0, "deduction", "a", True, True, None),
                 ProposalResult("teacher_0", 1, "deduction", "b", True, False, "duplicate"))
    attempts = tuple(AttemptResult("student_0", i, "a", "deduction", "teacher_0", True, i == 0, None)
                     for i in range(2))
    matches = (MatchResult("teacher_0", "student_0", 0.5, 0.5, 1, 2, 1, "draw"),)
    results = RoundResults(1, ("teacher_0",), ("student_0",), proposals, attempts, matches)
    outcome = RoundOutcome(results, {"teacher_0": (1.0, -1.0), "student_0": (1.0, 0.0)},
                           {"teacher_0": (25.0, 8.0), "student_0": (25.0, 8.0)}, {"metrics": {}})
    completions = {("teacher_0", 0): _completion(12), ("teacher_0", 1): _completion(12),
                   ("student_0", 0): _completion(3), ("student_0", 1): _completion(5)}
    mapping = AgentMapping.build(("teacher_0",), ("student_0",), {"teacher_0": "azr", "student_0": "azr"})
    metrics = {"azr": {"entropy": 1.25, "entropy/teacher": 1.0, "entropy/student": 2.0}}
    out = step_scalars(StepRecord(1, outcome, completions, {}, mapping, metrics))
    assert out[tags.entropy("teacher")] == 1.0 and out[tags.entropy("student")] == 2.0
    assert out[tags.member("azr", "entropy")] == 1.25
    assert out[tags.response_length("teacher")] == 12 and out[tags.response_length("student")] == 4
    assert out[tags.TEACHER_REWARD] == 0.0 and out[tags.STUDENT_REWARD] == 0.5
    assert out[tags.pair("teacher_0", "student_0", "attempts")] == 2
    assert out[tags.validity("duplicate")] == 1 and out[tags.SOLVE_RATE] == 0.5


# ------------------------------------------------------------------------------ 2. real CLI runs


@pytest.fixture(scope="module")
def runs(arm_runs: dict[str, Path]) -> dict[str, Path]:
    """A population and a baseline run of 3 steps (PBT at step 2), side by side, and the report of both
    (conftest's ``arm_runs``, shared with test_train_smoke.py)."""
    return arm_runs


def _env_config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())["config"]["env"]


def _at(scalars: dict, tag: str) -> dict[int, float]:
    return dict(scalars.get(tag, ()))


def _every_step(scalars: dict, tag: str) -> dict[int, float]:
    got = _at(scalars, tag)
    assert sorted(got) == list(range(1, STEPS + 1)), f"{tag} logged at steps {sorted(got)}"
    assert all(math.isfinite(v) for v in got.values()), (tag, got)
    return got


@pytest.mark.parametrize("arm", ["population", "baseline"])
def test_run_writes_every_tag_with_plausible_values(runs: dict[str, Path], arm: str) -> None:
    run = runs[arm]
    sc = load_scalars(run)
    cfg = json.loads((run / "config.json").read_text())
    env = cfg["config"]["env"]
    mapping = AgentMapping.from_dict(cfg["mapping"])
    agents, members = list(mapping.agent_to_member), mapping.members

    always = [tags.TEACHER_REWARD, tags.STUDENT_REWARD, tags.VALID_RATE, tags.STUDENT_FORMAT_RATE,
              tags.FRAC_REWARD_ZERO_STD, tags.STEP_SECONDS, tags.REPLACEMENTS]
    always += [f(role) for role in tags.ROLES for f in (tags.response_length, tags.entropy)]
    always += [tags.loss(t) for t in tags.LOSS_KEYS] + [tags.program(k) for k in tags.COVERAGE_KEYS]
    always += [tags.time(p) for p in tags.TIME_PHASES]
    always += [tags.member(a, k) for a in agents for k in (*tags.RATING_KEYS, *tags.AGENT_KEYS)]
    always += [tags.member(m, k) for m in members for k in tags.MEMBER_KEYS]
    # the rollout/trainer mismatch of every member's update (the HF engine's sampling log-probs against the
    # trainer's: float rounding on CPU)
    always += [tags.member(m, k) for m in members for k in tags.MISMATCH_KEYS]
    # reward-hacking telemetry: every member's count and the total at every step (a random model writes no program
    # that runs, so none tampers: all zero, and no per-class tag)
    always += [tags.tamper(m) for m in members] + [tags.TAMPER_TOTAL]
    # whether a role's advantages were all zero: a flag at every step of each role
    always += [tags.zero_advantage(role) for role in tags.ROLES]
    series = {t: _every_step(sc, t) for t in always}
    assert all(v in (0.0, 1.0) for role in tags.ROLES for v in series[tags.zero_advantage(role)].values())
    assert all(v == 0.0 for m in members for v in series[tags.tamper(m)].values())
    assert not [t for t in sc if tags.parse_tamper_class(t)] and not (run / TAMPER_SAMPLES).exists()
    for m in members:
        assert all(0 <= v < 1e-3 for v in series[tags.member(m, tags.MISMATCH_ABS_MAX)].values())
    for t in RATE_TAGS + tuple(t for t in sc if tags.parse_valid_rate(t)):
        assert all(0.0 <= v <= 1.0 for v in _at(sc, t).values()), (t, _at(sc, t))
    for t in (tags.TEACHER_REWARD, tags.STUDENT_REWARD):
        assert all(-1.0 <= v <= 1.0 for v in series[t].values()), (t, series[t])
    for a in agents:
        mu, sigma, cons = (series[tags.member(a, k)] for k in tags.RATING_KEYS)
        assert all(cons[s] == pytest.approx(mu[s] - 3 * sigma[s], abs=1e-4) and sigma[s] > 0 for s in mu)

    proposers = [a for a, role in mapping.agent_roles.items() if role == "teacher"]
    assert len(proposers) == env["num_teachers"] == (1 if arm == "baseline" else 2)
    n_proposals = env["num_teachers"] * env["tasks_per_teacher"]
    reasons = [t for t in sc if tags.parse_validity(t)]
    for step in range(1, STEPS + 1):
        counts = {t: _at(sc, t).get(step, 0.0) for t in reasons}
        assert sum(counts.values()) == n_proposals, (step, counts)
        valid = counts.get(tags.validity("valid"), 0.0)
        assert series[tags.VALID_RATE][step] == pytest.approx(valid / n_proposals)
        # pair counts: every proposing teacher matched once per step; its valid tasks, samples_per_task each
        pairs = {p: v.get(step) for t in sc if (p := tags.parse_pair(t)) and step in (v := _at(sc, t))}
        matched_teachers = {t for t, _, key in pairs if key == "attempts"}
        assert len(matched_teachers) == len(proposers), (step, pairs)
        attempts = sum(v for (_, _, key), v in pairs.items() if key == "attempts")
        correct = sum(v for (_, _, key), v in pairs.items() if key == "correct")
        assert attempts == valid * env["samples_per_task"] and 0 <= correct <= attempts
        solve = _at(sc, tags.SOLVE_RATE)
        assert (step in solve) == (attempts > 0)  # matched solve rate exactly when there were matched attempts
        if attempts:
            assert solve[step] == pytest.approx(correct / attempts)
        for k in tags.PROGRAM_KEYS:  # complexity means of the round's valid programs: only when there are some
            assert (step in _at(sc, tags.program(k))) == (valid > 0), (k, step, valid)

    # evolution: the replacements logged are the lineage's lines, at the PBT interval
    lineage = [json.loads(line) for line in (run / "lineage.jsonl").read_text().splitlines()] \
        if (run / "lineage.jsonl").exists() else []
    assert sum(series[tags.REPLACEMENTS].values()) == len(lineage)
    if arm == "population":
        assert {r["step"] for r in lineage} == {2} and {r["role"] for r in lineage} == {"teacher", "student"}
    else:
        assert lineage == []  # one member: nothing to evolve

    # the per-step history of run_summary.json copies the same tags
    history = json.loads((run / "run_summary.json").read_text())["history"]
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    for h in history:
        for key, tag in HISTORY_KEYS.items():
            assert h[key] == (pytest.approx(_at(sc, tag)[h["step"]]) if h["step"] in _at(sc, tag) else None)

    # text: the hyperparameter table and samples of both roles
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(run), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    texts = acc.Tags()["tensors"]  # torch's add_text stores <tag>/text_summary
    for tag in (tags.HYPERPARAMETERS, tags.samples("teacher"), tags.samples("student")):
        assert any(t == tag or t.startswith(f"{tag}/") for t in texts), (tag, texts)


def test_baseline_entropy_is_split_by_role(runs: dict[str, Path]) -> None:
    """The single member trains proposer and solver completions in one update: the per-role curves are two
    measurements, and the member's mixed entropy is their token-weighted mean (so it lies between them)."""
    sc = load_scalars(runs["baseline"])
    teacher, student = _every_step(sc, tags.entropy("teacher")), _every_step(sc, tags.entropy("student"))
    mixed = _every_step(sc, tags.member("azr", "entropy"))
    assert any(teacher[s] != student[s] for s in teacher)
    for s in teacher:
        lo, hi = sorted((teacher[s], student[s]))
        assert lo - 1e-6 <= mixed[s] <= hi + 1e-6, (s, teacher[s], student[s], mixed[s])


def test_report_draws_the_matrix_retention_and_roles(runs: dict[str, Path]) -> None:
    out = runs["report"]
    figures = {f["key"]: f for f in json.loads((out / "figures.json").read_text())["figures"]}
    for key in ("pairs", "retention", "roles", "solve_rate", "entropy", "tamper"):
        assert (out / f"{key}.png").is_file(), key
    names = {arm: load_run(runs[arm]).name for arm in ("population", "baseline")}

    # teacher x student matrix: one panel per run and step (3 steps -> 3 windows of one step)
    panels = figures["pairs"]["panels"]
    assert [(p["run"], p["first"], p["last"]) for p in panels] == [
        (names[arm], s, s) for arm in ("population", "baseline") for s in range(1, STEPS + 1)
    ]
    pop_panel = panels[0]
    assert pop_panel["teachers"] == ["teacher_0", "teacher_1"]
    assert pop_panel["students"] and set(pop_panel["students"]) <= {"student_0", "student_1"}
    assert [sum(row) for row in pop_panel["matched_steps"]] == [1, 1]  # each teacher matched once in the step
    assert panels[-1]["teachers"] == ["teacher_0"] and panels[-1]["students"] == ["student_0"]

    # retention: the population's children of step 2 (one per role), ranked one step after birth
    curves = figures["retention"]["panels"]
    assert [p["run"] for p in curves] == [names["population"]]
    kids = curves[0]["curves"]
    assert sorted(c["role"] for c in kids) == ["student", "teacher"]
    assert all(c["step"] == 2 and c["points"] == 1 and c["culled_rank"] in (1, 2) for c in kids)
    summary = (out / "summary.md").read_text()
    assert sum(line.startswith(f"| {names['population']} |") for line in summary.splitlines()) == 2

    # the baseline's proposer and solver entropy: two curves of the per-role tags
    entropy = next(p for p in figures["roles"]["panels"]
                   if p["run"] == names["baseline"] and "entropy" in p["title"])
    assert {(c["label"], c["tag"], c["points"]) for c in entropy["curves"]} == {
        ("teacher (proposer)", tags.entropy("teacher"), STEPS),
        ("student (solver)", tags.entropy("student"), STEPS),
    }
    # the solve-rate figure's first panel is the matched rate: its curves (if a run matched anything; a random
    # model rarely writes a valid task) come from the matched tag, else the empty panel is noted
    matched = figures["solve_rate"]["panels"][0]
    assert matched["title"] == "matched tasks (fillers excluded)"
    assert all(c["tag"] == tags.SOLVE_RATE for c in matched["curves"])
    logged = [arm for arm in ("population", "baseline") if tags.SOLVE_RATE in load_scalars(runs[arm])]
    assert sorted(c["run"] for c in matched["curves"]) == sorted(names[arm] for arm in logged)
    if not logged:
        assert f"no run logs `{tags.SOLVE_RATE}` (panel left empty)" in summary
