"""Time per child of every LoRA weight-space operator on a Qwen2.5-7B-shaped adapter, side by side.

    python benchmarks/evolution.py [--layers 28] [--rank 32] [--repeats 3] [--threads N]
                                   [--ties-layers 1] [--dense-shapes q,k,gate,down] [--skip-lucidrains]
                                   [--skip-peft] [--skip-dense] [--omp-wait-policy PASSIVE]

The adapter: 28 layers × (q, k, v, o, gate, up, down), rank 32, float32, hidden 3584, intermediate 18944, 4 KV
heads × head dim 128 (k/v out 512): 196 modules, 80.7M parameters. Two parents with PEFT-init A
(``U(±1/√d_in)``) and Gaussian B (a "trained" adapter). In the same process it times:

* ours: every registered operator except ``ties`` (median of ``--repeats`` after one warm-up call); ``ties`` on
  ``--ties-layers`` layers, scaled to the whole adapter (it forms every module's dense ΔW; exempt from the target);
* lucidrains' ``populora`` (PyPI) operators where they correspond (M1–M4, X1–X4, average, clone), on a
  3-individual population in his ``[P, d, r]`` layout (skipped with a message if not importable);
* PEFT ``merge_utils`` ``ties`` / ``dare_linear`` applied to the factors of every module (what
  ``add_weighted_adapter`` does for those combination types);
* the dense route on one module of each shape (``--dense-shapes``): ΔW = B·A, full ``torch.linalg.svd``, and
  TIES on the dense ΔW, with the whole-adapter estimate (Σ over modules);
* the floors: ``clone`` and ``randn`` (one generator) of the whole adapter, printed first and last as a noise
  reference for the shared machine.

Targets: every operator but ``ties`` ≤ 1 s per child; each SVD-based one faster than its lucidrains counterpart.
``OMP_WAIT_POLICY`` defaults to PASSIVE here (set before torch is imported; ``--omp-wait-policy default`` keeps
the OpenMP default): on an oversubscribed machine OpenMP's spin-waiting made every multi-threaded torch program
(ours and lucidrains' alike) 10–30× slower in wall time; with PASSIVE both measure their own work.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path


def _early_policy() -> str:
    policy = "PASSIVE"
    for i, a in enumerate(sys.argv):
        if a == "--omp-wait-policy" and i + 1 < len(sys.argv):
            policy = sys.argv[i + 1]
        elif a.startswith("--omp-wait-policy="):
            policy = a.split("=", 1)[1]
    if policy.lower() != "default":
        os.environ["OMP_WAIT_POLICY"] = policy
    return os.environ.get("OMP_WAIT_POLICY", "default")


_POLICY = _early_policy()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from evolution.operators import (  # noqa: E402
    GRAM_STATS,
    TIES_TIMINGS,
    get_operator,
    gram_precision,
    kth_largest,
    list_operators,
    ties_merge,
)
from evolution.ties import topr_dense  # noqa: E402

SHAPES = {  # name -> (d_out, d_in) for Qwen2.5-7B
    "self_attn.q_proj": (3584, 3584),
    "self_attn.k_proj": (512, 3584),
    "self_attn.v_proj": (512, 3584),
    "self_attn.o_proj": (3584, 3584),
    "mlp.gate_proj": (18944, 3584),
    "mlp.up_proj": (18944, 3584),
    "mlp.down_proj": (3584, 18944),
}
SHORT = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "gate": "mlp.gate_proj", "down": "mlp.down_proj"}
SLOW_S = 4.0  # a call slower than this is measured once


def make_adapter(seed: int, layers: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for layer in range(layers):
        for name, (d_out, d_in) in SHAPES.items():
            prefix = f"base_model.model.model.layers.{layer}.{name}"
            bound = 1 / math.sqrt(d_in)
            state[f"{prefix}.lora_A.weight"] = torch.empty(rank, d_in).uniform_(-bound, bound, generator=g)
            state[f"{prefix}.lora_B.weight"] = torch.randn(d_out, rank, generator=g) * 0.01
    return state


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, int, float]:
    """``(median wall s, calls, median process-CPU s)`` of ``fn`` over ``repeats`` calls after one warm-up; one
    call if it is slow. CPU time (all threads of the process) is printed because the machine is shared."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    if first > SLOW_S or repeats <= 0:
        return first, 1, first_cpu
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), len(walls), statistics.median(cpus)


