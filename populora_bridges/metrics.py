"""The game's metrics of a finished round, flattened for a trainer's scalar logs (TRL's ``log_metric``).

:func:`round_metrics` reads the env's round summary (``infos[a]["round"]``, :func:`populora_env.metrics.round_summary`)
and returns what the project's own trainer logs and TRL does not:

- ``game/proposals/valid_rate`` = valid / total proposals, and ``game/proposals/reason/<code>`` = the fraction
  of proposals rejected with each reason code (every code of ``populora_env.Reason``, 0 when absent, so that an
  average over rounds is an average over all of them);
- ``game/attempts/correct_rate``, ``game/attempts/format_error_rate`` and ``game/attempts/reason/<code>``, the
  same for the students' attempts;
- ``game/pair/p_hat``: the mean p̂ over the round's pairs that had a valid task (p̂ = the matched student's solve
  rate over the teacher's valid tasks), and ``game/pair/outcome/<winner>``: the fraction of pairs won by
  ``student``, ``teacher`` or ``draw``;
- ``game/mean_reward/<role>``: the round's mean reward per role under the env's reward scheme.

A rate whose denominator is zero is left out (a round without attempts logs no attempt rate, never a 0). TRL averages each name over a logging step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from populora_env import Reason

PREFIX = "game"
REASONS = tuple(r.value for r in Reason)


def _rates(counts: Mapping[str, Any], kind: str, hit: str) -> dict[str, float]:
    total = int(counts.get("total", 0))
    if total <= 0:
        return {}
    out = {f"{PREFIX}/{kind}/{hit}_rate": counts.get(hit, 0) / total}
    if kind == "attempts":
        out[f"{PREFIX}/attempts/format_error_rate"] = counts.get("format_errors", 0) / total
    reasons = {**dict.fromkeys(REASONS, 0), **counts.get("reasons", {})}
    out |= {f"{PREFIX}/{kind}/reason/{code}": n / total for code, n in sorted(reasons.items())}
    return out


def round_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The round's proposal and attempt rates by reason, its pairs' p̂ and outcomes, and its mean rewards."""
    out = _rates(summary.get("proposals", {}), "proposals", "valid")
    out |= _rates(summary.get("attempts", {}), "attempts", "correct")
    pairs = list(summary.get("pairs", []))
    p_hats = [p["p_hat"] for p in pairs if p.get("p_hat") is not None]
    if p_hats:
        out[f"{PREFIX}/pair/p_hat"] = sum(p_hats) / len(p_hats)
    for winner in ("student", "teacher", "draw"):
        if pairs:
            out[f"{PREFIX}/pair/outcome/{winner}"] = sum(p.get("outcome") == winner for p in pairs) / len(pairs)
    out |= {f"{PREFIX}/mean_reward/{role}": float(v) for role, v in sorted(summary.get("mean_reward", {}).items())}
    return out
