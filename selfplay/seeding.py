"""The seeding stage before training: the base model fills the task buffers (docs/azr.md §7, §13.2).

AZR starts self-play from a seed set that its base model proposed (256 tasks), not from hand-written tasks.
With ``env.seed_tasks = N > 0`` a run does the same before its first step:

1. **Programs** (deduction and abduction, one pool as in AZR): rounds of proposer prompts of each of the two
   types that is still short, built from the current buffers exactly as a round's prompts are (K references
   drawn uniformly), answered by the base model with every adapter disabled (``adapter=None``); the valid,
   de-duplicated tasks go into both buffers. Until each holds N tasks (the hand-written seeds included).
2. **Induction**: then induction proposer prompts, one program from the seeded pool per prompt, until the
   induction buffer holds N tasks.

Each task type may use at most ``seed_max_proposals`` proposals (default 8 × N). A type still short after that
is reported with a **warning** naming it, its counts and its most frequent rejection reasons, and training
starts with what the buffers hold: the seed set is a head start, not a precondition (the hand-written seeds
are still there), and aborting would throw away the proposals already validated.

Nothing is trained, no rating changes. The seeded programs are stored without their comments and docstrings
(:func:`populora_env.seeds.strip_comments_and_docstrings`, as AZR's seeding does).

**One seeding per fingerprint, shared by both arms.** The result (report and buffers) depends only on the
*fingerprint* (:func:`seeding_fingerprint`): the base model, the seed, the env settings that shape tasks (every
``env`` field but the agent counts and the reward scheme and its arguments) and the generation settings. It is
written to a shared cache, ``<cache>/<sha256 of the fingerprint>.json`` (``seeding_cache``, default
``<run_dir's parent>/.seeding``, so ``runs/<preset>-population-s0`` and ``runs/<preset>-baseline-s0`` share
``runs/.seeding``), under a file lock, and every run with the same fingerprint — the population and the
baseline arm of one seed, in either order or at the same time — starts from those same buffers, byte for byte.
The run's own copy is ``<run>/seeding.json`` (reused when the run is restarted before its first checkpoint);
later the buffers are part of every checkpoint's env state. After seeding (generated or reused) the loop
re-seeds the env's RNG, so a run's history does not depend on which arm seeded first. Per call the counts (proposals, valid, added, seconds) are logged, a
progress bar shows the tasks still missing, and :class:`SeedingReport` sums them up per task type.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from agents.generation import GenerationRequest
from agents.generation.threads import generation_threads
from populora_env.config import seed_proposal_budget
from populora_env.seeds import strip_comments_and_docstrings
from populora_env.tasks import TaskType
from selfplay.checkpoint import write_json
from selfplay.config import TrainConfig, to_dict
from selfplay.rundir import SEEDING, RunFileError, UnsafeRunFile, read_json

log = logging.getLogger(__name__)

SEEDING_CACHE = ".seeding"
"""Default shared cache of seeding results, next to the run directories (``<run_dir's parent>/.seeding``)."""

ARM_FIELDS = ("num_teachers", "num_students", "reward_scheme", "reward_kwargs")
"""The env fields left out of the seeding fingerprint: what differs between the arms of one comparison and does
not shape the seeded tasks."""

SEEDING_FILE = SEEDING
"""The seeding stage's record in the run directory (report, buffers and the settings they came from)."""

DEFAULT_BATCH = 64
"""Proposals per generate call and task type when few are missing (AZR's seeding batch is 64)."""

Proposer = Callable[[Sequence[str], Sequence[Mapping[str, Any]]], Sequence[str]]
"""``propose(prompts, requests) -> completions``: one completion per prompt; ``requests`` are the env's request
infos (task type, response prefix, chat-template flag, stop strings; induction: program and input count)."""


@dataclass
class TypeStats:
    """What seeding one task type cost and gave."""

    proposals: int = 0
    """Proposals of this type generated."""
    valid: int = 0
    """Valid proposals among them (after de-duplication)."""
    added: int = 0
    """Tasks that entered this type's buffer (a deduction/abduction proposal of the other type counts too)."""
    seconds: float = 0.0
    """Generation + validation time of this type's calls."""
    calls: int = 0
    """Generate calls."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Rejection reasons of the invalid proposals, with counts."""


@dataclass
class SeedingReport:
    """The outcome of the seeding stage."""

    target: int
    """Tasks wanted in every buffer in play (``env.seed_tasks``)."""
    budget: int
    """Most proposals per task type (``env.seed_max_proposals``, default 8 × target)."""
    sizes_before: dict[str, int]
    sizes_after: dict[str, int]
    per_type: dict[str, TypeStats]
    seconds: float = 0.0
    short: dict[str, int] = field(default_factory=dict)
    """Task type -> tasks still missing when its budget ran out (empty when every buffer reached the target)."""
    reused: bool = False
    """The buffers came from an earlier attempt's ``seeding.json`` (nothing was generated this time)."""

    @property
    def reached(self) -> bool:
        """Every buffer in play holds ``target`` tasks."""
        return not self.short

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeedingReport:
        fields = dict(data)
        fields["per_type"] = {t: TypeStats(**s) for t, s in data["per_type"].items()}
        return cls(**fields)

    def warning(self) -> str | None:
        """The message of a shortfall (``None`` when the target was reached)."""
        if self.reached:
            return None
        parts = []
        for task_type, missing in self.short.items():
            stats = self.per_type[task_type]
            top = ", ".join(f"{r} {n}" for r, n in Counter(stats.reasons).most_common(3)) or "none"
            parts.append(f"{task_type}: {self.target - missing}/{self.target} tasks after {stats.proposals} "
                         f"proposals ({stats.valid} valid; most frequent rejections: {top})")
        return ("seeding: the base model did not fill every buffer within env.seed_max_proposals = "
                f"{self.budget} proposals per type — " + "; ".join(parts) + ". Training starts with these buffers "
                "(the hand-written seeds included); raise env.seed_max_proposals or lower env.seed_tasks, or check "
                "the prompt set (env.prompts) and the generation budget if the rejections are format errors.")


def seed_buffers(env: Any, propose: Proposer, target: int, budget: int, *, batch: int = DEFAULT_BATCH,
                 progress: bool = False) -> SeedingReport:
    """Fill ``env``'s buffers to ``target`` tasks per task type in play with proposals from ``propose`` (see the
    module docstring), at most ``budget`` proposals per type; returns the report (nothing is raised for a
    shortfall: :meth:`SeedingReport.warning` says what is missing and why).

    Args:
        env: a :class:`populora_env.env.PopuLoRAParallelEnv` between rounds.
        propose: answers proposer prompts (the base model in a run; a scripted policy in tests).
        target: tasks wanted per buffer (>= 1).
        budget: most proposals per task type (>= 1).
        batch: proposals per call when fewer are missing (more are asked when more are missing).
        progress: show a progress bar of the tasks still missing.
    """
    if target < 1 or budget < 1 or batch < 1:
        raise ValueError(f"target, budget and batch must be >= 1, got {target}, {budget}, {batch}")
    t_start = time.perf_counter()
    in_play = list(env.task_types)
    stages = [[t for t in (TaskType.DEDUCTION, TaskType.ABDUCTION) if t in in_play]]
    if TaskType.INDUCTION in in_play:
        stages.append([TaskType.INDUCTION])
    stats = {t.value: TypeStats() for t in in_play}
    before = {t.value: len(env.buffers[t]) for t in in_play}

    def have(t: TaskType) -> int:
        return len(env.buffers[t])

    def filled() -> int:
        return sum(min(have(t), target) for t in in_play)

    bar = tqdm(total=sum(max(0, target - n) for n in before.values()), desc="seeding", unit="task",
               disable=not progress)
    start_filled = filled()
    try:
        for stage in stages:
            while True:
                wanted = [t for t in stage if have(t) < target and stats[t.value].proposals < budget]
                if not wanted:
                    break
                for task_type in wanted:
                    s = stats[task_type.value]
                    missing = target - have(task_type)
                    if missing <= 0:
                        continue  # filled by the other type of the pool in this round
                    k = min(budget - s.proposals, max(missing, batch))
                    t0 = time.perf_counter()
                    prompts, requests = env.seed_prompts(task_type, k)
                    completions = list(propose(prompts, requests))
                    records = env.add_seed_proposals(requests, completions)
                    s.seconds += time.perf_counter() - t0
                    s.calls += 1
                    s.proposals += k
                    s.valid += sum(r["valid"] for r in records)
                    for r in records:
                        if r["reason"] is not None:
                            s.reasons[r["reason"]] = s.reasons.get(r["reason"], 0) + 1
                        for added in r["added"]:
                            if added in stats:
                                stats[added].added += 1
                    log.info("seeding %s: %d proposals, %d valid, %.1f s; buffers %s", task_type.value, k,
                             sum(r["valid"] for r in records), time.perf_counter() - t0,
                             {t.value: have(t) for t in in_play})
                    bar.update(filled() - start_filled - bar.n)
                    bar.set_postfix({t.value: f"{have(t)}/{target}" for t in in_play})
    finally:
        bar.close()
    short = {t.value: target - have(t) for t in in_play if have(t) < target}
    report = SeedingReport(target=target, budget=budget, sizes_before=before,
                           sizes_after={t.value: have(t) for t in in_play}, per_type=stats,
                           seconds=time.perf_counter() - t_start, short=short)
    for name, s in stats.items():
        log.info("seeding %s done: %d proposals, %d valid, %d added, %.1f s, buffer %d/%d", name, s.proposals,
                 s.valid, s.added, s.seconds, report.sizes_after[name], target)
    return report


def request_seed(run_seed: int, task_id: str) -> int:
    """The sampling seed of a seeding request (``base-<n>``): a 31-bit hash of (run seed, n)."""
    n = int(task_id.rsplit("-", 1)[-1]) if task_id.rsplit("-", 1)[-1].isdigit() else 0
    return int(np.random.SeedSequence([run_seed, 0x5EED, n]).generate_state(1)[0] & 0x7FFFFFFF)


def base_model_proposer(generator: Any, *, max_new_tokens: int, temperature: float, top_p: float,
                        seed: int) -> Proposer:
    """A :data:`Proposer` that asks ``generator`` for one completion per prompt from the **base model** (every
    adapter disabled: ``adapter=None``), generated as the env's request says (chat template or not, response
    prefix, stop strings)."""

    def propose(prompts: Sequence[str], requests: Sequence[Mapping[str, Any]]) -> list[str]:
        batch = [
            GenerationRequest(
                adapter=None, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                seed=request_seed(seed, str(request.get("task_id", ""))), n=1,
                chat=bool(request.get("chat_template", True)), prefix=str(request.get("prefix", "")),
                stop=tuple(request.get("stop", ())),
            )
            for prompt, request in zip(prompts, requests, strict=True)
        ]
        texts = [""] * len(batch)
        for completion in generator.generate(batch):
            texts[completion.request_index] = completion.text
        return texts

    return propose


def seeding_fingerprint(cfg: Any) -> dict[str, Any]:
    """What a seeding result depends on: model, seed, the env settings that shape tasks (all but
    :data:`ARM_FIELDS`) and the generation settings (JSON-normalised)."""
    env = {k: v for k, v in to_dict(cfg.env).items() if k not in ARM_FIELDS}
    fingerprint = {"model": cfg.model, "seed": cfg.seed, "env": env, "generation": to_dict(cfg.generation)}
    return json.loads(json.dumps(fingerprint, sort_keys=True))


def seeding_cache_path(cfg: Any, run_dir: Path) -> Path:
    """The shared cache file of ``cfg``'s fingerprint (``seeding_cache`` or ``<run_dir's parent>/.seeding``)."""
    root = getattr(cfg, "seeding_cache", None)
    root = Path(run_dir).resolve().parent / SEEDING_CACHE if root is None else Path(root)
    digest = hashlib.sha256(json.dumps(seeding_fingerprint(cfg), sort_keys=True).encode()).hexdigest()[:24]
    return root / f"{digest}.json"


def strip_seeded_programs(buffers: Any) -> int:
    """Strip comments and docstrings from the programs of the seeded tasks (ids ``base-…``) in ``buffers``;
    returns how many programs changed. The buffers are rebuilt from their state (keys recomputed)."""
    state = buffers.state_dict()
    changed = 0
    for items in state.values():
        for item in items:
            if str(item.get("task_id", "")).startswith("base-"):
                stripped = strip_comments_and_docstrings(item["program"])
                changed += stripped != item["program"]
                item["program"] = stripped
    if changed:
        buffers.load_state_dict(state)
    return changed


def seed_before_training(cfg: TrainConfig, run_dir: Path, env: Any, generator: Any, device: str
                         ) -> SeedingReport | None:
    """The seeding stage of a run that starts at step 0 (``None`` when ``cfg.env.seed_tasks`` is 0): fills
    ``env``'s buffers. Reuses ``<run_dir>/seeding.json`` when it was written by the same settings, else the shared
    cache (:func:`seeding_cache_path`), else generates with the base model.

    Args:
        cfg: the run configuration (its fingerprint decides what may be reused).
        run_dir: the run directory (``seeding.json`` is written there).
        env: a :class:`populora_env.env.PopuLoRAParallelEnv` between rounds, at its initial buffers.
        generator: the run's generator (asked with every adapter disabled).
        device: the device the generator's model runs on (its generation threads).
    """
    target = cfg.env.seed_tasks
    if target <= 0:
        return None
    path = Path(run_dir) / SEEDING_FILE
    fingerprint = seeding_fingerprint(cfg)
    saved = _read(path)
    if saved is not None and saved.get("fingerprint") == fingerprint:
        report = _reuse(env, saved, path)
    else:
        shared = seeding_cache_path(cfg, run_dir)
        shared.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(shared) + ".lock"):  # the other arm seeds once, the second one waits and reuses
            cached = _read(shared)
            if cached is not None and cached.get("fingerprint") == fingerprint:
                report = _reuse(env, cached, shared)
            else:
                report = _seed(cfg, env, generator, device)
                write_json(shared, {"fingerprint": fingerprint, "report": report.to_dict(),
                                    "buffers": env.buffers.state_dict()})
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"fingerprint": fingerprint, "report": report.to_dict(),
                          "buffers": env.buffers.state_dict()})
    message = report.warning()
    if message:
        log.warning(message)
    return report


