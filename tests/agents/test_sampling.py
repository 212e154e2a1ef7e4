"""The candidate-only top-p sampler draws exactly the reference (full stable sort) sampler's tokens."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.generation.sampling import SAMPLERS, sample_rows, sample_rows_sorted, top_p_filter

EDGE_TOP_P = [1e-7, 0.01, 0.5, 0.9, 0.95, 0.999, 0.99999, 1 - 2**-24, 1.0]
EDGE_U = [0.0, 2**-24, 0.5, 1 - 2**-24]


@st.composite
def draws(draw):
    """A batch of logits (flat or peaked, continuous or with many exact ties), top-p values (edges included)
    and uniforms (edges included), all from one seed."""
    seed = draw(st.integers(0, 2**31 - 1))
    rows = draw(st.integers(1, 6))
    vocab = draw(st.sampled_from([1, 2, 3, 17, 100, 1000, 5000, 20000]))
    scale = draw(st.sampled_from([0.0, 0.1, 1.0, 3.0, 10.0, 40.0]))
    ties = draw(st.sampled_from(["none", "rounded", "few-levels"]))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * scale
    if ties == "rounded":
        logits = logits.round()
    elif ties == "few-levels":
        logits = torch.randint(0, 3, (rows, vocab), generator=g).float() * scale
    temperature = draw(st.sampled_from([0.3, 0.8, 1.0, 2.0]))
    probs = torch.softmax(logits / temperature, dim=-1)
    top_p = torch.tensor(draw(st.lists(st.one_of(st.sampled_from(EDGE_TOP_P), st.floats(1e-6, 1.0)),
                                       min_size=rows, max_size=rows)), dtype=torch.float32)
    top_p = top_p.clamp(min=1e-7)
    u = torch.tensor(draw(st.lists(st.one_of(st.sampled_from(EDGE_U), st.floats(0.0, 1 - 2**-24)),
                                   min_size=rows, max_size=rows)), dtype=torch.float32)
    return probs, top_p, u


@settings(max_examples=300, deadline=None)
@given(draws())
def test_candidate_sampler_draws_the_reference_tokens(case):
    probs, top_p, u = case
    assert torch.equal(sample_rows(probs, top_p, u), sample_rows_sorted(probs, top_p, u))


def test_candidate_sampler_matches_on_many_seeded_vocabulary_sized_draws(monkeypatch):
    """The main job's shape: 49,152 tokens, rows at top-p 0.95 and temperature 0.8, a model-like spread of
    logits. Peaked rows are served from the candidates; only flat rows reach the full-sort fallback."""
    import agents.generation.sampling as sampling

    fallback_rows = []

    def counting(probs, top_p, u):
        fallback_rows.append(probs.shape[0])
        return sample_rows_sorted(probs, top_p, u)

    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 4.0, 12.0):
        logits = torch.randn(16, 49152, generator=g) * scale
        logits[:8, :50] += 15.0  # peaked rows
        probs = torch.softmax(logits / 0.8, dim=-1)
        top_p = torch.full((16,), 0.95)
        top_p[-1] = 1.0
        for _ in range(3):
            u = torch.rand(16, generator=g)
            fallback_rows.clear()
            monkeypatch.setattr(sampling, "sample_rows_sorted", counting)
            fast = sample_rows(probs, top_p, u)
            monkeypatch.undo()
            assert torch.equal(fast, sample_rows_sorted(probs, top_p, u))
            assert sum(fallback_rows) <= 7  # the 8 peaked rows never need the full sort


def test_ties_are_broken_by_token_id():
    """Four equally likely tokens in the nucleus: the order (hence the token a given u picks) is by id."""
    probs = torch.zeros(1, 300)
    probs[0, [250, 7, 120, 3]] = 0.24  # the filler below avoids these ids
    probs[0, 10:56] = 0.04 / 46
    for sampler in SAMPLERS.values():
        picks = [sampler(probs, torch.tensor([0.9]), torch.tensor([x])).item() for x in (0.1, 0.3, 0.6, 0.9)]
        assert picks == [3, 7, 120, 250]


def test_top_p_filter_keeps_the_smallest_prefix_reaching_top_p():
    kept, order = top_p_filter(torch.tensor([[0.1, 0.5, 0.15, 0.25]]), torch.tensor([0.7]))
    assert order.tolist() == [[1, 3, 2, 0]]
    assert torch.allclose(kept, torch.tensor([[0.5, 0.25, 0.0, 0.0]]))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_each_row_is_independent_of_the_others(sampler):
    """A row's token does not depend on which other rows share the batch (nor on their top-p)."""
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(6, 3000, generator=g) * 4, dim=-1)
    top_p = torch.tensor([0.95, 1.0, 0.5, 0.999, 0.95, 0.1])
    u = torch.rand(6, generator=g)
    whole = SAMPLERS[sampler](probs, top_p, u)
    alone = torch.cat([SAMPLERS[sampler](probs[i : i + 1], top_p[i : i + 1], u[i : i + 1]) for i in range(6)])
    assert torch.equal(whole, alone)
