"""docs/env.md's table of the env's settings is the one generated from ``EnvConfig`` (so it cannot drift), and
the generator sees every field with its docstring."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from populora_env.config import EnvConfig
from populora_env.settings_doc import MARKERS, field_docs, settings_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "env.md"


def test_the_docs_table_is_the_generated_one() -> None:
    text = PAGE.read_text(encoding="utf-8")
    table = text.split(MARKERS[0], 1)[1].split(MARKERS[1], 1)[0].strip("\n") + "\n"
    assert table == settings_table(), "docs/env.md is stale: .venv/bin/python -m populora_env.settings_doc docs/env.md"


def test_every_field_is_a_row_with_its_docstring() -> None:
    docs = field_docs(EnvConfig)
    names = [f.name for f in dataclasses.fields(EnvConfig)]
    assert set(docs) == set(names)  # every field documents itself
    rows = settings_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == names
    assert "| `samples_per_task` / `--env.samples-per-task` | `int` | `8` | Attempts each matched student" in \
        settings_table()


def test_field_docs_reads_the_docstring_under_each_field() -> None:
    @dataclasses.dataclass
    class Example:
        a: int = 1
        """The a."""
        b: str = "x"
        c: float = 0.5
        """The c,
        on two lines."""

    assert field_docs(Example) == {"a": "The a.", "c": "The c, on two lines."}
