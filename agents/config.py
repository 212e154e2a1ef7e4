"""Run configuration: nested dataclasses, presets from ``configs/<name>.json``, validation.

Every field has a docstring: ``populora train --help`` shows them (tyro reads them). A preset is a JSON
object with the same nesting as :class:`TrainConfig`; command-line flags override it; ``--resume RUN_DIR``
starts from the run's own ``config.json``. :func:`validate` checks every value before any work starts and
raises :class:`ConfigError` naming the offending field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agents.trainer import TrainerConfig
from evolution.pbt import PBTConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
KNOWN_MODELS = ("smollm2-135m", "tiny-random")
TASK_TYPES = ("deduction", "abduction", "induction")


class ConfigError(ValueError):
    """A configuration value is invalid. ``field`` is the dotted field name (e.g. ``env.timeout_s``)."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


@dataclass
class EnvConfig:
    """The game (populora_env) settings."""

    tasks_per_teacher: int = 3
    """Proposals each teacher makes per round (task types assigned in turn)."""
    samples_per_task: int = 4
    """Attempts each matched student makes at every valid task (estimates the solve rate p̂)."""
    task_types: tuple[str, ...] = TASK_TYPES
    """Task types in play: deduction (predict the output), abduction (find an input), induction (write f)."""
    reward_scheme: str = "populora"
    """Registered reward scheme (populora_env.rewards): 'populora' (cross-evaluation), 'azr' (learnability)."""
    references_k: int = 2
    """Reference tasks from the buffer shown in each proposer prompt (AZR: 6)."""
    require_think: bool = False
    """Require a <think>…</think> block before <answer> for a completion to be well formatted."""
    timeout_s: float = 2.0
    """Sandbox wall-clock limit per program execution, seconds."""
    memory_mb: int = 512
    """Sandbox address-space limit per execution, MiB."""
    sandbox_workers: int = 2
    """Warm sandbox worker processes."""


