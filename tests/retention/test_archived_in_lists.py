"""Archived batches are listed among the live ones (marked archived, by batch ID), and a job
search or a batch filter finds archived jobs too, in the pages and the API alike (both
databases)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client

from queues.console import batch_reads, job_reads
from queues.core.states import BatchState, JobState
from queues.operator import archive
from queues.operator.audit import ApiToken

NOW = timedelta(0)


def _api(client: Client) -> dict[str, str]:
    user = client.get("/jobs/").wsgi_request.user
    _token, key = ApiToken.issue(user=user, name="archived-lists")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_archived_batches_are_listed_marked_and_filtered(
    database: str, zk: Any, finished_batch: Any, viewer_client: Client
) -> None:
    old, _old_jobs = finished_batch((JobState.COMPLETED, JobState.FAILED), tag="old")
    list(archive.sweep(older_than=NOW))
    live, _live_jobs = finished_batch((JobState.COMPLETED,), batch_state="Processing", tag="new")

    page = batch_reads.batches_page(flt=batch_reads.BatchFilter())
    assert [r.bid for r in page.items] == [live.bid, old.bid] and page.total == 2
    archived = page.items[1]
    assert getattr(archived.item, "archived", False) and archived.item.state == BatchState.FAILED
    assert archived.states == {JobState.COMPLETED: 1, JobState.FAILED: 1}
    assert not getattr(page.items[0].item, "archived", False)

    # Paging runs through both, by batch ID.
    second = batch_reads.batches_page(flt=batch_reads.BatchFilter(), page=2, per_page=1)
    assert [r.bid for r in second.items] == [old.bid] and not second.has_next
    # Filters apply to the archived rows too.
    failed = batch_reads.batches_page(flt=batch_reads.BatchFilter(state=BatchState.FAILED))
    assert [r.bid for r in failed.items] == [old.bid]
    by_title = batch_reads.batches_page(flt=batch_reads.BatchFilter(q="Ada old"))
    assert [r.bid for r in by_title.items] == [old.bid]
    assert batch_reads.batches_page(flt=batch_reads.BatchFilter(profile="other")).total == 0

    html = viewer_client.get("/batches/").content.decode()
    assert f'id="archived-batch-row-{old.bid}"' in html and f'id="batch-row-{live.bid}"' in html
    assert f'value="{old.bid}:' not in html  # no checkbox: nothing can be done to it

    answer = viewer_client.get("/api/batches", **_api(viewer_client)).json()
    assert [b["id"] for b in answer["items"]] == [live.bid, old.bid] and answer["total"] == 2
    assert [b.get("archived", False) for b in answer["items"]] == [False, True]


def test_a_job_search_finds_archived_jobs_in_the_page_and_the_api(
    database: str, zk: Any, finished_batch: Any, viewer_client: Client
) -> None:
    batch, made = finished_batch((JobState.COMPLETED, JobState.FAILED), tag="arc")
    list(archive.sweep(older_than=NOW))
    job = made[1]

    page = job_reads.jobs_page(flt=job_reads.JobFilter(q=job.primary_id))
    assert [j.jid for j in page.items] == [job.jid] and page.archived_included
    assert getattr(page.items[0], "archived", False)
    assert page.items[0].state == JobState.FAILED and page.items[0].bid == batch.bid
    # Filters apply; "act on everything matching" never names an archived job.
    assert job_reads.jobs_page(flt=job_reads.JobFilter(q=job.primary_id, state="Held")).total == 0
    assert job_reads.jobs_matching(flt=job_reads.JobFilter(q=job.primary_id)) == ([], False)
    by_batch = job_reads.jobs_page(flt=job_reads.JobFilter(bid=batch.bid))
    assert sorted(j.jid for j in by_batch.items) == sorted(j.jid for j in made)

    html = viewer_client.get("/jobs/", {"q": job.local_ids[1]}).content.decode()
    assert html.count(f'id="archived-row-{job.jid}"') == 1  # in the table, not twice

    api = _api(viewer_client)
    for q in (job.primary_id, job.local_ids[1], job.configuration["localID"]):
        answer = viewer_client.get("/api/jobs", {"q": q}, **api).json()
        assert [j["id"] for j in answer["items"]] == [job.jid], q
        assert answer["items"][0]["state"] == JobState.FAILED and answer["total"] == 1
        assert answer["items"][0]["archived"] is True
