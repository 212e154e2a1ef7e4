"""Rollouts and completions as numpy arrays for the trip between the driver and the actors.

Ray serialises numpy arrays without copying them into Python objects (pickle protocol 5, out-of-band buffers),
while a list of thousands of small Python ints costs a Python object each on both sides; big batches of
Python lists through the driver are what blew up the controllers of other RL frameworks. Token ids travel as
one concatenated ``int64`` array plus lengths, log-probs and rewards as ``float64`` (the values of the Python
floats, exactly), and the few distinct grouping keys / metadata / extras as a small table referenced by index.

``unpack_*(pack_*(x)) == x`` field by field (tested), so the trainer sees exactly the batch the local backend
would give it.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.generation.base import Completion
from agents.rollout import Rollout

__all__ = ["pack_completions", "pack_rollouts", "unpack_completions", "unpack_rollouts"]


class _Table:
    """Distinct objects (compared by their pickled bytes) and the index of each given object."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[bytes, int] = {}

    def add(self, obj: Any) -> int:
        key = pickle.dumps(obj, protocol=5)
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(obj)
        return self._index[key]


def _concat(seqs: Sequence[Sequence], dtype) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter((x for s in seqs for x in s), dtype=dtype, count=int(lens.sum()))
    return flat, lens


def _split(flat: np.ndarray, lens: np.ndarray) -> list[list]:
    ends = np.cumsum(lens)
    return [flat[e - n:e].tolist() for e, n in zip(ends.tolist(), lens.tolist(), strict=True)]


def pack_rollouts(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """One member's rollouts as arrays (see the module docstring)."""
    table = _Table()
    prompts, prompt_lens = _concat([r.prompt_ids for r in rollouts], np.int64)
    comps, comp_lens = _concat([r.completion_ids for r in rollouts], np.int64)
    has_lp = np.array([r.logprobs is not None for r in rollouts], dtype=bool)
    lps, lp_lens = _concat([r.logprobs for r in rollouts if r.logprobs is not None], np.float64)
    return {
        "prompts": prompts, "prompt_lens": prompt_lens, "completions": comps, "completion_lens": comp_lens,
        "rewards": np.array([float(r.reward) for r in rollouts], dtype=np.float64),
        "has_logprobs": has_lp, "logprobs": lps, "logprob_lens": lp_lens,
        "keys": np.array([[table.add(r.group), table.add(r.scope), table.add(r.meta)] for r in rollouts],
                         dtype=np.int64).reshape(len(rollouts), 3),
        "versions": _versions(rollouts),
        "table": table.items,
    }


def _versions(items: Sequence[Rollout] | Sequence[Completion]) -> np.ndarray:
    """Each item's adapter version, ``-1`` for ``None``."""
    return np.array([-1 if x.version is None else int(x.version) for x in items], dtype=np.int64)


def _version(versions: np.ndarray | None, i: int) -> int | None:
    v = -1 if versions is None else int(versions[i])
    return None if v < 0 else v


def unpack_rollouts(p: dict[str, Any]) -> list[Rollout]:
    """The rollouts :func:`pack_rollouts` packed."""
    prompts = _split(p["prompts"], p["prompt_lens"])
    comps = _split(p["completions"], p["completion_lens"])
    lps = iter(_split(p["logprobs"], p["logprob_lens"]))
    table = p["table"]
    out = []
    for i, (g, s, m) in enumerate(p["keys"].tolist()):
        meta = table[m]
        out.append(Rollout(prompts[i], comps[i], float(p["rewards"][i]), group=table[g], scope=table[s],
                           logprobs=next(lps) if p["has_logprobs"][i] else None,
                           meta=dict(meta) if isinstance(meta, dict) else meta, version=_version(p.get("versions"), i)))
    return out


def pack_completions(completions: Sequence[Completion], rows: Sequence[int] | None = None) -> dict[str, Any]:
    """Completions as arrays; ``rows`` (optional) carries each completion's row number in the caller's plan."""
    table = _Table()
    prompts, prompt_lens = _concat([c.prompt_token_ids for c in completions], np.int64)
    tokens, token_lens = _concat([c.token_ids for c in completions], np.int64)
    lps, lp_lens = _concat([c.logprobs for c in completions], np.float64)
    return {
        "index": np.array([[c.request_index, c.sample_index] for c in completions], dtype=np.int64).reshape(-1, 2),
        "rows": None if rows is None else np.asarray(rows, dtype=np.int64),
        "text": [c.text for c in completions],
        "prompts": prompts, "prompt_lens": prompt_lens, "tokens": tokens, "token_lens": token_lens,
        "logprobs": lps, "logprob_lens": lp_lens,
        "keys": np.array([[table.add(c.adapter), table.add(c.finish_reason), table.add(c.extra)]
                          for c in completions], dtype=np.int64).reshape(-1, 3),
        "versions": _versions(completions),
        "table": table.items,
    }


def unpack_completions(p: dict[str, Any]) -> list[Completion]:
    """The completions :func:`pack_completions` packed."""
    prompts = _split(p["prompts"], p["prompt_lens"])
    tokens = _split(p["tokens"], p["token_lens"])
    lps = _split(p["logprobs"], p["logprob_lens"])
    table = p["table"]
    out = []
    for i, ((req, sample), (a, f, e)) in enumerate(zip(p["index"].tolist(), p["keys"].tolist(), strict=True)):
        extra = table[e]
        out.append(Completion(request_index=req, sample_index=sample, adapter=table[a], text=p["text"][i],
                              prompt_token_ids=prompts[i], token_ids=tokens[i], logprobs=lps[i],
                              finish_reason=table[f], extra=dict(extra) if isinstance(extra, dict) else extra,
                              version=_version(p.get("versions"), i)))
    return out
