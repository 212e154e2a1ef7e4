"""``populora train --backend ray`` (2 trainer shards, 2 engines, sandbox actors on 2 nodes) on ``tiny-random``
with evolution ends bitwise where ``--backend local`` does: the same adapters, optimizer states, ratings,
buffers, lineage and logged values; a Ray run killed during a checkpoint and resumed ends there too."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evaluation.report import load_scalars
from selfplay import tags
from tests.selfplay.conftest import REPO, TINY, cli_env, killed_on_exit, populora, populora_started

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

PLUGIN = str(REPO / "tests" / "selfplay" / "fault_plugin.py")
ARGS = [*TINY, "--steps", "3", "--checkpoint-every", "1", "--keep-checkpoints", "3", "--generation.batch-size", "4"]
TIMED = (tags.TIME_PREFIX, tags.STEP_SECONDS)


def ray_args(address: str) -> list[str]:
    return ["--backend", "ray", "--ray.address", address, "--ray.trainers", "2", "--ray.engines", "2",
            "--ray.sandbox-nodes", "2", "--ray.sandbox-workers-per-node", "1", "--ray.placement-timeout-s", "600"]


def _untimed(obj):
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in ("seconds", "step_seconds", "totals")}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def _weights(d: Path) -> dict[str, dict]:
    return {m.name: load_file(str(m / "adapter_model.safetensors")) for m in sorted(d.iterdir()) if m.is_dir()}


def assert_same_run(ref: Path, run: Path, steps: tuple[int, ...] = (1, 2, 3)) -> None:
    """Bitwise the same adapters and optimizer states, the same env state (ratings, buffers, RNG), PBT state,
    loop counters and lineage (wall-clock fields aside)."""
    wa, wb = _weights(ref / "adapters"), _weights(run / "adapters")
    assert wa.keys() == wb.keys() and len(wa) == 4
    for m in wa:
        assert wa[m].keys() == wb[m].keys()
        for k in wa[m]:
            assert wa[m][k].dtype == wb[m][k].dtype and (wa[m][k] == wb[m][k]).all(), f"{m} {k} differs"
    for s in steps:
        a, b = ref / "checkpoints" / f"step_{s}", run / "checkpoints" / f"step_{s}"
        pa, pb = _weights(a / "population"), _weights(b / "population")
        assert all((pa[m][k] == pb[m][k]).all() for m in pa for k in pa[m]), f"step {s} weights"
        for m in pa:
            oa, ob = (a / "population" / m / "optimizer.pt"), (b / "population" / m / "optimizer.pt")
            assert oa.is_file() == ob.is_file()
            if oa.is_file():
                sa, sb = torch.load(oa, weights_only=True), torch.load(ob, weights_only=True)
                assert sa["param_groups"] == sb["param_groups"]
                for i in sa["state"]:
                    for k, v in sa["state"][i].items():
                        assert (v == sb["state"][i][k]).all(), f"step {s} {m} optimizer {i} {k}"
        for f in ("env_state.json", "pbt_state.json", "loop_state.json", "population/population.json"):
            assert _untimed(json.loads((a / f).read_text())) == _untimed(json.loads((b / f).read_text())), f"{b / f}"
    la = [_untimed(json.loads(x)) for x in (ref / "lineage.jsonl").read_text().splitlines()]
    lb = [_untimed(json.loads(x)) for x in (run / "lineage.jsonl").read_text().splitlines()]
    assert la == lb and len(la) == 2, "one replacement per role at step 2"
    ratings = json.loads((ref / "checkpoints" / "step_3" / "env_state.json").read_text())
    assert ratings  # (compared above as part of env_state.json)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The uninterrupted local run, started in the background (one thread: its result does not depend on what else
    runs) so that the first Ray run overlaps it; calling the fixture's value waits for it and returns its directory."""
    run = tmp_path_factory.mktemp("eq") / "local"
    proc = populora_started("train", *ARGS, "--run-dir", str(run))
    done: dict[str, str] = {}

    def finished() -> Path:
        if "err" not in done:
            done["err"] = proc.communicate(timeout=1200)[1]
        assert proc.returncode == 0, done["err"][-4000:]
        return run

    with killed_on_exit([proc]):
        yield finished


