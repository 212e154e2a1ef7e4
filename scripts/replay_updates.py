"""Replay a fixed sequence of policy-gradient updates (and one generation) on the tiny-random base and save what
they produce, so that a refactor of ``agents/`` can be checked bit for bit against the code before it.

    python scripts/replay_updates.py --out after.pt              # this checkout's results
    python scripts/replay_updates.py --compare before.pt after.pt  # equal bit for bit? (exit 1 if not)

Everything both files hold must be equal bit for bit; what only AFTER holds (a trainer setting or a metric the
newer code added) is listed as added and does not fail the comparison (``--strict`` makes it fail); what only
BEFORE holds fails it.

To get ``before.pt``, run this file with the older code first on the path (e.g. ``git archive <commit> | tar
-x -C /tmp/before`` and ``PYTHONPATH=/tmp/before python scripts/replay_updates.py --out before.pt``); it uses
public names only (``LoRAPopulation``, ``PolicyGradientTrainer``, ``TrainerConfig``, ``HFGenerator``).

Each trainer setting (both update layouts, dense-mask and tree attention, PEFT and fused LoRA, the
zero-advantage skip on and off, mini-batches and epochs, micro-batches with checkpointing, an entropy bonus
with KL as a loss, KL in the reward, the generator's behaviour log-probs, a mixed-role batch, several
aggregation modes and estimators) trains member ``ma`` of a fresh population on three batches, one of which
holds a group of equal rewards (all-zero advantages under a group baseline), then member ``mb`` on one batch.
Saved per setting: every member's adapter tensors and AdamW state after each update, and the update's metrics
(its wall time left out). The generation: greedy and sampled completions of three requests by the default
``HFGenerator`` (token ids and log-probs). One intra-op thread, so the float sums are the same run to run.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: older code may come first

import torch  # noqa: E402

SETTINGS: dict[str, dict] = {
    "default": {},
    "padded": {"packing": "none"},
    "mask": {"packed_attention": "mask"},
    "peft": {"lora_impl": "peft"},
    "no-skip": {"skip_zero_advantage": False},
    "mini-epochs": {"mini_batch_size": 4, "epochs": 2},
    "mini-epochs-padded": {"mini_batch_size": 4, "epochs": 2, "packing": "none"},
    "grpo-mini-epochs": {"advantage": "grpo", "mini_batch_size": 4, "epochs": 2},
    "micro-checkpointing": {"micro_batch_size": 3, "gradient_checkpointing": True},
    "chunks": {"logprob_chunk_size": 3},
    "entropy-kl-loss": {"entropy_coef": 0.01, "kl_mode": "loss", "kl_coef": 0.1,
                        "loss_agg_mode": "seq-mean-token-mean"},
    "kl-reward": {"kl_mode": "reward", "kl_coef": 0.05, "mini_batch_size": 6},
    "behaviour": {"use_behaviour_logprobs": True, "mini_batch_size": 6},
    "roles-balanced": {"role_weighting": "balanced", "loss_agg_mode": "seq-mean-token-sum"},
    "grpo-roles-tokens": {"advantage": "grpo", "role_weighting": "tokens"},
    "dr-grpo": {"advantage": "dr_grpo", "loss_agg_mode": "seq-mean-token-sum-norm", "norm_len": 12},
    "rloo-padded": {"advantage": "rloo", "packing": "none", "micro_batch_size": 2},
    "row-cap": {"max_tokens_per_row": 40},
    "row-cap-padded": {"max_tokens_per_row": 40, "packing": "none"},
    "tis": {"is_correction": "tis", "is_cap": 1.5},
    "mis-mini-epochs": {"is_correction": "mis", "is_cap": 1.5, "mini_batch_size": 6, "epochs": 2},
}


def _batch(seed: int, flat_group: bool, roles: bool, vocab: int = 1000):
    """Students' shape: 3 attempts at each of 4 prompts (two share their first 5 tokens), completions of 1-8
    tokens; with ``flat_group`` group 0's rewards are equal; with ``roles`` rows alternate proposer/solver."""
    from agents.rollout import Rollout

    rng = random.Random(seed)
    shared = [rng.randrange(vocab) for _ in range(5)]
    out = []
    for g in range(4):
        prompt = (shared if g % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randint(6, 12))]
        for k in range(3):
            completion = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
            reward = 0.5 if flat_group and g == 0 else rng.random()
            logprobs = [-rng.random() * 3 for _ in completion]
            meta = {"role": ("proposer", "solver")[k % 2]} if roles else {}
            out.append(Rollout(prompt, completion, reward, group=g, scope=("solver", g % 2), logprobs=logprobs,
                               meta=meta))
    rng.shuffle(out)
    return out


