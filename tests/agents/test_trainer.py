"""PolicyGradientTrainer on the tiny-random base: log-prob correctness, gradient accumulation, behaviour
log-probs, KL modes, isolation of members, and learning a toy verifiable reward."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time

import pytest
import torch

from agents.forward import pack_rollouts, rollout_logprobs
from agents.losses import list_loss_aggs
from agents.rollout import Rollout
from agents.trainer import PolicyGradientTrainer, TrainerConfig


def make_rollouts(n: int = 6, seed: int = 0, vocab: int = 1000, groups: int = 3) -> list[Rollout]:
    """Random token sequences of unequal prompt and completion lengths, rewards in [0, 1]."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        c = [rng.randrange(vocab) for _ in range(rng.randint(1, 7))]
        out.append(Rollout(p, c, rng.random(), group=i % groups, scope=("solver", i % 2)))
    return out


class GradCapture:
    """Stands in for a member's AdamW: records the gradient at every step instead of stepping."""

    def __init__(self, params):
        self.params = params
        self.grads: list[list[torch.Tensor]] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params])


def assert_same_grad(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to float32 summation-order noise, relative to the tensor's norm."""
    assert (a - b).norm() <= 1e-4 * a.norm() + 1e-9, ((a - b).norm(), a.norm())


def capture(pop, monkeypatch, member: str) -> GradCapture:
    cap = GradCapture(pop.parameters(member))
    monkeypatch.setattr(pop, "optimizer", lambda name, **kw: cap)
    return cap


def grads_of(population, config: TrainerConfig, rollouts, monkeypatch, member="ma", **pop_kw):
    pop = population(nonzero_std=0.5, **pop_kw)
    cap = capture(pop, monkeypatch, member)
    metrics = PolicyGradientTrainer(pop, config).update(member, rollouts)
    return cap.grads, metrics


@pytest.mark.parametrize("extra", [{}, {"gradient_checkpointing": True, "micro_batch_size": 2},
                                   {"mini_batch_size": 2, "epochs": 2}, {"packing": "none"}],
                         ids=["default", "checkpointing", "mini", "unpacked"])
def test_fused_lora_gives_peft_gradients(population, monkeypatch, extra):
    """``lora_impl="fused"`` (the default: ``LoRAPopulation.single``'s one-addmm LoRA, spied) and PEFT's forward
    give the same gradients and loss within float rounding."""
    from agents.population import _SingleForward

    calls = {"n": 0}
    real = _SingleForward.__call__

    def spy(self, *args, **kwargs):
        calls["n"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_SingleForward, "__call__", spy)
    rollouts = make_rollouts(8)
    fused, mf = grads_of(population, TrainerConfig(**extra), rollouts, monkeypatch)
    assert calls["n"] > 0
    calls["n"] = 0
    peft, mp = grads_of(population, TrainerConfig(lora_impl="peft", **extra), rollouts, monkeypatch)
    assert calls["n"] == 0
    assert len(fused) == len(peft) == (8 if "epochs" in extra else 1)  # 4 mini-batches x 2 epochs
    for step_f, step_p in zip(fused, peft, strict=True):
        assert any(torch.count_nonzero(g) > 0 for g in step_f)
        for a, b in zip(step_f, step_p, strict=True):
            assert_same_grad(a, b)
    assert mf["loss"] == pytest.approx(mp["loss"], rel=1e-5, abs=1e-7)


def zero_group_rollouts() -> list[Rollout]:
    """Nine rollouts in three groups; group 0 (rows 0, 3, 6) has equal rewards: GRPO gives it zero advantages."""
    return [Rollout(r.prompt_ids, r.completion_ids, 0.5 if r.group == 0 else r.reward, r.group, r.scope)
            for r in make_rollouts(9, seed=7, groups=3)]


def _rows_and_grads(population, monkeypatch, cfg: TrainerConfig, rollouts):
    """The rows the update forwarded, its gradient per step and its metrics."""
    pop = population(nonzero_std=0.5)
    cap = capture(pop, monkeypatch, "ma")
    trainer = PolicyGradientTrainer(pop, cfg)
    rows_seen: set[int] = set()
    real = trainer.forward.logprobs

    def spy(batch, rows, ent_grad=False):
        rows_seen.update(rows)
        return real(batch, rows, ent_grad)

    monkeypatch.setattr(trainer.forward, "logprobs", spy)
    metrics = trainer.update("ma", rollouts)
    return rows_seen, cap.grads, metrics


@pytest.mark.parametrize("extra", [*({"loss_agg_mode": m} for m in list_loss_aggs()),
                                   {"mini_batch_size": 3, "epochs": 2}, {"micro_batch_size": 2},
                                   {"packing": "none"}, {"role_weighting": "tokens"}],
                         ids=[*list_loss_aggs(), "mini", "micro", "unpacked", "tokens"])
def test_zero_advantage_rows_are_left_out_with_the_same_gradients(population, monkeypatch, extra):
    """``skip_zero_advantage``: rows whose advantages are all zero take no pass (grad or no-grad), the
    gradient of every optimizer step equals the one computed with them (each step normalised by all its rows),
    and ``zero_advantage_rows`` counts them per step."""
    rollouts = zero_group_rollouts()
    zero = {0, 3, 6}
    seen: dict[bool, set[int]] = {}
    result = {}
    for skip in (True, False):
        cfg = TrainerConfig(advantage="grpo", skip_zero_advantage=skip, **extra)
        seen[skip], grads, m = _rows_and_grads(population, monkeypatch, cfg, rollouts)
        result[skip] = (grads, m)
    assert seen[True] == set(range(9)) - zero and seen[False] == set(range(9))
    (g1, m1), (g0, m0) = result[True], result[False]
    steps = 6 if "epochs" in extra else 1
    assert len(g1) == len(g0) == steps
    assert m1["zero_advantage_rows"] == 3 * (2 if "epochs" in extra else 1) and m0["zero_advantage_rows"] == 0
    for a_step, b_step in zip(g1, g0, strict=True):
        assert any(torch.count_nonzero(g) > 0 for g in a_step)
        for a, b in zip(a_step, b_step, strict=True):
            assert_same_grad(a, b)
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-7)


