"""Where a fused decode step's time goes, against the memory-bandwidth floor, measured in one process.

    python benchmarks/decode_parts.py [--model smollm2-135m] [--rows 6] [--members 2] [--positions 350]
                                      [--steps 40] [--repeats 5] [--threads 2] [--json FILE]

The decode step of the main job (:class:`agents.generation.fused.FusedDecoder`, the HF loop's default) for
``--rows`` rows spread over ``--members`` LoRA members (rank 8, distinct random B, bound by
``LoRAPopulation.mixed`` as the loop binds them) with ``--positions`` positions already in the loop's decode
cache (:func:`agents.generation.decode._cache_buffers`, the fused layout; random keys and values, 16 positions of
left padding masked), then ``--steps`` more, one token per row each (the same random token ids at every step:
a step's cost does not depend on them):

1. **step**: the median wall time of a step over ``--repeats`` x ``--steps`` steps, no profiler.
2. **floor**: the time to read once, at the same thread count, what a step must read: the base weights the
   step streams (every layer's projections and the LM head) and, separately, those weights plus the keys and
   values it attends over (median of 7 sums over a tensor of that many bytes, ``benchmarks/generation.py``'s
   measure). The issue's target is a step within 2x of the weights' floor.
3. **projections alone**: the same GEMMs the step makes on the base weights (each layer's q/k/v, o, gate/up and
   down through the step's own :class:`agents.generation.fused._Dense`, then the LM head), in the step's order,
   on inputs of the step's shapes, with nothing between them: the median over as many sweeps as timed steps.
   Against the floor this says how far the weights' streaming itself is from it; the step minus this is what
   the rest of the step costs (LoRA, attention, norms, rotary, cache writes, the interpreter).
4. **parts**: one more ``--steps`` steps under ``torch.profiler``; each top-level operation's inclusive CPU
   time goes to a part by its name and the shape of its weight operand:

   * ``projections``: the base weights' GEMMs of every layer (MKL ``mm``/``addmm`` or oneDNN's packed linear);
   * ``lm_head``: the GEMM whose weight has the vocabulary as a dimension;
   * ``lora``: the low-rank products and their row masks (a dimension equal to a bound group's LoRA width,
     ``sum over members of rank x modules``: the weight's smaller dimension for a GEMM);
   * ``attention``: the scores, the softmax and the weighted sum (``baddbmm``, ``softmax``, ``bmm``);
   * ``norms``: the RMSNorms;
   * ``other``: everything else the step calls (rotary, cache writes, SiLU, residual adds, views);
   * ``python``: the profiled step's wall time that no operation accounts for (the interpreter between ops, and
     the profiler's own overhead).

   Profiled times carry the profiler's overhead: read the parts' shares, and compare the projections with the
   floor (one GEMM per projection stream is what a floor-bound step would be made of).

Timings on a shared machine are noisy: run it on a quiet one and read medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from generation import _floor as floor_seconds  # noqa: E402  (the floor benchmarks/generation.py measures)

from agents.generation.decode import _cache_buffers, _RowsLayer  # noqa: E402
from agents.generation.fused import FusedDecoder, fused_unsupported  # noqa: E402
from agents.models import load_base  # noqa: E402
from agents.population import LoRAPopulation, randomize_member  # noqa: E402

PARTS = ("projections", "lm_head", "lora", "attention", "norms", "other", "python")
_GEMMS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::matmul", "aten::linear", "mkldnn::_linear_pointwise"}
_ATTENTION = {"aten::baddbmm", "aten::bmm", "aten::softmax", "aten::_softmax"}
_NORMS = {"aten::rms_norm", "aten::_fused_rms_norm"}
PAD = 16  # left-padding positions masked in every row


def part_of(name: str, shapes: list[list[int]], lora_widths: set[int], vocab: int) -> str:
    """The part (module docstring) a top-level operation of the step belongs to, from its name and input
    shapes: GEMMs by their weight operand (the last 2-D input), the LoRA mask's ``mul_`` by its width."""
    if name in _GEMMS:
        weights = [s for s in shapes if len(s) == 2]
        weight = weights[-1] if weights else []
        if vocab in weight:
            return "lm_head"
        if weight and min(weight) in lora_widths:
            return "lora"
        return "projections"
    if name in _ATTENTION:
        return "attention"
    if name in _NORMS:
        return "norms"
    if name in {"aten::mul_", "aten::mul"} and len(shapes) == 2 and shapes[0] == shapes[1] \
            and len(shapes[0]) == 2 and shapes[0][-1] in lora_widths:
        return "lora"
    return "other"


