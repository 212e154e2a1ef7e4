"""Evaluate a run directory: greedy pass@1 (and avg@k) of every saved member, the base model and a baseline run.

``run_eval(EvalConfig(run_dir="runs/x", benchmarks="humaneval,gsm8k", limit=20))``:

1. checks the settings and loads every benchmark's problems first (a bad setting or a missing data file fails
   before any model is loaded);
2. loads the run's base model (``config.json["model"]``) on ``device`` and every adapter under
   ``<run>/adapters/`` into one :class:`~agents.population.LoRAPopulation`; a baseline run's adapters join the
   same population when they fit (same base, rank, alpha, target modules; their names get a ``bl-`` prefix),
   else a second population;
3. per benchmark, ONE ``generate`` call serves every entry's requests (members' adapters mixed in the batch,
   plus ``adapter=None`` rows for the base model), greedy (temperature 0), within the benchmark's token budget
   (:func:`resolve_budgets`);
4. on the sampled benchmarks (AIME 24/25 and AMC 23 by default) with ``samples_per_problem = k > 0``, a second
   call draws k answers per problem and entry (temperature ``sample_temperature``, top-p ``sample_top_p``;
   the k seeds of a problem are the same for every entry, so entries are compared on common random numbers):
   avg@k next to greedy pass@1;
5. scores answers: code in the sandbox (:class:`~evaluation.code.CodeEvaluator`), math with
   math-verify (:mod:`~evaluation.math_check`);
6. writes ``<run>/eval/results.json`` (per-benchmark records and AZR's aggregate rows, see
   :mod:`~evaluation.scores`), ``results.md``, ``generations/<benchmark>.jsonl`` and TensorBoard scalars
   ``eval/<benchmark>/<member>`` into ``<run>/``.

**Budgets** (new tokens per answer; docs/azr.md §9, §13.5). AZR evaluates code with up to 8,096 new tokens
(LiveCodeBench's setting) and math with up to 16,000. Those are the ``gpu`` profile's defaults; the ``cpu``
profile keeps 512 for both, which a 135M model on two cores can afford. The profile follows the device the
evaluation runs on (``budget_profile="auto"``). Overrides, most specific first: ``budgets``
(``"aime24=32768,humaneval+=4096"``), ``max_new_tokens_code`` / ``max_new_tokens_math``, ``max_new_tokens``
(every benchmark).

**Sampling** (avg@k): temperature 0.6 and top-p 0.95 by default, the setting of DeepSeek-R1's and AZR's
(v3) sampled evaluations; k defaults to 16 on the ``gpu`` profile and to 0 (off) on ``cpu``.
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
    canonical_name,
    load_code,
    load_math,
    parse_benchmarks,
)
from evaluation.math_check import extract_math_answer, is_equivalent
from evaluation.prompting import code_prompt, math_prompt, program_for
from evaluation.scores import aggregate_rows, summarize_benchmark, write_results

log = logging.getLogger(__name__)

BASELINE_PREFIX = "bl-"
DEFAULT_BENCHMARKS = "humaneval,humaneval+,mbpp+,gsm8k,math500,aime24,aime25,amc23,minerva,olympiadbench"
DEFAULT_SAMPLED = "aime24,aime25,amc23"
"""Benchmarks that get avg@k by default: the small competition sets, where one greedy answer per problem is a
noisy estimate (30, 30 and 40 problems)."""
BUDGET_PROFILES: dict[str, dict[str, int]] = {
    "gpu": {"code": 8096, "math": 16000},  # AZR's evaluation budgets
    "cpu": {"code": 512, "math": 512},
}
"""Default new-token budgets per profile and benchmark family (see the module docstring)."""
DEFAULT_SAMPLES = {"gpu": 16, "cpu": 0}
"""Default ``samples_per_problem`` per budget profile."""


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
    device: str = "auto"
    """Where the models run: 'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    budget_profile: str = "auto"
    """Default token budgets and sample count: 'gpu' (AZR's: code 8096, math 16000 new tokens; k = 16), 'cpu'
    (512 / 512; k = 0), or 'auto' (gpu when the device is a GPU)."""
    max_new_tokens: int | None = None
    """Budget of every benchmark (None: the profile's)."""
    max_new_tokens_code: int | None = None
    """Budget of the code benchmarks (None: max_new_tokens, else the profile's)."""
    max_new_tokens_math: int | None = None
    """Budget of the math benchmarks (None: max_new_tokens, else the profile's)."""
    budgets: str | None = None
    """Per-benchmark budgets, 'name=N,...' (e.g. 'aime24=32768'); win over every other budget setting."""
    samples_per_problem: int | None = None
    """k sampled answers per problem and entry on the sampled benchmarks, reported as avg@k next to greedy
    pass@1 (None: the profile's, 16 on gpu and 0 = off on cpu)."""
    sampled_benchmarks: str = DEFAULT_SAMPLED
    """Benchmarks that get avg@k (those not in --benchmarks are ignored)."""
    sample_temperature: float = 0.6
    """Sampling temperature of the avg@k answers."""
    sample_top_p: float = 0.95
    """Nucleus threshold of the avg@k answers."""
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
    """Seed of the sampled answers (greedy decoding does not use it)."""


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is available, else ``"cpu"``; other values as given."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_profile(cfg: EvalConfig, device: str) -> str:
    """The budget profile: ``cfg.budget_profile``, or for ``"auto"`` ``"gpu"`` on a CUDA device else ``"cpu"``."""
    if cfg.budget_profile != "auto":
        return cfg.budget_profile
    return "gpu" if device.startswith("cuda") else "cpu"


