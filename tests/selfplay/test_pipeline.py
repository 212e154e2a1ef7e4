"""The asynchronous population step (``selfplay/pipeline.py``, ``pipeline.max_staleness``) on ``tiny-random``.

* At staleness 0 its machinery (the generator apart from the trainer, given each version; updates on a worker
  thread; deferred rating resets) plays exactly the synchronous loop: the same completions, log-probs, metrics,
  lineage, weights and env state, bit for bit, for both arms. ``--pipeline.max-staleness 0`` itself runs the
  synchronous loop (``make_loop``).
* At staleness 1 round ``r`` is generated with every member's version of boundary ``r - 2``; each update is told
  the member's version; a stale rollout's log-probs are those of the version that generated it (scored again
  with that version's weights: float rounding), not those of the weights being trained; the staleness is 1 in
  steady state, and the mismatch each update logs is the drift from the version that generated its batch; PBT
  discards the replaced member's rollouts of the round generated before its replacement.
* The same seed gives the same run whichever layout generates (an engine process or a thread), and a run
  killed with ``kill -9`` during a checkpoint and resumed ends as the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines.azr import azr_config, azr_mapping
from selfplay.config import TrainConfig, load_preset
from selfplay.loop import SelfPlayLoop
from selfplay.pipeline import PIPELINE_STATE, AsyncSelfPlayLoop, make_loop
from tests.selfplay.conftest import REF_ARGS, REPO, cli_env, killed_on_exit, populora_started

STEPS = 4  # REF_ARGS: PBT at steps 2 and 4, one replacement per role each
ASYNC = ["--pipeline.max-staleness", "1", "--generation.threads", "1"]  # REF_ARGS sets --threads 1


def _cfg(*extra: str) -> TrainConfig:
    import tyro

    args = [a for a in REF_ARGS if a != "--no-progress"] + [*ASYNC, "--pipeline.layout", "thread", *extra]
    cfg = dataclasses.replace(tyro.cli(TrainConfig, default=load_preset("cpu-smoke"), args=args), progress=False)
    cfg.validate()
    return cfg


def _play(loop: SelfPlayLoop, steps: int = STEPS, each=None) -> tuple[list, dict, dict]:
    loop.setup()
    records = []
    try:
        for _ in range(steps):
            records.append(loop.train_step())
            if each is not None:
                each(loop, records[-1])
        states = {m: loop.population.state(m) for m in loop.population.names}
        env = loop.env.state_dict()
    finally:
        loop.close()
    return records, states, env


def _untimed(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("seconds", "staleness", "staleness_max")}


@pytest.mark.parametrize("arm", ["population", "baseline"])
def test_staleness_0_machinery_is_the_synchronous_loop_bit_for_bit(tmp_path: Path, arm: str) -> None:
    threads = torch.get_num_threads()
    cfg, assignment = _cfg(), None  # max_staleness 1 in the config: the parts are built apart
    if arm == "baseline":
        cfg, assignment = azr_config(cfg), azr_mapping()
    sync_cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, max_staleness=0))
    try:
        assert type(make_loop(sync_cfg, tmp_path / "m")) is SelfPlayLoop  # what --pipeline.max-staleness 0 runs
        sync = _play(SelfPlayLoop(sync_cfg, tmp_path / "sync", assignment))
        apart = AsyncSelfPlayLoop(cfg, tmp_path / "apart", assignment, max_staleness=0)
        pipe = _play(apart)
    finally:
        torch.set_num_threads(threads)
    assert apart.generator is not apart.trainer and apart.generator.population is not apart.population
    for a, b in zip(sync[0], pipe[0], strict=True):
        assert a.completions.keys() == b.completions.keys()
        for cid, ca in a.completions.items():
            cb = b.completions[cid]
            assert (ca.text, ca.token_ids, ca.logprobs) == (cb.text, cb.token_ids, cb.logprobs), (a.step, cid)
        assert a.outcome.rewards == b.outcome.rewards
        assert {m: _untimed(x) for m, x in a.member_metrics.items()} == \
            {m: _untimed(x) for m, x in b.member_metrics.items()}
        assert all(x["staleness"] == 0.0 for x in b.member_metrics.values())
        assert [_untimed(e) for e in a.evolution] == [_untimed(e) for e in b.evolution]
    assert sum(len(r.evolution) for r in sync[0]) == (4 if arm == "population" else 0)
    for m, state in sync[1].items():
        assert all(torch.equal(state[k], pipe[1][m][k]) for k in state), m
    assert json.dumps(sync[2], sort_keys=True) == json.dumps(pipe[2], sort_keys=True)


def _score(loop: AsyncSelfPlayLoop, member: str, rollouts: list, state: dict) -> float:
    """Mean |log pi_state - Rollout.logprobs| over the completion tokens, ``member`` holding ``state``."""
    from selfplay.distributed.shards import sync_gap

    live = loop.population.state(member)
    loop.population.load_state(member, state)
    try:
        return float(sync_gap(loop.population, member, rollouts))
    finally:
        loop.population.load_state(member, live)


def test_rounds_use_their_scheduled_versions_and_updates_score_them_against_the_version_that_generated_them(
        tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    loop = AsyncSelfPlayLoop(_cfg(), tmp_path / "run")
    assert loop.k == 1
    loop.setup()
    played: dict[int, dict] = {}  # round -> the versions it was generated with
    updates: list[tuple[dict, dict]] = []  # (batches, versions) of each update, in order
    boundaries = {0: dict(loop.boundaries[0])}  # step -> every member's version after it
    snapshots = {m: dict(s) for m, s in loop.snapshots.items()}  # member -> version -> weights
    play_round, update_many = loop.play_round, loop.trainer.update_many

    def recorded_round(step, versions=None):
        played[step] = dict(versions)
        return play_round(step, versions)

    def recorded_update(batches, versions=None):
        updates.append(({m: list(b) for m, b in batches.items()}, dict(versions)))
        return update_many(batches, versions=versions)

    loop.play_round, loop.trainer.update_many = recorded_round, recorded_update
    records = []
    try:
        for _ in range(STEPS):
            records.append(loop.train_step())
            boundaries[loop.step] = dict(loop.boundaries[loop.step])
            for m, snaps in loop.snapshots.items():
                snapshots[m].update(snaps)
    finally:
        loop.close()
        torch.set_num_threads(threads)
    assert sorted(played) == [1, 2, 3, 4]
    for r, versions in played.items():  # round r: every member's version at boundary r - 2 (0 at first)
        assert versions == boundaries[max(r - 2, 0)], r
        assert {c.version for (a, _), c in records[r - 1].completions.items()} <= set(versions.values())
    culled = sorted(e["culled"] for e in records[1].evolution)  # PBT after step 2: one member per role
    assert len(culled) == 2
    for t, (batches, versions) in enumerate(updates, start=1):
        assert versions == {m: boundaries[t - 1][m] for m in batches}  # each update is told the member's version
        for member, rollouts in batches.items():
            (v,) = {r.version for r in rollouts}
            assert v == played[t][member]
            staleness = versions[member] - v
            assert records[t - 1].member_metrics[member]["staleness"] == staleness
            assert staleness == (0 if t == 1 or (t == 4 and member in culled) else 1), (t, member)
            if staleness:  # the log-probs are the generating version's, not the weights the update started from
                assert _score(loop, member, rollouts, snapshots[member][v]) < 1e-4, (t, member)
                assert _score(loop, member, rollouts, snapshots[member][versions[member]]) > 1e-3, (t, member)
    # round 3 was generated before PBT replaced them: their rollouts of it are discarded, no update at step 3
    assert records[2].pipeline["discarded_rollouts"] > 0
    assert sorted(set(loop.population.names) - set(records[2].member_metrics)) == culled
    assert records[3].pipeline["discarded_rollouts"] == 0


def _checkpoints_played(tmp_path: Path, ahead) -> dict[int, tuple[str, str]]:
    """Run the staleness-1 loop :data:`STEPS` steps; ``ahead(t)``: whether the main thread plays every round the
    schedule allows while update ``t`` runs (the update waits for it) or none (the round is played when its step
    starts) — the two ends of the thread race. Returns each step's checkpoint state: ``env_state.json`` and
    ``pipeline_state.json`` as written."""
    import time

    loop = AsyncSelfPlayLoop(_cfg(), tmp_path / "run")
    may_play, update = loop._may_play, loop._update

    def paced_may_play(r: int, step: int) -> bool:
        return ahead(step) and may_play(r, step)

    def paced_update(batches, versions):
        t = loop.step + 1
        deadline = time.monotonic() + 600
        while ahead(t) and may_play(loop.next_round, t) and time.monotonic() < deadline:
            time.sleep(0.01)  # the main thread plays the rounds ahead first
        return update(batches, versions)

    loop._may_play, loop._update = paced_may_play, paced_update
    states: dict[int, tuple[str, str]] = {}

    def checkpoint(lp: AsyncSelfPlayLoop, record) -> None:
        d = tmp_path / f"step_{record.step}"
        lp.save_extra(d)
        states[record.step] = (json.dumps(lp.env_state(), sort_keys=True), (d / PIPELINE_STATE).read_text())

    threads = torch.get_num_threads()
    try:
        _play(loop, each=checkpoint)
    finally:
        torch.set_num_threads(threads)
    return states


def test_an_async_checkpoint_does_not_depend_on_how_far_ahead_rounds_were_played(tmp_path: Path) -> None:
    """Issue 48: with round 3 played during update 2 (PBT after step 2 resets two ratings, due before round 4) but
    round 4 not played during update 3, checkpoint 3 held the live env (ratings reset) and no reset pending; played
    ahead at every step it held the env of round 3 and the resets pending: a resumed run's checkpoint differed from
    the uninterrupted one's. One form now: the env as round ``t`` left it and every reset still due."""
    always = _checkpoints_played(tmp_path / "always", lambda t: True)
    at_pbt = _checkpoints_played(tmp_path / "at_pbt", lambda t: t == 2)
    assert sorted(always) == list(range(1, STEPS + 1))
    for step in (2, 3):  # PBT after step 2 replaced one member per role: both resets due before round 4
        assert [r for r, _ in json.loads(always[step][1])["rating_resets"]] == [4, 4], step
    for step in always:
        assert at_pbt[step] == always[step], step  # steps 1, 3 and 4 of at_pbt: no round played ahead