class Rig:
    """A population bound to ``rows`` rows and a decode cache of ``positions`` positions: :meth:`run` times
    ``steps`` fused decode steps from that state (the cache refilled the same way each time)."""

    def __init__(self, model: str, rows: int, members: int, positions: int, steps: int, seed: int = 0) -> None:
        base, _ = load_base(model, dtype="float32")
        why = fused_unsupported(base)
        if why is not None:
            raise SystemExit(f"decode_parts: the fused step cannot serve {model}: {why}")
        names = [f"m{i}" for i in range(members)]
        self.population = LoRAPopulation(base, names, rank=8, alpha=16)
        for i, name in enumerate(names):
            randomize_member(self.population, name, std=0.05, seed=seed + i)
        self.model = self.population.model.base_model.model
        self.decoder = FusedDecoder(self.model)
        cfg = self.model.config
        self.rows, self.positions, self.steps, self.seed = rows, positions, steps, seed
        self.adapters = [names[i % members] for i in range(rows)]
        self.layers, self.kv_heads = int(cfg.num_hidden_layers), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab = int(cfg.vocab_size)

    def weight_bytes(self) -> int:
        """Bytes of the base weights a step streams: each layer's stacked projections and the LM head."""
        dense = [d for layer in self.decoder.layers for d in layer.dense.values()] + [self.decoder.head]
        return sum(d.t.numel() * d.t.element_size() for d in dense)

    def kv_bytes(self) -> int:
        """Bytes of keys and values a step attends over, at the middle of the timed steps."""
        length = self.positions + self.steps // 2
        return self.rows * self.layers * 2 * self.kv_heads * length * self.head_dim * 4

    def projections_alone(self, sweeps: int) -> list[float]:
        """Seconds of each of ``sweeps`` sweeps over the step's base-weight GEMMs alone (module docstring)."""
        gen = torch.Generator().manual_seed(self.seed)
        first = self.decoder.layers[0].dense
        width = {name: d.t.shape[0] for name, d in first.items()}
        inputs = {name: torch.randn(self.rows, w, generator=gen) for name, w in width.items()}
        head_in = torch.randn(self.rows, self.decoder.head.t.shape[0], generator=gen)
        times = []
        for _ in range(sweeps):
            start = time.perf_counter()
            for layer in self.decoder.layers:
                for name in ("qkv", "o", "gu", "down"):
                    layer.dense[name](inputs[name])
            self.decoder.head(head_in)
            times.append(time.perf_counter() - start)
        return times

    def lora_widths(self) -> set[int]:
        return {lora.a_t.shape[1] for layer in self.decoder.layers for lora in layer.lora.values()
                if lora is not None}

    def _cache(self) -> list[_RowsLayer]:
        gen = torch.Generator().manual_seed(self.seed)
        like = torch.empty(self.rows, self.kv_heads, 1, self.head_dim)
        layers = []
        capacity = self.positions + self.steps + 1
        for _ in range(self.layers):
            keys, values = _cache_buffers(like, self.rows, capacity, fused=True)
            keys.normal_(generator=gen)
            values.normal_(generator=gen)
            layers.append(_RowsLayer(keys, values, self.positions))
        return layers

    def run(self, profiler=None) -> list[float]:
        """Seconds of each of ``steps`` decode steps; ``profiler`` (a ``torch.profiler.profile``) is started right
        before the first step and stopped after the last, so that it records the steps alone."""
        cache = self._cache()
        gen = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(0, self.vocab, (self.rows,), generator=gen)
        mask = torch.ones(self.rows, self.positions + self.steps + 1, dtype=torch.long)
        mask[:, :PAD] = 0
        times = []
        with self.population.mixed(self.adapters):
            self.decoder.bind()
            if profiler is not None:
                profiler.start()
            for s in range(self.steps):
                pos = torch.full((self.rows,), self.positions - PAD + s)
                start = time.perf_counter()
                self.decoder.step(ids, pos, mask[:, : self.positions + s + 1], cache)
                times.append(time.perf_counter() - start)
            if profiler is not None:
                profiler.stop()
        return times


