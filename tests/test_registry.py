"""The one registry helper, and that all four plugin registries are built on it with one behaviour."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from populora_env.registry import DuplicateEntryError, Registry, UnknownEntryError

# ----------------------------------------------------------------------------------------------- the helper


def test_register_get_list_unregister() -> None:
    reg: Registry[int] = Registry("widget")
    assert reg.add("b", 2) == 2
    assert reg.decorator("a")(1) == 1
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.items() == [("a", 1), ("b", 2)]
    assert reg.get("a") == 1 and "a" in reg and "c" not in reg and ["x"] not in reg
    assert reg.remove("a") == 1
    assert reg.names() == ["b"]
    assert repr(reg) == "Registry('widget': b)"


def test_unknown_names_one_error_naming_kind_and_known_entries() -> None:
    reg: Registry[int] = Registry("widget")
    for name in ("zeta", "alpha"):
        reg.add(name, 0)
    for call in (reg.get, reg.remove):
        with pytest.raises(UnknownEntryError) as info:
            call("nope")
        err = info.value
        assert str(err) == "unknown widget 'nope'; known: alpha, zeta"  # not quoted like a plain KeyError
        assert isinstance(err, KeyError) and isinstance(err, ValueError)
        assert (err.kind, err.name, err.known) == ("widget", "nope", ["alpha", "zeta"])
    with pytest.raises(UnknownEntryError, match=r"unknown widget \['x'\]"):
        reg.get(["x"])  # unhashable: still the registry's error, not a TypeError
    assert str(UnknownEntryError("widget", "x", [])) == "unknown widget 'x'; known: (none registered)"
    assert reg.names() == ["alpha", "zeta"]  # a failed remove removed nothing


def test_duplicates_and_bad_names_raise() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("a", 1)
    with pytest.raises(DuplicateEntryError, match="widget 'a' is already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="already registered"):
        reg.decorator("a")(3)
    assert reg.get("a") == 1  # never silently replaced
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="widget name must be a non-empty str"):
            reg.add(bad, 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-empty str"):
            reg.decorator(bad)  # type: ignore[arg-type]


def test_custom_error_class() -> None:
    class UnknownGadget(UnknownEntryError):
        pass

    reg: Registry[int] = Registry("gadget", error=UnknownGadget)
    with pytest.raises(UnknownGadget, match="unknown gadget 'x'; known: "):
        reg.get("x")
    with pytest.raises(TypeError, match="UnknownEntryError"):
        Registry("gadget", error=KeyError)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- the four registries use it


@dataclass
class Api:
    kind: str
    registry: Any
    register: Callable[[str, Any], Any]
    unregister: Callable[[str], Any]
    get: Callable[[str], Any]
    names: Callable[[], list[str]]
    builtin: str


def _apis() -> list[Api]:
    from agents import advantages, losses
    from evolution import operators
    from evolution import registry as operator_registry
    from populora_env import rewards

    def reg_op(name: str, fn: Any) -> Any:
        return operators.register_operator(name, family="control", arity=1)(fn)

    def op_names() -> list[str]:
        return [op.name for op in operators.list_operators()]

    return [
        Api("advantage estimator", advantages._REGISTRY, lambda n, f: advantages.register_advantage(n)(f),
            advantages.unregister_advantage, advantages.get_advantage, advantages.list_advantages, "grpo"),
        Api("loss aggregation mode", losses._AGG, lambda n, f: losses.register_loss_agg(n)(f),
            losses.unregister_loss_agg, losses.get_loss_agg, losses.list_loss_aggs, "token-mean"),
        Api("reward scheme", rewards._REGISTRY, lambda n, f: rewards.register_reward_scheme(n)(f),
            rewards.unregister_reward_scheme, rewards.get_reward_scheme, rewards.list_reward_schemes, "azr"),
        Api("operator", operator_registry._REGISTRY, reg_op, operators.unregister_operator,
            lambda n: operators.get_operator(n), op_names, "dare"),
    ]


@pytest.mark.parametrize("api", _apis(), ids=lambda a: a.kind)
def test_every_registry_is_a_registry_with_one_behaviour(api: Api) -> None:
    assert isinstance(api.registry, Registry) and api.registry.kind == api.kind
    known = api.names()
    assert known == sorted(known) and api.builtin in known
    with pytest.raises(UnknownEntryError) as info:
        api.get("no_such_entry")
    assert str(info.value) == f"unknown {api.kind} 'no_such_entry'; known: {', '.join(known)}"
    for caught in (KeyError, ValueError):  # callers written against either kind keep working
        with pytest.raises(caught):
            api.get("no_such_entry")
    with pytest.raises(UnknownEntryError, match=f"unknown {api.kind} 'no_such_entry'"):
        api.unregister("no_such_entry")

    def entry(*args: Any, **kwargs: Any) -> Any:
        """A test entry."""
        return {}

    api.register("_test_entry", entry)
    try:
        assert "_test_entry" in api.names()
        got = api.get("_test_entry")
        assert (got.fn if api.kind == "operator" else got) is entry
        with pytest.raises(DuplicateEntryError, match=f"{api.kind} '_test_entry' is already registered"):
            api.register("_test_entry", entry)
    finally:
        api.unregister("_test_entry")
    assert api.names() == known
    with pytest.raises(DuplicateEntryError, match="already registered"):
        api.register(api.builtin, entry)
    assert api.names() == known


def test_operator_error_keeps_its_name() -> None:
    from evolution.operators import UnknownOperatorError, get_operator

    assert issubclass(UnknownOperatorError, UnknownEntryError)
    with pytest.raises(UnknownOperatorError, match="unknown operator 'x'; known: .*svd_mutation"):
        get_operator("x")
