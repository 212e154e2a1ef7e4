"""The GPU memory a run needs at its peak, line by line, before any work (``--dry-run --gpu-memory-gib N``).

Everything is estimated from the run configuration and the model's configuration on the meta device
(:mod:`agents.memory`: no weights read): the trainer's copy of the base in the run's dtype; every member's
LoRA adapter as float32 master weights, its two AdamW moments, and the updated member's float32 gradients
(and its factors cast to the base's dtype for the update); the activations of the largest forward pass of
an update, with and without gradient checkpointing (the configured one counts); a fixed allowance for the
CUDA context and the allocator's slack; and, with the vLLM engine, its whole share
``generation.vllm_gpu_memory_utilization x N`` (vLLM reserves it at start-up and refuses to start where it
is not free), inside which its own copy of the base, its LoRA slots (``max_loras`` = members + 1, at the rank
vLLM rounds to) and a fixed allowance for its activations and graphs leave the KV cache, which must hold at
least ``generation.vllm_max_model_len`` tokens. With the HF engine the generation's KV cache is counted
instead of the update's activations where it is larger (the two phases never overlap).

The largest pass: ``trainer.max_tokens_per_row`` token slots when set (a single rollout longer than it is a
pass of its own: the longest rollout is ``generation.max_prompt_tokens`` + the larger generation budget),
else ``trainer.micro_batch_size`` rollouts of that longest length with no prefix shared: a bound, not a
typical pass. Without ``generation.max_prompt_tokens`` a prompt is bounded by the vLLM context
(``vllm_max_model_len`` minus the budget) or, with the HF engine, assumed to be :data:`HF_PROMPT_TOKENS`.

When the plan does not fit, :attr:`MemoryPlan.advice` names what to change with its effect: the row cap that
fits, checkpointing, the vLLM share (down to what its KV cache needs), or a larger GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selfplay.config import TrainConfig

__all__ = ["CUDA_RESERVE_GIB", "HF_PROMPT_TOKENS", "VLLM_RESERVE_GIB", "MemoryPlan", "memory_plan"]

GIB = 1 << 30
CUDA_RESERVE_GIB = 1.5
"""The trainer process's CUDA context, kernels and the caching allocator's slack (an allowance, not measured)."""
VLLM_RESERVE_GIB = 2.0
"""vLLM's own activation peak and CUDA graphs inside its share (an allowance; vLLM measures it at start-up)."""
HF_PROMPT_TOKENS = 2048
"""The prompt length assumed with the HF engine and no ``generation.max_prompt_tokens``."""


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass
class MemoryPlan:
    """The estimate: ``lines`` (label, bytes, how it was computed), the peak, whether it fits ``gpu_bytes``."""

    gpu_bytes: int
    lines: list[tuple[str, int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    peak: int = 0
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """The plan as printed: one line per part, the total, the verdict and what to change."""
        width = max(len(label) for label, _, _ in self.lines)
        out = [f"GPU memory plan for {self.gpu_bytes / GIB:g} GiB (estimated from the configuration; "
               "selfplay/memory_plan.py):"]
        out += [f"  {label:<{width}}  {_gib(n):>11}  {how}" for label, n, how in self.lines]
        out.append(f"  {'peak':<{width}}  {_gib(self.peak):>11}  of {_gib(self.gpu_bytes)}")
        out += [f"  note: {n}" for n in self.notes]
        if self.fits:
            out.append(f"fits: {_gib(self.gpu_bytes - self.peak)} to spare")
        else:
            out.append("does not fit: " + "; ".join(self.problems))
            out += [f"  change: {a}" for a in self.advice]
        return "\n".join(out)

    def error_line(self) -> str:
        """One line for an exit-2 message: the problem and what to change."""
        return ("the run does not fit in " + f"{self.gpu_bytes / GIB:g} GiB: " + "; ".join(self.problems)
                + (" — change: " + "; or ".join(self.advice) if self.advice else ""))


def _pass(cfg: TrainConfig, cap: int | None) -> tuple[int, int, int, str]:
    """``(tokens, head tokens, longest rollout, how)`` of the largest forward pass of an update (module
    docstring)."""
    g, t = cfg.generation, cfg.trainer
    budget = max(g.teacher_max_new_tokens, g.student_max_new_tokens)
    if g.max_prompt_tokens is not None:
        prompt, source = g.max_prompt_tokens, "generation.max_prompt_tokens"
    elif g.engine == "vllm":
        prompt, source = max(1, g.vllm_max_model_len - budget), "the vLLM context minus the budget"
    else:
        prompt, source = HF_PROMPT_TOKENS, "assumed (no generation.max_prompt_tokens)"
    longest = prompt + budget
    unbounded = t.micro_batch_size * longest
    tokens = unbounded if cap is None else min(unbounded, max(cap, longest))
    how = (f"{t.micro_batch_size} x ({prompt:,} prompt [{source}] + {budget:,}), nothing shared" if cap is None
           else f"row cap {cap:,} (longest rollout {longest:,})")
    return tokens, min(t.logprob_chunk_size, tokens), longest, how


def _activations(cfg: TrainConfig, shape, tokens: int, head: int, checkpointing: bool, cuda: bool) -> int:
    from agents.memory import activation_bytes

    return activation_bytes(shape, tokens, head, cfg.dtype, checkpointing=checkpointing, rank=cfg.rank,
                            targets=cfg.target_modules, attention=cfg.trainer.packed_attention, cuda=cuda)


def memory_plan(cfg: TrainConfig, members: int, gpu_gib: float, advise: bool = True) -> MemoryPlan:
    """The plan of ``cfg`` with ``members`` adapters on a GPU of ``gpu_gib`` GiB (module docstring); ``advise``:
    when it does not fit, find what to change (each change is planned again and kept only if it fits).

    Raises:
        ValueError: the model's configuration cannot be read without a download."""
    from agents.generation.vllm import supported_max_lora_rank
    from agents.memory import dtype_bytes, model_shape

    shape = model_shape(cfg.model)
    e = dtype_bytes(cfg.dtype)
    g, t = cfg.generation, cfg.trainer
    plan = MemoryPlan(int(gpu_gib * GIB))
    lora = shape.lora_params(cfg.rank, cfg.target_modules)
    base = shape.params * e
    plan.lines += [
        ("base model (trainer)", base, f"{shape.params / 1e9:.2f} B parameters x {e} B ({cfg.dtype}), {cfg.model}"),
        ("LoRA adapters", members * lora * 4,
         f"{members} x {lora / 1e6:.1f} M parameters (rank {cfg.rank}) x 4 B, float32 master weights"),
        ("AdamW moments", members * 2 * lora * 4, f"{members} x 2 x {lora / 1e6:.1f} M x 4 B"),
        ("gradients (one member)", lora * 4 + (lora * e if e < 4 else 0),
         "float32" + (f", plus its factors cast to {cfg.dtype} for the update" if e < 4 else "")),
    ]
    cuda = cfg.device != "cpu"
    tokens, head, longest, how = _pass(cfg, t.max_tokens_per_row)
    full = _activations(cfg, shape, tokens, head, False, cuda)
    ckpt = _activations(cfg, shape, tokens, head, True, cuda)
    act = ckpt if t.gradient_checkpointing else full
    chosen, other = ("with", "without") if t.gradient_checkpointing else ("without", "with")
    plan.lines.append((f"activations ({chosen} checkpointing)", act,
                       f"largest pass {tokens:,} tokens: {how}; {head:,} through the LM head; "
                       f"{other} checkpointing {_gib(full if t.gradient_checkpointing else ckpt)}"))
    if cuda and t.packed_attention == "mask":
        plan.notes.append("trainer.packed_attention 'mask' on CUDA runs SDPA's math kernel (T x T scores per "
                          "layer are counted above): use 'tree' or 'flex'")
    step = act
    if g.engine == "hf":
        kv = g.batch_size * (longest) * shape.kv_bytes_per_token(e) + g.batch_size * shape.vocab * 4
        plan.lines.append(("HF generation (KV cache)", kv,
                           f"{g.batch_size} rows x {longest:,} tokens x {shape.kv_bytes_per_token(e) / 1024:.0f} "
                           "KiB, plus a float32 logits row each; not at the same time as the update"))
        step = max(act, kv)
    plan.lines.append(("CUDA context and slack", int(CUDA_RESERVE_GIB * GIB), "allowance"))
    static = sum(n for label, n, _ in plan.lines if not label.startswith(("activations", "HF generation")))
    vllm = least_share = 0
    if g.engine == "vllm":
        vllm = int(g.vllm_gpu_memory_utilization * plan.gpu_bytes)
        slots = (members + 1) * (supported_max_lora_rank(cfg.rank) * lora // cfg.rank) * e
        fixed = base + slots + int(VLLM_RESERVE_GIB * GIB)
        kv_token = shape.kv_bytes_per_token(e)
        kv_tokens = max(0, vllm - fixed) // kv_token
        least_share = fixed + g.vllm_max_model_len * kv_token
        plan.lines.append((f"vLLM share ({g.vllm_gpu_memory_utilization:g} of the GPU)", vllm,
                           f"its base copy {_gib(base)}, {members + 1} LoRA slots {_gib(slots)}, activations and "
                           f"graphs ~{VLLM_RESERVE_GIB:g} GiB, KV cache {_gib(max(0, vllm - fixed))} = "
                           f"{kv_tokens:,} tokens at {kv_token / 1024:.0f} KiB"))
        if kv_tokens < g.vllm_max_model_len:
            plan.problems.append(f"vLLM's KV cache holds {kv_tokens:,} tokens, fewer than vllm_max_model_len "
                                 f"{g.vllm_max_model_len:,} (vLLM would refuse to start)")
    plan.peak = static + step + vllm
    if plan.peak > plan.gpu_bytes:
        plan.problems.append(f"estimated peak {_gib(plan.peak)} > {_gib(plan.gpu_bytes)}")
    if plan.problems and advise:
        _advise(plan, cfg, members, gpu_gib, static + _least_activations(cfg, shape, longest, cuda) + least_share)
    return plan


def _advise(plan: MemoryPlan, cfg: TrainConfig, members: int, gpu_gib: float, smallest: int) -> None:
    """What to change so that the plan fits (module docstring): each change that fits alone, with its effect;
    else the changes together; else the GPU the least of every setting needs (``smallest`` bytes)."""
    import dataclasses

    t, g = cfg.trainer, cfg.generation

    def trained(c: TrainConfig, **kw) -> TrainConfig:
        return dataclasses.replace(c, trainer=dataclasses.replace(c.trainer, **kw))

    def generated(c: TrainConfig, **kw) -> TrainConfig:
        return dataclasses.replace(c, generation=dataclasses.replace(c.generation, **kw))

    def peak(c: TrainConfig) -> MemoryPlan:
        return memory_plan(c, members, gpu_gib, advise=False)

    def largest_cap(c: TrainConfig) -> int | None:  # the largest multiple of 1,024 tokens whose pass fits
        start = min(64 * 1024, c.trainer.max_tokens_per_row or 64 * 1024)
        return next((cap for cap in range(start - 1024, 1023, -1024) if peak(trained(c, max_tokens_per_row=cap)).fits),
                    None)

    def largest_share(c: TrainConfig) -> float | None:  # the largest vLLM share, in hundredths, that fits
        top = int(round(c.generation.vllm_gpu_memory_utilization * 100))
        return next((u / 100 for u in range(top - 1, 4, -1)
                     if peak(generated(c, vllm_gpu_memory_utilization=u / 100)).fits), None)

    if not t.gradient_checkpointing and peak(trained(cfg, gradient_checkpointing=True)).fits:
        plan.advice.append("--trainer.gradient-checkpointing")
    cap = largest_cap(cfg)
    if cap is not None:
        plan.advice.append(f"--trainer.max-tokens-per-row {cap}")
    share = largest_share(cfg) if g.engine == "vllm" else None
    if share is not None:
        plan.advice.append(f"--generation.vllm-gpu-memory-utilization {share:.2f}")
    if plan.advice:
        return
    both = trained(cfg, gradient_checkpointing=True)
    changes = [] if t.gradient_checkpointing else ["--trainer.gradient-checkpointing"]
    cap = largest_cap(both)
    if cap is not None:
        plan.advice.append(" and ".join([*changes, f"--trainer.max-tokens-per-row {cap}"]))
        return
    if g.engine == "vllm":
        for u in range(int(round(g.vllm_gpu_memory_utilization * 100)) - 1, 4, -1):
            c = generated(both, vllm_gpu_memory_utilization=u / 100)
            cap = largest_cap(c)
            if cap is not None:
                plan.advice.append(" and ".join([*changes, f"--trainer.max-tokens-per-row {cap}",
                                                 f"--generation.vllm-gpu-memory-utilization {u / 100:.2f}"]))
                return
    plan.advice.append(f"a GPU with at least {-(-smallest // GIB)} GiB (the base copies, adapters, the least vLLM share "
                       "and the activations of one longest rollout with checkpointing need that much), or a smaller "
                       "model")


def _least_activations(cfg: TrainConfig, shape, longest: int, cuda: bool) -> int:
    """Activations of a pass of one longest rollout with checkpointing: the least any setting reaches."""
    return _activations(cfg, shape, longest, min(cfg.trainer.logprob_chunk_size, longest), True, cuda)
