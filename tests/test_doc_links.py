"""Every relative link of the user-facing pages leads somewhere: the file or folder exists,
and an anchor (``page.md#section``) names a heading of that page as GitHub spells it
(lowercased, punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a repeated heading
numbered ``-1``, ``-2``). A section renamed or moved on one page then fails here instead
of leaving dead links on the others."""
import os
import re
from typing import List, Set

import pytest

from conftest import REPO, USER_PAGES

PAGES = USER_PAGES
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> Set[str]:
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.S | re.M)
    seen, out = {}, set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def test_slug_follows_github():
    assert slug("Two fairseq `--amp` bugs (fixed by the plugin)") == "two-fairseq---amp-bugs-fixed-by-the-plugin"
    assert slug("When `--dss-passes P` is safe") == "when---dss-passes-p-is-safe"
    assert slug("Tables 3.1-3.2 under the thesis's protocol") == "tables-31-32-under-the-thesiss-protocol"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    broken: List[str] = []
    for target in LINK.findall(prose(open(os.path.join(REPO, page), encoding="utf-8").read())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path else os.path.join(REPO, page)
        if not os.path.exists(full):
            broken.append(f"{target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page}: " + "; ".join(broken)


def evidence_table(page: str) -> List[str]:
    text = open(os.path.join(REPO, page), encoding="utf-8").read()
    section = text.split("## Evidence at a glance", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_readme_and_index_show_one_evidence_table():
    """The README's evidence table is docs/index.md's, row for row: one edit, not two that drift."""
    rows = evidence_table("docs/index.md")
    assert len(rows) >= 2 + 10  # header, rule, a row per method
    assert evidence_table("README.md") == rows
