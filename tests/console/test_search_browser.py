"""The search in a real Chromium (issue 25): typed into the header box in any case, narrowed by
field and date range in the results' form, paged by kind, a single exact match opening the
item, and a depositor's markup shown as text; on a phone too."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.console import search
from queues.zk import batches, jobs
from tests.browser import PHONE, logged_in, shot

from .conftest import PASSWORD, PROFILE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCRIPT = "<img src=x onerror=alert(1)><script>alert(2)</script>"


def _job(zk: KazooClient, title: str, *, ark: str = "", failed: str = "") -> Any:
    batch = batches.batch_create(
        zk,
        submission={"profile": PROFILE, "submitter": "dpr/Ada Lovelace", "title": "Batch"},
    )
    job = jobs.job_create(
        zk,
        bid=batch.bid,
        configuration={"profile": PROFILE, "submitter": "dpr/Ada Lovelace", "title": title},
        identifiers={"primary_id": ark, "local_id": []},
    )
    if failed:
        job = jobs.job_transition(zk, job, "Estimating")
        job = jobs.job_transition(zk, job, "Failed", message=failed)
    return job


def test_search_from_the_header_narrow_page_and_open(
    browser: Any, live_server: Any, make_user: Any, zk: KazooClient, monkeypatch: Any
) -> None:
    monkeypatch.setattr(search, "PER_PAGE", 2)
    made = [_job(zk, f"Letters of Ada, volume {n}") for n in range(3)]
    hostile = _job(zk, f"Letters {SCRIPT}", failed=f"Letters: digest mismatch {SCRIPT}")
    unique = _job(zk, "Herbarium sheet", ark="ark:/13030/m5Unique1")
    # Both users made before any page is open: SQLite's shared cache refuses a write at once,
    # not after a wait, while the live server reads the same table for the first page.
    make_user("viewer", "phone-searcher")
    make_user("operator", "searcher")
    with logged_in(browser, live_server.url, "searcher", PASSWORD) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

        # From the header, a part of a title in another case: the results, newest first, paged.
        page.keyboard.press("/")
        page.keyboard.type("LETTERS")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r".*/search/\?q=LETTERS$"))
        assert page.get_attribute("#search-jobs", "data-total") == "4"
        first = page.locator("#search-jobs .search-row").evaluate_all("rs => rs.map(r => r.id)")
        assert first == [f"search-row-{hostile.jid}", f"search-row-{made[2].jid}"]
        assert page.locator("img[src=x], script:not([src])").count() == 0
        assert SCRIPT in page.inner_text(f"#search-row-{hostile.jid}")
        shot(page, "search-results")
        page.click("#search-jobs a[rel=next]")
        page.wait_for_url(re.compile(r".*page_jobs=2.*"))
        second = page.locator("#search-jobs .search-row").evaluate_all("rs => rs.map(r => r.id)")
        assert second == [f"search-row-{made[1].jid}", f"search-row-{made[0].jid}"]

        # Narrowed to error text: only the failed job; a range long ago: nothing.
        page.select_option("#search-field", "error")
        page.click("#search-form button[type=submit]")
        page.wait_for_url(re.compile(r".*field=error.*"))
        assert page.get_attribute("#search-jobs", "data-total") == "1"
        page.select_option("#search-field", "")
        long_ago = date.today() - timedelta(days=400)
        page.fill("#search-since", long_ago.isoformat())
        page.fill("#search-until", long_ago.isoformat())
        page.click("#search-form button[type=submit]")
        page.wait_for_url(re.compile(r".*until=.*"))
        assert page.get_attribute("#search-jobs", "data-total") == "0"
        assert page.input_value("#search-until") == long_ago.isoformat()

        # One exact match (an ARK typed in upper case): the job's own page.
        page.keyboard.press("Escape")
        page.fill("#header-q", "ARK:/13030/M5UNIQUE1")
        page.press("#header-q", "Enter")
        page.wait_for_url(re.compile(rf".*/jobs/{unique.jid}/$"))

        # Refused input: the reason beside the form.
        page.goto(f"{live_server.url}/search/?q=letters&since=yesterday")
        assert "is not a day" in page.inner_text("#search-error")
        assert dialogs == []

    # On a phone, in the dark: the results still read.
    with logged_in(browser, live_server.url, "phone-searcher", PASSWORD, viewport=PHONE) as phone:
        phone.emulate_media(color_scheme="dark")
        phone.goto(f"{live_server.url}/search/?q=letters")
        assert phone.locator("#search-jobs .search-row").count() == 2
        shot(phone, "search-results-phone-dark")
