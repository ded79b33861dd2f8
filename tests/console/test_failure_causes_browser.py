"""In Chromium, as an operator would: from the failed list to its "by cause" grouping, a
cause's group with its count, batches, collections and newest message (markup shown as text),
and its resume previewed by the bulk confirmation before it resumes exactly that group."""

from __future__ import annotations

import pytest

from queues.zk import jobs
from tests.browser import logged_in, shot

from .conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page(browser, live_server, make_user):
    make_user("operator", "ada")
    with logged_in(browser, live_server.url, "ada", PASSWORD) as page:
        yield page


def test_an_operator_resumes_one_cause_from_the_failed_page(
    page, live_server, zk, make_job, make_batch
):
    depositor = make_batch(profile="letters")
    down = [
        make_job(
            "Failed",
            batch=depositor,
            profile="letters",
            message=f"Downloading: could not fetch https://depositor.example.org/f{i}.zip: "
            f"HTTP 503 after {i + 2} tries",
        )
        for i in range(3)
    ]
    marked = make_job(
        "Failed",
        failed_at="Storing",
        message="Storing: node 9501 said <script>document.title='owned'</script>",
    )
    page.goto(f"{live_server.url}/failed/")
    page.click("#group-by-cause")
    page.wait_for_selector(".failed-cause")
    groups = page.locator(".failed-cause")
    assert groups.count() == 2
    top = groups.first
    assert top.get_attribute("data-count") == "3"
    assert "could not fetch <url>: HTTP <n> after <n> tries" in top.inner_text()
    assert depositor.bid in top.locator(".cause-batches").inner_text()
    assert top.locator(".cause-collections").inner_text() == "letters"
    assert down[2].jid in top.locator(".cause-sample").inner_text()
    other = groups.nth(1).locator(".cause-sample").inner_text()
    assert "<script>document.title='owned'</script>" in other
    assert page.title() != "owned"
    shot(page, "failed-by-cause")

    top.locator("button.cause-resume").click()
    page.wait_for_selector("#bulk-confirm")
    assert "3 Failed" in page.inner_text("#bulk-preview-counts")
    preview = page.inner_text("#bulk-preview-rows")
    assert all(j.jid in preview for j in down) and marked.jid not in preview
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in down)
    shot(page, "failed-by-cause-resume-preview")
    page.click("#confirm-button")
    page.wait_for_selector("text=3 done, 0 skipped")
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in down)
    assert jobs.job_load(zk, marked.jid).state == "Failed"
