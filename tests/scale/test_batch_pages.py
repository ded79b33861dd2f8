"""The batch list, /api/batches and the batch page cost what they show (issue 27): no listing
of every batch's jobs per request, the same requests at ten times the jobs, and an index grown
under a running console as cheap as a fresh one. And the list shows each batch's own batchID
(Merritt's ``bid-…``)."""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from kazoo.client import KazooClient

from bench.loader import bulk_load
from queues.console import batch_reads, job_reads
from queues.core.states import BATCH_INDEX_FOLDERS, JobState
from queues.zk import index as zindex
from queues.zk import jobs, paths
from queues.zk.batches import batch_create
from tests.zkcount import clock_sample

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr id="batch-row-(bid[0-9]{10})"')
BATCHES = 60  # more than a page (job_reads.PER_PAGE)


@pytest.fixture
def viewer(db: Any, zk: KazooClient) -> Client:
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("batch-viewer", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def token_headers(db: Any) -> dict[str, str]:
    from queues.operator.audit import ApiToken

    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("batch-api", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    _token, key = ApiToken.issue(user=user, name="batch-pages")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def fresh_index() -> Any:
    zindex.reset()
    yield
    zindex.reset()


def requests_during(zk: KazooClient, action: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """``action()``'s result and the requests it queued on ``zk``: per kind, and per folder
    listed ("listed <path>")."""
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        if clock_sample(zk, request):
            return original(request, async_object)
        kind = type(request).__name__
        calls["GetChildren" if kind.startswith(("GetChildren", "_Raw")) else kind] += 1
        if kind.startswith(("GetChildren", "_Raw")):
            calls[f"listed {zk.unchroot(request.path)}"] += 1
        return original(request, async_object)

    zk._call = counting
    try:
        return action(), calls
    finally:
        zk._call = original


def true_counts(zk: KazooClient, bid: str) -> tuple[dict[str, int], dict[str, int]]:
    """A batch's row counts read straight from ZooKeeper: its folders, and each job's state."""
    folders = {f: zk.get_children(paths.batch_index(bid, f)) for f in BATCH_INDEX_FOLDERS}
    states: Counter[str] = Counter()
    for folder, jids in folders.items():
        if folder != "batch-deleted":
            states.update(jobs.job_load(zk, j).state for j in jids)
    return {f: len(v) for f, v in folders.items()}, dict(states)


def view_requests(zk: KazooClient, viewer: Client, token_headers: dict[str, str]) -> dict:
    """The requests of the batch list and /api/batches, each asked twice (the second warm)."""
    found = {}
    for name, ask in (
        ("list", lambda: viewer.get(reverse("batches"))),
        ("api", lambda: Client().get("/api/batches", **token_headers)),
    ):
        ask()
        answer, calls = requests_during(zk, ask)
        assert answer.status_code == 200
        found[name] = calls
    return found


def test_the_batch_list_counts_jobs_from_the_index_without_listing_every_batch(
    zk: KazooClient, viewer: Client, token_headers: dict[str, str], fresh_index: Any
) -> None:
    bulk_load(zk, batches=BATCHES, jobs=BATCHES * 2, seed=3)
    small = view_requests(zk, viewer, token_headers)

    # Ten times the jobs a batch, loaded while the console's index watches: the newest page is
    # all new batches.
    grown = bulk_load(zk, batches=BATCHES, jobs=BATCHES * 20, seed=4)
    large = view_requests(zk, viewer, token_headers)
    for view in ("list", "api"):
        # Warm: no listing at all, so nothing proportional to the jobs shown or the queue.
        assert small[view]["GetChildren"] == 0, small[view]
        assert large[view] == small[view], (view, small[view], large[view])

    # The counts are the batches' real ones.
    page = batch_reads.batches_page(flt=batch_reads.BatchFilter())
    assert [r.bid for r in page.items] == list(reversed(grown.batches))[: job_reads.PER_PAGE]
    for row in page.items[:5]:
        assert (row.folders, row.states) == true_counts(zk, row.bid)

    # An index grown under a running console answers as a fresh one does, at the same cost.
    rows = [(r.bid, r.folders, r.states) for r in page.items]
    zindex.reset()
    fresh = view_requests(zk, viewer, token_headers)
    assert fresh == large
    again = batch_reads.batches_page(flt=batch_reads.BatchFilter())
    assert [(r.bid, r.folders, r.states) for r in again.items] == rows


def test_a_move_changes_the_row_of_its_batch_only(
    zk: KazooClient, other_zk: KazooClient, viewer: Client, fresh_index: Any
) -> None:
    loaded = bulk_load(zk, batches=8, jobs=80, distribution={JobState.PENDING: 1.0})
    batch_reads.batches_page(flt=batch_reads.BatchFilter())  # warm
    jid = loaded.jobs_by_state[JobState.PENDING][-1]
    job = jobs.job_transition(other_zk, jobs.job_load(other_zk, jid), JobState.ESTIMATING)
    # The move was made on another session: its watch events reach this one's connection before
    # the answer to any request this one sends after the move (one server), and ``settle`` waits
    # for kazoo to have run them. Without the round trip a loaded machine read the page first
    # (a whole run, once: Pending 10).
    zk.sync("/")
    zindex.for_client(zk).settle()
    page, calls = requests_during(
        zk, lambda: batch_reads.batches_page(flt=batch_reads.BatchFilter())
    )
    row = next(r for r in page.items if r.bid == job.bid)
    assert row.states == {JobState.PENDING: 9, JobState.ESTIMATING: 1}
    assert (row.folders, row.states) == true_counts(zk, job.bid)
    # The state folders the move changed are listed again; no batch's own folders are (the
    # job stayed in its batch's batch-processing).
    listed = {k.removeprefix("listed ") for k in calls if k.startswith("listed ")}
    assert listed == {
        paths.job_state_folder(JobState.PENDING),
        paths.job_state_folder(JobState.ESTIMATING),
    }


def test_the_batch_page_reads_its_own_jobs_not_the_queue(
    zk: KazooClient, viewer: Client, fresh_index: Any
) -> None:
    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    for _ in range(5):
        jobs.job_create(zk, bid=batch.bid, configuration={"profile": "p", "submitter": "s"})
    url = reverse("batch", args=[batch.bid])
    viewer.get(url)
    _answer, small = requests_during(zk, lambda: viewer.get(url))
    bulk_load(zk, batches=20, jobs=2000, seed=5)
    viewer.get(url)
    answer, large = requests_during(zk, lambda: viewer.get(url))
    assert answer.status_code == 200 and answer.content.decode().count("jid") >= 5
    assert large == small
    # Its own index folders at most; never a state folder's whole listing.
    listed = {k.removeprefix("listed ") for k in small if k.startswith("listed ")}
    assert listed <= {paths.batch_index(batch.bid, f) for f in BATCH_INDEX_FOLDERS}, small


def test_the_batch_list_shows_each_batch_s_batch_id(
    zk: KazooClient, viewer: Client, token_headers: dict[str, str]
) -> None:
    merritt = batch_create(
        zk, submission={"batchID": "bid-8f14e45f-ceea-467a-9af0-1c2b3d4e5f60", "profile": "p"}
    )
    html = viewer.get(reverse("batches")).content.decode()
    assert ROW.findall(html) == [merritt.bid]
    assert "bid-8f14e45f-ceea-467a-9af0-1c2b3d4e5f60" in html
    api = Client().get("/api/batches", **token_headers).json()
    assert api["items"][0]["uuid"] == "bid-8f14e45f-ceea-467a-9af0-1c2b3d4e5f60"


def test_the_batch_page_shows_a_page_of_rows_per_state_and_links_the_rest(
    zk: KazooClient, viewer: Client, fresh_index: Any
) -> None:
    from queues.views.batches import BATCH_ROWS_PER_STATE

    loaded = bulk_load(
        zk, batches=1, jobs=BATCH_ROWS_PER_STATE + 15, distribution={JobState.PENDING: 1.0}
    )
    bid = loaded.batches[0]
    html = viewer.get(reverse("batch", args=[bid])).content.decode()
    rows = re.findall(r'<tr id="job-row-(jid[0-9]{10})"', html)
    assert len(rows) == BATCH_ROWS_PER_STATE
    assert set(rows) <= set(loaded.jobs_by_state[JobState.PENDING])
    more = re.search(r'id="batch-jobs-Pending-more">(.*?)</span>', html)
    assert more is not None
    assert f"all {BATCH_ROWS_PER_STATE + 15} in the job list" in more.group(1)
    assert f"state=Pending&amp;bid={bid}" in more.group(1)
