"""Pages whose cost follows what they show: the grouped failed list, search through the read
index's maps, and an index that answers while it is still being filled after a start."""

from __future__ import annotations

import io
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from bench.loader import bulk_load
from queues.console import batch_reads, failed_reads, job_reads, selectors
from queues.core.states import JobState
from queues.operator import stuck
from queues.zk import index as zindex
from queues.zk.batches import batch_create
from queues.zk.codecs import decode_json
from queues.zk.errors import StillReading
from queues.zk.jobs import job_create, job_load, job_transition
from tests.jobnodes import set_job_nodes
from tests.zkcount import clock_sample

ROW = re.compile(r'<tr id="job-row-(jid[0-9]{10})"')
GROUP = re.compile(r'class="card failed-group"[^>]*data-key="([^"]+)" data-count="([0-9]+)"')


# A search or a batch filter also looks in the database for archived jobs.
pytestmark = pytest.mark.django_db


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.fixture
def viewer(db, zk) -> Client:
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("scale-viewer", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def loaded(zk):
    """600 jobs in 12 batches, half of them Failed (at several steps, in several collections)."""
    zindex.reset()
    result = bulk_load(zk, batches=12, jobs=600, distribution={"Failed": 0.5, "Completed": 0.5})
    yield result
    zindex.reset()


def _expected_groups(zk, jids: list[str]) -> dict[str, Counter[str]]:
    """What the groups must count, read straight from each job's nodes."""
    found: dict[str, Counter[str]] = {
        "batch": Counter(),
        "collection": Counter(),
        "step": Counter(),
    }
    for jid in jids:
        job = job_load(zk, jid)
        found["batch"][job.bid] += 1
        found["collection"][job.profile] += 1
        found["step"][job_reads.failing_step(job)] += 1
    return found


def test_failed_page_shows_groups_with_counts_and_a_bounded_number_of_rows(zk, viewer, loaded):
    failed = loaded.jobs_by_state["Failed"]
    assert len(failed) == 300 > failed_reads.FAILED_ROWS_PER_PAGE
    expected = _expected_groups(zk, failed)

    for group in ("batch", "collection", "step"):
        html = viewer.get(reverse("failed"), {"group": group}).content.decode()
        assert 'data-total="300"' in html
        groups = {key: int(count) for key, count in GROUP.findall(html)}
        assert groups == dict(expected[group]), group
        assert ROW.findall(html) == []  # rows only on demand

    # One group opened: a page of its rows, the next page the rest, nothing of other groups.
    bid, count = expected["batch"].most_common(1)[0]
    assert count > 0
    html = viewer.get(reverse("failed"), {"group": "batch", "open": bid}).content.decode()
    rows = ROW.findall(html)
    assert 0 < len(rows) <= failed_reads.FAILED_ROWS_PER_PAGE
    assert len(rows) == min(count, failed_reads.FAILED_ROWS_PER_PAGE)
    assert all(job_load(zk, j).bid == bid for j in rows)
    if count > failed_reads.FAILED_ROWS_PER_PAGE:
        more = viewer.get(reverse("failed"), {"group": "batch", "open": bid, "rpage": 2})
        rest = ROW.findall(more.content.decode())
        assert len(rest) == count - failed_reads.FAILED_ROWS_PER_PAGE and not set(rest) & set(rows)

    # A filter narrows the counts; "everything matching" is exactly what the filter takes.
    step, step_count = expected["step"].most_common(1)[0]
    html = viewer.get(reverse("failed"), {"group": "batch", "step": step}).content.decode()
    assert f'data-total="{step_count}"' in html
    matching = failed_reads.failed_matching(step=step)
    assert len(matching) == step_count
    assert all(job_reads.failing_step(job_load(zk, j)) == step for j in matching)


def test_api_failed_is_paged_with_group_counts(zk, loaded, token_headers):
    client = Client()
    first = client.get("/api/failed", **token_headers).json()
    assert first["total"] == 300 and first["per_page"] == failed_reads.FAILED_ROWS_PER_PAGE
    assert len(first["items"]) == failed_reads.FAILED_ROWS_PER_PAGE and first["has_next"]
    assert sum(first["groups"]["batch"].values()) == 300
    last = client.get("/api/failed", {"page": 6}, **token_headers).json()
    assert len(last["items"]) == 50 and not last["has_next"]
    seen = {
        i["id"]
        for p in range(1, 7)
        for i in client.get("/api/failed", {"page": p}, **token_headers).json()["items"]
    }
    assert seen == set(loaded.jobs_by_state["Failed"])
    assert client.get("/api/failed", {"page": "x"}, **token_headers).status_code == 400


@pytest.fixture
def token_headers(db) -> dict[str, str]:
    from queues.operator.audit import ApiToken

    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("scale-api", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    _token, key = ApiToken.issue(user=user, name="scale")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _requests_during(zk, action: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    calls: Counter[str] = Counter()
    original = zk._call

    def counting(request, async_object):
        if clock_sample(zk, request):
            return original(request, async_object)
        calls[type(request).__name__] += 1
        if type(request).__name__ == "MultiRead" or hasattr(request, "path"):
            calls["paths"] += len(getattr(request, "paths", None) or [1])
        return original(request, async_object)

    zk._call = counting
    try:
        return action(), calls
    finally:
        zk._call = original


def test_search_is_a_lookup_in_the_index_maps_kept_current_by_watches(zk, loaded):
    """Exact and complete at any size: no scan, so no scan limit. The lookup reads nothing
    but the job it finds, and jobs created or given an ARK after the index is warm are found
    through the watches that keep the index current."""
    idx = zindex.for_client(zk)
    completed = loaded.jobs_by_state["Completed"]
    target = completed[len(completed) // 2]
    config = decode_json("c", zk.get(f"/jobs/{target}/configuration")[0])
    ark = decode_json("i", zk.get(f"/jobs/{target}/identifiers")[0])["primary_id"]
    assert job_reads.jobs_page(flt=job_reads.JobFilter(q=config["localID"])).items  # warm

    page, calls = _requests_during(
        zk, lambda: job_reads.jobs_page(flt=job_reads.JobFilter(q=config["localID"]))
    )
    assert [j.jid for j in page.items] == [target] and page.total == 1 and not page.loading
    # Listing nothing, reading one job's nodes: a lookup, whatever the number of jobs.
    assert calls["GetChildren"] + calls["GetChildren2"] == 0
    assert calls["paths"] <= 20, calls
    assert [j.jid for j in job_reads.jobs_page(flt=job_reads.JobFilter(q=ark)).items] == [target]
    assert job_reads.jobs_page(flt=job_reads.JobFilter(q="local-nothing")).total == 0
    # The state filter still applies to what the lookup found.
    assert job_reads.jobs_page(flt=job_reads.JobFilter(q=ark, state="Failed")).total == 0

    # Created after the index is warm: found by its local ID at once.
    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    new = job_create(
        zk, bid=batch.bid, configuration={"profile": "p", "submitter": "s", "localID": "late-1"}
    )
    found = job_reads.jobs_page(flt=job_reads.JobFilter(q="late-1"))
    assert [j.jid for j in found.items] == [new.jid]

    # Given its ARK by Processing, then moved on: found by the ARK.
    for step in ("Estimating", "Provisioning", "Downloading", "Processing"):
        new = job_transition(zk, new, step)
    set_job_nodes(zk, new, identifiers={"primary_id": "ark:/99999/fk4late", "local_id": []})
    new = job_transition(zk, job_load(zk, new.jid), "Storing")
    assert eventually(
        lambda: (
            [
                j.jid
                for j in job_reads.jobs_page(flt=job_reads.JobFilter(q="ark:/99999/fk4late")).items
            ]
            == [new.jid]
        )
    )
    assert idx.memory_counts()["facts"] >= 601


def test_the_index_answers_while_still_loading_and_the_page_says_so(zk, viewer, loaded):
    """A fill held at its first step: pages answer from what is ready and say what is not."""
    idx = zindex.for_client(zk)
    release = threading.Event()
    filler = idx.start_fill(first=lambda: release.wait(30))
    try:
        assert eventually(lambda: idx.filling)
        html = viewer.get(reverse("failed")).content.decode()
        # Counted from what is read so far (nothing yet), without waiting; the count of the
        # Failed state itself is known from its listing.
        assert 'id="index-loading"' in html and "of 300 in the Failed state" in html
        reports = viewer.get(reverse("reports")).content.decode()
        # The batch states are not read yet (the fill is held before them): none listed so
        # far, and the page says it is still loading rather than waiting for them.
        assert 'id="index-loading"' in reports and "0 batches with a report" in reports
        overview = viewer.get(reverse("overview")).content.decode()
        assert 'id="index-loading"' in overview
        # Stuck jobs are counted once the index is filled, not by this page (at a million jobs
        # that first count reads every working entry's time): the card says so, and /metrics
        # leaves the figure out rather than wait.
        assert "counted once the read index is filled" in overview
        with pytest.raises(stuck.StillCounting):
            stuck.stuck_counts(zk, wait=False)
        assert "mrt_jobs_stuck" not in viewer.get(reverse("metrics")).content.decode()
        ov = selectors.overview()
        assert ov.loading and ov.jobs[JobState.FAILED].count == 300
        assert ov.jobs[JobState.COMPLETED].count == 300
        target = loaded.jobs_by_state["Completed"][0]
        local = decode_json("c", zk.get(f"/jobs/{target}/configuration")[0])["localID"]
        page = job_reads.jobs_page(flt=job_reads.JobFilter(q=local))
        assert page.loading  # not read yet: the page says so rather than claiming no match
    finally:
        release.set()
        filler.join(60)
    assert not idx.filling and idx.loading() == ""
    assert (
        "counted once the read index is filled"
        not in viewer.get(reverse("overview")).content.decode()
    )
    html = viewer.get(reverse("failed")).content.decode()
    assert 'id="index-loading"' not in html and 'data-total="300"' in html
    reports = viewer.get(reverse("reports")).content.decode()
    assert 'id="index-loading"' not in reports and "12 batches with a report" in reports
    page = job_reads.jobs_page(flt=job_reads.JobFilter(q=local))
    assert [j.jid for j in page.items] == [target] and not page.loading


def test_job_counts_without_a_listing_come_from_the_folders_stats(zk, loaded):
    """What the overview shows before a folder is listed: its stat's child count."""
    fresh = zindex.ReadIndex(zk)
    try:
        counts = fresh.job_counts_now()
        assert counts[JobState.FAILED] == 300 and counts[JobState.COMPLETED] == 300
        assert counts[JobState.PENDING] == 0
        assert fresh.oldest_entry_now(JobState.FAILED) is None  # not listed: no age yet
        assert fresh.job_count(JobState.FAILED) == 300
        assert fresh.oldest_entry_now(JobState.FAILED) == fresh.oldest_entry(JobState.FAILED)
    finally:
        fresh.close()


def test_search_and_collections_answer_without_reading_every_job_while_loading(zk, viewer, loaded):
    """While the fill runs, a search looks IDs up instead of preparing the texts of thousands of
    jobs and every batch, and the collections page counts what is read so far instead of reading
    every waiting job's collection first (each held a cold answer at 1,000,000 jobs for 8-18 s)."""
    from tests.scale.test_flat_failed_stuck import _work

    idx = zindex.for_client(zk)
    release = threading.Event()
    filler = idx.start_fill(first=lambda: release.wait(30))
    try:
        assert eventually(lambda: idx.filling)
        bid = loaded.batches[0]
        answer = viewer.get(reverse("search") + f"?q={bid}")
        assert answer.status_code == 302 and bid in answer["Location"]
        page, calls, _lines = _work(zk, lambda: viewer.get(reverse("search") + "?q=word"))
        assert "batch fields are searched once it has loaded" in (page.content.decode())
        assert calls["paths"] < 60, calls  # the texts of 600 jobs and 12 batches: hundreds
        page, calls, _lines = _work(zk, lambda: viewer.get(reverse("collections")))
        assert page.status_code == 200 and 'id="index-loading"' in page.content.decode()
        assert calls["paths"] < 60, calls
    finally:
        release.set()
        filler.join(60)
    assert not idx.filling
    assert "searched once" not in viewer.get(reverse("search") + "?q=word").content.decode()


def test_the_batch_filters_read_on_from_where_the_last_request_stopped(zk, loaded, monkeypatch):
    """Right after a start the batch list's filters read every batch's submission beside the
    fill (20,000 batches took 4.5 s at a million jobs). A request past its loading wait stops
    after the chunk in hand and says how far the reading got; what it read is kept, and the
    next request reads on from there, until one answers."""
    idx = zindex.for_client(zk)
    monkeypatch.setattr(zindex, "FILL_CHUNK", 5)  # 12 batches: three parts while filling
    bid = loaded.batches[0]
    profile = decode_json("s", zk.get(f"/batches/{bid}/submission")[0])["profile"]
    flt = batch_reads.BatchFilter(profile=profile)
    held, release = threading.Event(), threading.Event()
    # Held after its first step (the state folders' listings), as it reads the batches next.
    filler = idx.start_fill(first=lambda: (held.set(), release.wait(30)))
    said: list[str] = []
    try:
        assert held.wait(30) and idx.filling
        for _ in range(10):
            try:
                with zindex.answer_within(0):  # every request already past its wait
                    page = batch_reads.batches_page(flt=flt)
                break
            except StillReading as exc:
                said.append(exc.stage)
    finally:
        release.set()
        filler.join(60)
    assert said == [
        "the submissions of the batches, for the batch list's filters: 5 of 12 read",
        "the submissions of the batches, for the batch list's filters: 10 of 12 read",
    ]
    assert bid in [b.bid for b in page.items]
    assert [b.bid for b in page.items] == [b.bid for b in batch_reads.batches_page(flt=flt).items]
