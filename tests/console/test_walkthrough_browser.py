"""The round's walk-through (issue 25's last "done when"), in Chromium: the pages this round added
or changed, as a viewer, an operator and an admin, on a desktop and on a phone in dark mode.
Each page answers, shows what the role may do and nothing more, fits a phone's width, runs no
page error, and leaves a screenshot in test-artifacts/screenshots/."""

from __future__ import annotations

from typing import Any

import pytest

from queues.zk.maintenance import node_hold_set, window_set
from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD
from .test_phone_and_repeat_browser import _page_fits

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Page, an element it must show, and the writes (selectors) a viewer must not be offered.
PAGES: list[tuple[str, str, list[str]]] = [
    ("/", "#backlog", []),
    ("/holds/", "#node-holds", ["#hold-node", "#release-node-9501"]),
    ("/holds/node-failed/", "#node-failed-form", []),
    ("/alerts/", "main h1", []),
    ("/collections/", "main h1", []),
    ("/failed/causes/", "main h1", []),
    ("/search/?q=letters", "#search-summary", []),
    ("/consistency/", "main h1", []),
    ("/batches/fixed/", "main h1", []),
    ("/history/", "#history-totals", []),
    ("/consumers/", "main h1", []),
    ("/batches/", "main h1", []),
]


@pytest.fixture
def queue(zk: Any, make_job: Any) -> None:
    """Something on every page: a failed job, a waiting one, a held node with a window."""
    from datetime import UTC, datetime, timedelta

    make_job("Failed", message="downloading: https://d.example.org/x.pdf: HTTP 404 Not Found")
    make_job("Pending")
    node_hold_set(zk, 9501, by="ops", reason="node 9501 disk swap")
    window_set(zk, "node", "9501", until=datetime.now(UTC) + timedelta(hours=1), reason="disk swap")


def _walk(page: Any, base: str, role: str, *, phone: bool) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    for path, shown, writes in PAGES:
        response = page.goto(f"{base}{path}")
        assert response is not None and response.status == 200, (role, path)
        page.wait_for_selector(shown)
        if role == "viewer":
            for selector in writes:
                assert page.locator(selector).count() == 0, (path, selector)
        if phone:
            _page_fits(page, PHONE)
        slug = path.strip("/").split("?")[0].replace("/", "-") or "overview"
        shot(page, f"walk-{role}-{'phone-dark' if phone else 'desktop'}-{slug}")
    assert errors == [], errors


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_each_role_walks_the_new_pages_on_a_desktop(
    browser: Any, live_server: Any, make_user: Any, queue: None, role: str
) -> None:
    make_user(role, f"walk-{role}")
    with logged_in(browser, live_server.url, f"walk-{role}", PASSWORD) as page:
        _walk(page, live_server.url, role, phone=False)


@pytest.mark.parametrize("role", ["viewer", "admin"])
def test_each_role_walks_the_new_pages_on_a_phone_in_dark_mode(
    browser: Any, live_server: Any, make_user: Any, queue: None, role: str
) -> None:
    make_user(role, f"phone-{role}")
    with logged_in(
        browser, live_server.url, f"phone-{role}", PASSWORD, viewport=PHONE, color_scheme="dark"
    ) as page:
        _walk(page, live_server.url, role, phone=True)
