"""The env's verdicts do not depend on how busy the machine is (issue 39).

The same seeded, scripted rounds are played on a quiet machine and then five times on a busy one (two CPU hogs
per core, each in its own session, so the sandbox's sessions get a third of the CPUs or less): the traces,
every proposal's validity and reason, every attempt's verdict and every reward, are identical. The rounds hold
what a timing-dependent verdict would flip: a program that uses a good part of its time limit in CPU (on the
busy machine it takes several times as long in wall time), a program that loops until its limit, and honest
ones. A job's limit counts its own time (CPU, or wall time not spent waiting for a CPU), so the first stays
valid and the loop times out, however busy the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from populora_env import parallel_env

TIMEOUT_S = 0.5
# About 0.2 s of CPU here (40 % of the limit, a margin for CPU time itself growing under load): several times
# that in wall time on the busy machine, where a wall-clock limit would have killed it.
HEAVY = "def f(x):\n    t = 0\n    for i in range(6000000):\n        t += i % 7\n    return x + t % 5\n"
PROGRAMS = [
    HEAVY,
    "def f(x):\n    while True:\n        x += 1\n",
    "def f(x):\n    return [x, x * 2, str(x)]\n",
]


def think(answer: str) -> str:
    return f"<think>ok</think>\n<answer>\n{answer}\n</answer>"


def _propose(info: dict[str, Any], rnd: int) -> tuple[str, ...]:
    out = []
    for k, _ in enumerate(info["requests"]):  # the heavy program first: in both task types over the rounds
        program = PROGRAMS[(rnd + k) % len(PROGRAMS)]
        out.append(think(f"```python\n{program}```\n```input\n{10 * rnd + k}\n```"))
    return tuple(out)


def _solve(env: Any, info: dict[str, Any]) -> tuple[str, ...]:
    out = []
    for k, request in enumerate(info["requests"]):
        task = env.current_tasks[request["task_id"]]
        if request["task_type"] == "deduction":
            answer = task.outputs[0] if k % 2 == 0 else "'wrong'"
            out.append(think(f"```output\n{answer}\n```"))
        else:
            out.append(think(f"```input\n{task.inputs[0] if k % 2 == 0 else 12345}\n```"))
    return tuple(out)


def _trace(rounds: int = 1) -> list[Any]:
    env = parallel_env(num_teachers=1, num_students=1, task_types=("deduction", "abduction"), tasks_per_teacher=3,
                       samples_per_task=1, student_fill=False, timeout_s=TIMEOUT_S, sandbox_workers=2,
                       validation="strict")
    trace: list[Any] = []
    try:
        for rnd in range(rounds):
            obs, infos = env.reset(seed=11 if rnd == 0 else None)
            obs, _, _, _, infos = env.step({"teacher_0": _propose(infos["teacher_0"], rnd)})
            env.step({"student_0": _solve(env, infos["student_0"])})
            res = env.last_outcome.results
            trace.append(([(p.valid, p.reason) for p in res.proposals],
                          [(a.task_id, a.correct, a.reason) for a in res.attempts],
                          {a: list(r) for a, r in env.last_outcome.rewards.items()}))
    finally:
        env.close()
    return trace


def test_the_same_rounds_give_the_same_trace_on_a_busy_machine() -> None:
    quiet = _trace()
    proposals = [p for rnd in quiet for p in rnd[0]]
    assert (True, None) in proposals and (False, "timeout") in proposals  # both kinds of verdict are in play
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(2 * (os.cpu_count() or 1))]
    try:
        for attempt in range(5):
            assert _trace() == quiet, f"busy run {attempt + 1} of 5 differs from the quiet one"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