def test_zero_advantage_rows_stay_in_with_an_entropy_term(population, monkeypatch):
    """With an entropy bonus a zero-advantage row still has a gradient: every row takes its pass."""
    cfg = TrainerConfig(advantage="grpo", entropy_coef=0.01)
    rows_seen, _, m = _rows_and_grads(population, monkeypatch, cfg, zero_group_rollouts())
    assert rows_seen == set(range(9)) and m["zero_advantage_rows"] == 0


@pytest.fixture
def loss_term():
    """``loss_term(name, coef, fn, **kw)`` registers an extra loss term for this test only."""
    from agents.losses import list_loss_terms, register_loss_term, unregister_loss_term

    names: list[str] = []

    def register(name: str, coef: float, fn, **kwargs) -> None:
        register_loss_term(name, coef, **kwargs)(fn)
        names.append(name)

    yield register
    for name in names:
        if name in list_loss_terms():
            unregister_loss_term(name)


def test_a_new_loss_term_keeps_the_zero_advantage_rows(population, monkeypatch, loss_term):
    """The skip asks the loss, not a list of term names: a registered term that depends on every row's
    log-probs (0.1 * lp_t^2, which does not vanish where A_t = 0) keeps the zero-advantage rows in the passes,
    so the update is bit for bit the one with the skip off, and the term really moved those rows' gradient;
    the same term declared ``vanishes_at_zero_advantage`` (A_t * lp_t^2) lets them be left out again."""
    rollouts = zero_group_rollouts()
    everything = set(range(9))
    without = _rows_and_grads(population, monkeypatch, TrainerConfig(advantage="grpo"), rollouts)
    assert without[0] == everything - {0, 3, 6}  # the zero-advantage rows of group 0 are left out
    loss_term("lp_square", 0.1, lambda x: x.logprobs.square())
    seen, grads, m = _rows_and_grads(population, monkeypatch, TrainerConfig(advantage="grpo"), rollouts)
    _, grads_off, m_off = _rows_and_grads(population, monkeypatch,
                                          TrainerConfig(advantage="grpo", skip_zero_advantage=False), rollouts)
    assert seen == everything and m["zero_advantage_rows"] == 0
    assert m["lp_square"] > 0 and m["loss"] == m_off["loss"]
    for a, b in zip(grads[0], grads_off[0], strict=True):
        assert torch.equal(a, b)
    # the term's gradient through the zero-advantage rows: the whole batch's differs from the other rows' alone
    _, grads_live, _ = _rows_and_grads(population, monkeypatch, TrainerConfig(advantage="grpo"),
                                       [r for i, r in enumerate(rollouts) if i not in {0, 3, 6}])
    assert any(not torch.allclose(a, b) for a, b in zip(grads[0], grads_live[0], strict=True))

    from agents.losses import unregister_loss_term

    unregister_loss_term("lp_square")
    loss_term("adv_lp_square", 0.1, lambda x: x.advantages * x.logprobs.square(), vanishes_at_zero_advantage=True)
    seen, grads, m = _rows_and_grads(population, monkeypatch, TrainerConfig(advantage="grpo"), rollouts)
    _, grads_off, _ = _rows_and_grads(population, monkeypatch,
                                      TrainerConfig(advantage="grpo", skip_zero_advantage=False), rollouts)
    assert seen == everything - {0, 3, 6} and m["zero_advantage_rows"] == 3
    for a, b in zip(grads[0], grads_off[0], strict=True):
        assert_same_grad(a, b)


# ------------------------------------------------------------------------------------------ config


def test_config_validation_and_registry_errors(population):
    from populora_env.checks import ConfigError

    for bad, field, reason in [
        ({"micro_batch_size": 0}, "micro_batch_size", "must be >= 1, got 0"),
        ({"kl_mode": "sometimes"}, "kl_mode", "must be one of off, reward, loss, got 'sometimes'"),
        ({"kl_coef": 0.1}, "kl_coef", "0.1 has no effect with kl_mode 'off'; set kl_mode"),
        ({"clip_eps_low": 1.5}, "clip_eps_low", "must be < 1, got 1.5"),
        ({"lr": -1.0}, "lr", "must be > 0, got -1"),
        ({"lora_impl": "dora"}, "lora_impl", "must be one of fused, peft, got 'dora'"),
    ]:
        config = TrainerConfig(**bad)  # built as given (tyro and presets build it): validate() refuses it
        with pytest.raises(ConfigError) as info:
            config.validate()
        assert (info.value.field, info.value.reason) == (field, reason)
    pop = population()
    with pytest.raises(ConfigError, match="micro_batch_size"):  # a trainer refuses a bad config when built
        PolicyGradientTrainer(pop, TrainerConfig(micro_batch_size=0))
    with pytest.raises(ConfigError, match="known: dr_grpo, grpo"):
        PolicyGradientTrainer(pop, TrainerConfig(advantage="ppo"))
    with pytest.raises(ConfigError, match="known: seq-mean-token-mean"):
        PolicyGradientTrainer(pop, TrainerConfig(loss_agg_mode="sum"))
    with pytest.raises(KeyError, match="no member"):
        PolicyGradientTrainer(pop).update("zz", make_rollouts())
    assert TrainerConfig(kl_mode="reward", kl_coef=0.1).resolved_kl_estimator == "k1"
    assert TrainerConfig(kl_mode="loss", kl_coef=0.1).resolved_kl_estimator == "k3"


