"""Test plugin (``--plugins tests/selfplay/builder_plugin.py``): adds an option to the run's builder, as a
developer's edit of :func:`selfplay.members.build_members` would, and nothing else.

Every generator and trainer the builder makes gets the attribute ``builder_option``, read from the run
configuration (``{"seed": cfg.seed, "batch_size": cfg.generation.batch_size}``), and each call is recorded as
one line of ``<cfg.run_dir>/builder_option.jsonl`` (process id, members, the parts built and the option they
got). Plugins are imported by the command and by every Ray actor before it builds its parts, so the file shows
which processes built what through the builder. The parts themselves are unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import selfplay.members

RECORD = "builder_option.jsonl"


def _with_option(build):
    def build_members(cfg, members, **kwargs):
        parts = build(cfg, members, **kwargs)
        option = {"seed": cfg.seed, "batch_size": cfg.generation.batch_size}
        built = {}
        for name in ("generator", "trainer"):
            part = getattr(parts, name)
            if part is not None:
                part.builder_option = option
                built[name] = part.builder_option
        if cfg.run_dir is not None:
            line = {"pid": os.getpid(), "members": list(members), "parts": built}
            with open(Path(cfg.run_dir) / RECORD, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        return parts

    build_members.with_option = True
    return build_members


if not getattr(selfplay.members.build_members, "with_option", False):
    selfplay.members.build_members = _with_option(selfplay.members.build_members)