@pytest.mark.e2e  # several full runs (docs/testing.md §1): CI's end-to-end tier
def test_ray_run_is_bitwise_the_local_run(ray_cluster, local_run, tmp_path):
    _cluster, address = ray_cluster
    run = tmp_path / "ray"
    p = populora("train", *ARGS, *ray_args(address), "--run-dir", str(run), timeout=1800)
    assert p.returncode == 0, p.stderr[-6000:]
    local_run = local_run()
    assert_same_run(local_run, run)
    # every logged value but wall-clock times is the local one; the Ray run adds the sync metric of every member
    sl, sr = load_scalars(local_run), load_scalars(run)
    members = json.loads((run / "config.json").read_text())["mapping"]["agent_to_member"].values()
    sync = {tags.member(m, tags.SYNC) for m in members}
    assert set(sr) - set(sl) == sync
    for tag in sl:
        if not tag.startswith(TIMED):
            assert sl[tag] == sr[tag], tag
    for tag in sync:  # every member, every step: the engines served the trainer's weights (float rounding only)
        assert [s for s, _ in sr[tag]] == [1, 2, 3]
        assert all(0.0 <= v < 1e-3 for _, v in sr[tag]), (tag, sr[tag])
    summary = json.loads((run / "run_summary.json").read_text())
    assert _untimed(summary["history"]) == _untimed(json.loads((local_run / "run_summary.json").read_text())["history"])


@pytest.mark.e2e  # several full runs (docs/testing.md §1): CI's end-to-end tier
def test_a_killed_ray_run_resumes_to_the_uninterrupted_run(ray_cluster, local_run, tmp_path):
    _cluster, address = ray_cluster
    run = tmp_path / "killed"
    env = cli_env()
    env["POPULORA_TEST_KILL"] = "after_done@3"  # kill -9 when step 3's checkpoint is complete, not yet renamed
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", *ARGS, *ray_args(address), "--plugins",
                        PLUGIN, "--run-dir", str(run)], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=1800, start_new_session=True)
    assert p.returncode == -9, (p.returncode, p.stderr[-4000:])
    assert not (run / "adapters").exists()
    env.pop("POPULORA_TEST_KILL")
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", "--resume", str(run), "--plugins", PLUGIN,
                        "--no-progress"],  # the run's plugin, named again: a resume imports none by itself
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1800, start_new_session=True)
    assert p.returncode == 0, p.stderr[-6000:]
    assert "resumed" in p.stderr and "from checkpoint step 2" in p.stderr, p.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["config"]["backend"] == "ray"
    assert_same_run(local_run(), run)


# ------------------------------------------------------------------- asynchronous runs (pipeline.max_staleness)

ASYNC = ["--pipeline.max-staleness", "1"]


@pytest.mark.e2e  # several full runs (docs/testing.md §1): CI's end-to-end tier
@pytest.mark.parametrize("arm", ["population", "baseline"])
def test_staleness_0_machinery_on_ray_is_the_local_synchronous_run(ray_cluster, tmp_path, arm):
    """The asynchronous loop's machinery at staleness 0, driving the Ray engines (given each version) and shards
    (updates on the driver's worker thread), ends bitwise where the synchronous local loop does, for both arms:
    the same adapters, lineage and env state."""
    import tyro

    from baselines.azr import azr_config, azr_mapping
    from selfplay.config import TrainConfig, load_preset
    from selfplay.loop import SelfPlayLoop
    from selfplay.pipeline import AsyncSelfPlayLoop

    _cluster, address = ray_cluster
    threads = torch.get_num_threads()

    def play(loop) -> tuple[dict, dict]:
        loop.setup()
        try:
            for _ in range(3):
                loop.train_step()
            return {m: loop.population.state(m) for m in loop.population.names}, loop.env_state()
        finally:
            loop.close()
            if loop.backend is not None:
                loop.backend.close()

    ends = {}
    for backend in ("local", "ray"):
        on_ray = ray_args(address) + ASYNC + (["--ray.trainers", "1"] if arm == "baseline" else [])  # one member
        args = [a for a in ARGS if a != "--no-progress"] + (on_ray if backend == "ray" else [])
        cfg = tyro.cli(TrainConfig, default=load_preset("cpu-smoke"), args=args)
        cfg, assignment = (azr_config(cfg), azr_mapping()) if arm == "baseline" else (cfg, None)
        cfg = dataclasses.replace(cfg, progress=False, run_dir=tmp_path / backend)
        cfg.validate()
        loop = (AsyncSelfPlayLoop(cfg, tmp_path / backend, assignment, max_staleness=0) if backend == "ray"
                else SelfPlayLoop(cfg, tmp_path / backend, assignment))
        try:
            ends[backend] = play(loop)
        finally:
            torch.set_num_threads(threads)
    (wa, ea), (wb, eb) = ends["local"], ends["ray"]
    assert wa.keys() == wb.keys() and len(wa) == (4 if arm == "population" else 1)
    for m in wa:
        assert all(torch.equal(wa[m][k], wb[m][k]) for k in wa[m]), m
    assert json.loads(json.dumps(ea)) == json.loads(json.dumps(eb))
    if arm == "population":
        la, lb = ([_untimed(json.loads(x)) for x in (tmp_path / b / "lineage.jsonl").read_text().splitlines()]
                  for b in ("local", "ray"))
        assert la == lb and len(la) == 2


