"""Exact low-rank SVD, stacked sums, refactoring and dead-component regrowth against dense references."""

from __future__ import annotations

import math

import pytest
import torch

from evolution.lowrank import (
    dead_components,
    gram_core,
    lora_a_init,
    lowrank_svd,
    lowrank_svd_sum,
    refactor,
    truncate,
)

from .helpers import gen, rel, top_r


@pytest.mark.parametrize("shape", [(30, 8, 40), (40, 8, 30), (6, 8, 10), (64, 1, 16)])
def test_lowrank_svd_reconstructs_float32(shape):
    d_out, r, d_in = shape
    g = gen(1)
    A, B = torch.randn(r, d_in, generator=g), torch.randn(d_out, r, generator=g)
    U, S, V = lowrank_svd(A, B)
    assert U.shape == (d_out, r) and S.shape == (r,) and V.shape == (d_in, r)
    assert U.dtype == S.dtype == V.dtype == torch.float32
    assert rel((U * S) @ V.mT, B @ A) < 1e-5
    assert bool((S[:-1] >= S[1:]).all()) and bool((S >= 0).all())
    # singular values agree with a dense SVD
    dense = torch.linalg.svdvals(B.double() @ A.double())[: min(r, d_out, d_in)]
    assert torch.allclose(S[: dense.numel()].double(), dense, rtol=1e-5, atol=1e-6 * float(dense[0]))
    live = S > S[0] * 1e-6
    Ul, Vl = U[:, live].double(), V[:, live].double()
    eye = torch.eye(int(live.sum()), dtype=torch.float64)
    assert torch.allclose(Ul.mT @ Ul, eye, atol=1e-5) and torch.allclose(Vl.mT @ Vl, eye, atol=1e-5)


def test_lowrank_svd_float64_is_tighter_and_batched():
    g = gen(2)
    A = torch.randn(3, 5, 20, generator=g, dtype=torch.float64)
    B = torch.randn(3, 25, 5, generator=g, dtype=torch.float64)
    U, S, V = lowrank_svd(A, B)
    assert U.dtype == torch.float64 and U.shape == (3, 25, 5)
    assert rel((U * S.unsqueeze(-2)) @ V.mT, B @ A) < 1e-12


def test_gram_route_matches_householder_and_handles_ill_conditioning():
    # B with condition number 1e4: the float64-Gram route keeps S to ~1e-8 relative
    g = gen(3)
    r, d_out, d_in = 8, 200, 100
    Q, _ = torch.linalg.qr(torch.randn(d_out, r, generator=g, dtype=torch.float64))
    W, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))
    B = ((Q * torch.logspace(0, -4, r, dtype=torch.float64)) @ W.mT).float()
    A = torch.randn(r, d_in, generator=g)
    exact = torch.linalg.svdvals(B.double() @ A.double())[:r]
    _, S, _ = lowrank_svd(A, B)
    _, S_hh, _ = lowrank_svd(A, B, method="householder")
    assert float(((S.double() - exact).abs() / exact).max()) < 1e-5
    assert float(((S_hh.double() - exact).abs() / exact).max()) < 1e-3
    U, S, V = lowrank_svd(A, B)
    assert rel((U * S) @ V.mT, B @ A) < 1e-5


def test_rank_deficient_and_zero_factors():
    g = gen(4)
    A = torch.randn(6, 20, generator=g)
    B = torch.randn(15, 6, generator=g)
    B[:, [1, 4]] = 0  # two dead columns: rank 4
    U, S, V = lowrank_svd(A, B)
    assert rel((U * S) @ V.mT, B @ A) < 1e-5
    assert float(S[4:].max()) <= float(S[0]) * 1e-6
    _, S0, _ = lowrank_svd(A, torch.zeros(15, 6))
    assert bool((S0 == 0).all())


