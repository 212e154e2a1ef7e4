"""Tests of agents.population.LoRAPopulation on the tiny-random base."""

from __future__ import annotations

import json

import pytest
import torch

from agents.population import LoRAPopulation, randomize_member


def _equal_states(s1, s2) -> bool:
    return s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)


def _loss(pop, tokenizer) -> torch.Tensor:
    batch = tokenizer(["def f(x): return x + 1", "print('hello world')"], return_tensors="pt", padding=True)
    out = pop.model(**batch, labels=batch["input_ids"])
    return out.loss


def test_state_keys_are_peft_file_keys(population):
    from peft import get_peft_model_state_dict

    pop = population(["ma", "mb"])
    state = pop.state("ma")
    assert set(state) == set(get_peft_model_state_dict(pop.model, adapter_name="ma"))
    n_modules = 2 * 7  # 2 layers x 7 target modules
    assert len(state) == 2 * n_modules
    assert all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in state)
    key_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert state[key_a].shape == (4, 64) and state[key_a].device.type == "cpu"
    assert all(torch.count_nonzero(v) == 0 for k, v in state.items() if "lora_B" in k)  # PEFT init: B = 0
    state[key_a].add_(1.0)  # a detached clone: the member is untouched
    assert not torch.equal(state[key_a], pop.state("ma")[key_a])


def test_seeded_init_depends_only_on_seed_and_name(population):
    p1 = population(["ma", "mb"], seed=3)
    p2 = population(["mb", "ma", "mc"], seed=3)
    p3 = population(["ma"], seed=4)
    assert _equal_states(p1.state("ma"), p2.state("ma"))
    assert _equal_states(p1.state("mb"), p2.state("mb"))
    assert not _equal_states(p1.state("ma"), p1.state("mb"))
    assert not _equal_states(p1.state("ma"), p3.state("ma"))


def test_training_one_member_leaves_others_bitwise_equal(population, tiny_tokenizer):
    pop = population(["ma", "mb", "mc"], nonzero_std=0.1)
    before = {n: pop.state(n) for n in pop.names}
    base_before = {k: v.clone() for k, v in pop.model.named_parameters() if "lora_" not in k}
    for _step in range(2):
        with pop.activate("mb"):
            assert pop.active == "mb"
            assert all(p.requires_grad for p in pop.parameters("mb"))
            assert not any(p.requires_grad for n in ("ma", "mc") for p in pop.parameters(n))
            _loss(pop, tiny_tokenizer).backward()
            opt = pop.optimizer("mb", lr=1e-2, weight_decay=0.1)
            assert pop.optimizer("mb", lr=1e-2, weight_decay=0.1) is opt  # created once, reused
            opt.step()
            opt.zero_grad(set_to_none=True)
        assert pop.active == "ma"  # the context manager restored the previous member
    assert _equal_states(before["ma"], pop.state("ma"))
    assert _equal_states(before["mc"], pop.state("mc"))
    assert not _equal_states(before["mb"], pop.state("mb"))
    for k, v in pop.model.named_parameters():
        if "lora_" not in k:
            assert torch.equal(v, base_before[k]) and not v.requires_grad
    assert len(pop.optimizer("mb").param_groups[0]["params"]) == len(pop.parameters("mb"))
    assert pop.optimizer("mb").state[pop.parameters("mb")[0]]["step"] == 2


def test_optimizer_hyperparameters_and_state_dict_round_trip(population, tiny_tokenizer):
    pop = population(["ma", "mb"], nonzero_std=0.1)
    pop.activate("ma")
    _loss(pop, tiny_tokenizer).backward()
    pop.optimizer("ma", lr=1e-3).step()
    assert pop.optimizer("ma", lr=5e-4).param_groups[0]["lr"] == 5e-4  # the latest call's hyperparameters
    sd = pop.optimizer_state_dict("ma")
    assert pop.optimizer_state_dict("mb") is None and not pop.has_optimizer("mb")
    pop.reset_optimizer("ma")
    assert not pop.has_optimizer("ma")
    pop.load_optimizer_state_dict("ma", sd)
    restored = pop.optimizer("ma", lr=5e-4)
    p0 = pop.parameters("ma")[-1]
    assert torch.equal(restored.state[p0]["exp_avg"], sd["state"][len(pop.parameters("ma")) - 1]["exp_avg"])
    with pytest.raises(ValueError, match="cannot be loaded"):
        pop.load_optimizer_state_dict("mb", {"state": {}, "param_groups": [{"params": [0, 1], "lr": 1.0}]})