@pytest.mark.e2e  # several full runs (docs/testing.md §1): CI's end-to-end tier
def test_an_async_ray_run_is_bitwise_the_local_async_run(ray_cluster, tmp_path):
    """Staleness 1 on Ray (engines and shards overlapping across actors) ends where the local asynchronous run
    (its generator in an engine process) does: adapters, optimizer states, env, PBT, loop and pipeline state at every
    checkpoint, lineage and every logged value but wall-clock times (Ray adds its sync metric)."""
    _cluster, address = ray_cluster
    local = tmp_path / "local"
    proc = populora_started("train", *ARGS, *ASYNC, "--run-dir", str(local))
    with killed_on_exit([proc]):
        run = tmp_path / "ray"
        p = populora("train", *ARGS, *ASYNC, *ray_args(address), "--run-dir", str(run), timeout=1800)
        assert p.returncode == 0, p.stderr[-6000:]
        _out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-4000:]
    assert_same_run(local, run)
    for s in (1, 2, 3):
        a, b = (d / "checkpoints" / f"step_{s}" / "pipeline_state.json" for d in (local, run))
        assert json.loads(a.read_text()) == json.loads(b.read_text())
    sl, sr = load_scalars(local), load_scalars(run)
    assert tags.member("teacher_0", tags.STALENESS) in sl
    for tag in sl:
        if not tag.startswith(TIMED):
            assert sl[tag] == sr[tag], tag


def test_cli_refuses_impossible_requests_before_any_work(ray_cluster, tmp_path):
    """Exit 2 with one line, no model loaded, no placement group left pending."""
    _cluster, address = ray_cluster
    base = [*ARGS, "--backend", "ray", "--ray.address", address, "--ray.placement-timeout-s", "20"]
    cases = {
        "more shards than members": (["--ray.trainers", "5"], "--ray.trainers: 5 trainer shards for at most 4"),
        "a GPU no node has": (["--ray.trainer-gpus", "1"], "no node has that much"),
        "a cluster that is not there": (["--ray.address", "127.0.0.1:1", "--ray.init-timeout-s", "15"],
                                        "Ray cluster"),
    }
    # the refusals are independent commands: started together, so the unreachable cluster's wait for its
    # connection and the other commands' start-up overlap (each is then checked as before)
    commands = {what: ["train", *base, *extra, "--run-dir", str(tmp_path / what.replace(" ", "_"))]
                for what, (extra, _needle) in cases.items()}
    commands["baseline"] = ["baseline", *base, "--ray.trainers", "2", "--run-dir", str(tmp_path / "b")]
    procs = {what: populora_started(*args) for what, args in commands.items()}
    with killed_on_exit(procs.values()):
        done = {what: (p.communicate(timeout=600)[1], p.returncode) for what, p in procs.items()}
    for what, (_extra, needle) in cases.items():
        run = tmp_path / what.replace(" ", "_")
        stderr, returncode = done[what]
        assert returncode == 2, (what, returncode, stderr[-3000:])
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("populora train: error:") and needle in last, (what, last)
        assert "Traceback" not in stderr, what
        assert not (run / "config.json").exists(), what
    stderr, returncode = done["baseline"]
    assert returncode == 2 and "more trainer shards than members (1)" in stderr, stderr[-2000:]
    _no_pending()


def _no_pending() -> None:
    pending = [pg for pg in ray.util.placement_group_table().values() if pg["state"] in ("PENDING", "RESCHEDULING")]
    assert not pending, pending


