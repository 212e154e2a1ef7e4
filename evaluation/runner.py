"""Evaluate a run directory: greedy pass@1 of every saved member, the base model and a baseline run.

``run_eval(EvalConfig(run_dir="runs/x", benchmarks="humaneval,gsm8k", limit=20))``:

1. loads every benchmark's problems first (a missing data file fails before any model is loaded);
2. loads the run's base model (``config.json["model"]``) and every adapter under ``<run>/adapters/`` into one
   :class:`~agents.population.LoRAPopulation`; a baseline run's adapters join the same population when they
   fit (same base, rank, alpha, target modules; their names get a ``bl-`` prefix), else a second population;
3. per benchmark, ONE ``generate`` call serves every entry's requests (members' adapters mixed in the batch,
   plus ``adapter=None`` rows for the base model), greedy (temperature 0);
4. scores answers: code in the sandbox (:class:`~evaluation.code.CodeEvaluator`), math with
   math-verify (:mod:`~evaluation.math_check`);
5. writes ``<run>/eval/results.json``, ``results.md``, ``generations/<benchmark>.jsonl`` and TensorBoard
   scalars ``eval/<benchmark>/<member>`` into ``<run>/`` (:mod:`~evaluation.scores`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evaluation.code import CodeEvaluator
from evaluation.data import (
    CODE_BENCHMARKS,
    CodeProblem,
    MathProblem,
    load_code,
    load_math,
    parse_benchmarks,
)
from evaluation.math_check import extract_math_answer, is_equivalent
from evaluation.prompting import code_prompt, math_prompt, program_for
from evaluation.scores import summarize_benchmark, write_results

log = logging.getLogger(__name__)

BASELINE_PREFIX = "bl-"
DEFAULT_BENCHMARKS = "humaneval,humaneval+,mbpp+,gsm8k,math500,aime24,aime25,amc23,minerva,olympiadbench"


@dataclass
class EvalConfig:
    """Configuration of ``populora eval`` (run-directory evaluation)."""

    run_dir: str
    """Run directory to evaluate (``runs/<name>``): its ``config.json`` names the base model, and every PEFT
    adapter under ``adapters/<member>/`` is evaluated."""
    baseline: str | None = None
    """Another run directory (e.g. the single-agent AZR baseline) whose adapters are evaluated alongside."""
    benchmarks: str = DEFAULT_BENCHMARKS
    """Comma-separated benchmarks: humaneval, humaneval+, mbpp+, gsm8k, math500, aime24, aime25, amc23,
    minerva, olympiadbench (livecodebench has no offline source and is refused)."""
    limit: int | None = None
    """Evaluate only the first N problems of each benchmark (None: all)."""
    data_dir: str | None = None
    """Directory of the benchmark files (default: $POPULORA_EVALDATA, else evaluation/evaldata)."""
    members: str | None = None
    """Comma-separated subset of the run's members to evaluate (None: every adapter under adapters/)."""
    include_base: bool = True
    """Also evaluate the base model (adapters disabled)."""
    model: str | None = None
    """Base model override (name or local path); default: the run's config.json "model"."""
    max_new_tokens: int = 512
    """Generation budget per answer (code and math alike)."""
    max_new_tokens_math: int | None = None
    """Separate budget for math benchmarks (None: max_new_tokens)."""
    batch_size: int = 16
    """Rows per forward of the HF generator (all members' requests still go in one generate call)."""
    workers: int = 2
    """Sandbox worker processes for the code checks."""
    out_dir: str | None = None
    """Where results.json / results.md / generations go (default: <run_dir>/eval)."""
    tensorboard: bool = True
    """Write eval/<benchmark>/<member> scalars into the run directory's TensorBoard events."""
    step: int | None = None
    """TensorBoard global step of the scalars (default: the run's latest checkpoints/step_<n>, else 0)."""
    save_generations: bool = True
    """Write every answer with its outcome to <out_dir>/generations/<benchmark>.jsonl."""
    gt_cache_dir: str | None = None
    """Cache directory of HumanEval+/MBPP+ ground truths (default: ~/.cache/populora/evalplus_gt)."""
    seed: int = 0
    """Generator seed (greedy decoding does not use it)."""


