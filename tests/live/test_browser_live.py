"""The live console in a real Chromium against daphne: pages follow ZooKeeper without reloads.

pytest-django's live_server speaks WSGI only (no websockets), so the console runs under daphne
in a subprocess, on its own SQLite file and on the test's ZooKeeper chroot; the test moves jobs
with a separate ZooKeeper client, as another consumer or Merritt's Java ingest would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.zk import jobs
from queues.zk.records import Batch, Job
from tests.browser import log_in, shot

from .conftest import console_env, daphne

pytestmark = [pytest.mark.live_server, pytest.mark.browser, pytest.mark.slow]

USER, PASSWORD = "ada", "a-long-test-password-1"
# The deadline of each wait for a condition, not a wait: a run of four workers on two busy cores
# took more than 20 s for a move to reach a page once (it passes alone in seconds).
WAIT_MS = 60_000


@pytest.fixture
def console_url(zk_hosts: str, tmp_path: Path) -> Iterator[str]:
    """The console under daphne on a free port, with a user ``ada`` in a fresh database."""
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD)
    with daphne(env, tmp_path / "daphne.log") as url:
        yield url


@pytest.fixture
def context(browser: Any, console_url: str) -> Iterator[Any]:
    """A logged-in browser context (its pages share the session cookie, like tabs)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    log_in(page, console_url, USER, PASSWORD)
    page.close()
    yield context
    context.close()


def open_live(context: Any, url: str) -> Any:
    """A new tab on ``url``, once the server watches all it shows; marked to detect a reload.

    Not at "live": the page says it before its subscription reaches the server, and a move made
    in that moment was never heard of (a whole run on four busy workers failed so, once).
    """
    page = context.new_page()
    page.goto(url)
    # A predicate as a function: Playwright would eval() a bare expression, which the
    # console's Content-Security-Policy forbids.
    page.wait_for_function("() => window.mrtLive && window.mrtLive.following()")
    page.evaluate("window.__notReloaded = true")
    return page


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("window.__notReloaded === true"))


def test_overview_and_batch_page_follow_moves_made_elsewhere(
    context: Any,
    console_url: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    queued = [make_job(batch) for _ in range(3)]
    overview = open_live(context, f"{console_url}/")
    batch_page = open_live(context, f"{console_url}/batches/{batch.bid}/")
    assert (overview.text_content("#count-job-Pending") or "").startswith("3 ")
    for job in queued:
        assert batch_page.get_attribute(f"#job-row-{job.jid}", "data-state") == "Pending"

    failed = [jobs.job_transition(other_zk, j, "Failed", admin=True) for j in queued[:2]]
    jobs.job_transition(other_zk, queued[2], "Estimating")

    overview.wait_for_function(
        "() => document.querySelector('#count-job-Failed')?.textContent.startsWith('2 ')"
    )
    overview.wait_for_function(
        "() => document.querySelector('#count-job-Estimating')?.textContent.startsWith('1 ')"
    )
    for job in failed:
        batch_page.wait_for_selector(f"#batch-jobs-Failed #job-row-{job.jid}[data-state=Failed]")
    # Its state's list is a closed <details>: the row is there, not shown.
    batch_page.wait_for_selector(
        f"#job-row-{queued[2].jid}[data-state=Estimating]", state="attached"
    )
    assert not_reloaded(overview) and not_reloaded(batch_page)
    shot(overview, "live-overview")
    shot(batch_page, "live-batch")


def test_a_ticked_row_holds_the_update_until_the_operator_is_done(
    context: Any,
    console_url: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    mine, theirs = make_job(batch), make_job(batch)
    page = open_live(context, f"{console_url}/batches/{batch.bid}/")
    page.check(f"#job-row-{mine.jid} input[type=checkbox]")

    jobs.job_transition(other_zk, theirs, "Estimating")
    # The page was told (the socket message arrives) but keeps the operator's selection.
    page.wait_for_function("() => window.mrtLive.pending() > 0")
    assert page.is_checked(f"#job-row-{mine.jid} input[type=checkbox]")
    assert page.get_attribute(f"#job-row-{theirs.jid}", "data-state") == "Pending"
    # ... and says that what it shows is held back, and why.
    assert page.get_attribute("#batch-live", "data-live-paused") == "rows are ticked"
    note = page.evaluate(
        "getComputedStyle(document.getElementById('batch-live'), '::before').content"
    )
    assert "Live updates paused while rows are ticked." in note
    assert page.text_content("#live-status") == "live · updates paused"
    shot(page, "live-batch-selection-kept")

    page.uncheck(f"#job-row-{mine.jid} input[type=checkbox]")
    page.wait_for_selector(f"#job-row-{theirs.jid}[data-state=Estimating]", state="attached")
    assert page.get_attribute("#batch-live", "data-live-paused") is None
    assert page.text_content("#live-status") == "live"
    assert not_reloaded(page)
