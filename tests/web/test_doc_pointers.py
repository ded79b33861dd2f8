"""A pointer to the docs goes somewhere (issue 53, item 6: docker-compose.yml sent readers to a
README section that no longer exists): every ``docs/NAME.md`` named in the project's files is
there, and every README section named ``"Section" in README.md`` or ``README.md "Section"`` is a
heading of README.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOKED_AT = ["docker-compose.yml", "Dockerfile", "Makefile", "README.md"]
FOLDERS = ["bin", "docker", "queues", "mrtadmin", "bench", "docs", "templates"]
DOC = re.compile(r"\bdocs/([a-z0-9-]+\.md)\b")
SECTION = re.compile(r'"([A-Z][^"]{2,60})" in README(?:\.md)?|README(?:\.md)? "([A-Z][^"]{2,60})"')


def files() -> list[Path]:
    found = [ROOT / name for name in LOOKED_AT if (ROOT / name).exists()]
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {"", ".py", ".md", ".yml", ".sh", ".html"}:
                found.append(path)
    return found


def test_every_pointer_to_the_docs_leads_to_a_page_or_a_section() -> None:
    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    checked = 0
    missing = []
    for path in files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        where = path.relative_to(ROOT)
        for name in DOC.findall(text):
            checked += 1
            if not (ROOT / "docs" / name).exists():
                missing.append(f"{where}: docs/{name}")
        for first, second in SECTION.findall(text):
            checked += 1
            if (first or second) not in headings:
                missing.append(f'{where}: README.md "{first or second}"')
    assert checked > 20
    assert missing == []
