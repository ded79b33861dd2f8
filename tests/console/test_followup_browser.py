"""In Chromium, as an operator would: resume a job from a step chosen on its page, a bulk
resume from a step with its preview, a fixed batch's Update-reporting (one and all), and
notes on a job, a batch and a collection, shown as text where they are listed."""

from __future__ import annotations

import re

import pytest

from queues.core.states import JOB_STEPS
from queues.zk import batches, jobs, locks
from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MARKUP = "<img src=x onerror=\"document.title='owned'\"><b>bold</b>"


@pytest.fixture
def page(browser, live_server, make_user):
    make_user("operator", "grace")
    with logged_in(browser, live_server.url, "grace", PASSWORD) as page:
        yield page


def test_resume_a_job_from_an_earlier_step_chosen_on_its_page(page, live_server, zk, make_job):
    job = make_job("Failed", failed_at="Storing", message="storage: manifest refused")
    page.goto(f"{live_server.url}/jobs/{job.jid}/")
    offered = page.locator("#resume-to option").all_inner_texts()
    assert offered[0] == "Pending" and offered[-1] == "Storing (where it failed)"
    page.select_option("#resume-to", "Processing")
    shot(page, "job-resume-from-step")
    page.click("#job-resume-from-button")
    page.wait_for_selector("#job-panel[data-state='Processing']")
    assert "Failed -> Processing" in page.inner_text("#messages")
    timeline = page.inner_text("#job-timeline")
    assert "resume: Failed → Processing" in timeline
    assert jobs.job_load(zk, job.jid).status.last_successful_status == "Downloading"


def test_a_bulk_resume_from_a_step_is_previewed_before_it_runs(page, live_server, zk, make_job):
    late = make_job("Failed", failed_at="Recording")
    early = make_job("Failed", failed_at="Provisioning")
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    for job in (late, early):
        page.check(f"#job-row-{job.jid} input[type=checkbox]")
    page.select_option("#bulk-action", "resume")
    page.select_option("#bulk-to", "Storing")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_selector("#bulk-resume-step")
    plan = page.inner_text("#bulk-resume-plan")
    assert f"{late.jid}: restarts at Storing" in plan
    assert f"{early.jid}: skipped" in plan
    assert jobs.job_load(zk, late.jid).state == "Failed"
    shot(page, "bulk-resume-from-step-preview")
    page.click("#confirm-button")
    page.wait_for_selector("text=1 done, 1 skipped")
    assert jobs.job_load(zk, late.jid).state == "Storing"
    assert jobs.job_load(zk, early.jid).state == "Failed"


def _fixed_batch(zk, make_batch, make_job):
    batch = make_batch(profile="merritt_demo_content")
    made = [make_job("Failed", batch=batch, profile="merritt_demo_content") for _ in range(3)]
    batch = batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Processing")
    batches.batch_transition(zk, batch, "Reporting")
    batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Failed", message="3 failed")
    return batch.bid, made


def test_a_fixed_batch_offers_update_reporting_on_its_page_and_with_all_others(
    page, live_server, zk, make_batch, make_job
):
    fixed = []
    for _ in range(2):
        bid, made = _fixed_batch(zk, make_batch, make_job)
        for job in made:
            page.goto(f"{live_server.url}/jobs/{job.jid}/")
            page.click("#job-actions button:has-text('Resume')")
            page.wait_for_selector("#job-panel[data-state='Downloading']")
            moved = jobs.job_load(zk, job.jid)
            while moved.state != "Completed":
                moved = jobs.job_transition(zk, moved, JOB_STEPS[JOB_STEPS.index(moved.state) + 1])
        fixed.append(bid)
    page.goto(f"{live_server.url}/batches/{fixed[0]}/")
    assert "Next step: Update-reporting" in page.inner_text("#batch-next-step")
    shot(page, "batch-fixed-next-step")
    page.click("#batch-update-reporting")
    page.wait_for_selector("#batch-panel[data-state='UpdateReporting']")
    page.goto(f"{live_server.url}/")
    page.click("#fixed-batches-card a")
    page.wait_for_url(re.compile(r".*/batches/fixed/$"))
    assert page.inner_text("#fixed-count").startswith("1 batch")
    shot(page, "fixed-batches")
    page.click("#fixed-update-all")
    page.wait_for_selector("text=1 done, 0 skipped")
    assert [batches.batch_load(zk, b).state for b in fixed] == ["UpdateReporting"] * 2


def test_notes_on_a_job_a_batch_and_a_collection_show_as_text_where_listed(
    page, live_server, zk, make_job
):
    job = make_job("Failed", profile="letters")
    page.goto(f"{live_server.url}/jobs/{job.jid}/")
    page.fill(f"#note-new-job-{job.jid}", MARKUP)
    page.click(f"#note-add-job-{job.jid}")
    page.wait_for_selector(f"#notes-job-{job.jid} li.note")
    assert page.inner_text(f"#notes-job-{job.jid} .note-text") == MARKUP
    assert page.locator(f"#notes-job-{job.jid} img").count() == 0
    assert MARKUP in page.inner_text("#job-timeline")
    assert page.title() != "owned"
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    marker = page.locator(f"#job-row-{job.jid} .note-marker")
    assert marker.get_attribute("title") == f"grace: {MARKUP}"
    marker.hover()
    shot(page, "jobs-note-marker")

    page.goto(f"{live_server.url}/batches/{job.bid}/")
    page.fill(f"#note-new-batch-{job.bid}", "depositor re-sends on Friday")
    page.click(f"#note-add-batch-{job.bid}")
    page.wait_for_selector(f"#notes-batch-{job.bid} li.note")
    page.goto(f"{live_server.url}/batches/")
    batch_marker = page.locator(f"#batch-row-{job.bid} .note-marker")
    assert batch_marker.get_attribute("title") == "grace: depositor re-sends on Friday"

    locks.collection_hold_set(zk, "letters")
    page.goto(f"{live_server.url}/holds/")
    page.click("#collection-notes-letters summary")
    page.fill("#note-new-collection-letters", "node 9 replaced; hold until Monday")
    page.click("#note-add-collection-letters")
    page.wait_for_selector("#collection-letters .note-marker")
    assert "node 9 replaced" in page.locator("#collection-letters .note-marker").get_attribute(
        "title"
    )
    shot(page, "holds-collection-note")
    assert page.title() != "owned"


def test_notes_and_the_resume_choice_fit_a_phone_in_dark_mode(
    browser, live_server, make_user, make_job
):
    make_user("operator", "grace")
    with logged_in(
        browser, live_server.url, "grace", PASSWORD, viewport=PHONE, color_scheme="dark"
    ) as page:
        job = make_job("Failed", failed_at="Storing")
        page.goto(f"{live_server.url}/jobs/{job.jid}/")
        page.fill(f"#note-new-job-{job.jid}", "a long note " * 40)
        page.click(f"#note-add-job-{job.jid}")
        page.wait_for_selector(f"#notes-job-{job.jid} li.note")
        for selector in ("#resume-to", f"#notes-job-{job.jid} li.note", f"#note-new-job-{job.jid}"):
            box = page.locator(selector).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, selector
        shot(page, "job-notes-phone-dark")
