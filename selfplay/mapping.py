"""Which adapter acts for which agent (like RLlib's policy mapping).

In a population every env agent is its own LoRA adapter; a baseline may map several agents to one adapter
(the single-agent AZR baseline maps ``teacher_0`` and ``student_0`` to ``azr``). The mapping is data: it is
saved in the run's ``config.json`` and read back on ``--resume``, so the run layer never needs to know which
arm it is running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AgentMapping:
    """Agents, their roles, and the member (adapter) acting for each.

    Attributes:
        agent_to_member: env agent -> member name.
        agent_roles: env agent -> ``"teacher"`` or ``"student"``.
    """

    agent_to_member: Mapping[str, str]
    agent_roles: Mapping[str, str]

    @classmethod
    def build(cls, teachers: Sequence[str], students: Sequence[str],
              assignment: Mapping[str, str] | None = None) -> AgentMapping:
        """The mapping of an env's ``teachers`` and ``students``; ``assignment`` (agent -> member) defaults to
        one adapter per agent, named like the agent. Every agent must be assigned."""
        agents = list(teachers) + list(students)
        chosen = dict(assignment) if assignment is not None else {a: a for a in agents}
        missing = [a for a in agents if a not in chosen]
        extra = sorted(set(chosen) - set(agents))
        if missing or extra:
            raise ValueError(f"agent mapping does not match the env's agents (missing: {missing}, unknown: {extra})")
        roles = {a: "teacher" for a in teachers} | {a: "student" for a in students}
        return cls({a: chosen[a] for a in agents}, roles)

    @property
    def members(self) -> list[str]:
        """Members in order of first appearance (teachers' first)."""
        return list(dict.fromkeys(self.agent_to_member.values()))

    @property
    def roles(self) -> dict[str, list[str]]:
        """Role -> members acting in it (evolution replaces members within a role)."""
        out: dict[str, list[str]] = {"teacher": [], "student": []}
        for agent, member in self.agent_to_member.items():
            bucket = out[self.agent_roles[agent]]
            if member not in bucket:
                bucket.append(member)
        return out

    def agents_of(self, member: str) -> list[str]:
        """The agents ``member`` acts for."""
        return [a for a, m in self.agent_to_member.items() if m == member]

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"agent_to_member": dict(self.agent_to_member), "agent_roles": dict(self.agent_roles)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, str]]) -> AgentMapping:
        return cls(dict(data["agent_to_member"]), dict(data["agent_roles"]))
