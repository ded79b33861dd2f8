"""Issue 15 in a real Chromium: each defect an operator hit in the walk-through, and each new
page feature, clicked through as a person would, with a screenshot of each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queues.operator.audit import AuditEntry
from queues.steps import notify
from queues.zk import batches, jobs, locks
from tests.browser import logged_in, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG = (
    "downloading: 1 of 1 downloads failed: https://depositor.example.org/collections/letters/"
    "2026/volume-0007/scans/page-0001.tif: after 3 attempts over 41 s the server kept answering "
    "with a body whose digest does not match the manifest: expected sha256 0f3c…, got 9ab1… "
    "HTTP 404 at the end"
)


@pytest.fixture
def admin_page(browser, live_server, make_user):
    make_user("admin", "adam")
    with logged_in(browser, live_server.url, "adam", PASSWORD) as page:
        yield page


def test_batch_page_checkboxes_act_on_the_ticked_jobs(
    operator_page, live_server, zk, make_batch, make_job
):
    page = operator_page
    batch = make_batch()
    first, second = (make_job("Failed", batch=batch) for _ in range(2))
    page.goto(f"{live_server.url}/batches/{batch.bid}/")
    page.check(f"#job-row-{first.jid} input[type=checkbox]")
    page.select_option("#bulk-action", "resume")
    shot(page, "cockpit-batch-ticked")
    page.click("#bulk-apply")
    page.wait_for_selector("#bulk-summary")
    assert "1 done, 0 skipped" in page.inner_text("#bulk-summary")
    assert jobs.job_load(zk, first.jid).state == "Downloading"
    assert jobs.job_load(zk, second.jid).state == "Failed"


def test_resume_the_failed_jobs_of_a_batch_with_a_preview(
    operator_page, live_server, zk, make_batch, make_job
):
    page = operator_page
    batch = make_batch()
    failed = [make_job("Failed", batch=batch, message=f"HTTP 404 on file {n}") for n in range(3)]
    other = make_job("Failed")  # another batch's: untouched
    page.goto(f"{live_server.url}/batches/{batch.bid}/")
    page.click("#resume-batch-failed-button")
    page.wait_for_selector("#bulk-confirm")
    counts = page.inner_text("#bulk-preview-counts")
    assert "3 jobs match the filter now: 3 Failed" in counts
    assert page.locator("#bulk-preview-rows tbody tr").count() == 3
    assert "HTTP 404 on file 0" in page.inner_text("#bulk-preview-rows")
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in failed)  # not yet
    shot(page, "cockpit-batch-resume-preview")
    page.click("#confirm-button")
    page.wait_for_selector("#bulk-summary")
    assert "3 done, 0 skipped" in page.inner_text("#bulk-summary")
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in failed)
    assert jobs.job_load(zk, other.jid).state == "Failed"
    shot(page, "cockpit-batch-resumed")


def test_a_resumed_job_keeps_its_failure_path_and_timeline(
    operator_page, live_server, zk, make_job
):
    page = operator_page
    job = make_job("Failed", failed_at="Downloading", message="digest mismatch on a.pdf")
    page.goto(f"{live_server.url}/jobs/{job.jid}/")
    # On a Failed job only the operator moves out of Failed are drawn (dashed).
    assert page.locator("#job-body svg .edge-admin").count() >= 1
    titles = page.locator("#job-body svg .edge-admin title").all_text_contents()
    assert titles and all(t.startswith("Failed →") for t in titles)
    page.click("#job-actions button:has-text('Resume')")
    page.wait_for_selector("#job-panel[data-state='Downloading']")
    failures = page.inner_text("#earlier-failures")
    assert "digest mismatch on a.pdf" in failures and "olga" in failures
    path = page.inner_text("#job-path")
    assert "4. Downloading" in path and "5. Failed" in path and "6. Downloading" in path
    # The Downloading box carries both its visits.
    assert page.text_content("#node-jobpath-Downloading .step-number") == "4,6"
    timeline = page.locator("#job-timeline li").all_inner_texts()
    assert timeline[0].split(" ", 3)[3].startswith("Created")  # after "date time zone"
    assert any("resume: Failed → Downloading" in t and "olga" in t for t in timeline)
    assert "Entered Downloading" in timeline[-1]
    shot(page, "cockpit-job-resumed-history")


def test_long_failure_messages_show_their_end_and_the_whole_on_demand(
    operator_page, live_server, make_job
):
    page = operator_page
    job = make_job("Failed", message=LONG)
    page.goto(f"{live_server.url}/jobs/?state=Failed")
    cell = page.locator(f"#job-row-{job.jid} details.msg")
    summary = cell.locator("summary").inner_text()
    assert "HTTP 404 at the end" in summary and summary.startswith("downloading: 1 of 1")
    assert not cell.locator(".msg-full").is_visible()
    shot(page, "cockpit-long-message-closed")
    cell.locator("summary").click()
    assert cell.locator(".msg-full").is_visible()
    assert cell.locator(".msg-full").inner_text() == LONG
    shot(page, "cockpit-long-message-open")


def test_holding_the_ingest_queue_asks_for_a_reason_after_a_preview(
    admin_page, live_server, zk, make_job, make_batch
):
    page = admin_page
    make_job("Pending")
    held_job = make_job("Held", profile="letters")
    batch = make_batch(profile="letters")
    batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Held")
    page.goto(f"{live_server.url}/holds/")
    assert "1 held batch" in page.inner_text("#held-batches")
    assert "1 held job" in page.inner_text("#held-jobs")
    shot(page, "cockpit-holds-lists")
    page.click("#queue-ingest a:has-text('Hold ingest')")
    page.wait_for_selector("#queue-hold-confirm")
    assert "1 job waiting" in page.inner_text("#queue-hold-preview")
    page.click("#confirm-button")  # no reason: the browser refuses to send it
    assert not locks.queue_held(zk, "ingest")
    page.fill("#id_reason", "storage maintenance until noon")
    shot(page, "cockpit-queue-hold-confirm")
    page.click("#confirm-button")
    page.wait_for_url(re.compile(r".*/holds/$"))
    assert locks.queue_held(zk, "ingest")
    assert "storage maintenance until noon" in page.inner_text("#queue-reason-ingest")
    page.click(f"#held-jobs a:has-text('{held_job.jid}')")
    page.wait_for_url(re.compile(rf".*/jobs/{held_job.jid}/$"))
    shot(page, "cockpit-queue-held")


def test_after_holding_a_collection_its_held_items_are_one_click_away(
    operator_page, live_server, zk, make_job
):
    page = operator_page
    make_job("Held", profile="maps")
    page.goto(f"{live_server.url}/holds/")
    page.fill("#hold-profile", "maps")
    page.fill("#hold-reason", "re-cataloguing")
    page.click("#hold-collection")
    page.wait_for_selector("#just-held")
    shot(page, "cockpit-collection-just-held")
    page.click("#just-held a:has-text('its held jobs')")
    page.wait_for_url(re.compile(r".*/jobs/\?state=Held&profile=maps$"))
    assert page.locator("#job-table tbody tr[data-state=Held]").count() == 1
    assert AuditEntry.objects.get(kind="collection", action="hold").reason == "re-cataloguing"


def test_unknown_pages_are_styled_and_the_navigation_is_complete(operator_page, live_server):
    page = operator_page
    for url in ("/batches/bogus/", "/no/such/page/"):
        response = page.goto(f"{live_server.url}{url}")
        assert response.status == 404
        assert page.locator("#error-page h1").inner_text() == "Not found"
        # The console's stylesheet applies: the header is laid out as a flex row.
        assert page.eval_on_selector("header.top", "e => getComputedStyle(e).display") == "flex"
    shot(page, "cockpit-404")
    nav = page.locator("nav[aria-label=Main]")
    nav.locator("a:has-text('Bulk runs')").click()
    page.wait_for_url(re.compile(r".*/bulk/$"))
    page.locator("nav[aria-label=Main] a:has-text('Tokens')").click()
    page.wait_for_url(re.compile(r".*/tokens/$"))


def test_header_search_with_the_slash_shortcut(operator_page, live_server, make_job):
    page = operator_page
    job = make_job("Failed")
    page.goto(f"{live_server.url}/failed/")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "header-q"
    page.keyboard.type(job.jid)
    shot(page, "cockpit-search")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf".*/jobs/{job.jid}/$"))
    # An ARK two jobs carry lists them both.
    other = make_job("Pending")
    page.keyboard.press("/")
    page.keyboard.type("ark:/99999/fk4test")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/search/\?q=ark.*"))
    assert page.locator(f"#search-row-{job.jid}, #search-row-{other.jid}").count() == 2
    # Typing "/" into a field is typing, not the shortcut.
    page.fill("#search-q", "")
    page.focus("#search-q")
    page.keyboard.type("a/b")
    assert page.input_value("#search-q") == "a/b"


def test_the_overview_can_hide_operator_moves_and_remembers_it(
    operator_page, live_server, make_job
):
    page = operator_page
    make_job("Failed")
    page.goto(f"{live_server.url}/")
    edge = "#overview-live svg .edge-admin"
    assert page.eval_on_selector(edge, "e => getComputedStyle(e).display") != "none"
    page.uncheck("#toggle-admin-moves")
    assert page.eval_on_selector(edge, "e => getComputedStyle(e).display") == "none"
    shot(page, "cockpit-overview-admin-moves-hidden")
    page.reload()
    assert not page.is_checked("#toggle-admin-moves")
    assert page.eval_on_selector(edge, "e => getComputedStyle(e).display") == "none"
    page.check("#toggle-admin-moves")
    assert page.eval_on_selector(edge, "e => getComputedStyle(e).display") != "none"


def test_reports_show_reasons_collapse_and_export(
    operator_page, live_server, zk, make_batch, make_job
):
    page = operator_page
    batch = make_batch()
    failed = [make_job("Failed", batch=batch, message="digest mismatch") for _ in range(2)]
    odd = make_job("Failed", batch=batch, message="HTTP 404")
    batches.batch_write_report(
        zk,
        batches.batch_load(zk, batch.bid),
        failed=[*(j.jid for j in failed), odd.jid],
        successful=[],
    )
    page.goto(f"{live_server.url}/reports/")
    reasons = page.locator(f"#reasons-{batch.bid} tbody tr").all_inner_texts()
    assert reasons[0].startswith("digest mismatch\t2") and reasons[1].startswith("HTTP 404\t1")
    shot(page, "cockpit-reports")
    section = page.locator(f"#report-{batch.bid} details.report-batch")
    section.locator("> summary").click()
    assert not page.locator(f"#reasons-{batch.bid}").is_visible()
    section.locator("> summary").click()
    with page.expect_download() as info:
        page.click(f"#report-{batch.bid} a.export-csv")
    text = Path(info.value.path()).read_text(encoding="utf-8")
    assert text.startswith("batch,report,job,outcome,state_now,message")
    assert f"{odd.jid},failed,Failed,HTTP 404" in text


def test_the_batch_page_shows_the_summary_mail(
    operator_page, live_server, make_batch, settings, tmp_path
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path / "mail"
    page = operator_page
    batch = make_batch()
    subject = f"Merritt batch {batch.bid} completed: Letters (1/1 ok)"
    notify.send(["dpr@example.org"], subject, "Completed:\n  jid0000000001 <b>ok</b>\n")
    page.goto(f"{live_server.url}/batches/{batch.bid}/")
    mails = page.inner_text("#batch-mails")
    assert subject in mails and "jid0000000001 <b>ok</b>" in mails
    assert page.locator("#batch-mails b").count() == 0
    page.locator("#batch-mails").scroll_into_view_if_needed()
    shot(page, "cockpit-batch-mail")
