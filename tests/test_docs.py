"""The repository is self-contained: code cites only the in-repo docs, and every cited section exists.

* No Python file cites a document outside the repository (the former design notes, method notes, or the
  ``../shared`` data directory).
* Every ``docs/<page>.md §N`` citation names an existing page with a heading that carries ``§N``, and every
  ``docs/<page>.md "Title"`` citation names an existing heading.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_DIRS = {"build", "dist", "runs", "__pycache__", "node_modules"}  # and every directory starting with "."

OUTSIDE = re.compile(
    r"DESIGN\.md|populora-method|\bnotes/\w+\.md|\.\./shared|shared/evaldata|(?<!docs/)\b(?:azr|anchors)\.md"
)
SECTION_CITE = re.compile(r"docs/(?P<page>[\w-]+)\.md(?P<refs>(?:[\s,/–-]*(?:and\s+)?§\d+(?:\.\d+)*)+)")
TITLE_CITE = re.compile(r"docs/(?P<page>[\w-]+)\.md,?\s+\"(?P<title>[^\"]+)\"")
ANY_CITE = re.compile(r"docs/(?P<page>[\w-]+)\.md")


def _python_files() -> list[Path]:
    """The project's Python files: hidden directories (virtual environments, caches, .git) are never entered."""
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in SKIP_DIRS and "site-packages" != d]
        found += [Path(directory) / f for f in files if f.endswith(".py")]
    this = Path(__file__).resolve()
    return sorted(p for p in found if p.resolve() != this)


def _headings(page: str) -> list[str]:
    return [line.lstrip("#").strip() for line in (DOCS / f"{page}.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("#")]


def _sections(page: str) -> set[str]:
    found = set()
    for heading in _headings(page):
        m = re.match(r"§(\d+(?:\.\d+)*)\b", heading)
        if m:
            found.add(m.group(1))
    return found


def test_docs_pages_exist() -> None:
    for page in ("index", "design", "method", "azr", "anchors"):
        assert (DOCS / f"{page}.md").is_file(), f"docs/{page}.md is missing"


def test_no_citation_outside_the_repository() -> None:
    bad = []
    for path in _python_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "citations of documents outside the repository:\n" + "\n".join(bad)


def test_cited_sections_exist() -> None:
    bad = []
    for path in _python_files():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for m in ANY_CITE.finditer(text):
            if not (DOCS / f"{m['page']}.md").is_file():
                bad.append(f"{where}: docs/{m['page']}.md does not exist")
        for m in SECTION_CITE.finditer(text):
            if not (DOCS / f"{m['page']}.md").is_file():
                continue
            have = _sections(m["page"])
            for ref in re.findall(r"§(\d+(?:\.\d+)*)", m["refs"]):
                if ref not in have:
                    bad.append(f"{where}: docs/{m['page']}.md has no heading §{ref}")
        for m in TITLE_CITE.finditer(text):
            if not (DOCS / f"{m['page']}.md").is_file():
                continue
            if not any(m["title"].lower() in h.lower() for h in _headings(m["page"])):
                bad.append(f'{where}: docs/{m["page"]}.md has no heading "{m["title"]}"')
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", ["method", "azr", "anchors"])
def test_section_numbers_are_unique(page: str) -> None:
    numbers = [re.match(r"§(\d+(?:\.\d+)*)", h).group(1) for h in _headings(page) if h.startswith("§")]
    assert numbers and len(numbers) == len(set(numbers)), f"docs/{page}.md: duplicate section numbers"