def test_preflight_refuses_what_the_cluster_cannot_hold(ray_cluster, tmp_path):
    from dataclasses import asdict

    from populora_env.sandbox import Limits
    from selfplay.distributed.cluster import ClusterError, preflight
    from selfplay.distributed.config import RayConfig

    limits = asdict(Limits())
    cases = [(RayConfig(trainers=4, trainer_cpus=4), "do not fit"),
             (RayConfig(sandbox_nodes=5), "5 sandbox nodes asked for"),
             (RayConfig(engine_gpus=0.5), "no node has that much")]
    for rc, needle in cases:
        with pytest.raises(ClusterError, match=needle):
            preflight(rc, 4, tmp_path, limits)
    # the resources exist but are taken: the placement group times out and is removed, never left pending
    from ray.util.placement_group import placement_group, remove_placement_group

    hog = placement_group([{"CPU": 3}] * 3, strategy="STRICT_SPREAD")
    ray.get(hog.ready(), timeout=300)
    try:
        with pytest.raises(ClusterError, match="in use"):
            preflight(RayConfig(trainers=2, trainer_cpus=2, placement_timeout_s=5), 4, tmp_path, limits)
        _no_pending()
    finally:
        remove_placement_group(hog)
    assert list(tmp_path.iterdir()) == []  # the visibility marker is never left behind


def test_a_run_directory_a_trainer_node_cannot_see_exits_2(ray_cluster, tmp_path):
    """The driver runs in a mount namespace of its own with a tmpfs over the run directory's parent: the nodes
    (started outside it) cannot see the run directory, as on a cluster whose nodes do not share the file system."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and util-linux unshare to give the driver a private mount")
    _cluster, address = ray_cluster
    private = tmp_path / "private"
    private.mkdir()
    script = f'mount -t tmpfs populora-test "{private}" && exec "$@"'
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", sys.executable, "-m",
                        "populora_cli.main", "train", *ARGS, "--backend", "ray", "--ray.address", address,
                        "--run-dir", str(private / "run")],
                       capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=600)
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    last = p.stderr.strip().splitlines()[-1]
    assert "is not visible from node(s)" in last and "Traceback" not in p.stderr, last
    assert list(private.iterdir()) == []  # the tmpfs is gone with the driver; nothing was written here
    _no_pending()


def test_cli_without_ray_installed_exits_2(tmp_path):
    """``--backend ray`` where ``import ray`` fails: exit 2 naming the extra (ray hidden by a sitecustomize)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _NoRay(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'ray'\")\n"
        "sys.meta_path.insert(0, _NoRay())\n")
    env = cli_env()
    env["PYTHONPATH"] = str(hide) + os.pathsep + env["PYTHONPATH"]
    p = subprocess.run([sys.executable, "-m", "populora_cli.main", "train", *ARGS, "--backend", "ray", "--run-dir",
                        str(tmp_path / "run")], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "ray is not installed" in p.stderr and "[ray]" in p.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e  # several full runs (docs/testing.md §1): CI's end-to-end tier
def test_the_baseline_on_a_private_ray_instance_is_the_local_baseline(tmp_path):
    """No --ray.address: the command starts a private Ray instance on this machine (its processes must outlive
    the start-up, a bug found here); the single-agent baseline (one member in both roles) ends where it ends
    locally."""
    short = [*TINY, "--steps", "2", "--generation.batch-size", "4"]
    env = cli_env()
    env.pop("RAY_ADDRESS", None)  # set by this session's ray.init: it would make the command join that cluster
    runs = {}
    # one arm after the other: run together on 2 loaded cores, the private instance's actors missed the 120 s
    # placement limit, and once (2026-12-02, full suite) the arms' teachers sampled other tokens from step 1 on
    for arm, extra in (("local", []), ("ray", ["--backend", "ray", "--ray.sandbox-workers-per-node", "1",
                                                "--ray.placement-timeout-s", "600"])):
        runs[arm] = tmp_path / arm
        proc = populora_started("baseline", *short, *extra, "--run-dir", str(runs[arm]), env=env)
        with killed_on_exit([proc]):
            _out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, (arm, err[-4000:])
    wa, wb = _weights(runs["local"] / "adapters"), _weights(runs["ray"] / "adapters")
    assert list(wa) == list(wb) == ["azr"]
    assert all(torch.equal(wa["azr"][k], wb["azr"][k]) for k in wa["azr"])
    sa, sb = load_scalars(runs["local"]), load_scalars(runs["ray"])
    assert set(sb) - set(sa) == {tags.member("azr", tags.SYNC)}
    assert all(sa[t] == sb[t] for t in sa if not t.startswith(TIMED))
