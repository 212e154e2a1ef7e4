"""Run configuration: nested dataclasses, presets, validation.

A run is described by :class:`TrainConfig`. Its ``env`` section *is* the env's own
:class:`populora_env.config.EnvConfig` (same fields, same defaults, same validation), so everything the game
can be told is settable from a preset or a flag (``--env.induction-inputs 10``) and the env is built from that
section as is. The other sections are the learner's own configs (:class:`agents.trainer_config.TrainerConfig`,
:class:`evolution.pbt_config.PBTConfig`: torch-free modules, so parsing a command line imports no torch) and the
generation settings below.

Every field has a docstring: ``populora train --help`` shows them. A preset is a JSON object with the same
nesting as :class:`TrainConfig` (a shipped name, see :func:`list_presets`, or a path to a ``.json`` file);
command-line flags override it; ``--resume RUN_DIR`` starts from the run's own ``config.json``.
:meth:`TrainConfig.validate` checks every value before any work starts and raises :class:`ConfigError` naming the
dotted field; each section checks its own fields (``validate()``, built from the ``check_*`` helpers of
:mod:`populora_env.checks`) and the run config adds the section's prefix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import numbers
import os
import re
import types
import typing
from dataclasses import InitVar, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from agents.model_names import HF_CONFIG, RANDOM_PREFIX, random_shapes
from agents.trainer_config import TrainerConfig
from evolution.pbt_config import PBTConfig
from populora_env.checks import check_bool, check_choice, check_section, renamed
from populora_env.config import ConfigError, EnvConfig, check, check_int, check_number
from selfplay.distributed.config import RAY_INSTALL_HINT, RayConfig, ray_installed
from selfplay.rundir import RunFileError, parse_json
from selfplay.scripted import ScriptedConfig

__all__ = [
    "ConfigError",
    "EnvConfig",
    "GenerationConfig",
    "KNOWN_MODELS",
    "PipelineConfig",
    "RayConfig",
    "TrainConfig",
    "from_dict",
    "list_presets",
    "load_preset",
    "preset_path",
    "read_config_json",
    "to_dict",
]

KNOWN_MODELS = ("smollm2-135m", "tiny-random")
VLLM_ADAPTERS = "vllm-adapters"
"""The run directory's folder for vLLM's adapter versions when /dev/shm lacks the room
(``GenerationConfig.vllm_adapter_dir``)."""
PRESETS_PACKAGE = "selfplay.presets"  # the repository's configs/ directory, shipped as package data


@dataclass
class GenerationConfig:
    """Sampling settings and the generation engine."""

    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: 'hf' (this project's Hugging Face generator, mixed-adapter batches, CPU/GPU) or 'vllm'
    (one vLLM multi-LoRA engine, GPU)."""
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
    threads: int = 2
    """torch CPU threads during generation (HF backend; 0 = torch's default, every core). The populora command
    sets OMP_WAIT_POLICY=PASSIVE so that idle OpenMP threads sleep instead of spinning. Measured on 2 cores
    (benchmarks/generation.py --throughput, 8 rows): quiet, 2 threads took prefill 0.58x and the decode step
    0.83x of 1 thread's; with one core kept busy, 1.18x and 1.34x (set 1 on a shared machine). A fixed count
    rather than every core: log-probs differ in the last bits between thread counts, so the same count gives
    the same values on machines with more cores."""
    hf_engine: Literal["loop", "generate"] = "loop"
    """HF backend: 'loop' (the backend's own loop: each unique prompt prefilled once, finished rows leave the
    batch; agents.generation.decode) or 'generate' (one Hugging Face generate call per batch, the previous path).
    Same greedy tokens; the loop reorders some float sums, so a sampled token can differ."""
    fused_decode: bool = True
    """HF backend, 'loop' engine, CPU, float32 Llama/Qwen2 models: decode steps through agents.generation.fused (stacked,
    transposed projections, LoRA per row, attention of one query by two matmuls) instead of Hugging Face's
    forward; false = HF's forward (logits within 1e-4, greedy tokens equal; a sampled token can differ)."""
    vllm_gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (vLLM backend)."""
    vllm_max_model_len: int = 4096
    """Maximum sequence length of the vLLM engine (vLLM backend)."""
    vllm_adapter_dir: str | None = None
    """Where the vLLM backend writes each member's adapter versions (its free space is checked before the first
    write). None: /dev/shm when it has room for them, else the run directory's vllm-adapters/."""
    max_prompt_tokens: int | None = None
    """AZR's prompt-length rule: a prompt longer than this many tokens is dropped before generation (never sent
    to the engine), counted per role, answered with an empty completion (a format error in the game) and not
    trained on (agents.generation.limit; docs/azr.md §14). None: no limit (the CPU presets); GPU presets: 6144."""
    backend: InitVar[Literal["hf", "vllm"] | None] = None
    """Deprecated spelling of --generation.engine (accepted, with a warning, for one release)."""

    def __post_init__(self, backend: str | None) -> None:
        if backend is not None:
            self.engine = renamed("--generation.backend (generation.backend)",  # type: ignore[assignment]
                                  "--generation.engine (generation.engine)", backend)

    def generator_kwargs(self, model: str, run_dir: Path | None = None) -> dict[str, Any]:
        """The keyword arguments of ``agents.generation.make_generator`` for this engine (the generator is built by
        :func:`selfplay.members.build_members`, locally and in the Ray engines); ``model``: the run's model;
        ``run_dir``: the run directory (vLLM's adapters fall back to its ``vllm-adapters/``)."""
        limit = {} if self.max_prompt_tokens is None else {"max_prompt_tokens": self.max_prompt_tokens}
        if self.engine == "hf":
            return {"batch_size": self.batch_size, "engine": self.hf_engine, "fused_decode": self.fused_decode} | limit
        return {"model_path": model, "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
                "max_model_len": self.vllm_max_model_len, "adapter_dir": self.vllm_adapter_dir,
                "fallback_dir": None if run_dir is None else Path(run_dir) / VLLM_ADAPTERS} | limit

    def validate(self) -> None:
        """Check every setting; raise :class:`ConfigError` naming the first bad field."""
        check_choice("engine", self.engine, ("hf", "vllm"))
        check_choice("hf_engine", self.hf_engine, ("generate", "loop"))
        check_int("teacher_max_new_tokens", self.teacher_max_new_tokens, 1, 1 << 20)
        check_int("student_max_new_tokens", self.student_max_new_tokens, 1, 1 << 20)
        check_number("temperature", self.temperature, low=0.0, high=100.0)
        check_number("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        check_int("batch_size", self.batch_size, 1, 1 << 20)
        check_int("threads", self.threads, 0, 4096)
        check_bool("fused_decode", self.fused_decode)
        check_number("vllm_gpu_memory_utilization", self.vllm_gpu_memory_utilization, low=0.0, high=1.0,
                     low_open=True)
        check_int("vllm_max_model_len", self.vllm_max_model_len, 16, 1 << 24)
        if self.max_prompt_tokens is not None:
            check_int("max_prompt_tokens", self.max_prompt_tokens, 1, 1 << 24)
            check(self.engine != "vllm" or self.max_prompt_tokens < self.vllm_max_model_len, "max_prompt_tokens",
                  f"{self.max_prompt_tokens} leaves no room to generate within vllm_max_model_len "
                  f"{self.vllm_max_model_len}")
        if self.vllm_adapter_dir is not None:
            check(bool(str(self.vllm_adapter_dir).strip()), "vllm_adapter_dir", "must be a directory path")


PIPELINE_LAYOUTS = ("process", "thread")


@dataclass
class PipelineConfig:
    """Overlap of generation and training (docs/usage.md, "Asynchronous steps")."""

    max_staleness: int = 0
    """0: the synchronous loop (a round is generated with the weights of every update before it). k >= 1: round
    t+1 is generated while round t's updates run, each member acting with its adapter as it was after step
    t-k (at most k updates old); the updates score those rollouts against the log-probs they were sampled with
    (a PPO-style clipped ratio). Which version a round uses is fixed by this schedule, never by timing."""
    layout: Literal["process", "thread"] = "process"
    """Where the generating side of a local asynchronous HF run runs: 'process' (a child process with its own
    copy of the base model, built by selfplay.members like a Ray engine) or 'thread' (a second copy of the base
    in this process, generating in the main thread while a worker thread updates; torch's thread count is one
    for the whole process, so --threads and --generation.threads must be equal). Ray runs overlap their actors;
    a local vLLM run serves the versions from its one engine."""

    def validate(self) -> None:
        """Check every setting; raise :class:`ConfigError` naming the first bad field."""
        check_int("max_staleness", self.max_staleness, 0, 1 << 10)
        check_choice("layout", self.layout, PIPELINE_LAYOUTS)


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
    tamper_samples: int = 5
    """Completions per member whose run tripped a sandbox defence (reason 'tamper') saved, the first ones, with
    their step and class, to tamper_samples.jsonl (data, never run; 0: none)."""
    progress: bool = True
    """Show a progress bar."""
    seeding_cache: Path | None = None
    """Directory of the shared seeding results (env.seed_tasks > 0): one file per fingerprint (model, seed, the
    env settings that shape tasks, generation), reused by every run with that fingerprint, so both arms of one
    seed start from the same buffers; default: '.seeding' next to the run directory (selfplay.seeding)."""
    backend: Literal["local", "ray"] = "local"
    """Run backend: 'local' (every part in this process) or 'ray' (trainer shards, generation engines and
    sandboxes as Ray actors: the `ray` section; pip install '.[ray]'). The loop, env, ratings, PBT and logging
    stay in this process. (Which engine generates is generation.engine.)"""
    ray: RayConfig = field(default_factory=RayConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    scripted: ScriptedConfig = field(default_factory=ScriptedConfig)

    def checkpoint_due(self, step: int) -> bool:
        """Whether the run writes a checkpoint after step ``step``: every ``checkpoint_every`` steps and at the
        last."""
        return step % self.checkpoint_every == 0 or step == self.steps

    @property
    def asynchronous(self) -> bool:
        """Whether generation overlaps training (``pipeline.max_staleness >= 1``, :mod:`selfplay.pipeline`)."""
        return self.pipeline.max_staleness > 0

    def validate(self) -> None:
        """Check every value: the types of every field (:func:`check_types`), this config's own fields and
        cross-section rules, and each section by its own ``validate()`` under its prefix (``env.``, ``trainer.``,
        ...); raise :class:`ConfigError` naming the first bad dotted field. Plugins must already be imported
        (their registered names are looked up here). The checks that need torch come last, so a bad plain value
        is reported without loading it."""
        check_types(self)
        check_int("steps", self.steps, 1)
        check_int("seed", self.seed, 0, MAX_SEED)
        check_int("threads", self.threads, 0, 4096)
        problem = _model_problem(self.model)
        check(problem is None, "model", problem or "")
        check(self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,3}", self.device) is not None,
              "device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        check_int("rank", self.rank, 1, 4096)
        check_number("alpha", self.alpha, low=0.0, high=1e6, low_open=True)
        check_int("checkpoint_every", self.checkpoint_every, 1)
        check_int("keep_checkpoints", self.keep_checkpoints, 0)
        check_int("log_samples", self.log_samples, 0)
        check_int("tamper_samples", self.tamper_samples, 0, MAX_TAMPER_SAMPLES)
        check_choice("backend", self.backend, ("local", "ray"))
        check_section("env.", self.env)
        check_section("generation.", self.generation)
        check(not (self.generation.engine == "vllm" and self.model.startswith(RANDOM_PREFIX)), "generation.engine",
              f"vllm needs a model directory; {self.model!r} is built in memory: use --generation.engine hf")
        check_section("pipeline.", self.pipeline)
        check_section("scripted.", self.scripted, self.env.num_teachers, self.env.num_students)
        check(not self.scripted.active or (not self.asynchronous and self.backend == "local"), "scripted.teachers",
              "scripted opponents play in the synchronous local loop: use pipeline.max_staleness 0 and backend local")
        if self.asynchronous and self.backend == "local" and self.generation.engine == "hf" \
                and self.pipeline.layout == "thread":
            check(self.threads > 0 and self.threads == self.generation.threads, "pipeline.layout",
                  f"'thread' runs both sides in one process, whose torch thread count is shared: set --threads and "
                  f"--generation.threads to the same count > 0 (got {self.threads} and {self.generation.threads}), "
                  "or use --pipeline.layout process")
        if self.backend == "ray":
            check(ray_installed(), "backend", f"ray is not installed; {RAY_INSTALL_HINT}")
            check_section("ray.", self.ray, self.env.num_teachers + self.env.num_students)
            check(self.pbt.lr_explore == "off", "pbt.lr_explore",
                  "the ray backend's trainer shards do not take a child's learning-rate scale; use --backend local")
        else:  # the local backend ignores the section's values but still checks them
            check_section("ray.", self.ray)
        # last, the checks that import torch: the registries of the pbt and trainer sections (each checks its
        # plain values first), then the model's module names (transformers builds the model on the meta device)
        check_section("pbt.", self.pbt)
        check_section("trainer.", self.trainer)
        _check_target_modules(self.model, self.target_modules)


# ----------------------------------------------------------------------------------- dict <-> config


INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
"""Every integer field fits in a signed 64-bit integer (what numpy, torch and the JSON readers of other tools
accept); fields with narrower documented bounds are checked by :meth:`TrainConfig.validate`."""
MAX_CONFIG_BYTES = 1 << 20
"""Largest preset / ``config.json`` file read (a run configuration is a few kilobytes)."""
MAX_CONFIG_DEPTH = 16
"""Deepest nesting of objects/lists in a preset (a run configuration nests four levels)."""


def _type_name(tp: Any) -> str:
    """How an annotation reads in an error message: ``a bool``, ``an int``, ``one of 'a', 'b'``, ..."""
    origin = typing.get_origin(tp)
    if tp is bool:
        return "a bool (true/false)"
    if tp is int:
        return "an int"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Path:
        return "a path (string)"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) if a is not type(None) else "null" for a in typing.get_args(tp)]
        return " or ".join(names)
    if origin is tuple:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _got(value: Any) -> str:
    text = repr(value)
    return f"{text[:80]}{'...' if len(text) > 80 else ''} ({type(value).__name__})"


