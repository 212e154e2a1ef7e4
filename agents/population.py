"""A population of LoRA adapters on one frozen base model.

Every member is a named adapter of ONE ``peft.PeftModel``; all members share the rank, alpha and target
modules. The population gives each member:

* deterministic creation: PEFT's default init (B = 0, A Kaiming-uniform) drawn from a generator seeded by
  ``(seed, name)`` only, so a member's initial weights do not depend on which other members exist;
* its state as a ``dict[str, Tensor]`` whose keys are exactly those of a PEFT ``adapter_model.safetensors``
  (e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, no adapter name), to and from which
  weights are copied in place;
* PEFT-format directories (``adapter_config.json`` + ``adapter_model.safetensors``) loadable by
  ``PeftModel.from_pretrained`` and by vLLM;
* its own AdamW optimizer over its own parameters only, so training one member never touches another
  (no weight decay leaks onto other members, and only the active member's parameters require grad).

Typical training use::

    pop = LoRAPopulation(base, ["m0", "m1"], rank=8, alpha=16)
    with pop.activate("m0"):                     # forward passes use m0; only m0 requires grad
        loss = compute_loss(pop.model, batch)
        loss.backward()
        opt = pop.optimizer("m0", lr=1e-5)
        opt.step(); opt.zero_grad(set_to_none=True)

Mixed-adapter inference (one adapter per batch row) goes through :meth:`LoRAPopulation.mixed`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
POPULATION_FILE = "population.json"
BASE_ADAPTER = "__base__"  # the row label PEFT uses for "adapters disabled" in mixed batches

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")

__all__ = ["DEFAULT_TARGET_MODULES", "LoRAPopulation", "member_seed", "mixed_factors", "randomize_member",
           "save_optimizer_state"]


def save_optimizer_state(state: dict[str, object], path: str | Path) -> None:
    """``torch.save(state)`` to ``path`` through an open file. Given a path, torch names the archive's inner folder
    after the file when the path is ASCII (``optimizer/``) and ``archive/`` when it is not, so a run in a folder
    named with non-ASCII characters wrote other bytes; through a file it is ``archive/`` wherever the run is."""
    with open(path, "wb") as f:
        torch.save(state, f)


def member_seed(seed: int, name: str) -> int:
    """The seed a member's initial weights are drawn with: a stable hash of ``(seed, name)``."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def randomize_member(population: LoRAPopulation, name: str, std: float = 0.02, seed: int = 0) -> None:
    """Give member ``name`` a non-zero, seeded random B (A keeps its init), so that it really changes the
    base model's outputs. A utility for tests and benchmarks: PEFT's default init has B = 0, which makes
    every fresh member behave exactly like the base."""
    gen = torch.Generator().manual_seed(member_seed(seed, name))
    state = population.state(name)
    for key, tensor in state.items():
        if ".lora_B." in key:
            state[key] = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.dtype) * std
    population.load_state(name, state)


def _state_key(param_name: str, name: str) -> str | None:
    """``...q_proj.lora_A.<name>.weight`` -> ``...q_proj.lora_A.weight``; None if not a param of ``name``."""
    parts = param_name.split(".")
    for i in range(len(parts) - 1):
        if parts[i] in ("lora_A", "lora_B") and parts[i + 1] == name:
            return ".".join(parts[: i + 1] + parts[i + 2 :])
    return None


class _Activation:
    """Returned by :meth:`LoRAPopulation.activate`: the activation has already happened; used as a context
    manager it restores the previously active member on exit."""

    def __init__(self, population: LoRAPopulation, previous: str | None) -> None:
        self._population = population
        self._previous = previous

    def __enter__(self) -> LoRAPopulation:
        return self._population

    def __exit__(self, *exc) -> None:
        if self._previous is not None and self._previous in self._population:
            self._population.activate(self._previous)