# ------------------------------------------------------------------------------- end to end, the command


@pytest.fixture(scope="module")
def async_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same asynchronous run (REF_ARGS, staleness 1) with the generator in an engine process and in a thread,
    side by side."""
    root = tmp_path_factory.mktemp("async")
    dirs = {layout: root / layout for layout in ("process", "thread")}
    procs = {layout: populora_started("train", *REF_ARGS, *ASYNC, "--pipeline.layout", layout, "--run-dir", str(d))
             for layout, d in dirs.items()}
    with killed_on_exit(procs.values()):
        for layout, p in procs.items():
            _, err = p.communicate(timeout=900)
            assert p.returncode == 0, f"{layout}: {err[-4000:]}"
    return dirs


def test_one_seed_gives_one_async_run_whichever_layout_generates(async_runs: dict[str, Path]) -> None:
    from tests.selfplay.test_resume import assert_equal_runs

    assert_equal_runs(async_runs["process"], async_runs["thread"])
    for step in (3, 4):
        a, b = (async_runs[x] / "checkpoints" / f"step_{step}" / PIPELINE_STATE for x in ("process", "thread"))
        assert json.loads(a.read_text()) == json.loads(b.read_text())
    summary = json.loads((async_runs["process"] / "run_summary.json").read_text())
    assert len(summary["history"]) == STEPS


def test_async_metrics_per_member_in_tensorboard_and_the_report(async_runs: dict[str, Path]) -> None:
    from evaluation.report import load_scalars
    from selfplay import tags

    run = async_runs["process"]
    scalars = load_scalars(run)
    members = json.loads((run / "config.json").read_text())["mapping"]["agent_to_member"].values()
    for m in members:
        steps = [s for s, _ in scalars[tags.member(m, tags.STALENESS)]]
        assert steps and set(steps) <= set(range(1, STEPS + 1))
        assert {v for _, v in scalars[tags.member(m, tags.STALENESS)]} <= {0.0, 1.0}
        # the mismatch against the weights each update trained: float rounding on-policy, the drift when stale
        mismatch = dict(scalars[tags.member(m, tags.MISMATCH_ABS_MEAN)])
        assert sorted(mismatch) == steps
        for step, staleness in scalars[tags.member(m, tags.STALENESS)]:
            assert (mismatch[step] > 1e-3) if staleness else (mismatch[step] < 1e-4), (m, step, mismatch[step])
    assert [s for s, _ in scalars[tags.pipeline(tags.DISCARDED)]] == list(range(1, STEPS + 1))
    assert sum(v for _, v in scalars[tags.pipeline(tags.DISCARDED)]) > 0  # PBT after step 2 replaced two members
    report = (run / "report" / "summary.md").read_text()
    section = report.split("## Asynchronous steps", 1)[1].split("\n## ", 1)[0]
    assert "mismatch, mean abs Δ log p" in section and "mismatch KL (mean)" in section
    rows = [line for line in section.splitlines() if line.startswith(f"| {run.name} |")]
    assert sorted(line.split(" | ")[1] for line in rows) == sorted(members)
    assert all("n/a" not in line for line in rows)


@pytest.mark.e2e  # a kill and a resume (minutes of the default suite; issue 45): CI runs it in the e2e tier
def test_kill_9_during_an_async_run_then_resume_equals_the_uninterrupted_run(async_runs: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    """Killed while step 2's checkpoint is written (round 3 already generated, ahead), resumed from step 1."""
    from tests.selfplay.test_resume import PLUGIN, assert_equal_runs

    run = tmp_path / "killed"
    env = cli_env()
    env["POPULORA_TEST_KILL"] = "mid_population@2"
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", *REF_ARGS, *ASYNC, "--plugins", PLUGIN,
                        "--run-dir", str(run)], capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
                       start_new_session=True)
    assert p.returncode == -9, (p.returncode, p.stderr[-4000:])
    env.pop("POPULORA_TEST_KILL")
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", "--resume", str(run), "--plugins", PLUGIN,
                        "--no-progress"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
                       start_new_session=True)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "from checkpoint step 1" in p.stderr, p.stderr[-3000:]
    assert_equal_runs(async_runs["process"], run)
    for step in (3, 4):
        a, b = (d / "checkpoints" / f"step_{step}" / PIPELINE_STATE for d in (async_runs["process"], run))
        assert json.loads(a.read_text()) == json.loads(b.read_text())