def _exact(tp: Any, value: Any) -> bool:
    """Whether ``value`` already is of the simple type ``tp`` (used to pick a union member without converting)."""
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp in (int, float, str):
        return isinstance(value, tp) and not isinstance(value, bool)
    if typing.get_origin(tp) is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    return False


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """``value`` (from JSON, a flag or Python) as the annotated type ``tp``, or :class:`ConfigError` naming
    ``path`` and the expected type.

    Generic over the annotations of the config dataclasses, so a field added to any section is checked the same
    way: bools are bools (not ``"false"``, not ``0``), ints are ints (not bools, not ``1.5``) within the signed
    64-bit range, floats are finite numbers, strings are strings, ``Literal`` values are one of the choices,
    tuples are lists of the element type (of the declared length for ``tuple[X, Y]``), dicts have string keys
    and typed values, nested dataclasses are objects of their own fields (unknown keys refused).
    """
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = to_dict(value)
        if not isinstance(value, dict):
            raise ConfigError(path, f"must be an object, got {_got(value)}")
        return from_dict(tp, value, prefix=path + ".")
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(tp, value, path)
    if origin is Literal:
        if not _exact(tp, value):
            raise ConfigError(path, f"must be {_type_name(tp)}, got {_got(value)}")
        return value
    if origin in (tuple, list):
        return _coerce_sequence(tp, value, path)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"must be an object, got {_got(value)}")
        key_t, val_t = typing.get_args(tp) or (str, Any)
        out = {}
        for k, v in value.items():
            if key_t is str and not isinstance(k, str):
                raise ConfigError(path, f"keys must be strings, got {_got(k)}")
            out[k] = _coerce(val_t, v, f"{path}.{k}")
        return out
    return _coerce_scalar(tp, value, path)


