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
from evolution.ties import TIES_TIMINGS, topr_dense

from .helpers import (
    canonical_svd,
    deltas,
    gen,
    make_state,
    module_generators,
    noise_reference,
    rel,
    svd_mutation_reference,
    top_r,
)

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
    defaults = {  # every documented default
        "svd_mutation": {"epsilon": 0.1},
        "layer_mutation": {"epsilon": 0.1, "fraction": 0.33},
        "component_mask": {"rho": 0.3},
        "adaptive_noise": {"epsilon": 0.15},
        "dare": {"p": 0.7, "space": "delta"},
        "layer_crossover": {},
        "svd_crossover": {"mode": "index"},
        "extrapolate": {"eta_min": 1.0, "eta_max": 1.5, "eta": None, "space": "delta"},
        "task_arithmetic": {"weights": (1.0, 1.0), "space": "delta"},
        "ties": {"density": 0.5, "weights": (1.0, 1.0), "majority": "total", "space": "delta", "svd": "randomized",
                 "niter": 1, "oversample": 16},
        "copy_parent": {},
        "linear_0_5": {"space": "delta"},
    }
    for name, want in defaults.items():
        assert dict(ops[name].defaults) == want, name
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


def test_extrapolate_degenerate_eta_range_is_a_fixed_eta():
    p1, p2 = make_state(1), make_state(2)
    a = get_operator("extrapolate")(p1, p2, generator=gen(3), eta_min=1.2, eta_max=1.2)
    b = get_operator("extrapolate")(p1, p2, generator=gen(3), eta=1.2)
    assert all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in p1)


def test_extrapolate_eta_is_the_documented_first_draw():
    """η = η_min + (η_max − η_min)·u with u = the generator's first float64 ``rand``; both spaces use it."""
    p1, p2 = make_state(1), make_state(2)
    d1, d2 = deltas(p1), deltas(p2)
    u = float(torch.rand((), generator=gen(3), dtype=torch.float64))
    for eta_min, eta_max in ((1.0, 1.5), (0.2, 0.6)):
        eta = eta_min + (eta_max - eta_min) * u
        cf = get_operator("extrapolate")(p1, p2, generator=gen(3), space="factor", eta_min=eta_min, eta_max=eta_max)
        for k in p1:
            ref = p1[k].double() + eta * (p2[k].double() - p1[k].double())
            assert torch.allclose(cf[k].double(), ref, rtol=1e-6, atol=1e-7), k
        cd = get_operator("extrapolate")(p1, p2, generator=gen(3), eta_min=eta_min, eta_max=eta_max)
        for m in d1:
            assert rel(deltas(cd)[m], top_r((1 - eta) * d1[m] + eta * d2[m], R)) < 1e-5
    with pytest.raises(ValueError, match="eta_max"):
        get_operator("extrapolate")(p1, p2, generator=gen(), eta_min=1.5, eta_max=1.0)


# ---------------------------------------------------------------------------------------------- mutations


def test_svd_mutation_zero_noise_returns_parent_delta():
    p = make_state(1)
    c = get_operator("svd_mutation")(p, generator=gen(), epsilon=0.0)
    dp, dc = deltas(p), deltas(c)
    for m in dp:
        assert rel(dc[m], dp[m]) < 1e-5


@pytest.mark.parametrize("eps,seed", [(0.05, 4), (0.1, 11), (0.3, 2)])
def test_svd_mutation_equals_the_seeded_reference(eps, seed):
    """The exact M1 child: log-normal spectrum AND the seeded Cayley rotations of U and V (float64 reference
    from a dense SVD with the documented signs and draws), factor by factor; a spectrum-only mutation fails."""
    p = make_state(1)
    c = get_operator("svd_mutation")(p, generator=gen(seed), epsilon=eps)
    ref = svd_mutation_reference(p, seed, eps)
    for k in p:
        assert rel(c[k], ref[k]) < 1e-5, k
    A, B = ref[lora_modules(p)[0].a_key], ref[lora_modules(p)[0].b_key]
    assert torch.allclose(B.mT @ B, A @ A.mT, atol=1e-12)  # balanced: BᵀB = AAᵀ = diag(S')


