"""Citations resolve: every section the code and the docs cite exists in docs/semantics.md (the one specification
in the repository), every document they name is in the repository, and nothing cites a file users do not have."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "semantics.md"
CITED = re.compile(r"§(\d+(?:\.\d+)?[a-z]?)")
NAMED = re.compile(r"docs/semantics\.md sections? (\d+(?:\.\d+)?)")
DOCUMENT = re.compile(r"\bdocs/[\w.-]+\.md\b")
OUTSIDE = re.compile(r"(kafka-streams|flink)\.md|DESIGN\.md|STYLE\.md|\.\./shared")


def _sections() -> set[str]:
    text = SPEC.read_text()
    found = {m.group(1) for m in re.finditer(r"^## (\d+)\. ", text, re.M)}
    return found | {m.group(1) for m in re.finditer(r"^(\d+\.\d+[a-z]?) ", text, re.M)}


def _texts() -> list[Path]:
    return [*sorted((ROOT / "backfill").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
            *sorted((ROOT / "jobs").rglob("*.yaml"))]


def test_every_cited_section_exists() -> None:
    sections = _sections()
    assert {"2.3", "4.5", "12"} <= sections  # the spec is read as it is numbered
    dangling = [f"{p.relative_to(ROOT)}:{n}: §{m}" for p in _texts()
                for n, line in enumerate(p.read_text().splitlines(), 1)
                for m in CITED.findall(line) + NAMED.findall(line) if m not in sections]
    assert dangling == []


def test_every_named_document_is_in_the_repository() -> None:
    missing = [f"{p.relative_to(ROOT)}:{n}: {d}" for p in _texts()
               for n, line in enumerate(p.read_text().splitlines(), 1)
               for d in DOCUMENT.findall(line) if not (ROOT / d).exists()]
    assert missing == []


def test_nothing_cites_a_file_users_do_not_have() -> None:
    outside = [f"{p.relative_to(ROOT)}:{n}" for p in _texts()
               for n, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert outside == []
