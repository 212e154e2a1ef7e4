"""One self-play step by phase, and its update replayed with the prefix-shared and the padded layout.

    python benchmarks/step.py [--preset cpu-smoke] [--model smollm2-135m] [--steps 1] [--repeats 1]
                              [--out FILE.json]

1. **A step by phase**: builds the preset's run (``selfplay.loop.SelfPlayLoop``, the real model by default,
   the preset's values unchanged except ``--steps``) in a temporary directory and plays ``--steps`` steps;
   prints each step's seconds split into generation / sandbox / update / other (evolution, bookkeeping).
   Step 1 carries first-call warm-ups.
2. **The same rollouts, five ways**: every member update of step 1 is recorded (its rollouts, the adapter
   and optimizer state before it) and replayed ``--repeats`` times per layout, the layouts alternating
   member by member (``TrainerConfig.packing`` = "none": one right-padded row per rollout, the layout before
   packing; "prefix": each unique prompt once, unpadded, ``agents.packing``, with tree attention, the default;
   "mask": the same packed layout with one dense SDPA call over the tree mask, ``packed_attention="mask"``;
   "peft": the packed layout with PEFT's LoRA forward instead of the fused one-``addmm`` LoRA,
   ``lora_impl="peft"``; "skip": the default packed layout leaving rows with all-zero advantages out of the
   passes, ``skip_zero_advantage``, which the other four keep in so that they compare the same work), each from
   the recorded state.
   Prints per member and in total: the decoder's token slots (``PolicyGradientTrainer.forward_tokens``),
   prompt tokens unshared (sum over rollouts) vs each equal prompt once vs each common prefix once (what
   the packed layout forwards), completion tokens, the
   median update seconds of each layout and their ratios, and max |delta| between the adapters (and the AdamW
   moments) the layouts produce.

Timings on a shared machine are noisy: read the ratios, measured side by side in this one process.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from agents.packing import prefix_shared_tokens, prompt_groups  # noqa: E402
from agents.trainer import PolicyGradientTrainer  # noqa: E402
from selfplay.config import load_preset  # noqa: E402
from selfplay.loop import SelfPlayLoop  # noqa: E402

PHASES = ("generation", "sandbox", "update", "other")


def _phases(times: dict[str, float]) -> dict[str, float]:
    out = {k: times.get(k, 0.0) for k in ("generation", "sandbox", "update")}
    out["other"] = times["step"] - sum(out.values())
    out["step"] = times["step"]
    return out


def _max_delta(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _opt_delta(a: dict | None, b: dict | None) -> float:
    if a is None or b is None:
        return float("nan")
    out = 0.0
    for pid, st in a["state"].items():
        for key, v in st.items():
            if torch.is_tensor(v) and v.is_floating_point():
                out = max(out, float((v - b["state"][pid][key]).abs().max()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-smoke")
    parser.add_argument("--model", default=None, help="default: the preset's")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="replays per layout and member")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--members", nargs="*", default=None,
                        help="replay only these members' updates (default: all; a loaded machine may need fewer)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be >= 1")

    cfg = load_preset(args.preset)
    cfg = dataclasses.replace(cfg, steps=args.steps, **({"model": args.model} if args.model else {}))
    cfg.validate()
    report: dict = {"preset": args.preset, "model": cfg.model, "torch_threads": None, "steps": [], "members": {}}
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        loop = SelfPlayLoop(cfg, Path(tmp) / "run")
        t0 = time.perf_counter()
        loop.setup()
        report["setup_seconds"] = time.perf_counter() - t0
        report["torch_threads"] = torch.get_num_threads()
        pop, trainer = loop.population, loop.trainer
        print(f"{args.preset} on {cfg.model}: {len(pop.names)} members, packing {cfg.trainer.packing!r}, "
              f"torch threads {torch.get_num_threads()}, setup {report['setup_seconds']:.1f} s", flush=True)

        recorded: list[tuple] = []
        real_update = trainer.update

        def recording_update(member, rollouts):
            if loop.step == 0:  # step 1's updates
                recorded.append((member, list(rollouts), pop.state(member),
                                 copy.deepcopy(pop.optimizer_state_dict(member))))
            return real_update(member, rollouts)

        trainer.update = recording_update
        for _ in range(args.steps):
            record = loop.train_step()
            ph = _phases(record.times)
            report["steps"].append(ph | {"zero_advantage_members": sorted(
                m for m, mm in record.member_metrics.items() if mm.get("zero_advantage_steps"))})
            if args.out:
                args.out.write_text(json.dumps(report, indent=2) + "\n")
            print(f"step {record.step}: {ph['step']:.1f} s = " + " + ".join(f"{k} {ph[k]:.1f}" for k in PHASES)
                  + f"; members with all advantages zero (no forward/backward): "
                  f"{report['steps'][-1]['zero_advantage_members']}", flush=True)
        trainer.update = real_update

        # replay step 1's updates with each layout, alternating, from the recorded states
        # (zero-advantage updates are computed too here: the layouts are compared on the same work)
        layouts = {"none": {"packing": "none"}, "prefix": {"packing": "prefix"},
                   "mask": {"packing": "prefix", "packed_attention": "mask"},
                   "peft": {"packing": "prefix", "lora_impl": "peft"},
                   "skip": {"packing": "prefix", "skip_zero_advantage": True}}
        trainers = {k: PolicyGradientTrainer(pop, dataclasses.replace(cfg.trainer, **({"skip_zero_advantage": False}
                                                                                      | v)))
                    for k, v in layouts.items()}
        totals = {k: {"seconds": 0.0, "tokens": 0} for k in trainers}
        counts = {"prompt_unshared": 0, "prompt_shared": 0, "prompt_prefix_shared": 0, "completion": 0}
        worst = {"adapter": 0.0, "moments": 0.0}
        if args.members is not None:
            recorded = [r for r in recorded if r[0] in args.members]
        for member, rollouts, state, opt_state in recorded:
            prompts = [list(r.prompt_ids) for r in rollouts]
            row = {
                "rollouts": len(rollouts),
                "prompt_unshared": sum(map(len, prompts)),
                "prompt_shared": sum(len(prompts[g[0]]) for g in prompt_groups(prompts)),
                "prompt_prefix_shared": prefix_shared_tokens(prompts),
                "completion": sum(len(r.completion_ids) for r in rollouts),
            }
            for k in counts:
                counts[k] += row[k]
            results: dict[str, dict] = {k: {"seconds": []} for k in trainers}
            for _ in range(args.repeats):
                for layout, tr in trainers.items():
                    pop.load_state(member, state)
                    pop.load_optimizer_state_dict(member, copy.deepcopy(opt_state))
                    tok0 = tr.forward_tokens
                    t0 = time.perf_counter()
                    tr.update(member, rollouts)
                    results[layout]["seconds"].append(time.perf_counter() - t0)
                    results[layout]["tokens"] = tr.forward_tokens - tok0
                    results[layout]["state"] = pop.state(member)
                    results[layout]["opt"] = copy.deepcopy(pop.optimizer_state_dict(member))
            for layout in trainers:
                row[f"{layout}_seconds"] = statistics.median(results[layout]["seconds"])
                row[f"{layout}_tokens"] = results[layout]["tokens"]
                totals[layout]["seconds"] += row[f"{layout}_seconds"]
                totals[layout]["tokens"] += row[f"{layout}_tokens"]
            row["max_abs_delta_adapter"] = _max_delta(results["none"]["state"], results["prefix"]["state"])
            row["max_abs_delta_tree_vs_mask"] = _max_delta(results["mask"]["state"], results["prefix"]["state"])
            row["max_abs_delta_fused_vs_peft"] = _max_delta(results["peft"]["state"], results["prefix"]["state"])
            row["max_abs_delta_skip_vs_all_rows"] = _max_delta(results["skip"]["state"], results["prefix"]["state"])
            row["max_abs_delta_moments"] = _opt_delta(results["none"]["opt"], results["prefix"]["opt"])
            worst["adapter"] = max(worst["adapter"], row["max_abs_delta_adapter"])
            worst["moments"] = max(worst["moments"], row["max_abs_delta_moments"])
            report["members"][member] = row
            if args.out:  # as it goes: a run stopped by a time limit keeps what it measured
                args.out.write_text(json.dumps(report, indent=2) + "\n")
            print(f"  {member}: {row['rollouts']} rollouts, prompt tokens {row['prompt_unshared']} unshared / "
                  f"{row['prompt_shared']} equal prompts once / {row['prompt_prefix_shared']} prefixes once, completion {row['completion']}; decoder token slots "
                  f"padded {row['none_tokens']} vs packed {row['prefix_tokens']} "
                  f"({row['prefix_tokens'] / max(row['none_tokens'], 1):.2f}x); update {row['none_seconds']:.2f} s vs "
                  f"{row['prefix_seconds']:.2f} s (dense-mask attention {row['mask_seconds']:.2f} s, PEFT's LoRA "
                  f"{row['peft_seconds']:.2f} s, zero-advantage rows skipped {row['skip_seconds']:.2f} s with "
                  f"{row['skip_tokens']} token slots); max|delta| adapter {row['max_abs_delta_adapter']:.2e} (tree vs mask "
                  f"{row['max_abs_delta_tree_vs_mask']:.2e}, fused vs PEFT LoRA {row['max_abs_delta_fused_vs_peft']:.2e}, skip vs all rows "
                  f"{row['max_abs_delta_skip_vs_all_rows']:.2e})",
                  flush=True)
    report["update"] = {"totals": totals, "counts": counts, "max_abs_delta": worst, "repeats": args.repeats}
    if recorded:
        ratio_tok = totals["prefix"]["tokens"] / max(totals["none"]["tokens"], 1)
        ratio_s = totals["prefix"]["seconds"] / max(totals["none"]["seconds"], 1e-9)
        ratio_tree = totals["prefix"]["seconds"] / max(totals["mask"]["seconds"], 1e-9)
        ratio_lora = totals["prefix"]["seconds"] / max(totals["peft"]["seconds"], 1e-9)
        ratio_skip = totals["skip"]["seconds"] / max(totals["prefix"]["seconds"], 1e-9)
        ratio_skip_tok = totals["skip"]["tokens"] / max(totals["prefix"]["tokens"], 1)
        report["update"] |= {"token_ratio": ratio_tok, "time_ratio": ratio_s, "tree_vs_mask_time_ratio": ratio_tree,
                             "fused_vs_peft_lora_time_ratio": ratio_lora, "skip_vs_all_rows_time_ratio": ratio_skip,
                             "skip_vs_all_rows_token_ratio": ratio_skip_tok}
        print(f"update of step 1, all members: decoder token slots padded {totals['none']['tokens']} vs packed "
              f"{totals['prefix']['tokens']} = {ratio_tok:.2f}x; prompt tokens {counts['prompt_unshared']} unshared "
              f"vs {counts['prompt_shared']} equal prompts once vs {counts['prompt_prefix_shared']} prefixes once, completion tokens {counts['completion']}; seconds padded "
              f"{totals['none']['seconds']:.1f} vs packed {totals['prefix']['seconds']:.1f} = {ratio_s:.2f}x; "
              f"max|delta| adapters {worst['adapter']:.2e}, AdamW moments {worst['moments']:.2e}; packed with tree "
              f"attention vs the dense mask {totals['prefix']['seconds']:.1f} vs {totals['mask']['seconds']:.1f} s = "
              f"{ratio_tree:.2f}x; fused LoRA vs PEFT's forward {totals['prefix']['seconds']:.1f} vs "
              f"{totals['peft']['seconds']:.1f} s = {ratio_lora:.2f}x; zero-advantage rows skipped vs computed "
              f"{totals['skip']['seconds']:.1f} vs {totals['prefix']['seconds']:.1f} s = {ratio_skip:.2f}x (token slots "
              f"{totals['skip']['tokens']} vs {totals['prefix']['tokens']} = {ratio_skip_tok:.2f}x)")
    else:
        print("no member was updated in step 1 (no rollouts): nothing to replay")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