def _population(model):
    import copy

    from agents.population import LoRAPopulation, randomize_member

    pop = LoRAPopulation(copy.deepcopy(model), ["ma", "mb"], rank=4, alpha=8, seed=0)
    for name in pop.names:
        randomize_member(pop, name, std=0.5, seed=0)
    return pop


def _replay(model, extra: dict) -> dict:
    from agents.trainer import PolicyGradientTrainer, TrainerConfig

    pop = _population(model)
    trainer = PolicyGradientTrainer(pop, TrainerConfig(lr=1e-2, weight_decay=0.1, **extra))
    out: dict = {"updates": []}
    roles = "role_weighting" in extra
    for member, seed, flat in (("ma", 1, True), ("ma", 2, False), ("ma", 3, True), ("mb", 4, True)):
        metrics = trainer.update(member, _batch(seed, flat, roles))
        metrics.pop("seconds", None)
        out["updates"].append({
            "metrics": metrics,
            "state": {name: pop.state(name) for name in pop.names},
            "optimizer": pop.optimizer_state_dict(member)["state"],
        })
    out["forward_tokens"] = trainer.forward_tokens
    return out


def _generation(model, tokenizer) -> list:
    from agents.generation.base import GenerationRequest
    from agents.generation.hf import HFGenerator

    pop = _population(model)
    requests = [GenerationRequest("ma", "def f(x):", max_new_tokens=8, n=3, seed=1, chat=False),
                GenerationRequest("mb", "Solve this: def f(x):", max_new_tokens=6, n=2, seed=2, chat=False),
                GenerationRequest("ma", "Hello", max_new_tokens=7, n=1, temperature=0.0, chat=False)]
    return [(c.token_ids, c.logprobs, c.finish_reason) for c in HFGenerator(pop, tokenizer).generate(requests)]


def collect() -> dict:
    """Every setting this code's ``TrainerConfig`` has the fields of (an older checkout lacks the newer ones: those
    settings are left out, and ``--compare`` lists them as added), and the generation."""
    import dataclasses

    from agents.models import load_base
    from agents.trainer import TrainerConfig

    torch.set_num_threads(1)
    model, tokenizer = load_base("tiny-random")
    known = {f.name for f in dataclasses.fields(TrainerConfig)}
    results = {name: _replay(model, extra) for name, extra in SETTINGS.items() if set(extra) <= known}
    results["generation"] = _generation(model, tokenizer)
    return results


def _same(a, b, where: str, diffs: list[str], added: list[str]) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b)):
            diffs.append(where)
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) - set(b):
            diffs.append(f"{where}: keys missing after {sorted(set(a) - set(b), key=str)}")
        added += [f"{where}.{k}" for k in sorted(set(b) - set(a), key=str)]
        for k in set(a) & set(b):
            _same(a[k], b[k], f"{where}.{k}", diffs, added)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            diffs.append(f"{where}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _same(x, y, f"{where}[{i}]", diffs, added)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    elif a != b or type(a) is not type(b):
        diffs.append(f"{where}: {a!r} vs {b!r}")


def compare(before: dict, after: dict) -> tuple[list[str], list[str]]:
    """``(diffs, added)``: the paths where ``after`` differs from ``before`` (tensors bit for bit, floats exactly,
    NaN == NaN; a key ``before`` has and ``after`` lacks), and the keys only ``after`` has."""
    diffs: list[str] = []
    added: list[str] = []
    _same(before, after, "", diffs, added)
    return diffs, added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="save this checkout's results here")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--strict", action="store_true", help="with --compare: keys only AFTER has fail it too")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (torch.load(p, weights_only=False) for p in args.compare)
        diffs, added = compare(before, after)
        print("\n".join(diffs[:40]) if diffs else f"equal bit for bit: {len(before) - 1} trainer settings and "
              "the generation")
        if added:
            names = sorted({a.rsplit(".", 1)[-1] for a in added})
            print(f"added after (not in BEFORE, {len(added)} places): {', '.join(names)}")
        return 1 if diffs or (args.strict and added) else 0
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    import agents

    print(f"code: {Path(agents.__file__).resolve().parent.parent}")
    torch.save(collect(), args.out)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
