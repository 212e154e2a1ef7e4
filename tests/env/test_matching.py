"""TrueSkill ratings, p_ts, PFSP pairing and the outcome rule (docs/method.md §6)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import trueskill

from populora_env.matching import (
    PFSP_FLOOR,
    Ratings,
    TrueSkillConfig,
    match_outcome,
    pfsp_match,
    pfsp_weight,
)

TEACHERS = ["teacher_0", "teacher_1", "teacher_2", "teacher_3"]
STUDENTS = ["student_0", "student_1", "student_2", "student_3"]


def test_defaults_and_fresh_conservative_skill_is_zero() -> None:
    ratings = Ratings(TEACHERS + STUDENTS)
    assert ratings.mu("teacher_0") == 25.0 and ratings.sigma("teacher_0") == pytest.approx(25 / 3)
    assert ratings.conservative("student_2") == pytest.approx(0.0)
    assert ratings.config == TrueSkillConfig(25.0, 25 / 3, 25 / 6, 25 / 300, 0.1)
    assert ratings.p_student_wins("student_0", "teacher_0") == pytest.approx(0.5)


def test_p_ts_formula() -> None:
    ratings = Ratings(["t", "s"])
    ratings.load_state_dict({"ratings": {"t": [20.0, 3.0], "s": [27.0, 5.0]}})
    beta = 25 / 6
    expected = 0.5 * (1 + math.erf((27 - 20) / math.sqrt(2 * beta**2 + 25 + 9) / math.sqrt(2)))
    assert ratings.p_student_wins("s", "t") == pytest.approx(expected)


def test_record_uses_rate_1vs1_and_reset() -> None:
    ratings = Ratings(["t", "s"])
    env = trueskill.TrueSkill()
    ratings.record("t", "s", "student")
    want_s, want_t = trueskill.rate_1vs1(env.create_rating(), env.create_rating(), env=env)
    assert ratings.mu("s") == pytest.approx(want_s.mu) and ratings.mu("t") == pytest.approx(want_t.mu)
    assert ratings.mu("s") > 25 > ratings.mu("t")
    ratings.record("t", "s", "draw")
    ratings.reset("s")
    assert ratings.mu("s") == 25.0 and ratings.sigma("s") == pytest.approx(25 / 3)
    with pytest.raises(ValueError):
        ratings.record("t", "s", "nobody")
    state = json.loads(json.dumps(ratings.state_dict()))
    other = Ratings(["t", "s"])
    other.load_state_dict(state)
    assert other.summary() == ratings.summary()


def test_outcome_rule() -> None:
    assert match_outcome(0.8, 0.5) == "student"
    assert match_outcome(0.2, 0.5) == "teacher"
    assert match_outcome(0.5, 0.5) == "draw"
    assert match_outcome(None, 0.9) == "student"


def test_pfsp_weight() -> None:
    assert pfsp_weight(0.5) == 0.25
    assert pfsp_weight(1.0) == PFSP_FLOOR and pfsp_weight(0.0) == PFSP_FLOOR


def test_equal_populations_give_a_perfect_matching() -> None:
    ratings = Ratings(TEACHERS + STUDENTS)
    rng = np.random.default_rng(0)
    for _ in range(20):
        pairs = pfsp_match(TEACHERS, STUDENTS, ratings, rng)
        assert [p.teacher for p in pairs] == TEACHERS
        assert sorted(p.student for p in pairs) == STUDENTS


def test_pool_refills_when_more_teachers_than_students() -> None:
    ratings = Ratings(TEACHERS + STUDENTS[:2])
    pairs = pfsp_match(TEACHERS, STUDENTS[:2], ratings, np.random.default_rng(1))
    assert Counter(p.student for p in pairs) == {"student_0": 2, "student_1": 2}


def test_pfsp_prefers_balanced_matchups() -> None:
    ratings = Ratings(["t", "even", "strong"])
    ratings.load_state_dict({"ratings": {"t": [25.0, 1.0], "even": [25.0, 1.0], "strong": [60.0, 1.0]}})
    rng = np.random.default_rng(0)
    picks = Counter(pfsp_match(["t"], ["even", "strong"], ratings, rng)[0].student for _ in range(300))
    p_strong = ratings.p_student_wins("strong", "t")
    w_even, w_strong = 0.25, pfsp_weight(p_strong)
    assert picks["even"] / 300 == pytest.approx(w_even / (w_even + w_strong), abs=0.05)
    assert picks["even"] > 250


def test_uniform_when_every_weight_is_floored() -> None:
    ratings = Ratings(["t", "a", "b"])
    ratings.load_state_dict({"ratings": {"t": [0.0, 0.5], "a": [90.0, 0.5], "b": [95.0, 0.5]}})
    picks = Counter(
        pfsp_match(["t"], ["a", "b"], ratings, np.random.default_rng(s))[0].student for s in range(400)
    )
    assert 150 < picks["a"] < 250


def test_draw_and_teacher_win_use_the_right_rate_1vs1() -> None:
    env = trueskill.TrueSkill()
    ratings = Ratings(["t", "s"])
    ratings.load_state_dict({"ratings": {"t": [30.0, 4.0], "s": [22.0, 6.0]}})
    t0, s0 = env.create_rating(30.0, 4.0), env.create_rating(22.0, 6.0)
    ratings.record("t", "s", "draw")
    want_s, want_t = trueskill.rate_1vs1(s0, t0, drawn=True, env=env)
    assert (ratings.mu("s"), ratings.mu("t")) == (pytest.approx(want_s.mu), pytest.approx(want_t.mu))
    assert ratings.mu("s") > 22.0 and ratings.mu("t") < 30.0  # a draw moves the favourite down
    ratings.record("t", "s", "teacher")
    want_t2, want_s2 = trueskill.rate_1vs1(want_t, want_s, env=env)
    assert (ratings.mu("t"), ratings.sigma("s")) == (pytest.approx(want_t2.mu), pytest.approx(want_s2.sigma))
    assert "t" in ratings and "nobody" not in ratings


def test_config_and_pairings_are_immutable() -> None:
    import dataclasses

    ratings = Ratings(["t", "s"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        ratings.config.beta = 1.0  # type: ignore[misc]
    (pair,) = pfsp_match(["t"], ["s"], ratings, np.random.default_rng(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.p_ts = 0.0  # type: ignore[misc]
