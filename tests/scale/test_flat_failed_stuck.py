"""The failed and stuck views, and the batch list's title filter, cost what they show: the same
ZooKeeper requests and the same work in the web process for a queue ten times larger (counted,
not timed), and /stuck/ answers at once after a start, saying what is still loading.

Work is counted as the lines of the project's own code a warm request runs (``sys.settrace``
on the request's thread): a pass over every Failed job or every working entry shows up as lines
per job, whatever the machine's speed. Each queue keeps the answer's size equal at both sizes
(batches of five jobs, so a page of groups and an opened batch show as many rows at 10N as at N).
"""

from __future__ import annotations

import io
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

import queues
from bench.loader import bulk_load
from queues.console import failed_reads
from queues.operator import stuck
from queues.zk import index as zindex
from queues.zk import packed, servertime
from tests.zkcount import clock_sample

pytestmark = pytest.mark.django_db

# Every line of the project's code (the package, not one module's folder: the package moved).
PROJECT = str(Path(queues.__file__).resolve().parent)
# But the health probe's: every page's banner starts a database probe when the last one is
# older than BANNER_FRESH s, so whether a request runs those lines depends on the clock, not on
# the view (a count 11 lines over in one run of the whole suite, on a busy machine).
CLOCKED = str(Path(queues.__file__).resolve().parent / "web" / "health.py")
QUEUE = {"Failed": 0.5, "Pending": 0.25, "Processing": 0.25}
JOBS_PER_BATCH = 5
ROW = re.compile(r'<tr id="batch-row-(bid[0-9]{10})"')
N = 600  # 300 Failed jobs in 60 batches: more groups than a page shows (50)
# Lines that may differ between the sizes: a bisection a level deeper, a different number of
# distinct keys looked at on the way to the answer.
SLACK = 1.15


def _work(zk: Any, action: Callable[[], Any]) -> tuple[Any, Counter[str], int]:
    """``action``'s answer, the ZooKeeper requests this thread sent for it (by type, and
    ``paths`` for every path they name), and the lines of project code it ran."""
    calls: Counter[str] = Counter()
    lines = [0]
    me = threading.current_thread()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        if clock_sample(zk, request):
            return original(request, async_object)
        if threading.current_thread() is me:
            calls[type(request).__name__] += 1
            calls["paths"] += len(getattr(request, "paths", None) or [1])
        return original(request, async_object)

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return local

    def trace(frame: FrameType, _event: str, _arg: Any) -> Any:
        name = frame.f_code.co_filename
        return local if name.startswith(PROJECT) and name != CLOCKED else None

    zk._call = counting
    sys.settrace(trace)
    try:
        answer = action()
    finally:
        sys.settrace(None)
        zk._call = original
    return answer, calls, lines[0]