def test_svd_mutation_float64_parents_are_exact():
    p = make_state(3, dtype=torch.float64)
    c = get_operator("svd_mutation")(p, generator=gen(8), epsilon=0.2)
    ref = svd_mutation_reference(p, 8, 0.2)
    for k in p:
        assert rel(c[k], ref[k]) < 1e-10, k


def test_svd_mutation_rotates_only_live_components():
    """A rank-deficient ΔW (B's last column 0): the dead component is not rotated into the live ones, stays
    dead (zero B column) and gets a fresh A row from the module's generator after z, G_U, G_V."""
    p = make_state(5)
    for m in lora_modules(p):
        p[m.b_key][:, -1] = 0.0
    c = get_operator("svd_mutation")(p, generator=gen(6), epsilon=0.3)
    ref = svd_mutation_reference(p, 6, 0.3)
    for m in lora_modules(p):
        assert torch.equal(c[m.b_key][:, -1], torch.zeros(p[m.b_key].shape[0]))
        assert rel(c[m.b_key], ref[m.b_key]) < 1e-5, m.name
        assert rel(c[m.a_key], ref[m.a_key]) < 1e-5, m.name


def test_noise_mutations_on_tiny_factors():
    """std over one entry is undefined: such a factor gets no noise; from two entries on it does."""
    p = {
        "m1.lora_A.weight": torch.tensor([[0.5]]), "m1.lora_B.weight": torch.tensor([[2.0]]),
        "m2.lora_A.weight": torch.tensor([[0.5, -1.0]]), "m2.lora_B.weight": torch.tensor([[2.0]]),
    }
    c = get_operator("adaptive_noise")(p, generator=gen(3), epsilon=0.5)
    assert torch.equal(c["m1.lora_A.weight"], p["m1.lora_A.weight"])
    assert torch.equal(c["m2.lora_B.weight"], p["m2.lora_B.weight"])
    mods = lora_modules(p)
    ref = noise_reference(p, mods, module_generators(gen(3), len(mods)), 0.5)
    assert torch.allclose(c["m2.lora_A.weight"].double(), ref["m2.lora_A.weight"], rtol=1e-6)
    assert not torch.equal(c["m2.lora_A.weight"], p["m2.lora_A.weight"])


def test_fraction_and_rho_bounds():
    """fraction = 0 still mutates one module (n = max(1, ⌊fL⌋)); fraction and ρ must lie in [0, 1], both ends
    allowed (ρ = 1 masks every component)."""
    p = make_state(1, layers=4)
    mods = lora_modules(p)
    c = get_operator("layer_mutation")(p, generator=gen(2), fraction=0.0)
    assert sum(not torch.equal(c[m.a_key], p[m.a_key]) for m in mods) == 1
    c = get_operator("layer_mutation")(p, generator=gen(2), fraction=1.0)
    assert all(not torch.equal(c[m.a_key], p[m.a_key]) for m in mods)
    c = get_operator("component_mask")(p, generator=gen(2), rho=1.0)
    assert all(torch.equal(c[m.b_key], torch.zeros_like(p[m.b_key])) for m in mods)
    c = get_operator("component_mask")(p, generator=gen(2), rho=0.0)
    assert all(rel(deltas(c)[m.name], deltas(p)[m.name]) < 1e-5 for m in mods)
    for name, key in (("layer_mutation", "fraction"), ("component_mask", "rho")):
        for bad in (-0.1, 1.5):
            with pytest.raises(ValueError, match=f"{key} must be in"):
                get_operator(name)(p, generator=gen(), **{key: bad})


