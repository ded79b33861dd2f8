"""Pages over nodes another client wrote oddly (found by feeding the console odd values): each
page answers, shows what it can read and says what it cannot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.zk import paths as zpaths
from queues.zk.caps import cap_path, cap_set
from queues.zk.locks import queue_hold_set
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