def parts(rig: Rig) -> tuple[dict[str, float], list[float], dict[str, float]]:
    """Seconds per step of each part (module docstring) over one profiled run, that run's step times, and the
    eight costliest operations of ``other`` (seconds per step)."""
    from torch.profiler import ProfilerActivity, profile

    widths = rig.lora_widths()
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    times = rig.run(prof)
    totals: dict[str, float] = defaultdict(float)
    others: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.cpu_parent is not None:
            continue
        part = part_of(event.name, [list(s) for s in event.input_shapes], widths, rig.vocab)
        totals[part] += event.cpu_time_total / 1e6
        if part == "other":
            others[event.name] += event.cpu_time_total / 1e6 / rig.steps
    per_step = {p: totals.get(p, 0.0) / rig.steps for p in PARTS if p != "python"}
    per_step["python"] = max(sum(times) / rig.steps - sum(per_step.values()), 0.0)
    return per_step, times, dict(sorted(others.items(), key=lambda kv: -kv[1])[:8])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=6, help="rows in the decode batch (the main job: 2-16)")
    parser.add_argument("--members", type=int, default=2, help="LoRA members the rows are spread over")
    parser.add_argument("--positions", type=int, default=350, help="positions already in the decode cache")
    parser.add_argument("--steps", type=int, default=40, help="decode steps per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs without the profiler")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    for name in ("rows", "members", "positions", "steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.positions <= PAD:
        parser.error(f"--positions must exceed the {PAD} padded positions")
    torch.set_num_threads(args.threads)
    rig = Rig(args.model, args.rows, args.members, args.positions, args.steps)
    rig.run()  # warm-up: first-call allocations
    steps: list[float] = []
    for _ in range(args.repeats):
        steps += rig.run()
    step = statistics.median(steps)
    rig.projections_alone(3)  # warm-up
    alone = statistics.median(rig.projections_alone(len(steps)))
    by_part, profiled_steps, others = parts(rig)
    profiled = statistics.median(profiled_steps)
    weights, kv = rig.weight_bytes(), rig.kv_bytes()
    floor_w = floor_seconds(weights, args.threads)
    floor_wkv = floor_seconds(weights + kv, args.threads)
    torch.set_num_threads(args.threads)
    out = {
        "model": args.model, "rows": args.rows, "members": args.members, "positions": args.positions,
        "threads": args.threads, "step_s": step, "steps_timed": len(steps),
        "weights_bytes": weights, "kv_bytes": kv, "floor_weights_s": floor_w, "floor_weights_kv_s": floor_wkv,
        "step_over_floor": step / floor_w, "projections_alone_s": alone,
        "projections_alone_over_floor": alone / floor_w, "profiled_step_s": profiled,
        "profiled_mean_s": statistics.fmean(profiled_steps), "parts_s": by_part, "other_ops_s": others,
        "load_average": os.getloadavg()[0],
    }
    print(f"{args.model}: fused decode step, {args.rows} rows over {args.members} members, {args.positions} cached "
          f"positions, {args.threads} threads (load average {out['load_average']:.1f})")
    print(f"step: median {step * 1e3:.1f} ms over {len(steps)} steps (no profiler)")
    print(f"floor: the weights ({weights / 1e9:.3f} GB) {floor_w * 1e3:.1f} ms; with the keys and values "
          f"({(weights + kv) / 1e9:.3f} GB) {floor_wkv * 1e3:.1f} ms; step / weights' floor "
          f"{step / floor_w:.2f}x (target <= 2x), step / both {step / floor_wkv:.2f}x")
    print(f"projections alone (the step's base-weight GEMMs, nothing between them): {alone * 1e3:.1f} ms = "
          f"{alone / floor_w:.2f}x the weights' floor; the rest of the step {(step - alone) * 1e3:.1f} ms")
    print(f"parts (ms per step under the profiler, whose overhead makes its step {profiled * 1e3:.1f} ms; small "
          "operations are inflated most):")
    for name in PARTS:
        seconds = by_part[name]
        print(f"  {name:12s} {seconds * 1e3:7.2f}  {100 * seconds / max(sum(by_part.values()), 1e-12):5.1f} %")
    print("  other, by operation: " + ", ".join(f"{k.removeprefix('aten::')} {v * 1e3:.2f}" for k, v in others.items()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