def test_member_optimizer_runs_foreach_with_the_loops_values(population, tiny_tokenizer):
    """Members' AdamW runs the multi-tensor step (also once restored from a state saved without it), and three
    steps give the per-tensor loop's weights and moments bit for bit."""
    pop = population(["ma", "mb"], nonzero_std=0.1)
    loop_params = [torch.nn.Parameter(p.detach().clone()) for p in pop.parameters("ma")]
    loop = torch.optim.AdamW(loop_params, lr=1e-3, weight_decay=0.1, foreach=False)
    for _ in range(3):
        pop.activate("ma")
        _loss(pop, tiny_tokenizer).backward()
        for mine, p in zip(loop_params, pop.parameters("ma"), strict=True):
            mine.grad = p.grad.clone()
        opt = pop.optimizer("ma", lr=1e-3, weight_decay=0.1)
        assert opt.param_groups[0]["foreach"] is True
        opt.step()
        loop.step()
        opt.zero_grad(set_to_none=True)
    for mine, p in zip(loop_params, pop.parameters("ma"), strict=True):
        assert torch.equal(mine, p)
        assert torch.equal(loop.state[mine]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])
    sd = pop.optimizer_state_dict("ma")
    for group in sd["param_groups"]:
        group["foreach"] = None  # as a checkpoint written before the choice holds it
    pop.load_optimizer_state_dict("ma", sd)
    assert pop.optimizer("ma", lr=1e-3).param_groups[0]["foreach"] is True


def test_load_state_in_place_and_errors(population):
    pop = population(["ma", "mb"], nonzero_std=0.3)
    params_before = [id(p) for p in pop.parameters("ma")]
    pop.load_state("ma", pop.state("mb"))
    assert [id(p) for p in pop.parameters("ma")] == params_before  # no reallocation
    assert _equal_states(pop.state("ma"), pop.state("mb"))
    state = pop.state("ma")
    key = next(iter(state))
    with pytest.raises(KeyError, match="1 missing key"):
        pop.load_state("ma", {k: v for k, v in state.items() if k != key})
    with pytest.raises(ValueError, match="shape mismatch"):
        pop.load_state("ma", {**state, key: torch.zeros(3, 3)})
    with pytest.raises(KeyError, match="no member named"):
        pop.state("zzz")


def test_add_remove_rename(population, tiny_tokenizer):
    pop = population(["ma", "mb"], nonzero_std=0.2)
    pop.add("mc", pop.state("ma"))
    assert pop.names == ["ma", "mb", "mc"] and _equal_states(pop.state("ma"), pop.state("mc"))
    with pytest.raises(ValueError, match="already exists"):
        pop.add("ma")
    with pytest.raises(ValueError, match="invalid member name"):
        pop.add("bad.name")
    # rename keeps weights, optimizer state, position and activity
    pop.activate("mb")
    _loss(pop, tiny_tokenizer).backward()
    pop.optimizer("mb", lr=1e-3).step()
    weights, opt_sd = pop.state("mb"), pop.optimizer_state_dict("mb")
    pop.rename("mb", "mb2")
    assert pop.names == ["ma", "mb2", "mc"] and pop.active == "mb2"
    assert _equal_states(weights, pop.state("mb2"))
    new_sd = pop.optimizer_state_dict("mb2")
    assert torch.equal(new_sd["state"][0]["exp_avg"], opt_sd["state"][0]["exp_avg"])
    assert all(p.requires_grad for p in pop.parameters("mb2"))
    assert not any(p.requires_grad for p in pop.parameters("ma"))
    pop.remove("mb2")
    assert pop.names == ["ma", "mc"] and pop.active in pop.names and "mb2" not in pop.model.peft_config
    assert all(p.requires_grad for p in pop.parameters(pop.active))
    pop.remove("mc")
    with pytest.raises(ValueError, match="at least one member"):
        pop.remove("ma")


