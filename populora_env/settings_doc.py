"""The env's settings as one Markdown table, generated from :class:`~populora_env.config.EnvConfig` (its fields,
types, defaults and field docstrings), so the table in docs/env.md cannot drift from the code:
``tests/env/test_settings_doc.py`` compares them, and ``python -m populora_env.settings_doc docs/env.md`` writes
it between the page's ``env-settings`` markers.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from pathlib import Path

from populora_env.config import EnvConfig

__all__ = ["MARKERS", "field_docs", "settings_table", "write_table"]

MARKERS = ("<!-- env-settings:start -->", "<!-- env-settings:end -->")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body (the convention every config follows)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type(name: str) -> str:
    """The field's annotation as written (``tuple[str, ...]``, not the bare ``tuple`` of a resolved hint)."""
    for klass in EnvConfig.__mro__:
        ann = getattr(klass, "__annotations__", {}).get(name)
        if ann is not None:
            return ann if isinstance(ann, str) else str(getattr(ann, "__name__", ann)).replace("typing.", "")
    return "?"


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(value).items())
    return repr(value)


def settings_table() -> str:
    """``| setting | type | default | what it sets |``, one row per field of :class:`EnvConfig`, in order; the
    setting as ``parallel_env``'s keyword and as ``populora train``'s flag."""
    docs = field_docs(EnvConfig)
    rows = ["| setting (`parallel_env(...)` keyword / `populora train` flag) | type | default | what it sets |",
            "|---|---|---|---|"]
    for f in dataclasses.fields(EnvConfig):
        doc = docs.get(f.name, "").replace("|", "\\|")
        flag = "--env." + f.name.replace("_", "-") + (".FIELD" if dataclasses.is_dataclass(f.type) or f.name ==
                                                       "trueskill" else "")
        rows.append(f"| `{f.name}` / `{flag}` | `{_type(f.name).replace('|', '&#124;')}` | `{_default(f)}` | {doc} |")
    return "\n".join(rows) + "\n"


def write_table(page: Path) -> bool:
    """Replace the table between the :data:`MARKERS` of ``page`` with :func:`settings_table`; whether it changed."""
    text = page.read_text(encoding="utf-8")
    start, end = MARKERS
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{settings_table()}{end}{tail}"
    page.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {'updated' if write_table(Path(arg)) else 'up to date'}")
