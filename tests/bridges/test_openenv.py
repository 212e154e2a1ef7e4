"""The OpenEnv bridge: examples/openenv_round.py pays what play_one_round.py pays; a server on 127.0.0.1 holds 8
sessions at once (and refuses a 9th), answers 10 malformed actions without falling over, and stops cleanly with its
sandbox's processes."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populora_env.policies import continue_prefix
from tests.bridges.marks import extra_marks
from tests.test_examples import run_example

pytestmark = extra_marks("openenv", ("openenv", "fastapi", "uvicorn", "websockets"))

SETTINGS = dict(num_teachers=1, num_students=1, tasks_per_teacher=1, samples_per_task=2, task_types=["deduction"])
TASK = "```python\ndef f(x):\n    return 2 * x + 1\n```\n```input\n20\n```"


class _Shared:
    """One sandbox for the property test's envs, started on first use and closed at exit."""

    def __init__(self) -> None:
        self.sandbox = None

    def get(self):
        if self.sandbox is None:
            import atexit

            from populora_env.sandbox import Limits, Sandbox

            self.sandbox = Sandbox(workers=1, limits=Limits(timeout_s=2.0, memory_mb=512))
            atexit.register(self.sandbox.close)
        return self.sandbox


_SANDBOX = _Shared()


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc)."""
    out, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == parent and int(entry.name) not in out:
                    out.add(int(entry.name))
                    todo.append(int(entry.name))
    return out


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen, str]]:
    p = subprocess.Popen([sys.executable, "-m", "populora_bridges.openenv_server", "--port", "0", "--max-sessions",
                          "8", "--sandbox-workers", "1", "--settings", json.dumps(SETTINGS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), (line, p.stderr.read() if p.poll() is not None else "")
        yield p, line.split()[-1]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=60)


def _play_round(address: str, seed: int) -> dict:
    from populora_bridges.openenv_client import GameAction, GameClient

    with GameClient(base_url=f"http://{address}").sync() as env:
        obs = env.reset(seed=seed).observation
        obs = env.step(GameAction(agent="teacher_0", completions=[
            continue_prefix(obs.requests["teacher_0"][0]["prefix"], TASK)])).observation
        answers = [continue_prefix(r["prefix"], f"```output\n{g}\n```") for r, g in
                   zip(obs.requests["student_0"], (41, 40), strict=True)]
        return env.step(GameAction(agent="student_0", completions=answers)).observation.completion_rewards


def test_the_openenv_example_pays_what_the_env_pays() -> None:
    out = dict(line.split(": ", 1) for line in run_example("openenv_round.py").splitlines())
    direct = dict(line.split(": ", 1) for line in run_example("play_one_round.py").splitlines())
    assert ast.literal_eval(out["per completion"]) == ast.literal_eval(direct["per completion"])
    assert ast.literal_eval(out["per completion"]) == {"teacher_0": [0.5], "student_0": [1.0, -0.5]}
    assert ast.literal_eval(out["the pair"]) == ast.literal_eval(direct["the pair"])


MALFORMED = [
    {"type": "step", "data": {"agent": "teacher_0", "completions": ["x"]}},  # before reset
    {"type": "reset", "data": {"seed": 0}},  # (not malformed: starts the round)
    {"type": "step", "data": {"agent": "nobody", "completions": ["x"]}},
    {"type": "step", "data": {"agent": "student_0", "completions": ["x"]}},  # inactive in the propose phase
    {"type": "step", "data": {"agent": "teacher_0", "completions": ["a", "b", "c"]}},  # more than its prompts
    {"type": "step", "data": {"agent": "teacher_0", "completions": ["x" * 70000]}},  # too long
    {"type": "step", "data": {"agent": "teacher_0", "completions": "not a list"}},
    {"type": "step", "data": {"completions": []}},  # no agent
    {"type": "step", "data": {"agent": ["teacher_0"], "completions": []}},
    {"type": "jump", "data": {}},
]


def test_a_server_holds_8_sessions_answers_malformed_actions_and_stops_cleanly(server) -> None:
    from websockets.sync.client import connect

    proc, address = server
    with ThreadPoolExecutor(8) as pool:  # 8 sessions at once, each its own game
        results = list(pool.map(lambda s: _play_round(address, s), range(8)))
    assert results == [{"teacher_0": [0.5], "student_0": [1.0, -0.5]}] * 8

    with connect(f"ws://{address}/ws") as ws:
        answers = []
        for message in [*MALFORMED, "{not json"]:
            ws.send(message if isinstance(message, str) else json.dumps(message))
            answers.append(json.loads(ws.recv(timeout=60)))
        refused = [a for a in answers if a["type"] == "error" or a["data"].get("observation", {}).get("error")]
        assert len(refused) == 10 and len(answers) == 11  # every malformed action answered, the reset served
        assert all("Traceback" not in json.dumps(a) for a in answers)
        ws.send(json.dumps({"type": "step", "data": {"agent": "teacher_0", "completions": [
            continue_prefix("", TASK)]}}))  # the session still plays after them
        assert json.loads(ws.recv(timeout=60))["data"]["observation"]["phase"] == "solve"

    with ExitStack() as stack:
        opened = [stack.enter_context(connect(f"ws://{address}/ws")) for _ in range(8)]
        for ws in opened:  # a session exists once its first message is answered
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv(timeout=60))["type"] == "state"
        with connect(f"ws://{address}/ws") as ninth:
            assert json.loads(ninth.recv(timeout=60))["data"]["code"] == "CAPACITY_REACHED"

    workers = _children(proc.pid)
    assert workers  # the sandbox's processes live in the server's process tree
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    assert "Traceback" not in proc.stderr.read()
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}") and
                "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]]


@settings(max_examples=30, deadline=None)
@given(agent=st.one_of(st.sampled_from(["teacher_0", "student_0"]), st.text(max_size=64)),
       completions=st.lists(st.one_of(st.text(max_size=200), st.none(), st.integers(), st.floats()), max_size=4),
       reset=st.booleans())
def test_any_typed_action_gets_an_observation_never_an_exception(agent, completions, reset) -> None:
    from populora_bridges.openenv_server import GameAction, GameEnvironment, GameObservation

    env = GameEnvironment(_SANDBOX.get(), SETTINGS)
    if reset:
        env.reset(seed=0)
    obs = env.step(GameAction(agent=agent, completions=completions))
    assert isinstance(obs, GameObservation)
    assert obs.error is not None or (reset and agent == "teacher_0" and len(completions) <= 1)
    json.dumps(obs.model_dump())  # plain data
