"""The game's rounds as a TRL ``GRPOTrainer`` dataset and reward function (docs/trl.md).

A GRPO group (``num_generations`` completions of one prompt) is paid by **replaying a round of the env**, never by
re-computing a reward here: each prompt of the dataset comes from a round played once, and the bridge keeps what
makes that round reproducible, a :class:`Round` (the env's ``state_dict()`` before ``reset``, the reset seed and,
for students, the teacher's proposal). To pay completions, the env is restored to that state, reset with that seed,
and stepped with the completions: the rewards are the env's ``infos[agent]["completion_rewards"]`` under its
own reward scheme, and the round's summary gives the game's metrics (:func:`populora_bridges.metrics.round_metrics`),
which reach TRL's logs through its ``log_metric`` (and the completions table through ``log_extra``).

- :class:`StudentRounds`: the trained model is ``student_0`` of a one-teacher, one-student game with
  ``samples_per_task = num_generations`` and ``tasks_per_teacher = 1``; a group is the student's attempts at one
  task, the whole solve step of one round, so the student rewards *and* the pair's p̂ and outcome are exactly the
  env's. Teachers are the policies the user passes (the scripted ``SeedTeacher``, frozen run members
  (:class:`populora_bridges.grpo.members.RunMembers`), a saved task buffer (:class:`BufferTeacher`)), one per
  round in turn.
- :class:`TeacherRounds`: the trained model is ``teacher_0`` (one proposal per round) against the frozen
  students the user passes (``num_students`` of them, matched by the env's PFSP); each completion of a group is
  replayed as its own round from the same state and seed, so every proposal is validated and attempted
  (``samples_per_task`` times by the matched student) exactly as the env would, and paid the scheme's teacher
  reward (the ``populora`` scheme: 1 − p̂ if the student solves it at least once, 0 if never, −1 invalid).

GRPO then normalises each group's rewards itself, ``A_i = (r_i − mean(r)) / (std(r) + ε)`` (``scale_rewards``):
the game's reward enters before that normalisation, so a group whose completions all earn the same reward (all
invalid, say) teaches nothing, as in the env's own estimators.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from populora_bridges.metrics import round_metrics
from populora_env import CompletionText, PopuLoRAParallelEnv, parallel_env
from populora_env.prompts import with_prefix
from populora_env.sandbox import Limits, Sandbox

Policy = Any
"""An object with ``act(observation, info) -> completions``, or a factory ``env -> policy`` (a class such as
``OracleStudent``, or a function), called once with the env the policy plays in."""


@dataclass(frozen=True)
class Round:
    """What replays one round: the env's state before its ``reset``, the seed, the teacher's proposal (student
    training; empty for teacher training) and the trained agent's observation (checked on replay)."""

    state: dict[str, Any]
    seed: int
    proposal: tuple[str, ...]
    observation: str


def completion_entry(text: str, token_ids: Sequence[int] | None) -> str:
    """The env's action entry for one completion: a :class:`~populora_env.results.CompletionText` carrying
    ``len(token_ids)`` (what TRL generated; reward schemes read it as ``num_tokens``), the plain text when TRL
    gave no ids."""
    return text if token_ids is None else CompletionText(text, len(token_ids))


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string (standard prompts) or ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return ""


def make_policy(spec: Policy, env: PopuLoRAParallelEnv) -> Any:
    """``spec`` itself when it is a policy instance, else ``spec(env)``."""
    return spec if hasattr(spec, "act") and not isinstance(spec, type) else spec(env)


def render_prompt(tokenizer: Any, observation: str, request: Mapping[str, Any]) -> str:
    """The text generation starts from, as the project's generators build it: the chat template's user turn and
    assistant opening, then the response prefix (``chat_template``); else the observation, which ends with it."""
    prefix = str(request.get("prefix", ""))
    if request.get("chat_template", True) and getattr(tokenizer, "chat_template", None):
        opened = tokenizer.apply_chat_template([{"role": "user", "content": observation}], tokenize=False,
                                               add_generation_prompt=True)
        return opened + prefix
    return with_prefix(observation, prefix)