def floors(p1: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    clone, _, _ = measure(lambda: {k: v.clone() for k, v in p1.items()}, repeats)
    randn, _, _ = measure(
        lambda: {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in p1.items()}, repeats
    )
    return clone, randn


# --------------------------------------------------------------------------------------------- lucidrains


def load_lucidrains():
    """lucidrains' ``populora.operators`` without its package ``__init__`` (which needs gym/video extras)."""
    try:
        spec = importlib.util.find_spec("populora")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return (
            None,
            "not installed (pip install -c constraints.txt --no-deps populora einops torch-einops-utils)",
        )
    if "populora" not in sys.modules:
        pkg = types.ModuleType("populora")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["populora"] = pkg
    try:
        import populora.operators as lops  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - any import failure means "skip"
        return None, f"import failed: {type(e).__name__}: {e}"
    from importlib.metadata import version  # noqa: PLC0415

    return lops, f"populora {version('populora')}"


class LucidPopulation:
    """The attributes lucidrains' operators read: ``weight_down [P, d_in, r]`` (= Aᵀ), ``weight_up [P, d_out, r]``."""

    def __init__(self, states: list[dict[str, torch.Tensor]]):
        self.device = torch.device("cpu")
        self.weight_down: dict[str, torch.nn.Parameter] = {}
        self.weight_up: dict[str, torch.nn.Parameter] = {}
        for key in states[0]:
            if ".lora_A." not in key:
                continue
            name = key.replace(".lora_A.weight", "").replace(".", "_")
            bkey = key.replace(".lora_A.", ".lora_B.")
            self.weight_down[name] = torch.nn.Parameter(
                torch.stack([s[key].mT.contiguous() for s in states]), requires_grad=False
            )
            self.weight_up[name] = torch.nn.Parameter(
                torch.stack([s[bkey] for s in states]), requires_grad=False
            )


LUCID_MAP = {  # ours -> (kind, lucidrains name, kwargs)
    "svd_mutation": ("mutation", "svd_structured", {"epsilon": 0.1}),
    "layer_mutation": ("mutation", "layer_selective_gaussian", {"epsilon": 0.1, "f": 0.33}),
    "component_mask": ("mutation", "component_masking", {"rho": 0.3}),
    "adaptive_noise": ("mutation", "full_gaussian", {"epsilon": 0.15}),
    "dare": ("crossover", "dare", {"p": 0.7}),
    "layer_crossover": ("crossover", "layer_wise", {}),
    "svd_crossover": ("crossover", "svd_subspace", {}),
    "extrapolate": ("crossover", "extrapolative", {}),
    "linear_0_5": ("crossover", "average", {}),
    "copy_parent": ("crossover", "clone", {}),
}


def lucid_call(lops, pop: LucidPopulation, ours: str) -> Callable[[], None]:
    kind, name, kw = LUCID_MAP[ours]
    child = torch.tensor([2])
    parents = torch.tensor([[0, 1]])
    fitness = torch.tensor([0.0, 1.0, 0.0])
    if kind == "mutation":
        fn = lops.MUTATION_REGISTRY[name]
        return lambda: fn(pop, child, **kw)
    fn = lops.CROSSOVER_REGISTRY[name]
    if name == "clone":
        return lambda: fn(pop, parents[:, :1], child)
    return lambda: fn(pop, parents, child, fitnesses=fitness, **kw)


# ---------------------------------------------------------------------------------------------------- PEFT


def peft_factor_call(p1, p2, combination: str) -> Callable[[], dict[str, torch.Tensor]]:
    from peft.utils import merge_utils  # noqa: PLC0415

    weights = torch.tensor([1.0, 1.0])

    def run() -> dict[str, torch.Tensor]:
        out = {}
        with torch.random.fork_rng():
            torch.manual_seed(0)
            for key in p1:
                if combination == "ties":
                    out[key] = merge_utils.ties([p1[key], p2[key]], weights, 0.5, "total")
                else:
                    out[key] = merge_utils.dare_linear([p1[key], p2[key]], weights * 0.5, 0.3)
        return out

    return run


# --------------------------------------------------------------------------------------------------- main


def fmt(x: float | None) -> str:
    return "—" if x is None else (f"{x:.3f}" if x < 100 else f"{x:.0f}")


def layer_of(key: str) -> int:
    return int(key.split(".layers.")[1].split(".")[0])


def exactness(p1, p2, lops, rank: int) -> list[tuple[str, str, float, float | None]]:
    """ΔW error vs the operator's definition on layer 0's k_proj (dense float64 reference)."""
    key = "base_model.model.model.layers.0.self_attn.k_proj"
    sub1 = {k: v for k, v in p1.items() if k.startswith(key + ".")}
    sub2 = {k: v for k, v in p2.items() if k.startswith(key + ".")}

    def dW(st):
        return st[key + ".lora_B.weight"].double() @ st[key + ".lora_A.weight"].double()

    def top_r(M):
        U, S, Vh = torch.linalg.svd(M, full_matrices=False)
        return (U[:, :rank] * S[:rank]) @ Vh[:rank]

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    d1, d2 = dW(sub1), dW(sub2)
    g = torch.Generator().manual_seed(0)
    rows = []
    lp = LucidPopulation([sub1, sub2, sub1]) if lops is not None else None

    def lucid_child() -> torch.Tensor:
        name = next(iter(lp.weight_up))
        return lp.weight_up[name][2].double() @ lp.weight_down[name][2].double().mT

    ours = rel(dW(get_operator("linear_0_5")(sub1, sub2, generator=g)), top_r(0.5 * (d1 + d2)))
    theirs = None
    if lp is not None:
        lops.CROSSOVER_REGISTRY["average"](lp, torch.tensor([[0, 1]]), torch.tensor([2]))
        theirs = rel(lucid_child(), top_r(0.5 * (d1 + d2)))
    rows.append(("linear_0_5", "best rank-r approx of ½ΔW₁+½ΔW₂", ours, theirs))
    eta = 1.25
    ref = top_r((1 - eta) * d1 + eta * d2)
    ours = rel(dW(get_operator("extrapolate")(sub1, sub2, generator=g, eta=eta)), ref)
    theirs = None
    if lp is not None:
        w_d, w_u = next(iter(lp.weight_down.values())), next(iter(lp.weight_up.values()))
        w_d.data[2] = w_d.data[0].lerp(w_d.data[1], eta)
        w_u.data[2] = w_u.data[0].lerp(w_u.data[1], eta)
        theirs = rel(lucid_child(), ref)
    rows.append(("extrapolate η=1.25", "best rank-r approx of (1−η)ΔW₁+ηΔW₂", ours, theirs))
    ours = rel(dW(get_operator("svd_mutation")(sub1, generator=g, epsilon=0.0)), d1)
    theirs = None
    if lp is not None:
        lp = LucidPopulation([sub1, sub2, sub1])
        lops.MUTATION_REGISTRY["svd_structured"](lp, torch.tensor([2]), epsilon=0.0)
        theirs = rel(lucid_child(), d1)
    rows.append(("svd_mutation ε=0", "the parent's ΔW", ours, theirs))
    ours = rel(dW(get_operator("dare")(sub1, sub2, generator=g, p=0.0)), top_r(0.5 * (d1 + d2)))
    rows.append(("dare p=0", "best rank-r approx of ½ΔW₁+½ΔW₂", ours, None))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ties-layers", type=int, default=1, help="layers TIES runs on (scaled to --layers)")
    ap.add_argument("--dense-shapes", default="q,k,gate,down", help="module shapes of the dense-route sample")
    ap.add_argument("--skip-lucidrains", action="store_true")
    ap.add_argument("--skip-peft", action="store_true")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--omp-wait-policy", default="PASSIVE", help="OMP_WAIT_POLICY ('default' = leave unset)")
    ap.add_argument(
        "--gram-precision",
        choices=("auto", "float64"),
        default="auto",
        help="Gram precision of the SVD-based operators, set with evolution.gram.gram_precision "
        "(auto = float32 Gram with a float64 fallback)",
    )
    ap.add_argument(
        "--siblings",
        type=float,
        default=0.0,
        help="parent 2 = parent 1 x (1 + this x N(0,1)) instead of independent (e.g. 1e-3: two children "
        "of one ancestor; their stacked factors are nearly collinear, so the float64 Gram is used)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with gram_precision(args.gram_precision):
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Every measurement and the summary tables (inside the chosen Gram precision)."""
    p1 = make_adapter(1, args.layers, args.rank)
    if args.siblings > 0:
        g = torch.Generator().manual_seed(2)
        p2 = {k: v * (1 + args.siblings * torch.randn(v.shape, generator=g)) for k, v in p1.items()}
    else:
        p2 = make_adapter(2, args.layers, args.rank)
    n_params = sum(v.numel() for v in p1.values())
    sib = f"parent 1 x (1 + {args.siblings:g} N(0,1))" if args.siblings > 0 else "independent"
    print(
        f"adapter: {args.layers} layers x 7 modules, rank {args.rank}, float32, {n_params / 1e6:.1f}M parameters | "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={_POLICY}, "
        f"load average {os.getloadavg()[0]:.1f} | gram precision {args.gram_precision}, parent 2: "
        f"{sib}",
        flush=True,
    )
    clone0, randn0 = floors(p1, args.repeats)
    print(f"floors (start): clone {clone0:.3f} s, randn {randn0:.3f} s", flush=True)

    lops, lmsg = (None, "skipped (--skip-lucidrains)") if args.skip_lucidrains else load_lucidrains()
    print(f"lucidrains: {lmsg}", flush=True)
    lpop = LucidPopulation([p1, p2, p1]) if lops is not None else None

    rows = []
    for op in list_operators():
        if op.name == "ties":
            continue
        parents = (p1,) if op.arity == 1 else (p1, p2)
        seeds = iter(range(10**6))

        def call(op=op, parents=parents, seeds=seeds):
            return op(*parents, generator=torch.Generator().manual_seed(next(seeds)))

        ours, n, ours_cpu = measure(call, args.repeats)
        grams = (
            f"gram f32/f64 {GRAM_STATS['float32']}/{GRAM_STATS['float64']}"
            if sum(GRAM_STATS.values())
            else ""
        )
        theirs = theirs_cpu = None
        if lops is not None and op.name in LUCID_MAP:
            torch.manual_seed(0)
            theirs, _, theirs_cpu = measure(lucid_call(lops, lpop, op.name), args.repeats)
        rows.append((op.name, op.family, ours, ours_cpu, theirs, theirs_cpu, n))
        ratio = f"{theirs / ours:5.2f}x" if theirs else "   — "
        print(
            f"  {op.name:16s} ours {ours:7.3f} s (cpu {ours_cpu:6.2f}, n={n})  lucidrains {fmt(theirs):>7s} s "
            f"(cpu {fmt(theirs_cpu)})  lucidrains/ours {ratio}  {grams}",
            flush=True,
        )

    tl = min(args.ties_layers, args.layers)
    sub = [k for k in p1 if layer_of(k) < tl]
    s1, s2 = {k: p1[k] for k in sub}, {k: p2[k] for k in sub}
    t0, c0 = time.perf_counter(), time.process_time()
    get_operator("ties")(s1, s2, generator=torch.Generator().manual_seed(0))
    scale = args.layers / tl
    ties_t, ties_cpu = (time.perf_counter() - t0) * scale, (time.process_time() - c0) * scale
    parts = ", ".join(f"{k} {v * scale:.1f} s" for k, v in TIES_TIMINGS.items())
    print(
        f"  ties (randomized truncation) {ties_t:.1f} s per child (cpu {ties_cpu:.1f}; {tl} layer(s) x{scale:g}): "
        f"{parts}",
        flush=True,
    )

    peft_rows = []
    if not args.skip_peft:
        for comb in ("ties", "dare_linear"):
            t, n, cpu = measure(peft_factor_call(p1, p2, comb), args.repeats)
            peft_rows.append((comb, t, cpu, n))
            print(f"  PEFT merge_utils.{comb} on factors {t:.3f} s (cpu {cpu:.2f}, n={n})", flush=True)

    dense_rows = []
    if not args.skip_dense:
        from peft.utils import merge_utils  # noqa: PLC0415

        for short in [s for s in args.dense_shapes.split(",") if s]:
            name = SHORT[short]
            key = f"base_model.model.model.layers.0.{name}"
            A1, B1 = p1[key + ".lora_A.weight"], p1[key + ".lora_B.weight"]
            A2, B2 = p2[key + ".lora_A.weight"], p2[key + ".lora_B.weight"]
            D1, D2 = B1 @ A1, B2 @ A2
            t0 = time.perf_counter()
            M_peft = merge_utils.ties([D1, D2], torch.tensor([1.0, 1.0]), 0.5, "total")
            t_peft = time.perf_counter() - t0
            t0 = time.perf_counter()
            M = ties_merge([D1.clone(), D2.clone()], [1.0, 1.0], 0.5, inplace=True)
            t_ours = time.perf_counter() - t0
            differ = ~torch.isclose(M, M_peft, rtol=1e-5, atol=1e-9)
            n_diff = int(torch.count_nonzero(differ))
            same = "equal"
            if (
                n_diff
            ):  # explained by entries tied with a parent's trim threshold? (topk picks among ties freely)
                k = int(0.5 * D1.numel())
                at_thr = torch.zeros_like(differ)
                for D in (D1, D2):
                    at_thr |= D.abs() == kth_largest(D.abs(), k)
                why = "all at a trim-threshold tie" if bool(at_thr[differ].all()) else "NOT explained by ties"
                same = f"{n_diff} of {M.numel()} entries differ, {why}"
            del M_peft, D1, D2
            g = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            Ud, Sd, Vd = topr_dense(
                M, args.rank, method="dense", init=None, niter=0, oversample=0, generator=g
            )
            t_dense = time.perf_counter() - t0
            t0 = time.perf_counter()
            Ur, Sr, Vr = topr_dense(
                M,
                args.rank,
                method="randomized",
                init=torch.cat([A1.mT, A2.mT], dim=1),
                niter=1,
                oversample=16,
                generator=g,
            )
            t_rand = time.perf_counter() - t0
            best = float((M - (Ud * Sd) @ Vd.mT).norm())
            excess = float((M - (Ur * Sr) @ Vr.mT).norm()) / best - 1
            dense_rows.append((short, SHAPES[name], t_peft, t_ours, same, t_dense, t_rand, excess))
            print(
                f"  dense {short:4s} {SHAPES[name]}: TIES merge: PEFT {t_peft:.2f} s, "
                f"ours {t_ours:.2f} s ({same}) | rank-r truncation of the TIES matrix: dense SVD {t_dense:.2f}"
                f" s, ours (randomized) {t_rand:.2f} s, residual excess {excess:.1e}",
                flush=True,
            )
            del M
    exact = exactness(p1, p2, lops, args.rank)

    clone1, randn1 = floors(p1, args.repeats)
    print(f"floors (end): clone {clone1:.3f} s, randn {randn1:.3f} s; load average {os.getloadavg()[0]:.1f}")

    # ------------------------------------------------------------------------------------------ summary
    rf = min(randn0, randn1)
    print(
        "\n| operator | family | ours s (cpu s) | lucidrains s (cpu s) | lucidrains / ours | ours / randn floor |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name, fam, ours, ours_cpu, theirs, theirs_cpu, _n in rows:
        ratio = f"{theirs / ours:.2f}" if theirs else "—"
        their = f"{theirs:.3f} ({theirs_cpu:.2f})" if theirs else "—"
        print(f"| {name} | {fam} | {ours:.3f} ({ours_cpu:.2f}) | {their} | {ratio} | {ours / rf:.1f} |")
    print(
        f"| ties (delta, randomized truncation; scaled from {tl} layer) | crossover | {ties_t:.1f} ({ties_cpu:.1f})"
        f" | — | — | {ties_t / rf:.0f} |"
    )
    for comb, t, cpu, _n in peft_rows:
        print(
            f"| PEFT merge_utils.{comb} on the factors | — | — | — | — | {t / rf:.1f} ({t:.3f} s, cpu {cpu:.2f}) |"
        )
    print(f"| floor: clone | — | {min(clone0, clone1):.3f} | | | |")
    print(f"| floor: randn | — | {rf:.3f} | | | |")
    if dense_rows:
        print(
            "\n| dense route, one module | shape | PEFT ties on dense ΔW s | our ties_merge s | full dense SVD s |"
            " our randomized top-r s | residual excess vs dense |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        for short, shape, t_peft, t_ours, same, t_dense, t_rand, excess in dense_rows:
            print(
                f"| {short} | {shape[0]}×{shape[1]} | {t_peft:.2f} | {t_ours:.2f}{'' if same == 'equal' else ' ¹'} | "
                f"{t_dense:.2f} | {t_rand:.2f} | {excess:.1e} |"
            )
        if any(r[4] != "equal" for r in dense_rows):
            print(
                "\n¹ differs from PEFT only where a parent's |ΔW| ties with its trim threshold: both keep exactly k "
                "entries, PEFT's torch.topk picks among the tied ones arbitrarily, ours the first in memory order."
            )
        per = {r[0]: r[5] for r in dense_rows}
        if set(per) >= {"q", "k", "gate", "down"}:
            est = args.layers * (2 * per["q"] + 2 * per["k"] + 2 * per["gate"] + per["down"])
            print(
                f"\ndense-SVD route, whole adapter (sum over its modules, from the sample): {est:.0f} s per SVD"
            )
    print("\n| exactness on layer 0 k_proj | reference | ours rel. error | lucidrains rel. error |")
    print("|---|---|---:|---:|")
    for name, refname, ours, theirs in exact:
        print(f"| {name} | {refname} | {ours:.1e} | {'—' if theirs is None else f'{theirs:.1e}'} |")
    over = [r[0] for r in rows if r[2] > 1.0]
    svd_based = ("svd_mutation", "component_mask", "svd_crossover", "dare")
    slower = [r[0] for r in rows if r[4] is not None and r[0] in svd_based and r[2] >= r[4]]
    print(
        f"\nover 1 s per child: {over or 'none'}; SVD-based ops not faster than lucidrains' counterpart: "
        f"{slower or 'none'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