@pytest.mark.parametrize("field, value, why", [
    ("versions", {"a": 1}, "not a count for each of the run's members"),
    ("boundaries", {"9": {"a": 0, "b": 0}}, "not an object of steps 0..4"),
    ("rating_resets", [[5, "zz"]], "not a list of [round, member] pairs"),
    ("older_versions", {"a": ["1"]}, "not lists of versions"),
    ("floor", -1, "not a step in 0..4"),
    ("boundaries", {"²": {"a": 2, "b": 2}}, "not an object of steps 0..4"),  # isdigit(), not int(): ValueError
])
def test_a_damaged_pipeline_state_is_refused_naming_the_field(tmp_path: Path, field: str, value, why: str) -> None:
    from selfplay.checkpoint import CheckpointError
    from selfplay.pipeline import PIPELINE_DIR, read_pipeline_state

    (tmp_path / PIPELINE_DIR / "a").mkdir(parents=True)
    (tmp_path / PIPELINE_DIR / "a" / "v2.safetensors").write_bytes(b"")  # the older version it names

    good = {"max_staleness": 1, "versions": {"a": 3, "b": 2}, "birth": {"a": 0, "b": 2}, "floor": 0,
            "boundaries": {"3": {"a": 2, "b": 2}, "4": {"a": 3, "b": 2}}, "older_versions": {"a": [2]},
            "rating_resets": [[6, "b"]]}
    path = tmp_path / PIPELINE_STATE
    path.write_text(json.dumps(good))
    state = read_pipeline_state(path, ["a", "b"], 4)
    assert state["boundaries"] == {3: {"a": 2, "b": 2}, 4: {"a": 3, "b": 2}}
    path.write_text(json.dumps(good | {field: value}))
    with pytest.raises(CheckpointError, match=f"field '{field}'.*{re.escape(why)}"):
        read_pipeline_state(path, ["a", "b"], 4)


