"""Storage-node holds and maintenance windows on the holds page and in the API (issue 24)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from queues.operator.audit import ApiToken, AuditEntry
from queues.zk import locks
from queues.zk.maintenance import node_held, windows
from tests.browser import logged_in, shot

from .conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _local(dt: datetime) -> str:
    """As a browser's datetime-local field sends it: the console's zone, no offset."""
    return timezone.localtime(dt).strftime("%Y-%m-%dT%H:%M")


def test_an_operator_holds_a_node_with_a_window_and_releases_it(operator, zk):
    end = datetime.now(UTC) + timedelta(hours=2)
    response = operator.post(
        reverse("node-hold-new"),
        {"node": "9501", "reason": "node 9501 disk swap", "until": _local(end)},
    )
    assert response.status_code == 303
    assert node_held(zk, 9501)
    (window,) = windows(zk)
    assert (window.kind, window.name, window.reason) == ("node", "9501", "node 9501 disk swap")
    assert abs((window.until - end).total_seconds()) < 60
    page = operator.get(reverse("holds")).content.decode()
    assert 'id="node-9501"' in page and "node 9501 disk swap" in page
    assert "maintenance window: released by itself" in page and "data-countdown=" in page
    entry = AuditEntry.objects.get(kind="node", action="hold")
    assert (entry.item_id, entry.reason, entry.username) == (
        "9501",
        "node 9501 disk swap",
        "operator-user",
    )
    overview = operator.get(reverse("overview")).content.decode()
    assert 'id="node-holds-card"' in overview and "9501" in overview
    assert operator.post(reverse("node-hold", args=["9501", "release"])).status_code == 303
    assert not node_held(zk, 9501) and windows(zk) == []


def test_a_node_hold_needs_a_node_number_a_reason_and_the_operator_role(operator, viewer, zk):
    assert (
        operator.post(reverse("node-hold-new"), {"node": "95x1", "reason": "r"}).status_code == 400
    )
    assert operator.post(reverse("node-hold-new"), {"node": "9501"}).status_code == 400
    assert operator.post("/holds/node/../hold/").status_code == 404
    assert viewer.post(reverse("node-hold-new"), {"node": "9501", "reason": "r"}).status_code == 403
    assert not node_held(zk, 9501)


def test_a_window_must_end_in_the_future(admin, zk):
    past = _local(datetime.now(UTC) - timedelta(hours=1))
    response = admin.post(
        reverse("queue-hold", args=["ingest", "hold"]), {"reason": "redeploy", "until": past}
    )
    assert response.status_code == 400
    assert windows(zk) == []


def test_the_weekly_redeploy_holds_ingest_until_a_time(admin, zk):
    end = datetime.now(UTC) + timedelta(minutes=30)
    confirm = admin.get(reverse("queue-hold", args=["ingest", "hold"])).content.decode()
    assert 'name="until"' in confirm
    response = admin.post(
        reverse("queue-hold", args=["ingest", "hold"]),
        {"reason": "weekly redeploy", "until": _local(end)},
    )
    assert response.status_code == 303
    assert locks.queue_held(zk, "ingest")
    (window,) = windows(zk)
    assert (window.kind, window.name) == ("queue", "ingest")
    page = admin.get(reverse("holds")).content.decode()
    assert "maintenance window" in page and "weekly redeploy" in page
    # Released by hand before its end: the window goes with the hold.
    admin.post(reverse("queue-hold", args=["ingest", "release"]))
    assert windows(zk) == []


def test_the_api_holds_and_lists_nodes_with_their_windows(client, make_user, zk):
    _token, key = ApiToken.issue(user=make_user("operator", "api-op"), name="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    end = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    response = client.post(
        "/api/holds/node/9502/hold", {"reason": "node down", "until": end}, **auth
    )
    assert response.status_code == 200, response.content
    body = client.get("/api/holds", **auth).json()
    assert body["nodes"]["9502"]["reason"] == "node down"
    assert body["windows"][0]["kind"] == "node" and body["windows"][0]["name"] == "9502"
    assert client.post("/api/holds/node/9502/release", **auth).status_code == 200
    assert client.get("/api/holds", **auth).json()["nodes"] == {}


def test_beside_merritt_the_page_says_merritt_does_not_honour_node_holds(operator, zk, settings):
    settings.MRT_DEPLOYMENT = "beside-merritt"
    settings.MRT_WORK_URL = "http://console.example.org/work"
    page = operator.get(reverse("holds")).content.decode()
    assert 'id="node-hold-beside-merritt"' in page
    settings.MRT_DEPLOYMENT = "standalone"
    assert 'id="node-hold-beside-merritt"' not in operator.get(reverse("holds")).content.decode()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_holding_a_node_in_a_browser_shows_a_ticking_countdown(browser, live_server, make_user, zk):
    make_user("operator", "olga")
    with logged_in(browser, live_server.url, "olga", PASSWORD) as page:
        page.goto(f"{live_server.url}/holds/")
        page.fill("#node-number", "9501")
        page.fill("#node-reason", "storage node 9501 down")
        page.fill("#node-until", _local(datetime.now(UTC) + timedelta(hours=1)))
        page.click("#hold-node")
        page.wait_for_selector("#node-9501")
        countdown = page.locator("#node-9501 [data-countdown]")
        first = countdown.inner_text()
        page.wait_for_function(
            "t => document.querySelector('#node-9501 [data-countdown]').textContent !== t",
            arg=first,
        )
        assert countdown.inner_text().startswith("in 0:5")  # h:mm:ss, under an hour left
        assert node_held(zk, 9501)
        shot(page, "holds-node-window")
        page.goto(f"{live_server.url}/")
        assert "9501" in page.inner_text("#node-holds-card")
        page.goto(f"{live_server.url}/holds/")
        page.click("#release-node-9501")
        page.wait_for_selector("#node-holds >> text=No storage node is held.")
        assert not node_held(zk, 9501)
