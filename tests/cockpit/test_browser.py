"""The cockpit's pages in a real Chromium (Playwright), screenshots in
test-artifacts/screenshots/: /consumers/ (a thread flagged, drained by a click, the page
following by itself), /history/ (charts with their numbers), a job's step records."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from queues.core.states import JobState
from queues.daemons.registration import ProcessObserver
from queues.models import StepRecord
from queues.zk import client as zkmod
from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD, Running, SlowStep, record

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _page(browser, live_server, make_user, *, dark=False):
    make_user("operator", "otto")
    scheme = "dark" if dark else "light"
    return logged_in(browser, live_server.url, "otto", PASSWORD, color_scheme=scheme)


def test_consumers_page_flags_a_slow_thread_and_drains(
    browser, live_server, make_user, make_job, zk, zk_hosts, settings
):
    settings.MRT_STUCK_SECONDS = 0.5  # no history yet: this is the usual time
    other = zkmod.connect(zk_hosts)
    # The busy thread holds the job until the test lets it go (after the drain), however slow
    # the browser is; the idle one works on another state, so it can never take the job first.
    busy = SlowStep(zk=other, poll=0.1)
    busy.until = threading.Event()
    idle = SlowStep(zk=other, poll=0.1)
    idle.state = JobState.PROVISIONING
    observer = ProcessObserver(
        other, [busy, idle], record=False, publish_seconds=0.3, host="ingest-7", pid=3141
    )
    busy.observer = idle.observer = observer
    observer.start()
    job = make_job("Estimating")
    running = Running([busy, idle])
    with _page(browser, live_server, make_user) as page:
        try:
            page.click("header nav a:has-text('Consumers')")
            page.wait_for_url(re.compile(r".*/consumers/$"))
            section = "#consumer-ingest-7-3141"
            page.wait_for_selector(f"{section} tr[data-item='{job.jid}']")
            # Held past the usual time: flagged, within the live refresh.
            page.wait_for_selector(f"{section}.flagged tr.flagged[data-item='{job.jid}']")
            assert "▶ claiming" in page.inner_text(f"{section} h2")
            text = page.inner_text(section)
            assert "slow-0" in text and "slow-1" in text and "idle" in text
            assert job.jid in text and "ingest-7" in text and "3141" in text
            assert "⚠" in page.inner_text("#consumers-summary")
            shot(page, "consumers-flagged")
            page.click("#drain-ingest-7-3141")
            # A confirmation page says what stops: this process is the only one serving its step.
            page.wait_for_selector("#drain-confirm")
            assert "No other claiming process serves" in page.inner_text("#drain-alone")
            shot(page, "consumers-drain-confirm")
            page.fill("#id_reason", "kernel update")
            page.click("#confirm-button")
            page.wait_for_url(re.compile(r".*/consumers/$"))
            assert "asked to drain" in page.inner_text("#messages")
            page.wait_for_selector("#state-ingest-7-3141:has-text('draining')")
            assert "kernel update" in page.inner_text(section)
            shot(page, "consumers-draining")
            busy.until.set()
            # The item in hand finishes; the page follows without a reload.
            page.wait_for_selector("#state-ingest-7-3141:has-text('drained')", timeout=30_000)
            assert page.query_selector("#undrain-ingest-7-3141") is not None
            shot(page, "consumers-drained")
            phone = page.context.new_page()
            phone.set_viewport_size(PHONE)
            phone.goto(f"{live_server.url}/consumers/")
            phone.wait_for_selector(section)
            shot(phone, "consumers-phone")
        finally:
            busy.until.set()
            running.stop()
            observer.stop()
            other.stop()
            other.close()


def _history_records() -> None:
    now = datetime.now(UTC)
    rows = []
    for h in range(0, 20):
        at = now - timedelta(hours=h, minutes=5)
        for i in range(1 + h % 4):
            rows.append(
                record(item_id=f"jid{h:05d}{i:05d}", started=at, duration=1.0 + i, waited=30.0)
            )
            rows.append(
                record(
                    item_id=f"jid{h:05d}{i:05d}",
                    step="downloading",
                    state="Downloading",
                    started=at + timedelta(seconds=40),
                    duration=20.0 + 5 * i,
                    waited=4.0,
                    bytes=10_000_000,
                )
            )
        if h % 5 == 0:
            rows.append(
                record(
                    step="downloading",
                    state="Downloading",
                    outcome="failed",
                    started=at,
                    duration=3.0,
                    detail="downloading: HTTP 404",
                )
            )
    StepRecord.objects.bulk_create(rows)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_history_page_draws_charts_with_their_numbers(browser, live_server, make_user, dark):
    _history_records()
    with _page(browser, live_server, make_user, dark=dark) as page:
        page.click("header nav a:has-text('History')")
        page.wait_for_url(re.compile(r".*/history/$"))
        for step in ("estimating", "downloading"):
            assert page.query_selector(f"svg#tp-{step} rect.chart-done") is not None
            table = page.inner_text(f"#table-{step}")
            assert "Done" in table and "Failed" in table
        # The numbers in the table are the records': 1+2+3+4 per 4 hours, 20 hours.
        total = sum(1 + h % 4 for h in range(20))
        assert page.inner_text("#table-estimating tfoot").split() == ["Total", str(total), "0"]
        assert page.inner_text("#table-downloading tfoot").split() == ["Total", str(total), "4"]
        assert page.query_selector("svg#tp-downloading rect.chart-failed-bar") is not None
        # The totals come first, above the charts, each step linking to its chart.
        totals = page.locator("#history-totals")
        assert totals.bounding_box()["y"] < page.locator("#chart-estimating").bounding_box()["y"]
        assert page.inner_text("#total-done") == str(2 * total)
        assert page.inner_text("#total-failed") == "4"
        assert page.get_attribute("#history-totals a:has-text('downloading')", "href") == (
            "#step-downloading"
        )
        durations = page.inner_text("#table-durations")
        assert "estimating" in durations and "downloading" in durations
        assert page.query_selector("svg#durations rect.chart-median") is not None
        waits = page.inner_text("#table-waits")
        assert "Estimating" in waits and "30.0 s" in waits
        assert page.query_selector("svg#waits") is not None
        shot(page, f"history-24h-{'dark' if dark else 'light'}")
        page.click("nav.ranges a:has-text('last 7 days')")
        page.wait_for_url(re.compile(r".*range=7d"))
        assert page.query_selector("svg#tp-estimating") is not None
        assert "per day" in page.inner_text("#tp-h")
        if not dark:
            shot(page, "history-7d")


def test_job_page_lists_its_step_records(browser, live_server, make_user, make_job):
    job = make_job("Downloading")
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [
            record(
                item_id=job.jid,
                step="pending",
                state="Pending",
                started=now - timedelta(minutes=9),
                duration=0.2,
                waited=3.0,
                detail="-> Estimating",
            ),
            record(
                item_id=job.jid,
                started=now - timedelta(minutes=8),
                duration=1.5,
                waited=2.0,
                host="ingest-2",
                detail="-> Provisioning",
            ),
            record(
                item_id=job.jid,
                step="downloading",
                state="Downloading",
                outcome="failed",
                started=now - timedelta(minutes=6),
                duration=12.0,
                waited=60.0,
                detail="-> Failed: downloading: HTTP 404",
            ),
            record(
                item_id=job.jid,
                step="downloading",
                state="Downloading",
                started=now - timedelta(minutes=2),
                duration=14.0,
                waited=5.0,
                detail="-> Processing",
            ),
        ]
    )
    with _page(browser, live_server, make_user) as page:
        page.goto(f"{live_server.url}/jobs/{job.jid}/")
        rows = page.query_selector_all("#job-steps-table tbody tr")
        assert len(rows) == 4
        texts = [r.inner_text() for r in rows]
        assert texts[0].startswith("pending") and "ingest-2" in texts[1]
        assert "failed" in texts[2] and "HTTP 404" in texts[2]
        assert "again" in texts[3]  # the second run of downloading: a retry
        shot(page, "job-steps")
