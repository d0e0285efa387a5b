"""Every relative link in README.md and docs/ leads to a file or folder inside the repository:
the docs travel with the code (a clone, a release archive), so they may not point past it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
# [text](target "title") and reference definitions `[id]: target`; code spans are no links
INLINE = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
# a code span that climbs out of the page's folder (`../x/y.md`) is read as a link too
# (`./staging/...` in prose about another repository is not)
PATH_SPAN = re.compile(r"`(\.\./[\w./-]+)`")


def relative_links(page: Path) -> list[str]:
    raw = page.read_text()
    text = CODE.sub("", raw)
    targets = INLINE.findall(text) + REFERENCE.findall(text) + PATH_SPAN.findall(raw)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def test_the_pages_have_links_to_check() -> None:
    assert len(PAGES) >= 5
    assert "docs/architecture.md" in relative_links(REPO / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    for target in relative_links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(REPO), f"{target} leaves the repository"
        assert path.exists(), f"{target} does not exist"


def test_a_link_past_the_repository_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [arch](../shared/ARCHITECTURE.md), [web](https://example.org), `[x](y)`,\n"
        "[top](#top), `../notes.md` and\n\n[ref]: ./other.md\n"
    )
    assert relative_links(page) == ["../shared/ARCHITECTURE.md", "./other.md", "../notes.md"]
