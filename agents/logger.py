"""TensorBoard logging of a training step (CleanRL/TRL-style tag names).

Tags (``global_step`` = training step), read back by :mod:`agents.report`:

- ``charts/``: ``student_solve_rate``, ``teacher_reward``, ``student_reward``, ``valid_rate``,
  ``valid_rate/<task_type>``, ``response_length/<role>``, ``entropy/<role>``, ``frac_reward_zero_std``,
  ``step_seconds``
- ``population/<agent>/``: ``mu``, ``sigma``, ``conservative`` (μ − 3σ), ``reward``, ``response_length``;
  ``population/<member>/``: ``loss``, ``entropy``, ``grad_norm``
- ``losses/``: ``policy_loss``, ``grad_norm``, ``clip_frac``, ``entropy`` (means over updated members)
- ``programs/``: ``ast_depth``, ``cyclomatic``, ``loc``, ``variables``, ``coverage_programs``,
  ``coverage_signatures``
- ``validity/<reason>``: proposals with that outcome this step (``validity/valid`` for valid ones)
- ``time/``: ``generation``, ``sandbox``, ``update``, ``evolution``, ``checkpoint``
- ``evolution/replacements``
- text: ``samples/teacher``, ``samples/student`` (prompt + completion + reward), ``hyperparameters``
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter


def _mean(xs: list[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(xs)) if xs else None


def hparams_markdown(cfg_dict: Mapping[str, Any]) -> str:
    """A ``|param|value|`` markdown table of a (flattened) config."""

    def flat(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
        out = []
        for k, v in d.items():
            if isinstance(v, Mapping):
                out += flat(v, prefix + k + ".")
            else:
                out.append((prefix + k, v))
        return out

    rows = "\n".join(f"|{k}|{v}|" for k, v in flat(cfg_dict))
    return "|param|value|\n|-|-|\n" + rows


def step_scalars(stats: Mapping[str, Any]) -> dict[str, float]:
    """Flatten one step's statistics (from :meth:`SelfPlayLoop.train_step`) into scalar tags."""
    out: dict[str, float] = {}
    infos = stats.get("infos", {})
    rnd = stats.get("round", {}) or {}
    role_len: dict[str, list[float]] = defaultdict(list)
    role_rew: dict[str, list[float]] = defaultdict(list)
    for agent, a in stats.get("agents", {}).items():
        role = agent.split("_", 1)[0]
        role_len[role].append(a["response_length"])
        role_rew[role].append(a["reward"])
        out[f"population/{agent}/reward"] = a["reward"]
        out[f"population/{agent}/response_length"] = a["response_length"]
    for role, v in role_len.items():
        out[f"charts/response_length/{role}"] = float(np.mean(v))
    if role_rew.get("teacher"):
        out["charts/teacher_reward"] = float(np.mean(role_rew["teacher"]))
    if role_rew.get("student"):
        out["charts/student_reward"] = float(np.mean(role_rew["student"]))

    # solve rate / validity from the per-completion infos
    correct, attempts = 0, 0
    valid_by_type: dict[str, list[int]] = defaultdict(list)
    reasons: dict[str, int] = defaultdict(int)
    for agent, info in infos.items():
        for ci in info.get("completion_info", []) or []:
            if agent.startswith("student"):
                attempts += 1
                correct += int(bool(ci.get("correct")))
            else:
                ok = bool(ci.get("valid"))
                valid_by_type[str(ci.get("task_type", "any"))].append(int(ok))
                reasons["valid" if ok else str(ci.get("reason", "invalid"))] += 1
    if attempts:
        out["charts/student_solve_rate"] = correct / attempts
    allv = [v for vs in valid_by_type.values() for v in vs]
    if allv:
        out["charts/valid_rate"] = float(np.mean(allv))
        for t, vs in valid_by_type.items():
            out[f"charts/valid_rate/{t}"] = float(np.mean(vs))
    for reason, n in reasons.items():
        out[f"validity/{reason}"] = float(n)

    for agent, r in (rnd.get("ratings") or {}).items():
        mu, sigma = (r["mu"], r["sigma"]) if isinstance(r, Mapping) else (r[0], r[1])
        out[f"population/{agent}/mu"] = float(mu)
        out[f"population/{agent}/sigma"] = float(sigma)
        out[f"population/{agent}/conservative"] = float(mu) - 3 * float(sigma)
    metrics = rnd.get("metrics") or {}
    if metrics.get("n_programs"):  # complexity means only over rounds that produced valid programs
        for key in ("ast_depth", "cyclomatic", "loc", "variables"):
            if metrics.get(f"{key}_mean") is not None:
                out[f"programs/{key}"] = float(metrics[f"{key}_mean"])
    for key in ("coverage_programs", "coverage_signatures"):
        if metrics.get(key) is not None:
            out[f"programs/{key}"] = float(metrics[key])

    members = stats.get("members", {})
    for m, mm in members.items():
        for k in ("loss", "entropy", "grad_norm"):
            if k in mm and mm[k] is not None:
                out[f"population/{m}/{k}"] = float(mm[k])
    agg = {"policy_loss": "loss", "grad_norm": "grad_norm", "clip_frac": "clip_frac", "entropy": "entropy"}
    for tag, key in agg.items():
        v = _mean([mm.get(key) for mm in members.values()])
        if v is not None:
            out[f"losses/{tag}"] = v
    v = _mean([mm.get("frac_reward_zero_std") for mm in members.values()])
    if v is not None:
        out["charts/frac_reward_zero_std"] = v
    member_roles = stats.get("member_roles", {})
    role_ent: dict[str, list[float]] = defaultdict(list)
    for m, mm in members.items():
        for role in member_roles.get(m, ()):
            if mm.get("entropy") is not None:
                role_ent[role].append(mm["entropy"])
    for role, v2 in role_ent.items():
        out[f"charts/entropy/{role}"] = float(np.mean(v2))
    for k, v in stats.get("time", {}).items():
        if k == "step":
            out["charts/step_seconds"] = float(v)
        else:
            out[f"time/{k}"] = float(v)
    out["evolution/replacements"] = float(len(stats.get("evolution", [])))
    return out


def samples_markdown(stats: Mapping[str, Any], role: str, limit: int) -> str | None:
    """A few prompt / completion / reward samples of one role as markdown."""
    phase = "propose" if role == "teacher" else "solve"
    infos_phase, out = stats.get("prompts", {}).get(phase, (None, None))
    if out is None:
        return None
    final = stats.get("infos", {})
    parts = []
    for agent, comps in out.completions.items():
        if not agent.startswith(role) or not comps:
            continue
        rewards = final.get(agent, {}).get("completion_rewards", [])
        for k, c in enumerate(comps[:limit]):
            r = rewards[k] if k < len(rewards) else None
            parts.append(f"**{agent}** reward={r}\n\n```\n{c.text[:2000]}\n```")
        if len(parts) >= limit:
            break
    return "\n\n".join(parts[:limit]) if parts else None


class TensorBoardLogger:
    """Writes each step's scalars and samples under the run directory."""

    def __init__(self, run_dir: str, purge_step: int | None = None):
        self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)

    def log_hparams(self, cfg_dict: Mapping[str, Any]) -> None:
        self.writer.add_text("hyperparameters", hparams_markdown(cfg_dict), 0)

    def log_step(self, step: int, stats: Mapping[str, Any], samples: int = 2) -> dict[str, float]:
        scalars = step_scalars(stats)
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        for role in ("teacher", "student"):
            md = samples_markdown(stats, role, samples) if samples else None
            if md:
                self.writer.add_text(f"samples/{role}", md, step)
        self.writer.flush()
        return scalars

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()