@pytest.mark.parametrize("weights", [(0.5, 0.5), (1.0, -0.7), (-0.2, 1.2, 0.3)])
def test_stacked_sum_truncation_equals_dense_truncation(weights):
    g = gen(5)
    r, d_out, d_in = 5, 30, 24
    As = [torch.randn(r, d_in, generator=g) for _ in weights]
    Bs = [torch.randn(d_out, r, generator=g) for _ in weights]
    dense = sum(w * B.double() @ A.double() for w, A, B in zip(weights, As, Bs, strict=True))
    U, S, V = lowrank_svd_sum(As, Bs, weights)
    assert S.shape == (len(weights) * r,)
    assert rel((U * S) @ V.mT, dense) < 1e-5
    Ut, St, Vt = truncate(U, S, V, r)
    A_c, B_c = refactor(Ut, St, Vt)
    assert A_c.shape == (r, d_in) and B_c.shape == (d_out, r)
    assert rel(B_c @ A_c, top_r(dense, r)) < 1e-5
    # the householder route agrees
    U2, S2, V2 = lowrank_svd_sum(As, Bs, weights, method="householder")
    assert rel((U2[:, :r] * S2[:r]) @ V2[:, :r].mT, top_r(dense, r)) < 1e-5


def test_refactor_is_balanced_and_exact():
    g = gen(6)
    A, B = torch.randn(4, 12, generator=g), torch.randn(9, 4, generator=g)
    A2, B2 = refactor(*lowrank_svd(A, B))
    assert rel(B2 @ A2, B @ A) < 1e-5
    # √S on both sides: BᵀB = A Aᵀ = diag(S)
    assert torch.allclose(B2.mT @ B2, A2 @ A2.mT, atol=1e-4)


def test_dead_components_regrow_with_peft_init():
    g = gen(7)
    A, B = torch.randn(6, 16, generator=g), torch.randn(10, 6, generator=g)
    U, S, V = lowrank_svd(A, B)
    S = S.clone()
    S[[1, 3]] = 0.0
    A_c, B_c = refactor(U, S, V, generator=gen(11))
    dense = (U * S) @ V.mT
    assert rel(B_c @ A_c, dense) < 1e-5  # ΔW unchanged by the regrown rows
    assert bool((B_c[:, [1, 3]] == 0).all())
    bound = 1 / math.sqrt(16)
    fresh = A_c[[1, 3]]
    assert bool((fresh.abs() <= bound).all()) and bool((fresh != 0).all())
    # fresh rows come from the generator: same seed, same rows; no generator: rows stay 0
    A_c2, _ = refactor(U, S, V, generator=gen(11))
    assert torch.equal(A_c, A_c2)
    A_c3, _ = refactor(U, S, V)
    assert bool((A_c3[[1, 3]] == 0).all())


def test_lora_a_init_is_peft_default_init():
    ours = lora_a_init((4, 32), generator=gen(3))
    ref = torch.empty(4, 32)
    torch.nn.init.kaiming_uniform_(ref, a=math.sqrt(5), generator=gen(3))
    assert torch.equal(ours, ref)


def test_truncate_pads_with_zero_components():
    U, S, V = torch.randn(5, 2), torch.tensor([2.0, 1.0]), torch.randn(4, 2)
    Ut, St, Vt = truncate(U, S, V, 3)
    assert Ut.shape == (5, 3) and St.tolist() == [2.0, 1.0, 0.0] and Vt.shape == (4, 3)


def test_factor_checks():
    with pytest.raises(ValueError, match="rank mismatch"):
        lowrank_svd(torch.randn(3, 5), torch.randn(4, 2))


def test_dead_components_tolerance_is_relative_and_scaled_by_width():
    """Dead iff S_i <= S_max · width · eps(dtype); all dead when S_max = 0."""
    eps = torch.finfo(torch.float64).eps
    S = torch.tensor([[1e6, 1e-4, 1e-10], [1.0, 3.5 * eps, 0.5 * eps]], dtype=torch.float64)
    assert dead_components(S, width=4).tolist() == [[False, False, True], [False, True, True]]
    assert dead_components(S, width=1).tolist() == [[False, False, True], [False, False, True]]
    assert dead_components(S).tolist() == [[False, False, True], [False, False, True]]  # width = 3 columns
    batched = torch.tensor([[[1.0, 3.5 * eps, 1.0, 1.0]]], dtype=torch.float64)  # [1, 1, 4]: width = 4
    assert dead_components(batched).tolist() == [[[False, True, False, False]]]
    on_tol = torch.tensor([1.0, 3 * eps], dtype=torch.float64)  # exactly S_max · 3 · eps: dead (<=)
    assert dead_components(on_tol, width=3).tolist() == [False, True]
    assert dead_components(torch.zeros(2, 3)).all()


