"""Every operator against its math on small shapes (dense float64 references), plus the registry contract."""

from __future__ import annotations

import math

import pytest
import torch
from peft.utils import merge_utils

from evolution.operators import (
    UnknownOperatorError,
    dare_drop,
    dare_mask_pair,
    get_operator,
    kth_largest,
    list_operators,
    lora_modules,
    magnitude_trim,
    register_operator,
    ties_merge,
    unregister_operator,
)

from .helpers import deltas, gen, make_state, rel, top_r

ALL = [op.name for op in list_operators()]
R = 4


def parents_for(op, dtype=torch.float32):
    ps = (make_state(1, dtype=dtype), make_state(2, dtype=dtype))
    return ps[: op.arity]


# ------------------------------------------------------------------------------------------- registry


def test_registry_contents_and_metadata():
    expected = {
        "svd_mutation": ("mutation", 1, True),
        "layer_mutation": ("mutation", 1, True),
        "component_mask": ("mutation", 1, True),
        "adaptive_noise": ("mutation", 1, True),
        "dare": ("crossover", 2, True),
        "layer_crossover": ("crossover", 2, True),
        "svd_crossover": ("crossover", 2, True),
        "extrapolate": ("crossover", 2, True),
        "ties": ("crossover", 2, False),
        "task_arithmetic": ("crossover", 2, False),
        "copy_parent": ("control", 1, False),
        "linear_0_5": ("control", 2, False),
    }
    ops = {op.name: op for op in list_operators()}
    assert expected.keys() <= ops.keys()
    for name, (family, arity, pool) in expected.items():
        op = ops[name]
        assert (op.family, op.arity, op.default_pool) == (family, arity, pool), name
        assert op.summary, f"{name} has no docstring"
    assert ops["svd_mutation"].defaults["epsilon"] == 0.1
    assert ops["layer_mutation"].defaults == {"epsilon": 0.1, "fraction": 0.33}
    assert ops["component_mask"].defaults["rho"] == 0.3
    assert ops["adaptive_noise"].defaults["epsilon"] == 0.15
    assert ops["dare"].defaults["p"] == 0.7
    assert (ops["extrapolate"].defaults["eta_min"], ops["extrapolate"].defaults["eta_max"]) == (1.0, 1.5)
    assert [op.name for op in list_operators("control")] == ["copy_parent", "linear_0_5"]


