"""Pages over nodes another client wrote oddly (found by feeding the console odd values): each
page answers, shows what it can read and says what it cannot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse
from kazoo.client import KazooClient

from queues.operator.audit import AuditEntry
from queues.zk import paths as zpaths
from queues.zk.caps import cap_path, cap_set
from queues.zk.locks import lock_create, queue_hold_set
from queues.zk.maintenance import about_path, hold_record_set

from .conftest import PROFILE

pytestmark = pytest.mark.django_db

ODD_LISTS: list[Any] = [
    5,
    [[1]],
    [{"jid": "x"}],
    ["not-a-job", "../../x", None],
    "jid0000000001",
]


def report_node(zk: KazooClient, bid: str, value: dict[str, Any]) -> None:
    path = zpaths.batch_node(bid, "status-report")
    data = json.dumps(value).encode()
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data)


@pytest.mark.parametrize("odd", ODD_LISTS, ids=repr)
def test_a_status_report_with_odd_lists_shows_its_job_ids_and_nothing_else(
    zk: KazooClient, viewer, token_for, make_batch, make_job, odd: Any
) -> None:
    batch = make_batch()
    job = make_job(batch=batch, state="Completed")
    report_node(
        zk,
        batch.bid,
        {
            "last_modified": "2026-12-06 08:00:00 +0000",
            "failed_jobs": odd,
            "successful_jobs": [job.jid, *(odd if isinstance(odd, list) else [odd])],
            "history": [{"failed_jobs": odd, "successful_jobs": odd}, odd],
        },
    )
    api = token_for("viewer")
    for url, headers in [
        ("/reports/", {}),
        (f"/batches/{batch.bid}/", {}),
        (f"/reports/{batch.bid}.csv", {}),
        (f"/reports/{batch.bid}.json", {}),
        ("/api/reports", api),
        (f"/api/batches/{batch.bid}", api),
    ]:
        response = viewer.get(url, **headers)
        assert response.status_code == 200, (url, response.status_code)
        body = response.content.decode()
        assert job.jid in body, url
        assert "not-a-job" not in body and "../../x" not in body, url


def test_a_space_needed_past_64_bits_reads_as_unreadable_not_as_a_failure_of_the_page(
    zk: KazooClient, viewer, make_job
) -> None:
    job = make_job(state="Estimating")
    other = make_job(state="Estimating")
    zk.set(zpaths.job_node(job.jid, "space_needed"), b"9" * 310)
    page = viewer.get(f"/jobs/{job.jid}/")
    assert page.status_code == 200
    assert "space_needed" in page.content.decode()
    for url in ["/", "/jobs/?state=Estimating", f"/batches/{job.bid}/"]:
        response = viewer.get(url)
        assert response.status_code == 200, url
    assert other.jid in viewer.get("/jobs/?state=Estimating").content.decode()


def test_a_batch_page_lists_the_jobs_it_cannot_read(zk: KazooClient, viewer, make_batch, make_job):
    batch = make_batch()
    good = make_job(batch=batch, state="Failed")
    odd = make_job(batch=batch, state="Failed")
    status = zpaths.job_node(odd.jid, "status")
    zk.set(status, zk.get(status)[0][:-1] + b',"note":"x\\ud800y"}')
    page = viewer.get(f"/batches/{batch.bid}/")
    assert page.status_code == 200
    body = page.content.decode()
    assert good.jid in body
    unreadable = body[body.index('id="batch-jobs-unreadable"') :]
    assert f'href="/jobs/{odd.jid}/"' in unreadable
    assert "lone surrogate" in unreadable


def with_lone_surrogate(zk: KazooClient, path: str, key: str) -> None:
    """``key`` of the JSON object at ``path`` rewritten to hold a lone surrogate escape."""
    value = json.loads(zk.get(path)[0])
    text = json.dumps({k: v for k, v in value.items() if k != key})
    zk.set(path, (text[:-1] + f', "{key}": "x\\ud800y"}}').encode())


@pytest.mark.parametrize("key", ["by", "reason"])
def test_a_hold_record_or_a_cap_with_a_lone_surrogate_leaves_every_page_answering(
    zk: KazooClient, viewer, token_for, key: str
) -> None:
    assert queue_hold_set(zk, "ingest")
    assert hold_record_set(zk, "queue", "ingest", by="olga", reason="redeploy")
    with_lone_surrogate(zk, about_path("queue", "ingest"), key)
    cap_set(zk, PROFILE, 2, by="olga", reason="slow storage")
    with_lone_surrogate(zk, cap_path(PROFILE), key)
    api = token_for("viewer")
    pages = [("/", {}), ("/holds/", {}), (f"/collections/{PROFILE}/", {}), ("/api/holds", api)]
    for url, headers in pages:
        response = viewer.get(url, **headers)
        assert response.status_code == 200, (url, response.status_code)
        response.content.decode()  # whole, in UTF-8


def index_entries_naming(zk: KazooClient, jid: str) -> list[str]:
    found = []
    for folder in zk.get_children(zpaths.JOB_STATES):
        found += [n for n in zk.get_children(f"{zpaths.JOB_STATES}/{folder}") if n.endswith(jid)]
    return found


@pytest.mark.parametrize("odd", ["priority", "status"])
def test_an_admin_deletes_a_job_that_cannot_be_read_from_its_page(
    zk: KazooClient, admin, operator, make_batch, make_job, other_zk: KazooClient, odd: str
) -> None:
    batch = make_batch()
    job = make_job(batch=batch, state="Failed")
    other = make_job(batch=batch, state="Failed")
    if odd == "priority":
        zk.set(zpaths.job_node(job.jid, "priority"), b"100")
    else:
        with_lone_surrogate(zk, zpaths.job_node(job.jid, "status"), "message")
    page = admin.get(f"/jobs/{job.jid}/").content.decode()
    assert 'id="job-delete-unreadable"' in page
    assert 'id="job-delete-unreadable"' not in operator.get(f"/jobs/{job.jid}/").content.decode()
    confirm = admin.get(reverse("job-action", args=[job.jid, "delete"]))
    assert 'id="confirm-unreadable"' in confirm.content.decode()
    url = reverse("job-action", args=[job.jid, "delete"])
    # Refused, nothing changed: no reason; the operator's role; a version (a page from before
    # the job became unreadable); the job locked by a consumer.
    assert admin.post(url, {"version": ""}).status_code == 400
    assert operator.post(url, {"reason": "x", "version": ""}).status_code == 403
    assert admin.post(url, {"reason": "x", "version": "3"}).status_code == 409
    assert lock_create(other_zk, zpaths.job_node(job.jid, "lock"))
    assert admin.post(url, {"reason": "x", "version": ""}).status_code == 409
    other_zk.delete(zpaths.job_node(job.jid, "lock"))
    assert zk.exists(zpaths.job(job.jid)) is not None
    assert index_entries_naming(zk, job.jid)
    response = admin.post(url, {"reason": "unreadable after a bad write", "version": ""})
    assert response.status_code == 303
    assert zk.exists(zpaths.job(job.jid)) is None
    assert index_entries_naming(zk, job.jid) == []
    assert job.jid not in zk.get_children(zpaths.batch_index(batch.bid, "batch-failed"))
    assert other.jid in zk.get_children(zpaths.batch_index(batch.bid, "batch-failed"))
    assert zk.exists(zpaths.job(other.jid)) is not None
    entry = AuditEntry.objects.get(item_id=job.jid, ok=True)
    assert entry.reason == "unreadable after a bad write"
    assert (entry.before, entry.after) == ("unreadable", "removed")
