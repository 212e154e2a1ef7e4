"""The PFSP weighting registry (populora_env/matching.py): the built-in weightings, the random share, a plugin's
weighting in a real env round, and the one-line errors of EnvConfig's matching settings."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from populora_env.checks import ConfigError
from populora_env.config import EnvConfig
from populora_env.matching import (
    PFSP_FLOOR,
    Ratings,
    get_matching,
    pfsp_match,
    pfsp_weight,
    register_matching,
    unregister_matching,
)

STUDENTS = {"s_weak": 15.0, "s_even": 25.0, "s_strong": 35.0}


def _ratings() -> Ratings:
    r = Ratings(["t", *STUDENTS])
    r.load_state_dict({"ratings": {"t": [25.0, 25 / 3], **{s: [mu, 25 / 3] for s, mu in STUDENTS.items()}}})
    return r


def _frequencies(matching: str, share: float = 0.0, n: int = 3000) -> dict[str, float]:
    r, rng = _ratings(), np.random.default_rng(0)
    counts = Counter(
        pfsp_match(["t"], list(STUDENTS), r, rng, matching, {}, share)[0].student for _ in range(n)
    )
    return {s: counts[s] / n for s in STUDENTS}


def test_builtin_weightings_and_the_floor() -> None:
    for p in (0.0, 0.2, 0.5, 0.9, 1.0):
        # the default is today's f_var, bit for bit
        assert get_matching("variance").weight(p) == pfsp_weight(p)
        assert get_matching("hard").weight(p) == max((1 - p) ** 2, PFSP_FLOOR)
        assert get_matching("linear").weight(p) == max(1 - p, PFSP_FLOOR)
        assert get_matching("uniform").weight(p) == 1.0


def test_default_arguments_pair_as_before() -> None:
    a = pfsp_match(["t"], list(STUDENTS), _ratings(), np.random.default_rng(3))
    b = pfsp_match(["t"], list(STUDENTS), _ratings(), np.random.default_rng(3), "variance", {}, 0.0)
    assert a == b


def test_hard_prefers_students_expected_to_lose_and_uniform_ignores_ratings() -> None:
    hard, var, uni = _frequencies("hard"), _frequencies("variance"), _frequencies("uniform")
    assert hard["s_weak"] > hard["s_even"] > hard["s_strong"]
    assert var["s_even"] > max(var["s_weak"], var["s_strong"])
    assert all(abs(f - 1 / 3) < 0.04 for f in uni.values())
    mixed = _frequencies("hard", share=1.0)  # all random: uniform whatever the weighting
    assert all(abs(f - 1 / 3) < 0.04 for f in mixed.values())
    half = _frequencies("hard", share=0.5)
    assert hard["s_strong"] < half["s_strong"] < 1 / 3


def test_a_plugin_weighting_is_used_by_the_env_and_checked() -> None:
    from populora_env.env import PopuLoRAParallelEnv

    calls: list[float] = []

    @register_matching("strongest_test", defaults={"power": 2.0})
    def strongest(p, power):
        """p^power"""
        calls.append(p)
        return p**power

    try:
        env = PopuLoRAParallelEnv(
            num_teachers=2,
            num_students=2,
            matching="strongest_test",
            matching_kwargs={"power": 3},
            sandbox_workers=1,
        )
        try:
            env.reset(seed=0)
            env.step({t: ("nothing",) * env.config.tasks_per_teacher for t in env.teachers})
        finally:
            env.close()
        assert calls and all(0.0 <= p <= 1.0 for p in calls)
        with pytest.raises(ConfigError) as exc:
            EnvConfig(matching="strongest_test", matching_kwargs={"power": "3"}).validate()
        assert exc.value.field == "matching_kwargs" and "is not a valid float" in exc.value.reason
    finally:
        unregister_matching("strongest_test")


def test_a_weighting_that_returns_garbage_is_named() -> None:
    @register_matching("nan_test")
    def nan(p):
        """nan"""
        return float("nan")

    try:
        with pytest.raises(ValueError, match="matching 'nan_test' returned nan"):
            pfsp_match(["t"], list(STUDENTS), _ratings(), np.random.default_rng(0), "nan_test")
    finally:
        unregister_matching("nan_test")


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        ({"matching": "nope"}, "matching", "unknown matching 'nope'; known: hard, linear, uniform, variance"),
        ({"matching_kwargs": {"x": 1}}, "matching_kwargs", "got unknown parameter(s) ['x']"),
        ({"matching_random": 1.5}, "matching_random", "1.5"),
    ],
)
def test_bad_matching_settings_name_the_field(settings: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        EnvConfig(**settings).validate()
    assert exc.value.field == field and message in exc.value.reason


def test_each_weighting_summary_is_its_docstring_s_first_line_and_entries_are_frozen() -> None:
    import dataclasses

    from populora_env.matching import Matching, get_matching

    assert get_matching("hard").summary == "(1 - p)^2: AlphaStar's f_hard, pairings the student is expected to lose."
    assert get_matching("uniform").summary == "1: uniform random pairing (ratings ignored)."
    undocumented = Matching("bare", {}, lambda p: p)
    assert undocumented.summary == "" and "fn=" not in repr(undocumented) and "bare" in repr(undocumented)
    with pytest.raises(dataclasses.FrozenInstanceError):
        undocumented.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("field", ["mu", "sigma", "beta", "tau"])
def test_trueskill_settings_stop_at_a_million(field: str) -> None:
    from populora_env.checks import ConfigError
    from populora_env.matching import TrueSkillConfig

    TrueSkillConfig(**{field: 1e6}).validate()
    with pytest.raises(ConfigError, match=field):
        TrueSkillConfig(**{field: 1e6 + 0.5}).validate()
    if field == "mu":
        TrueSkillConfig(mu=-1e6).validate()
        with pytest.raises(ConfigError, match="mu"):
            TrueSkillConfig(mu=-1e6 - 0.5).validate()
