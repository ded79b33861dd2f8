"""The overview in Chromium during a storage-node outage and during a capped campaign (issue
53): the hold's card, the backlog's forecast and the job diagram's boxes say what keeps the
jobs, why, who and since when. The screenshots are the ones in docs/console.md (bin/screenshots
copies them to docs/img/)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queues.console import backlog
from queues.services import hold_moves
from queues.zk import caps
from tests.browser import close_context, log_in, shot

from .conftest import PASSWORD
from .test_forecast import STEPS, _replay
from .test_wait_reasons import _storing

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CAMPAIGN = "campaign_scans"


@pytest.fixture
def overview_page(browser, live_server, make_user, settings, tmp_path):
    settings.MRT_WORK_DIR = tmp_path
    backlog.clear_cache()
    now = datetime.now(UTC)
    for step in STEPS:
        _replay(now, step, spacing=3.0 if step == "storing" else 1.0)
    make_user("viewer", "vic")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()

    def open_it() -> object:
        backlog.clear_cache()
        log_in(page, live_server.url, "vic", PASSWORD)
        return page

    yield open_it
    close_context(context)
    backlog.clear_cache()


def test_the_overview_during_a_storage_node_outage(zk, make_job, overview_page):
    for _ in range(4):
        make_job("Pending")
    for _ in range(2):
        make_job("Downloading")
    for node in (9501, 9501, 9501, 9502):
        _storing(zk, make_job, node)
    hold_moves.node_hold(node="9501", reason="node 9501 answers 503: disk swap", by="alice")
    page = overview_page()
    card = page.inner_text("#node-holds-card")
    assert "9501: node 9501 answers 503: disk swap, by alice, since" in card
    drain = page.inner_text("#backlog-drain")
    assert "3 Storing: blocked: node 9501 held" in drain
    assert "slowest step: Storing" in drain  # the other 7 jobs still have a time
    assert page.text_content("#wait-job-Storing-0") == "3 blocked: node 9501 held"
    shot(page, "overview-node-outage")


def test_the_overview_during_a_capped_campaign(zk, make_job, overview_page):
    for _ in range(3):
        make_job("Downloading", profile=CAMPAIGN)
    for _ in range(8):
        make_job("Pending", profile=CAMPAIGN)
    for _ in range(2):
        make_job("Pending")
    caps.cap_set(zk, CAMPAIGN, 3, by="olga", reason="300-object campaign")
    page = overview_page()
    drain = page.inner_text("#backlog-drain")
    assert f"8 Pending: capped: {CAMPAIGN} 3/3" in drain
    assert "3 of 3 in flight, at its cap, 300-object campaign, by olga" in drain
    assert page.text_content("#wait-job-Pending-0") == f"8 capped: {CAMPAIGN} 3/3"
    shot(page, "overview-capped-campaign")
