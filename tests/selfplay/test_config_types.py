"""One typed validation for every field of the run configuration, generated from the config dataclasses'
annotations (so a field added to any section is covered): a wrong-typed JSON value for any field exits 2 naming
the dotted field and the expected type; limits on preset files; enums and target modules checked at --dry-run."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populora_cli.main import main
from selfplay.config import (
    MAX_CONFIG_DEPTH,
    ConfigError,
    TrainConfig,
    from_dict,
    load_preset,
    to_dict,
)
from tests.selfplay.conftest import populora


def _leaves(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted field, annotation) of every non-section field, from the dataclasses."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, prefix + f.name + ".")
        else:
            out.append((prefix + f.name, tp))
    return out


LEAVES = _leaves()

_ANY_JSON = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.none(),
                      st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                          max_size=2))


def _accepts(tp: Any, v: Any) -> bool:
    """Whether ``v`` is a valid JSON value of annotation ``tp`` (the specification the fuzz checks against)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, v) for a in typing.get_args(tp))
    if tp is type(None):
        return v is None
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
    if tp is float:
        return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) != float("inf")
    if tp in (str, Path):
        return isinstance(v, str)
    if origin is Literal:
        return any(v == a and type(v) is type(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(v, list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_accepts(args[0], x) for x in v)
        return len(v) == len(args) and all(_accepts(a, x) for a, x in zip(args, v, strict=True))
    if origin is list:
        return isinstance(v, list) and all(_accepts(typing.get_args(tp)[0], x) for x in v)
    if origin is dict:
        _k, val = typing.get_args(tp)
        return isinstance(v, dict) and all(_accepts(val, x) for x in v.values())
    raise AssertionError(f"the fuzz does not know annotation {tp!r}: extend _accepts")


def _set(data: dict, dotted: str, value: Any) -> dict:
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def test_every_field_of_the_help_is_fuzzed() -> None:
    p = populora("train", "--help", timeout=120)
    flat = " ".join(p.stdout.split())
    for name, _tp in LEAVES:
        assert "--" + name.replace("_", "-") in flat, name
    assert {"seed", "evolution", "progress", "device", "dtype", "trainer.lr", "env.num_teachers", "pbt.seed",
            "trainer.max_nonfinite_updates", "generation.top_p", "ray.trainers"} <= {n for n, _ in LEAVES}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(LEAVES), _ANY_JSON)
def test_a_wrong_typed_value_of_any_field_names_it(leaf: tuple[str, Any], value: Any) -> None:
    name, tp = leaf
    data = _set({}, name, value)
    if _accepts(tp, value):
        try:  # the type is right: a range or cross-field rule may still refuse it, but never for the type
            from_dict(TrainConfig, data)
        except ConfigError as e:
            assert "must be an int" not in e.reason and "must be a bool" not in e.reason, (name, value, e)
        return
    with pytest.raises(ConfigError) as info:
        from_dict(TrainConfig, data)
    field = info.value.field
    assert field == name or field.startswith((name + ".", name + "[")), (name, value, field)
    assert info.value.reason.startswith(("must be", "keys must be")), info.value.reason


OPTIONAL_INTS = [name for name, tp in LEAVES
                 if typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {int, type(None)}]


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_an_optional_int_outside_64_bits_is_refused_naming_the_range(value: int) -> None:
    """Found by the fuzz above (``trainer.norm_len`` = 2**63 passed): a union took a value of one of its types
    without that type's range check."""
    assert "trainer.norm_len" in OPTIONAL_INTS
    for name in OPTIONAL_INTS:
        with pytest.raises(ConfigError) as info:
            from_dict(TrainConfig, _set({}, name, value))
        assert info.value.field == name and "signed 64-bit range" in info.value.reason, (name, info.value)
        edge = 2**63 - 1 if value > 0 else -(2**63)
        try:  # the range's own ends are ints: a rule of the field may refuse them, never the type check
            from_dict(TrainConfig, _set({}, name, edge))
        except ConfigError as e:
            assert "64-bit" not in e.reason and "must be an int" not in e.reason, (name, e)


def test_a_union_with_float_still_takes_a_large_int_as_a_float() -> None:
    from selfplay.config import _coerce

    assert _coerce(float | int | str, 2**64, "x") == float(2**64)
    assert _coerce(float | int | str, 5, "x") == 5 and type(_coerce(float | int | str, 5, "x")) is int


def test_defaults_and_presets_pass_the_typed_check() -> None:
    assert from_dict(TrainConfig, to_dict(TrainConfig())) == TrainConfig()
    for name in ("cpu-smoke", "cpu-learn"):
        cfg = load_preset(name)
        assert from_dict(TrainConfig, to_dict(cfg)) == cfg


@pytest.fixture(scope="module", autouse=True)
def _tiny_random_converted() -> None:
    """The target-module check reads the model's config.json; tiny-random's is written when it is first built."""
    from agents.models import resolve_base

    resolve_base("tiny-random")


def _dry(tmp_path: Path, capsys, data: dict | str, *flags: str) -> tuple[int, str]:
    preset = tmp_path / "p.json"
    preset.write_text(data if isinstance(data, str) else json.dumps(data))
    rc = main(["train", "--preset", str(preset), "--run-dir", str(tmp_path / "never"), "--dry-run", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize(("data", "line"), [
    ({"evolution": "false"}, "--evolution: must be a bool (true/false), got 'false' (str)"),
    ({"progress": 0}, "--progress: must be a bool (true/false), got 0 (int)"),
    ({"device": 5}, "--device: must be a string, got 5 (int)"),
    ({"device": "tpu"}, "--device: must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ({"seed": 2**70}, "--seed: must be an int in the signed 64-bit range"),
    ({"seed": -1}, "--seed: must be >= 0, got -1"),
    ({"dtype": "int8"}, "--dtype: must be one of 'float32', 'bfloat16', 'float16', got 'int8' (str)"),
    ({"target_modules": ["q_proj", "qproj"]}, "--target-modules: 'qproj' not in model 'tiny-random'"),
    ({"trainer": {"lr": "1e-3"}}, "--trainer.lr: must be a number, got '1e-3' (str)"),
    ({"trainer": {"max_nonfinite_updates": 0}}, "--trainer.max-nonfinite-updates: must be >= 1, got 0"),
    ({"env": {"num_teachers": 2.5}}, "--env.num-teachers: must be an int, got 2.5 (float)"),
    ({"generation": {"top_p": "NaN"}}, "--generation.top-p: must be a number, got 'NaN' (str)"),
])
def test_bad_values_in_a_preset_exit_2_naming_the_field(tmp_path: Path, capsys, data: dict, line: str) -> None:
    rc, err = _dry(tmp_path, capsys, {"model": "tiny-random", **data})
    assert rc == 2 and err.startswith(f"populora train: error: {line}"), err
    assert not (tmp_path / "never").exists()


def test_flags_get_the_same_checks(tmp_path: Path, capsys) -> None:
    rc, err = _dry(tmp_path, capsys, {"model": "tiny-random"}, "--seed", str(2**64))
    assert rc == 2 and err.startswith("populora train: error: --seed: must be an int in the signed 64-bit range"), err
    rc, err = _dry(tmp_path, capsys, {"model": "tiny-random"}, "--seed", str(2**63 - 1))
    assert rc == 0, err


def test_preset_files_have_depth_and_size_limits(tmp_path: Path, capsys) -> None:
    deep = '{"env": {"reward_kwargs": ' + "[" * 100000 + "]" * 100000 + "}}"
    rc, err = _dry(tmp_path, capsys, deep)
    assert rc == 2 and err.endswith(f"nests deeper than {MAX_CONFIG_DEPTH} levels"), err
    nested = {"env": {"reward_kwargs": {"a": json.loads("[" * 20 + "]" * 20)}}}
    rc, err = _dry(tmp_path, capsys, nested)
    assert rc == 2 and err.endswith(f"nests deeper than {MAX_CONFIG_DEPTH} levels"), err
    rc, err = _dry(tmp_path, capsys, '{"_comment": "' + "x" * (1 << 21) + '"}')
    assert rc == 2 and "more than a run configuration can be" in err, err
    rc, err = _dry(tmp_path, capsys, "[1, 2]")
    assert rc == 2 and err.endswith("must hold a JSON object, got list"), err


def test_validate_checks_values_set_from_python() -> None:
    cfg = TrainConfig(model="tiny-random")
    cfg.validate()
    for bad, field in [({"evolution": "yes"}, "evolution"), ({"rank": True}, "rank"), ({"steps": 3.0}, "steps")]:
        with pytest.raises(ConfigError) as info:
            dataclasses.replace(cfg, **bad).validate()
        assert info.value.field == field



def test_a_models_module_names_are_listed_once_then_read_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    """The target-module check lists a local model's modules on the meta device once; later checks read the
    cached list (keyed by the config's bytes), a damaged entry is listed again, another config gets its own."""
    import shutil

    from agents.models import _tiny_random_dir
    from selfplay.config import _module_names_file, model_module_names, unknown_target_modules

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(_tiny_random_dir() / "config.json", model / "config.json")
    monkeypatch.setenv("POPULORA_CACHE", str(tmp_path / "cache"))
    model_module_names.cache_clear()
    listed = model_module_names(str(model))
    assert listed is not None and {"q_proj", "v_proj", "down_proj"} <= set(listed)
    entry = _module_names_file(model / "config.json")
    assert entry.parent == tmp_path / "cache" / "module-names" and json.loads(entry.read_text()) == list(listed)
    entry.write_text(json.dumps(["q_proj", "only_in_the_cache"]))  # read, not listed again
    model_module_names.cache_clear()
    assert unknown_target_modules(str(model), ("only_in_the_cache", "v_proj")) == ["v_proj"]
    entry.write_text('{"damaged": ')  # listed again and rewritten
    model_module_names.cache_clear()
    assert model_module_names(str(model)) == listed and json.loads(entry.read_text()) == list(listed)
    other = json.loads((model / "config.json").read_text()) | {"num_hidden_layers": 3}
    (model / "config.json").write_text(json.dumps(other))
    assert _module_names_file(model / "config.json") != entry
    model_module_names.cache_clear()
