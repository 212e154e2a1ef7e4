"""``populora test-scheme NAME`` and ``populora test-estimator NAME``: a reward scheme or an advantage estimator
(a plugin's, with ``--plugins FILE.py``, or a built-in) run on scripted inputs that reach every branch, in
seconds and without a model; a table of what it returned, or exit 2 with its own exception.

Why: a run of the ``tiny`` preset (or any ``tiny-random`` run) never produces a valid task — a random model
writes no parsable program — so a plugin "tested" on it only ever runs its invalid-proposal branch.

**Schemes** get three scripted rounds (:func:`scheme_rounds`), built as the env builds a round's
:class:`~populora_env.results.RoundResults`, with the branches a round can hold:

1. teacher ``teacher_0``'s valid tasks that its matched student ``student_0`` solves at every attempt
   (p̂ = 1), at half of them (p̂ = 0.5) and at none (p̂ = 0); the student's attempts correct, wrong but well
   formatted, and a format error;
2. an invalid proposal (a program that fails validation), a badly formatted one and a tampering one (its
   program tripped a sandbox defence: reason ``tamper``, the defence's class in ``tamper``), next to one valid
   task; the student's filler attempts (a buffer task, not its teacher's: they never count towards p̂);
3. no student: ``teacher_0``'s valid task with no matched student (p̂ is ``None``, ``match_of`` is ``None``),
   and a student with no task at all (no completion: its list of rewards is empty).

Every record carries what a run gives a scheme (docs/swapping.md, "What a scheme receives"): valid proposals' tasks,
whose programs rise in complexity, an induction task and its submitted programs, completion texts and token
counts that grow with the index, answers, the ratings before the round and the buffers (a seed's program, and an
earlier round's task from the second round on).

Each round goes through the env's own check of a scheme's answer (one finite real per completion,
:func:`populora_env.rewards.compute_rewards`). **Estimators** get one scripted batch (:func:`estimator_batch`):
groups whose rewards differ, a group whose rewards are all equal, a group of one, completions of unequal
lengths with right padding, an empty completion, two whitening scopes and per-token rewards; the result must be
``[B, T]``, finite and zero on padding.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any

import tyro

from populora_env.results import AttemptResult, MatchResult, ProposalResult, RoundResults
from populora_env.tasks import Task, TaskType
from selfplay import interrupt

__all__ = ["CheckArgs", "PluginBug", "check_main", "estimator_batch", "scheme_rounds", "scheme_table"]


@dataclass
class CheckArgs:
    """Run a reward scheme (test-scheme) or an advantage estimator (test-estimator) on scripted inputs that reach
    every branch, in seconds and without a model, and print what it returned per branch."""

    name: Annotated[str, tyro.conf.Positional]
    """The registered name (a built-in, or what --plugins registers)."""
    plugins: tuple[str, ...] = field(default_factory=tuple)
    """Plugin modules (importable names or .py paths) imported first."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Its keyword arguments as JSON ('{"invalid": -0.25}'), checked against its signature as a run's are."""


class PluginBug(Exception):
    """The scheme or estimator raised or returned something a run refuses; the message says which input."""


# ------------------------------------------------------------------------------------------ schemes


#: The scripted tasks' programs, of rising complexity (AST depth, cyclomatic complexity, lines), so a scheme that
#: reads :attr:`ProposalResult.metrics` sees them differ.
_PROGRAMS = {
    "t-all": "def f(x):\n    return x + 1",
    "t-half": "def f(xs):\n    total = 0\n    for x in xs:\n        if x % 2:\n            total += x\n    return total",
    "t-none": ("def f(s):\n    out = []\n    for i, c in enumerate(s):\n        if c.isdigit() and i % 2:\n"
               "            out.append(int(c) * 2)\n        elif c.isalpha():\n            out.append(ord(c))\n"
               "    return sum(out) if out else -1"),
}


def _task(task_id: str, round_index: int, teacher: str | None = "teacher_0", task_type: str = "deduction") -> Task:
    program = _PROGRAMS.get(task_id, "def f(a, b):\n    return a * b")
    if task_type == "induction":  # an induction task's program is a buffer program (the previous round's)
        return Task(task_id, TaskType.INDUCTION, _PROGRAMS["t-half"], ("[1, 2]", "[3]", "[4, 5]", "[7]"),
                    ("1", "3", "5", "7"), "sum of the odd numbers", teacher, round_index)
    return Task(task_id, TaskType.parse(task_type), program, ("3",), ("4",), "", teacher, round_index)


