"""Run configuration: nested dataclasses, presets, validation.

A run is described by :class:`TrainConfig`. Its ``env`` section *is* the env's own
:class:`populora_env.config.EnvConfig` (same fields, same defaults, same validation), so everything the game
can be told is settable from a preset or a flag (``--env.induction-inputs 10``) and the env is built from that
section as is. The other sections are the learner's own configs (:class:`agents.trainer.TrainerConfig`,
:class:`evolution.pbt.PBTConfig`) and the generation settings below.

Every field has a docstring: ``populora train --help`` shows them. A preset is a JSON object with the same
nesting as :class:`TrainConfig` (a shipped name, see :func:`list_presets`, or a path to a ``.json`` file);
command-line flags override it; ``--resume RUN_DIR`` starts from the run's own ``config.json``.
:func:`validate` checks every value before any work starts and raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from agents.trainer import TrainerConfig
from evolution.pbt import PBTConfig
from populora_env.config import ConfigError, EnvConfig, check, check_int, check_number
from selfplay.distributed.config import RayConfig, validate_ray

__all__ = [
    "ConfigError",
    "EnvConfig",
    "GenerationConfig",
    "KNOWN_MODELS",
    "RayConfig",
    "TrainConfig",
    "from_dict",
    "list_presets",
    "load_preset",
    "preset_path",
    "to_dict",
    "validate",
]

KNOWN_MODELS = ("smollm2-135m", "tiny-random")
PRESETS_PACKAGE = "selfplay.presets"  # the repository's configs/ directory, shipped as package data


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
    """torch CPU threads during generation (HF backend; 0 = torch's default). Decoding is memory-bound; the
    populora command sets OMP_WAIT_POLICY=PASSIVE so that idle OpenMP threads sleep instead of spinning. On a
    shared 2-core machine two threads were not faster than one (benchmarks/generation.py --throughput)."""
    vllm_gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (vLLM backend)."""
    vllm_max_model_len: int = 4096
    """Maximum sequence length of the vLLM engine (vLLM backend)."""


@dataclass
class TrainConfig:
    """A PopuLoRA self-play run (``populora train``) or the AZR baseline (``populora baseline``)."""

    preset: str = "cpu-smoke"
    """Preset that sets the defaults: a shipped name (see the list above) or a path to a JSON file."""
    plugins: tuple[str, ...] = ()
    """Python modules (importable names or .py paths) imported before the config is checked, so that the reward
    schemes, advantage estimators, operators or prompt sets they register can be named here."""
    name: str | None = None
    """Run name; default: '<preset>-<arm>-s<seed>'."""
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
    """Run the PBT replacement step (needs at least two members in a role)."""
    checkpoint_every: int = 4
    """Checkpoint every N steps (and always at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (newest)."""
    log_samples: int = 2
    """Prompt/completion pairs per role logged as TensorBoard text each step."""
    progress: bool = True
    """Show a progress bar."""
    backend: Literal["local", "ray"] = "local"
    """'local': every part in this process; 'ray': trainer shards, generation engines and sandboxes as Ray actors
    (the `ray` section; pip install '.[ray]'). The loop, env, ratings, PBT and logging stay in this process."""
    ray: RayConfig = field(default_factory=RayConfig)


# ----------------------------------------------------------------------------------- dict <-> config


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
        if not isinstance(value, list | tuple):
            raise ConfigError(path, f"expected a list, got {value!r}")
        return tuple(value)
    if origin is dict and not isinstance(value, dict):
        raise ConfigError(path, f"expected an object, got {value!r}")
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
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a config class that checks itself on construction
        raise ConfigError(prefix.rstrip(".") or cls.__name__, str(exc)) from None


def to_dict(cfg: Any) -> dict:
    """JSON-ready dict of a config (Paths as strings, tuples as lists)."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, Path):
            return str(v)
        return v

    return conv(cfg)


# --------------------------------------------------------------------------------------------- presets


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.name[:-5] for p in resources.files(PRESETS_PACKAGE).iterdir() if p.name.endswith(".json"))


def preset_path(preset: str) -> Path | None:
    """The JSON file a preset argument names: an existing path (or anything ending in ``.json``), else a shipped
    preset of that name; ``None`` if it is neither."""
    looks_like_path = preset.endswith(".json") or os.sep in preset or "/" in preset
    p = Path(preset).expanduser()
    if looks_like_path or p.is_file():
        return p if p.is_file() else None
    shipped = resources.files(PRESETS_PACKAGE) / f"{preset}.json"
    return Path(str(shipped)) if shipped.is_file() else None


def load_preset(preset: str) -> TrainConfig:
    """The :class:`TrainConfig` a preset describes (unset fields keep the dataclass defaults)."""
    path = preset_path(preset)
    if path is None:
        what = "preset file" if preset.endswith(".json") or "/" in preset else "preset"
        raise ConfigError("preset", f"{what} {preset!r} not found (shipped presets: {', '.join(list_presets())}; "
                                    "or give a path to a .json file)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("preset", f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("preset", f"{path} must hold a JSON object")
    data = {k: v for k, v in data.items() if not k.startswith("_")}  # "_comment" and the like
    data["preset"] = preset
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


def _registered(name: str, value: str, names: list[str], kind: str) -> None:
    check(value in names, name, f"unknown {kind} {value!r} (known: {', '.join(names)})")


def validate(cfg: TrainConfig) -> None:
    """Check every value; raise :class:`ConfigError` naming the first bad field (``env.*`` by the env's own
    rules). Plugins must already be imported (their registered names are looked up here)."""
    check_int("steps", cfg.steps, 1)
    check_int("seed", cfg.seed, 0)
    check_int("threads", cfg.threads, 0, 4096)
    problem = _model_problem(cfg.model)
    check(problem is None, "model", problem or "")
    check(cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"), "device",
          f"must be auto, cpu or cuda[:N] (got {cfg.device!r})")
    check_int("rank", cfg.rank, 1, 4096)
    check_number("alpha", cfg.alpha, low=0.0, high=1e6, low_open=True)
    check(len(cfg.target_modules) > 0, "target_modules", "must name at least one module")
    try:
        cfg.env.validate()
    except ConfigError as exc:
        raise exc.prefixed("env.") from None
    g = cfg.generation
    check(g.backend in ("hf", "vllm"), "generation.backend", f"must be hf or vllm (got {g.backend!r})")
    check_int("generation.teacher_max_new_tokens", g.teacher_max_new_tokens, 1, 1 << 20)
    check_int("generation.student_max_new_tokens", g.student_max_new_tokens, 1, 1 << 20)
    check_number("generation.temperature", g.temperature, low=0.0, high=100.0)
    check_number("generation.top_p", g.top_p, low=0.0, high=1.0, low_open=True)
    check_int("generation.batch_size", g.batch_size, 1, 1 << 20)
    check_int("generation.threads", g.threads, 0, 4096)
    check_number("generation.vllm_gpu_memory_utilization", g.vllm_gpu_memory_utilization, low=0.0, high=1.0,
                 low_open=True)
    check_int("generation.vllm_max_model_len", g.vllm_max_model_len, 16, 1 << 24)
    t = cfg.trainer
    from agents.advantages import list_advantages
    from agents.losses import list_loss_aggs

    _registered("trainer.advantage", t.advantage, list_advantages(), "advantage estimator")
    _registered("trainer.loss_agg_mode", t.loss_agg_mode, list_loss_aggs(), "loss aggregation mode")
    check_number("trainer.lr", t.lr, low=0.0, high=1.0, low_open=True)
    if cfg.evolution:  # the controller checks its own config (operators known, probabilities, interval, γ)
        from evolution.pbt import PBTController

        try:
            PBTController(cfg.pbt, None)
        except (ValueError, KeyError) as exc:
            message = str(exc).strip("'\"")
            head = message.split()[0] if message.startswith("pbt.") else "pbt.operators"
            raise ConfigError(head, message.removeprefix(head).strip()) from None
    check_int("checkpoint_every", cfg.checkpoint_every, 1)
    check_int("keep_checkpoints", cfg.keep_checkpoints, 0)
    check_int("log_samples", cfg.log_samples, 0)
    validate_ray(cfg.ray, cfg.backend, cfg.env.num_teachers + cfg.env.num_students)