def _reuse(env: Any, saved: Mapping[str, Any], path: Path) -> SeedingReport:
    env.buffers.load_state_dict(saved["buffers"])
    report = SeedingReport.from_dict(saved["report"])
    report.reused = True
    log.info("seeding: reused %s (buffers %s)", path, env.buffers.sizes())
    return report


def _seed(cfg: TrainConfig, env: Any, generator: Any, device: str) -> SeedingReport:
    """Run the seeding stage with the base model, then strip the seeded programs."""
    g = cfg.generation
    propose = base_model_proposer(generator, max_new_tokens=g.teacher_max_new_tokens,
                                  temperature=g.temperature, top_p=g.top_p, seed=cfg.seed)
    with generation_threads(g.threads, device):
        report = seed_buffers(env, propose, cfg.env.seed_tasks, seed_proposal_budget(cfg.env),
                              progress=cfg.progress)
    stripped = strip_seeded_programs(env.buffers)
    log.info("seeding: comments and docstrings stripped from %d program(s)", stripped)
    return report


def _read(path: Path) -> dict[str, Any] | None:
    """A saved seeding (``None`` when missing or unreadable: the stage runs again); nested beyond the run
    directory's bound is :class:`~selfplay.rundir.UnsafeRunFile`."""
    if not path.exists():
        return None
    try:
        data = read_json(path)
    except UnsafeRunFile:
        raise
    except RunFileError:
        return None
    return data if isinstance(data, dict) and {"fingerprint", "report", "buffers"} <= set(data) else None


__all__ = ["ARM_FIELDS", "SEEDING_CACHE", "SEEDING_FILE", "SeedingReport", "TypeStats", "base_model_proposer",
           "seed_before_training", "seed_buffers", "seeding_cache_path", "seeding_fingerprint",
           "strip_seeded_programs"]