class LoRAPopulation:
    """N named LoRA adapters of one rank on one frozen base model (one ``peft.PeftModel``).

    Args:
        base: the frozen base model (e.g. from :func:`agents.models.load_base`). It is modified in place:
            PEFT injects the LoRA layers into it. Do not wrap one base in two populations.
        names: initial member names (at least one; letters, digits, ``_`` and ``-``, not starting with ``_``).
        rank, alpha, target_modules, dropout: the LoRA configuration shared by all members.
        seed: population seed; member ``name`` is initialised from ``member_seed(seed, name)``.

    Attributes:
        model: the ``peft.PeftModel`` holding every member.
        names: member names, in order (a copy).
        rank, alpha, target_modules, dropout, seed: as given.
    """

    def __init__(
        self,
        base: nn.Module,
        names: Sequence[str],
        rank: int = 8,
        alpha: float = 16,
        target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
        dropout: float = 0.0,
        seed: int = 0,
    ) -> None:
        from peft import PeftModel

        names = list(names)
        if not names:
            raise ValueError("a population needs at least one member name")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate member names: {names}")
        for name in names:
            self._check_name(name)
        if isinstance(base, PeftModel):
            raise TypeError("base is already a PeftModel; pass the plain frozen base model")
        if isinstance(target_modules, str):
            raise TypeError("target_modules must be a sequence of module names, not a string")
        self.rank = int(rank)
        self.alpha = alpha
        self.target_modules = tuple(target_modules)
        self.dropout = float(dropout)
        self.seed = int(seed)
        self._names: list[str] = []
        self._params: dict[str, dict[str, nn.Parameter]] = {}
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        self._mixed_active = False

        base.requires_grad_(False)
        first = names[0]
        with self._seeded(first):
            from peft import get_peft_model

            self.model = get_peft_model(base, self._config(), adapter_name=first)
        self.model.eval()  # get_peft_model leaves train mode on; the trainer decides when to train()
        self._names.append(first)
        self._lora_layers = self._find_lora_layers()
        for name in names[1:]:
            self.add(name)
        self.activate(first)

    # ------------------------------------------------------------------ structure

    @property
    def names(self) -> list[str]:
        """Member names in order (a copy: use add/remove/rename to change the population)."""
        return list(self._names)

    @property
    def active(self) -> str:
        """The member forward passes currently use."""
        return self.model.active_adapter

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __repr__(self) -> str:
        return (
            f"LoRAPopulation(names={self._names}, rank={self.rank}, alpha={self.alpha}, "
            f"target_modules={list(self.target_modules)}, active={self.active!r})"
        )

    @staticmethod
    def _check_name(name: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name) or name == BASE_ADAPTER:
            raise ValueError(
                f"invalid member name {name!r}: use letters, digits, '_' and '-', not starting with '_' "
                "(names become PEFT adapter names and directory names)"
            )

    def _require(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(f"no member named {name!r}; members: {self._names}")

    def _config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=list(self.target_modules),
            lora_dropout=self.dropout,
            bias="none",
            task_type="CAUSAL_LM",
        )

    @contextmanager
    def _seeded(self, name: str) -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(member_seed(self.seed, name))
            yield

    def _find_lora_layers(self) -> list[nn.Module]:
        from peft.tuners.lora import LoraLayer
        from peft.tuners.lora.layer import Linear as LoraLinear

        layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]
        if not layers:
            raise ValueError(f"no module of the base matched target_modules={list(self.target_modules)}")
        odd = [type(m).__name__ for m in layers if not isinstance(m, LoraLinear)]
        if odd:
            raise NotImplementedError(f"only LoRA on nn.Linear layers is supported, got {sorted(set(odd))}")
        return layers

    def _index_params(self, name: str) -> dict[str, nn.Parameter]:
        params = {}
        for pname, param in self.model.named_parameters():
            key = _state_key(pname, name)
            if key is not None:
                params[key] = param
        if not params:
            raise RuntimeError(f"member {name!r} has no LoRA parameters")
        return params

    def _member_params(self, name: str) -> dict[str, nn.Parameter]:
        self._require(name)
        if name not in self._params:
            self._params[name] = self._index_params(name)
        return self._params[name]

    def add(self, name: str, state: dict[str, torch.Tensor] | None = None) -> None:
        """Add member ``name``: seeded PEFT default init, or the given state (PEFT state-dict keys)."""
        self._check_name(name)
        if name in self._names:
            raise ValueError(f"member {name!r} already exists")
        if self._mixed_active:
            raise RuntimeError("cannot change the population inside LoRAPopulation.mixed()")
        with self._seeded(name):
            self.model.add_adapter(name, self._config())
        self._names.append(name)
        self._params.pop(name, None)
        try:
            if state is not None:
                self.load_state(name, state)
        except Exception:
            self.remove(name)
            raise
        self._apply_trainable()

    def remove(self, name: str) -> None:
        """Delete member ``name`` (its weights and optimizer). The last member cannot be removed."""
        self._require(name)
        if len(self._names) == 1:
            raise ValueError(f"cannot remove {name!r}: a population keeps at least one member")
        if self._mixed_active:
            raise RuntimeError("cannot change the population inside LoRAPopulation.mixed()")
        was_active = self.active == name
        with warnings.catch_warnings():  # "Adapter X was active which is now deleted": handled below
            warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
            self.model.delete_adapter(name)
        self._names.remove(name)
        self._params.pop(name, None)
        self._optimizers.pop(name, None)
        if was_active or self.active not in self._names:
            self.activate(self._names[0])
        else:
            self._apply_trainable()

    def rename(self, old: str, new: str) -> None:
        """Rename a member, keeping its weights, optimizer state, position in ``names`` and activity."""
        self._require(old)
        if old == new:
            return
        self._check_name(new)
        if new in self._names:
            raise ValueError(f"member {new!r} already exists")
        was_active = self.active == old
        position = self._names.index(old)
        self.add(new, self.state(old))
        old_opt = self._optimizers.get(old)
        if old_opt is not None:
            self.load_optimizer_state_dict(new, old_opt.state_dict())
        self._names.remove(new)
        self._names.insert(position, new)
        if was_active:
            self.activate(new)
        self.remove(old)

    # ------------------------------------------------------------------ activity and training

    def activate(self, name: str) -> _Activation:
        """Make ``name`` the adapter of forward passes and mark ONLY its parameters ``requires_grad``.

        Takes effect immediately; used as a context manager (``with pop.activate("m0"): ...``) it restores the
        previously active member on exit.
        """
        self._require(name)
        previous = self.model.active_adapter if self._names else None
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        self._apply_trainable()
        return _Activation(self, previous)

    def _apply_trainable(self) -> None:
        active = self.model.active_adapter
        for name in self._names:
            flag = name == active
            for param in self._member_params(name).values():
                param.requires_grad_(flag)

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """Forward passes inside use the base model with every adapter disabled."""
        with self.model.disable_adapter():
            yield

    def parameters(self, name: str) -> list[nn.Parameter]:
        """The trainable tensors (lora_A and lora_B of every target module) of member ``name``."""
        return list(self._member_params(name).values())

    def optimizer(
        self,
        name: str,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
    ) -> torch.optim.AdamW:
        """Member ``name``'s AdamW over its own parameters only; created on first call, then reused.

        The hyperparameters of the LATEST call are applied to the existing optimizer's param group (its moment
        estimates are kept), so a trainer that passes its configured ``lr`` always gets that ``lr``. The step
        runs torch's multi-tensor (``foreach``) implementation: the same values bit for bit as the per-tensor
        loop (a probe over a rank-8 SmolLM2 member's 420 tensors), in ~0.4x its time on CPU, where torch's
        default is the loop.
        """
        opt = self._optimizers.get(name)
        if opt is None:
            opt = torch.optim.AdamW(
                self.parameters(name), lr=lr, weight_decay=weight_decay, betas=tuple(betas), foreach=True
            )
            self._optimizers[name] = opt
        else:
            for group in opt.param_groups:
                group.update(lr=lr, weight_decay=weight_decay, betas=tuple(betas))
        return opt

    def has_optimizer(self, name: str) -> bool:
        """Whether member ``name``'s optimizer has been created."""
        self._require(name)
        return name in self._optimizers

    def reset_optimizer(self, name: str) -> None:
        """Forget member ``name``'s optimizer (moments and step); the next ``optimizer(name)`` makes a new one."""
        self._require(name)
        self._optimizers.pop(name, None)

    def optimizer_state_dict(self, name: str) -> dict | None:
        """``state_dict()`` of member ``name``'s optimizer (None if it was never created)."""
        self._require(name)
        opt = self._optimizers.get(name)
        return None if opt is None else opt.state_dict()

    def load_optimizer_state_dict(self, name: str, state_dict: dict | None) -> None:
        """Restore member ``name``'s optimizer (hyperparameters included) from ``state_dict``; None resets it."""
        self._require(name)
        if state_dict is None:
            self.reset_optimizer(name)
            return
        params = self.parameters(name)
        saved = [p for group in state_dict["param_groups"] for p in group["params"]]
        if len(saved) != len(params):
            raise ValueError(
                f"optimizer state for {len(saved)} tensors cannot be loaded into member {name!r} with "
                f"{len(params)} tensors (different rank/target modules?)"
            )
        opt = torch.optim.AdamW(params, foreach=True)
        opt.load_state_dict(state_dict)
        for group in opt.param_groups:  # a state saved before foreach was chosen carries foreach=None
            group["foreach"] = True
        self._optimizers[name] = opt

    # ------------------------------------------------------------------ state

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """Member ``name``'s weights: PEFT ``adapter_model.safetensors`` keys -> detached CPU clones."""
        return {key: p.detach().to("cpu", copy=True) for key, p in self._member_params(name).items()}

    def load_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (PEFT keys, as from :meth:`state`) into member ``name``'s tensors in place
        (no reallocation: optimizers and references stay valid). Keys and shapes must match exactly."""
        params = self._member_params(name)
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(
                f"state does not fit member {name!r}: {len(missing)} missing key(s) {missing[:3]}, "
                f"{len(unexpected)} unexpected key(s) {unexpected[:3]} (expected PEFT adapter keys such as "
                f"{next(iter(params))!r})"
            )
        bad = [
            (k, tuple(state[k].shape), tuple(p.shape)) for k, p in params.items() if state[k].shape != p.shape
        ]
        if bad:
            key, got, want = bad[0]
            raise ValueError(
                f"state does not fit member {name!r}: {len(bad)} shape mismatch(es), e.g. {key}: got {got}, "
                f"expected {want} (rank {self.rank})"
            )
        with torch.no_grad():
            for key, param in params.items():
                param.copy_(state[key])

    def save(self, name: str, directory: str | Path, dtype: torch.dtype | None = None,
             state: dict[str, torch.Tensor] | None = None) -> Path:
        """Write member ``name`` as a PEFT adapter directory (``adapter_config.json`` +
        ``adapter_model.safetensors``), loadable by ``PeftModel.from_pretrained`` and vLLM.

        ``dtype`` casts the saved weights (vLLM wants the adapter in the engine's dtype); ``state`` writes these
        weights (the member's keys, e.g. an earlier version of it) instead of the member's live ones."""
        from safetensors.torch import save_file

        self._require(name)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self.model.peft_config[name])
        config.inference_mode = True
        config.base_model_name_or_path = getattr(self.model.base_model.model.config, "_name_or_path", None)
        for key, value in vars(config).items():  # a set (target_modules) is written in the hash order of this
            if isinstance(value, set):  # process (PYTHONHASHSEED): sorted, the same bytes in every process
                setattr(config, key, sorted(value))
        config.save_pretrained(str(directory))
        state = self.state(name) if state is None else dict(state)
        if dtype is not None:
            state = {k: v.to(dtype) for k, v in state.items()}
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(directory / ADAPTER_WEIGHTS),
            metadata={"format": "pt"},
        )
        return directory

    def load(self, directory: str | Path, name: str) -> None:
        """Load a PEFT adapter directory as member ``name`` (replaced in place if it exists, else added).

        Raises ValueError if the adapter's rank, alpha or target modules differ from the population's."""
        from peft import LoraConfig

        directory = Path(directory)
        if not (directory / ADAPTER_CONFIG).is_file():
            raise FileNotFoundError(f"{directory} has no {ADAPTER_CONFIG}: not a PEFT adapter directory")
        config = LoraConfig.from_pretrained(str(directory))
        problems = []
        if config.r != self.rank:
            problems.append(f"rank {config.r} != {self.rank}")
        if float(config.lora_alpha) != float(self.alpha):
            problems.append(f"alpha {config.lora_alpha} != {self.alpha}")
        saved_targets = config.target_modules
        if isinstance(saved_targets, str) or set(saved_targets or ()) != set(self.target_modules):
            problems.append(f"target_modules {saved_targets} != {sorted(self.target_modules)}")
        for flag in ("use_dora", "use_rslora"):
            if getattr(config, flag, False):
                problems.append(f"{flag}=True is not supported")
        if config.rank_pattern or config.alpha_pattern:
            problems.append("rank_pattern/alpha_pattern are not supported")
        if problems:
            raise ValueError(
                f"adapter at {directory} is incompatible with this population: " + "; ".join(problems)
            )
        state = self._read_weights(directory)
        if name in self._names:
            self.load_state(name, state)
        else:
            self.add(name, state)

    @staticmethod
    def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
        if (directory / ADAPTER_WEIGHTS).is_file():
            from safetensors.torch import load_file

            return load_file(str(directory / ADAPTER_WEIGHTS))
        if (directory / "adapter_model.bin").is_file():
            return torch.load(directory / "adapter_model.bin", map_location="cpu", weights_only=True)
        raise FileNotFoundError(f"{directory} has no {ADAPTER_WEIGHTS} (nor adapter_model.bin)")

    def save_all(self, directory: str | Path) -> Path:
        """Checkpoint every member: ``dir/<member>/`` PEFT directories (+ ``optimizer.pt`` where an optimizer
        exists) and ``dir/population.json`` (names, order, LoRA config, seed, active member)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in self._names:
            member_dir = self.save(name, directory / name)
            opt_file = member_dir / OPTIMIZER_FILE
            sd = self.optimizer_state_dict(name)
            if sd is not None:
                save_optimizer_state(sd, opt_file)
            elif opt_file.exists():
                opt_file.unlink()
        meta = {
            "names": self._names,
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": list(self.target_modules),
            "dropout": self.dropout,
            "seed": self.seed,
            "active": self.active,
        }
        (directory / POPULATION_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    def load_all(self, directory: str | Path) -> None:
        """Restore a :meth:`save_all` checkpoint: afterwards the members, their order, weights, optimizer states
        and the active member are exactly the saved ones (members not in the checkpoint are removed)."""
        directory = Path(directory)
        meta_file = directory / POPULATION_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(f"{directory} has no {POPULATION_FILE}: not a LoRAPopulation checkpoint")
        meta = json.loads(meta_file.read_text())
        if meta["rank"] != self.rank or set(meta["target_modules"]) != set(self.target_modules):
            raise ValueError(
                f"checkpoint {directory} has rank {meta['rank']} / targets {meta['target_modules']}, "
                f"this population rank {self.rank} / targets {list(self.target_modules)}"
            )
        saved = list(meta["names"])
        for name in saved:
            self.load(directory / name, name)
        for name in [n for n in self._names if n not in saved]:
            self.remove(name)
        self._names = saved
        for name in saved:
            opt_file = directory / name / OPTIMIZER_FILE
            sd = torch.load(opt_file, map_location="cpu", weights_only=True) if opt_file.is_file() else None
            self.load_optimizer_state_dict(name, sd)
        self.activate(meta.get("active") if meta.get("active") in saved else saved[0])

    @contextmanager
    def single(self, name: str) -> Iterator[None]:
        """Forward passes inside run member ``name``'s LoRA modules as ``base(x) + s * (x A^T) B^T`` with the
        low-rank product added by ONE ``addmm`` (``alpha = s``), where PEFT's forward writes ``(x A^T) B^T``,
        scales it and adds it: two full-size passes over each module's ``[tokens, out]`` output (and their
        backward) fewer, the same function and gradients up to float rounding. On a base in a lower precision
        than the adapters (bf16 base, fp32 LoRA: PEFT's default) the product runs in the base's dtype with the
        factors cast to it, where PEFT casts every input to float32; the parameters and their optimizer state
        stay float32 (the master weights). For training the active member
        (:class:`agents.trainer.PolicyGradientTrainer`, ``lora_impl="fused"``); ``name`` must be the active
        adapter. A module whose LoRA is not plain (another variant such as DoRA, a LoRA bias), or a forward with
        adapters disabled or merged, runs PEFT's own forward. Not re-entrant with :meth:`mixed`."""
        self._require(name)
        if self.model.active_adapter != name:
            raise RuntimeError(f"single({name!r}) needs {name!r} active (LoRAPopulation.activate), "
                               f"not {self.model.active_adapter!r}")
        patched: list[nn.Module] = []
        try:
            for module in self._lora_layers:
                if name in module.lora_A and name not in getattr(module, "lora_variant", {}) \
                        and module.lora_B[name].bias is None and "forward" not in module.__dict__:
                    module.forward = _SingleForward(module, name)
                    patched.append(module)
            yield
        finally:
            _unpatch(patched)

    # ------------------------------------------------------------------ mixed-adapter inference

    @contextmanager
    def mixed(self, row_adapters: Sequence[str | None]) -> Iterator[None]:
        """Forward passes inside use adapter ``row_adapters[i]`` for batch row ``i`` (``None`` = base only).

        Every batch of a forward inside must have ``len(row_adapters)`` rows. Per LoRA module the used members'
        A and B are concatenated once on entry ([P*r, in] and [out, P*r]); a forward computes
        ``base(x) + ((x @ A_cat^T) * mask) @ B_cat^T`` where ``mask`` keeps, for each row, only its member's r
        columns times its scaling. That is two small matmuls per module whatever the number of members
        (PEFT's ``adapter_names=`` path loops over the members), with the same result as PEFT's forward up to
        float rounding. Meant for inference (dropout is not applied); weights are read on entry, so do not
        update members inside. Not re-entrant.
        """
        rows = list(row_adapters)
        if not rows:
            raise ValueError("row_adapters is empty")
        used: list[str] = []
        for adapter in rows:
            if adapter is None or adapter == BASE_ADAPTER:
                continue
            self._require(adapter)
            if adapter not in used:
                used.append(adapter)
        if self._mixed_active:
            raise RuntimeError("LoRAPopulation.mixed() is not re-entrant")
        if not used:
            self._mixed_active = True
            try:
                with self.model.disable_adapter():
                    yield
            finally:
                self._mixed_active = False
            return
        col = {name: i for i, name in enumerate(used)}
        r = self.rank
        patched: list[nn.Module] = []
        masks: dict[tuple, torch.Tensor] = {}
        self._mixed_active = True
        try:
            with torch.no_grad():
                for module in self._lora_layers:
                    a_weights = [module.lora_A[name].weight for name in used]
                    dtype, device = a_weights[0].dtype, a_weights[0].device
                    a_cat = torch.cat(a_weights, dim=0)
                    b_cat = torch.cat([module.lora_B[name].weight for name in used], dim=1)
                    scalings = tuple(float(module.scaling[name]) for name in used)
                    key = (scalings, dtype, device)
                    if key not in masks:
                        mask = torch.zeros(len(rows), 1, len(used) * r, dtype=dtype, device=device)
                        for i, adapter in enumerate(rows):
                            if adapter in col:
                                j = col[adapter]
                                mask[i, 0, j * r : (j + 1) * r] = scalings[j]
                        masks[key] = mask
                    module.forward = _MixedForward(module, a_cat, b_cat, masks[key])
                    patched.append(module)
            yield
        finally:
            _unpatch(patched)
            self._mixed_active = False


def _unpatch(modules: Sequence[nn.Module]) -> None:
    """Give back each module its class's ``forward`` (undo ``module.forward = ...`` of :meth:`LoRAPopulation.mixed`
    and :meth:`LoRAPopulation.single`)."""
    for module in modules:
        module.__dict__.pop("forward", None)


class _MixedForward:
    """Replacement forward of one PEFT LoRA Linear inside :meth:`LoRAPopulation.mixed`."""

    def __init__(
        self, module: nn.Module, a_cat: torch.Tensor, b_cat: torch.Tensor, mask: torch.Tensor
    ) -> None:
        self.base_layer = module.base_layer
        self.a_cat = a_cat
        self.b_cat = b_cat
        self.mask = mask

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        kwargs.pop("adapter_names", None)
        result = self.base_layer(x, *args, **kwargs)
        if x.shape[0] != self.mask.shape[0]:
            raise ValueError(
                f"LoRAPopulation.mixed() was set up for {self.mask.shape[0]} rows, got a batch of {x.shape[0]} "
                "(beam search or batch expansion is not supported)"
            )
        h = torch.nn.functional.linear(x.to(self.a_cat.dtype), self.a_cat)
        mask = self.mask if h.dim() == 3 else self.mask.view(self.mask.shape[0], -1)
        return result + torch.nn.functional.linear(h * mask, self.b_cat).to(result.dtype)


class _SingleForward:
    """Replacement forward of one PEFT LoRA Linear inside :meth:`LoRAPopulation.single`."""

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        m, name = self.module, self.name
        if m.disable_adapters or m.merged or kwargs.get("adapter_names") is not None \
                or list(m.active_adapters) != [name]:
            return type(m).forward(m, x, *args, **kwargs)
        result = m.base_layer(x, *args, **kwargs)
        a, b = m.lora_A[name].weight, m.lora_B[name].weight
        if x.dtype != a.dtype and x.dtype == result.dtype:  # a bf16 base with fp32 adapters (the GPU recipe)
            # compute in the base's dtype: cast the rank-r factors (small, differentiable: the gradients reach the
            # fp32 master weights in fp32) instead of copying every [tokens, in] input to fp32
            a, b = a.to(x.dtype), b.to(x.dtype)
        low = torch.nn.functional.linear(m.lora_dropout[name](x.to(a.dtype)), a)
        if result.dtype != b.dtype:
            return result + (torch.nn.functional.linear(low, b) * m.scaling[name]).to(result.dtype)
        out = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), b.t(),
                          alpha=m.scaling[name])
        return out.view(result.shape)


def mixed_factors(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """What :meth:`LoRAPopulation.mixed` bound to one LoRA module: ``(A_cat [P*r, in], B_cat [out, P*r],
    mask [rows, P*r])`` (its forward adds ``((x A_cat^T) * mask) B_cat^T`` to the base output), or ``None``
    where no member adapter is applied: a plain module, or adapters disabled or merged. Raises
    ``RuntimeError`` for a LoRA module with an active adapter that ``mixed`` did not patch (outside ``mixed``,
    a caller reading the factors would silently drop that adapter)."""
    patched = module.__dict__.get("forward")
    if isinstance(patched, _MixedForward):
        return patched.a_cat, patched.b_cat, patched.mask.reshape(patched.mask.shape[0], -1)
    if hasattr(module, "lora_A") and not getattr(module, "disable_adapters", True) \
            and not getattr(module, "merged", False):
        raise RuntimeError("an active LoRA adapter outside LoRAPopulation.mixed(): read the factors inside "
                           "LoRAPopulation.mixed() (or with adapters disabled)")
    return None
