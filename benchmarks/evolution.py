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

from evolution.operators import TIES_TIMINGS, get_operator, list_operators, ties_merge  # noqa: E402

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


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, int]:
    """Median wall seconds of ``fn`` over ``repeats`` calls after one warm-up; one call if it is slow."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > SLOW_S or repeats <= 0:
        return first, 1
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def floors(p1: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    clone, _ = measure(lambda: {k: v.clone() for k, v in p1.items()}, repeats)
    randn, _ = measure(
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
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    p1 = make_adapter(1, args.layers, args.rank)
    p2 = make_adapter(2, args.layers, args.rank)
    n_params = sum(v.numel() for v in p1.values())
    print(
        f"adapter: {args.layers} layers x 7 modules, rank {args.rank}, float32, {n_params / 1e6:.1f}M parameters | "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={_POLICY}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    clone0, randn0 = floors(p1, args.repeats)
    print(f"floors (start): clone {clone0:.3f} s, randn {randn0:.3f} s")

    lops, lmsg = (None, "skipped (--skip-lucidrains)") if args.skip_lucidrains else load_lucidrains()
    print(f"lucidrains: {lmsg}")
    lpop = LucidPopulation([p1, p2, p1]) if lops is not None else None

    rows = []
    for op in list_operators():
        if op.name == "ties":
            continue
        parents = (p1,) if op.arity == 1 else (p1, p2)
        seeds = iter(range(10**6))
        ours, n = measure(
            lambda op=op, parents=parents: op(*parents, generator=torch.Generator().manual_seed(next(seeds))),
            args.repeats,
        )  # noqa: E501,B023
        theirs = None
        if lops is not None and op.name in LUCID_MAP:
            torch.manual_seed(0)
            theirs, _ = measure(lucid_call(lops, lpop, op.name), args.repeats)
        rows.append((op.name, op.family, ours, n, theirs))
        ratio = f"{theirs / ours:5.2f}x" if theirs else "   — "
        print(
            f"  {op.name:16s} ours {ours:7.3f} s (n={n})  lucidrains {fmt(theirs):>7s} s  speed-up {ratio}",
            flush=True,
        )

    # TIES on a few layers, scaled
    tl = min(args.ties_layers, args.layers)
    sub = [k for k in p1 if int(k.split(".layers.")[1].split(".")[0]) < tl]
    s1, s2 = {k: p1[k] for k in sub}, {k: p2[k] for k in sub}
    ties = get_operator("ties")
    t0 = time.perf_counter()
    ties(s1, s2, generator=torch.Generator().manual_seed(0))
    ties_t = (time.perf_counter() - t0) * args.layers / tl
    ties_parts = {k: v * args.layers / tl for k, v in TIES_TIMINGS.items()}
    print(
        f"  ties (svd=randomized) {ties_t:.1f} s per child (measured on {tl} layer(s), x{args.layers / tl:g}): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in ties_parts.items()),
        flush=True,
    )

    peft_rows = []
    if not args.skip_peft:
        for comb in ("ties", "dare_linear"):
            t, n = measure(peft_factor_call(p1, p2, comb), args.repeats)
            peft_rows.append((comb, t, n))
            print(f"  PEFT merge_utils.{comb} on factors {t:.3f} s (n={n})", flush=True)

    dense_rows = []
    if not args.skip_dense:
        for short in [s for s in args.dense_shapes.split(",") if s]:
            name = SHORT[short]
            key = f"base_model.model.model.layers.0.{name}"
            A1, B1 = p1[key + ".lora_A.weight"], p1[key + ".lora_B.weight"]
            A2, B2 = p2[key + ".lora_A.weight"], p2[key + ".lora_B.weight"]
            t0 = time.perf_counter()
            D1, D2 = B1 @ A1, B2 @ A2
            t_form = time.perf_counter() - t0
            t0 = time.perf_counter()
            U, S, Vh = torch.linalg.svd(D1, full_matrices=False)
            t_svd = time.perf_counter() - t0
            del U, S, Vh
            from peft.utils import merge_utils  # noqa: PLC0415

            t0 = time.perf_counter()
            M_peft = merge_utils.ties([D1, D2], torch.tensor([1.0, 1.0]), 0.5, "total")
            t_peft_ties = time.perf_counter() - t0
            t0 = time.perf_counter()
            M = ties_merge([D1, D2], [1.0, 1.0], 0.5)
            t_our_ties = time.perf_counter() - t0
            same = bool(torch.allclose(M, M_peft, atol=1e-7))
            del M_peft, D1, D2
            # truncation of the TIES matrix: dense SVD vs our randomized route (residual vs optimal)
            from evolution.operators import _topr_dense  # noqa: PLC0415

            t0 = time.perf_counter()
            Ud, Sd, Vd = _topr_dense(
                M,
                args.rank,
                method="dense",
                init=None,
                niter=0,
                oversample=0,
                generator=torch.Generator().manual_seed(0),
            )
            t_dense_tr = time.perf_counter() - t0
            init = torch.cat([A1.mT, A2.mT], dim=1)
            t0 = time.perf_counter()
            Ur, Sr, Vr = _topr_dense(
                M,
                args.rank,
                method="randomized",
                init=init,
                niter=2,
                oversample=16,
                generator=torch.Generator().manual_seed(0),
            )
            t_rand_tr = time.perf_counter() - t0
            best = (M - (Ud * Sd) @ Vd.mT).norm()
            got = (M - (Ur * Sr) @ Vr.mT).norm()
            dense_rows.append(
                (
                    short,
                    SHAPES[name],
                    t_form,
                    t_svd,
                    t_peft_ties,
                    t_our_ties,
                    same,
                    t_dense_tr,
                    t_rand_tr,
                    float(got / best - 1),
                )
            )
            print(
                f"  dense {short:4s} {SHAPES[name]}: form ΔW {t_form:.2f} s, full SVD {t_svd:.2f} s, PEFT ties "
                f"{t_peft_ties:.2f} s, our ties_merge {t_our_ties:.2f} s (equal: {same}), truncation dense "
                f"{t_dense_tr:.2f} s vs randomized {t_rand_tr:.2f} s (residual excess {float(got / best - 1):.1e})",
                flush=True,
            )
            del M
        if dense_rows:
            per_shape = {r[0]: r[3] for r in dense_rows}
            if set(per_shape) >= {"q", "k", "gate", "down"}:
                est = args.layers * (
                    2 * per_shape["q"] + 2 * per_shape["k"] + 2 * per_shape["gate"] + per_shape["down"]
                )
                print(
                    f"  dense-SVD route, whole adapter (estimate from the sample): {est:.0f} s per SVD of one parent"
                )

    clone1, randn1 = floors(p1, args.repeats)
    print(f"floors (end): clone {clone1:.3f} s, randn {randn1:.3f} s; load average {os.getloadavg()[0]:.1f}")

    # ---------------------------------------------------------------------------------------- summary
    print("\n| operator | family | ours (s) | lucidrains (s) | lucidrains / ours | ours / randn floor |")
    print("|---|---|---:|---:|---:|---:|")
    randn_floor = min(randn0, randn1)
    for name, fam, ours, _n, theirs in rows:
        ratio = f"{theirs / ours:.2f}" if theirs else "—"
        print(f"| {name} | {fam} | {ours:.3f} | {fmt(theirs)} | {ratio} | {ours / randn_floor:.1f} |")
    print(
        f"| ties (randomized truncation, scaled) | crossover | {ties_t:.1f} | — | — | {ties_t / randn_floor:.0f} |"
    )
    for comb, t, _ in peft_rows:
        print(f"| PEFT merge_utils.{comb} (factors) | — | — | — | — | {t / randn_floor:.1f} ({t:.3f} s) |")
    print(f"| floor: clone | — | {min(clone0, clone1):.3f} | | | |")
    print(f"| floor: randn | — | {randn_floor:.3f} | | | |")
    over = [name for name, _, ours, _, _ in rows if ours > 1.0]
    slower = [
        name
        for name, _, ours, _, theirs in rows
        if theirs is not None
        and name in ("svd_mutation", "component_mask", "svd_crossover", "dare", "extrapolate", "linear_0_5")
        and ours >= theirs
    ]
    print(
        f"\nover 1 s per child: {over or 'none'}; SVD/ΔW-based ops not faster than lucidrains: {slower or 'none'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
