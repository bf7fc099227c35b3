"""Citations resolve: every repository file a comment, docstring or doc names exists, every
design invariant cited by number is in docs/DESIGN.md's list, every section of it cited by
name is one of its headings, and the design is cited by its path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"

TEXT_SUFFIXES = {".py", ".md", ".c", ".cfg", ".toml", ".txt", ".ini"}
SKIPPED_DIRS = {"build", "dist", "__pycache__", "node_modules"}
SKIPPED_PATHS = {"tests/golden", "bench/results"}

# A repository path: one of the top-level directories, then a file ending in .py or .md.
PATH = re.compile(
    r"(?<![\w./-])((?:tests|docs|bench|examples|persistlog|spark_replay|destinations)/[\w./-]*?\.(?:py|md))(?![\w/-])"
)
# "DESIGN invariant 4", "docs/DESIGN.md invariants 2 and 5", "DESIGN.md, invariant 1".
INVARIANT = re.compile(r"DESIGN(?:\.md)?,? invariants? (\d+(?:(?:, | and |, and )\d+)*)")
# 'DESIGN.md, "Rotation"' or 'DESIGN.md "Contract details"'.
SECTION = re.compile(r'DESIGN\.md,? "([^"]+)"')
# Outside docs/ the design is cited by its path from the repository's root.
BARE_DESIGN = re.compile(r"(?<!docs/)\bDESIGN\b")


def repo_text_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        parts = rel.parts
        if any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        if any(rel.as_posix().startswith(s + "/") for s in SKIPPED_PATHS):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Makefile"):
            files.append(path)
    return files


def cited_paths(text: str) -> list[str]:
    return [m.group(1).rstrip(".") for m in PATH.finditer(text)]


def cited_invariants(text: str) -> list[int]:
    return [int(n) for m in INVARIANT.finditer(text) for n in re.findall(r"\d+", m.group(1))]


def cited_sections(text: str) -> list[str]:
    return [m.group(1) for m in SECTION.finditer(text)]


def design_invariants(design: str) -> int:
    """How many items the numbered list under "## Invariants" has."""
    section = design.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    return len(numbers)


def design_sections(design: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", design, re.M)}


def problems(rel: str, text: str, root: Path, invariants: int, sections: set[str]) -> list[str]:
    found = []
    for line_no, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{line_no}"
        for cited in cited_paths(line):
            if not (root / cited).exists():
                found.append(f"{where}: cites {cited}, which does not exist")
        for n in cited_invariants(line):
            if not 1 <= n <= invariants:
                found.append(f"{where}: cites design invariant {n}; docs/DESIGN.md lists {invariants}")
        for name in cited_sections(line):
            if name not in sections:
                found.append(f'{where}: cites section "{name}", which docs/DESIGN.md does not have')
        if not rel.startswith("docs/") and BARE_DESIGN.search(line):
            found.append(f"{where}: cites the design other than as docs/DESIGN.md")
    return found


@pytest.mark.slow
def test_every_citation_resolves() -> None:
    design = DESIGN.read_text()
    invariants, sections = design_invariants(design), design_sections(design)
    found = []
    for path in repo_text_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tests/architecture/test_citations.py":
            continue  # its patterns and examples are not citations
        found += problems(rel, path.read_text(errors="replace"), ROOT, invariants, sections)
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("FORMAT.md", "DESIGN.md"):
        (tmp_path / "docs" / name).write_text("")
    sections = {"Rotation", "Invariants"}
    text = "\n".join([
        '"""See docs/FORMAT.md and docs/FORMAT.md."""',  # fine
        "# DESIGN invariant 3, docs/DESIGN.md invariants 2 and 9",  # bare DESIGN; 9 too big
        "# built on ``tests/gone.py`` (docs/DESIGN.md, \"Rotation\")",  # missing file
        '# docs/DESIGN.md, "Retention"',  # no such section
    ])
    found = problems("persistlog/x.py", text, tmp_path, 7, sections)
    assert found == [
        "persistlog/x.py:2: cites design invariant 9; docs/DESIGN.md lists 7",
        "persistlog/x.py:2: cites the design other than as docs/DESIGN.md",
        "persistlog/x.py:3: cites tests/gone.py, which does not exist",
        'persistlog/x.py:4: cites section "Retention", which docs/DESIGN.md does not have',
    ]
    # Inside docs/ the design is a sibling: DESIGN.md alone is a fine citation there.
    assert problems("docs/RELIABILITY.md", 'See DESIGN.md, "Rotation".', tmp_path, 7, sections) == []


def test_the_design_lists_its_invariants() -> None:
    assert design_invariants(DESIGN.read_text()) == 8
