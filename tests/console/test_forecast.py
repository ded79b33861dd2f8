"""The forecast from what the queue is doing now (issue 53): each step's pace over the time it
was at work lately, replayed from a known sequence of step runs with known times; the holds and
caps that keep jobs named instead of a time; nothing when nothing waits. Through the console's
HTTP server (the API and the overview page), on a real ZooKeeper."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queues.console import backlog
from queues.console.backlog import Pace, forecast, pace_of
from queues.console.waits import CapFigure, Wait
from queues.core.states import JOB_STEPS
from queues.models import StepRecord
from queues.operator.audit import ApiToken
from queues.services import hold_moves
from queues.zk import caps
from queues.zk.maintenance import BREAKER, node_hold_set
from tests.jobnodes import set_job_nodes
from tests.live.conftest import log_in

from .conftest import PASSWORD, PROFILE

STEPS = [s.lower() for s in JOB_STEPS[:-1]]  # pending .. notify


# The arithmetic, without a server ---------------------------------------------------------------


def test_a_pace_counts_the_time_a_step_was_at_work_not_the_hours_it_was_down():
    # 100 runs a second apart, two hours of nothing (the consumers down), 200 more: 300 runs
    # over 300 s of work, 3,600 an hour, whatever the pause.
    first = [(1000.0 + i, 1.0) for i in range(100)]
    later = [(1000.0 + 100 + 7200 + i, 1.0) for i in range(200)]
    pace = pace_of("storing", first + later)
    assert (pace.done, pace.busy_seconds) == (300, 300.0)
    assert pace.per_hour == 3600.0
    # Runs side by side (two consumers) count once for the time they share.
    both = [(2000.0 + i, 2.0) for i in range(100)]  # two runs under way at every moment
    assert pace_of("storing", both).busy_seconds == 101.0
    assert pace_of("storing", []).per_hour == 0.0


def _paces(**per_hour: float) -> dict[str, Pace]:
    return {s: Pace(s, int(per_hour.get(s, 3600)), 3600.0) for s in STEPS}


def test_a_step_must_pass_every_job_at_it_and_before_it():
    counts = {"Pending": 6, "Downloading": 4, "Storing": 3}
    f = forecast(counts, [], _paces(storing=1200))
    # Storing passes 13 jobs at 1,200 an hour: 39 s; every other step needs at most 13 s.
    assert (f.seconds, f.bottleneck, f.moving) == (39.0, "Storing", 13)


def test_jobs_a_hold_or_cap_keeps_are_named_not_timed():
    hold = Wait("Storing", 2, cap=None, hold=None)
    cap = Wait("Pending", 6, cap=CapFigure(PROFILE, 7, 7))
    counts = {"Pending": 6, "Downloading": 4, "Storing": 3}
    f = forecast(counts, [cap], _paces(storing=1200))
    assert (f.seconds, f.moving, f.kept) == (21.0, 7, 6)
    assert cap.words == f"capped: {PROFILE} 7/7"
    kept_all = forecast({"Storing": 2}, [hold], _paces())
    assert kept_all.moving == 0 and kept_all.seconds is None and kept_all.kept == 2
    assert not kept_all.nothing_waits
    assert forecast({}, [], _paces()).nothing_waits


def test_a_step_with_jobs_and_no_run_ended_for_a_while_is_named():
    paces = _paces()
    paces["storing"] = Pace("storing", 300, 900.0, last_end=10_000.0)
    f = forecast({"Storing": 4, "Notify": 1}, [], paces, now=10_000.0 + 420)
    assert f.stalled == [("Storing", 420.0)]
    assert "no Storing run has ended for 7.0 min" in backlog.forecast_words(f)
    # Notify's pace has no end known here; a step with no jobs of its own is never named.
    assert forecast({"Notify": 1}, [], paces, now=10_000.0 + 420).stalled == []
    assert pace_of("storing", [(100.0, 5.0), (103.0, 1.0)]).last_end == 105.0


def test_no_estimate_when_a_step_the_jobs_need_did_nothing_lately():
    paces = _paces()
    paces["provisioning"] = Pace("provisioning", 0, 0.0)
    f = forecast({"Pending": 3}, [], paces)
    assert f.seconds is None and f.no_pace == "Provisioning"
    assert "did nothing in the last 30 min" in backlog.forecast_words(f)


# Through the server ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_rates():
    backlog.clear_cache()
    yield
    backlog.clear_cache()


def _replay(now: datetime, step: str, *, spacing: float) -> None:
    """The runs of one step as a replayed hour of work: a burst of 100 runs 25 minutes ago,
    nothing for a while (the consumers down), then 200 more up to ten seconds ago, one every
    ``spacing`` seconds, each taking ``spacing`` seconds (one consumer thread, never idle)."""
    starts = [now - timedelta(minutes=25) + timedelta(seconds=i * spacing) for i in range(100)]
    end = now - timedelta(seconds=10)
    starts += [end - timedelta(seconds=(200 - i) * spacing) for i in range(200)]
    # And runs of a day ago, which the old three-hour average would have mixed in.
    starts += [now - timedelta(hours=2, seconds=i) for i in range(50)]
    StepRecord.objects.bulk_create(
        StepRecord(
            kind="job",
            item_id=f"jid{i:010d}",
            step=step,
            state=step.capitalize(),
            outcome="ok",
            started=start,
            duration=spacing,
            hour=int(start.timestamp() // 3600),
            host="replay",
        )
        for i, start in enumerate(starts)
    )


@pytest.fixture
def replayed(zk, make_job, settings, tmp_path) -> dict[str, Any]:
    """6 Pending, 4 Downloading and 3 Storing jobs (two bound for storage node 9501, one for
    9502; the ARK URL-encoded in the mode, as Merritt writes it); every step replayed at 3,600
    an hour but Storing at 1,200."""
    settings.MRT_WORK_DIR = tmp_path
    now = datetime.now(UTC)
    for step in STEPS:
        _replay(now, step, spacing=3.0 if step == "storing" else 1.0)
    made = {"Pending": [make_job("Pending") for _ in range(6)]}
    made["Downloading"] = [make_job("Downloading") for _ in range(4)]
    made["Storing"] = [
        set_job_nodes(
            zk,
            make_job("Storing"),
            store={"mode": f"add/{node}/ark%3A%2F99999%2Ffk4test", "manifest_url": "http://x/m"},
        )
        for node in (9501, 9501, 9502)
    ]
    return made


@pytest.fixture
def api(make_user, live_server):
    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")

    def get(path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{live_server.url}{path}", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return dict(json.load(answer))

    return get


@pytest.fixture
def api_text(make_user, live_server):
    _token, key = ApiToken.issue(user=make_user("viewer", "metrics-viewer"), name="m")

    def get(path: str) -> str:
        backlog.clear_cache()
        request = urllib.request.Request(
            f"{live_server.url}{path}", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(answer.read().decode())

    return get


@pytest.fixture
def overview(make_user, live_server):
    make_user("viewer", "vic")
    session = log_in(live_server.url, "vic", PASSWORD)

    def get() -> str:
        backlog.clear_cache()
        answer = session.get(f"{live_server.url}/", timeout=30)
        assert answer.status_code == 200
        return answer.text

    return get


@pytest.mark.django_db(transaction=True)
def test_the_forecast_of_a_replayed_pace_through_the_api_and_the_page(replayed, api, overview):
    body = api("/api/overview")["backlog"]
    paces = {s["state"]: s["done_per_hour"] for s in body["steps"]}
    assert paces["Storing"] == 1200.0 and paces["Pending"] == 3600.0
    f = body["forecast"]
    assert (f["seconds"], f["bottleneck"], f["jobs"], f["blocked"]) == (39, "Storing", 13, [])
    assert f["stalled"] == []  # every step's last run ended ten seconds ago
    assert body["drain_seconds"] == 39 and body["pace_window_minutes"] == 30
    assert body["rate_per_hour"] == 3600.0
    page = overview()
    assert "in 39 s" in page or "in 39.0 s" in page, page[page.find("backlog-drain") :][:600]
    assert "slowest step: Storing" in page


@pytest.mark.django_db(transaction=True)
def test_a_held_node_blocks_its_jobs_and_a_breaker_says_so(zk, replayed, api, api_text, overview):
    hold_moves.node_hold(node="9501", reason="disk swap", by="alice")
    body = api("/api/overview")["backlog"]
    assert body["waits_error"] is None, body
    f = body["forecast"]
    assert f["jobs"] == 11 and f["seconds"] == 33, f  # Storing passes 11 at 1,200 an hour
    (wait,) = f["blocked"]
    assert (wait["state"], wait["jobs"], wait["kind"]) == ("Storing", 2, "node")
    assert wait["words"] == "blocked: node 9501 held"
    assert wait["detail"].startswith("disk swap, by alice, since ")
    page = overview()
    assert "2 Storing: blocked: node 9501 held" in page and "disk swap, by alice" in page
    metrics = api_text("/metrics")
    assert 'mrt_backlog_kept_jobs{kind="node"} 2.0' in metrics
    assert 'mrt_backlog_kept_jobs{kind="cap"} 0.0' in metrics
    hold_moves.node_release(node="9501")
    assert node_hold_set(zk, 9501, by=BREAKER, reason="breaker: 5 x 503 from node 9501 in 3 s")
    (wait,) = api("/api/overview")["backlog"]["forecast"]["blocked"]
    assert (wait["kind"], wait["words"]) == ("breaker", "waiting for a breaker: node 9501")
    assert "breaker: 5 x 503 from node 9501" in wait["detail"]
    assert "waiting for a breaker: node 9501" in overview()


@pytest.mark.django_db(transaction=True)
def test_a_full_cap_keeps_the_pending_jobs_and_says_its_figure(zk, replayed, api, overview):
    caps.cap_set(zk, PROFILE, 7, by="bob", reason="campaign")
    f = api("/api/overview")["backlog"]["forecast"]
    (wait,) = f["blocked"]
    assert (wait["state"], wait["jobs"], wait["words"]) == ("Pending", 6, f"capped: {PROFILE} 7/7")
    assert wait["cap"]["in_flight"] == 7 and wait["cap"]["limit"] == 7
    assert (f["jobs"], f["seconds"]) == (7, 21)
    assert f"6 Pending: capped: {PROFILE} 7/7" in overview()


@pytest.mark.django_db(transaction=True)
def test_the_ingest_queue_held_in_a_window_keeps_every_job_until_its_end(
    zk, replayed, api, overview
):
    end = datetime.now(UTC) + timedelta(hours=1)
    hold_moves.queue_hold(name="ingest", reason="weekly redeploy", by="carol", until=end)
    f = api("/api/overview")["backlog"]["forecast"]
    assert f["jobs"] == 0 and f["seconds"] is None
    assert {w["state"]: w["jobs"] for w in f["blocked"]} == {
        "Pending": 6,
        "Downloading": 4,
        "Storing": 3,
    }
    detail = f["blocked"][0]["detail"]
    assert detail.startswith("weekly redeploy, by carol, since ") and " until " in detail
    assert "held: ingest queue" in overview()


@pytest.mark.django_db(transaction=True)
def test_nothing_is_forecast_when_nothing_waits(zk, api, overview, settings, tmp_path):
    settings.MRT_WORK_DIR = tmp_path
    body = api("/api/overview")["backlog"]
    assert body["forecast"]["words"] == "" and body["forecast"]["seconds"] is None
    page = overview()
    drain = page[page.find('id="backlog-drain"') :][:400]
    assert "nothing waits" in drain and " ms" not in drain
