"""An asynchronous population step: round t+1 is generated while round t's updates run, each member acting with
an adapter at most ``k = pipeline.max_staleness`` updates old.

**The schedule.** A member's *version* counts the changes of its weights (each update that stepped, each PBT
replacement). *Boundary* ``b`` is the moment after step ``b``'s updates and PBT step; boundary 0 is the start.
Round ``r`` is generated with every member's version at boundary ``r - 1 - k`` (boundary 0 for the first rounds)
— a rule of the step numbers alone, so which weights play a round never depends on which thread finished first.
``k = 0`` is the synchronous loop (:class:`selfplay.loop.SelfPlayLoop`, which a run with ``max_staleness 0`` uses
unchanged); this class at ``k = 0`` reproduces it bit for bit (tested), so the machinery is checked against it.

**Who does what.** The main thread plays rounds (env, sandbox, the generator), in order, one step's worth of
rounds ahead at most (round ``r`` needs boundary ``r - 1 - k``, so while update ``t`` runs it may play rounds up
to ``t + k``); a worker thread runs the updates, in order (update ``t`` needs round ``t`` and boundary ``t - 1``).
The generator is apart from the trainer (:func:`selfplay.parts.build_parts`: an engine process, a second copy of
the base in this process, the vLLM engine, or Ray's engines) and is given each version to serve through
``load_version`` (the lifecycle contract of :mod:`agents.generation.versions`): it serves exactly the version a
request names. Each rollout records its version (``Rollout.version``) and each update is told the member's current
version, so a stale batch is scored against the log-probs it was sampled with (:mod:`agents.trainer`) and the
staleness is logged per member (``population/<member>/staleness``).

**PBT: in-flight rollouts are discarded.** The PBT step after step ``t`` runs at boundary ``t`` as in the
synchronous loop (ratings of round ``t``, parents' weights after update ``t``). Rounds ``t+1 .. t+k`` were (or
will be) generated with versions from before boundary ``t``, so a replaced member played them with the adapter
PBT removed: those rollouts of that member are discarded — the child is never trained on its predecessor's
samples (``pipeline/discarded_rollouts``, and a log line at the event) — and the child's rating is reset before
round ``t+k+1``, the first it plays, so the games of the removed adapter do not count for it. The other members
train on those rounds as usual. With ``k = 0`` nothing is in flight and this is the synchronous order.

**Checkpoints at a boundary with nothing in flight.** When step ``t``'s record is returned, update ``t`` and the
PBT step are done and the worker is idle until the next call, so the trainer's state is boundary ``t``'s; a round
played ahead is not part of the checkpoint. The env's state is the one round ``t`` left (kept when round ``t``
ended, for the steps a checkpoint follows), and ``pipeline_state.json`` holds the versions, the boundaries the next
rounds read, the adapters of older versions they use (``pipeline/<member>/v<version>.safetensors``) and every rating
reset due after round ``t`` — also one the live env already applied because round ``t + 1`` was played ahead — so a
checkpoint's bytes do not depend on how far ahead the main thread got (a thread race). A resumed run plays the rounds after ``t`` again with the same versions, seeds and env, so it
ends as the uninterrupted run ends (tested with ``kill -9``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from agents.rollout import Rollout
from selfplay import tags
from selfplay.checkpoint import CheckpointError, write_json
from selfplay.config import TrainConfig
from selfplay.finite import check_rewards
from selfplay.loop import PlayedRound, SelfPlayLoop, StepRecord
from selfplay.phase_memory import PhaseMemory
from selfplay.rollouts import rollouts_from_round
from selfplay.rundir import RunFileError, read_json

__all__ = ["AsyncSelfPlayLoop", "PIPELINE_DIR", "PIPELINE_STATE", "make_loop", "read_pipeline_state"]

log = logging.getLogger(__name__)

PIPELINE_STATE = "pipeline_state.json"
"""A checkpoint's record of the pipeline (versions, boundaries, rating resets due)."""
PIPELINE_DIR = "pipeline"
"""A checkpoint's folder of older adapter versions the next rounds use (``<member>/v<version>.safetensors``)."""