def test_component_mask_equals_the_seeded_reference():
    """M3: the masked indices are the ⌈ρr⌉ smallest of the module's r uniform scores; kept components are
    U√S / √S Vᵀ (documented signs); the masked ones get a zero B column and an A row drawn next from the same
    generator by PEFT's init."""
    r, rho = 6, 0.3
    p = make_state(1, rank=r)
    c = get_operator("component_mask")(p, generator=gen(2), rho=rho)
    n_mask = math.ceil(rho * r)
    mods = lora_modules(p)
    masked_sets = set()
    for m, g in zip(mods, module_generators(gen(2), len(mods)), strict=True):
        U, S, V = canonical_svd(p[m.a_key], p[m.b_key])
        masked = torch.rand(r, generator=g, dtype=torch.float64).argsort()[:n_mask]
        dead = torch.zeros(r, dtype=torch.bool)
        dead[masked] = True
        masked_sets.add(tuple(sorted(masked.tolist())))
        root = torch.where(dead, 0.0, S.sqrt())
        d_in = p[m.a_key].shape[1]
        fresh = torch.empty(n_mask, d_in).uniform_(-1 / math.sqrt(d_in), 1 / math.sqrt(d_in), generator=g)
        assert rel(c[m.b_key], U * root) < 1e-5
        assert torch.equal(c[m.b_key][:, dead], torch.zeros(p[m.b_key].shape[0], n_mask))
        assert rel(c[m.a_key][~dead], (root[:, None] * V.mT)[~dead]) < 1e-5
        assert torch.equal(c[m.a_key][dead], fresh)
    assert len(masked_sets) > 1  # drawn per module


@pytest.mark.parametrize("seed", [1, 5])
@pytest.mark.parametrize("name,eps", [("layer_mutation", 0.1), ("adaptive_noise", 0.15)])
def test_noise_mutations_equal_the_seeded_reference(name, eps, seed):
    """M2/M4 exactly: ``X + ε·std(X)·Z`` with the documented draws (M2: ``randperm`` first, the first
    ``max(1, ⌊fL⌋)`` entries are the chosen modules; then one seed per chosen module; Z for A then B)."""
    p = make_state(1, layers=6)
    mods = lora_modules(p)
    c = get_operator(name)(p, generator=gen(seed))
    g = gen(seed)
    if name == "layer_mutation":
        n = max(1, math.floor(0.33 * len(mods)))
        chosen = set(torch.randperm(len(mods), generator=g)[:n].tolist())
        picked = [m for i, m in enumerate(mods) if i in chosen]
    else:
        picked = mods
    ref = noise_reference(p, picked, module_generators(g, len(picked)), eps)
    for m in mods:
        for key in (m.a_key, m.b_key):
            if m in picked:
                assert torch.allclose(c[key].double(), ref[key], rtol=1e-6, atol=1e-7), key
            else:
                assert torch.equal(c[key], p[key]), key


def test_layer_mutation_fraction_and_epsilon_are_used():
    p = make_state(1, layers=6)
    mods = lora_modules(p)
    c = get_operator("layer_mutation")(p, generator=gen(3), epsilon=0.4, fraction=0.5)
    g = gen(3)
    picked_idx = sorted(torch.randperm(len(mods), generator=g)[: math.floor(0.5 * len(mods))].tolist())
    picked = [mods[i] for i in picked_idx]
    ref = noise_reference(p, picked, module_generators(g, len(picked)), 0.4)
    changed = [m for m in mods if not torch.equal(c[m.a_key], p[m.a_key])]
    assert changed == picked
    for key, want in ref.items():
        assert torch.allclose(c[key].double(), want, rtol=1e-6, atol=1e-7), key


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
    zero_b, zero_a = lora_modules(ps[0])[:2]
    for p in ps:
        p[zero_b.b_key] = torch.zeros_like(p[zero_b.b_key])  # untrained LoRA: B = 0, A random
        p[zero_a.a_key] = torch.zeros_like(p[zero_a.a_key])  # ΔW = 0 through A
    c = op(*ps, generator=gen())
    for m in (zero_b, zero_a):
        assert torch.equal(c[m.a_key], ps[0][m.a_key]) and torch.equal(c[m.b_key], ps[0][m.b_key])


# ---------------------------------------------------------------------------------------------- crossovers


def test_layer_crossover_copies_the_drawn_parent_per_module():
    """X2: module j's raw factors from parent ``π_j``, ``π = randint(0, 2, (L,))`` (the generator's first draw)."""
    p1, p2 = make_state(1, layers=8), make_state(2, layers=8)
    c = get_operator("layer_crossover")(p1, p2, generator=gen(3))
    mods = lora_modules(p1)
    picks = torch.randint(0, 2, (len(mods),), generator=gen(3)).tolist()
    assert 0 < sum(picks) < len(picks)
    for m, i in zip(mods, picks, strict=True):
        src = (p1, p2)[i]
        assert torch.equal(c[m.a_key], src[m.a_key]) and torch.equal(c[m.b_key], src[m.b_key])


