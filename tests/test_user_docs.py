"""The user docs speak to a user: no internal issue numbers or session history, and the README stays a
front door (short, linking guides that exist). docs/results.md is a lab record (its sections are
dated runs) and is left out of the history check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "models" / "README.md",
             *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")]
HISTORY = re.compile(r"\bissue[- ]?\d+|\b(this|last|previous) round\b|\bround's\b", re.I)


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_name_no_issue_numbers_or_session_history(doc):
    found = HISTORY.search(doc.read_text())
    assert not found, f"{doc.relative_to(ROOT)}: {found.group(0)!r}"


def test_the_readme_is_short_and_its_links_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


@pytest.mark.parametrize("guide", sorted((ROOT / "docs").glob("guide-*.md")) + [ROOT / "docs" / "reproduce.md"],
                         ids=lambda p: p.name)
def test_guides_link_only_to_files_that_exist(guide):
    for target in re.findall(r"\]\(([^)#\s]+)\)", guide.read_text()):
        if "://" not in target:
            assert (guide.parent / target).exists(), target
