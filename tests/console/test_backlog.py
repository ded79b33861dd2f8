"""The backlog ahead (issue 24): jobs and bytes waiting per step, jobs finished per hour over
the last day, a drain estimate at the recent pace (each step's pace while at work lately: issue
53, tests/console/test_forecast.py) and the working disk against what waits; on the overview,
in /api/overview and in /metrics alike."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from queues.console import backlog
from queues.daemons.provisioning import Provisioning
from queues.models import StepRecord
from queues.operator.audit import ApiToken
from queues.steps.workdisk import provision_room
from tests.browser import SCREENSHOTS, logged_in
from tests.jobnodes import set_job_nodes

from .conftest import PASSWORD

pytestmark = pytest.mark.django_db

GIB = 1024**3


@pytest.fixture(autouse=True)
def _fresh_rates():
    backlog.clear_cache()
    yield
    backlog.clear_cache()


@pytest.fixture
def token(make_user) -> dict[str, str]:
    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _records(step: str, n: int, *, ago: timedelta, spacing: float = 1.0) -> None:
    """``n`` runs of ``step`` one after the other from ``ago`` on, each ``spacing`` seconds
    long: the step's pace while at work is 3600 / ``spacing`` an hour."""
    first = datetime.now(UTC) - ago
    StepRecord.objects.bulk_create(
        StepRecord(
            kind="job",
            item_id=f"jid{i:010d}",
            step=step,
            state=step.capitalize(),
            outcome="ok",
            started=(started := first + timedelta(seconds=i * spacing)),
            duration=spacing,
            hour=int(started.timestamp() // 3600),
            host="h1",
        )
        for i in range(n)
    )


@pytest.fixture
def queue(zk, make_job, settings, tmp_path):
    """3 Pending, 2 Provisioning (5 GiB and 1 GiB), 1 Downloading (2 GiB); lately every step
    went at 360 an hour (12 runs of 10 s each, the 12 of Notify finished jobs), Provisioning at
    60 (3 runs of a minute); 30 more jobs finished a day ago."""
    settings.MRT_WORK_DIR = tmp_path
    for _ in range(3):
        make_job("Pending")
    for size in (5, 1):
        set_job_nodes(zk, make_job("Provisioning"), space_needed=size * GIB)
    set_job_nodes(zk, make_job("Downloading"), space_needed=2 * GIB)
    for step in ("pending", "estimating", "downloading", "processing", "storing", "recording"):
        _records(step, 12, ago=timedelta(minutes=10), spacing=10.0)
    _records("notify", 12, ago=timedelta(minutes=10), spacing=10.0)
    _records("notify", 30, ago=timedelta(hours=20))
    _records("provisioning", 3, ago=timedelta(minutes=20), spacing=60.0)
    return tmp_path


def test_the_api_gives_the_backlog_per_step_the_pace_and_a_drain_estimate(client, token, queue):
    body = client.get("/api/overview", **token).json()["backlog"]
    steps = {s["state"]: s for s in body["steps"]}
    assert steps["Pending"] == {
        "state": "Pending",
        "jobs": 3,
        "bytes": None,
        "done_per_hour": 360.0,
        "drain_seconds": 30,
        "waits": [],
    }
    assert steps["Provisioning"]["jobs"] == 2 and steps["Provisioning"]["bytes"] == 6 * GIB
    assert steps["Provisioning"]["done_per_hour"] == 60.0  # 3 runs in 3 minutes of work
    assert steps["Provisioning"]["drain_seconds"] == 120
    assert steps["Downloading"]["bytes"] == 2 * GIB
    assert body["waiting_jobs"] == 6 and body["waiting_bytes"] == 8 * GIB
    assert body["finished_last_day"] == 42
    assert body["rate_per_hour"] == 360.0
    # Provisioning must still pass the 5 jobs at it and before it, at 60 an hour: 5 min.
    assert body["drain_seconds"] == 300 and body["bottleneck"] == "Provisioning"
    disk = body["disk"]
    usage = shutil.disk_usage(queue)
    assert disk["total"] == usage.total and disk["to_provision"] == 6 * GIB
    assert disk["unestimated_jobs"] == 3
    assert disk["fits"] == (disk["room"] >= 6 * GIB)


def test_a_disk_at_its_high_water_mark_does_not_hold_what_waits(client, token, queue, settings):
    settings.MRT_PROVISION_HIGH_WATER = 0.0
    disk = client.get("/api/overview", **token).json()["backlog"]["disk"]
    assert disk["room"] == 0 and disk["fits"] is False


def test_the_disk_card_measures_room_as_provisioning_does(client, token, queue, settings, zk):
    """Issue 53, item 6: the card said "does not fit" while provisioning let jobs through: it
    counted the blocks the file system keeps for root as used. It now asks the same rule as the
    provisioning step, for a mark just above the disk's real use (where the two differed)."""
    usage = shutil.disk_usage(queue)
    settings.MRT_PROVISION_HIGH_WATER = min(1.0, (usage.used + 7 * GIB) / usage.total)
    disk = client.get("/api/overview", **token).json()["backlog"]["disk"]
    step = Provisioning(zk=zk, poll=0.05)
    room = step.room()
    # The disk moves a little between two looks (other tests write): a MiB either way.
    assert abs(disk["room"] - max(0, room)) < 2**20, (disk, room)
    assert room > 6 * GIB and disk["fits"] is True  # 7 GiB of room for the 6 that wait


def test_the_room_rule_leaves_the_blocks_kept_for_root_out_of_use() -> None:
    # An ext4 disk of 100 units: 60 in use, 5 kept for root, so 35 free for us.
    usage = shutil._ntuple_diskusage(total=100 * GIB, used=60 * GIB, free=35 * GIB)
    assert provision_room(usage, 0.70) == 10 * GIB  # not 70 - (100 - 35) = 5
    assert provision_room(usage, 0.99) == 35 * GIB  # never more than is free
    assert provision_room(usage, 0.50) == -10 * GIB  # past the mark


def test_no_estimate_without_a_recent_pace(client, token, zk, make_job, settings, tmp_path):
    settings.MRT_WORK_DIR = tmp_path
    make_job("Pending")
    _records("notify", 5, ago=timedelta(hours=10))  # finished, but not lately
    body = client.get("/api/overview", **token).json()["backlog"]
    assert body["finished_last_day"] == 5 and body["rate_per_hour"] == 0
    assert body["drain_seconds"] is None and body["forecast"]["no_pace"] == "Pending"


def test_the_overview_shows_the_backlog(viewer, queue):
    html = viewer.get(reverse("overview")).content.decode()
    assert 'id="backlog"' in html
    assert "6 jobs" in html and "42 in 24 h" in html and "360 an hour lately" in html
    assert "slowest step: Provisioning" in html
    assert 'id="finished-per-hour"' in html  # the chart of the last day
    assert 'id="backlog-provisioning"' in html and "6.00 GB" in html


def test_metrics_carry_the_same_figures(client, token, queue):
    text = client.get("/metrics", **token).content.decode()
    found = {
        (f.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert found[("mrt_backlog_jobs", (("state", "Pending"),))] == 3
    assert found[("mrt_backlog_bytes", (("state", "Provisioning"),))] == 6 * GIB
    assert ("mrt_backlog_bytes", (("state", "Pending"),)) not in found
    assert found[("mrt_jobs_finished_per_hour", ())] == 360.0
    assert found[("mrt_backlog_drain_seconds", ())] == 300
    assert found[("mrt_work_disk_waiting_bytes", ())] == 6 * GIB


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_backlog_in_a_browser(browser, live_server, make_user, queue):
    make_user("viewer", "vic")
    with logged_in(browser, live_server.url, "vic", PASSWORD) as page:
        assert "slowest step: Provisioning" in page.inner_text("#backlog-drain")
        assert not page.is_visible("#backlog-provisioning")
        page.click("#backlog-steps summary")
        page.wait_for_selector("#backlog-provisioning")
        assert "2.0 min" in page.inner_text("#backlog-provisioning")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#backlog").screenshot(path=str(SCREENSHOTS / "overview-backlog.png"))