@pytest.mark.parametrize("change, why", [
    ({"boundaries": {"4": {"a": 5, "b": 2}}}, "boundary 4 names version 5 of 'a', which the checkpoint does not hold"),
    ({"older_versions": {"a": [2, 1]}}, "v1.safetensors: is missing"),
])
def test_a_pipeline_state_naming_a_version_it_does_not_hold_is_refused_before_the_model(tmp_path: Path, change,
                                                                                       why: str) -> None:
    """Issue 48: resume found this only after the model loaded (exit 2); read_pipeline_state, which
    check_checkpoint calls before, now refuses it, so resume falls back to an older checkpoint."""
    from selfplay.checkpoint import CheckpointError
    from selfplay.pipeline import PIPELINE_DIR, read_pipeline_state

    (tmp_path / PIPELINE_DIR / "a").mkdir(parents=True)
    (tmp_path / PIPELINE_DIR / "a" / "v2.safetensors").write_bytes(b"")
    good = {"max_staleness": 1, "versions": {"a": 3, "b": 2}, "birth": {"a": 0, "b": 2}, "floor": 0,
            "boundaries": {"4": {"a": 2, "b": 2}}, "older_versions": {"a": [2]}, "rating_resets": []}
    path = tmp_path / PIPELINE_STATE
    path.write_text(json.dumps(good | change))
    with pytest.raises(CheckpointError, match=re.escape(why)):
        read_pipeline_state(path, ["a", "b"], 4)


@pytest.mark.e2e
def test_resume_falls_back_over_a_pipeline_state_naming_a_version_it_does_not_hold(async_runs: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    """The issue's reproduction through the command: step 4's pipeline_state.json (re-sealed) names a version
    the checkpoint does not hold; resume names the file, sets step 4 aside and continues from step 3 (it exited 2
    after the model loaded)."""
    import shutil

    from selfplay.checkpoint import write_manifest

    run = tmp_path / "crafted"
    shutil.copytree(async_runs["thread"], run)
    path = run / "checkpoints" / "step_4" / PIPELINE_STATE
    state = json.loads(path.read_text())
    member = sorted(state["versions"])[0]
    state["boundaries"][max(state["boundaries"], key=int)][member] = 99
    path.write_text(json.dumps(state))
    write_manifest(path.parent, 4)
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", "--resume", str(run), "--no-progress"],
                       capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    assert f"step_4/{PIPELINE_STATE}: boundary" in p.stderr and "from checkpoint step 3" in p.stderr, p.stderr[-3000:]
    assert (run / "checkpoints" / "damaged" / "step_4").is_dir() and (run / "checkpoints" / "step_4").is_dir()
