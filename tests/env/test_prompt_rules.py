"""Every rendered prompt of every prompt set agrees with the env's actual rules (issue 22): the forbidden list is
the validation profile's and forbids nothing the required answer format contains, the stated time limit is the
sandbox's, and the code and value rules are the profile's."""

from __future__ import annotations

import re

import pytest

from populora_env import parallel_env
from populora_env.prompts import list_prompt_sets, seconds_text
from populora_env.seeds import seed_tasks
from populora_env.validation import AZR_BANNED_MODULES, forbidden_hint

ANSWER_WORDS = {"python", "input", "output", "message", "answer", "think", "f"}
"""Words of the answer formats that validation requires (fenced block names, tags, the entry function)."""


def rendered(prompts: str, validation: str, timeout_s: float) -> tuple[list[str], list[str]]:
    """(proposer prompts of all three types, solver prompts of the seed tasks) as the env renders them."""
    env = parallel_env(num_teachers=1, num_students=1, tasks_per_teacher=3, prompts=prompts, validation=validation,
                       timeout_s=timeout_s, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        proposer = list(obs["teacher_0"]["prompts"])
        solver = [env.prompts.solver(t) for t in seed_tasks(env.config.induction_inputs)[:3]]
    finally:
        env.close()
    return proposer, solver


@pytest.mark.parametrize("validation", ["strict", "azr"])
@pytest.mark.parametrize("timeout_s", [2.0, 10.0])
@pytest.mark.parametrize("prompts", list_prompt_sets())
def test_every_prompt_states_the_envs_rules(prompts: str, validation: str, timeout_s: float) -> None:
    proposer, solver = rendered(prompts, validation, timeout_s)
    assert len(proposer) == 3 and len(solver) == 3
    hint = forbidden_hint(validation)
    modules_part, builtins_part = hint.split("; the builtins ")
    modules = modules_part.removeprefix("the modules ").split(", ")
    builtins = builtins_part.split(", ")
    assert all(b.endswith("()") for b in builtins)  # builtins are forbidden as calls, never as bare words
    assert not ANSWER_WORDS & set(modules)
    if validation == "azr":
        assert modules == list(AZR_BANNED_MODULES)
    for text in proposer + solver:
        assert "in any form" not in text  # the AST checks code, never words in comments or block names
        assert "two seconds" not in text
        for stated in re.findall(r"(\d+(?:\.\d+)?) seconds?\b", text):
            assert seconds_text(float(stated)) == seconds_text(timeout_s), (prompts, stated)
        if "do not use:" in text or "Forbidden:" in text:
            assert hint in text
    for text in proposer:
        if validation == "azr":  # expression inputs, one def: no strict-only rule may remain
            assert "helper functions or classes may come before" not in text
            assert "Calls and names are not literals" not in text and "not calls like" not in text
            assert "custom classes" not in text
        else:
            assert "evaluated once" not in text
    if prompts == "azr":  # the set that states a time limit states the sandbox's
        assert all(seconds_text(timeout_s) in text for text in proposer)