@pytest.mark.parametrize("mode", ["index", "top"])
def test_svd_crossover_equals_the_seeded_reference(mode):
    """X3: module j's split ``k ~ U{1, …, r−1}`` from its own generator; parent 1's triplets 1..k, then parent
    2's triplets k+1..r ("index") or its top r − k ("top"), refactored with √S."""
    r = 5
    p1, p2 = make_state(1, rank=r), make_state(2, rank=r)
    c = get_operator("svd_crossover")(p1, p2, generator=gen(9), mode=mode)
    mods = lora_modules(p1)
    ks = []
    for m, g in zip(mods, module_generators(gen(9), len(mods)), strict=True):
        k = int(torch.randint(1, r, (), generator=g))
        ks.append(k)
        U1, S1, V1 = torch.linalg.svd(deltas(p1)[m.name], full_matrices=False)
        U2, S2, V2 = torch.linalg.svd(deltas(p2)[m.name], full_matrices=False)
        part1 = (U1[:, :k] * S1[:k]) @ V1[:k]
        sel = slice(k, r) if mode == "index" else slice(0, r - k)
        part2 = (U2[:, sel] * S2[sel]) @ V2[sel]
        assert rel(deltas(c)[m.name], part1 + part2) < 1e-5, (m.name, k)
        # component-wise: B_c[:, i] A_c[i] = S u vᵀ of its source triplet, with ‖B_c[:, i]‖² = ‖A_c[i]‖² = S
        src = [(U1, S1, V1, i) for i in range(k)] + [(U2, S2, V2, j) for j in range(r)[sel]]
        A, B = c[m.a_key].double(), c[m.b_key].double()
        for i, (U, S, Vh, j) in enumerate(src):
            assert rel(B[:, i : i + 1] @ A[i : i + 1], S[j] * U[:, j : j + 1] @ Vh[j : j + 1]) < 1e-5
            assert abs(float(B[:, i].square().sum()) - float(S[j])) < 1e-5 * float(S[0])
            assert abs(float(A[i].square().sum()) - float(S[j])) < 1e-5 * float(S[0])
    assert len(set(ks)) > 1  # k is drawn per module


def test_dare_drop_other_dtypes_and_bad_p():
    x = torch.randn(50, 40, generator=gen(1), dtype=torch.float64)
    u = torch.empty(50, 40).uniform_(generator=gen(2))  # float32 uniforms whatever x's dtype
    d = dare_drop(x, 0.3, gen(2))
    assert d.dtype == torch.float64 and torch.equal(d, x * (u >= 0.3) / 0.7)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="drop probability"):
            dare_drop(x, bad, gen())
        with pytest.raises(ValueError, match="p must be in"):
            get_operator("dare")(make_state(1), make_state(2), generator=gen(), p=bad)


def test_dare_mask_pair_boundaries():
    """m₁ = [u ≥ p], m₂ = [u ≥ 2p − p²] ∨ [p² ≤ u < p], checked on the boundaries (p = 0.5: 0.25, 0.5, 0.75)."""
    u = torch.tensor([0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9])
    m1, m2 = dare_mask_pair(u, 0.5)
    assert m1.tolist() == [False, False, False, True, True, True, True]
    assert m2.tolist() == [False, True, True, False, False, True, True]


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


@pytest.mark.parametrize("zero_parent", [0, 1])
def test_one_zero_parent_is_not_a_zero_module(zero_parent):
    """A module is copied only when ΔW = 0 in EVERY parent; one zero parent is combined like any other."""
    ps = [make_state(1), make_state(2)]
    m = lora_modules(ps[0])[0]
    ps[zero_parent][m.b_key] = torch.zeros_like(ps[zero_parent][m.b_key])
    c = get_operator("linear_0_5")(*ps, generator=gen())
    want = top_r(0.5 * (deltas(ps[0])[m.name] + deltas(ps[1])[m.name]), R)
    assert rel(deltas(c)[m.name], want) < 1e-5


