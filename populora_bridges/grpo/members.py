"""Frozen members of a run directory as policies of the game: the teachers a TRL student trains against, or the
students a TRL teacher is paid by (docs/trl.md).

:class:`RunMembers` reads the run's ``config.json`` through :class:`selfplay.rundir.RunDir`, builds the run's
base model and generator with :func:`selfplay.members.build_members` (the run's own builder: model, rank, alpha,
target modules, engine), and loads each member's saved adapter: the final ``adapters/<member>/`` or, with
``checkpoint``, ``checkpoints/step_<n>/population/<member>/``. :meth:`RunMembers.policy` is one member acting as
an agent: it answers an agent's prompts with the generator, the way the run generated them (the request's chat
template, response prefix and stop strings; the run's token budget per phase and sampling temperature), with
sampling seeds derived from ``(seed, call, agent, index)`` so the same calls give the same text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents.generation import GenerationRequest
from selfplay.config import TrainConfig, from_dict
from selfplay.loop import derive_seed
from selfplay.members import build_members
from selfplay.rundir import RunDir


class RunMembers:
    """The members ``members`` (default: all) of the run at ``run_dir``, frozen, on one generator.

    Raises:
        selfplay.rundir.RunDirError: the directory is no run, or a member has no saved adapter there.
    """

    def __init__(self, run_dir: str | Path, members: Sequence[str] | None = None, *, checkpoint: int | None = None,
                 seed: int = 0) -> None:
        from selfplay.rundir import RunDirError

        run = RunDir(run_dir)
        self.config: TrainConfig = from_dict(TrainConfig, dict(run.train_config()))
        saved = self._saved(run, checkpoint)
        chosen = list(members) if members is not None else sorted(saved)
        missing = [m for m in chosen if m not in saved]
        if missing or not chosen:
            raise RunDirError(f"{run.path}: no saved adapter for {missing or 'any member'} (saved: {sorted(saved)})")
        self.parts = build_members(self.config, chosen, generator=True)
        for name in chosen:
            self.parts.population.load(saved[name], name)
        self.parts.generator.refresh(chosen)
        self.members, self.seed, self._calls = chosen, seed, 0

    @staticmethod
    def _saved(run: RunDir, checkpoint: int | None) -> dict[str, Path]:
        if checkpoint is None:
            return run.adapters()
        steps = dict(run.checkpoints())
        if checkpoint not in steps:
            from selfplay.rundir import RunDirError

            raise RunDirError(f"{run.path}: no complete checkpoint at step {checkpoint} (have {sorted(steps)})")
        population = steps[checkpoint] / "population"
        return {d.name: d for d in sorted(population.iterdir()) if (d / "adapter_config.json").is_file()}

    def policy(self, member: str) -> MemberPolicy:
        """``member`` acting as one agent of the game (``act(observation, info)``)."""
        if member not in self.members:
            raise ValueError(f"unknown member {member!r}; loaded: {', '.join(self.members)}")
        return MemberPolicy(self, member)

    def generate(self, member: str, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        """``member``'s completions of an agent's prompts (one per prompt, in order)."""
        prompts = list(observation.get("prompts", ()))
        if not prompts:
            return ()
        g, requests = self.config.generation, list(info.get("requests", []))
        budget = g.teacher_max_new_tokens if info.get("phase") == "propose" else g.student_max_new_tokens
        self._calls += 1
        batch = []
        for k, prompt in enumerate(prompts):
            request = requests[k] if k < len(requests) else {}
            batch.append(GenerationRequest(
                adapter=member, prompt=prompt, max_new_tokens=budget, temperature=g.temperature, top_p=g.top_p,
                seed=derive_seed(self.seed, self._calls, member, k), chat=bool(request.get("chat_template", True)),
                prefix=str(request.get("prefix", "")), stop=tuple(request.get("stop", ()))))
        done = sorted(self.parts.generator.generate(batch), key=lambda c: (c.request_index, c.sample_index))
        return tuple(c.text for c in done)


class MemberPolicy:
    """One frozen run member playing one agent: ``act(observation, info)`` generates its completions."""

    def __init__(self, members: RunMembers, member: str) -> None:
        self.members, self.member = members, member

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[str, ...]:
        """One completion per prompt of ``observation``."""
        return self.members.generate(self.member, observation, info)
