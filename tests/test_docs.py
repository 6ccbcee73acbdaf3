"""The README stays short and every link in the docs leads somewhere.

The README is the front door (install, the two commands, a first agent, run, view, export); the
rest lives on the pages under docs/, listed by docs/index.md. Other tests hold the pages' content
true (tests/test_layers.py: docs/layout.md; tests/test_public_api.py: imports and classes;
tests/test_package.py: the /metrics table).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]*`")


def links(markdown: str) -> list[str]:
    """The target of every Markdown link and image outside code."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return LINK.findall(prose)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or heading within it, does not exist."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_readme_is_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move some to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Its `part`: one\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#its-part-one) [ok](#title) ![gone](images/gone.png) [gone](other.md#nope)\n"
        "`[in code](missing.md)` [web](https://example.com/x.md)\n\n# Title\n"
        "```\n[in a block](missing.md)\n```\n"
    )
    assert broken_links(page) == ["images/gone.png: no such file", "other.md#nope: no such heading"]


def test_the_index_links_every_page_and_the_readme_links_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in links(index)}
    pages = {page.resolve() for page in DOCS.glob("*.md")} - {(DOCS / "index.md").resolve()}
    assert sorted(p.name for p in pages - linked) == []
    assert "docs/index.md" in links((ROOT / "README.md").read_text())


def python_block(markdown: str, heading: str) -> str:
    """The first Python code block after ``heading``."""
    section = markdown.split(f"\n{heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.slow  # the embedded model, as the README's snippet builds it
@pytest.mark.timeout(600)
def test_the_readmes_first_agent_runs_as_pasted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the embedded model, with the snippet's own tasks and settings: every rollout ends
    within its timeout and prints its outcome."""
    code = python_block((ROOT / "README.md").read_text(), "## A first agent")
    monkeypatch.chdir(tmp_path)  # its results go to ./rollway-runs
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_first_agent"})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines  # 2 tasks x group_size 2
    statuses = [line.split()[1] for line in lines]
    assert set(statuses) <= {"completed", "truncated", "error"}, lines
    assert (tmp_path / "rollway-runs" / "my-agent" / "summary.json").exists()
