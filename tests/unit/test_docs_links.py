"""The documentation holds together: every relative link resolves, every anchor names a heading,
every repository path written in backticks exists, and the README stays a front door.

Checked files: README.md, docs/*.md, bench/README.md, trainer/README.md. Fenced code blocks are
left out everywhere (commands and sketches there name outputs, not files of the repository), and
so are inline code spans when links are looked for.

- A link ``[text](target)`` whose target is not a URL (``http:``, ``https:``, ``mailto:``) is a
  path relative to the file that holds it; it must exist (a file or a folder). A ``#anchor``
  (alone: this file; after a ``.md`` path: that file) must be the GitHub slug of one of its
  headings: the heading's text lower-cased, inline code and link markup reduced to their text,
  every character that is not a letter, a digit, ``_``, ``-`` or a space dropped, spaces turned
  into ``-``; a repeated slug gets ``-1``, ``-2``, ... in order.
- An inline code span that is one path starting with a top-level folder of the repository
  (``client/``, ``service/``, ``trainer/``, ``tests/``, ``bench/``, ``deploy/``, ``examples/``,
  ``protos/``, ``docs/``) must exist (``*`` as a glob that matches something); a span holding
  ``...`` or ``<`` is a pattern, not a path, and is skipped. A span ``a/b.py`` that starts
  elsewhere is a module named from inside its package (``tokenize/chat.py``): it must exist
  under the file's own folder, the repository root, or one of ``service/``, ``trainer/``,
  ``client/``. A bare file name (``rank.py``) is not checked: it is named within a table or a
  sentence that gives its folder.
- README.md is under 350 lines, and links every page under docs/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 350
TOP_FOLDERS = ("client", "service", "trainer", "tests", "bench", "deploy", "examples", "protos", "docs")
MODULE_HOMES = ("", "service", "trainer", "client")

LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(?P<code>.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
MODULE_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/[\w.-]+\.py$")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
             ROOT / "trainer" / "README.md"]
    return [f for f in files if f.exists()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = CODE_SPAN.sub(lambda m: m.group("code"), text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group("text"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        without_code = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        out += [(number, m.group("target")) for m in LINK.finditer(without_code)]
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if URL.match(target):
            continue
        where = f"{path.relative_to(ROOT)}:{number}: ({target})"
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{where}: no such file or folder {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return problems


def missing_paths(path: Path) -> list[str]:
    problems = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in CODE_SPAN.finditer(line):
            code = match.group("code").strip()
            if " " in code or "..." in code or "<" in code or not code:
                continue
            where = f"{path.relative_to(ROOT)}:{number}: `{code}`"
            if code.split("/", 1)[0] in TOP_FOLDERS and "/" in code:
                found = list(ROOT.glob(code.rstrip("/"))) if "*" in code else [ROOT / code]
                if not any(p.exists() for p in found):
                    problems.append(f"{where}: no such path in the repository")
            elif MODULE_PATH.match(code):
                homes = [path.parent] + [ROOT / home for home in MODULE_HOMES]
                if not any((home / code).exists() for home in homes):
                    problems.append(f"{where}: no such module under {path.parent.relative_to(ROOT) or '.'}/, "
                                    "the root, service/, trainer/ or client/")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_in_backticks_exists(path: Path) -> None:
    problems = missing_paths(path)
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move a section to a page under docs/"
    linked = {(readme.parent / target.partition("#")[0]).resolve() for _, target in links(readme)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"pages under docs/ that README.md does not link: {unlinked}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing anchor and a missing path are each found,
    a repeated heading's second anchor is ``-1``, and links in code are not links."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Same `x`, twice!\n\n## Same x twice\n\n"
                    "[ok](#same-x-twice) [ok](#same-x-twice-1) [bad](#nowhere) [gone](missing.md)\n"
                    "`[not a link](missing.md)` `trainer/loop/rank.py` `trainer/loop/nowhere.py`\n"
                    "```\n[in a fence](missing.md) `trainer/none.py`\n```\n", encoding="utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        (tmp_path / "trainer" / "loop").mkdir(parents=True)
        (tmp_path / "trainer" / "loop" / "rank.py").write_text("")
        found = broken_links(page)
        assert [p.split(": ", 1)[1] for p in found] == [
            "(#nowhere): no heading with the anchor #nowhere in page.md",
            "(missing.md): no such file or folder missing.md",
        ]
        assert missing_paths(page) == ["page.md:8: `trainer/loop/nowhere.py`: no such path in the repository"]
    finally:
        ROOT = saved
