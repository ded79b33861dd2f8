"""The console's views are split by resource (queues/views/<resource>.py, GET and POST
together); a view module imports no other view module but ``common``, and the JSON API takes
from the views only ``common`` (the one error mapping, the shared reads and action steps)."""

from __future__ import annotations

import re
from pathlib import Path

import grimp
import pytest

QUEUES = Path(__file__).resolve().parents[2] / "queues"
GRAPH = grimp.build_graph("queues")
VIEW_MODULES = sorted(m for m in GRAPH.find_children("queues.views"))


def _views_imported_by(module: str) -> set[str]:
    return {
        m
        for m in GRAPH.find_modules_directly_imported_by(module)
        if m.startswith("queues.views.") and m != "queues.views.common"
    }


@pytest.mark.parametrize("module", VIEW_MODULES)
def test_a_view_module_imports_no_other_view_module_but_common(module):
    assert _views_imported_by(module) - {module} == set()


def test_the_api_takes_only_common_from_the_views():
    assert _views_imported_by("queues.web.api") == set()


def test_no_view_split_by_verb_is_left():
    assert "queues.views.pages" not in VIEW_MODULES
    assert "queues.views.writes" not in VIEW_MODULES


def test_htmx_response_headers_are_written_by_django_htmx():
    written = re.compile(r"""\[\s*["']HX-""")
    by_hand = [
        str(path.relative_to(QUEUES))
        for path in QUEUES.rglob("*.py")
        if written.search(path.read_text(encoding="utf-8"))
    ]
    assert by_hand == []