@dataclass
class _Entry:
    """One evaluated policy: a run member, the base model, or a baseline member."""

    label: str  # key in the results (member name, "base", or baseline member name)
    adapter: str | None  # adapter name inside its population (None = base model)
    group: str  # "member" | "base" | "baseline"
    population: int  # index into the loaded populations


def _latest_step(run_dir: Path) -> int:
    steps = [
        int(m.group(1))
        for p in (run_dir / "checkpoints").glob("step_*")
        if (m := re.fullmatch(r"step_(\d+)", p.name))
    ]
    return max(steps, default=0)


def _adapter_dirs(run_dir: Path) -> dict[str, Path]:
    root = run_dir / "adapters"
    if not root.is_dir():
        raise FileNotFoundError(f"{root} not found: {run_dir} has no saved adapters (is it a finished run?)")
    dirs = {p.name: p for p in sorted(root.iterdir()) if (p / "adapter_config.json").is_file()}
    if not dirs:
        raise FileNotFoundError(f"no PEFT adapter (adapter_config.json) under {root}")
    return dirs


def _run_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    return json.loads(path.read_text())


def _lora_config(adapter_dir: Path) -> tuple[int, float, tuple[str, ...]]:
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    targets = cfg.get("target_modules") or ()
    return (
        int(cfg["r"]),
        float(cfg["lora_alpha"]),
        tuple(sorted([targets] if isinstance(targets, str) else targets)),
    )


def _load_population(model_name: str, adapters: dict[str, Path]):
    """Base model + one population holding ``adapters`` (name -> PEFT dir); returns (population, tokenizer)."""
    from agents.models import load_base
    from agents.population import LoRAPopulation

    base, tokenizer = load_base(model_name)
    first = next(iter(adapters.values()))
    rank, alpha, targets = _lora_config(first)
    pop = LoRAPopulation(base, list(adapters), rank=rank, alpha=alpha, target_modules=targets)
    for name, path in adapters.items():
        pop.load(path, name)
    return pop, tokenizer


def _problems(bench: str, cfg: EvalConfig) -> list[CodeProblem] | list[MathProblem]:
    if bench in CODE_BENCHMARKS:
        return load_code(bench, cfg.data_dir, cfg.limit)
    return load_math(bench, cfg.data_dir, cfg.limit)