@dataclass
class GenerationConfig:
    """Sampling settings and backend."""

    backend: Literal["hf", "vllm"] = "hf"
    """'hf': Hugging Face generate with mixed-adapter batches (CPU/GPU); 'vllm': one vLLM multi-LoRA engine."""
    teacher_max_new_tokens: int = 256
    """Generation budget of a proposal."""
    student_max_new_tokens: int = 192
    """Generation budget of a solution attempt."""
    temperature: float = 0.8
    """Sampling temperature (0 = greedy)."""
    top_p: float = 0.95
    """Nucleus sampling threshold."""
    batch_size: int = 32
    """Rows per generate call (HF backend)."""
    threads: int = 1
    """torch CPU threads during generation (HF backend; 0 = torch's default). Decoding is memory-bound: on 2
    cores one thread was as fast on a quiet machine and 5x faster on a busy one (OpenMP threads spin)."""
    vllm_gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (vLLM backend)."""
    vllm_max_model_len: int = 4096
    """Maximum sequence length of the vLLM engine (vLLM backend)."""


@dataclass
class TrainConfig:
    """A PopuLoRA self-play run (``populora train``) or the AZR baseline (``populora baseline``)."""

    preset: str = "cpu-smoke"
    """Preset from configs/<name>.json that sets the defaults; flags override it."""
    name: str | None = None
    """Run name; default: '<preset>-<kind>-s<seed>'."""
    run_dir: Path | None = None
    """Run directory; default: runs/<name>."""
    resume: Path | None = None
    """Resume the run in this directory from its last checkpoint (its config.json is used)."""
    model: str = "smollm2-135m"
    """Base model: 'smollm2-135m' (offline default), 'tiny-random', a local HF directory or .gguf file, or a hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Base model dtype."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu' or 'cuda'."""
    threads: int = 0
    """torch intra-op CPU threads for updates and everything but generation; 0 keeps torch's default (all
    cores)."""
    steps: int = 12
    """Training steps (= env rounds) in total."""
    seed: int = 0
    """Seed of everything: env RNG, adapter init, sampling seeds, evolution."""
    num_teachers: int = 2
    """Teacher adapters (population mode)."""
    num_students: int = 2
    """Student adapters (population mode)."""
    rank: int = 8
    """LoRA rank of every member."""
    alpha: int = 16
    """LoRA alpha (scaling alpha/rank)."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Modules that get LoRA adapters."""
    env: EnvConfig = field(default_factory=EnvConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pbt: PBTConfig = field(default_factory=PBTConfig)
    evolution: bool = True
    """Run the PBT replacement step (population mode only)."""
    checkpoint_every: int = 4
    """Checkpoint every N steps (and always at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (newest)."""
    log_samples: int = 2
    """Prompt/completion pairs per role logged as TensorBoard text each step."""
    progress: bool = True
    """Show a progress bar."""


# --------------------------------------------------------------------------------------------- presets


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Convert a JSON value into the annotated type ``tp`` (nested dataclasses, tuples, Paths)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected an object, got {value!r}")
        return from_dict(tp, value, prefix=path + ".")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {value!r}")
        return tuple(value)
    if tp is Path:
        return Path(value)
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (nested) dict; unknown keys raise :class:`ConfigError`."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(hints[k], v, prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict:
    """JSON-ready dict of a config (Paths as strings, tuples as lists)."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (tuple, list)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, Path):
            return str(v)
        return v

    return conv(cfg)


def list_presets() -> list[str]:
    """Names of the presets shipped in configs/."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_preset(name: str) -> TrainConfig:
    """The :class:`TrainConfig` a preset describes (unset fields keep the dataclass defaults)."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ConfigError("preset", f"unknown preset {name!r} (known: {', '.join(list_presets())})")
    data = json.loads(path.read_text())
    data.pop("_comment", None)
    data["preset"] = name
    return from_dict(TrainConfig, data)


# ------------------------------------------------------------------------------------------ validation


def _model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded here, or None."""
    if model in KNOWN_MODELS:
        return None
    looks_local = model.startswith(("/", "./", "../", "~")) or model.endswith(".gguf") or os.sep * 2 in model
    p = Path(model).expanduser()
    if p.exists():
        return None
    if looks_local or model.count("/") != 1:
        return (f"model path {model!r} does not exist (use a local HF directory, a .gguf file, "
                f"or one of {', '.join(KNOWN_MODELS)})")
    return None  # a hub id: checked by load_base (fails with a clear message when offline)


def validate(cfg: TrainConfig, kind: Literal["population", "baseline"] = "population") -> None:
    """Check every value; raise :class:`ConfigError` naming the first bad field."""

    def need(cond: bool, name: str, msg: str) -> None:
        if not cond:
            raise ConfigError(name, msg)

    need(cfg.steps >= 1, "steps", f"must be >= 1 (got {cfg.steps})")
    need(cfg.seed >= 0, "seed", f"must be >= 0 (got {cfg.seed})")
    need(cfg.threads >= 0, "threads", f"must be >= 0 (got {cfg.threads})")
    problem = _model_problem(cfg.model)
    need(problem is None, "model", problem or "")
    need(cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"), "device",
         f"must be auto, cpu or cuda[:N] (got {cfg.device!r})")
    if kind == "population":
        need(cfg.num_teachers >= 1, "num_teachers", f"must be >= 1 (got {cfg.num_teachers})")
        need(cfg.num_students >= 1, "num_students", f"must be >= 1 (got {cfg.num_students})")
    need(cfg.rank >= 1, "rank", f"must be >= 1 (got {cfg.rank})")
    need(cfg.alpha > 0, "alpha", f"must be > 0 (got {cfg.alpha})")
    need(len(cfg.target_modules) > 0, "target_modules", "must name at least one module")
    e = cfg.env
    need(e.tasks_per_teacher >= 1, "env.tasks_per_teacher", f"must be >= 1 (got {e.tasks_per_teacher})")
    need(e.samples_per_task >= 1, "env.samples_per_task", f"must be >= 1 (got {e.samples_per_task})")
    need(len(e.task_types) > 0, "env.task_types", "must name at least one task type")
    for t in e.task_types:
        need(t in TASK_TYPES, "env.task_types", f"unknown task type {t!r} (known: {', '.join(TASK_TYPES)})")
    from populora_env.rewards import list_reward_schemes

    need(e.reward_scheme in list_reward_schemes(), "env.reward_scheme",
         f"unknown reward scheme {e.reward_scheme!r} (known: {', '.join(list_reward_schemes())})")
    need(e.references_k >= 0, "env.references_k", f"must be >= 0 (got {e.references_k})")
    need(e.timeout_s > 0, "env.timeout_s", f"must be > 0 (got {e.timeout_s})")
    need(e.memory_mb >= 64, "env.memory_mb", f"must be >= 64 (got {e.memory_mb})")
    need(e.sandbox_workers >= 1, "env.sandbox_workers", f"must be >= 1 (got {e.sandbox_workers})")
    g = cfg.generation
    need(g.backend in ("hf", "vllm"), "generation.backend", f"must be hf or vllm (got {g.backend!r})")
    need(g.teacher_max_new_tokens >= 1, "generation.teacher_max_new_tokens", "must be >= 1")
    need(g.student_max_new_tokens >= 1, "generation.student_max_new_tokens", "must be >= 1")
    need(g.temperature >= 0, "generation.temperature", f"must be >= 0 (got {g.temperature})")
    need(0 < g.top_p <= 1, "generation.top_p", f"must be in (0, 1] (got {g.top_p})")
    need(g.batch_size >= 1, "generation.batch_size", f"must be >= 1 (got {g.batch_size})")
    need(g.threads >= 0, "generation.threads", f"must be >= 0 (got {g.threads})")
    t = cfg.trainer
    from agents.advantages import list_advantages

    need(t.advantage in list_advantages(), "trainer.advantage",
         f"unknown advantage estimator {t.advantage!r} (known: {', '.join(list_advantages())})")
    need(t.lr > 0, "trainer.lr", f"must be > 0 (got {t.lr})")
    need(cfg.checkpoint_every >= 1, "checkpoint_every", f"must be >= 1 (got {cfg.checkpoint_every})")
    need(cfg.log_samples >= 0, "log_samples", f"must be >= 0 (got {cfg.log_samples})")