class GameRounds:
    """What both roles share: the env's settings, one sandbox, the rounds played, replay and logging."""

    reward_name = "populora"
    others_role = "agent"
    fixed: dict[str, Any] = {}

    def __init__(self, others: Sequence[Policy], *, num_generations: int, tokenizer: Any, seed: int = 0,
                 sandbox: Any = None, **env_settings: Any) -> None:
        if not others:
            raise ValueError(f"{type(self).__name__} needs at least one {self.others_role} policy")
        self.others = list(others)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a GRPO group), got {num_generations}")
        self.num_generations, self.tokenizer, self.seed = num_generations, tokenizer, seed
        clash = sorted(set(env_settings) & set(self.fixed_settings()))
        if clash:
            raise ValueError(f"{', '.join(clash)}: set by the bridge ({type(self).__name__} plays "
                             f"{self.fixed_settings()})")
        self.settings = {**env_settings, **self.fixed_settings()}
        self._own_sandbox = sandbox is None
        self.sandbox = sandbox if sandbox is not None else Sandbox(
            workers=int(env_settings.get("sandbox_workers", 1)),
            limits=Limits(timeout_s=float(env_settings.get("timeout_s", 2.0)),
                          memory_mb=int(env_settings.get("memory_mb", 512))))
        self.rounds: list[Round] = []
        self.replay_env = self.new_env()
        self.reward = self._reward_function()

    def fixed_settings(self) -> dict[str, Any]:
        """The env settings this role's bridge fixes."""
        return dict(self.fixed)

    def new_env(self) -> PopuLoRAParallelEnv:
        """A fresh env with the bridge's settings on the bridge's sandbox."""
        return parallel_env(sandbox=self.sandbox, **self.settings)

    def round_seed(self, k: int) -> int:
        """The reset seed of round ``k`` (a 31-bit function of the bridge's seed and ``k``)."""
        return int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0] & 0x7FFFFFFF)

    def replay(self, record: Round) -> tuple[dict, dict]:
        """Restore the replay env to ``record``'s state and reset it with its seed; ``(obs, infos)``."""
        self.replay_env.load_state_dict(record.state)
        return self.replay_env.reset(seed=record.seed)

    def dataset(self, rounds: int):
        """A ``datasets.Dataset`` of the prompts of ``rounds`` rounds (columns ``prompt``, ``round``,
        ``task_type``; rounds that give the trained agent no prompt are left out)."""
        from datasets import Dataset

        rows = self.play(rounds)
        if not rows:
            raise ValueError(f"{rounds} rounds gave the trained agent no prompt: check the teachers' policies")
        return Dataset.from_list(rows)

    def play(self, rounds: int) -> list[dict[str, Any]]:
        """Play ``rounds`` rounds of the trained agent's side up to its prompt (:meth:`open_round`), saving each
        as a :class:`Round`; one dataset row per round that gives the agent a prompt."""
        env = self.new_env()
        self.bind(env)
        rows = []
        try:
            for k in range(rounds):
                state, seed = env.state_dict(), self.round_seed(k)
                opened = self.open_round(env, k, *env.reset(seed=seed))
                while env.phase != "done":  # the round ends here; TRL's completions replay it
                    env.step({})
                if opened is None:
                    continue
                proposal, observation, request = opened
                self.rounds.append(Round(state, seed, proposal, observation))
                rows.append({"prompt": render_prompt(self.tokenizer, observation, request),
                             "round": len(self.rounds) - 1, "task_type": request["task_type"]})
        finally:
            env.close()
        return rows

    def bind(self, env: PopuLoRAParallelEnv) -> None:
        """Build the policies that play in ``env`` (:meth:`play`'s env)."""

    def open_round(self, env: PopuLoRAParallelEnv, k: int, obs: dict, infos: dict
                   ) -> tuple[tuple[str, ...], str, Mapping[str, Any]] | None:  # pragma: no cover - per role
        """Round ``k`` after ``reset``: ``(proposal, observation, request)`` of the trained agent's prompt, or
        ``None`` when it gets none."""
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Write the rounds (``[{state, seed, proposal, observation}]``, JSON) to ``path``: what a replay needs."""
        path = Path(path)
        path.write_text(json.dumps([asdict(r) for r in self.rounds]))
        return path

    def close(self) -> None:
        """Close the bridge's sandbox (when it started it)."""
        if self._own_sandbox:
            self.sandbox.close()

    # ------------------------------------------------------------------------------- TRL's reward function

    def _reward_function(self) -> Callable[..., list[float]]:
        def reward(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] | None = None,
                   round: Sequence[int] | None = None, log_metric: Callable | None = None,
                   log_extra: Callable | None = None, **_: Any) -> list[float]:
            if round is None or len(round) != len(completions):
                raise ValueError("the reward function needs the dataset's 'round' column (one per completion)")
            ids = completion_ids if completion_ids is not None else [None] * len(completions)
            entries = [completion_entry(completion_text(c), t) for c, t in zip(completions, ids, strict=True)]
            rewards, details, summaries = self.pay([int(r) for r in round], entries)
            for summary in summaries:
                for name, value in round_metrics(summary).items():
                    if log_metric is not None:
                        log_metric(name, value)
            if log_extra is not None:
                log_extra("round", [int(r) for r in round])
                log_extra("reason", [d.get("reason") or "ok" for d in details])
            return rewards

        reward.__name__ = self.reward_name
        return reward

    def pay(self, rounds: Sequence[int], entries: Sequence[object]
            ) -> tuple[list[float], list[dict[str, Any]], list[dict[str, Any]]]:
        """Each group's rewards and verdicts (one per completion) and its rounds' summaries, in order."""
        rewards: list[float] = []
        details: list[dict[str, Any]] = []
        summaries: list[dict[str, Any]] = []
        for start, k in groups(rounds, self.num_generations):
            for played in self.pay_group(self.rounds[k], entries[start:start + self.num_generations]):
                rewards += played[0]
                details += played[1]
                summaries.append(played[2])
        return rewards, details, summaries

    def pay_group(self, record: Round, entries: Sequence[object]
                  ) -> list[tuple[list[float], list[dict[str, Any]], dict[str, Any]]]:  # pragma: no cover - per role
        """The rounds that pay one group: per round, its rewards and verdicts of ``entries`` and its summary."""
        raise NotImplementedError


