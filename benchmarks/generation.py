"""Mixed-adapter generation speed with the HF backend on the offline default model.

    python benchmarks/generation.py [--model smollm2-135m] [--adapters 8] [--prompts 16] [--new-tokens 64]
                                    [--repeats 3] [--threads N] [--dtype float32] [--skip-peft]

Population of ``--adapters`` members (rank 8, all linear layers) with distinct non-zero random B, so they
really differ; greedy decoding. Each repeat times, through :class:`agents.generation.HFGenerator`:

  (a) one adapter for all prompts, one batch;
  (b) the mixed batch: prompts / adapters prompts per adapter, all in ONE generate call;
  (c) what a naive user does: one generate call per adapter with its prompts, sequentially;
  (d) the base with adapters disabled, one batch;
  (b') the mixed batch through PEFT's own ``adapter_names=`` path (for comparison; ``--skip-peft`` to omit).

Prints per-repeat and median wall time and generated tokens/s, the ratios b/a and c/b (targets: b/a <= 1.3,
c/b >= 3), and checks that (b) and (c) produce the same tokens for every prompt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from agents.generation import GenerationRequest, HFGenerator  # noqa: E402
from agents.models import load_base  # noqa: E402
from agents.population import LoRAPopulation, randomize_member  # noqa: E402

TOPICS = [
    "Write a Python function that returns the sum of a list.",
    "Explain what a binary search does.",
    "Write a function that checks whether a string is a palindrome.",
    "What is the capital of France? Answer briefly.",
    "Write a Python function to compute the factorial of n.",
    "Give three tips for writing clean code.",
    "Write a function that reverses a linked list.",
    "What is 17 times 23? Show your steps.",
    "Write a Python function that counts vowels in a string.",
    "Describe the difference between a list and a tuple in Python.",
    "Write a function that returns the n-th Fibonacci number.",
    "Explain recursion to a beginner.",
    "Write a function that merges two sorted lists.",
    "What does the len() function do in Python?",
    "Write a function that removes duplicates from a list, keeping order.",
    "Name two sorting algorithms and their complexity.",
]


def _timed(gen: HFGenerator, requests: list[GenerationRequest]) -> tuple[float, int, list]:
    start = time.perf_counter()
    out = gen.generate(requests)
    return time.perf_counter() - start, sum(len(c.token_ids) for c in out), out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--std", type=float, default=0.05, help="std of the random non-zero B matrices")
    parser.add_argument("--skip-peft", action="store_true", help="do not time PEFT's adapter_names path")
    args = parser.parse_args()
    if args.prompts % args.adapters:
        parser.error("--prompts must be a multiple of --adapters")
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    base, tok = load_base(args.model, dtype=args.dtype)
    names = [f"m{i}" for i in range(args.adapters)]
    pop = LoRAPopulation(base, names, rank=8, alpha=16)
    for name in names:
        randomize_member(pop, name, std=args.std, seed=1)
    print(
        f"model {args.model} ({args.dtype}), {args.adapters} adapters rank 8 all-linear, {args.prompts} prompts, "
        f"greedy, {args.new_tokens} new tokens, torch threads {torch.get_num_threads()}, "
        f"setup {time.perf_counter() - t0:.1f} s"
    )
    prompts = [TOPICS[i % len(TOPICS)] for i in range(args.prompts)]
    per = args.prompts // args.adapters
    owner = [names[i // per] for i in range(args.prompts)]

    def req(adapter, prompt):
        return GenerationRequest(adapter, prompt, max_new_tokens=args.new_tokens, temperature=0)

    gen = HFGenerator(pop, tok, batch_size=args.prompts)
    peft_gen = HFGenerator(pop, tok, batch_size=args.prompts, lora_impl="peft")
    one = [req(names[0], p) for p in prompts]
    mixed = [req(a, p) for a, p in zip(owner, prompts, strict=True)]
    base_reqs = [req(None, p) for p in prompts]

    # warm-up (first-call allocations), and adapters really differ on one prompt
    probe = gen.generate([req(n, prompts[0]) for n in names] + [req(None, prompts[0])])
    print(
        f"distinct greedy outputs for one prompt over {len(names)} adapters + base: {len({tuple(c.token_ids) for c in probe})}"
    )

    cases = {"a": [], "b": [], "c": [], "d": [], "b_peft": []}
    tokens = {k: 0 for k in cases}
    agree = None
    for rep in range(args.repeats):
        wall, n, _ = _timed(gen, one)
        cases["a"].append((wall, n))
        wall, n, out_b = _timed(gen, mixed)
        cases["b"].append((wall, n))
        start, n, out_c = time.perf_counter(), 0, []
        for name in names:
            part = [r for r in mixed if r.adapter == name]
            out = gen.generate(part)
            n += sum(len(c.token_ids) for c in out)
            out_c.extend(out)
        cases["c"].append((time.perf_counter() - start, n))
        wall, n, _ = _timed(gen, base_reqs)
        cases["d"].append((wall, n))
        if not args.skip_peft:
            wall, n, out_p = _timed(peft_gen, mixed)
            cases["b_peft"].append((wall, n))
        if agree is None:
            # out_c is ordered adapter by adapter = the order of `mixed` (prompts grouped by owner)
            agree = sum(x.token_ids == y.token_ids for x, y in zip(out_b, out_c, strict=True))
            agree_peft = (
                None
                if args.skip_peft
                else sum(x.token_ids == y.token_ids for x, y in zip(out_b, out_p, strict=True))
            )
        print(f"repeat {rep + 1}: " + "  ".join(f"{k} {v[-1][0]:.2f}s" for k, v in cases.items() if v))
    labels = {
        "a": "(a) one adapter, one batch",
        "b": "(b) mixed adapters, one batch",
        "c": "(c) sequential per-adapter batches",
        "d": "(d) base, adapters disabled",
        "b_peft": "(b') mixed, PEFT adapter_names",
    }
    med = {}
    print(f"\nmedians over {args.repeats} repeats:")
    for key, runs in cases.items():
        if not runs:
            continue
        wall = statistics.median(w for w, _ in runs)
        ntok = statistics.median(n for _, n in runs)
        med[key] = wall
        tokens[key] = ntok
        print(f"  {labels[key]:<38} {wall:7.2f} s   {ntok / wall:7.1f} tok/s   ({ntok:.0f} tokens)")
    print(f"  ratio b/a = {med['b'] / med['a']:.2f}  (target <= 1.3)")
    print(f"  ratio c/b = {med['c'] / med['b']:.2f}  (target >= 3)")
    if "b_peft" in med:
        print(f"  ratio b'/b = {med['b_peft'] / med['b']:.2f}  (PEFT's path vs the fused one)")
    print(f"  (b) vs (c) identical tokens for {agree}/{len(mixed)} prompts", end="")
    print("" if agree_peft is None else f"; (b) vs (b') {agree_peft}/{len(mixed)}")


if __name__ == "__main__":
    main()
