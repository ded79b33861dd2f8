"""Every wait and every hold says why, who and until when (issue 53), wherever it is shown:
the overview's cards and state boxes, /holds/, /collections/, the job page and the API; a cap in
one figure. Through the console's HTTP server on a real ZooKeeper."""

from __future__ import annotations

import html
import json
import re
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queues.console import backlog
from queues.operator.audit import ApiToken
from queues.services import hold_moves
from queues.zk import caps
from queues.zk.locks import collection_hold_set
from tests.jobnodes import set_job_nodes
from tests.live.conftest import log_in

from .conftest import PASSWORD, PROFILE

pytestmark = pytest.mark.django_db(transaction=True)

# The console's one written form of a time, to the minute (queues/core/clock.py).
MINUTE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} \S+"


@pytest.fixture(autouse=True)
def _fresh_rates(settings, tmp_path):
    settings.MRT_WORK_DIR = tmp_path
    backlog.clear_cache()
    yield
    backlog.clear_cache()


@pytest.fixture
def api(make_user, live_server):
    _token, key = ApiToken.issue(user=make_user("operator", "api-op"), name="t")

    def call(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{live_server.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            method="GET" if body is None else "POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return dict(json.load(answer))

    return call


@pytest.fixture
def page(make_user, live_server):
    make_user("viewer", "vic")
    session = log_in(live_server.url, "vic", PASSWORD)

    def get(path: str) -> str:
        answer = session.get(f"{live_server.url}{path}", timeout=30)
        assert answer.status_code == 200, (path, answer.status_code)
        # The text a person reads: tags out (inline ones without a space), entities decoded,
        # spaces folded.
        text = re.sub(r"</?(?:time|strong|em|b|code|span|a)\b[^>]*>", "", answer.text)
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())

    return get


def _storing(zk, make_job, node: int):
    return set_job_nodes(
        zk,
        make_job("Storing"),
        store={"mode": f"add/{node}/ark%3A%2F99999%2Ffk4test", "manifest_url": "http://x/m"},
    )


def test_a_held_nodes_storing_jobs_say_which_node_why_who_and_since(zk, make_job, api, page):
    kept = [_storing(zk, make_job, 9501) for _ in range(2)]
    going = _storing(zk, make_job, 9502)
    hold_moves.node_hold(node="9501", reason="disk swap", by="alice")
    job = page(f"/jobs/{kept[0].jid}/")
    assert re.search(
        rf"Waiting, unclaimed — blocked: node 9501 held \(disk swap, by alice, since {MINUTE}\)",
        job,
    ), job[:2000]
    assert "Waiting, unclaimed" not in page(f"/jobs/{going.jid}/")
    body = api(f"/api/jobs/{kept[0].jid}")
    assert body["waiting_for"]["words"] == "blocked: node 9501 held"
    assert body["waiting_for"]["hold"]["by"] == "alice"
    assert api(f"/api/jobs/{going.jid}")["waiting_for"] is None
    overview = page("/")
    assert "2 blocked: node 9501 held" in overview  # under the Storing box
    assert re.search(rf"9501: disk swap, by alice, since {MINUTE}", overview)
    holds = page("/holds/")
    assert "2 jobs waiting for it in Storing and Recording" in holds


def test_a_collection_held_by_the_fuse_shows_its_reason_and_who(zk, make_job, api, page):
    make_job("Held")
    hold_moves.collection_hold(
        profile=PROFILE,
        by="alert fuse",
        reason="12 jobs failed in the last 10 minutes",
        keep_record=True,
    )
    overview = page("/")
    assert re.search(
        rf"{PROFILE} — 1 held jobs, for \S+: 12 jobs failed in the last 10 minutes, by alert "
        rf"fuse, since {MINUTE}",
        overview,
    ), overview[:3000]
    holds = page("/holds/")
    assert "12 jobs failed in the last 10 minutes — alert fuse" in holds
    (detail,) = [d for d in api("/api/holds")["details"] if d["kind"] == "collection"]
    assert (detail["name"], detail["by"]) == (PROFILE, "alert fuse")
    # The fuse finding it held already (by an operator, or by Merritt's own tools) claims
    # nothing.
    hold_moves.collection_release(profile=PROFILE)
    hold_moves.collection_hold(profile=PROFILE, by="olga", reason="bad manifests")
    hold_moves.collection_hold(profile=PROFILE, by="alert fuse", reason="burst", keep_record=True)
    assert "bad manifests — olga" in page("/holds/")
    hold_moves.collection_release(profile=PROFILE)
    collection_hold_set(zk, PROFILE)
    hold_moves.collection_hold(profile=PROFILE, by="alert fuse", reason="burst", keep_record=True)
    holds = page("/holds/")
    assert "no reason recorded" in holds and "alert fuse" not in holds


def test_a_hold_placed_outside_the_console_says_it_has_no_record(zk, make_job, page):
    make_job("Held")
    hold_moves.collection_hold(profile=PROFILE, by="olga", reason="old")
    hold_moves.collection_release(profile=PROFILE)
    collection_hold_set(zk, PROFILE)  # as Merritt's own admin tool places it
    holds = page("/holds/")
    assert "no reason recorded" in holds and "old — olga" not in holds


def test_pending_jobs_behind_a_full_cap_say_so_in_one_figure(zk, make_job, api, page):
    for _ in range(3):
        make_job("Downloading")
    waiting = make_job("Pending")
    answer = api(f"/api/holds/collection/{PROFILE}/cap", {"limit": 3, "reason": "campaign"})
    (outcome,) = answer["outcomes"]
    assert outcome["detail"] == "3 of 3 in flight now, at its cap", outcome
    assert answer["cap"]["limit"] == 3
    job = page(f"/jobs/{waiting.jid}/")
    assert f"Waiting, unclaimed — capped: {PROFILE} 3/3 (3 of 3 in flight, at its cap" in job
    rows = page("/collections/")
    assert f"{PROFILE} 1 3 cap 3 at its cap: its Pending jobs wait" in rows, rows
    assert "counted" not in rows
    one = api("/api/caps")["collections"][PROFILE]
    assert one["in_flight"] == 3 and one["cap"]["in_flight"] == 3 and one["cap"]["full"]
    assert one["cap"]["words"] == "3 of 3 in flight, at its cap"
    assert f"1 capped: {PROFILE} 3/3" in page("/")  # under the Pending box
    # A marker left by a job gone from flight does not make a second figure on the pages.
    caps.count_entry(zk, PROFILE, "jid9999999999")
    assert "cap 3 at its cap" in page("/collections/")
    assert "3 of its jobs in flight now" in page(f"/collections/{PROFILE}/")


def test_the_ingest_queue_held_in_a_window_says_until_when(zk, make_job, api, page):
    make_job("Pending")
    end = datetime.now(UTC) + timedelta(hours=1)
    hold_moves.queue_hold(name="ingest", reason="weekly redeploy", by="carol", until=end)
    overview = page("/")
    assert re.search(
        rf"held for \S+: weekly redeploy, by carol, since {MINUTE}, until {MINUTE} — released "
        r"by itself in",
        overview,
    ), overview[:2000]
    (detail,) = [d for d in api("/api/holds")["details"] if d["kind"] == "queue"]
    assert detail["until"] is not None and detail["by"] == "carol"
    assert "weekly redeploy — carol" in page("/holds/")
