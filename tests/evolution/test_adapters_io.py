"""``evolve_dirs`` on real PEFT adapter directories of a tiny Llama: load, check, evolve, save, reload."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file

from evolution.adapters_io import evolve_dirs, load_adapter_dir, parse_params

from .helpers import tiny_llama

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapter(path, seed, *, r=4, alpha=8, targets=TARGETS, train_b=True):
    model = tiny_llama()
    peft_model = get_peft_model(
        model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    )
    if train_b:  # pretend training happened: B != 0
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name or "lora_A" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peft_model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return save_adapter(root / "a", 1), save_adapter(root / "b", 2), root


def lora_out(model_dir, ids):
    model = PeftModel.from_pretrained(tiny_llama(), model_dir)
    model.eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("op,params", [("ties", {"density": 0.5}), ("dare", {}), ("svd_mutation", {})])
def test_evolve_dirs_writes_a_loadable_peft_adapter(adapters, op, params, tmp_path):
    a, b, _ = adapters
    parents = [a, b] if op != "svd_mutation" else [a]
    out = evolve_dirs(op, parents, tmp_path / "child", params, seed=3)
    assert out == tmp_path / "child"
    assert (out / "adapter_config.json").read_text() == (a / "adapter_config.json").read_text()
    child = load_file(str(out / "adapter_model.safetensors"))
    parent = load_file(str(a / "adapter_model.safetensors"))
    assert child.keys() == parent.keys()
    assert all(child[k].shape == parent[k].shape and child[k].dtype == parent[k].dtype for k in child)
    assert any(not torch.equal(child[k], parent[k]) for k in child)
    # PEFT loads it, and the loaded weights are exactly the child's
    model = PeftModel.from_pretrained(tiny_llama(), out)
    sd = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    for k, v in child.items():
        loaded = k.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight"
        )
        assert torch.equal(sd[loaded], v)
    # same seed, same child
    again = evolve_dirs(op, parents, tmp_path / "again", params, seed=3)
    child2 = load_file(str(again / "adapter_model.safetensors"))
    assert all(torch.equal(child[k], child2[k]) for k in child)


def test_copy_parent_roundtrip_gives_identical_outputs(adapters, tmp_path):
    a, _, _ = adapters
    out = evolve_dirs("copy_parent", [a], tmp_path / "copy", {})
    ids = torch.arange(10).unsqueeze(0)
    assert torch.equal(lora_out(out, ids), lora_out(a, ids))


def test_mismatches_are_named(adapters, tmp_path):
    a, b, root = adapters
    r8 = save_adapter(root / "r8", 3, r=8, alpha=16)
    with pytest.raises(ValueError, match="parents differ in r: .* 4, .* 8"):
        evolve_dirs("dare", [a, r8], tmp_path / "x", {})
    alpha = save_adapter(root / "alpha", 4, alpha=4)
    with pytest.raises(ValueError, match="lora_alpha"):
        evolve_dirs("dare", [a, alpha], tmp_path / "x", {})
    qv = save_adapter(root / "qv", 5, targets=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match="target_modules"):
        evolve_dirs("dare", [a, qv], tmp_path / "x", {})
    with pytest.raises(ValueError, match="takes 2 parent"):
        evolve_dirs("dare", [a], tmp_path / "x", {})
    with pytest.raises(ValueError, match="unknown operator .*; known: "):
        evolve_dirs("nope", [a], tmp_path / "x", {})
    with pytest.raises(ValueError, match="unknown parameter"):
        evolve_dirs("ties", [a, b], tmp_path / "x", {"dens": 0.5})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evolve_dirs("dare", [a, root / "missing"], tmp_path / "x", {})
    binonly = root / "bin"
    binonly.mkdir()
    shutil.copy(a / "adapter_config.json", binonly)
    (binonly / "adapter_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pickled adapter_model.bin"):
        load_adapter_dir(binonly)
    notlora = root / "ia3"
    notlora.mkdir()
    (notlora / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    shutil.copy(a / "adapter_model.safetensors", notlora)
    with pytest.raises(ValueError, match="only LORA"):
        load_adapter_dir(notlora)
    assert not (tmp_path / "x").exists()


def test_untrained_adapter_is_copied_by_svd_ops(tmp_path):
    a = save_adapter(tmp_path / "fresh", 0, train_b=False)  # PEFT init: B = 0
    out = evolve_dirs("svd_mutation", [a], tmp_path / "child", {})
    parent, child = (
        load_file(str(a / "adapter_model.safetensors")),
        load_file(str(out / "adapter_model.safetensors")),
    )
    assert all(torch.equal(parent[k], child[k]) for k in parent)


def test_parse_params():
    assert parse_params(["density=0.5", "niter=3", "space=factor", "weights=0.3,0.7", "p = 0.25"]) == {
        "density": 0.5,
        "niter": 3,
        "space": "factor",
        "weights": "0.3,0.7",
        "p": 0.25,
    }
    for bad in (["density"], ["=1"], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_params(bad)


REFUSED = [
    ("ties", "density=nan", "parameter density=nan is not a finite number"),
    ("ties", "density=-1", "operator 'ties' refuses density=-1: density must be >= 0, got -1.0"),
    ("dare", "p=1", "operator 'dare' refuses p=1: dare: p must be in [0, 1), got 1.0"),
    ("component_mask", "rho=5", "operator 'component_mask' refuses rho=5: component_mask: rho must be in [0, 1]"),
    ("layer_mutation", "fraction=nan", "parameter fraction=nan is not a finite number"),
    ("svd_crossover", "mode=bogus", "svd_crossover: mode must be 'index' or 'top', got 'bogus'"),
    ("extrapolate", "eta_min=2", "extrapolate: eta_max (1.5) < eta_min (2.0)"),
    ("svd_mutation", "epsilon=inf", "parameter epsilon=inf is not a finite number"),
]


@pytest.mark.parametrize("op, param, why", REFUSED)
def test_a_value_the_operator_refuses_is_a_param_error_before_the_parents_are_read(tmp_path, op, param, why):
    """Issue 48: the operators' own checks raised ``ValueError`` out of ``populora evolve``. They run before
    any parent is read (missing parents here: a ``FileNotFoundError`` would mean the check came too late), as
    ``EvolveError`` for ``--param``; the command prints it as one line, exit 2, and writes nothing."""
    from evolution.adapters_io import EvolveError
    from evolution.operators import get_operator
    from populora_cli.main import main

    parents = [tmp_path / f"missing_{i}" for i in range(get_operator(op).arity)]
    with pytest.raises(EvolveError, match=re.escape(why)) as err:
        evolve_dirs(op, parents, tmp_path / "child", parse_params([param]))
    assert err.value.argument == "param"
    assert main(["evolve", "--op", op, "--parents", *map(str, parents), "--out", str(tmp_path / "c"),
                 "--param", param]) == 2
    assert not (tmp_path / "c").exists() and not (tmp_path / "child").exists()


def test_the_probe_accepts_every_default_and_leaves_the_global_rng_alone():
    """``check_params`` on each built-in operator's defaults passes, and draws nothing from torch's global RNG
    (a run's history is unchanged by the check of its PBT settings)."""
    from evolution.operators import list_operators

    state = torch.random.get_rng_state()
    for op in list_operators():
        assert op.check_params({}) == op.resolve_params({})
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_run_s_operator_params_get_the_same_checks():
    """``--pbt.operator-params '{"dare": {"p": 1}}'`` failed at the first PBT event; now the run's settings are
    refused before it starts, naming the field."""
    from evolution.pbt_config import PBTConfig
    from populora_env.checks import ConfigError

    with pytest.raises(ConfigError, match=r"refuses p=1: dare: p must be in \[0, 1\)") as err:
        PBTConfig(operator_params={"dare": {"p": 1}}).validate()
    assert err.value.field == "operator_params.dare"


@pytest.mark.parametrize("change, why", [
    ({"r": 10**9}, r"adapter_config.json: r = 1000000000 but .*lora_[AB].weight in adapter_model.safetensors has "
                   r"rank 4"),
    ({"r": 0}, r"adapter_config.json: r must be a positive int, got 0"),
    ({"r": "4"}, r"adapter_config.json: r must be a positive int, got '4'"),
    ({"r": True}, r"adapter_config.json: r must be a positive int, got True"),
    ({"lora_alpha": 1e400}, r"adapter_config.json: lora_alpha must be a finite number, got inf"),
    ({"rank_pattern": {"q_proj": 10**9}}, r"adapter_config.json: r = 4 but .* has rank 4"),
])
def test_a_config_that_does_not_describe_its_weights_is_refused_before_allocating(adapters, tmp_path, monkeypatch,
                                                                                   capsys, change, why):
    """Issue 48: ``populora eval --adapters`` on ``r = 10^9`` ended in the allocator's RuntimeError. The config's
    rank must be the weights' (bounded by the file read), checked before any model loads: one line, exit 2."""
    import agents.models
    from evolution.adapters_io import AdapterFileError
    from populora_cli.main import main

    d = tmp_path / "crafted"
    shutil.copytree(adapters[0], d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    if "rank_pattern" in change:  # a pattern that names a rank the weights hold nowhere, and none they hold
        cfg["r"] = 10**9
    cfg.update(change)
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    if "rank_pattern" in change:
        why = why.replace("r = 4", "r = 1000000000")
    with pytest.raises(AdapterFileError, match=why):
        load_adapter_dir(d)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(agents.models, "load_base", no_model)
    capsys.readouterr()
    assert main(["eval", "--adapters", str(d), "--benchmarks", "humaneval", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("populora eval: error: ") and len(err.strip().splitlines()) == 1, err
    assert not (d / "eval").exists()