def groups(rounds: Sequence[int], size: int) -> Iterable[tuple[int, int]]:
    """``(start, round)`` of each block of ``size`` consecutive completions (TRL keeps a prompt's generations
    together); every block must belong to one round."""
    if len(rounds) % size:
        raise ValueError(f"{len(rounds)} completions are not whole groups of {size}")
    for start in range(0, len(rounds), size):
        block = set(rounds[start:start + size])
        if len(block) != 1:
            raise ValueError(f"completions {start}..{start + size - 1} mix rounds {sorted(block)}: a group is one "
                             "prompt's num_generations completions")
        yield start, rounds[start]


class StudentRounds(GameRounds):
    """Students trained by TRL on the tasks of ``teachers`` (policies or factories, one per round in turn)."""

    reward_name = "populora_student"

    others_role = "teacher"

    def fixed_settings(self) -> dict[str, Any]:
        return {"num_teachers": 1, "num_students": 1, "tasks_per_teacher": 1,
                "samples_per_task": self.num_generations, "student_fill": False}

    def bind(self, env: PopuLoRAParallelEnv) -> None:
        self._policies = [make_policy(t, env) for t in self.others]

    def open_round(self, env: PopuLoRAParallelEnv, k: int, obs: dict, infos: dict):
        """The teachers take turns proposing; the student's prompt is the valid task's, if any."""
        proposal = tuple(self._policies[k % len(self._policies)].act(obs["teacher_0"], infos["teacher_0"]))
        obs, _r, _te, _tr, infos = env.step({"teacher_0": proposal})
        if not obs["student_0"]["prompts"]:
            return None
        return proposal, obs["student_0"]["prompts"][0], infos["student_0"]["requests"][0]

    def pay_group(self, record: Round, entries: Sequence[object]):
        """One round: the teacher's proposal replayed (the same task: checked), then the group's attempts."""
        self.replay(record)
        obs, *_rest, infos = self.replay_env.step({"teacher_0": record.proposal})
        if tuple(obs["student_0"]["prompts"][:1]) != (record.observation,):
            raise RuntimeError("a round did not replay to the same task: the env is not deterministic here")
        *_done, infos = self.replay_env.step({"student_0": tuple(entries)})
        student = infos["student_0"]
        return [(student["completion_rewards"], student["completion_info"], student["round"])]


