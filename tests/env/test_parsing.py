"""Format check and answer extraction (docs/azr.md §3), including robustness to garbage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populora_env.literals import (
    ArgsError,
    literal_equal,
    literal_matches,
    max_equal_repr_chars,
    parse_call_args,
    same_value,
    with_heap_padding,
)
from populora_env.parsing import (
    extract_answer,
    parse_induction_proposal,
    parse_input_answer,
    parse_output_answer,
    parse_program_answer,
    parse_program_proposal,
)
from populora_env.policies import RandomPolicy


def test_think_answer_structure_required() -> None:
    ok = extract_answer("<think>plan</think>\n<answer>42</answer>")
    assert ok.format_ok and ok.answer == "42"
    assert extract_answer("  <think>a</think><answer>x</answer> trailing text").format_ok
    assert not extract_answer("<answer>42</answer>").format_ok
    assert not extract_answer("text <think>a</think><answer>x</answer>").format_ok
    assert not extract_answer("<think>a</think> words <answer>x</answer>").format_ok
    assert not extract_answer("<think>a</think><answer>x").format_ok


def test_require_think_false_accepts_bare_answer() -> None:
    lenient = extract_answer("Sure! <answer>42</answer>", require_think=False)
    assert lenient.format_ok and lenient.answer == "42"
    assert not extract_answer("no tags at all", require_think=False).format_ok


def test_prefix_is_prepended_for_r1_prompts() -> None:
    assert extract_answer("plan</think><answer>1</answer>", prefix="<think>").format_ok
    assert not extract_answer("plan</think><answer>1</answer>").format_ok


def test_last_answer_wins() -> None:
    got = extract_answer("<think>t</think><answer>first</answer><answer>second</answer>")
    assert got.answer == "second"


@pytest.mark.parametrize("bad", [None, 3, b"<think></think><answer></answer>", ["x"], object()])
def test_non_strings_are_format_errors(bad: object) -> None:
    assert not extract_answer(bad).format_ok


def test_random_strings_never_raise_and_never_pass() -> None:
    policy = RandomPolicy(seed=1, max_length=2000)
    for _ in range(300):
        text = policy.sample()
        assert not extract_answer(text).format_ok
        assert not extract_answer(text, require_think=False).format_ok
        parse_program_proposal(text)
        parse_induction_proposal(text)
        parse_output_answer(text)
        parse_input_answer(text)
        parse_program_answer(text)


def test_proposal_blocks() -> None:
    answer = "```python\ndef f(x):\n    return x\n```\n```input\n[1, 2]\n```\n```input\n3\n```"
    payload = parse_program_proposal(answer)
    assert payload.program == "def f(x):\n    return x\n"
    assert payload.inputs == ("[1, 2]",)
    induction = parse_induction_proposal(answer + "\n```message\nidentity\n```")
    assert induction.inputs == ("[1, 2]", "3") and induction.message == "identity"
    assert parse_induction_proposal("```input\n1\n```<message>hi</message>").message == "hi"


def test_solver_answers_use_last_block_with_fallback() -> None:
    assert parse_output_answer("```output\n1\n```\n```output\n2\n```") == "2"
    assert parse_output_answer("  [1, 2] ") == "[1, 2]"
    assert parse_input_answer("```input\n'a', 3\n```") == "'a', 3"
    assert parse_program_answer("no code") is None
    assert parse_program_answer("```\ndef f(x):\n    return 1\n```") == "def f(x):\n    return 1\n"


def test_call_args_literals_only() -> None:
    assert parse_call_args("[1,2],  'a' ").canonical == "[1, 2], 'a'"
    assert parse_call_args("x=1, y={'a': (1, 2)}").values == (1, {"a": (1, 2)})
    for kind, text in [
        ("parse_error", "1, 2)"),
        ("parse_error", "1) + f(2"),
        ("parse_error", "1)(2"),
        ("parse_error", "def"),
        ("not_literal", "[1] * 10"),
        ("not_literal", "__import__('os')"),
        ("not_literal", "*[1, 2]"),
        ("not_literal", "**{'a': 1}"),
    ]:
        with pytest.raises(ArgsError) as info:
            parse_call_args(text)
        assert info.value.kind == kind, text


def test_same_value_normalises_set_and_dict_order_only() -> None:
    assert same_value("{'b', 'a'}", "{'a', 'b'}")
    assert same_value("{'a': 1, 'b': 2}", "{'b': 2, 'a': 1}")
    assert not same_value("[1, 2]", "[2, 1]")
    assert not same_value("1", "True")
    assert not same_value("<object at 0x1>", "<object at 0x2>")


def test_heap_padding_keeps_future_imports_first() -> None:
    program = '"""doc"""\nfrom __future__ import annotations\ndef f(x):\n    return x\n'
    padded = with_heap_padding(program)
    lines = padded.splitlines()
    assert lines[1] == "from __future__ import annotations" and lines[2].startswith("__populora_pad__")
    compile(padded, "<test>", "exec")  # compiles (not executed)


def test_random_bytes_as_arguments_never_raise() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        text = "".join(chr(int(c)) for c in rng.integers(32, 127, size=int(rng.integers(0, 40))))
        try:
            parse_call_args(text)
        except ArgsError:
            pass


def test_format_check_matches_azr_regex_on_random_tag_soup() -> None:
    import re

    azr = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>", re.S)
    tokens = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x", "<", ">", "think"]
    rng = np.random.default_rng(0)
    for _ in range(5000):
        text = "".join(tokens[int(i)] for i in rng.integers(0, len(tokens), size=int(rng.integers(0, 14))))
        assert extract_answer(text).format_ok == (azr.match(text) is not None), repr(text)


def test_degenerate_long_completions_are_linear_time() -> None:
    import time

    texts = [
        "<think>" + "</think><answer>" * 20000,  # quadratic for a backtracking regex
        "<message>" * 30000,
        "```" * 60000,
        "<think>x</think><answer>" + "```input\n" * 20000,
    ]
    start = time.process_time()  # this process's CPU time: what other processes do to the wall clock is not ours
    for text in texts:
        extract_answer(text)
        parse_induction_proposal(text)
        parse_program_proposal(text)
        parse_program_answer(text)
    assert time.process_time() - start < 2.0


def test_lenient_answer_close_accepts_an_answer_running_to_the_end() -> None:
    """``require_close=False`` (the env's ``lenient_answer_close``): no final ``</answer>`` needed; a fenced
    block left open at the end of the text is closed there. Off by default (AZR's rule)."""
    stopped = "<think></think>\n<answer>\n```output\n[6, 8]\n```\n"
    assert not extract_answer(stopped).format_ok
    got = extract_answer(stopped, require_close=False)
    assert got.format_ok and parse_output_answer(got.answer) == "[6, 8]"
    open_block = "<think></think>\n<answer>\n```input\n[3, -1], 2"
    got = extract_answer(open_block, require_close=False)
    assert got.format_ok and parse_input_answer(got.answer) == "[3, -1], 2"
    two = "<think>t</think><answer>\n```python\ndef f(x):\n    return x\n```\n```input\n5"
    assert parse_program_proposal(extract_answer(two, require_close=False).answer).inputs == ("5",)
    # a closed answer is taken up to its </answer>, lenient or not; the structure before <answer> still counts
    closed = "<think>t</think><answer>```output\n1\n```</answer> ```output\n2"
    assert extract_answer(closed, require_close=False).answer == extract_answer(closed).answer
    assert not extract_answer("<answer>```output\n1", require_close=False).format_ok  # <think> still required
    assert extract_answer("Sure <answer>1", require_think=False, require_close=False).answer == "1"
    assert not extract_answer("no tags", require_think=False, require_close=False).format_ok


# --- the host reads a job's claim at a cost bounded by the expected value (issue 39) --------------------------

_atoms = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                   st.binary(max_size=8), st.complex_numbers(allow_nan=False, allow_infinity=False))
_plain = st.recursive(_atoms, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.frozensets(st.integers() | st.text(max_size=4), max_size=4),
    st.dictionaries(st.integers() | st.text(max_size=4), inner, max_size=4)), max_leaves=12)