def parse_budgets(spec: str | None) -> dict[str, int]:
    """``"aime24=32768,humaneval+=4096"`` -> ``{canonical name: budget}``; a clear ValueError otherwise."""
    out: dict[str, int] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"budgets: {item.strip()!r} is not NAME=N (e.g. aime24=32768)")
        try:
            budget = int(value)
        except ValueError:
            raise ValueError(f"budgets: {value.strip()!r} for {name.strip()!r} is not an integer") from None
        if budget < 1:
            raise ValueError(f"budgets: {name.strip()} must be >= 1, got {budget}")
        out[canonical_name(name)] = budget
    return out


def resolve_budgets(cfg: EvalConfig, benchmarks: Sequence[str], profile: str) -> dict[str, int]:
    """The new-token budget of every benchmark: ``budgets`` > the family's setting > ``max_new_tokens`` > the
    profile's default (see the module docstring)."""
    explicit = parse_budgets(cfg.budgets)
    out = {}
    for bench in benchmarks:
        family = "code" if bench in CODE_BENCHMARKS else "math"
        by_family = cfg.max_new_tokens_code if family == "code" else cfg.max_new_tokens_math
        out[bench] = explicit.get(bench) or by_family or cfg.max_new_tokens or BUDGET_PROFILES[profile][family]
    return out


def resolve_samples(cfg: EvalConfig, profile: str) -> int:
    """k of avg@k: ``samples_per_problem``, else the profile's default."""
    return DEFAULT_SAMPLES[profile] if cfg.samples_per_problem is None else cfg.samples_per_problem


