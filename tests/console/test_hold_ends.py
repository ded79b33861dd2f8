"""A hold's end (issue 52, items 1 and 2): a hold whose end is refused places nothing, through
every door (the API, the console's buttons, the /holds/ forms), and ends are bounded to a year
ahead; the hold-overrun rule reports every overrun whatever ends other windows were stored with.
Each test reads ZooKeeper itself after the refusal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from queues.daemons.alert_rules import Context
from queues.daemons.maintenance import hold_overrun
from queues.operator.audit import AuditEntry
from queues.zk import paths as zpaths
from queues.zk.locks import collection_hold_set, queue_hold_set
from queues.zk.maintenance import (
    WINDOWS,
    node_hold_set,
    window_set,
    windows,
)

from .conftest import nothing_held, post_json

pytestmark = pytest.mark.django_db

PAST = "2020-01-02T03:04:05+00:00"
FAR = "9999-12-31T00:00:00+00:00"


# 1 and 2: a hold's end -----------------------------------------------------------------------

API_HOLDS = [
    "/api/holds/queue/ingest/hold",
    "/api/holds/collection/letters/hold",
    "/api/holds/node/9501/hold",
]


@pytest.mark.parametrize("end", [PAST, FAR, "9999-12-31"], ids=["past", "far", "far-date"])
@pytest.mark.parametrize("url", API_HOLDS)
def test_an_api_hold_with_a_refused_end_places_nothing(client, token_for, zk, url, end):
    answer = post_json(client, url, {"reason": "redeploy", "until": end}, **token_for("admin"))
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert ("in the future" in error) if end == PAST else ("at most 365 days ahead" in error)
    assert nothing_held(zk)
    refused = AuditEntry.objects.get(action="hold")
    assert not refused.ok and refused.detail.startswith("refused")


@pytest.mark.parametrize("end", [PAST, FAR])
def test_a_console_hold_with_a_refused_end_places_nothing(admin, zk, end):
    posts = [
        (reverse("queue-hold", args=["ingest", "hold"]), {"reason": "redeploy"}),
        (reverse("collection-hold", args=["letters", "hold"]), {"reason": "redeploy"}),
        (reverse("node-hold", args=["9501", "hold"]), {"reason": "redeploy"}),
        # The /holds/ page's forms, where the collection or the node is typed.
        (reverse("collection-hold-new"), {"profile": "letters", "reason": "redeploy"}),
        (reverse("node-hold-new"), {"node": "9501", "reason": "redeploy"}),
    ]
    for url, form in posts:
        answer = admin.post(url, {**form, "until": end})
        assert answer.status_code == 400, (url, answer.status_code)
        assert nothing_held(zk), url
    assert AuditEntry.objects.filter(action="hold", ok=True).count() == 0


def test_a_hold_with_an_end_within_the_horizon_is_placed_with_its_window(client, token_for, zk):
    end = (datetime.now(UTC) + timedelta(days=364)).isoformat()
    answer = post_json(
        client,
        "/api/holds/collection/letters/hold",
        {"reason": "campaign", "until": end},
        **token_for("operator"),
    )
    assert answer.status_code == 200, answer.content
    assert zk.exists(zpaths.collection_lock("letters")) is not None
    (window,) = windows(zk)
    assert window.name == "letters" and window.until > datetime.now(UTC) + timedelta(days=363)


def test_the_overrun_rule_reports_every_overrun_whatever_other_windows_say(zk, viewer):
    """Windows an older console or another client wrote with ends out of any sane range (or
    beyond what a datetime holds once converted) cost the rule nothing: the overrun beside them
    is still reported, and the pages that show windows still answer."""
    now = datetime.now(UTC)
    queue_hold_set(zk, "ingest")
    window_set(zk, "queue", "ingest", until=now - timedelta(hours=2), reason="redeploy")
    node_hold_set(zk, 9501, reason="disk swap")
    window_set(zk, "node", "9501", until=datetime(9999, 12, 31, tzinfo=UTC))
    collection_hold_set(zk, "letters")
    for name, until, at in [
        ("letters", "9999-12-31T23:59:59-12:00", "not a time"),
        ("early", "0001-01-01T00:00:00+05:00", None),
    ]:
        info = {"kind": "collection", "name": name, "until": until, "at": at}
        zk.create(f"{WINDOWS}/collection:{name}", json.dumps(info).encode(), makepath=True)
    found = hold_overrun(Context(zk, now), 300.0)
    assert [f.key for f in found] == ["queue:ingest"]
    assert viewer.get(reverse("holds")).status_code == 200
