"""The harness's printer of plain values (``_zygote._plain_repr``): the text of the builtin ``repr``, character for
character, for every value built from exact builtin types, and nothing for anything else.

The job child reports a plain value with this printer instead of ``repr(value)`` after a type check, because
another thread of the job may change the value between the two (``test_gold_forgery``); the text must stay what
``repr`` writes, since gold outputs are stored and shown as that text (the main job's history depends on it).
These run on the host: the function is pure and looks up nothing at call time.
"""

from __future__ import annotations

import dis

from hypothesis import given, settings
from hypothesis import strategies as st

from populora_env.sandbox._zygote import _plain_repr

leaves = st.one_of(st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.text(max_size=8), st.booleans(),
                   st.none(), st.floats(), st.binary(max_size=8), st.complex_numbers())
keys = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3).map(tuple), st.frozensets(inner)),
                    max_leaves=6)


def _churned(base: set, extra: set) -> set:
    """``base`` reached through insertions and deletions: the same elements, perhaps in another order."""
    out = set(extra) | set(base)
    for e in extra - base:
        out.discard(e)
    return out


values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=4), st.sets(keys, max_size=4), st.frozensets(keys, max_size=4),
        st.builds(_churned, st.sets(keys, max_size=4), st.sets(keys, max_size=6)),
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_plain_values_print_as_repr(value: object) -> None:
    assert _plain_repr(value, 10 ** 6, 10 ** 9, 1000) == (repr(value), None)


@settings(max_examples=50, deadline=None)
@given(values)
def test_a_value_longer_than_the_cap_gives_no_text(value: object) -> None:
    text = repr(value)
    assert _plain_repr(value, 10 ** 6, len(text), 1000) == (text, None)
    assert _plain_repr(value, 10 ** 6, len(text) - 1, 1000) == (None, None)


def test_edge_values() -> None:
    for value in ((), (1,), (1, 2), [], {}, set(), frozenset(), frozenset({1}), {1: ()}, [[], [[]]], -0.0,
                  float("nan"), float("-inf"), 1e16, 2 ** 100, "\ud800", b"\x00'\"", complex(-0.0, float("nan")),
                  {(1, frozenset({2})): {None: [True]}}):
        assert _plain_repr(value, 100, 10 ** 6, 100) == (repr(value), None)


def test_anything_but_exact_builtins_is_not_plain() -> None:
    class Int(int):
        def __repr__(self) -> str:
            return "3007"

    assert _plain_repr([1, {2: (Int(3),)}], 100, 10 ** 6, 100) == (None, Int)
    assert _plain_repr(bytearray(b"x"), 100, 10 ** 6, 100) == (None, bytearray)
    assert _plain_repr(object, 100, 10 ** 6, 100) == (None, type)
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert _plain_repr(cyclic, 10 ** 6, 10 ** 9, 1000) == (None, "value nested too deeply or cyclic")
    assert _plain_repr(cyclic, 50, 10 ** 9, 10 ** 6) == (None, "value too large or cyclic")
    deep: list = []
    for _ in range(29):
        deep = [deep]  # 30 lists, one in the other
    assert _plain_repr(deep, 100, 10 ** 6, 30) == (repr(deep), None)
    assert _plain_repr(deep, 100, 10 ** 6, 29) == (None, "value nested too deeply or cyclic")
    assert _plain_repr(list(range(10)), 10, 10 ** 6, 5) == (None, "value too large or cyclic")


def test_the_printer_looks_up_no_global_name() -> None:
    """Job code may rebind any builtin or module attribute: the printer uses only names bound when the zygote
    starts (its defaults), never a global or builtin lookup at call time."""
    ops = {ins.opname for ins in dis.get_instructions(_plain_repr)}
    assert not ops & {"LOAD_GLOBAL", "LOAD_NAME"}, ops