def check_config(cfg: EvalConfig) -> None:
    """Every setting's value (names, ranges); raise ValueError naming the setting, before any work."""
    parse_benchmarks(cfg.benchmarks)
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"limit must be >= 1, got {cfg.limit}")
    if cfg.budget_profile not in ("auto", *BUDGET_PROFILES):
        raise ValueError(f"budget_profile must be auto, gpu or cpu, got {cfg.budget_profile!r}")
    if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {cfg.device!r}")
    for name in ("max_new_tokens", "max_new_tokens_code", "max_new_tokens_math"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    parse_budgets(cfg.budgets)
    if cfg.samples_per_problem is not None and cfg.samples_per_problem < 0:
        raise ValueError(f"samples_per_problem must be >= 0, got {cfg.samples_per_problem}")
    if cfg.sampled_benchmarks.strip():
        parse_benchmarks(cfg.sampled_benchmarks)
    if not 0.0 < cfg.sample_temperature <= 100.0:
        raise ValueError(f"sample_temperature must be in (0, 100], got {cfg.sample_temperature}")
    if not 0.0 < cfg.sample_top_p <= 1.0:
        raise ValueError(f"sample_top_p must be in (0, 1], got {cfg.sample_top_p}")
    if cfg.batch_size < 1 or cfg.workers < 1:
        raise ValueError(f"batch_size and workers must be >= 1, got {cfg.batch_size}, {cfg.workers}")


def sample_seed(seed: int, bench: str, index: int) -> int:
    """The seed of problem ``index``'s k sampled answers on ``bench`` (the same for every entry)."""
    import numpy as np

    words = [seed, index, *bench.encode()]
    return int(np.random.SeedSequence(words).generate_state(1)[0] & 0x7FFFFFFF)


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
    from evolution.adapters_io import load_adapter_dir

    for d in dirs.values():  # before any model loads: a damaged file exits 2 naming it (AdapterFileError)
        load_adapter_dir(d)
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


def _load_population(model_name: str, adapters: dict[str, Path], device: str = "cpu", dtype: str | None = None):
    """Base model (on ``device``, in ``dtype``) + one population holding ``adapters`` (name -> PEFT dir);
    returns (population, tokenizer)."""
    from agents.models import load_base
    from agents.population import LoRAPopulation

    base, tokenizer = load_base(model_name, dtype=dtype)
    base.to(device)
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
    from agents.generation import HFGenerator

    t_start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    check_config(cfg)
    benchmarks = parse_benchmarks(cfg.benchmarks)  # raises for livecodebench / unknown names
    device = resolve_device(cfg.device)
    profile = resolve_profile(cfg, device)
    budgets = resolve_budgets(cfg, benchmarks, profile)
    k = resolve_samples(cfg, profile)
    sampled = [b for b in parse_benchmarks(cfg.sampled_benchmarks) if b in benchmarks] if (
        k > 0 and cfg.sampled_benchmarks.strip()) else []
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

    # on a GPU the run's own dtype (bf16 for the GPU presets); on CPU float32
    dtype = (run_cfg.get("config") or {}).get("dtype") if device.startswith("cuda") else None
    generators = []
    for model, adapter_set in zip(pop_models, pop_adapters, strict=True):
        pop, tokenizer = _load_population(model, adapter_set, device, dtype)
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
        "device": device,
        "budget_profile": profile,
        "budgets": budgets,
        "sampling": {"k": k, "temperature": cfg.sample_temperature, "top_p": cfg.sample_top_p,
                     "benchmarks": sampled} if sampled else None,
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
            budget = budgets[bench]
            prompts = [code_prompt(p) if is_code else math_prompt(p) for p in probs]  # type: ignore[arg-type]
            answers = _generate(generators, entries, prompts, budget, temperature=0.0, top_p=1.0, n=1, seeds=None)
            t_gen = time.perf_counter()
            scores, base_scores, rows = _score(bench, probs, entries, answers, evaluator)
            for row in rows:
                row["decoding"] = "greedy"
            if is_code and evaluator.gt_failures:
                failed = sorted(set(evaluator.gt_failures) & {p.task_id for p in probs})
                if failed:
                    results["failed_reference"][bench] = failed
            results["benchmarks"][bench] = _record(
                bench, len(probs), entries, scores, base_scores, cfg.baseline
            )
            seconds = {"generate": round(t_gen - t0, 2), "score": round(time.perf_counter() - t_gen, 2)}
            if bench in sampled:  # k answers per problem: one more generate call, scored the same way
                t1 = time.perf_counter()
                seeds = [sample_seed(cfg.seed, bench, i) for i in range(len(probs))]
                flat = _generate(generators, entries, prompts, budget, temperature=cfg.sample_temperature,
                                 top_p=cfg.sample_top_p, n=k, seeds=seeds)
                t2 = time.perf_counter()
                repeated = [p for p in probs for _ in range(k)]  # problem-major, as the completions come back
                avg, avg_base, sample_rows = _score(bench, repeated, entries, flat, evaluator)
                for i, row in enumerate(sample_rows):
                    row["decoding"], row["sample"] = "sampled", i % k
                rows += sample_rows
                rec = _record(bench, len(probs), entries, avg, avg_base, cfg.baseline)
                results["benchmarks"][bench]["avg@k"] = {
                    "k": k, "temperature": cfg.sample_temperature, "top_p": cfg.sample_top_p, **rec}
                seconds.update({"generate_sampled": round(t2 - t1, 2),
                                "score_sampled": round(time.perf_counter() - t2, 2)})
            results["seconds"][bench] = seconds
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
    results["aggregates"] = aggregate_rows(results["benchmarks"], cfg.baseline)
    results["seconds"]["total"] = round(time.perf_counter() - t_start, 2)
    step = cfg.step if cfg.step is not None else _latest_step(run_dir)
    results["step"] = step
    results["complete"] = True
    write_results(results, run_dir, step=step, tensorboard=cfg.tensorboard, out_dir=out_dir)
    return results


def _generate(generators: Sequence[Any], entries: Sequence[_Entry], prompts: Sequence[str], budget: int, *,
              temperature: float, top_p: float, n: int, seeds: Sequence[int] | None) -> dict[str, list[str]]:
    """Every entry's answers to ``prompts`` (``n`` per prompt, problem-major), one ``generate`` call per loaded
    population with every entry's requests (adapters mixed); keyed ``group:label``."""
    from agents.generation import GenerationRequest

    answers: dict[str, list[str]] = {}
    for gi, gen in enumerate(generators):
        mine = [e for e in entries if e.population == gi]
        if not mine:
            continue
        requests = [
            GenerationRequest(adapter=e.adapter, prompt=prompt, max_new_tokens=budget, temperature=temperature,
                              top_p=top_p, n=n, seed=None if seeds is None else seeds[i])
            for e in mine
            for i, prompt in enumerate(prompts)
        ]
        completions = gen.generate(requests)
        texts = [c.text for c in sorted(completions, key=lambda c: (c.request_index, c.sample_index))]
        if len(texts) != len(requests) * n:
            raise RuntimeError(f"the generator returned {len(texts)} answers for {len(requests)} x {n}")
        per_entry = len(prompts) * n
        for j, e in enumerate(mine):
            answers[f"{e.group}:{e.label}"] = texts[j * per_entry : (j + 1) * per_entry]
    return answers


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


__all__ = ["EvalConfig", "check_config", "parse_budgets", "resolve_budgets", "resolve_profile", "resolve_samples",
           "run_eval"]