@pytest.mark.parametrize("r", [1, 2])
def test_svd_crossover_at_ranks_one_and_two(r):
    """r = 1: k ~ U{0, 1} (the child takes one parent's only component); r = 2: k = 1 always."""
    p1, p2 = make_state(1, rank=r, layers=4), make_state(2, rank=r, layers=4)
    c = get_operator("svd_crossover")(p1, p2, generator=gen(5))
    mods = lora_modules(p1)
    picks = []
    for m, g in zip(mods, module_generators(gen(5), len(mods)), strict=True):
        k = int(torch.randint(*((0, 2) if r == 1 else (1, r)), (), generator=g))
        U1, S1, V1 = torch.linalg.svd(deltas(p1)[m.name], full_matrices=False)
        U2, S2, V2 = torch.linalg.svd(deltas(p2)[m.name], full_matrices=False)
        want = (U1[:, :k] * S1[:k]) @ V1[:k] + (U2[:, k:r] * S2[k:r]) @ V2[k:r]
        assert rel(deltas(c)[m.name], want) < 1e-5, (m.name, k)
        picks.append(k)
    if r == 1:
        assert set(picks) == {0, 1}


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
    # with d_in <= r the rank-r truncation is lossless, so E[child ΔW] = ½(ΔW₁ + ΔW₂) exactly. Monte Carlo over
    # 3000 copies of one module in ONE call (every module has its own generator, so they are 3000 draws)
    shapes = {"proj": (6, 4)}
    q1, q2 = make_state(3, shapes=shapes, layers=1), make_state(4, shapes=shapes, layers=1)
    k = "base_model.model.model.layers.0.proj"
    n = 3000

    def tiled(q):
        return {key.replace("layers.0.", f"layers.{i}."): v for i in range(n) for key, v in q.items()}

    target = 0.5 * (deltas(q1)[k] + deltas(q2)[k])
    cross = (  # factor-space DARE targets ¼(B₁+B₂)(A₁+A₂) instead (cross terms)
        0.25
        * (q1[f"{k}.lora_B.weight"] + q2[f"{k}.lora_B.weight"]).double()
        @ (q1[f"{k}.lora_A.weight"] + q2[f"{k}.lora_A.weight"]).double()
    )
    assert rel(cross, target) > 0.5  # the two targets are far apart
    mean = sum(deltas(get_operator("dare")(tiled(q1), tiled(q2), generator=gen(), p=0.5)).values()) / n
    fac = sum(deltas(get_operator("dare")(tiled(q1), tiled(q2), generator=gen(), p=0.5, space="factor")).values())
    # Monte-Carlo error: one sample's rel. spread is ~2.3, so ~2.3/√3000 ≈ 0.04 for the mean
    assert rel(mean, target) < 0.08
    assert rel(fac / n, cross) < 0.08


# --------------------------------------------------------------------------------------------------- TIES