# --------------------------------------------------------------------------------------- log-probs


def test_chunked_logprobs_and_entropy_match_a_plain_forward(population):
    pop = population(nonzero_std=0.5)
    rollouts = make_rollouts(7, seed=1)
    trainer = PolicyGradientTrainer(pop, TrainerConfig(logprob_chunk_size=3, micro_batch_size=4))
    batch = pack_rollouts(rollouts)
    with torch.no_grad(), pop.activate("mb"):
        lp, ent = trainer.forward.logprobs(batch, list(range(len(rollouts))))
        lp_ref_model = trainer.forward.logprobs_no_grad(batch, reference=True)
        for i, r in enumerate(rollouts):
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            logits = pop.model(input_ids=ids).logits[0].float()
            P, C = len(r.prompt_ids), len(r.completion_ids)
            logp = torch.log_softmax(logits[P - 1 : P + C - 1], -1)
            want = logp.gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
            torch.testing.assert_close(lp[i, :C], want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ent[i, :C], -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-5)
            assert lp[i, C:].abs().sum() == 0 and ent[i, C:].abs().sum() == 0
            with pop.disabled():
                base_logits = pop.model(input_ids=ids).logits[0].float()
            base_lp = torch.log_softmax(base_logits[P - 1 : P + C - 1], -1)
            want_base = base_lp.gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
            torch.testing.assert_close(lp_ref_model[i, :C], want_base, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(want, want_base)  # the member really differs from the base


def test_trainer_logprobs_match_the_hf_generator_behaviour_logprobs(population, tiny_tokenizer):
    from agents.generation.base import GenerationRequest
    from agents.generation.hf import HFGenerator

    pop = population(nonzero_std=0.5)
    gen = HFGenerator(pop, tiny_tokenizer)
    reqs = [
        GenerationRequest("ma", "def f(x):", max_new_tokens=6, n=3, seed=1, chat=False),
        GenerationRequest("ma", "Hello there, solve", max_new_tokens=6, n=3, seed=2, chat=False),
    ]
    rollouts = [
        Rollout(c.prompt_token_ids, c.token_ids, 0.0, logprobs=c.logprobs) for c in gen.generate(reqs)
    ]
    trainer = PolicyGradientTrainer(pop)
    batch = pack_rollouts(rollouts)
    with pop.activate("ma"):
        lp = trainer.forward.logprobs_no_grad(batch, reference=False)
    torch.testing.assert_close(lp, rollout_logprobs(rollouts, batch), atol=1e-4, rtol=1e-4)


def test_a_single_logprob_chunk_skips_the_checkpoint_with_the_same_gradient(population, monkeypatch):
    """Several LM-head chunks run checkpointed (one chunk's logits alive at a time); a micro-batch of one chunk
    runs plainly (nothing to bound, no recomputation): the gradients agree."""
    import agents.forward as forward_module

    calls = []
    real = forward_module.checkpoint
    monkeypatch.setattr(forward_module, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    rollouts = make_rollouts(6, seed=2)
    grads = {}
    for chunk in (2, 1024):
        calls.clear()
        grads[chunk], _ = grads_of(population, TrainerConfig(logprob_chunk_size=chunk), rollouts, monkeypatch)
        assert (len(calls) > 0) == (chunk == 2), (chunk, len(calls))
    for a, b in zip(grads[1024][0], grads[2][0], strict=True):
        assert b.abs().max() > 0
        assert_same_grad(a, b)  # float summation order: up to ~5e-7 of a tensor whose largest entry is ~0.1


# ------------------------------------------------------------------------------ gradient accumulation


@pytest.mark.parametrize("mode", sorted(list_loss_aggs()))
def test_micro_batches_accumulate_to_the_full_batch_gradient(population, monkeypatch, mode):
    rollouts = make_rollouts(6, seed=2)
    cfgs = [
        TrainerConfig(advantage="grpo", loss_agg_mode=mode, micro_batch_size=mb, max_grad_norm=None)
        for mb in (6, 4, 1)
    ]
    results = [grads_of(population, cfg, rollouts, monkeypatch) for cfg in cfgs]
    full = results[0][0]
    assert len(full) == 1 and any(g.abs().sum() > 0 for g in full[0])
    for grads, metrics in results[1:]:
        for a, b in zip(full[0], grads[0], strict=True):
            assert_same_grad(a, b)
        assert metrics["loss"] == pytest.approx(results[0][1]["loss"], abs=1e-6)
        assert metrics["grad_norm"] == pytest.approx(results[0][1]["grad_norm"], rel=1e-4)


def test_gradient_checkpointing_gives_the_same_gradient(population, monkeypatch):
    rollouts = make_rollouts(5, seed=3)
    g0, _ = grads_of(population, TrainerConfig(max_grad_norm=None), rollouts, monkeypatch)
    g1, _ = grads_of(
        population, TrainerConfig(max_grad_norm=None, gradient_checkpointing=True), rollouts, monkeypatch
    )
    for a, b in zip(g0[0], g1[0], strict=True):
        assert_same_grad(a, b)


def test_equal_rewards_give_zero_gradient_unless_entropy_bonus(population, monkeypatch):
    rollouts = [Rollout(r.prompt_ids, r.completion_ids, 1.0, group=0) for r in make_rollouts(4, seed=4)]
    g, m = grads_of(population, TrainerConfig(advantage="grpo", max_grad_norm=None), rollouts, monkeypatch)
    assert all(x.abs().sum() == 0 for x in g[0]) and m["grad_norm"] == 0.0
    assert m["frac_reward_zero_std"] == 1.0
    cfg = TrainerConfig(advantage="grpo", max_grad_norm=None, entropy_coef=0.01)
    g, m = grads_of(population, cfg, rollouts, monkeypatch)
    # the entropy bonus alone moves the member, and the logged grad_norm is the norm of that very gradient
    norm = float(torch.sqrt(sum((x.double() ** 2).sum() for x in g[0])))
    assert norm > 0 and m["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert m["entropy"] > 0


# -------------------------------------------------------------------------------- behaviour policy


def test_on_policy_update_has_ratio_one(population):
    m = PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig(lr=1e-2)).update(
        "ma", make_rollouts()
    )
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == 0.0 and m["num_steps"] == 1 and m["skipped"] == 0.0
    assert m["grad_norm"] > 0 and math.isfinite(m["loss"])


def test_several_steps_per_batch_go_off_policy(population):
    cfg = TrainerConfig(lr=5e-2, epochs=2, mini_batch_size=3)
    m = PolicyGradientTrainer(population(nonzero_std=0.5), cfg).update("ma", make_rollouts(6))
    assert m["num_steps"] == 4  # 2 epochs x 2 mini-batches
    assert m["approx_kl"] > 0  # steps after the first see a policy != the behaviour one
    assert m["clip_frac"] > 0


@pytest.mark.parametrize("epochs", [1, 2])
def test_first_mini_batch_behaviour_logprobs_come_from_its_own_forward(population, monkeypatch, epochs):
    """Several optimizer steps: the no-grad pass forwards every mini-batch but the first (each laid out as its
    steps lay it out); the first mini-batch's behaviour log-probs are its own first forward's, detached. The
    update equals the one whose no-grad pass computes every mini-batch's, bit for bit."""
    cfg = TrainerConfig(lr=5e-2, epochs=epochs, mini_batch_size=3)
    rollouts = make_rollouts(9, seed=3)
    states = {}
    for way in ("deferred", "all up front"):
        pop = population(nonzero_std=0.5)
        trainer = PolicyGradientTrainer(pop, cfg)
        passes: list[tuple[bool, list[int]]] = []
        real = trainer.forward.logprobs

        def spy(batch, rows, ent_grad=False, real=real, passes=passes):
            passes.append((torch.is_grad_enabled(), sorted(rows)))
            return real(batch, rows, ent_grad)

        monkeypatch.setattr(trainer.forward, "logprobs", spy)
        if way == "all up front":
            def every_mini_batch(batch, n_steps, mini, zero_gradient, live=None, behaviour_lp=None,
                                 trainer=trainer):
                minis = [list(range(s, min(batch.size, s + mini))) for s in range(0, batch.size, mini)]
                return trainer.forward.logprobs_no_grad(batch, reference=False, minis=minis), set(), None

            monkeypatch.setattr(trainer, "_fixed_logprobs", every_mini_batch)
        m = trainer.update("ma", rollouts)
        assert m["num_steps"] == 3 * epochs and m["skipped_steps"] == 0
        no_grad = sorted(i for grad, rows in passes if not grad for i in rows)
        assert no_grad == (list(range(3, 9)) if way == "deferred" else list(range(9)))
        assert sum(grad for grad, _ in passes) == 3 * epochs
        states[way] = pop.state("ma")
    for k, v in states["all up front"].items():
        assert torch.equal(states["deferred"][k], v), k


def test_behaviour_logprobs_used_when_asked(population):
    pop = population(nonzero_std=0.5)
    rollouts = make_rollouts(6, seed=5)
    trainer = PolicyGradientTrainer(pop, TrainerConfig(use_behaviour_logprobs=True))
    with pytest.raises(ValueError, match="no logprobs"):
        trainer.update("ma", rollouts)
    batch = pack_rollouts(rollouts)
    with pop.activate("ma"):
        own = trainer.forward.logprobs_no_grad(batch, reference=False)
    # behaviour = the policy itself -> ratio 1; behaviour 0.5 nats more likely -> ratio e^-0.5 < 0.8: clipped
    # exactly on the tokens with a negative advantage
    exact = [
        Rollout(
            r.prompt_ids,
            r.completion_ids,
            r.reward,
            r.group,
            r.scope,
            own[i, : len(r.completion_ids)].tolist(),
        )
        for i, r in enumerate(rollouts)
    ]
    m = trainer.update("ma", exact)
    assert m["approx_kl"] < 1e-6 and m["clip_frac"] == 0.0
    pop2 = population(nonzero_std=0.5)
    shifted = [
        Rollout(r.prompt_ids, r.completion_ids, r.reward, r.group, r.scope, [x + 0.5 for x in r.logprobs])
        for r in exact
    ]
    m = PolicyGradientTrainer(pop2, TrainerConfig(use_behaviour_logprobs=True)).update("ma", shifted)
    assert 0 < m["clip_frac"] < 1
    assert m["approx_kl"] == pytest.approx(math.exp(-0.5) - 1 + 0.5, rel=1e-3)
    bad = [
        Rollout(r.prompt_ids, r.completion_ids, r.reward, logprobs=[0.0])
        for r in rollouts
        if len(r.completion_ids) > 1
    ]
    with pytest.raises(ValueError, match="logprobs for"):
        trainer.update("ma", bad)


def _generated_by_version_0(trainer: PolicyGradientTrainer):
    """Six rollouts of member ``ma`` as its version 0 generated them (carrying its log-probs, ``version=0``):
    ``(batch, own_logprobs, at_v, generated)``, ``own_logprobs()`` scoring the batch with ``ma``'s weights now."""
    rollouts = make_rollouts(6, seed=7)
    batch = pack_rollouts(rollouts)

    def own_logprobs() -> torch.Tensor:
        with trainer.population.activate("ma"):
            return trainer.forward.logprobs_no_grad(batch, reference=False)

    at_v = own_logprobs()
    generated = [Rollout(r.prompt_ids, r.completion_ids, r.reward, r.group, r.scope,
                         at_v[i, : len(r.completion_ids)].tolist(), version=0) for i, r in enumerate(rollouts)]
    return batch, own_logprobs, at_v, generated


def test_a_stale_batch_is_scored_against_the_version_that_generated_it(population, monkeypatch):
    """A rollout generated by version v of a member and trained when the member is at v + 1 (an asynchronous run)
    has the ratio pi_{v+1} / pi_v: the denominator is the rollout's own log-probs (v's), not the trainer's forward
    with the current weights (v+1's); the update reports its staleness. A batch of the current version is
    on-policy as without versions, bit for bit; a rollout newer than the weights is refused."""
    import agents.trainer as trainer_module

    pop = population(nonzero_std=0.5)
    trainer = PolicyGradientTrainer(pop, TrainerConfig(lr=5e-2))
    batch, own_logprobs, at_v, generated = _generated_by_version_0(trainer)
    trainer.update("ma", make_rollouts(6, seed=8), version=0)  # the member moves on to version 1
    at_next = own_logprobs()
    v1 = pop.state("ma"), copy.deepcopy(pop.optimizer_state_dict("ma"))
    assert (at_next - at_v).abs().max() > 1e-3  # v+1 scores these completions differently

    seen: list[tuple[list[int], torch.Tensor]] = []  # (rows, the ratio's denominator) of each micro-batch
    real = trainer_module._Targets.old_logprobs

    def spy(self, rows, lp):
        out = real(self, rows, lp)
        seen.append((list(rows), out.detach().clone()))
        return out

    monkeypatch.setattr(trainer_module._Targets, "old_logprobs", spy)
    m = trainer.update("ma", generated, version=1)
    assert m["staleness"] == 1.0 and m["staleness_max"] == 1.0
    old = torch.zeros_like(at_v)
    for rows, lp in seen:
        old[rows] = lp
    assert sorted(i for rows, _ in seen for i in rows) == list(range(len(generated)))
    assert torch.equal(old * batch.mask, at_v * batch.mask)  # v's log-probs, exactly
    assert (old - at_next).mul(batch.mask).abs().max() > 1e-3  # not v+1's
    assert m["approx_kl"] > 0  # the ratio is not 1: the weights moved since the rollouts were sampled
    drift = ((at_next - at_v).abs() * batch.mask).sum() / batch.mask.sum()  # the mismatch: against v+1's weights
    assert m["mismatch_abs_mean"] == pytest.approx(float(drift), rel=1e-3)

    # the same rollouts as if generated by the current version: on-policy, as without versions, bit for bit
    updated = {}
    for way, batch_of in (("fresh", [dataclasses.replace(r, version=1) for r in generated]),
                          ("unversioned", [dataclasses.replace(r, version=None) for r in generated])):
        p = population(nonzero_std=0.5)
        p.load_state("ma", v1[0])
        p.load_optimizer_state_dict("ma", copy.deepcopy(v1[1]))
        updated[way] = (PolicyGradientTrainer(p, TrainerConfig(lr=5e-2)).update("ma", batch_of, version=1), p.state("ma"))
    (m_fresh, w_fresh), (m_none, w_none) = updated["fresh"], updated["unversioned"]
    assert m_fresh["staleness"] == 0.0 and m_fresh["approx_kl"] == 0.0 and "staleness" not in m_none
    assert all(torch.equal(w_fresh[k], w_none[k]) for k in w_fresh)
    assert {k: v for k, v in m_fresh.items() if k not in ("seconds", "staleness", "staleness_max")} == \
        {k: v for k, v in m_none.items() if k != "seconds"}
    with pytest.raises(ValueError, match="newer than the version"):
        trainer.update("ma", generated, version=-1)


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_a_stale_batch_under_an_importance_correction_is_the_decoupled_objective(population, mode):
    """With ``is_correction`` a stale batch keeps the trainer's own pre-update log-probs (version v+1's) as the
    ratio's denominator, and each token's surrogate is weighted by w = pi_{v+1} / pi_v truncated (TIS) or masked
    (MIS) at the cap: one optimizer step, rho = 1, so pg_loss = sum(-A w' m) / N_tok (agents.trainer's docstring)."""
    pop = population(nonzero_std=0.5)
    plain = PolicyGradientTrainer(pop, TrainerConfig(lr=5e-2))
    batch, own_logprobs, at_v, generated = _generated_by_version_0(plain)
    plain.update("ma", generated, version=0)  # the member moves on to version 1
    at_next = own_logprobs()
    m = batch.mask
    w = torch.exp(at_next - at_v)
    cap = float(w[(m > 0) & (w > 1)].median())  # some tokens' weights above the cap, some below
    trainer = PolicyGradientTrainer(pop, TrainerConfig(lr=5e-2, is_correction=mode, is_cap=cap,
                                                       skip_zero_advantage=False))
    adv = trainer._advantages(generated, batch, torch.tensor([r.reward for r in generated]),
                              [r.group for r in generated], token_rewards=None)
    weight = w.clamp(max=cap) if mode == "tis" else torch.where(w > cap, torch.zeros_like(w), w)
    metrics = trainer.update("ma", generated, version=1)
    assert metrics["staleness"] == 1.0
    assert 0 < metrics["is_capped_frac"] < 1
    assert metrics["approx_kl"] == 0.0  # the ratio is against the weights being trained: rho = 1
    assert metrics["pg_loss"] == pytest.approx(float((-adv * weight * m).sum() / m.sum()), rel=1e-3, abs=1e-6)


# ------------------------------------------------------------------------------------------------ KL


def test_kl_loss_is_zero_for_a_fresh_member_and_grows_after_training(population):
    pop = population()  # PEFT init: B = 0, every member equals the base
    cfg = TrainerConfig(lr=5e-2, kl_mode="loss", kl_coef=0.1)
    trainer = PolicyGradientTrainer(pop, cfg)
    m0 = trainer.update("ma", make_rollouts(6))
    assert m0["kl"] == 0.0
    for _ in range(3):
        m = trainer.update("ma", make_rollouts(6))
    assert m["kl"] > 0


def test_kl_in_reward_changes_nothing_at_the_base_and_shapes_the_reward_after(population):
    rollouts = make_rollouts(6, seed=6)
    pa, pb = population(), population()
    ma = PolicyGradientTrainer(pa, TrainerConfig(lr=1e-2, kl_mode="reward", kl_coef=0.5)).update(
        "ma", rollouts
    )
    mb = PolicyGradientTrainer(pb, TrainerConfig(lr=1e-2)).update("ma", rollouts)
    assert ma["kl"] == 0.0
    assert ma["advantage_abs_mean"] == pytest.approx(mb["advantage_abs_mean"])
    for (k, a), b in zip(pa.state("ma").items(), pb.state("ma").values(), strict=True):
        torch.testing.assert_close(a, b, msg=k)
    # a member that differs from the base gets KL-penalised token rewards -> different advantages
    pc = population(nonzero_std=0.5)
    mc = PolicyGradientTrainer(pc, TrainerConfig(kl_mode="reward", kl_coef=0.5)).update("ma", rollouts)
    md = PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig()).update("ma", rollouts)
    assert mc["kl"] != 0.0 and mc["advantage_abs_mean"] != pytest.approx(md["advantage_abs_mean"])


# ---------------------------------------------------------------------------------- bookkeeping


def test_empty_rollouts_take_no_step(population):
    pop = population(nonzero_std=0.5)
    before = pop.state("ma")
    trainer = PolicyGradientTrainer(pop)
    m = trainer.update("ma", [])
    assert m["skipped"] == 1.0 and m["num_rollouts"] == 0 and m["num_steps"] == 0 and m["tokens"] == 0
    m = trainer.update("ma", [Rollout([1, 2], [], 1.0), Rollout([3], [], 0.0)])
    assert m["skipped"] == 1.0 and m["num_rollouts"] == 2 and m["tokens"] == 0
    assert not pop.has_optimizer("ma")
    assert all(torch.equal(before[k], v) for k, v in pop.state("ma").items())
    with pytest.raises(ValueError, match="empty prompt"):
        trainer.update("ma", [Rollout([], [1], 1.0)])


def test_reward_metrics():
    from agents.trainer import _reward_metrics

    m = _reward_metrics(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b", "c"])
    assert m["frac_reward_zero_std"] == 0.5  # a: zero std, b: not, c: single (not counted)
    assert m["reward_mean"] == pytest.approx(0.7)
    assert m["reward_std"] == pytest.approx(
        torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]).std(unbiased=False).item()
    )
    assert math.isnan(_reward_metrics(torch.tensor([1.0]), ["a"])["frac_reward_zero_std"])


