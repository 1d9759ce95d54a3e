"""Documentation citations resolve inside the repository.

Code and documents cite the design as `docs/design.md, "<heading>"`; every such heading must exist,
and nothing may cite design notes that a clone of the repository does not have.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SCANNED = ("whiflash", "datagen", "train", "eval", "scripts", "tests", "docs", "checkpoints", "README.md",
           "pyproject.toml")
"""Folders and files whose text is checked."""
SUFFIXES = {".py", ".md", ".sh", ".json", ".toml", ".yaml"}
SECTIONS = ("The round", "Tau", "Drafters and checkpoints", "Routing", "The router dataset", "Testbed", "Performance")
"""Headings other files are told to cite; renaming one means updating every citation."""
CITATION = re.compile(r'docs/design\.md,\s+"([^"<>]+)"')
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\breference/[\w.-]+\.md\b")
"""Citations of the design notes kept outside the repository."""


def headings() -> set[str]:
    """Section and subsection headings of docs/design.md."""
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", DESIGN.read_text(), re.MULTILINE)}


def texts() -> dict[str, str]:
    """Relative path -> text of every scanned file."""
    files = []
    for name in SCANNED:
        path = ROOT / name
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return {str(p.relative_to(ROOT)): p.read_text(errors="replace") for p in sorted(files)}


def test_design_has_the_cited_sections() -> None:
    missing = sorted(set(SECTIONS) - headings())
    assert not missing, f"docs/design.md lacks the section(s) {missing}"


def test_every_design_citation_names_a_heading() -> None:
    known = headings()
    bad = [f"{path}: {' '.join(m.group(1).split())!r}" for path, text in texts().items()
           for m in CITATION.finditer(text) if " ".join(m.group(1).split()) not in known]
    assert not bad, "citations of headings docs/design.md does not have:\n" + "\n".join(bad)


def test_nothing_cites_design_notes_outside_the_repo() -> None:
    bad = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for path, text in texts().items()
           for m in OUTSIDE.finditer(text)]
    assert not bad, "cite docs/design.md, \"<heading>\" instead of notes outside the repository:\n" + "\n".join(bad)