def test_save_load_round_trip_identical_greedy(population, tiny_tokenizer, tmp_path):
    pop = population(["ma", "mb"], nonzero_std=0.5)
    inputs = tiny_tokenizer("Write a function", return_tensors="pt")

    def greedy(p, name):
        with p.activate(name):
            return p.model.generate(**inputs, max_new_tokens=12, do_sample=False)[0].tolist()

    expected = greedy(pop, "ma")
    pop.save("ma", tmp_path / "ma")
    cfg = json.loads((tmp_path / "ma" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and set(cfg["target_modules"]) == set(pop.target_modules)
    other = population(["mx"])
    other.load(tmp_path / "ma", "ma")
    assert _equal_states(other.state("ma"), pop.state("ma"))
    assert greedy(other, "ma") == expected
    other.load(tmp_path / "ma", "mx")  # replaces an existing member in place
    assert _equal_states(other.state("mx"), pop.state("ma"))
    assert greedy(pop, "mb") != expected  # the members really differ


def test_saved_member_loads_with_peft_from_pretrained(population, tiny_base, tiny_tokenizer, tmp_path):
    from peft import PeftModel

    pop = population(["ma"], nonzero_std=0.5)
    pop.save("ma", tmp_path / "ma")
    base, _ = tiny_base
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "ma"))
    inputs = tiny_tokenizer("hello there", return_tensors="pt")
    with torch.no_grad():
        ours = pop.model(**inputs).logits
        theirs = peft_model(**inputs).logits
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_load_rejects_incompatible_adapter(population, tmp_path):
    pop = population(["ma"], rank=4)
    population(["ma"], rank=8).save("ma", tmp_path / "r8")
    with pytest.raises(ValueError, match=r"rank 8 != 4"):
        pop.load(tmp_path / "r8", "mz")
    population(["ma"], rank=4, target_modules=("q_proj", "v_proj")).save("ma", tmp_path / "qv")
    with pytest.raises(ValueError, match="target_modules"):
        pop.load(tmp_path / "qv", "mz")
    with pytest.raises(FileNotFoundError, match="not a PEFT adapter"):
        pop.load(tmp_path, "mz")
    assert pop.names == ["ma"]


def test_save_all_load_all(population, tiny_tokenizer, tmp_path):
    pop = population(["ma", "mb", "mc"], nonzero_std=0.2)
    pop.activate("mc")
    _loss(pop, tiny_tokenizer).backward()
    pop.optimizer("mc", lr=1e-3).step()
    pop.save_all(tmp_path / "ckpt")
    other = population(["ma", "mzz"], seed=9)
    other.load_all(tmp_path / "ckpt")
    assert other.names == ["ma", "mb", "mc"] and other.active == "mc"
    for name in pop.names:
        assert _equal_states(pop.state(name), other.state(name))
    assert other.optimizer_state_dict("ma") is None
    sd1, sd2 = pop.optimizer_state_dict("mc"), other.optimizer_state_dict("mc")
    assert sd1["param_groups"][0]["lr"] == sd2["param_groups"][0]["lr"] == 1e-3
    assert all(
        torch.equal(sd1["state"][i]["exp_avg_sq"], sd2["state"][i]["exp_avg_sq"]) for i in sd1["state"]
    )


def test_mixed_forward_matches_peft_per_row(population, tiny_tokenizer):
    pop = population(["ma", "mb", "mc"], nonzero_std=0.5)
    texts = ["one two three", "four five", "six", "seven eight nine ten"]
    rows = ["ma", None, "mc", "mb"]
    batch = tiny_tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad(), pop.mixed(rows):
        mixed = pop.model(**batch).logits
    with torch.no_grad():
        peft_mixed = pop.model(**batch, adapter_names=[r or "__base__" for r in rows]).logits
    assert torch.allclose(mixed, peft_mixed, atol=1e-5)
    for i, adapter in enumerate(rows):
        single = tiny_tokenizer(texts[i], return_tensors="pt")
        n = single["input_ids"].shape[1]
        with torch.no_grad():
            if adapter is None:
                with pop.disabled():
                    ref = pop.model(**single).logits[0]
            else:
                with pop.activate(adapter):
                    ref = pop.model(**single).logits[0]
        assert torch.allclose(mixed[i, -n:], ref, atol=1e-4)
    # the patch is removed on exit
    assert not any("forward" in m.__dict__ for m in pop.model.modules())
    with pytest.raises(ValueError, match="set up for 4 rows"), torch.no_grad(), pop.mixed(rows):
        pop.model(input_ids=batch["input_ids"][:2])