def make_loop(cfg: TrainConfig, run_dir: Path, assignment: Any = None) -> SelfPlayLoop:
    """The loop a run uses: :class:`AsyncSelfPlayLoop` with ``pipeline.max_staleness >= 1``, else the synchronous
    :class:`~selfplay.loop.SelfPlayLoop`."""
    return AsyncSelfPlayLoop(cfg, run_dir, assignment) if cfg.asynchronous else SelfPlayLoop(cfg, run_dir, assignment)


class AsyncSelfPlayLoop(SelfPlayLoop):
    """The self-play loop with generation and updates overlapped under the staleness bound (module docstring).

    ``max_staleness`` (default ``cfg.pipeline.max_staleness``) may be 0 here: the same machinery then waits for
    every update before the next round, which is the synchronous loop's order (what the tests compare).
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, assignment: Any = None,
                 max_staleness: int | None = None) -> None:
        super().__init__(cfg, run_dir, assignment)
        self.k = cfg.pipeline.max_staleness if max_staleness is None else int(max_staleness)

    # ------------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        super().setup()
        members = list(self.mapping.members)
        self.versions: dict[str, int] = dict.fromkeys(members, 0)  # the trainer's weights
        self.birth: dict[str, int] = dict.fromkeys(members, 0)  # the version each member's adapter started at
        self.boundaries: dict[int, dict[str, int]] = {0: dict(self.versions)}
        self.floor = 0  # the earliest boundary there is (a run resumed from a synchronous checkpoint: that step)
        self.snapshots: dict[str, dict[int, dict]] = {m: {0: self.population.state(m)} for m in members}
        self.served: dict[str, int] = {}  # what the generator serves
        self.rounds: dict[int, PlayedRound] = {}  # played, not yet turned into a record
        self.env_states: dict[int, dict] = {}  # the env as round t left it, for a checkpoint after step t
        self.resets: list[list] = []  # [round before which, member, applied]: ratings PBT reset (_reset_rating)
        self.next_round = 1
        # the phases overlap (generation on this thread, updates on the worker): CUDA's one peak counter cannot
        # tell them apart, so an asynchronous run records no per-phase memory (a synchronous run's measure)
        self.memory = PhaseMemory("cpu")
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="populora-update")

    def continue_after(self, step: int) -> None:
        """Continue after checkpoint ``step`` (parts and :meth:`load_extra` already restored)."""
        self.step = step
        self._seeded = True
        self.next_round = step + 1
        self.served = {}

    def close(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.shutdown(wait=True, cancel_futures=True)
        try:
            super().close()
        finally:
            close = getattr(self.generator, "close", None)
            if callable(close) and self.backend is None:
                close()

    def _generation_threads(self):
        """No change of this process's torch threads: the generating side sets its own (its process, Ray's
        engines), or shares this process's count with the updates (``pipeline.layout = "thread"``)."""
        return nullcontext()

    # -------------------------------------------------------------------------------- the schedule
    def round_versions(self, r: int) -> dict[str, int]:
        """Every member's version that generates round ``r``: its version at boundary ``r - 1 - k`` (module
        docstring; never before the first boundary there is, and, in a run resumed with a larger staleness than
        its checkpoint kept boundaries for, the earliest one it kept after that)."""
        target = max(r - 1 - self.k, self.floor)
        return dict(self.boundaries[min((b for b in self.boundaries if b >= target), default=max(self.boundaries))])

    def _may_play(self, r: int, step: int) -> bool:
        """Whether round ``r`` may be played while step ``step``'s update runs: the next round, within the run,
        and its boundary ``r - 1 - k`` complete (boundaries up to ``step - 1`` are)."""
        return r == self.next_round and r <= self.cfg.steps and r - 1 - self.k <= step - 1

    def _play(self, r: int) -> None:
        """Play round ``r`` with its versions (the ratings PBT reset for it first), and keep what its update and
        a checkpoint after step ``r`` need."""
        for entry in self.resets:
            if entry[0] == r and not entry[2]:
                self._apply_reset(entry)
        versions = self.round_versions(r)
        for member, v in versions.items():
            if self.served.get(member) != v:
                self.generator.load_version(member, v, self.snapshots[member][v])
                self.served[member] = v
        self.rounds[r] = self.play_round(r, versions)
        if self.cfg.checkpoint_due(r):
            self.env_states[r] = json.loads(json.dumps(self.env.state_dict()))
        self.next_round = r + 1

    def _batches(self, step: int) -> tuple[dict[str, list[Rollout]], int]:
        """Each member's rollouts of round ``step`` for its update, without those generated by an adapter PBT
        has replaced since (module docstring), and how many were discarded."""
        played = self.rounds[step]
        batches = rollouts_from_round(played.outcome, played.completions, self.mapping)
        check_rewards(batches, self.cfg.env.reward_scheme)
        out: dict[str, list[Rollout]] = {}
        discarded = 0
        for m in self.mapping.members:
            batch = batches.get(m) or []
            kept = [r for r in batch if r.version is None or r.version >= self.birth[m]]
            if len(kept) < len(batch):
                discarded += len(batch) - len(kept)
                log.info("pipeline: step %d: %d rollout(s) of %s discarded (generated by the adapter that PBT "
                         "replaced)", step, len(batch) - len(kept), m)
            if kept:
                out[m] = kept
        return out, discarded

    # ---------------------------------------------------------------------------------------- a step
    def train_step(self) -> StepRecord:
        """Step ``t = step + 1``: round ``t`` (played ahead during the previous step, or now), its updates on the
        worker while the main thread plays the next rounds the schedule allows, then the PBT step; returns
        step ``t``'s record once boundary ``t`` is complete."""
        self._seed_once()
        t_step = time.perf_counter()
        t = self.step + 1
        if t not in self.rounds:
            self._play(t)
        batches, discarded = self._batches(t)
        versions = {m: self.versions[m] for m in batches}
        job: Future = self._worker.submit(self._update, batches, versions)
        while not job.done() and self._may_play(self.next_round, t):
            self._play(self.next_round)
        member_metrics, update_s = job.result()
        self.nonfinite.observe(t, member_metrics)  # NonFiniteTraining before this step's checkpoint
        for m, mm in member_metrics.items():
            if mm.get("skipped") == 0.0:
                self.versions[m] += 1
        self.step = t
        played = self.rounds.pop(t)
        t0 = time.perf_counter()
        events = self._evolve(t, played.outcome, lambda m: self._reset_rating(t + self.k + 1, m))
        for e in events:
            child = e["culled"]
            self.versions[child] += 1
            self.birth[child] = self.versions[child]
            if self.k and t < self.cfg.steps:
                log.info("pipeline: PBT after step %d replaced %s; its rollouts of rounds %d..%d, generated before the "
                         "replacement, are discarded; the child plays from round %d", t, child, t + 1,
                         min(t + self.k, self.cfg.steps), t + self.k + 1)
        evolution_s = time.perf_counter() - t0
        self._complete_boundary(t)
        record = StepRecord(
            step=t, outcome=played.outcome, completions=played.completions, prompts=played.prompts,
            mapping=self.mapping, member_metrics=member_metrics, evolution=events,
            times={**played.times, "update": update_s, "evolution": evolution_s},
            pipeline={tags.DISCARDED: float(discarded)}, dropped_prompts=played.dropped_prompts)
        record.times["step"] = time.perf_counter() - t_step
        return record

    def _reset_rating(self, due: int, member: str) -> None:
        """PBT replaced ``member``: its agents' ratings are reset before round ``due``, its child's first — now, if
        every earlier round has been played (``k = 0``: the synchronous order), else when round ``due`` starts."""
        entry = [due, member, False]
        self.resets.append(entry)
        if self.next_round == due:
            self._apply_reset(entry)

    def _apply_reset(self, entry: list) -> None:
        for agent in self.mapping.agents_of(entry[1]):
            self.env.reset_rating(agent)
        entry[2] = True

    def _update(self, batches: dict[str, list[Rollout]], versions: dict[str, int]
                ) -> tuple[dict[str, dict[str, float]], float]:
        """The worker's job: every member's update of one step; its metrics and seconds."""
        t0 = time.perf_counter()
        metrics = self.trainer.update_many(batches, versions=versions)
        return metrics, time.perf_counter() - t0

    def _complete_boundary(self, t: int) -> None:
        """Record boundary ``t``: the versions, a snapshot of each new one, and forget what no later round or
        checkpoint reads (boundaries before ``t - k``, the env states and rating resets of earlier steps)."""
        self.boundaries[t] = dict(self.versions)
        for m, v in self.versions.items():
            if v not in self.snapshots[m]:
                self.snapshots[m][v] = self.population.state(m)
        keep_from = max(self.floor, t - self.k)
        self.boundaries = {b: vs for b, vs in self.boundaries.items() if b >= keep_from}
        needed = {m: {vs[m] for vs in self.boundaries.values()} for m in self.versions}
        self.snapshots = {m: {v: st for v, st in snaps.items() if v in needed[m]} for m, snaps in self.snapshots.items()}
        self.env_states = {r: st for r, st in self.env_states.items() if r >= t}
        self.resets = [e for e in self.resets if e[0] > t]

    # ------------------------------------------------------------------------------ checkpoints
    def env_state(self) -> dict:
        """The env at boundary ``step`` in one form, whatever the main thread played ahead: as round ``step`` left
        it (kept when the round ended), without the rating resets applied since; :meth:`save_extra` records every
        reset still due after round ``step`` (applied to the live env or not), so the checkpoint's bytes do not
        depend on how far ahead the rounds were played (a thread race)."""
        if self.step in self.env_states:
            return self.env_states[self.step]
        if self.next_round == self.step + 1 and not any(applied for _, _, applied in self.resets):
            return self.env.state_dict()  # nothing played or reset since round ``step``: the live env is its state
        raise RuntimeError(f"no env state kept for a checkpoint after step {self.step} (round {self.next_round - 1} "
                           "was played since; checkpoints follow cfg.checkpoint_due)")

    def save_extra(self, directory: Path) -> None:
        """``pipeline_state.json`` and the older adapter versions the next rounds use (module docstring)."""
        from safetensors.torch import save_file

        older: dict[str, list[int]] = {}
        for m, snaps in self.snapshots.items():
            older[m] = sorted(v for v in snaps if v != self.versions[m])
            for v in older[m]:
                path = Path(directory) / PIPELINE_DIR / m / f"v{v}.safetensors"
                path.parent.mkdir(parents=True, exist_ok=True)
                save_file({k: x.contiguous() for k, x in snaps[v].items()}, str(path), metadata={"format": "pt"})
        write_json(Path(directory) / PIPELINE_STATE, {
            "max_staleness": self.k, "versions": self.versions, "birth": self.birth, "floor": self.floor,
            "boundaries": {str(b): vs for b, vs in sorted(self.boundaries.items())},
            "older_versions": older, "rating_resets": [[r, m] for r, m, _ in self.resets],  # all due after `step`
        })

    def load_extra(self, directory: Path) -> None:
        """Restore :meth:`save_extra`'s record; a checkpoint without one (written by a synchronous run, resumed
        with a staleness) starts the schedule at its step, with every member's version there."""
        step = int(Path(directory).name.rpartition("_")[2])
        path = Path(directory) / PIPELINE_STATE
        members = list(self.mapping.members)
        if not path.is_file():
            self.versions, self.birth = dict.fromkeys(members, 0), dict.fromkeys(members, 0)
            self.boundaries, self.floor, self.resets = {step: dict(self.versions)}, step, []
            self.snapshots = {m: {0: self.population.state(m)} for m in members}
            return
        state = read_pipeline_state(path, members, step)
        self.versions, self.birth, self.floor = state["versions"], state["birth"], state["floor"]
        self.boundaries, self.resets = state["boundaries"], state["rating_resets"]
        self.snapshots = {m: {self.versions[m]: self.population.state(m)} for m in members}
        from safetensors.torch import load_file

        for m, vs in state["older_versions"].items():
            for v in vs:
                file = Path(directory) / PIPELINE_DIR / m / f"v{v}.safetensors"
                try:
                    self.snapshots[m][v] = load_file(str(file))
                except Exception as exc:  # noqa: BLE001 - a missing or damaged file names itself
                    raise CheckpointError(file, f"cannot be read ({type(exc).__name__}: {exc})") from None
        for b, vs in self.boundaries.items():
            for m, v in vs.items():
                if v not in self.snapshots[m]:
                    raise CheckpointError(path, f"boundary {b} names version {v} of {m!r}, which the checkpoint "
                                                "does not hold")


