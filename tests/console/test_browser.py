"""The console in a real Chromium: log in, act with clicks, and a screenshot of every page."""

from __future__ import annotations

import re
import threading

import pytest

from queues.operator import bulkrun
from queues.zk import batches, jobs, locks
from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(browser, live_server, make_user):
    make_user("admin", "ada")
    with logged_in(browser, live_server.url, "ada", PASSWORD) as page:
        yield page


def test_resume_a_failed_job_from_its_page(page, live_server, make_job):
    job = make_job("Failed", failed_at="Downloading", message="HTTP 404 on payload")
    page.goto(f"{live_server.url}/failed/")
    shot(page, "failed")
    page.click(f"text={job.jid}")
    page.wait_for_url(re.compile(rf".*/jobs/{job.jid}/$"))
    assert "HTTP 404 on payload" in page.inner_text("#job-message")
    shot(page, "job-failed")
    page.click("#job-actions button:has-text('Resume')")
    page.wait_for_selector("#job-panel[data-state='Downloading']")
    assert "Downloading" in page.inner_text("#job-state")
    assert "Done" in page.inner_text("#messages")
    shot(page, "job-resumed")


def test_hold_and_release_a_collection(page, live_server, zk, make_job):
    held = make_job("Held", profile="letters")
    page.goto(f"{live_server.url}/holds/")
    page.fill("#hold-profile", "letters")
    page.click("#hold-collection")
    page.wait_for_selector("#collection-letters .badge-held")
    assert locks.collection_held(zk, "letters")
    shot(page, "holds-collection-held")
    page.click("#collection-letters button:has-text('Release letters')")
    # Released with its held job, the collection has nothing left to show.
    page.wait_for_selector("#collection-letters", state="detached")
    assert not locks.collection_held(zk, "letters")
    assert jobs.job_load(zk, held.jid).state == "Pending"
    shot(page, "holds-released")


def test_delete_a_batch_after_confirming(page, live_server, zk, make_job):
    job = make_job("Failed")
    bid = job.bid
    batch = batches.batch_load(zk, bid)
    batch = batches.batch_transition(zk, batch, "Processing")
    batch = batches.batch_transition(zk, batch, "Failed", message="1 job failed")
    page.goto(f"{live_server.url}/batches/{bid}/")
    shot(page, "batch")
    page.click("a:has-text('Delete…')")
    page.wait_for_selector("#confirm-button")
    assert "1 job" in page.inner_text("main")
    shot(page, "batch-delete-confirm")
    page.fill("#id_reason", "test batch, never wanted")
    page.click("#confirm-button")
    page.wait_for_url(f"{live_server.url}/batches/")
    assert "Deleted" in page.inner_text("#messages")
    assert zk.exists(f"/batches/{bid}") is None
    shot(page, "batches-after-delete")


def test_a_long_bulk_resume_shows_its_progress_until_done(
    page, live_server, zk, make_job, settings, monkeypatch, bulk_runs_daemon
):
    settings.MRT_BULK_INLINE_MAX = 2
    failed = [make_job("Failed", profile="letters") for _ in range(6)]
    real = bulkrun.actions.apply
    seen_part_way = threading.Event()

    def slow(**kwargs):
        # The run waits at its items until the test has seen its page part-way.
        assert seen_part_way.wait(60), "the test never looked at the running page"
        return real(**kwargs)

    monkeypatch.setattr(bulkrun.actions, "apply", slow)
    page.goto(f"{live_server.url}/failed/")
    page.check("input[name=scope][value=filter]")
    page.click("#bulk-apply")
    # Over a filter the action is previewed and confirmed first (issue 15).
    page.wait_for_selector("#bulk-confirm")
    assert "6 Failed" in page.inner_text("#bulk-preview-counts")
    page.click("#confirm-button")
    page.wait_for_url(re.compile(r".*/bulk/[0-9]+/$"))
    # Recorded by the web process, then taken by the bulk-runs daemon.
    try:
        assert page.get_attribute("#bulk-run", "data-state") in ("waiting", "running")
        shot(page, "bulk-run-running")
    finally:
        seen_part_way.set()
    page.wait_for_selector("#bulk-run[data-state=finished]", timeout=30_000)
    assert "6 of 6 handled (100%): 6 done, 0 skipped" in page.inner_text("#bulk-progress")
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in failed)
    shot(page, "bulk-run-finished")


def test_screenshot_every_page(page, live_server, make_job, make_access, zk):
    failed = make_job("Failed")
    make_job("Held")
    make_job("Processing")
    make_access("Failed")
    locks.queue_hold_set(zk, "access-large")
    pages = {
        "overview": "/",
        "jobs": "/jobs/",
        "jobs-failed-state": "/jobs/?state=Failed",
        "job": f"/jobs/{failed.jid}/",
        "job-delete-confirm": f"/jobs/{failed.jid}/delete/",
        "batches": "/batches/",
        "batch-page": f"/batches/{failed.bid}/",
        "failed-by-step": "/failed/?group=step",
        "reports": "/reports/",
        "holds": "/holds/",
        "access": "/access/",
        "consistency": "/consistency/",
        "submit": "/submit/",
        "audit": "/audit/",
        "tokens": "/tokens/",
    }
    for name, url in pages.items():
        response = page.goto(f"{live_server.url}{url}")
        assert response.status == 200, name
        shot(page, name)
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    shot(page, "phone-jobs")
    page.emulate_media(color_scheme="dark")
    page.goto(f"{live_server.url}/")
    shot(page, "phone-overview-dark")
