"""Reward-hacking telemetry of a run: which completions of a step tripped a sandbox defence, counted for
TensorBoard, and the first few of each member saved to ``tamper_samples.jsonl``.

The env decides tampering, not this module: the sandbox's harness names the defence a job tripped, and the
round's records carry its class (``ProposalResult.tamper``, ``AttemptResult.tamper``, reason ``"tamper"``).
:func:`tampering` lists those records of a step in the round's order (proposals, then attempts); the logger
counts them per member (``tamper/<member>``) and per role and class (``tamper/<role>/<class>``), and
:class:`TamperSampler` appends the first ``tamper_samples`` of each member, with their step and class, one JSON
object per line. The model's text is a JSON string in that file: nothing imports or runs it, and its readers
(``populora report``, resume) read it through :meth:`selfplay.rundir.RunDir.tamper_samples`, trusting nothing
but its shape.

Resume: a step's lines are appended (flushed and fsynced) before the step's checkpoint; a resumed run first drops
the lines of the steps after its checkpoint (:func:`selfplay.resume.truncate_tamper_samples`) and then counts
each member's saved samples from the file, so the replayed steps write the same lines again and a run stopped or
killed anywhere, then resumed, leaves the file the uninterrupted run leaves.

Nothing here draws a random number or changes a record: a run's values are the same with or without it.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from selfplay.loop import StepRecord
from selfplay.rundir import MAX_TAMPER_BYTES, TAMPER_SAMPLES, RunDir, open_append

log = logging.getLogger(__name__)

MAX_TAMPER_TEXT = 20_000
"""Characters of a completion's text kept in a sample (a longer one is cut there, ``"truncated": true``)."""


@dataclass(frozen=True)
class Tampering:
    """One completion of a step whose run tripped a sandbox defence.

    Attributes:
        agent: the env agent that wrote it; ``index``: its position among the agent's completions of its phase.
        member: the adapter acting for the agent; ``role``: the agent's role (``teacher``/``student``).
        task_type, task_id: the task proposed or attempted.
        cls: the defence's class, as the env recorded it (``introspection``, ``signal``, ...).
    """

    agent: str
    index: int
    member: str
    role: str
    task_type: str
    task_id: str
    cls: str


def tampering(record: StepRecord) -> list[Tampering]:
    """The step's completions marked as tampering (a record whose ``tamper`` is set), proposals first, each list
    in the round's order."""
    results, mapping = record.outcome.results, record.mapping
    out = []
    for r in (*results.proposals, *results.attempts):
        if r.tamper is not None:
            out.append(Tampering(r.agent, r.index, mapping.agent_to_member.get(r.agent, r.agent),
                                 mapping.agent_roles.get(r.agent, "?"), r.task_type, r.task_id, str(r.tamper)))
    return out


class TamperSampler:
    """Appends the first ``limit`` tampering completions of each member to ``run_dir/tamper_samples.jsonl``.

    Args:
        run_dir: the run directory (its ``config.json`` written; on resume, the samples after the checkpoint
            already dropped): the members' saved counts are read back from the file.
        limit: samples kept per member (``tamper_samples`` in the run config; 0 writes nothing).
    """

    def __init__(self, run_dir: str | os.PathLike[str], limit: int):
        self.path = Path(run_dir) / TAMPER_SAMPLES
        self.limit = limit
        samples = RunDir(run_dir).tamper_samples() if limit else []
        self.saved: Counter[str] = Counter(rec["member"] for rec in samples)
        self.size = self.path.stat().st_size if limit and self.path.is_file() else 0
        """The file's bytes: a line that would take it past :data:`~selfplay.rundir.MAX_TAMPER_BYTES` (what its
        readers read) is not written. What is written depends on the file's content only (counts and size), so a
        resumed run decides as the uninterrupted one did."""

    def lines(self, record: StepRecord) -> list[str]:
        """The JSON lines ``record``'s step adds (counting them as saved), newline included: each member's
        tampering completions in the round's order, while the member has fewer than ``limit`` saved and the file
        stays within :data:`~selfplay.rundir.MAX_TAMPER_BYTES`; each line an object with the fields of
        :data:`selfplay.rundir.TAMPER_SAMPLE_FIELDS`, ASCII only (``json.dumps`` escapes the rest)."""
        out = []
        for t in tampering(record):
            if self.saved[t.member] >= self.limit:
                continue
            completion = record.completions.get((t.agent, t.index))
            text = completion.text if completion is not None and isinstance(completion.text, str) else ""
            sample = {"step": record.step, "member": t.member, "agent": t.agent, "role": t.role, "index": t.index,
                      "task_type": t.task_type, "task_id": t.task_id, "class": t.cls,
                      "text": text[:MAX_TAMPER_TEXT], "truncated": len(text) > MAX_TAMPER_TEXT}
            line = json.dumps(sample, sort_keys=True) + "\n"
            if self.size + len(line) > MAX_TAMPER_BYTES:  # ASCII: len is the byte count
                log.warning("%s: full (%d bytes); sample of %s at step %d not saved", TAMPER_SAMPLES, self.size,
                            t.member, record.step)
                continue
            self.saved[t.member] += 1
            self.size += len(line)
            out.append(line)
        return out

    def write(self, record: StepRecord) -> int:
        """Append ``record``'s lines (:meth:`lines`), flushed and fsynced, never through a symbolic link; returns
        how many were written."""
        lines = self.lines(record)
        if lines:
            with open_append(self.path) as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
        return len(lines)


__all__ = ["MAX_TAMPER_TEXT", "TamperSampler", "Tampering", "tampering"]