class TeacherRounds(GameRounds):
    """Teachers trained by TRL against frozen ``students`` (policies or factories, matched by the env's PFSP)."""

    reward_name = "populora_teacher"

    others_role = "student"

    def __init__(self, students: Sequence[Policy], **kwargs: Any) -> None:
        super().__init__(students, **kwargs)
        self.student_policies = {f"student_{i}": make_policy(s, self.replay_env) for i, s in enumerate(self.others)}

    def fixed_settings(self) -> dict[str, Any]:
        return {"num_teachers": 1, "num_students": len(self.others), "tasks_per_teacher": 1}

    def open_round(self, env: PopuLoRAParallelEnv, k: int, obs: dict, infos: dict):
        """The teacher's proposer prompt (the env's state moves on by rounds nobody plays)."""
        return (), obs["teacher_0"]["prompts"][0], infos["teacher_0"]["requests"][0]

    def pay_group(self, record: Round, entries: Sequence[object]):
        """One round per completion, each from the same state and seed."""
        return [self.pay_one(record, entry) for entry in entries]

    def pay_one(self, record: Round, entry: object) -> tuple[list[float], list[dict[str, Any]], dict[str, Any]]:
        """One proposal's round: validated, attempted by the matched frozen student, paid by the scheme."""
        obs, infos = self.replay(record)
        if tuple(obs["teacher_0"]["prompts"][:1]) != (record.observation,):
            raise RuntimeError("a round did not replay to the same proposer prompt: the env is not deterministic here")
        obs, *_rest, infos = self.replay_env.step({"teacher_0": (entry,)})
        actions = {a: tuple(p.act(obs[a], infos[a])) for a, p in self.student_policies.items() if obs[a]["prompts"]}
        *_done, infos = self.replay_env.step(actions)
        teacher = infos["teacher_0"]
        return teacher["completion_rewards"][:1], teacher["completion_info"][:1], teacher["round"]


class BufferTeacher:
    """A teacher that proposes the tasks of a saved task buffer (a run's ``env_state.json``), in order.

    Deduction and abduction requests get a saved task of their type (program and input), induction requests the
    inputs and message of a saved induction task whose program is the one the env drew, else nothing (an invalid
    proposal: the env draws induction programs from its own buffers). The env validates every proposal again.
    """

    def __init__(self, buffers: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        self.tasks = {t: list(items) for t, items in buffers.items()}
        self._next = dict.fromkeys(self.tasks, 0)

    @classmethod
    def from_env_state(cls, path: str | Path) -> BufferTeacher:
        """From an ``env_state.json`` (a run's checkpoint) or an env ``state_dict()`` saved as JSON."""
        from selfplay.rundir import read_json

        state = read_json(path)
        if not isinstance(state, dict) or not isinstance(state.get("buffers"), dict):
            raise ValueError(f"{path}: not an env state (no 'buffers' object)")
        return cls(state["buffers"])

    def _take(self, task_type: str, match: Callable[[Mapping[str, Any]], bool] = lambda t: True):
        items = self.tasks.get(task_type, [])
        for _ in range(len(items)):
            task = items[self._next[task_type] % len(items)]
            self._next[task_type] += 1
            if match(task):
                return task
        return None

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        """One proposal per request: a saved task of the requested type, written as a model would write it."""
        from populora_env.policies import continue_prefix

        out = []
        for request in info.get("requests", []):
            kind, prefix = str(request.get("task_type")), str(request.get("prefix", ""))
            if kind == "induction":
                drawn = request.get("program")
                task = self._take(kind, lambda t, drawn=drawn: t.get("program") == drawn)
                blocks = [] if task is None else [f"```input\n{i}\n```" for i in task.get("inputs", [])]
                blocks += [] if task is None else [f"```message\n{task.get('message', '')}\n```"]
                out.append(continue_prefix(prefix, "\n".join(blocks)) if blocks else "")
                continue
            task = self._take(kind)
            if task is None:
                out.append("")
                continue
            program, given = f"```python\n{task['program'].rstrip()}\n```", f"```input\n{task['inputs'][0]}\n```"
            out.append(continue_prefix(prefix, (program + "\n" + given, given + "\n" + program)))
        return tuple(out)
