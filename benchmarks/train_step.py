"""Cost of one policy-gradient update per population member, population of 1 vs 4, on the offline model.

    python benchmarks/train_step.py [--model smollm2-135m] [--pops 1 4] [--rollouts 8] [--prompt-len 64]
                                    [--completion-len 64] [--repeats 3] [--micro-batch-size 8]
                                    [--advantage reinforce_pp_baseline] [--gradient-checkpointing]
                                    [--threads N]

For each population size P: a ``LoRAPopulation`` of P members (rank 8, alpha 16, all linear layers of the
decoder) on a fresh copy of the base, one ``PolicyGradientTrainer`` with the default ``TrainerConfig``
(one AdamW step per batch, token-mean loss, grad-clip 1.0). Each member gets ``--rollouts`` rollouts of
random tokens (``--prompt-len`` prompt + ``--completion-len`` completion tokens, rewards in [0, 1], groups of
4). One warm-up round updates every member once (creates the optimizers); then ``--repeats`` rounds update
every member once each. Prints the median and all timings of a member-update per population size, and the
ratio median(P=4) / median(P=1): how much a member-update slows down when other adapters share the base.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from agents.models import load_base  # noqa: E402
from agents.population import LoRAPopulation  # noqa: E402
from agents.rollout import Rollout  # noqa: E402
from agents.trainer import PolicyGradientTrainer, TrainerConfig  # noqa: E402


def make_rollouts(n: int, prompt_len: int, completion_len: int, vocab: int, seed: int) -> list[Rollout]:
    rng = random.Random(seed)
    return [
        Rollout(
            prompt_ids=[rng.randrange(vocab) for _ in range(prompt_len)],
            completion_ids=[rng.randrange(vocab) for _ in range(completion_len)],
            reward=rng.random(),
            group=i // 4,
        )
        for i in range(n)
    ]


def bench(base, pop_size: int, args) -> list[float]:
    names = [f"m{i}" for i in range(pop_size)]
    pop = LoRAPopulation(copy.deepcopy(base), names, rank=8, alpha=16)
    cfg = TrainerConfig(
        advantage=args.advantage,
        micro_batch_size=args.micro_batch_size,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    trainer = PolicyGradientTrainer(pop, cfg)
    vocab = base.config.vocab_size
    times: list[float] = []
    for round_ in range(args.repeats + 1):
        for k, name in enumerate(names):
            rollouts = make_rollouts(
                args.rollouts, args.prompt_len, args.completion_len, vocab, 1000 * round_ + k
            )
            start = time.perf_counter()
            metrics = trainer.update(name, rollouts)
            elapsed = time.perf_counter() - start
            if round_ > 0:
                times.append(elapsed)
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"  P={pop_size} {label} {name}: {elapsed:.2f}s  tokens {metrics['tokens']:.0f}  "
                f"loss {metrics['loss']:+.4f}  grad_norm {metrics['grad_norm']:.3f}",
                flush=True,
            )
    del trainer, pop
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--pops", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--advantage", default="reinforce_pp_baseline")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base, _tok = load_base(args.model)
    print(
        f"model {args.model} ({sum(p.numel() for p in base.parameters()) / 1e6:.0f}M params, fp32), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; per member-update: {args.rollouts} "
        f"rollouts x ({args.prompt_len} prompt + {args.completion_len} completion) tokens, micro-batch "
        f"{args.micro_batch_size}, gradient checkpointing {args.gradient_checkpointing}"
    )
    medians: dict[int, float] = {}
    for pop_size in args.pops:
        times = bench(base, pop_size, args)
        medians[pop_size] = statistics.median(times)
        print(
            f"P={pop_size}: median {medians[pop_size]:.2f}s per member-update over {len(times)} "
            f"[{', '.join(f'{t:.2f}' for t in times)}]",
            flush=True,
        )
    if 1 in medians and 4 in medians:
        print(f"ratio median(P=4) / median(P=1) = {medians[4] / medians[1]:.2f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.2f} GiB")


if __name__ == "__main__":
    main()
