"""One clock on the archived pages too (issue 53, item 4): a job and a batch moved out of
ZooKeeper by retention are shown, in a zone that is not UTC, with their times in the one
written form and the exact UTC time on hover, and answered by the API in its one ISO form."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from console.conftest import admin, make_user, token_for  # noqa: F401 - fixtures
from console.test_one_clock import EXACT, ZONE, api_times, check_page
from django.test import Client

from queues.console import backlog
from queues.operator import archive
from queues.operator.audit import AuditEntry

pytestmark = pytest.mark.django_db


def test_the_archived_pages_and_answers_write_times_one_way(
    zk: Any,
    finished_batch: Any,
    admin: Client,  # noqa: F811
    token_for: Any,  # noqa: F811
    settings: Any,
) -> None:
    settings.TIME_ZONE = ZONE
    backlog.clear_cache()
    batch, made = finished_batch(("Completed", "Failed"))
    AuditEntry.objects.create(
        action="resume", kind="job", item_id=made[1].jid, before="Failed", after="Estimating"
    )
    assert [o.done for o in archive.sweep(older_than=timedelta(0), zk=zk)] == [True]
    shown = 0
    for url in (
        f"/jobs/{made[1].jid}/",
        f"/batches/{batch.bid}/",
        f"/jobs/?bid={batch.bid}",
        "/batches/?state=Failed",
        "/batches/",
        "/jobs/",
    ):
        response = admin.get(url)
        assert response.status_code == 200, (url, response.status_code)
        shown += check_page(response.content.decode(), url)
    assert shown >= 6  # created, archived, each state's time, the audit entry
    api = Client(**token_for("viewer"))
    seen = 0
    for url in (f"/api/jobs/{made[1].jid}", f"/api/batches/{batch.bid}"):
        response = api.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        for where, value in api_times(response.json()):
            assert EXACT.fullmatch(value), (url, where, value)
            seen += 1
    assert seen >= 3