def _proposal(i: int, task: str, valid: bool = True, reason: str | None = None, format_ok: bool = True,
              teacher: str = "teacher_0", task_type: str = "deduction", tamper: str | None = None,
              round_index: int = 0) -> ProposalResult:
    parsed = _task(task, round_index, teacher, task_type) if valid else None
    program = _PROGRAMS.get(task, "def f(x):\n    return x")
    body = f"```python\n{program}\n```\n```input\n3\n```" if format_ok else program
    completion = f"<think>A task.</think><answer>{body}</answer>" if format_ok else body
    return ProposalResult(teacher, i, task_type, task, format_ok, valid, reason, tamper, task=parsed,
                          completion=completion, num_tokens=8 + len(completion) // 4)


def _attempt(i: int, task: str, correct: bool, format_ok: bool = True, teacher: str | None = "teacher_0",
             student: str = "student_0", task_type: str = "deduction", round_index: int = 0) -> AttemptResult:
    reason = None if correct else ("wrong" if format_ok else "format")
    answer = (f"```python\n{_PROGRAMS['t-half']}\n```" if task_type == "induction"
              else ("4" if correct else "5")) if format_ok else None
    think = "Let me work it out. " * (1 + 3 * i)  # longer reasoning at every index: token counts differ
    completion = f"<think>{think}</think><answer>{answer}</answer>" if format_ok else think
    program = answer.split("\n", 1)[1].rsplit("\n", 1)[0] if answer and task_type == "induction" else None
    return AttemptResult(student, i, task, task_type, teacher, format_ok, correct, reason,
                         task=_task(task, round_index - (teacher is None), teacher, task_type), completion=completion,
                         answer=answer, program=program, num_tokens=4 + len(completion) // 4)


def _match(p_hat: float | None, n_valid: int, n_attempts: int, n_correct: int) -> MatchResult:
    outcome = "draw" if p_hat is None else ("student" if p_hat > 0.5 else "teacher" if p_hat < 0.5 else "draw")
    return MatchResult("teacher_0", "student_0", 0.5, p_hat, n_valid, n_attempts, n_correct, outcome)


def _context(round_index: int) -> dict[str, Any]:
    """A scripted round's ratings before the round and its buffers (a seed task, and from the second round on, an
    earlier round's task per type)."""
    ratings = MappingProxyType({"teacher_0": (25.0 + round_index, 8.0), "student_0": (25.0 - round_index, 8.0)})
    buffers = {t.value: (_task("t-all", -1, None, t.value),) for t in TaskType}
    if round_index:
        buffers = {k: (*v, _task("t-half", round_index - 1, "teacher_0", k)) for k, v in buffers.items()}
    return {"ratings_before": ratings, "buffers": MappingProxyType(buffers)}


@dataclass(frozen=True)
class Labelled:
    """A scripted round and what each completion stands for: ``labels[agent][index]``."""

    title: str
    results: RoundResults
    labels: dict[str, list[str]]


def scheme_rounds() -> list[Labelled]:
    """The three scripted rounds (see the module docstring)."""
    solved = RoundResults(
        0, ("teacher_0",), ("student_0",),
        (_proposal(0, "t-all"), _proposal(1, "t-half"), _proposal(2, "t-none")),
        (_attempt(0, "t-all", True), _attempt(1, "t-all", True), _attempt(2, "t-half", True),
         _attempt(3, "t-half", False), _attempt(4, "t-none", False), _attempt(5, "t-none", False, format_ok=False)),
        (_match(0.5, 3, 6, 3),), **_context(0),
    )
    invalid = RoundResults(
        1, ("teacher_0",), ("student_0",),
        (_proposal(0, "t-bad", valid=False, reason="error", round_index=1),
         _proposal(1, "t-fmt", valid=False, reason="format", format_ok=False, round_index=1),
         _proposal(2, "t-ok", task_type="induction", round_index=1),
         _proposal(3, "t-hack", valid=False, reason="tamper", tamper="introspection", round_index=1)),
        (_attempt(0, "t-ok", True, task_type="induction", round_index=1),
         _attempt(1, "t-ok", False, task_type="induction", round_index=1),
         _attempt(2, "t-buffer", True, teacher=None, round_index=1),
         _attempt(3, "t-buffer", False, teacher=None, round_index=1)),
        (_match(0.5, 1, 2, 1),), **_context(1),
    )
    alone = RoundResults(
        2, ("teacher_0",), ("student_0",), (_proposal(0, "t-alone", round_index=2),), (), (), **_context(2),
    )
    return [
        Labelled("solved and unsolved tasks", solved, {
            "teacher_0": ["valid task, solved at every attempt (p̂ = 1)", "valid task, solved at half (p̂ = 0.5)",
                          "valid task, never solved (p̂ = 0)"],
            "student_0": ["correct", "correct", "correct", "wrong, well formatted", "wrong, well formatted",
                          "format error"]}),
        Labelled("invalid proposals and filler attempts", invalid, {
            "teacher_0": ["invalid proposal (fails validation)", "badly formatted proposal",
                          "valid induction task (p̂ = 0.5)",
                          "tampering proposal (reason tamper)"],
            "student_0": ["induction program, correct", "induction program, wrong",
                          "filler task (not its teacher's), correct",
                          "filler task, wrong"]}),
        Labelled("no student", alone, {
            "teacher_0": ["valid task, no matched student (p̂ None)"],
            "student_0": []}),
    ]


PLUGIN_EXITS = (Exception, SystemExit, KeyboardInterrupt)
"""What a scheme or estimator may raise that is its failure: any exception, ``sys.exit(N)`` (which would end the
command with the plugin's status, 0 included) and a ``KeyboardInterrupt`` it raised itself (a real Ctrl-C is
told apart by :mod:`selfplay.interrupt` and ends the command with status 130)."""


def _plugin_failure(exc: BaseException) -> str:
    """What the plugin did: ``SystemExit: sys.exit(0)``, ``KeyError: 'x'``."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` (the scheme's own code, where it failed)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def scheme_table(scheme: Callable[..., Any], kwargs: Mapping[str, Any]) -> list[tuple[str, str, str, float]]:
    """``(round, agent, branch, reward)`` for every completion of :func:`scheme_rounds`, and one row per agent
    with no completion (reward ``nan``); :class:`PluginBug` naming the round if the scheme fails."""
    from populora_env.rewards import compute_rewards

    rows: list[tuple[str, str, str, float]] = []
    for labelled in scheme_rounds():
        try:
            rewards = compute_rewards(scheme, labelled.results, kwargs)
        except PLUGIN_EXITS as exc:  # the plugin's own exception, reported as it is
            interrupt.reraise_if_interrupted(exc)
            raise PluginBug(f"round '{labelled.title}': {_plugin_failure(exc)}{_where(exc)}") from exc
        for agent in labelled.results.agents:
            if not labelled.labels[agent]:
                rows.append((labelled.title, agent, "no task this round (no completion)", float("nan")))
            for label, value in zip(labelled.labels[agent], rewards[agent], strict=True):
                rows.append((labelled.title, agent, label, value))
    return rows


# ------------------------------------------------------------------------------------------ estimators


def estimator_batch() -> dict[str, Any]:
    """The scripted batch (see the module docstring) and a label per row."""
    import torch

    lengths = [3, 5, 2, 4, 4, 3, 0, 5]
    T = max(lengths)
    return {
        "rewards": torch.tensor([1.0, 0.0, -0.5, 0.5, 0.5, 0.5, -1.0, 1.0]),
        "response_mask": torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths]),
        "group_ids": ["a", "a", "a", "b", "b", "b", "c", "d"],
        "scope_ids": [("student", "deduction")] * 6 + [("teacher", "deduction")] * 2,
        "token_rewards": torch.zeros(len(lengths), T),
        "labels": ["group a (rewards differ)", "group a", "group a", "group b (all rewards equal)", "group b",
                   "group b", "group c of one, empty completion", "group d of one"],
    }


def estimator_table(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> list[tuple[str, float, int, list[float]]]:
    """``(label, reward, length, advantages on its tokens)`` per row of :func:`estimator_batch`;
    :class:`PluginBug` when the estimator raises or returns a tensor a run refuses."""
    import torch

    batch = estimator_batch()
    labels = batch.pop("labels")
    mask = batch["response_mask"]
    try:
        adv = fn(batch["rewards"], mask, batch["group_ids"], scope_ids=batch["scope_ids"],
                 token_rewards=batch["token_rewards"], **kwargs)
    except PLUGIN_EXITS as exc:  # the plugin's own exception, reported as it is
        interrupt.reraise_if_interrupted(exc)
        raise PluginBug(f"{_plugin_failure(exc)}{_where(exc)}") from exc
    if not isinstance(adv, torch.Tensor) or tuple(adv.shape) != tuple(mask.shape):
        got = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
        raise PluginBug(f"returned {got}, expected a tensor of shape {tuple(mask.shape)} (rows, tokens)")
    adv = adv.detach().float()
    if not bool(torch.isfinite(adv).all()):
        raise PluginBug(f"returned non-finite advantages: {adv.tolist()}")
    if bool((adv * (1 - mask)).abs().gt(0).any()):
        raise PluginBug("returned non-zero advantages on padding (positions where response_mask is 0)")
    lengths = mask.sum(1).long().tolist()
    return [(labels[i], float(batch["rewards"][i]), n, adv[i, :n].tolist()) for i, n in enumerate(lengths)]


# ------------------------------------------------------------------------------------------ the command


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:+.3f}"


def _scheme(args: CheckArgs) -> str:
    from populora_env.config import EnvConfig
    from populora_env.rewards import get_reward_scheme

    EnvConfig(reward_scheme=args.name, reward_kwargs=dict(args.kwargs)).validate()  # name and kwargs, as a run
    rows = scheme_table(get_reward_scheme(args.name), args.kwargs)
    width = max(len(r[2]) for r in rows)
    lines = [f"reward scheme {args.name!r}{' with ' + json.dumps(args.kwargs) if args.kwargs else ''}: "
             "rewards per branch of three scripted rounds (no model)"]
    current = None
    for title, agent, branch, value in rows:
        if title != current:
            lines.append(f"  {title}:")
            current = title
        lines.append(f"    {agent:<10} {branch:<{width}}  {_fmt(value)}")
    return "\n".join(lines)


def _estimator(args: CheckArgs) -> str:
    from agents.trainer_config import TrainerConfig

    TrainerConfig(advantage=args.name, advantage_kwargs=dict(args.kwargs)).validate()  # name and kwargs
    from agents.advantages import get_advantage

    rows = estimator_table(get_advantage(args.name), args.kwargs)
    width = max(len(r[0]) for r in rows)
    lines = [f"advantage estimator {args.name!r}{' with ' + json.dumps(args.kwargs) if args.kwargs else ''}: "
             "advantages per row of a scripted batch (scopes: rows 1-6 student, 7-8 teacher; no model)",
             f"    {'row':<{width}}  reward  tokens  advantage per token"]
    for label, reward, n, values in rows:
        shown = " ".join(_fmt(v) for v in values) or "(no token)"
        lines.append(f"    {label:<{width}}  {reward:+.2f}   {n:>4}    {shown}")
    return "\n".join(lines)


def _name_after_plugins(argv: list[str]) -> list[str]:
    """``--plugins FILE NAME --kwargs ...`` -> ``NAME --plugins FILE --kwargs ...``: ``--plugins`` takes every
    value up to the next flag, so a NAME written after the plugins (the order a reader writes it in) is the
    last of them when no other positional argument is given."""
    if "--plugins" not in argv:
        return argv
    i = argv.index("--plugins")
    j = i + 1
    while j < len(argv) and not argv[j].startswith("-"):
        j += 1
    values = argv[i + 1:j]
    others = [a for k, a in enumerate(argv) if not (i <= k < j) and not a.startswith("-")]
    flag_values = {argv[k + 1] for k, a in enumerate(argv[:-1]) if a.startswith("--") and a != "--plugins"}
    if len(values) < 2 or [a for a in others if a not in flag_values]:
        return argv
    return [values[-1], *argv[:j - 1], *argv[j:]]


def check_main(cmd: str, argv: Sequence[str]) -> int:
    """Entry of ``populora test-scheme`` / ``populora test-estimator``; returns the exit status."""
    from populora_cli.errors import fail
    from populora_cli.parsing import json_dict_rule, parse
    from populora_env.checks import ConfigError
    from selfplay.plugins import PluginError, load_plugins, normalize_plugin

    with json_dict_rule():
        args = parse(CheckArgs, _name_after_plugins(list(argv)), f"populora {cmd}")
    try:
        load_plugins(normalize_plugin(p) for p in args.plugins)
    except PluginError as e:
        return fail(cmd, f"--plugins: {e}")
    try:
        print(_scheme(args) if cmd == "test-scheme" else _estimator(args))
    except ConfigError as e:  # the name (positional) or its keyword arguments (--kwargs)
        return fail(cmd, f"{'--kwargs' if e.field.endswith('kwargs') else 'NAME'}: {e.reason}")
    except PluginBug as e:
        return fail(cmd, f"{args.name}: {e}")
    return 0