def read_pipeline_state(path: Path, members: list[str], step: int) -> dict[str, Any]:
    """``pipeline_state.json`` with every value checked (members of this run, non-negative integers, boundaries
    and rating resets within the run's steps); :class:`CheckpointError` naming the field otherwise."""
    try:
        st = read_json(path)
    except RunFileError as exc:
        raise CheckpointError(path, exc.reason) from None

    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(path, f"field {field!r}: {why}")

    def is_count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62

    def per_member(field: str, value: Any) -> dict[str, int]:
        if not isinstance(value, dict) or sorted(value) != sorted(members) or not all(map(is_count, value.values())):
            raise bad(field, f"not a count for each of the run's members {members}")
        return {m: int(value[m]) for m in members}

    if not isinstance(st, dict):
        raise CheckpointError(path, "is not a JSON object")
    out: dict[str, Any] = {"versions": per_member("versions", st.get("versions")),
                           "birth": per_member("birth", st.get("birth"))}
    floor = st.get("floor")
    if not is_count(floor) or floor > step:
        raise bad("floor", f"not a step in 0..{step}")
    out["floor"] = floor
    raw = st.get("boundaries")
    # ASCII digits only: '²'.isdigit() is True, but int('²') fails
    if not isinstance(raw, dict) or not raw or not all(re.fullmatch(r"[0-9]{1,18}", k) and int(k) <= step
                                                       for k in raw):
        raise bad("boundaries", f"not an object of steps 0..{step}")
    out["boundaries"] = {int(b): per_member(f"boundaries.{b}", vs) for b, vs in raw.items()}
    older = st.get("older_versions")
    if not isinstance(older, dict) or not set(older) <= set(members) \
            or not all(isinstance(v, list) and all(map(is_count, v)) for v in older.values()):
        raise bad("older_versions", "not lists of versions of the run's members")
    out["older_versions"] = {m: list(v) for m, v in older.items()}
    for b, vs in out["boundaries"].items():  # every version a boundary names is held: the current or a file
        for m, v in vs.items():
            if v != out["versions"][m] and v not in out["older_versions"].get(m, []):
                raise CheckpointError(path, f"boundary {b} names version {v} of {m!r}, which the checkpoint does "
                                            "not hold")
    for m, vs in out["older_versions"].items():
        for v in vs:
            file = path.parent / PIPELINE_DIR / m / f"v{v}.safetensors"
            if not file.is_file():
                raise CheckpointError(file, "is missing (pipeline_state.json names it among the older versions)")
    resets = st.get("rating_resets")
    if not isinstance(resets, list) or not all(isinstance(x, list) and len(x) == 2 and is_count(x[0])
                                               and x[1] in members for x in resets):
        raise bad("rating_resets", "not a list of [round, member] pairs")
    out["rating_resets"] = [[int(r), str(m), False] for r, m in resets]
    return out
