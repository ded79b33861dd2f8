"""In a real Chromium: script and markup in submitter, title and file name are shown as text on
every page and never run."""

from __future__ import annotations

import pytest

from queues.zk.records import Job
from tests.browser import close_context, log_in

from .conftest import HOSTILE, PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_hostile_text_is_shown_and_never_runs(browser, live_server, make_user, hostile_job: Job):
    make_user("admin", "escaper")
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, "escaper", PASSWORD)

    job_page = f"{live_server.url}/jobs/{hostile_job.jid}/"
    for url in (
        job_page,
        f"{live_server.url}/batches/{hostile_job.bid}/",
        f"{live_server.url}/jobs/?state=Failed",
        f"{live_server.url}/failed/",
        f"{live_server.url}/batches/",
        f"{live_server.url}/",
    ):
        page.goto(url)
        page.wait_for_load_state("networkidle")
        assert page.locator("img[src=x], svg[onload]").count() == 0, url
    assert dialogs == []

    page.goto(job_page)
    text = page.locator("body").inner_text()
    assert HOSTILE["submitter"] in text
    assert HOSTILE["filename"] in text
    close_context(context)