def _grads(pop, name, tokenizer, single: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    for p in pop.parameters(name):
        p.grad = None
    with pop.activate(name):
        if single:
            with pop.single(name):
                loss = _loss(pop, tokenizer)
        else:
            loss = _loss(pop, tokenizer)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in pop._member_params(name).items()}


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_single_forward_gives_peft_loss_and_gradients(population, tiny_tokenizer, dropout):
    """``single``'s one-addmm LoRA: PEFT's loss and LoRA gradients within float rounding (with dropout too, the
    same draws in the same order), and the patch is gone on exit."""
    pop = population(["ma", "mb"], nonzero_std=0.5, dropout=dropout)
    pop.model.train()
    torch.manual_seed(5)
    ref_loss, ref = _grads(pop, "ma", tiny_tokenizer, single=False)
    torch.manual_seed(5)
    loss, got = _grads(pop, "ma", tiny_tokenizer, single=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert ref.keys() == got.keys() and all(torch.count_nonzero(g) > 0 for g in ref.values())
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6)
    assert not any("forward" in m.__dict__ for m in pop.model.modules())


def test_single_forward_runs_only_for_the_active_member(population, tiny_tokenizer):
    from agents.population import _SingleForward

    pop = population(["ma", "mb"], nonzero_std=0.5)
    with pytest.raises(RuntimeError, match="needs 'mb' active"), pop.activate("ma"), pop.single("mb"):
        pass
    batch = tiny_tokenizer(["one two three"], return_tensors="pt")
    with torch.no_grad(), pop.activate("ma"), pop.single("ma"):
        assert sum(isinstance(m.__dict__.get("forward"), _SingleForward) for m in pop.model.modules()) == 14
        with pop.disabled():  # adapters off inside: the base, exactly
            base = pop.model(**batch).logits
        lora = pop.model(**batch).logits
    with torch.no_grad(), pop.disabled():
        assert torch.equal(base, pop.model(**batch).logits)
    with torch.no_grad(), pop.activate("ma"):
        torch.testing.assert_close(lora, pop.model(**batch).logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(base, lora)


def test_randomize_member_is_seeded(population):
    p1, p2 = population(["ma"]), population(["ma"])
    randomize_member(p1, "ma", std=0.1, seed=1)
    randomize_member(p2, "ma", std=0.1, seed=1)
    assert _equal_states(p1.state("ma"), p2.state("ma"))
    assert any(torch.count_nonzero(v) > 0 for k, v in p1.state("ma").items() if "lora_B" in k)


def test_constructor_errors(tiny_base):
    base, _ = tiny_base
    with pytest.raises(ValueError, match="at least one"):
        LoRAPopulation(base, [])
    with pytest.raises(ValueError, match="duplicate"):
        LoRAPopulation(base, ["ma", "ma"])
    with pytest.raises(ValueError, match="invalid member name"):
        LoRAPopulation(base, ["__base__"])


BF16_MODULE_TOL = 0.01
"""One LoRA module on a bf16 base: the fused product in bf16 against the same math in float32, same (bf16)
input: gradients of A and B within 1 % of the largest entry (measured 0.35 % and 0.27 %: bf16 rounding)."""
BF16_MODEL_COSINE, BF16_MODEL_REL = 0.995, 0.10
"""A whole update on the bf16 tiny-random base: the member's gradient with the LoRA in bf16 against the LoRA in
float32 (PEFT's forward) on the same base: cosine >= 0.995 and |a - b| / |b| <= 10 % (measured 0.9992 and 4.1 %:
every rounding difference passes through the bf16 layers after it)."""


def test_fused_lora_math_in_bf16_matches_float32(population, tiny_base):
    from agents.population import LoRAPopulation

    pop = LoRAPopulation(tiny_base[0].to(torch.bfloat16), ["ma"], rank=4, alpha=8)
    randomize_member(pop, "ma", std=0.5)
    module = pop._lora_layers[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, module.in_features, generator=g).to(torch.bfloat16)
    w = torch.randn(3, 7, module.out_features, generator=g)
    a, b = module.lora_A["ma"].weight, module.lora_B["ma"].weight
    with pop.single("ma"):
        out = module(x)
    assert out.dtype == torch.bfloat16 and a.dtype == b.dtype == torch.float32
    got = torch.autograd.grad((out.float() * w).sum(), (a, b))
    ref = (x.float() @ a.t()) @ b.t() * module.scaling["ma"]  # the LoRA term in float32 (the base adds no grad)
    want = torch.autograd.grad((ref * w).sum(), (a, b))
    for p, q in zip(got, want, strict=True):
        assert p.dtype == torch.float32
        assert (p - q).abs().max() <= BF16_MODULE_TOL * q.abs().max()


def test_fused_lora_on_a_bf16_base_computes_in_bf16_with_float32_master_weights(population, tiny_base, monkeypatch):
    """On a bf16 base the fused LoRA runs in bf16 (its input is never copied to float32: what enters each LoRA A
    is bf16) while the adapter's parameters, their gradients and the optimizer state stay float32; the update's
    gradient is the float32 LoRA's (PEFT's forward) on the same base within :data:`BF16_MODEL_COSINE` /
    :data:`BF16_MODEL_REL`."""
    from agents.population import LoRAPopulation
    from agents.trainer import PolicyGradientTrainer, TrainerConfig
    from tests.agents.test_packing import shared_rollouts
    from tests.agents.test_trainer import capture

    pop32 = population(nonzero_std=0.5)
    pop16 = LoRAPopulation(tiny_base[0].to(torch.bfloat16), ["ma", "mb"], rank=4, alpha=8, seed=0)
    pop16.load_state("ma", pop32.state("ma"))
    assert {p.dtype for p in pop16.parameters("ma")} == {torch.float32}  # PEFT keeps adapters in float32
    seen: list[torch.dtype] = []
    for module in pop16._lora_layers:  # what enters each LoRA A: the input as the product computes it
        module.lora_dropout["ma"].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    rollouts = shared_rollouts()
    grads = {}
    for impl in ("fused", "peft"):
        cap = capture(pop16, monkeypatch, "ma")
        seen.clear()
        PolicyGradientTrainer(pop16, TrainerConfig(lora_impl=impl)).update("ma", rollouts)
        grads[impl] = torch.cat([g.flatten() for g in cap.grads[0]])
        assert seen and set(seen) == {torch.bfloat16 if impl == "fused" else torch.float32}
    a, b = grads["fused"], grads["peft"]
    assert a.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) >= BF16_MODEL_COSINE
    assert (a - b).norm() <= BF16_MODEL_REL * b.norm()
    monkeypatch.undo()
    trainer = PolicyGradientTrainer(pop16, TrainerConfig())
    trainer.update("ma", rollouts)
    opt = pop16.optimizer("ma")
    assert {t.dtype for st in opt.state.values() for t in st.values() if t.dim() > 0} == {torch.float32}