@pytest.fixture
def viewer(db: Any, zk: Any) -> Client:
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("flat-viewer", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def token_headers(db: Any) -> dict[str, str]:
    from queues.operator.audit import ApiToken

    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("flat-api", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    _token, key = ApiToken.issue(user=user, name="flat")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def grown(zk: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], str]]:
    """A queue of N jobs; the fixture's value grows it to 10N (once) and counts the stuck
    jobs again (each view's first request warms the read index for it). Every working job is
    stuck (the setting at a millisecond): the stuck page shows a full page at both sizes."""
    settings.MRT_STUCK_SECONDS = 0.001
    monkeypatch.setattr(stuck, "CACHE_SECONDS", 3600.0)  # no recount in the background
    zindex.reset()
    stuck.reset()

    def load(jobs: int, seed: int) -> None:
        # Another seed for the second load: its batches get other UUIDs.
        bulk_load(zk, batches=jobs // JOBS_PER_BATCH, jobs=jobs, distribution=QUEUE, seed=seed)
        zindex.for_client(zk).settle()
        # Stuck is judged by the ZooKeeper server's clock, whose figure here trails the server
        # by up to a round trip (queues/zk/servertime.py): a sample taken after the load, and
        # the setting's millisecond past it, make every job loaded stuck.
        servertime.forget(zk)
        loaded = servertime.server_now(zk)
        while servertime.server_now(zk) < loaded + 2 * settings.MRT_STUCK_SECONDS:
            time.sleep(0.001)
        stuck.prime(zk)

    load(N, 1)
    sizes = iter([9 * N])

    def grow() -> str:
        load(next(sizes), 2)
        return "grown"

    yield grow
    zindex.reset()
    stuck.reset()


def _flat(measure: Callable[[], tuple[Counter[str], int]], grow: Callable[[], str]) -> None:
    """The requests and lines of ``measure`` (warm) at N and at 10N."""
    small_calls, small_lines = measure()
    grow()
    big_calls, big_lines = measure()
    assert big_calls == small_calls, (small_calls, big_calls)
    assert big_lines <= small_lines * SLACK, (small_lines, big_lines)


def _page(client: Client, url: str, headers: dict[str, str] | None = None) -> Any:
    response = client.get(url, **(headers or {}))
    assert response.status_code == 200, (url, response.status_code)
    return response


def test_api_failed_reads_and_works_the_same_for_ten_times_the_failed_jobs(
    zk, grown, token_headers
):
    client = Client()

    def measure() -> tuple[Counter[str], int]:
        _page(client, "/api/failed", token_headers)  # warm: what a change costs once
        response, calls, lines = _work(zk, lambda: _page(client, "/api/failed", token_headers))
        body = response.json()
        assert len(body["items"]) == failed_reads.FAILED_ROWS_PER_PAGE
        assert sum(body["groups"]["batch"].values()) == body["total"]
        return calls, lines

    _flat(measure, grown)
    assert Client().get("/api/failed", **token_headers).json()["total"] == 10 * N // 2


def test_one_failed_batch_opened_reads_and_works_the_same_for_ten_times_the_batches(
    zk, grown, viewer
):
    def measure() -> tuple[Counter[str], int]:
        # The last batch on the first page of groups (a full page at either size).
        bid = failed_reads.failed_jobs(group="batch").groups[-1].key
        url = f"{reverse('failed')}?group=batch&open={bid}"
        _page(viewer, url)
        response, calls, lines = _work(zk, lambda: _page(viewer, url))
        html = response.content.decode()
        assert html.count('<tr id="job-row-') == JOBS_PER_BATCH
        assert html.count('class="card failed-group"') == failed_reads.FAILED_GROUPS_PER_PAGE
        return calls, lines

    _flat(measure, grown)


@pytest.mark.parametrize("group", ["batch", "step"])
def test_the_failed_page_reads_and_works_the_same_for_ten_times_the_failed_jobs(
    zk, grown, viewer, group
):
    url = f"{reverse('failed')}?group={group}"

    def measure() -> tuple[Counter[str], int]:
        _page(viewer, url)
        response, calls, lines = _work(zk, lambda: _page(viewer, url))
        assert 'id="failed-summary"' in response.content.decode()
        return calls, lines

    _flat(measure, grown)


def test_the_stuck_page_reads_and_works_the_same_for_ten_times_the_working_jobs(zk, grown, viewer):
    def measure() -> tuple[Counter[str], int]:
        _page(viewer, reverse("stuck"))
        response, calls, lines = _work(zk, lambda: _page(viewer, reverse("stuck")))
        html = response.content.decode()
        assert html.count('<tr class="flagged">') == stuck.PAGE_SIZE
        assert 'id="index-loading"' not in html
        return calls, lines

    _flat(measure, grown)
    html = _page(viewer, reverse("stuck")).content.decode()
    assert f"{10 * N // 2} stuck jobs" in html


def test_the_stuck_page_says_what_is_still_loading_after_a_start_instead_of_waiting(
    zk, viewer, settings
):
    """While the read index fills after a start (held here at its first step), /stuck/
    answers at once with what is still loading, reading no job's time in the request; the
    stuck jobs are listed once their times are read."""
    settings.MRT_STUCK_SECONDS = 0.001
    zindex.reset()
    stuck.reset()
    result = bulk_load(zk, batches=20, jobs=200, distribution={"Pending": 1.0})
    idx = zindex.for_client(zk)
    release = threading.Event()
    filler = idx.start_fill(first=lambda: release.wait(30))
    try:
        assert _eventually(lambda: idx.filling)
        response, calls, _lines = _work(zk, lambda: _page(viewer, reverse("stuck")))
        html = response.content.decode()
        assert 'id="index-loading"' in html and "Still loading after a start" in html
        assert "stuck job" not in html.split('id="stuck-thresholds"')[0].split("</h1>")[1]
        # No entry's creation time, no lock read in the request: listing the consumers only.
        assert calls["ExistsRequest"] == 0 and calls["Exists"] == 0, calls
        assert calls["paths"] <= 2, calls
        # Counted meanwhile in the background: listed without waiting for the whole fill.
        listed = _eventually(
            lambda: (
                result.jobs_by_state["Pending"][0]
                in _page(viewer, reverse("stuck")).content.decode()
            ),
            timeout=30,
        )
        assert listed
    finally:
        release.set()
        filler.join(60)
    html = _page(viewer, reverse("stuck")).content.decode()
    assert 'id="index-loading"' not in html and "200 stuck jobs" in html
    zindex.reset()
    stuck.reset()


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_the_order_a_count_keeps_reaches_its_horizon_and_grows_with_the_same_listing() -> None:
    """Only entries that can be on the stuck page before the next count are kept in order; a
    later count of the same listing adds those that came within reach since, after the rest."""
    from array import array

    stuck.reset()
    entries = packed.Entries(array("q", range(10)))
    ctimes = array("d", [5.0, 1.0, 0.0, 9.0, 3.0, 7.0, 2.0, 8.0, 6.0, 4.0])  # 0.0: not read
    first = stuck._oldest_of("Pending", entries, ctimes, 5.0)
    assert (list(first.keys), list(first.ctimes)) == ([1, 6, 4, 9], [1.0, 2.0, 3.0, 4.0])
    with stuck._lock:
        stuck._oldest["Pending"] = first
    assert stuck._oldest_of("Pending", entries, ctimes, 4.0) is first
    later = stuck._oldest_of("Pending", entries, ctimes, 8.0)
    assert list(later.keys) == [1, 6, 4, 9, 0, 8, 5] and later.source is entries.keys
    other = packed.Entries(array("q", range(10)))  # listed anew: ordered afresh
    again = stuck._oldest_of("Pending", other, ctimes, 8.0)
    assert list(again.keys) == list(later.keys) and again.source is other.keys
    stuck.reset()


def test_one_failed_batch_filtered_first_time_works_the_same_for_ten_times_the_failed_jobs(
    zk, grown, viewer
):
    """A batch filter asked for the first time (the bench asks a new batch each request)
    takes the batch's own Failed jobs from the page's grouping, not a pass over every one:
    it ran 9.7 times as long at 1,000,000 jobs as at 1,000."""

    def measure() -> tuple[Counter[str], int]:
        _page(viewer, reverse("failed"))  # the page as an operator opens it first
        # The last batch of the groups (off the first page): not asked for before.
        bid = list(failed_reads.failed_group_counts()["batch"])[-1]
        url = f"{reverse('failed')}?bid={bid}"
        response, calls, lines = _work(zk, lambda: _page(viewer, url))
        assert response.content.decode().count('<tr id="job-row-') == JOBS_PER_BATCH
        return calls, lines

    _flat(measure, grown)


def test_a_batch_title_filter_asked_first_works_the_same_for_ten_times_the_batches(
    zk, grown, viewer
):
    """A title filter of the batch list asked for the first time (another asked before it, so
    the batches' submissions are read and prepared) finds the batches holding the text in
    the prepared titles, not by a pass over every batch: it ran twice as long at 1,000,000
    jobs (20,000 batches) as at 1,000 for the same answer of one batch."""
    idx = zindex.for_client(zk)

    def measure() -> tuple[Counter[str], int]:
        bids = idx.batch_ids()
        _page(viewer, f"{reverse('batches')}?q=Benchmark+batch+{bids[0][-6:]}")
        bid = bids[-1]  # the newest batch: not asked for before at either size
        url = f"{reverse('batches')}?q=Benchmark+batch+{bid[-6:]}"
        response, calls, lines = _work(zk, lambda: _page(viewer, url))
        assert ROW.findall(response.content.decode()) == [bid]
        return calls, lines

    _flat(measure, grown)