def test_update_many_trains_each_member_and_leaves_the_others_bitwise(population):
    pop = population(names=("ma", "mb", "mc"), nonzero_std=0.5)
    before = {n: pop.state(n) for n in pop.names}
    pop.activate("mb")
    out = PolicyGradientTrainer(pop, TrainerConfig(lr=1e-2)).update_many(
        {"ma": make_rollouts(4, seed=1), "mc": make_rollouts(5, seed=2)}
    )
    assert set(out) == {"ma", "mc"} and out["mc"]["num_rollouts"] == 5
    assert pop.active == "mb"  # the previously active member is restored
    for name in ("ma", "mc"):
        assert all(not torch.equal(before[name][k], v) for k, v in pop.state(name).items())
    assert all(torch.equal(before["mb"][k], v) for k, v in pop.state("mb").items())
    assert not pop.has_optimizer("mb")


# ------------------------------------------------------------------------------------------ learning


@torch.no_grad()
def sample(pop, member: str, prompts: list[list[int]], n: int, max_new_tokens: int, gen: torch.Generator):
    """Minimal temperature-1 sampler (KV cache, inverse-CDF draws) for the learning tests.

    Not agents.generation.hf.HFGenerator: that backend draws each row with torch.multinomial over the 49k
    vocabulary, ~10-25 ms per token on this CPU, which alone would take ~90 s of CPU per learning test; the
    inverse-CDF draw here is ~100x cheaper. The trainer/generator agreement is checked separately
    (test_trainer_logprobs_match_the_hf_generator_behaviour_logprobs)."""
    assert len({len(p) for p in prompts}) == 1, "equal-length prompts: no padding needed"
    rows = [p for p in prompts for _ in range(n)]
    ids = torch.tensor(rows)
    x, cache, out, lps = ids, None, [], []
    with pop.activate(member):
        for _ in range(max_new_tokens):
            o = pop.model(input_ids=x, past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            logp = torch.log_softmax(o.logits[:, -1].float(), -1)
            u = torch.rand(len(rows), 1, generator=gen)
            tok = torch.searchsorted(logp.exp().cumsum(-1), u).clamp(max=logp.shape[-1] - 1)
            out.append(tok)
            lps.append(logp.gather(-1, tok))
            x = tok
    toks, lps = torch.cat(out, 1).tolist(), torch.cat(lps, 1).tolist()
    return [(i // n, rows[i], toks[i], lps[i]) for i in range(len(rows))]


@pytest.mark.parametrize("advantage", ["reinforce_pp", "grpo"])
def test_learns_a_toy_verifiable_reward(population, advantage):
    """Reward = fraction of generated tokens in a target set: the 10% of the vocabulary whose (tied) output
    embeddings point most along a fixed random direction, so a random model hits it ~10% of the time and the
    LoRA can raise it by steering the last hidden state. Temperature-1 sampling, 2 prompts x 8 samples x 8
    tokens per update, 30 updates at lr 5e-2.

    The trajectory is chaotic: a 1e-6 change of an update changes later samples, so the packing layout (equal
    gradients up to float summation order, tests/agents/test_packing.py) gives another run. Sampling seeds 0-4
    measured (reinforce_pp, reward of the 30th update): padded 0.45 0.30 0.48 0.41 0.56; prefix-packed 0.13 0.58
    0.43 0.23 0.55 (seed 0 never left ~0.1). With tree attention over the packed layout (the default since;
    ``agents.tree_attention``), seeds 0-4, first-5 -> last-5 mean reward: reinforce_pp 0.10->0.44, 0.13->0.53,
    0.12->0.43, 0.10->0.40, 0.10->0.46; grpo 0.09->0.38, 0.12->0.24, 0.10->0.47, 0.10->0.46, 0.09->0.42 (the
    one run under the +0.15 bar: seed 1, grpo). The sampling seed is 0 since tree attention."""
    t0 = time.perf_counter()
    pop = population(names=("ma", "mb", "mc"), rank=4, alpha=8)
    emb = pop.model.get_input_embeddings().weight.detach()
    score = emb @ torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(1))
    target = score > score.quantile(0.9)
    gen = torch.Generator().manual_seed(0)
    prompts = [[504, 282, 30, 94, 33], [2361, 282, 30, 17, 1133]]
    cfg = TrainerConfig(advantage=advantage, lr=5e-2, weight_decay=0.0, micro_batch_size=16)
    trainer = PolicyGradientTrainer(pop, cfg)
    before = {n: pop.state(n) for n in pop.names}
    rewards = []
    for _ in range(30):
        rollouts = [
            Rollout(p, c, float(target[c].float().mean()), group=g, logprobs=lp)
            for g, p, c, lp in sample(pop, "ma", prompts, n=8, max_new_tokens=8, gen=gen)
        ]
        m = trainer.update("ma", rollouts)
        assert m["skipped"] == 0.0 and m["num_rollouts"] == 16 and m["tokens"] == 128
        rewards.append(m["reward_mean"])
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"{advantage}: reward first5 {first:.3f} last5 {last:.3f} ({time.perf_counter() - t0:.1f}s)")
    assert last > first + 0.15, rewards
    after = {n: pop.state(n) for n in pop.names}
    changed = [k for k in before["ma"] if not torch.equal(before["ma"][k], after["ma"][k])]
    assert len(changed) == len(before["ma"])  # every trainable tensor of the trained member moved
    for other in ("mb", "mc"):
        assert all(torch.equal(before[other][k], after[other][k]) for k in before[other])


# ------------------------------------------------------------------------ rollout/trainer mismatch, TIS / MIS


def _with_generator_logprobs(pop, rollouts, offsets):
    """``rollouts`` carrying the member's own log-probs plus a fixed offset per token (as a generator whose
    numerics differ would report them), and the trainer's log-probs."""
    trainer = PolicyGradientTrainer(pop, TrainerConfig())
    batch = pack_rollouts(rollouts)
    with pop.activate("ma"):
        own = trainer.forward.logprobs_no_grad(batch, reference=False)
    out = []
    for i, r in enumerate(rollouts):
        n = len(r.completion_ids)
        mu = (own[i, :n] + offsets[i, :n]).tolist()
        out.append(Rollout(r.prompt_ids, r.completion_ids, r.reward, r.group, r.scope, logprobs=mu))
    return out, own, batch


def test_mismatch_is_measured_against_the_generators_logprobs(population):
    """mismatch_abs_mean / mismatch_abs_max / mismatch_kl are mean |d|, max |d| and mean(exp(d) - 1 - d) over the
    completion tokens, d = the trainer's log-prob minus the generator's (agents.trainer's docstring)."""
    pop = population(nonzero_std=0.5)
    rollouts = make_rollouts(6, seed=3)
    g = torch.Generator().manual_seed(0)
    offsets = 0.3 * torch.randn(6, 8, generator=g)
    with_lp, _, batch = _with_generator_logprobs(pop, rollouts, offsets)
    metrics = PolicyGradientTrainer(pop, TrainerConfig(skip_zero_advantage=False)).update("ma", with_lp)
    d = -offsets[:, : batch.mask.shape[1]][batch.mask.bool()].double()
    assert metrics["mismatch_abs_mean"] == pytest.approx(float(d.abs().mean()), rel=1e-4, abs=1e-6)
    assert metrics["mismatch_abs_max"] == pytest.approx(float(d.abs().max()), rel=1e-4, abs=1e-6)
    assert metrics["mismatch_kl"] == pytest.approx(float((torch.expm1(d) - d).mean()), rel=1e-3, abs=1e-6)
    plain = PolicyGradientTrainer(population(nonzero_std=0.5)).update("ma", rollouts)  # no log-probs: no metric
    assert "mismatch_kl" not in plain


def test_hf_generators_logprobs_agree_with_the_trainers(population, tiny_tokenizer):
    """On CPU the HF generator samples with the trainer's numbers: the mismatch of its rollouts is float
    rounding (why ``is_correction`` is ``none`` on CPU)."""
    from agents.generation import GenerationRequest, HFGenerator

    pop = population(nonzero_std=0.5)
    completions = HFGenerator(pop, tiny_tokenizer).generate(
        [GenerationRequest("ma", "def f(x):", max_new_tokens=8, n=4, seed=1, chat=False)])
    rollouts = [Rollout(c.prompt_token_ids, c.token_ids, float(i), group=i, logprobs=c.logprobs)
                for i, c in enumerate(completions)]
    metrics = PolicyGradientTrainer(pop, TrainerConfig(skip_zero_advantage=False)).update("ma", rollouts)
    assert metrics["mismatch_abs_max"] < 1e-4 and metrics["mismatch_kl"] < 1e-8


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_importance_correction_weighs_the_loss_as_its_docstring_says(population, monkeypatch, mode):
    """TIS: each token's surrogate times min(w, C); MIS: times w where w <= C, else 0; w = exp(lp_trainer -
    lp_generator). With one optimizer step rho = 1, so pg_loss = sum(-A w' m) / N_tok; the gradient is the
    uncorrected one with each token's term weighted."""
    cap = 1.2
    pop = population(nonzero_std=0.5)
    rollouts = make_rollouts(6, seed=4)
    offsets = 0.4 * torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    with_lp, own, batch = _with_generator_logprobs(pop, rollouts, offsets)
    cfg = TrainerConfig(is_correction=mode, is_cap=cap, skip_zero_advantage=False)
    trainer = PolicyGradientTrainer(pop, cfg)
    adv = trainer._advantages(with_lp, batch, torch.tensor([r.reward for r in with_lp]), [r.group for r in with_lp],
                              token_rewards=None)
    w = torch.exp(own - rollout_logprobs(with_lp, batch))
    weight = w.clamp(max=cap) if mode == "tis" else torch.where(w > cap, torch.zeros_like(w), w)
    m = batch.mask
    metrics = trainer.update("ma", with_lp)
    assert metrics["pg_loss"] == pytest.approx(float((-adv * weight * m).sum() / m.sum()), rel=1e-4, abs=1e-6)
    assert metrics["is_capped_frac"] == pytest.approx(float(((w > cap).float() * m).sum() / m.sum()), abs=1e-6)
    assert 0 < metrics["is_capped_frac"] < 1
    plain = PolicyGradientTrainer(population(nonzero_std=0.5), TrainerConfig(skip_zero_advantage=False))
    assert plain.update("ma", with_lp)["pg_loss"] == pytest.approx(float((-adv * m).sum() / m.sum()), rel=1e-4,
                                                                     abs=1e-6)


def test_importance_correction_needs_the_generators_logprobs(population):
    from populora_env.checks import ConfigError

    with pytest.raises(ValueError, match="rollout 0 has no logprobs"):
        PolicyGradientTrainer(population(), TrainerConfig(is_correction="tis")).update("ma", make_rollouts())
    with pytest.raises(ConfigError, match="is_correction.*use_behaviour_logprobs"):
        TrainerConfig(is_correction="mis", use_behaviour_logprobs=True).validate()
    with pytest.raises(ConfigError, match="is_cap"):
        TrainerConfig(is_correction="tis", is_cap=0.5).validate()