def test_kth_largest_is_exact():
    g = gen(0)
    cases = [(10, 3), (3_000_000, 1), (3_000_000, 1_500_000), (3_000_000, 3_000_000), (2_500_000, 17),
             (3_000_000, 50_000), (3_000_000, 2_950_000)]  # both bracket ends inside the data
    for n, k in cases:
        x = torch.randn(n, generator=g)
        assert float(kth_largest(x, k)) == float(torch.kthvalue(x, n - k + 1).values)
    # an adversarial layout the strided sample misses (every sampled entry is 0): the full kthvalue answers
    n = 1 << 21
    x = torch.arange(n, dtype=torch.float32)
    x[:: n // (1 << 18)] = 0.0
    for k in (1_000, n // 2):
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
    if name == "linear_0_5":
        d = deltas(c)
        for m in lora_modules(ps[0]):
            r = ps[0][m.a_key].shape[0]
            target = top_r(0.5 * (deltas(ps[0])[m.name] + deltas(ps[1])[m.name]), r)
            assert rel(d[m.name], target) < 1e-5
    if name == "svd_mutation":  # module j keeps its own generator whatever the rank grouping of the chunks
        ref = svd_mutation_reference(ps[0], 0, 0.1)
        for k in ps[0]:
            assert rel(c[k], ref[k]) < 1e-5, k


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


def test_magnitude_trim_edge_densities():
    t = torch.tensor([0.5, -3.0, 2.0, -1.0])
    assert torch.equal(magnitude_trim(t, 0.0), torch.zeros(4))  # k = 0: nothing kept (allowed)
    assert magnitude_trim(t, 0.25).tolist() == [0.0, -3.0, 0.0, 0.0]  # k = 1
    assert torch.equal(magnitude_trim(t, 1.0), t) and torch.equal(magnitude_trim(t, 1.5), t)
    with pytest.raises(ValueError, match="density must be >= 0"):
        magnitude_trim(t, -0.1)


def test_ties_timings_add_up_over_the_modules(monkeypatch):
    """TIES_TIMINGS sums each phase over the modules: with a clock that ticks 1 s per reading, every computed
    module adds exactly 1 s to each of dense, merge and svd."""
    import types

    import evolution.ties as ties_mod

    ticks = iter(range(1000))
    monkeypatch.setattr(ties_mod, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    p1, p2 = make_state(1), make_state(2)
    get_operator("ties")(p1, p2, generator=gen())
    n = len(lora_modules(p1))
    assert TIES_TIMINGS == {"dense": n, "merge": n, "svd": n}


def test_ties_timings_are_the_phases_of_the_last_call():
    import time

    p1, p2 = make_state(1), make_state(2)
    t0 = time.perf_counter()
    get_operator("ties")(p1, p2, generator=gen())
    elapsed = time.perf_counter() - t0
    assert set(TIES_TIMINGS) == {"dense", "merge", "svd"}
    assert all(0.0 < v <= elapsed for v in TIES_TIMINGS.values())
    assert sum(TIES_TIMINGS.values()) <= elapsed


def test_randomized_truncation_uses_the_start_block_and_the_gaussian_columns():
    """topr_dense("randomized"): the subspace starts from ``init`` plus ``oversample`` Gaussian columns."""
    g = gen(4)
    X, Y = torch.randn(30, 3, generator=g, dtype=torch.float64), torch.randn(20, 3, generator=g, dtype=torch.float64)
    M = X @ Y.mT  # rank 3, row space span(Y)
    ref = top_r(M, 3)
    # the start block alone spans M's row space: exact with no Gaussian column and no power iteration
    U, S, V = topr_dense(M, 3, method="randomized", init=Y, niter=0, oversample=0, generator=gen())
    assert rel((U * S) @ V.mT, ref) < 1e-10
    # a start block orthogonal to M's row space: the Gaussian columns alone must find it
    Q = torch.linalg.qr(torch.cat([Y, torch.randn(20, 3, generator=g, dtype=torch.float64)], 1)).Q
    U, S, V = topr_dense(M, 3, method="randomized", init=Q[:, 3:], niter=0, oversample=3, generator=gen())
    assert rel((U * S) @ V.mT, ref) < 1e-10
    # no start block: max(oversample, r) Gaussian columns, so even oversample 0 or 1 finds a rank-3 M exactly
    for oversample in (0, 1):
        U, S, V = topr_dense(M, 3, method="randomized", init=None, niter=0, oversample=oversample, generator=gen())
        assert rel((U * S) @ V.mT, ref) < 1e-10
    # one Gaussian column next to an orthogonal start block finds a rank-1 M
    M1 = X[:, :1] @ Y[:, :1].mT
    Q1 = torch.linalg.qr(torch.cat([Y[:, :1], torch.randn(20, 2, generator=g, dtype=torch.float64)], 1)).Q
    U, S, V = topr_dense(M1, 1, method="randomized", init=Q1[:, 1:], niter=0, oversample=1, generator=gen())
    assert rel((U * S) @ V.mT, M1) < 1e-10
    with pytest.raises(ValueError, match="svd must be"):
        topr_dense(M, 3, method="lanczos", init=None, niter=0, oversample=0, generator=gen())


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
