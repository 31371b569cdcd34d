"""Every file or folder of the repository that a page or a docstring names
exists (issue 38, item 9: docs/remote.md named memosfs/store/remote.py after
it had become a folder; a docstring named docs/df.md, which never existed).

Checked: paths in backquotes on README.md, docs/*.md and */README.md that
start with one of the repository's folders, and `docs/NAME.md` anywhere in
the sources, tests, scripts and pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("memosfs", "native", "tests", "scripts", "mountscripts", "docs")
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")) + sorted(
    ROOT.glob("*/README.md"))
QUOTED = re.compile(r"`((?:%s)/[A-Za-z0-9_./-]*)`" % "|".join(FOLDERS))
DOC_NAME = re.compile(r"\bdocs/[A-Za-z0-9_-]+\.md\b")


def _sources() -> list[Path]:
    out = [ROOT / "Makefile"] + PAGES
    for folder in ("memosfs", "tests", "scripts", "mountscripts", "native"):
        out += [p for p in (ROOT / folder).rglob("*")
                if p.is_file() and p.suffix in (".py", ".c", ".h", ".sh", ".md", "")
                and "__pycache__" not in p.parts]
    return [p for p in out if p != Path(__file__).resolve()]     # (names bad ones)


def test_paths_quoted_on_the_pages_exist():
    missing = []
    for page in PAGES:
        for m in QUOTED.finditer(page.read_text()):
            path = m.group(1).rstrip(".")
            if not (ROOT / path).exists() and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []


def test_pages_named_anywhere_exist():
    missing = []
    for src in _sources():
        try:
            text = src.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for m in DOC_NAME.finditer(text):
            if not (ROOT / m.group(0)).exists():
                missing.append(f"{src.relative_to(ROOT)}: {m.group(0)}")
    assert missing == []
