"""Per-role metrics of ``PolicyGradientTrainer.update`` (a member that proposes and solves in one batch, like
the single-agent baseline): entropy, length, reward per role, checked against an independent plain forward."""

from __future__ import annotations

import random

import pytest
import torch

from agents.rollout import Rollout
from agents.trainer import PolicyGradientTrainer, TrainerConfig


def mixed_rollouts(n: int = 7, seed: int = 3, vocab: int = 1000) -> list[Rollout]:
    """Teacher rows (short completions) and student rows (longer ones), interleaved, distinct rewards."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        role = "teacher" if i % 3 == 0 else "student"
        p = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
        c = [rng.randrange(vocab) for _ in range(rng.randint(1, 3) if role == "teacher" else rng.randint(4, 8))]
        out.append(Rollout(p, c, float(i) / n, group=i, scope=(role, "deduction"), meta={"role": role}))
    return out


def plain_entropies(pop, member: str, rollouts: list[Rollout]) -> list[torch.Tensor]:
    """Per-token entropy of each rollout's completion, from a plain full forward (no trainer code)."""
    out = []
    with torch.no_grad(), pop.activate(member):
        for r in rollouts:
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            logits = pop.model(input_ids=ids).logits[0].float()
            P, C = len(r.prompt_ids), len(r.completion_ids)
            logp = torch.log_softmax(logits[P - 1 : P + C - 1], -1)
            out.append(-(logp.exp() * logp).sum(-1))
    return out


@pytest.mark.parametrize("micro", [2, 8])
def test_entropy_per_role_is_the_mean_over_that_roles_tokens(population, micro):
    pop = population(nonzero_std=0.5)
    rollouts = mixed_rollouts()
    # reference before the update: with one optimizer step the measured entropy is the pre-step policy's
    ents = plain_entropies(pop, "ma", rollouts)
    cfg = TrainerConfig(advantage="reinforce_pp", micro_batch_size=micro, lr=1e-3)
    m = PolicyGradientTrainer(pop, cfg).update("ma", rollouts)

    for role in ("teacher", "student"):
        rows = [i for i, r in enumerate(rollouts) if r.meta["role"] == role]
        tok = torch.cat([ents[i] for i in rows])
        assert m[f"entropy/{role}"] == pytest.approx(float(tok.mean()), rel=1e-4)
        assert m[f"tokens/{role}"] == sum(len(rollouts[i].completion_ids) for i in rows)
        assert m[f"response_length/{role}"] == pytest.approx(m[f"tokens/{role}"] / len(rows))
        assert m[f"reward_mean/{role}"] == pytest.approx(sum(rollouts[i].reward for i in rows) / len(rows))
    # the member-level entropy is unchanged: the mean over every completion token, i.e. the token-weighted mix
    assert m["entropy"] == pytest.approx(float(torch.cat(ents).mean()), rel=1e-4)
    mix = (m["entropy/teacher"] * m["tokens/teacher"] + m["entropy/student"] * m["tokens/student"]) / m["tokens"]
    assert m["entropy"] == pytest.approx(mix, rel=1e-5)
    assert m["entropy/teacher"] != pytest.approx(m["entropy/student"], rel=1e-3)  # really two measurements


def test_no_role_metrics_without_meta_roles(population):
    pop = population(nonzero_std=0.5)
    rollouts = [Rollout(r.prompt_ids, r.completion_ids, r.reward, group=r.group) for r in mixed_rollouts()]
    m = PolicyGradientTrainer(pop, TrainerConfig()).update("ma", rollouts)
    assert not [k for k in m if "/" in k]
    assert m["entropy"] > 0
