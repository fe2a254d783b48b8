"""The README and docs/*.md: every ``>>>`` example runs and prints what it shows, and every
relative link points to a file (and, for a ``#anchor`` into a markdown file, a heading) that exists.

The files are found relative to this test file (the repository root is its parent's parent), not
to the working directory: CI runs pytest from the repository root against an installed wheel.
Where the README or docs/ are absent (an sdist without them), the tests skip.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _markdown_files() -> list[Path]:
    files = [README] if README.is_file() else []
    if DOCS.is_dir():
        files += sorted(DOCS.glob("*.md"))
    return files


_FENCE = re.compile(r"^(```|~~~)")

FILES = _markdown_files()
WITH_EXAMPLES = [p for p in FILES if ">>>" in p.read_text(encoding="utf-8")]


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_readme_is_short():
    if not README.is_file():
        pytest.skip("README.md is not here (an sdist without it)")
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail to docs/"


def _without_fences(text: str) -> str:
    """A code fence right after an example's output would read as output: blank it (same line numbers)."""
    return "\n".join("" if _FENCE.match(line.strip()) else line for line in text.split("\n"))


@pytest.mark.parametrize("path", WITH_EXAMPLES or [None], ids=[_id(p) for p in WITH_EXAMPLES] or ["none"])
def test_markdown_examples_run(path):
    if path is None:
        pytest.skip("no README.md or docs/*.md with >>> examples here")
    pytest.importorskip("rankmesh")
    text = _without_fences(path.read_text(encoding="utf-8"))
    test = doctest.DocTestParser().get_doctest(text, {"__name__": "__main__"}, _id(path), str(path), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test)
    assert result.attempted > 0, f"{_id(path)}: no example was run"
    assert result.failed == 0, f"{_id(path)}: {result.failed} of {result.attempted} examples failed (output above)"


# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _outside_code_blocks(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.split("\n"):
        if _FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_code_blocks(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if m:
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _relative_links(path: Path) -> list[str]:
    links = []
    for line in _outside_code_blocks(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in _LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            links.append(target)
    return links


@pytest.mark.parametrize("path", FILES or [None], ids=[_id(p) for p in FILES] or ["none"])
def test_relative_links_point_to_existing_files(path):
    if path is None:
        pytest.skip("no README.md or docs/*.md here")
    broken = []
    for target in _relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_id(dest)}")
    assert not broken, f"{_id(path)} has broken links:\n" + "\n".join(broken)