def _equal_variants(value: object) -> list[object]:
    """Values equal to ``value`` by ``==`` whose ``repr`` may be longer: other numeric types, set for frozenset."""
    out = [value]
    if isinstance(value, bool | int | float | complex):
        for kind in (int, float, complex, bool):
            try:
                other = kind(value)
            except (TypeError, ValueError, OverflowError):
                continue
            if other == value:
                out.append(other)
    elif isinstance(value, frozenset):
        out.append(set(value))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            for other in _equal_variants(item)[1:]:
                copy = list(value)
                copy[i] = other
                out.append(type(value)(copy))
    elif isinstance(value, dict):
        for key, item in value.items():
            for other in _equal_variants(item)[1:]:
                out.append({**value, key: other})
    return out


@settings(max_examples=300, deadline=None)
@given(_plain)
def test_no_value_equal_to_the_expected_one_has_a_longer_repr_than_the_bound(value: object) -> None:
    bound = max_equal_repr_chars(value)
    for other in _equal_variants(value):
        assert len(repr(other)) <= bound, (value, other, bound)
        assert literal_matches(repr(other), repr(value)) == literal_equal(repr(other), repr(value))


def test_a_claim_longer_than_the_bound_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from populora_env import literals

    parsed: list[int] = []
    real = literals.literal_value
    monkeypatch.setattr(literals, "literal_value", lambda text: (parsed.append(len(text)), real(text))[1])
    claim = "[" + ", ".join(["1"] * 100_000) + "]"
    assert not literals.literal_matches(claim, "[4, 5]")
    assert not literals.same_value("[4, 5]", claim)
    assert parsed and max(parsed) == len("[4, 5]")  # only the expected value was ever parsed
    assert literals.literal_matches("[4.0, 5]", "[4, 5]") and literals.literal_matches(repr(int(1e308)), "1e308")
