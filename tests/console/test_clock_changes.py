"""Times at the clock changes: a local time an operator gives that the console's zone skips
(spring forward) or shows twice (fall back), through the real views and the API; the end a
maintenance window keeps and the maintenance daemon's "due"; the node-failed window's own
defaults; the morning digest once per local day across both changes. Real ZooKeeper."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.urls import reverse

from queues.core import clock
from queues.daemons.alerting import digest_if_due
from queues.models import AlertDigest
from queues.views import holds as holds_view
from queues.zk.locks import queue_held
from queues.zk.maintenance import due, node_held, windows

from .conftest import nothing_held, post_json

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("_los_angeles")]

ZONE = ZoneInfo("America/Los_Angeles")


@pytest.fixture
def _los_angeles() -> Any:
    with override_settings(TIME_ZONE="America/Los_Angeles"):
        yield


def _next_change(forward: bool) -> datetime:
    """The next hour, within a year, at which Los Angeles's clocks go forward (or back): the
    first UTC instant with the new offset. Found from now so that the ends stay in the future
    the windows need (at most a year ahead)."""
    moment = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    before = moment.astimezone(ZONE).utcoffset()
    for _ in range(24 * 366):
        moment += timedelta(hours=1)
        after = moment.astimezone(ZONE).utcoffset()
        assert before is not None and after is not None
        if after != before and (after > before) == forward:
            return moment
        before = after
    raise AssertionError("no clock change in Los Angeles within a year")


def _wall(moment: datetime, fmt: str = "%Y-%m-%dT%H:%M") -> str:
    return moment.astimezone(ZONE).strftime(fmt)


def _skipped() -> str:
    """Half past the hour the clocks skip: 02:30 on the night they go forward."""
    change = _next_change(forward=True)  # 10:00 UTC: 02:00 PST became 03:00 PDT
    return (change.astimezone(ZONE) - timedelta(hours=1)).strftime("%Y-%m-%dT02:30")


def _repeated() -> tuple[datetime, datetime]:
    """01:30 on the night the clocks go back, as both instants (PDT first, then PST)."""
    change = _next_change(forward=False)  # 09:00 UTC: 02:00 PDT became 01:00 PST
    return change - timedelta(minutes=30), change + timedelta(minutes=30)


def _doors(client: Any, operator: Any, headers: dict[str, str], until: str) -> list[Any]:
    """Every door a hold's end comes in by: the holds page's forms (collection, node), the
    ingest queue's confirmation page, and the API's JSON."""
    return [
        operator.post(
            reverse("collection-hold-new"), {"profile": "letters", "reason": "r", "until": until}
        ),
        operator.post(reverse("node-hold-new"), {"node": "9501", "reason": "r", "until": until}),
        operator.post(
            reverse("queue-hold", args=["ingest", "hold"]), {"reason": "r", "until": until}
        ),
        post_json(client, "/api/holds/node/9501/hold", {"reason": "r", "until": until}, **headers),
    ]


def _said(response: Any) -> str:
    return html.unescape(response.content.decode())


def test_a_local_time_the_clocks_skip_is_a_400_naming_it_and_nothing_is_held(
    client, admin, token_for, zk
):
    until = _skipped()
    for answer in _doors(client, admin, token_for("admin"), until):
        said = _said(answer)
        assert answer.status_code == 400, said
        assert f"{until.replace('T', ' ')} is no one time in America/Los_Angeles" in said
        assert "it does not exist, the clocks go forward from PST to PDT" in said
    assert nothing_held(zk) and windows(zk) == []


def test_a_local_time_the_clocks_show_twice_is_a_400_asking_which(client, admin, token_for, zk):
    first, _second = _repeated()
    until = _wall(first)
    shown = until.replace("T", " ")
    for answer in _doors(client, admin, token_for("admin"), until):
        said = _said(answer)
        assert answer.status_code == 400, said
        assert "show it twice, first in PDT (-07:00), then in PST (-08:00)" in said
        assert f"say which, as {shown} PDT or {shown} PST" in said
    assert nothing_held(zk) and windows(zk) == []


@pytest.mark.parametrize("which", ["PDT", "PST"])
def test_the_repeated_hour_with_its_zone_name_ends_the_hold_at_that_instant(operator, zk, which):
    first, second = _repeated()
    meant = first if which == "PDT" else second
    until = f"{_wall(meant, '%Y-%m-%d %H:%M')} {which}"  # as the console writes it
    answer = operator.post(
        reverse("node-hold-new"), {"node": "9501", "reason": "r", "until": until}
    )
    assert answer.status_code == 303, _said(answer)
    (window,) = windows(zk)
    assert window.until == meant
    # The maintenance daemon's question (``Maintenance.sweep``): due at that instant, not before,
    # and not an hour off either way.
    assert due(zk, now=meant - timedelta(seconds=1)) == []
    assert [w.key for w in due(zk, now=meant)] == ["node:9501"]
    page = _said(operator.get(reverse("holds")))
    assert f'released by itself at <time datetime="{meant.isoformat()}"' in page
    assert f">{until}</time>" in page  # the window's end, with its zone's name
    assert f'data-countdown="{meant.isoformat()}"' in page  # the countdown counts to the instant
    assert node_held(zk, 9501)


def test_the_api_takes_an_offset_in_the_repeated_hour(client, token_for, zk):
    _first, second = _repeated()
    until = _wall(second) + "-08:00"
    answer = post_json(
        client,
        "/api/holds/queue/ingest/hold",
        {"reason": "redeploy", "until": until},
        **token_for("admin"),
    )
    assert answer.status_code == 200, answer.content
    assert queue_held(zk, "ingest")
    (window,) = windows(zk)
    assert window.until == second
    listed = client.get("/api/holds", **token_for("viewer")).json()["windows"]
    assert listed[0]["until"] == second.isoformat()


def test_a_zone_name_the_zone_does_not_use_then_is_refused(operator, zk):
    _first, second = _repeated()
    until = _wall(second + timedelta(hours=4), "%Y-%m-%d %H:%M") + " PDT"  # PST by then
    answer = operator.post(
        reverse("node-hold-new"), {"node": "9501", "reason": "r", "until": until}
    )
    assert answer.status_code == 400
    assert f"{until} is no time in America/Los_Angeles: the zone" in _said(answer)
    assert "clocks say PST then" in _said(answer)
    assert windows(zk) == [] and not node_held(zk, 9501)


# The node-failed window: its bounds, and the defaults the page writes into its own form -------


def _failed_page(operator: Any, **query: str) -> Any:
    return operator.get(reverse("node-failed"), query)


def test_a_failure_window_across_the_repeated_hour_is_read_in_order(operator, zk):
    # 01:40 PDT comes before 01:10 PST: a window of half an hour, not one that ends first.
    answer = _failed_page(
        operator, node="9501", since="2026-11-01 01:40 PDT", before="2026-11-01 01:10 PST"
    )
    assert answer.status_code == 200, _said(answer)
    heading = re.search(r'<h2 id="node-failed-h">(.*?)</h2>', _said(answer), re.S)
    assert heading and "2026-11-01 01:40 PDT" in heading.group(1)
    assert "2026-11-01 01:10 PST" in heading.group(1)


def test_a_failure_window_bound_the_clocks_skip_is_a_400(operator, zk):
    answer = _failed_page(
        operator, node="9501", since="2026-03-08T02:30", before="2026-03-09T00:00"
    )
    assert answer.status_code == 400
    assert "2026-03-08 02:30 is no one time in America/Los_Angeles: it does not exist" in _said(
        answer
    )


@pytest.mark.parametrize(
    "now",
    [
        datetime(2026, 11, 1, 9, 30, tzinfo=UTC),  # 01:30 PST: "before" is in the repeated hour
        datetime(2026, 11, 2, 9, 30, tzinfo=UTC),  # a day on: "since" is
        datetime(2026, 3, 8, 10, 30, tzinfo=UTC),  # 03:30 PDT, just past the skipped hour
    ],
)
def test_the_window_the_page_fills_in_is_one_it_takes_back(operator, zk, monkeypatch, now):
    monkeypatch.setattr(holds_view, "timezone", SimpleNamespace(now=lambda: now))
    form = _said(_failed_page(operator))
    since = re.search(r'name="since"[^>]* value="([^"]*)"', form)
    before = re.search(r'name="before"[^>]* value="([^"]*)"', form)
    assert since and before
    assert before.group(1) == clock.clock_text(now, "minutes")
    answer = _failed_page(operator, node="9501", since=since.group(1), before=before.group(1))
    assert answer.status_code == 200, _said(answer)
    heading = re.search(r'<h2 id="node-failed-h">(.*?)</h2>', _said(answer), re.S)
    assert heading and clock.clock_text(now, "minutes") in heading.group(1)
    assert clock.clock_text(now - timedelta(hours=24), "minutes") in heading.group(1)


# The morning digest: once per local day, across both changes ---------------------------------


@pytest.mark.parametrize("hour", [0, 1, 2, 3])
def test_the_digest_is_written_once_each_local_day_across_both_changes(settings, hour):
    """``digest_if_due`` driven every ten minutes over the three local days around each change
    (2026-03-08 has 23 hours in Los Angeles, 2026-11-01 has 25)."""
    settings.MRT_ALERT_DIGEST_HOUR = hour
    for first_day in ("2026-03-07", "2026-10-31"):
        moment = datetime.fromisoformat(first_day).replace(tzinfo=ZONE).astimezone(UTC)
        days = {first_day}
        written: list[datetime] = []
        while len(days) <= 3:
            if digest_if_due(moment):
                written.append(moment)
            moment += timedelta(minutes=10)
            days.add(_day(moment))
        assert sorted(_day(w) for w in written) == sorted(days)[:3], written
        for w in written:  # at its hour, or at the first moment past it the clocks show
            assert hour <= w.astimezone(ZONE).hour <= hour + 1, w.astimezone(ZONE)
    assert AlertDigest.objects.count() == 6


def _day(moment: datetime) -> str:
    return moment.astimezone(ZONE).date().isoformat()


def test_the_other_forms_django_reads_are_refused_in_the_gap_too(operator, zk):
    answer = _failed_page(
        operator, node="9501", since="03/08/2026 02:30", before="03/09/2026 00:00"
    )
    assert answer.status_code == 400
    assert "2026-03-08 02:30 is no one time in America/Los_Angeles" in _said(answer)
    answer = _failed_page(
        operator, node="9501", since="03/08/2026 01:30", before="03/09/2026 00:00"
    )
    assert answer.status_code == 200, _said(answer)
