"""The documentation stands alone: relative links resolve, and nothing cites a file the repository lacks.

Read from the Markdown (README, BENCHMARKS, docs/, bench/README): each ``[text](target)`` that is not a
URL or a bare ``#anchor`` must name a file or folder of the checkout, relative to the page. Pages once
cited a ``SPEC.md`` that was never in the repository; such a name fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: Documents of the workplace the project came from, never part of the repository.
NOT_IN_THE_REPOSITORY = ("SPEC.md", "ENVIRONMENT.md", "STYLE.md")


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` that name nothing in the checkout."""
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_a_document_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert [name for name in NOT_IN_THE_REPOSITORY if name in text] == []


def test_the_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a) [web](https://example.com) [anchor](#x) [gone](missing.md)\n")
    assert broken_links(page) == ["missing.md"]
