"""The outage banner in the real Chromium: its role="alert" notice is put on the page once an
outage, not again by each of the banner's polls (a screen reader says an alert each time one is
inserted), and it goes when the outage does."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from queues.zk import client as zkmod
from tests.browser import close_context, log_in

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Sends the banner's poll now (as its "every 20s" would) and resolves with whether htmx was left
# to swap the answer in, once that answer is in hand.
POLL = """
() => new Promise((resolve) => {
  document.addEventListener("htmx:beforeSwap", function seen(event) {
    if (event.detail.target.id !== "zk-banner") return;
    document.removeEventListener("htmx:beforeSwap", seen);
    // After the page's own listeners: this one was added last.
    setTimeout(() => resolve(event.detail.shouldSwap), 0);
  });
  htmx.trigger(document.getElementById("zk-banner"), "live-refresh");
})
"""


def test_the_zookeeper_notice_is_inserted_once_an_outage(
    browser: Any, live_server: Any, make_user: Any, zk_hosts: str
) -> None:
    make_user("viewer", "vic")
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    old_timeout = settings.ZK_TIMEOUT
    try:
        log_in(page, live_server.url, "vic", PASSWORD)
        page.goto(f"{live_server.url}/jobs/")
        page.wait_for_load_state("networkidle")
        assert page.locator("#zk-banner [role=alert]").count() == 0

        settings.ZK_HOSTS, settings.ZK_TIMEOUT = "127.0.0.1:9", 1.0
        zkmod.close()
        assert page.evaluate(POLL) is True  # the outage is new: swapped in
        notice = page.locator("#zk-banner [role=alert]")
        notice.wait_for()
        assert "ZooKeeper is unreachable" in notice.inner_text()
        page.evaluate("document.querySelector('#zk-banner [role=alert]').dataset.first = 'yes'")

        for _ in range(2):  # the same outage, polled again: nothing inserted
            assert page.evaluate(POLL) is False
            assert notice.count() == 1
            assert notice.get_attribute("data-first") == "yes"

        settings.ZK_HOSTS, settings.ZK_TIMEOUT = zk_hosts, old_timeout
        zkmod.close()
        assert page.evaluate(POLL) is True  # over: the notice goes
        notice.wait_for(state="detached")
        # And the banner still polls, with its notice inserted again at the next outage.
        settings.ZK_HOSTS, settings.ZK_TIMEOUT = "127.0.0.1:9", 1.0
        zkmod.close()
        assert page.evaluate(POLL) is True
        notice.wait_for()
        assert notice.get_attribute("data-first") is None
    finally:
        settings.ZK_HOSTS, settings.ZK_TIMEOUT = zk_hosts, old_timeout
        zkmod.close()
        close_context(context)
