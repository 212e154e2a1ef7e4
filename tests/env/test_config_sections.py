"""The env's own config sections check themselves the one way (``validate()`` from the ``check_*`` helpers of
``populora_env.checks``, a :class:`ConfigError` naming the bare field), and whatever consumes one refuses a bad
one when built: the answer checker, the proposal validator, the ratings, the sandbox's :class:`Limits` (built
per job too). :class:`ConfigError` is a ``ValueError``, so ``except ValueError`` callers keep working."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from populora_env.checking import AnswerChecker, CheckConfig
from populora_env.checks import ConfigError, check_choice, check_number, check_section, shown
from populora_env.config import EnvConfig
from populora_env.env import PopuLoRAParallelEnv, parallel_env
from populora_env.matching import Ratings, TrueSkillConfig
from populora_env.sandbox import Limits
from populora_env.validation import ProposalValidator, ValidationConfig


def _refused(make, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert (info.value.field, info.value.reason) == (field, reason)
    assert isinstance(info.value, ValueError)


def test_each_section_names_its_own_field() -> None:
    _refused(TrueSkillConfig(beta=0.0).validate, "beta", "must be > 0, got 0")
    _refused(TrueSkillConfig(draw_probability=1.0).validate, "draw_probability", "must be < 1, got 1")
    _refused(CheckConfig(max_program_chars=0).validate, "max_program_chars", "must be >= 1, got 0")
    _refused(CheckConfig(timeout_s=-1.0).validate, "timeout_s", "must be > 0, got -1")
    _refused(ValidationConfig(profile="lax").validate, "profile", "must be one of strict, azr, got 'lax'")
    _refused(ValidationConfig(response_prefixes={"guessing": ""}).validate, "response_prefixes",
             "must map task types (deduction, abduction, induction) to strings, got {'guessing': ''}")
    _refused(lambda: Limits(memory_mb=8), "memory_mb", "must be >= 16, got 8")
    _refused(lambda: Limits(timeout_s=float("inf")), "timeout_s", "must be a finite number, got inf")
    _refused(lambda: Limits(max_open_files=4), "max_open_files",
             "must be >= 8 (the job needs its standard streams), got 4")


def test_consumers_refuse_a_bad_section_when_built() -> None:
    _refused(lambda: AnswerChecker(CheckConfig(require_think="yes")), "require_think",  # type: ignore[arg-type]
             "must be a bool, got 'yes'")
    _refused(lambda: ProposalValidator(ValidationConfig(induction_inputs=1)), "induction_inputs",
             "must be >= 2, got 1")
    _refused(lambda: Ratings(["a", "b"], TrueSkillConfig(sigma=-1.0)), "sigma", "must be > 0, got -1")
    AnswerChecker(CheckConfig())
    ProposalValidator(ValidationConfig())
    Ratings(["a"], TrueSkillConfig())


def test_an_embedded_section_gets_its_prefix() -> None:
    _refused(lambda: EnvConfig(trueskill=TrueSkillConfig(tau=-1.0)).validate(), "trueskill.tau",
             "must be >= 0, got -1")
    _refused(lambda: check_section("env.", EnvConfig(samples_per_task=0)), "env.samples_per_task",
             "must be >= 1, got 0")


def test_the_helpers() -> None:
    assert [shown(v) for v in (-1.0, 0.5, 1e-5, 3, float("inf"))] == ["-1", "0.5", "1e-05", "3", "inf"]
    assert check_number("x", 2, low=0.0, high=2.0) == 2.0
    _refused(lambda: check_number("x", 2.0, low=0.0, high=2.0, high_open=True), "x", "must be < 2, got 2")
    _refused(lambda: check_number("x", True, low=0.0, high=2.0), "x", "must be a finite number, got True")
    assert check_choice("c", "a", ("a", "b")) == "a"
    _refused(lambda: check_choice("c", "z", ("a", "b")), "c", "must be one of a, b, got 'z'")


def test_the_env_config_is_the_one_declaration_of_the_env_settings() -> None:
    """:class:`EnvConfig` declares the env's settings and their defaults once: the env's constructor names none
    of them (they arrive as the config or as keyword overrides, so no default of its own can drift from the
    config's), every field is a keyword of ``parallel_env``, and the sandbox limits derive from the config."""
    names = [f.name for f in dataclasses.fields(EnvConfig)]
    params = inspect.signature(PopuLoRAParallelEnv.__init__).parameters
    assert not set(params) & set(names)
    assert list(params.values())[-1].kind is inspect.Parameter.VAR_KEYWORD
    defaults = EnvConfig()
    env = parallel_env(**{n: getattr(defaults, n) for n in names})  # every field is a keyword
    assert env.config == parallel_env().config == defaults
    assert env._limits == defaults.sandbox_limits() == Limits(timeout_s=defaults.timeout_s,
                                                             memory_mb=defaults.memory_mb)
    overridden = parallel_env(EnvConfig(num_students=3), samples_per_task=5, timeout_s=1.5)
    assert overridden.config == dataclasses.replace(defaults, num_students=3, samples_per_task=5, timeout_s=1.5)
    assert overridden._limits.timeout_s == 1.5
    for e in (env, overridden):
        e.close()


@pytest.mark.parametrize("section", [ValidationConfig, CheckConfig])
def test_the_validator_and_checker_defaults_are_the_envs(section: type) -> None:
    """A field the validator or the checker shares with the env has the env's default (declared once, in
    ``populora_env.defaults``): a validator built alone judges like the env's. ``timeout_s`` is the exception by
    design: ``None`` there means the sandbox's own limit, which the env sets from its ``timeout_s``."""
    env = EnvConfig()
    shared = [f.name for f in dataclasses.fields(section) if hasattr(env, f.name) and f.name != "timeout_s"]
    assert len(shared) >= 3
    for name in shared:
        assert getattr(section(), name) == getattr(env, name), name
    assert ValidationConfig().profile == env.validation
