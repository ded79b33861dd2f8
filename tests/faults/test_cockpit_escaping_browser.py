"""In a real Chromium: markup and script in a failure message, a hold reason and a summary mail
are shown as text in the places issue 15 added (the long-message cell, earlier failures, the
timeline, the report's reasons, the holds page, the batch's mails) and never run."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues.operator import actions
from queues.steps import notify
from queues.zk import batches, jobs
from queues.zk.records import Job
from tests.browser import close_context, log_in, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCRIPT = "<img src=x onerror=alert(1)><script>alert(2)</script>"
# Longer than a list shows whole, with markup at both ends of it.
MESSAGE = SCRIPT + " downloading failed " + "x" * 150 + " " + SCRIPT


def test_hostile_messages_reasons_and_mails_stay_text(
    browser, live_server, make_user, zk: KazooClient, settings, tmp_path, hostile_job: Job
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path / "mail"
    admin = make_user("admin", "escaper2")
    job = jobs.job_create(
        zk,
        bid=hostile_job.bid,
        configuration={"profile": "hostile_collection", "payload_url": "https://example.org/y"},
    )
    job = jobs.job_transition(zk, job, "Estimating")
    job = jobs.job_transition(zk, job, "Failed", message=MESSAGE)
    # Resumed (the hostile message goes to the audit log), then failed again with it.
    actions.perform(user=admin, kind="job", action="resume", item_id=job.jid, reason=SCRIPT)
    job = jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Failed", message=MESSAGE)
    batch = batches.batch_load(zk, hostile_job.bid)
    batches.batch_write_report(zk, batch, failed=[job.jid, hostile_job.jid], successful=[])
    actions.perform(user=admin, kind="queue", action="hold", item_id="ingest", reason=SCRIPT)
    notify.send(["dpr@example.org"], f"Merritt batch {batch.bid} failed: {SCRIPT}", SCRIPT)

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, "escaper2", PASSWORD)

    for url in (
        "/jobs/?state=Failed",
        "/failed/",
        f"/jobs/{job.jid}/",
        "/reports/",
        "/holds/",
        f"/batches/{batch.bid}/",
        f"/search/?q={SCRIPT}",
    ):
        page.goto(f"{live_server.url}{url}")
        page.wait_for_load_state("networkidle")
        for summary in page.locator("details.msg > summary").all():
            summary.click()  # the whole message, opened
        assert page.locator("img[src=x], script:not([src])").count() == 0, url
    assert dialogs == []

    page.goto(f"{live_server.url}/jobs/{job.jid}/")
    assert SCRIPT in page.inner_text("#earlier-failures")
    assert SCRIPT in page.inner_text("#job-timeline")
    page.goto(f"{live_server.url}/batches/{batch.bid}/")
    assert SCRIPT in page.inner_text("#batch-mails")
    page.goto(f"{live_server.url}/holds/")
    assert SCRIPT in page.inner_text("#queue-reason-ingest")
    shot(page, "cockpit-hostile-holds")
    close_context(context)