def test_registry_errors():
    with pytest.raises(UnknownOperatorError, match="unknown operator .nope.; known: .*svd_mutation"):
        get_operator("nope")

    @register_operator("_test_identity", family="control", arity=1)
    def _identity(parents, modules, generator):
        """Identity."""
        return dict(parents[0])

    try:
        with pytest.raises(ValueError, match="already registered"):
            register_operator("_test_identity", family="control", arity=1)(_identity)
    finally:
        unregister_operator("_test_identity")
    with pytest.raises(ValueError, match="family"):
        register_operator("_x", family="bogus", arity=1)
    p = make_state(1)
    with pytest.raises(ValueError, match="unknown parameter.*accepted: p=0.7"):
        get_operator("dare")(p, p, generator=gen(), q=1)
    with pytest.raises(ValueError, match="takes 2 parent"):
        get_operator("dare")(p, generator=gen())
    with pytest.raises(TypeError, match="torch.Generator"):
        get_operator("svd_mutation")(p, generator=None)
    with pytest.raises(ValueError, match="space must be"):
        get_operator("linear_0_5")(p, p, generator=gen(), space="weights")
    q = make_state(2, rank=3)
    with pytest.raises(ValueError, match="shape"):
        get_operator("linear_0_5")(p, q, generator=gen())
    bad = dict(p)
    bad["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] = torch.ones(3)
    with pytest.raises(ValueError, match="not LoRA factors"):
        get_operator("copy_parent")(bad, generator=gen())


def test_module_parsing_with_adapter_names():
    st = {"m.lora_A.default.weight": torch.zeros(2, 3), "m.lora_B.default.weight": torch.zeros(4, 2)}
    (m,) = lora_modules(st)
    assert (m.a_key, m.b_key) == ("m.lora_A.default.weight", "m.lora_B.default.weight")
    with pytest.raises(ValueError, match="no lora_B"):
        lora_modules({"m.lora_A.weight": torch.zeros(2, 3)})


# -------------------------------------------------------------------------------------- common contract


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_operator_keeps_keys_shapes_dtypes_and_is_seeded(name, dtype):
    op = get_operator(name)
    ps = parents_for(op, dtype)
    before = [{k: v.clone() for k, v in p.items()} for p in ps]
    c1 = op(*ps, generator=gen(5))
    c2 = op(*ps, generator=gen(5))
    assert list(c1) == list(ps[0])
    for k, v in ps[0].items():
        assert c1[k].shape == v.shape and c1[k].dtype == v.dtype, k
        assert torch.equal(c1[k], c2[k]), f"{name} not deterministic under a seed ({k})"
        assert bool(torch.isfinite(c1[k].float()).all())
        assert c1[k].data_ptr() not in {p[k].data_ptr() for p in ps}, "child shares memory with a parent"
    for p, b in zip(ps, before, strict=True):  # parents untouched
        assert all(torch.equal(p[k], b[k]) for k in p)
    if name not in ("copy_parent",):
        c3 = op(*ps, generator=gen(6))
        same = all(torch.equal(c1[k], c3[k]) for k in c1)
        if name not in ("linear_0_5", "task_arithmetic", "ties"):  # deterministic by definition
            assert not same, f"{name}: another seed gave the same child"


def test_global_rng_is_not_used():
    ps = (make_state(1), make_state(2))
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    for op in list_operators():
        op(*ps[: op.arity], generator=gen(1))
    assert torch.equal(torch.random.get_rng_state(), state)


# ----------------------------------------------------------------------------------------------- controls


def test_copy_parent_is_bitwise():
    p = make_state(1, dtype=torch.bfloat16)
    c = get_operator("copy_parent")(p, generator=gen())
    assert all(torch.equal(c[k], p[k]) for k in p)


@pytest.mark.parametrize(
    "name,weights,params",
    [
        ("linear_0_5", (0.5, 0.5), {}),
        ("task_arithmetic", (1.0, 1.0), {}),
        ("task_arithmetic", (1.0, -0.5), {"weights": "1.0,-0.5"}),
        ("extrapolate", (-0.25, 1.25), {"eta": 1.25}),
    ],
)
def test_delta_space_combinations_equal_dense_truncation(name, weights, params):
    p1, p2 = make_state(1), make_state(2)
    c = get_operator(name)(p1, p2, generator=gen(), **params)
    d1, d2, dc = deltas(p1), deltas(p2), deltas(c)
    for m in d1:
        ref = top_r(weights[0] * d1[m] + weights[1] * d2[m], R)
        assert rel(dc[m], ref) < 1e-5, (name, m)


def test_factor_space_variants():
    p1, p2 = make_state(1), make_state(2)
    lin = get_operator("linear_0_5")(p1, p2, generator=gen(), space="factor")
    ext = get_operator("extrapolate")(p1, p2, generator=gen(), space="factor", eta=1.3)
    ta = get_operator("task_arithmetic")(p1, p2, generator=gen(), space="factor", weights=(1.0, -0.25))
    for k in p1:
        assert torch.allclose(lin[k], 0.5 * (p1[k] + p2[k]))
        assert torch.allclose(ext[k], p1[k] + 1.3 * (p2[k] - p1[k]), atol=1e-6)
        w2 = -0.5 if ".lora_A." in k else 0.5  # sign(w)√|w| on A, √|w| on B (PEFT)
        assert torch.allclose(ta[k], p1[k] + w2 * p2[k], atol=1e-6)


def test_extrapolate_eta_drawn_in_range():
    p1, p2 = make_state(1), make_state(2)
    d1, d2 = deltas(p1), deltas(p2)
    m = next(iter(d1))
    c = get_operator("extrapolate")(p1, p2, generator=gen(3), space="factor")
    # factor space is linear in eta: recover it from one entry
    k = lora_modules(p1)[0].a_key
    diff = p2[k] - p1[k]
    i = diff.abs().argmax()
    eta = float((c[k].flatten()[i] - p1[k].flatten()[i]) / diff.flatten()[i])
    assert 1.0 <= eta <= 1.5
    cd = get_operator("extrapolate")(p1, p2, generator=gen(3))
    assert rel(deltas(cd)[m], top_r((1 - eta) * d1[m] + eta * d2[m], R)) < 1e-4


# ---------------------------------------------------------------------------------------------- mutations


def test_svd_mutation_zero_noise_returns_parent_delta():
    p = make_state(1)
    c = get_operator("svd_mutation")(p, generator=gen(), epsilon=0.0)
    dp, dc = deltas(p), deltas(c)
    for m in dp:
        assert rel(dc[m], dp[m]) < 1e-5


def test_svd_mutation_spectrum_and_rotations():
    p = make_state(1)
    eps = 0.05
    c = get_operator("svd_mutation")(p, generator=gen(4), epsilon=eps)
    for m in lora_modules(p):
        dp, dc = deltas(p)[m.name], deltas(c)[m.name]
        Sp = torch.linalg.svdvals(dp)[:R]
        Sc = torch.linalg.svdvals(dc)[:R]
        assert rel(dc, dp) < 0.5
        # log-normal scaling: every singular value moves by a factor exp(eps·z), |z| < 6
        ratio = (Sc.sort().values / Sp.sort().values).log().abs()
        assert float(ratio.max()) < 6 * eps + 0.2
        # balanced refactor
        A, B = c[m.a_key].double(), c[m.b_key].double()
        assert torch.allclose(torch.linalg.svdvals(A), torch.linalg.svdvals(B), rtol=1e-4)


def test_component_mask_zeroes_components_and_regrows():
    p = make_state(1, rank=6)
    c = get_operator("component_mask")(p, generator=gen(2), rho=0.3)
    n_mask = math.ceil(0.3 * 6)
    for m in lora_modules(p):
        dp, dc = deltas(p)[m.name], deltas(c)[m.name]
        U, S, Vh = torch.linalg.svd(dp, full_matrices=False)
        S = S[:6]
        Sc = torch.linalg.svdvals(dc)[:6]
        # the child's spectrum is the parent's with n_mask values set to 0
        kept = Sc[: 6 - n_mask]
        assert all(bool((S - v).abs().min() < 1e-5 * S[0]) for v in kept)
        assert float(Sc[6 - n_mask :].max()) < 1e-5 * float(S[0])
        B = c[m.b_key]
        dead_cols = (B == 0).all(0)
        assert int(dead_cols.sum()) == n_mask
        A = c[m.a_key]
        bound = 1 / math.sqrt(A.shape[1])
        assert bool((A[dead_cols].abs() <= bound).all()) and bool((A[dead_cols] != 0).any())
        # the child equals the parent's SVD with some n_mask components removed
        removed = [i for i in range(6) if float((kept - S[i]).abs().min()) > 1e-5 * float(S[0])]
        assert len(removed) == n_mask
        mask = torch.ones(6, dtype=torch.float64)
        mask[removed] = 0
        assert rel(dc, (U[:, :6] * (S * mask)) @ Vh[:6]) < 1e-5


@pytest.mark.parametrize("name,eps", [("layer_mutation", 0.1), ("adaptive_noise", 0.15)])
def test_noise_mutations(name, eps):
    p = make_state(1, layers=6)
    c = get_operator(name)(p, generator=gen(1))
    mods = lora_modules(p)
    changed = [m for m in mods if not torch.equal(c[m.a_key], p[m.a_key])]
    if name == "layer_mutation":
        assert len(changed) == max(1, math.floor(0.33 * len(mods)))
        for m in mods:
            if m not in changed:
                assert torch.equal(c[m.a_key], p[m.a_key]) and torch.equal(c[m.b_key], p[m.b_key])
    else:
        assert len(changed) == len(mods)
    for m in changed:
        for key in (m.a_key, m.b_key):
            noise = c[key] - p[key]
            # noise std ≈ eps·std(tensor) (loose: small tensors)
            assert 0.3 < float(noise.std() / (eps * p[key].std())) < 2.0


def test_noise_on_zero_b_adds_nothing():
    p = make_state(1)
    for m in lora_modules(p):
        p[m.b_key] = torch.zeros_like(p[m.b_key])
    c = get_operator("adaptive_noise")(p, generator=gen())
    assert all(torch.equal(c[m.b_key], p[m.b_key]) for m in lora_modules(p))


@pytest.mark.parametrize(
    "name", ["svd_mutation", "component_mask", "svd_crossover", "dare", "linear_0_5", "ties"]
)
def test_zero_delta_module_is_copied(name):
    op = get_operator(name)
    ps = [make_state(1), make_state(2)][: op.arity]
    zero_mod = lora_modules(ps[0])[0]
    for p in ps:
        p[zero_mod.b_key] = torch.zeros_like(p[zero_mod.b_key])  # untrained LoRA: B = 0, A random
    c = op(*ps, generator=gen())
    assert torch.equal(c[zero_mod.a_key], ps[0][zero_mod.a_key])
    assert torch.equal(c[zero_mod.b_key], ps[0][zero_mod.b_key])


# ---------------------------------------------------------------------------------------------- crossovers


def test_layer_crossover_copies_one_parent_per_module():
    p1, p2 = make_state(1, layers=8), make_state(2, layers=8)
    c = get_operator("layer_crossover")(p1, p2, generator=gen(3))
    picks = []
    for m in lora_modules(p1):
        from1 = torch.equal(c[m.a_key], p1[m.a_key]) and torch.equal(c[m.b_key], p1[m.b_key])
        from2 = torch.equal(c[m.a_key], p2[m.a_key]) and torch.equal(c[m.b_key], p2[m.b_key])
        assert from1 != from2
        picks.append(from1)
    assert 0 < sum(picks) < len(picks)


@pytest.mark.parametrize("mode", ["index", "top"])
def test_svd_crossover_takes_leading_triplets_from_parent_1(mode):
    p1, p2 = make_state(1, rank=5), make_state(2, rank=5)
    c = get_operator("svd_crossover")(p1, p2, generator=gen(9), mode=mode)
    r = 5
    ks = []
    for m in lora_modules(p1):
        U1, S1, V1 = torch.linalg.svd(deltas(p1)[m.name], full_matrices=False)
        U2, S2, V2 = torch.linalg.svd(deltas(p2)[m.name], full_matrices=False)
        dc = deltas(c)[m.name]
        errs = {}
        for k in range(1, r):
            part1 = (U1[:, :k] * S1[:k]) @ V1[:k]
            sel = slice(k, r) if mode == "index" else slice(0, r - k)
            part2 = (U2[:, sel] * S2[sel]) @ V2[sel]
            errs[k] = rel(dc, part1 + part2)
        k_best = min(errs, key=errs.get)
        assert errs[k_best] < 1e-5, errs
        ks.append(k_best)
    assert len(set(ks)) > 1  # k is drawn per module


def test_dare_drop_exact_rescale():
    x = torch.randn(200, 300, generator=gen(1))
    d = dare_drop(x, 0.7, gen(2))
    kept = d != 0
    assert torch.equal(d[kept], x[kept] / (1 - 0.7))
    frac = float(kept.float().mean())
    assert abs(frac - 0.3) < 0.01
    # the mask is u >= p for u ~ U[0, 1) from the generator
    u = torch.empty(200, 300).uniform_(generator=gen(2))
    assert torch.equal(kept, u >= 0.7)
    assert torch.equal(dare_drop(x, 0.0, gen(2)), x)


def test_dare_matches_dense_reference_with_the_same_masks():
    p1, p2 = make_state(1), make_state(2)
    p = 0.5
    c = get_operator("dare")(p1, p2, generator=gen(7), p=p)
    mods = lora_modules(p1)
    # documented randomness: one generator per module, seeded by the operator's first draw; per module one
    # uniform of B's shape then one of A's shape, each giving both parents' masks (dare_mask_pair)
    seeds = torch.randint(0, 2**62, (len(mods),), generator=gen(7)).tolist()
    dc = deltas(c)
    dropped = {}
    for j, m in enumerate(mods):
        g = gen(seeds[j])
        for key in (m.b_key, m.a_key):
            u = torch.empty(p1[key].shape).uniform_(generator=g)
            m1, m2 = dare_mask_pair(u, p)
            dropped[key, 0] = p1[key] * m1 / (1 - p)
            dropped[key, 1] = p2[key] * m2 / (1 - p)
        terms = [dropped[m.b_key, i].double() @ dropped[m.a_key, i].double() for i in (0, 1)]
        assert rel(dc[m.name], top_r(0.5 * (terms[0] + terms[1]), R)) < 1e-5
    # factor space uses the same masks
    cf = get_operator("dare")(p1, p2, generator=gen(7), p=p, space="factor")
    for m in mods:
        for key in (m.b_key, m.a_key):
            assert torch.allclose(cf[key], 0.5 * (dropped[key, 0] + dropped[key, 1]))


def test_dare_mask_pair_is_two_independent_bernoullis():
    u = torch.empty(4_000_000).uniform_(generator=gen(3))
    for p in (0.3, 0.7, 0.9):
        m1, m2 = dare_mask_pair(u, p)
        keep = 1 - p
        assert abs(float(m1.float().mean()) - keep) < 2e-3
        assert abs(float(m2.float().mean()) - keep) < 2e-3
        assert abs(float((m1 & m2).float().mean()) - keep * keep) < 2e-3
        assert abs(float((~m1 & ~m2).float().mean()) - p * p) < 2e-3
    # the second mask is uniform over u's range within each half of the first decision
    m1, m2 = dare_mask_pair(u, 0.7)
    lo, hi = u < 0.7, u >= 0.7
    assert abs(float(m2[lo].float().mean()) - 0.3) < 2e-3 and abs(float(m2[hi].float().mean()) - 0.3) < 2e-3


@pytest.mark.parametrize("name", ALL)
def test_children_do_not_depend_on_the_thread_count(name):
    op = get_operator(name)
    ps = [make_state(1, layers=6), make_state(2, layers=6)][: op.arity]  # 18 modules: 3 chunks
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        c1 = op(*ps, generator=gen(3))
        torch.set_num_threads(3)
        c3 = op(*ps, generator=gen(3))
    finally:
        torch.set_num_threads(n)
    assert all(torch.equal(c1[k], c3[k]) for k in c1)


def test_dare_p0_is_linear_and_expectation_is_the_mean():
    p1, p2 = make_state(1), make_state(2)
    c0 = get_operator("dare")(p1, p2, generator=gen(), p=0.0)
    lin = get_operator("linear_0_5")(p1, p2, generator=gen())
    assert all(torch.allclose(c0[k], lin[k]) for k in p1)
    # with d_in <= r the rank-r truncation is lossless, so E[child ΔW] = ½(ΔW₁ + ΔW₂) exactly
    shapes = {"proj": (6, 4)}
    q1, q2 = make_state(3, shapes=shapes, layers=1), make_state(4, shapes=shapes, layers=1)
    target = 0.5 * (
        deltas(q1)["base_model.model.model.layers.0.proj"]
        + deltas(q2)["base_model.model.model.layers.0.proj"]
    )
    n = 3000
    acc = torch.zeros_like(target)
    for s in range(n):
        acc += deltas(get_operator("dare")(q1, q2, generator=gen(s), p=0.5))[
            "base_model.model.model.layers.0.proj"
        ]
    mean = acc / n
    # Monte-Carlo error: a few per cent of the target's scale
    assert rel(mean, target) < 0.08
    fac = torch.zeros_like(target)
    for s in range(300):
        fac += deltas(get_operator("dare")(q1, q2, generator=gen(s), p=0.5, space="factor"))[
            "base_model.model.model.layers.0.proj"
        ]
    # factor-space DARE targets ¼(B₁+B₂)(A₁+A₂) instead (cross terms)
    k = "base_model.model.model.layers.0.proj"
    cross = (
        0.25
        * (q1[f"{k}.lora_B.weight"] + q2[f"{k}.lora_B.weight"]).double()
        @ (q1[f"{k}.lora_A.weight"] + q2[f"{k}.lora_A.weight"]).double()
    )
    assert rel(fac / 300, cross) < 0.2


# --------------------------------------------------------------------------------------------------- TIES


def test_kth_largest_is_exact():
    g = gen(0)
    for n, k in [(10, 3), (3_000_000, 1), (3_000_000, 1_500_000), (3_000_000, 3_000_000), (2_500_000, 17)]:
        x = torch.randn(n, generator=g)
        assert float(kth_largest(x, k)) == float(torch.kthvalue(x, n - k + 1).values)
    x = torch.randint(0, 5, (2_000_000,), generator=g).float()  # heavy ties
    for k in (1, 400_000, 1_000_000, 1_999_999):
        assert float(kth_largest(x, k)) == float(torch.kthvalue(x, x.numel() - k + 1).values)


def test_magnitude_trim_and_ties_merge_match_peft():
    g = gen(1)
    taus = [torch.randn(40, 30, generator=g) for _ in range(2)]
    for density in (0.2, 0.5, 0.9):
        for t in taus:
            assert torch.equal(magnitude_trim(t, density), merge_utils.magnitude_based_pruning(t, density))
        for method in ("total", "frequency"):
            ours = ties_merge(taus, [1.0, 0.6], density, method)
            ref = merge_utils.ties(taus, torch.tensor([1.0, 0.6]), density, method)
            assert torch.allclose(ours, ref, atol=1e-6)


def test_ties_equals_peft_ties_on_delta_then_truncation():
    p1, p2 = make_state(1), make_state(2)
    c = get_operator("ties")(p1, p2, generator=gen(), density=0.4, svd="dense", weights=(1.0, 0.8))
    d1, d2, dc = deltas(p1), deltas(p2), deltas(c)
    for m in d1:
        merged = merge_utils.ties([d1[m].float(), d2[m].float()], torch.tensor([1.0, 0.8]), 0.4, "total")
        assert rel(dc[m], top_r(merged, R)) < 1e-5


def test_ties_randomized_truncation_is_near_optimal():
    shapes = {"mlp.up_proj": (120, 80)}
    p1, p2 = make_state(1, shapes=shapes, rank=8), make_state(2, shapes=shapes, rank=8)
    c = get_operator("ties")(p1, p2, generator=gen(), density=0.5)  # default: randomized
    d1, d2, dc = deltas(p1), deltas(p2), deltas(c)
    for m in d1:
        merged = merge_utils.ties([d1[m].float(), d2[m].float()], torch.ones(2), 0.5, "total").double()
        best = (merged - top_r(merged, 8)).norm()
        got = (merged - dc[m]).norm()
        assert float(got / best) < 1.01


def test_ties_factor_space_is_peft_semantics():
    p1, p2 = make_state(1), make_state(2)
    c = get_operator("ties")(p1, p2, generator=gen(), space="factor", density=0.5, weights=(1.0, 0.5))
    for m in lora_modules(p1):
        for key, w in ((m.a_key, [1.0, math.sqrt(0.5)]), (m.b_key, [1.0, math.sqrt(0.5)])):
            ref = merge_utils.ties([p1[key], p2[key]], torch.tensor(w), 0.5, "total")
            assert torch.allclose(c[key], ref, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_mixed_ranks_rank_pattern(name):
    """PEFT ``rank_pattern`` adapters mix ranks across modules; every module keeps its own rank."""
    op = get_operator(name)
    ps = [make_state(1, layers=3), make_state(2, layers=3)][: op.arity]
    q = [make_state(3, layers=3, rank=6), make_state(4, layers=3, rank=6)]
    for p, other in zip(ps, q, strict=False):
        for k in list(p):
            if ".k_proj." in k:
                p[k] = other[k]
    c = op(*ps, generator=gen())
    assert all(c[k].shape == ps[0][k].shape for k in ps[0])
    if name in ("linear_0_5", "svd_mutation"):
        d = deltas(c)
        ref = deltas(ps[0]) if name == "svd_mutation" else None
        for m in lora_modules(ps[0]):
            r = ps[0][m.a_key].shape[0]
            if name == "linear_0_5":
                target = top_r(0.5 * (deltas(ps[0])[m.name] + deltas(ps[1])[m.name]), r)
                assert rel(d[m.name], target) < 1e-5
            else:
                assert rel(d[m.name], ref[m.name]) < 0.5


def test_gram_precision_fallback_keeps_near_identical_parents_exact():
    """Siblings: [B₁|B₂] is nearly rank-deficient, so the float32 Gram is rejected and float64 used."""
    import evolution.operators as ops

    shapes = {"mlp.up_proj": (400, 300)}
    p1 = make_state(1, shapes=shapes, rank=8, layers=1)
    g = gen(5)
    p2 = {k: v * (1 + 1e-5 * torch.randn(v.shape, generator=g)) for k, v in p1.items()}
    c = get_operator("linear_0_5")(p1, p2, generator=gen())
    assert ops.GRAM_STATS["float64"] == 1 and ops.GRAM_STATS["float32"] == 0
    (m,) = deltas(p1)
    assert rel(deltas(c)[m], top_r(0.5 * (deltas(p1)[m] + deltas(p2)[m]), 8)) < 1e-6
    # unrelated parents: float32 accepted, same result as forcing float64 (to float32 accuracy)
    q = make_state(2, shapes=shapes, rank=8, layers=1)
    c32 = get_operator("linear_0_5")(p1, q, generator=gen())
    assert ops.GRAM_STATS["float32"] == 1
    with ops.gram_precision("float64"):
        c64 = get_operator("linear_0_5")(p1, q, generator=gen())
        assert ops.GRAM_STATS["float64"] == 1 and ops.current_gram_precision() == "float64"
    assert ops.current_gram_precision() == "auto"
    c64_kw = get_operator("linear_0_5")(p1, q, generator=gen(), gram_precision="float64")
    assert ops.GRAM_STATS["float64"] == 1
    assert all(torch.equal(c64[k], c64_kw[k]) for k in c64)
    ref = top_r(0.5 * (deltas(p1)[m] + deltas(q)[m]), 8)
    assert rel(deltas(c32)[m], ref) < 1e-5 and rel(deltas(c64)[m], ref) < 1e-5


def test_gram_precision_is_a_context_that_reaches_the_worker_threads():
    """``gram_precision`` holds in the operators' worker threads, is undone on exit and never leaks to other
    threads; a bad value is refused."""
    import threading

    import evolution.operators as ops

    p1, p2 = make_state(1, layers=6), make_state(2, layers=6)  # 18 modules: 3 chunks, several workers
    n = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(2)
        with ops.gram_precision("float64"):
            c64 = get_operator("linear_0_5")(p1, p2, generator=gen())
            assert ops.GRAM_STATS == {"float32": 0, "float64": 18}
            other = threading.Thread(target=lambda: seen.append(ops.current_gram_precision()))
            other.start()
            other.join()
        c32 = get_operator("linear_0_5")(p1, p2, generator=gen())
        # auto: float32 where the conditioning test passes; float64 for the six k_proj (6 rows, so the stacked
        # [B₁|B₂] with 8 columns is rank-deficient) and three small stacks with κ > 10
        assert ops.GRAM_STATS == {"float32": 9, "float64": 9}
    finally:
        torch.set_num_threads(n)
    assert seen == ["auto"]
    for k in c64:  # same child to float32 accuracy
        assert torch.allclose(c64[k], c32[k], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="gram precision must be one of"):
        with ops.gram_precision("float16"):
            pass
    with pytest.raises(ValueError, match="gram precision must be one of"):
        get_operator("linear_0_5")(p1, p2, generator=gen(), gram_precision="half")


def test_float32_gram_is_accurate_at_realistic_width():
    shapes = {"mlp.up_proj": (4096, 512)}
    p1, p2 = make_state(1, shapes=shapes, rank=16, layers=1), make_state(2, shapes=shapes, rank=16, layers=1)
    import evolution.operators as ops

    c = get_operator("extrapolate")(p1, p2, generator=gen(), eta=1.3)
    assert ops.GRAM_STATS["float32"] == 1
    (m,) = deltas(p1)
    assert rel(deltas(c)[m], top_r(-0.3 * deltas(p1)[m] + 1.3 * deltas(p2)[m], 16)) < 1e-5
    s = get_operator("svd_mutation")(p1, generator=gen(), epsilon=0.0)
    assert rel(deltas(s)[m], deltas(p1)[m]) < 1e-5


def test_magnitude_trim_keeps_exactly_k_with_ties():
    t = torch.tensor([3.0, -1.0, 1.0, 2.0, -1.0, 1.0, 0.5, -3.0])
    out = magnitude_trim(t, 0.5)  # k = 4: both 3s, the 2, and the first of the four tied 1s
    assert int((out != 0).sum()) == 4
    assert out.tolist() == [3.0, -1.0, 0.0, 2.0, 0.0, 0.0, 0.0, -3.0]
    big = torch.randint(-3, 4, (3_000_000,), generator=gen(1)).float()  # heavy ties, large path
    for density in (0.1, 0.5, 0.77):
        kept = magnitude_trim(big, density)
        assert int((kept != 0).sum()) == int(density * big.numel())
        assert torch.equal(kept[kept != 0], big[kept != 0])