_SAVE_CONFIG = """
import hashlib, sys
from agents.models import load_base
from agents.population import LoRAPopulation
base, _ = load_base("tiny-random")
LoRAPopulation(base, ["a"], rank=4, alpha=8, seed=0).save("a", sys.argv[1])
print(open(sys.argv[1] + "/adapter_config.json").read())
"""


def test_a_saved_adapter_config_is_the_same_bytes_in_every_process(tmp_path):
    """``target_modules`` is a set: written in the process's string-hash order, a checkpoint's
    ``adapter_config.json`` differed between a run and its resumed continuation (issue 48). Two processes with
    other hash seeds write the same bytes, the modules sorted."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    texts = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, HF_HUB_OFFLINE="1", PYTHONPATH=str(repo))
        p = subprocess.run([sys.executable, "-c", _SAVE_CONFIG, str(tmp_path / hash_seed)], capture_output=True,
                           text=True, env=env, cwd=repo, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        texts.append((tmp_path / hash_seed / "adapter_config.json").read_bytes())
    assert texts[0] == texts[1]
    modules = json.loads(texts[0])["target_modules"]
    assert modules == sorted(modules) and len(modules) > 1


def test_optimizer_state_bytes_do_not_depend_on_the_folder_name(tmp_path):
    """``torch.save`` to an ASCII path names the archive's folder after the file, to a non-ASCII one ``archive``:
    a run in ``run dir ü`` wrote other ``optimizer.pt`` bytes than the same run elsewhere (issue 48's resume
    test). Saved through a file, the bytes are the same in both, and the state loads back."""
    from agents.population import save_optimizer_state

    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}},
             "param_groups": [{"lr": 1e-3, "params": [0]}]}
    paths = [tmp_path / "plain" / "optimizer.pt", tmp_path / "dir ü 日本" / "optimizer.pt"]
    for p in paths:
        p.parent.mkdir()
        save_optimizer_state(state, p)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    loaded = torch.load(paths[1], weights_only=True)
    assert torch.equal(loaded["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    torch.save(state, paths[0])  # what checkpoints did before: the folder's name decides the bytes
    torch.save(state, paths[1])
    assert paths[0].read_bytes() != paths[1].read_bytes()