def _coerce_union(tp: Any, value: Any, path: str) -> Any:
    """A union: a value that already has one of the types keeps it (5 stays an int in ``float | int | str``) if
    that type's own checks pass, else the first member type that takes it; refused with the failed check of
    the value's own type when it has one (``2**63`` in ``int | None``: the 64-bit range), else naming the union."""
    args = typing.get_args(tp)
    exact = [a for a in args if _exact(a, value)]
    if type(None) in exact:
        return None
    errors: list[ConfigError] = []
    # the members the value already has first, still through their own checks (an int outside the signed
    # 64-bit range is refused in ``int | None`` as in ``int``), then the others in order
    for a in exact + [a for a in args if a not in exact and a is not type(None)]:
        try:
            return _coerce(a, value, path)
        except ConfigError as e:
            errors.append(e)
    raise errors[0] if exact else ConfigError(path, f"must be {_type_name(tp)}, got {_got(value)}")


def _coerce_sequence(tp: Any, value: Any, path: str) -> tuple | list:
    """``tuple[X, ...]``, ``tuple[X, Y]`` (that many values) or ``list[X]`` from a list."""
    if not isinstance(value, list | tuple):
        raise ConfigError(path, f"must be a list, got {_got(value)}")
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        (arg,) = args or (Any,)
        return [_coerce(arg, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if args:
        if len(value) != len(args):
            raise ConfigError(path, f"must be a list of {len(args)} values, got {_got(value)}")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    return tuple(value)


def _coerce_scalar(tp: Any, value: Any, path: str) -> Any:
    """A bool, int (signed 64-bit), finite float, string or path; other annotations pass the value through."""
    bad = ConfigError(path, f"must be {_type_name(tp)}, got {_got(value)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise bad
        if not INT_MIN <= value <= INT_MAX:
            raise ConfigError(path, f"must be an int in the signed 64-bit range [{INT_MIN}, {INT_MAX}], got {value}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(path, f"must be a finite number, got {value}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if tp is Path:
        if not isinstance(value, str | os.PathLike):
            raise bad
        return Path(value)
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (nested) dict; unknown keys raise :class:`ConfigError`. A deprecated
    spelling the class still takes (an ``InitVar`` its ``__post_init__`` renames) is accepted."""
    annotations = typing.get_type_hints(cls)
    aliases = {k for k, t in annotations.items() if isinstance(t, InitVar)}
    hints = {k: t.type if k in aliases else t for k, t in annotations.items()}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - aliases)
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field (known: {', '.join(sorted(names))})")
    return cls(**{k: _coerce(hints[k], v, prefix + k) for k, v in data.items()})


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


def _presets_root() -> Any:
    """Where the shipped presets are: the package ``selfplay.presets`` of an installed project, else the
    checkout's ``configs/`` (a checkout on ``sys.path`` without being installed, as ``benchmarks/gpu_check.py``
    runs on a bare GPU image: the package exists only through the installed ``package-dir`` mapping)."""
    try:
        return resources.files(PRESETS_PACKAGE)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[1] / "configs"


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.name[:-5] for p in _presets_root().iterdir() if p.name.endswith(".json"))


def preset_path(preset: str) -> Path | None:
    """The JSON file a preset argument names: an existing path (or anything ending in ``.json``), else a shipped
    preset of that name; ``None`` if it is neither."""
    looks_like_path = preset.endswith(".json") or os.sep in preset or "/" in preset
    p = Path(preset).expanduser()
    if looks_like_path or p.is_file():
        return p if p.is_file() else None
    shipped = _presets_root() / f"{preset}.json"
    return Path(str(shipped)) if shipped.is_file() else None


def read_config_json(path: Path, field_name: str) -> dict:
    """The JSON object in ``path`` (a preset or a run's ``config.json``), within :data:`MAX_CONFIG_BYTES` and
    :data:`MAX_CONFIG_DEPTH`, with no key twice in one object (JSON would keep the last one silently:
    ``{"seed": 1, "seed": 2}`` trains seed 2); :class:`ConfigError` for ``field_name`` naming the file otherwise."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(field_name, f"{path} is {size} bytes, more than a run configuration can be "
                                          f"({MAX_CONFIG_BYTES} bytes)")
        data = parse_json(path.read_text(), path, MAX_CONFIG_DEPTH, unique_keys=True)
    except RunFileError as exc:
        raise ConfigError(field_name, f"{path} {exc.reason}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(field_name, f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(field_name, f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_preset(preset: str) -> TrainConfig:
    """The :class:`TrainConfig` a preset describes (unset fields keep the dataclass defaults)."""
    path = preset_path(preset)
    if path is None:
        what = "preset file" if preset.endswith(".json") or "/" in preset else "preset"
        raise ConfigError("preset", f"{what} {preset!r} not found (shipped presets: {', '.join(list_presets())}; "
                                    "or give a path to a .json file)")
    data = read_config_json(path, "preset")
    data = {k: v for k, v in data.items() if not k.startswith("_")}  # "_comment" and the like
    data["preset"] = preset
    return from_dict(TrainConfig, data)


# ------------------------------------------------------------------------------------------ validation


def _model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded here, or None."""
    if model in KNOWN_MODELS:
        return None
    if model.startswith(RANDOM_PREFIX):  # a published architecture with seeded random weights
        shape = model[len(RANDOM_PREFIX) :]
        if shape not in random_shapes():
            return f"unknown random shape {shape!r} (known: {', '.join(random_shapes())})"
        return None
    looks_local = model.startswith(("/", "./", "../", "~")) or model.endswith(".gguf") or os.sep * 2 in model
    p = Path(model).expanduser()
    if p.exists():
        return None
    if looks_local or model.count("/") != 1:
        return (f"model path {model!r} does not exist (use a local HF directory, a .gguf file, "
                f"or one of {', '.join(KNOWN_MODELS)})")
    return None  # a hub id: checked by load_base (fails with a clear message when offline)


MAX_TAMPER_SAMPLES = 1000
"""Most ``tamper_samples`` per member (whatever it is, the file stops growing at what its readers read,
:data:`selfplay.rundir.MAX_TAMPER_BYTES`)."""
MAX_SEED = (1 << 63) - 1
"""Largest run / PBT seed: every RNG of a run takes it (torch, numpy's Generator, Python's ``random``; numpy's
legacy global seed gets its low 32 bits)."""


def check_types(cfg: TrainConfig) -> None:
    """Every field of ``cfg`` has its annotated type (:func:`_coerce`); :class:`ConfigError` naming the dotted
    field and the expected type otherwise. Covers values set from Python or by a flag as well as from JSON."""
    from_dict(TrainConfig, to_dict(cfg))


def _model_config_file(model: str) -> Path | None:
    """The ``config.json`` of ``model`` if it can be read without building or loading anything: a local HF
    directory, or a built-in model already converted into the cache."""
    p = Path(model).expanduser()
    if p.is_dir():
        return p / HF_CONFIG if (p / HF_CONFIG).is_file() else None
    if model in KNOWN_MODELS:
        from agents import models

        name = {"tiny-random": "tiny-random-llama", "smollm2-135m": "smollm2-135m-instruct-fp32"}[model]
        f = models.cache_dir() / f"{name}-{models._CACHE_VERSION}" / HF_CONFIG
        return f if f.is_file() else None
    return None


@functools.lru_cache(maxsize=8)
def model_module_names(model: str) -> tuple[str, ...] | None:
    """Sorted names (last component) of the modules of ``model`` that hold weights of their own, from its
    ``config.json`` with the model built on the meta device (no weights read or allocated); ``None`` when the
    config cannot be read that way (a hub id, a ``.gguf`` not converted yet): peft checks the names later."""
    f = _model_config_file(model)
    if f is None:
        return None
    cached = _module_names_file(f)
    try:
        listed = json.loads(cached.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        listed = None  # not listed yet, or a damaged entry: list them below
    if isinstance(listed, list) and listed and all(isinstance(n, str) for n in listed):
        return tuple(listed)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(f.parent))
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(config)
    except Exception:  # an unusual architecture: leave the check to peft when the model loads
        return None
    names = tuple(sorted({name.rsplit(".", 1)[-1] for name, m in net.named_modules()
                          if name and any(True for _ in m.parameters(recurse=False))}))
    with contextlib.suppress(OSError):  # a read-only cache only costs the next command the listing again
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(names), encoding="utf-8")
        os.replace(tmp, cached)
    return names


def _module_names_file(config_file: Path) -> Path:
    """Where the module names of the model whose ``config.json`` is ``config_file`` are kept once listed: the
    cache (:func:`agents.models.cache_dir`'s parent, ``module-names/``), keyed by the file's bytes and the
    installed transformers version, so a dry run or a refused configuration skips importing transformers
    (half of a ``--dry-run``'s time: docs/testing.md §1)."""
    import hashlib
    from importlib import metadata

    from agents import models

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "none"
    key = hashlib.sha256(config_file.read_bytes() + b"\0" + version.encode()).hexdigest()[:32]
    return models.cache_dir().parent / "module-names" / f"{key}.json"


def unknown_target_modules(model: str, targets: tuple[str, ...]) -> list[str]:
    """The entries of ``targets`` that name no module of ``model`` (by last name component or a dotted suffix,
    as peft matches them); empty when the model's modules cannot be listed without loading it."""
    names = model_module_names(model)
    if names is None:
        return []
    return [t for t in targets if t.rsplit(".", 1)[-1] not in names]


def _check_target_modules(model: str, targets: tuple[str, ...]) -> None:
    check(len(targets) > 0, "target_modules", "must name at least one module")
    check(len(set(targets)) == len(targets), "target_modules", f"names a module twice: {list(targets)}")
    unknown = unknown_target_modules(model, targets)
    check(not unknown, "target_modules",
          f"{', '.join(map(repr, unknown))} not in model {model!r} (its modules: "
          f"{', '.join(model_module_names(model) or [])})")
