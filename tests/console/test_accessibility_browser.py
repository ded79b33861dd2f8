"""Every main page of the console, checked with axe-core in the real Chromium: an operator on a
keyboard or with a screen reader must be able to use each of them. One browser session visits
the pages in turn (logged out for the login page, then as an admin, with a queue that puts
something on every page) and fails on any WCAG 2 A/AA violation axe rates serious or critical,
naming the rule, its impact and the elements."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe

from queues.zk.maintenance import node_hold_set, window_set
from tests.browser import close_context

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# axe-core's tags for the WCAG 2.0, 2.1 and 2.2 success criteria of levels A and AA.
WCAG_AA = {"wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"}
FAILING = ("serious", "critical")
# Axe's best practices the console keeps whatever their impact: everything inside a landmark
# (region) and a name for every column (empty-table-header).
KEPT = {"region", "empty-table-header"}


def violations(axe: Axe, page: Any) -> list[str]:
    """The serious and critical WCAG A/AA violations on the page, and those of the best
    practices kept, one line per rule."""
    results = axe.run(
        page,
        options={
            "runOnly": {"type": "tag", "values": [*sorted(WCAG_AA), "best-practice"]},
            "resultTypes": ["violations"],
        },
    )
    found = []
    for rule in results.response["violations"]:
        wcag = WCAG_AA & set(rule["tags"])
        if (wcag and rule["impact"] in FAILING) or rule["id"] in KEPT:
            targets = ", ".join(" ".join(node["target"]) for node in rule["nodes"])
            found.append(f"{rule['id']} ({rule['impact']}): {targets}")
    return found


@pytest.fixture
def queue(zk: Any, make_batch: Any, make_job: Any) -> dict[str, str]:
    """A failed, a waiting, a held and a finished job in one batch, and two held nodes (one is
    released on the way)."""
    batch = make_batch()
    failed = make_job(
        "Failed", batch=batch, message="downloading: https://d.example.org/x.pdf: HTTP 404"
    )
    make_job("Pending", batch=batch)
    make_job("Held", batch=batch, profile="letters")
    make_job("Completed", batch=batch)
    node_hold_set(zk, 9501, by="ops", reason="node 9501 disk swap")
    node_hold_set(zk, 9502, by="ops", reason="node 9502 disk swap")
    window_set(zk, "node", "9501", until=datetime.now(UTC) + timedelta(hours=1), reason="swap")
    return {"jid": failed.jid, "bid": batch.bid}


def test_every_main_page_passes_axe(
    browser: Any, live_server: Any, make_user: Any, queue: dict[str, str]
) -> None:
    make_user("admin", "ada")
    axe = Axe()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    found: dict[str, list[str]] = {}

    def check(path: str, shown: str = "main h1") -> None:
        response = page.goto(f"{live_server.url}{path}")
        assert response is not None and response.status == 200, path
        page.wait_for_selector(shown)
        page.wait_for_load_state("networkidle")
        found[path] = violations(axe, page)

    try:
        check("/login/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/")
        for path, shown in [
            ("/", "#backlog"),
            ("/jobs/", "main h1"),
            (f"/jobs/{queue['jid']}/", "#job-panel"),
            ("/batches/", "main h1"),
            (f"/batches/{queue['bid']}/", "main h1"),
            ("/failed/", "main h1"),
            ("/failed/causes/", "main h1"),
            ("/holds/queue/ingest/hold/", "#queue-hold-confirm"),
        ]:
            check(path, shown)
        # The confirmation's form, sent: a hold on the holds page and an entry in the audit log.
        page.fill("#id_reason", "weekly redeploy")
        page.click("#confirm-button")
        page.wait_for_url(f"{live_server.url}/holds/")
        check("/holds/", "#node-holds")
        # An htmx action's message goes into the live region already on the page, which a
        # screen reader then reads out; a region swapped in whole, message and all, it would not.
        page.evaluate("window.messagesBefore = document.getElementById('messages')")
        page.click("#release-node-9501")
        page.locator("#messages .message-success", has_text="node 9501").wait_for()
        same = page.evaluate("document.getElementById('messages') === window.messagesBefore")
        assert same, "the htmx answer replaced the #messages live region instead of filling it"
        for path, shown in [
            ("/collections/", "main h1"),
            ("/collections/letters/", "main h1"),
            ("/consumers/", "main h1"),
            ("/alerts/", "#alert-rules"),
            ("/history/", "#history-totals"),
            ("/audit/", "main h1"),
            ("/search/?q=letters", "#search-summary"),
            ("/reports/", "main h1"),
            ("/access/", "main h1"),
            ("/consistency/", "main h1"),
            ("/bulk/", "main h1"),
            ("/tokens/", "main h1"),
            ("/submit/", "main h1"),
        ]:
            check(path, shown)
    finally:
        close_context(context)
    report = [f"{path}: {line}" for path, lines in found.items() for line in lines]
    assert report == [], "axe found serious or critical violations:\n" + "\n".join(report)