def test_lora_a_init_on_batched_blocks():
    """``[..., rows, d_in]``: the bound is 1/√d_in of the LAST dim."""
    ours = lora_a_init((2, 3, 8), generator=gen(4), dtype=torch.float64)
    ref = torch.empty(2, 3, 8, dtype=torch.float64).uniform_(-1 / math.sqrt(8), 1 / math.sqrt(8), generator=gen(4))
    assert torch.equal(ours, ref)


def test_gram_core_batched_weights_match_single_calls():
    g = gen(8)
    B = torch.randn(2, 12, 6, generator=g, dtype=torch.float64)
    A = torch.randn(2, 6, 9, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, 1.0, -0.5, -0.5, -0.5], [0.2, 0.2, 0.2, 2.0, 2.0, 2.0]], dtype=torch.float64)
    XB, S, XA = gram_core(B.mT @ B, A @ A.mT, w)
    for i in range(2):
        XBi, Si, XAi = gram_core(B[i].mT @ B[i], A[i] @ A[i].mT, w[i])
        torch.testing.assert_close(S[i], Si)
        dense = B[i] @ torch.diag(w[i]) @ A[i]
        U, V = B[i] @ XB[i], A[i].mT @ XA[i]
        assert rel((U * S[i]) @ V.mT, dense) < 1e-12


def test_stacked_sum_defaults_and_validation():
    g = gen(9)
    As = [torch.randn(3, 7, generator=g) for _ in range(2)]
    Bs = [torch.randn(5, 3, generator=g) for _ in range(2)]
    U, S, V = lowrank_svd_sum(As, Bs)  # weights default to 1
    assert rel((U * S) @ V.mT, sum(B.double() @ A.double() for A, B in zip(As, Bs, strict=True))) < 1e-5
    with pytest.raises(ValueError, match="same non-zero number"):
        lowrank_svd_sum(As, Bs[:1])
    with pytest.raises(ValueError, match="same non-zero number"):
        lowrank_svd_sum([], [])
    with pytest.raises(ValueError, match="2 weights for 1 terms"):
        lowrank_svd_sum(As[:1], Bs[:1], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least 2-D"):
        lowrank_svd(torch.randn(7), Bs[0])
    with pytest.raises(ValueError, match="at least 2-D"):
        lowrank_svd(As[0], torch.randn(5))


def test_refactor_pads_small_values_and_batches():
    """rank > #triplets pads dead components; √S is taken of values below 1 too; batched with dead components."""
    g = gen(10)
    A, B = torch.randn(3, 8, generator=g, dtype=torch.float64) * 0.1, torch.randn(6, 3, generator=g, dtype=torch.float64) * 0.1
    U, S, V = lowrank_svd(A, B)
    assert float(S[0]) < 1.0
    A2, B2 = refactor(U, S, V, rank=5, generator=gen(1))
    assert A2.shape == (5, 8) and B2.shape == (6, 5)
    assert rel(B2 @ A2, B @ A) < 1e-12
    torch.testing.assert_close(B2[:, :3].square().sum(0), S)  # ‖B col‖² = S: √S, not √max(S, 1)
    assert torch.equal(B2[:, 3:], torch.zeros(6, 2, dtype=torch.float64))
    fresh = lora_a_init((5, 8), generator=gen(1), dtype=torch.float64)[3:]
    assert torch.equal(A2[3:], fresh)
    # batched: one leading dim, a dead component in the second item only
    Ub, Sb, Vb = torch.stack([U, U]), torch.stack([S, S * torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)]), torch.stack([V, V])
    Ab, Bb = refactor(Ub, Sb, Vb, generator=gen(2))
    torch.testing.assert_close(Bb[0], refactor(U, S, V)[1])
    assert torch.equal(Bb[1][:, 2], torch.zeros(6, dtype=torch.float64))
    assert bool((Ab[1][2] != 0).all()) and torch.equal(Ab[0], refactor(U, S, V)[0])
