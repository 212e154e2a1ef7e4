"""``populora list`` (what can be named, with parameters and a line of documentation, plugins included) and
``populora test-scheme`` / ``test-estimator`` (every branch of a scheme or an estimator, scripted, no model)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from populora_cli.plugin_check import PluginBug, estimator_table, scheme_rounds, scheme_table
from populora_env.rewards import get_reward_scheme

PLUGIN = '''
from agents.advantages import register_advantage
from populora_env import register_reward_scheme, student_reward


@register_reward_scheme("test_only_mean_reward")
def mean_reward(results, bonus=0.0):
    """Teachers: the mean reward of their matched student's attempts, plus a bonus; students: AZR's."""
    rewards = {}
    for student in results.students:
        rewards[student] = [student_reward(a) for a in results.attempts_of(student)]
    for teacher in results.teachers:
        match = results.match_of(teacher)
        mine = rewards[match.student] if match else []
        rewards[teacher] = [sum(mine) / len(mine) + bonus for _ in results.proposals_of(teacher)]
    return rewards


@register_advantage("test_only_centred")
def centred(rewards, response_mask, group_ids, *, scale: float = 1.0, **kw):
    """Rewards minus the batch mean, times scale, on every token."""
    return (rewards - rewards.mean())[:, None] * scale * response_mask
'''


@pytest.fixture
def plugin(tmp_path: Path):
    from agents.advantages import list_advantages, unregister_advantage
    from populora_env import list_reward_schemes, unregister_reward_scheme

    path = tmp_path / "my_plugin.py"
    path.write_text(PLUGIN)
    yield str(path)
    if "test_only_mean_reward" in list_reward_schemes():
        unregister_reward_scheme("test_only_mean_reward")
    if "test_only_centred" in list_advantages():
        unregister_advantage("test_only_centred")


def _out(cli, capsys: pytest.CaptureFixture, *argv: str) -> str:
    capsys.readouterr()
    from populora_cli.main import main

    rc = main(list(argv))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out


# ------------------------------------------------------------------------------------------ populora list


def test_list_estimators_names_each_with_its_parameters(cli, capsys: pytest.CaptureFixture) -> None:
    out = _out(cli, capsys, "list", "estimators")
    lines = out.splitlines()
    assert lines[0].startswith("advantage estimators: --trainer.advantage NAME")
    for name in ("reinforce_pp_baseline", "grpo(eps=1e-06)", "rloo", "dr_grpo", "reinforce_pp(gamma=1.0)"):
        assert any(ln.split()[0] == name for ln in lines[1:]), (name, out)
    assert any(ln.split()[0] == "grpo(eps=1e-06)" and "GRPO" in ln for ln in lines)  # its docstring's line


def test_list_includes_a_plugin_and_every_kind(cli, capsys: pytest.CaptureFixture, plugin: str) -> None:
    out = _out(cli, capsys, "list", "--plugins", plugin)
    assert "test_only_centred(scale=1.0)" in out and "Rewards minus the batch mean" in out
    assert "test_only_mean_reward(bonus=0.0)" in out
    for header in ("reward schemes:", "advantage estimators:", "loss aggregation modes:", "evolution operators:",
                   "PBT fitness:", "PBT selection rules:", "PFSP matching weightings:", "presets:", "models:",
                   "benchmarks:"):
        assert header in out
    for name in ("populora", "azr", "token-mean", "ties(density=0.5", "cpu-smoke", "tiny", "tiny-random",
                 "random:qwen2.5-coder-7b", "humaneval+", "gsm8k"):
        assert name in out, name


def test_list_refuses_an_unknown_kind(cli) -> None:
    rc, err = cli("list", "everything")
    assert rc == 2 and err.startswith("populora list: error: kind: invalid choice 'everything' (choose from ")


# ------------------------------------------------------------------------------------------ test-scheme


def test_the_scripted_rounds_reach_every_branch() -> None:
    """The rounds hold what a scheme must handle: p̂ of 1, 0.5, 0 and None; valid, invalid, badly formatted and
    tampering proposals; correct, wrong and badly formatted attempts, filler attempts; a student with no task."""
    rounds = scheme_rounds()
    proposals = [p for r in rounds for p in r.results.proposals]
    attempts = [a for r in rounds for a in r.results.attempts]
    p_hats = {r.results.solve_rate(p.task_id) for r in rounds for p in r.results.proposals if p.valid}
    assert p_hats == {1.0, 0.5, 0.0, None}
    assert {(p.valid, p.format_ok) for p in proposals} == {(True, True), (False, True), (False, False)}
    assert [(p.reason, p.tamper) for p in proposals if p.tamper is not None] == [("tamper", "introspection")]
    assert {(a.correct, a.format_ok, a.matched) for a in attempts} >= {
        (True, True, True), (False, True, True), (False, False, True), (True, True, False), (False, True, False)}
    assert any(r.results.n_completions("student_0") == 0 and r.results.match_of("teacher_0") is None
               for r in rounds)
    for r in rounds:  # every completion is labelled
        for agent in r.results.agents:
            assert len(r.labels[agent]) == r.results.n_completions(agent)


def test_the_populora_scheme_per_branch() -> None:
    rows = {(title, agent, branch): v for title, agent, branch, v in
            scheme_table(get_reward_scheme("populora"), {})}
    assert rows[("solved and unsolved tasks", "teacher_0", "valid task, solved at every attempt (p̂ = 1)")] == 0.0
    assert rows[("solved and unsolved tasks", "teacher_0", "valid task, solved at half (p̂ = 0.5)")] == 0.5
    assert rows[("solved and unsolved tasks", "teacher_0", "valid task, never solved (p̂ = 0)")] == 0.0
    assert rows[("solved and unsolved tasks", "student_0", "format error")] == -1.0
    assert rows[("invalid proposals and filler attempts", "teacher_0", "invalid proposal (fails validation)")] == -1.0
    assert rows[("invalid proposals and filler attempts", "teacher_0",
                 "tampering proposal (reason tamper)")] == -1.0
    assert rows[("invalid proposals and filler attempts", "student_0", "filler task, wrong")] == -0.5
    assert rows[("no student", "teacher_0", "valid task, no matched student (p̂ None)")] == 0.0
    assert math.isnan(rows[("no student", "student_0", "no task this round (no completion)")])


def test_test_scheme_prints_every_branch_for_a_builtin_and_a_plugin(cli, capsys: pytest.CaptureFixture,
                                                                    plugin: str) -> None:
    out = _out(cli, capsys, "test-scheme", "populora")
    for branch in ("p̂ = 1", "p̂ = 0.5", "p̂ = 0)", "invalid proposal", "badly formatted proposal",
                   "tampering proposal", "format error", "filler task", "no matched student", "no task this round"):
        assert branch in out, branch
    out = _out(cli, capsys, "test-scheme", "azr", "--kwargs", '{"extreme_reward": -0.5}')
    assert "valid task, never solved (p̂ = 0)             -0.500" in out


def test_a_plugin_scheme_s_bug_exits_2_with_its_own_exception(cli, plugin: str) -> None:
    """The plugin divides by the number of its student's attempts: the round without a student raises, and the
    line names the round, the exception and where in the plugin it was raised."""
    rc, err = cli("test-scheme", "--plugins", plugin, "test_only_mean_reward")
    assert rc == 2
    assert err.startswith("populora test-scheme: error: test_only_mean_reward: round 'no student': "
                          "ZeroDivisionError: division by zero at "), err
    line = PLUGIN.splitlines().index(next(ln for ln in PLUGIN.splitlines() if "/ len(mine)" in ln)) + 1
    assert err.rstrip().endswith(f"{plugin}:{line}") and len(err.strip().splitlines()) == 1, err
    rc, err = cli("test-scheme", "--plugins", plugin, "test_only_mean_reward", "--kwargs", '{"bonnus": 1}')
    assert rc == 2 and err.startswith("populora test-scheme: error: --kwargs: got an unexpected keyword argument "
                                      "'bonnus' (scheme 'mean_reward' takes: bonus)"), err


def test_a_scheme_returning_the_wrong_length_is_reported() -> None:
    with pytest.raises(PluginBug, match="round 'solved and unsolved tasks': RewardSchemeError: reward scheme "
                                        "returned 0 rewards for teacher_0, which has 3 completions"):
        scheme_table(lambda results: {}, {})


# ------------------------------------------------------------------------------------------ test-estimator


def test_test_estimator_on_a_builtin_and_a_plugin(cli, capsys: pytest.CaptureFixture, plugin: str) -> None:
    out = _out(cli, capsys, "test-estimator", "grpo", "--kwargs", '{"eps": 0.001}')
    assert "group b (all rewards equal)" in out and "(no token)" in out
    out = _out(cli, capsys, "test-estimator", "--plugins", plugin, "test_only_centred", "--kwargs", '{"scale": 2}')
    assert "'test_only_centred' with {\"scale\": 2}" in out
    rc, err = cli("test-estimator", "grpo", "--kwargs", '{"epsilon": 1}')
    assert (rc, err.strip()) == (2, "populora test-estimator: error: --kwargs: estimator 'grpo' takes no keyword "
                                    "argument 'epsilon' (it takes: eps)")


def test_an_estimator_that_writes_on_padding_or_the_wrong_shape_is_reported() -> None:
    import torch

    rows = estimator_table(lambda r, m, g, **kw: (r[:, None] * m), {})
    assert [n for _, _, n, _ in rows] == [3, 5, 2, 4, 4, 3, 0, 5]
    with pytest.raises(PluginBug, match="non-zero advantages on padding"):
        estimator_table(lambda r, m, g, **kw: r[:, None] * torch.ones_like(m), {})
    with pytest.raises(PluginBug, match=r"returned \(8,\), expected a tensor of shape \(8, 5\)"):
        estimator_table(lambda r, m, g, **kw: r, {})
    with pytest.raises(PluginBug, match="ValueError: nope at "):
        estimator_table(lambda r, m, g, **kw: (_ for _ in ()).throw(ValueError("nope")), {})


EXITING = '''
import sys
from agents.advantages import register_advantage
from populora_env import register_reward_scheme


@register_reward_scheme("test_only_exits")
def exits(results):
    sys.exit(0)


@register_reward_scheme("test_only_interrupts")
def interrupts(results):
    raise KeyboardInterrupt


@register_advantage("test_only_exits_3")
def exits_3(rewards, response_mask, group_ids, **kw):
    sys.exit(3)


@register_advantage("test_only_interrupts")
def interrupts_too(rewards, response_mask, group_ids, **kw):
    raise KeyboardInterrupt


from evolution.selection import register_fitness, register_selection
from populora_env.matching import register_matching


@register_selection("test_only_exits")
def selection_exits(ctx):
    sys.exit(0)


@register_fitness("test_only_exits_4")
def fitness_exits(rating, history):
    sys.exit(4)


@register_matching("test_only_interrupts")
def matching_interrupts(p):
    raise KeyboardInterrupt
'''


@pytest.fixture
def exiting_plugin(tmp_path: Path):
    from agents.advantages import list_advantages, unregister_advantage
    from populora_env import list_reward_schemes, unregister_reward_scheme

    path = tmp_path / "exiting_plugin.py"
    path.write_text(EXITING)
    yield str(path)
    for name in ("test_only_exits", "test_only_interrupts"):
        if name in list_reward_schemes():
            unregister_reward_scheme(name)
    for name in ("test_only_exits_3", "test_only_interrupts"):
        if name in list_advantages():
            unregister_advantage(name)
    from evolution.selection import list_fitness, list_selections, unregister_fitness, unregister_selection
    from populora_env.matching import list_matchings, unregister_matching

    for listed, unregister, name in ((list_selections, unregister_selection, "test_only_exits"),
                                     (list_fitness, unregister_fitness, "test_only_exits_4"),
                                     (list_matchings, unregister_matching, "test_only_interrupts")):
        if name in [x.name for x in listed()]:
            unregister(name)


@pytest.mark.parametrize("cmd, name, what", [
    ("test-scheme", "test_only_exits", "round 'solved and unsolved tasks': RewardSchemeError: reward scheme "
                                       "'exits' called sys.exit(0)"),
    ("test-scheme", "test_only_interrupts", "round 'solved and unsolved tasks': KeyboardInterrupt: "),
    ("test-estimator", "test_only_exits_3", "SystemExit: called sys.exit(3) at "),
    ("test-estimator", "test_only_interrupts", "KeyboardInterrupt:  at "),
    ("test-selection", "test_only_exits", "event 1: SystemExit: called sys.exit(0) at "),
    ("test-selection", "truncation --fitness test_only_exits_4",
     "fitness 'test_only_exits_4': SystemExit: called sys.exit(4) at "),
    ("test-matching", "test_only_interrupts", "KeyboardInterrupt:  at "),
])
def test_a_plugin_that_exits_or_interrupts_is_a_plugin_failure(cli, exiting_plugin: str, cmd: str, name: str,
                                                              what: str) -> None:
    """``sys.exit(0)`` in a scheme exited 0 silently (issue 48): any exit, and a ``KeyboardInterrupt`` the
    plugin raised itself (no SIGINT arrived), is the plugin's failure: one line, exit 2."""
    rc, err = cli(cmd, *name.split(), "--plugins", exiting_plugin)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"populora {cmd}: error: {name.split()[0]}: {what}"), err


def test_a_scheme_s_exit_in_a_run_is_a_reward_scheme_error() -> None:
    """The env's own check of a scheme's answer turns ``sys.exit`` into the run's one-line RewardSchemeError."""
    from populora_env.rewards import RewardSchemeError, compute_rewards

    def leaves(results):
        sys.exit(0)

    with pytest.raises(RewardSchemeError, match=r"reward scheme 'leaves' called sys.exit\(0\)"):
        compute_rewards(leaves, scheme_rounds()[0].results)
