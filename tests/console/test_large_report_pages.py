"""A batch whose reports keep their job IDs in part nodes, on the pages and in the API."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.urls import reverse

from queues.operator.audit import ApiToken
from queues.zk import batches
from queues.zk.batches import batch_create, batch_load, batch_transition


def test_the_batch_page_the_api_and_the_export_read_a_large_report_whole(
    zk_1mib: Any, viewer: Any, client: Any, make_user: Callable[..., Any]
) -> None:
    zk = zk_1mib
    batch = batch_create(zk, submission={"profile": "demo_collection", "title": "large"})
    for state in ("Processing", "Reporting"):
        batch = batch_transition(zk, batch, state)
    failed = [f"jid{n:010d}" for n in range(1, 70_001)]
    batches.batch_write_report(zk, batch, failed=failed, successful=[])
    batches.batch_write_report(zk, batch, failed=failed[1:], successful=failed[:1])
    assert zk.get_children(f"/batches/{batch.bid}/status-report")  # in parts

    html = viewer.get(reverse("batch", args=[batch.bid])).content.decode()
    assert "✔ 1 successful, ✖ 69999 failed" in html
    assert "✔ 0 successful, ✖ 70000 failed" in html
    assert "1 newly successful (jid0000000001)" in html

    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="test")
    answer = client.get(f"/api/batches/{batch.bid}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    report = answer["status_report"]
    assert report["failed_jobs"] == failed[1:] and report["successful_jobs"] == failed[:1]
    assert report["history"][0]["failed_jobs"] == failed

    listed = client.get("/api/reports", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    [row] = [r for r in listed["items"] if r["batch"] == batch.bid]
    latest = row["reports"][0]
    assert (latest["failed_count"], latest["successful_count"], latest["whole"]) == (
        69_999,
        1,
        False,
    )

    exported = json.loads(viewer.get(f"/reports/{batch.bid}.json").content)
    assert len(exported["jobs"]) == 70_000
    assert batch_load(zk, batch.bid).state == "Reporting"