def _mean(xs: Sequence[bool]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Evaluate ``cfg.run_dir`` (see the module docstring); returns the results dict also written to
    ``<out_dir>/results.json``."""
    from agents.generation import GenerationRequest, HFGenerator

    t_start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    benchmarks = parse_benchmarks(cfg.benchmarks)  # raises for livecodebench / unknown names
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"limit must be >= 1, got {cfg.limit}")
    run_cfg = _run_config(run_dir)
    model_name = cfg.model or run_cfg.get("model")
    if not model_name:
        raise ValueError(f'{run_dir / "config.json"} names no "model"; pass --model')
    adapters = _adapter_dirs(run_dir)
    if cfg.members:
        wanted = [m.strip() for m in cfg.members.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in adapters]
        if unknown:
            raise ValueError(
                f"members {unknown} not found under {run_dir / 'adapters'} (have {list(adapters)})"
            )
        adapters = {m: adapters[m] for m in wanted}
    problems = {b: _problems(b, cfg) for b in benchmarks}  # fail fast on missing data

    baseline_adapters: dict[str, Path] = {}
    baseline_model = None
    if cfg.baseline:
        bl_dir = Path(cfg.baseline)
        baseline_model = cfg.model or _run_config(bl_dir).get("model")
        baseline_adapters = _adapter_dirs(bl_dir)

    # populations: the run's members (+ baseline members when they fit) in one, else two
    entries: list[_Entry] = [_Entry(m, m, "member", 0) for m in adapters]
    pop_adapters: list[dict[str, Path]] = [dict(adapters)]
    pop_models = [model_name]
    if baseline_adapters:
        fits = baseline_model == model_name and {_lora_config(p) for p in baseline_adapters.values()} == {
            _lora_config(p) for p in adapters.values()
        }
        if fits:
            for name, path in baseline_adapters.items():
                internal = BASELINE_PREFIX + name
                if internal in pop_adapters[0]:
                    raise ValueError(f"baseline member name {internal!r} collides with a run member")
                pop_adapters[0][internal] = path
                entries.append(_Entry(name, internal, "baseline", 0))
        else:
            log.info("baseline adapters do not fit the run's population; loading a second base model")
            pop_adapters.append(dict(baseline_adapters))
            pop_models.append(baseline_model)
            entries += [_Entry(name, name, "baseline", 1) for name in baseline_adapters]
    if cfg.include_base:
        entries.append(_Entry("base", None, "base", 0))

    generators = []
    for model, adapter_set in zip(pop_models, pop_adapters, strict=True):
        pop, tokenizer = _load_population(model, adapter_set)
        generators.append(HFGenerator(pop, tokenizer, batch_size=cfg.batch_size, seed=cfg.seed))
    t_loaded = time.perf_counter()

    out_dir = Path(cfg.out_dir) if cfg.out_dir else run_dir / "eval"
    results: dict[str, Any] = {
        "run": str(run_dir),
        "model": model_name,
        "baseline_run": cfg.baseline,
        "members": list(adapters),
        "baseline_members": list(baseline_adapters),
        "limit": cfg.limit,
        "decoding": "greedy",
        "max_new_tokens": cfg.max_new_tokens,
        "max_new_tokens_math": cfg.max_new_tokens_math or cfg.max_new_tokens,
        "config": asdict(cfg),
        "benchmarks": {},
        "failed_reference": {},
        "seconds": {"load": round(t_loaded - t_start, 2)},
    }
    evaluator = CodeEvaluator(workers=cfg.workers, cache_dir=cfg.gt_cache_dir)
    with evaluator:
        for bench in benchmarks:
            t0 = time.perf_counter()
            probs = problems[bench]
            is_code = bench in CODE_BENCHMARKS
            budget = cfg.max_new_tokens if is_code else (cfg.max_new_tokens_math or cfg.max_new_tokens)
            prompts = [code_prompt(p) if is_code else math_prompt(p) for p in probs]  # type: ignore[arg-type]
            answers: dict[str, list[str]] = {}
            for gi, gen in enumerate(generators):
                mine = [e for e in entries if e.population == gi]
                if not mine:
                    continue
                requests = [
                    GenerationRequest(
                        adapter=e.adapter, prompt=prompt, max_new_tokens=budget, temperature=0.0
                    )
                    for e in mine
                    for prompt in prompts
                ]
                completions = gen.generate(requests)  # one call: every entry's requests, adapters mixed
                texts = [c.text for c in sorted(completions, key=lambda c: (c.request_index, c.sample_index))]
                for k, e in enumerate(mine):
                    answers[f"{e.group}:{e.label}"] = texts[k * len(probs) : (k + 1) * len(probs)]
            t_gen = time.perf_counter()
            scores, base_scores, rows = _score(bench, probs, entries, answers, evaluator)
            if is_code and evaluator.gt_failures:
                failed = sorted(set(evaluator.gt_failures) & {p.task_id for p in probs})
                if failed:
                    results["failed_reference"][bench] = failed
            results["benchmarks"][bench] = _record(
                bench, len(probs), entries, scores, base_scores, cfg.baseline
            )
            results["seconds"][bench] = {
                "generate": round(t_gen - t0, 2),
                "score": round(time.perf_counter() - t_gen, 2),
            }
            if cfg.save_generations:
                gen_dir = out_dir / "generations"
                gen_dir.mkdir(parents=True, exist_ok=True)
                with (gen_dir / f"{bench}.jsonl").open("w", encoding="utf-8") as fh:
                    for row in rows:
                        fh.write(json.dumps(row) + "\n")
            log.info("eval %s: %s", bench, {k: round(v, 3) for k, v in scores.items()})
            # partial results after every benchmark, so a long evaluation that is stopped keeps what it has
            write_results({**results, "complete": False}, run_dir, tensorboard=False, out_dir=out_dir)
    if not results["failed_reference"]:
        del results["failed_reference"]
    results["seconds"]["total"] = round(time.perf_counter() - t_start, 2)
    step = cfg.step if cfg.step is not None else _latest_step(run_dir)
    results["step"] = step
    results["complete"] = True
    write_results(results, run_dir, step=step, tensorboard=cfg.tensorboard, out_dir=out_dir)
    return results


def _score(
    bench: str,
    probs: Sequence[CodeProblem] | Sequence[MathProblem],
    entries: Sequence[_Entry],
    answers: dict[str, list[str]],
    evaluator: CodeEvaluator,
) -> tuple[dict[str, float], dict[str, float], list[dict[str, Any]]]:
    """pass@1 per entry key (``group:label``), evalplus base-test pass@1 (code+ sets), and per-answer rows."""
    scores: dict[str, float] = {}
    base_scores: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    keys = [f"{e.group}:{e.label}" for e in entries]
    if bench in CODE_BENCHMARKS:
        flat_probs = [p for _ in keys for p in probs]
        programs = [program_for(p, a, "answer") for k in keys for p, a in zip(probs, answers[k], strict=True)]
        results = evaluator.evaluate(flat_probs, programs)  # one sandbox batch for every entry
        for i, key in enumerate(keys):
            chunk = results[i * len(probs) : (i + 1) * len(probs)]
            scores[key] = _mean([r.passed for r in chunk])
            base_scores[key] = _mean([r.base_passed for r in chunk])
            for p, a, r in zip(probs, answers[key], chunk, strict=True):
                rows.append(
                    {
                        "entry": key,
                        "task_id": p.task_id,
                        "answer": a,
                        "passed": r.passed,
                        "base_passed": r.base_passed,
                        "result": r.reason,
                    }
                )
    else:
        for key in keys:
            ok = []
            for p, a in zip(probs, answers[key], strict=True):
                extracted = extract_math_answer(a, p.benchmark)  # type: ignore[union-attr]
                correct = is_equivalent(p.answers, extracted, p.unit)  # type: ignore[union-attr]
                ok.append(correct)
                rows.append(
                    {
                        "entry": key,
                        "task_id": p.task_id,
                        "answer": a,
                        "extracted": extracted,
                        "gold": p.answers,
                        "passed": correct,
                    }
                )  # type: ignore[union-attr]
            scores[key] = _mean(ok)
    return scores, base_scores, rows


def _record(
    bench: str,
    n: int,
    entries: Sequence[_Entry],
    scores: dict[str, float],
    base_scores: dict[str, float],
    baseline_run: str | None,
) -> dict[str, Any]:
    def split(s: dict[str, float]) -> tuple[dict[str, float], float | None, dict[str, float]]:
        members = {e.label: s[f"member:{e.label}"] for e in entries if e.group == "member"}
        base = next((s[f"base:{e.label}"] for e in entries if e.group == "base"), None)
        baseline = {e.label: s[f"baseline:{e.label}"] for e in entries if e.group == "baseline"}
        return members, base, baseline

    rec = summarize_benchmark(n, *split(scores), baseline_run=baseline_run)
    if bench in ("humaneval+", "mbpp+"):
        rec["base_pass@1"] = summarize_benchmark(n, *split(base_scores), baseline_run=baseline_run)
    return rec


__all__ = ["EvalConfig", "run_eval"]
