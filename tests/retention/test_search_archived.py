"""The header search finds jobs and batches that retention archived out of ZooKeeper, by every
field and in any case, narrowed by a date range, and opens a single exact match (both
databases: the lookups into JSON columns differ between them)."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from django.test import Client

from queues.core.states import JobState
from queues.models import ArchivedBatch, ArchivedJob
from queues.operator import archive

NOW = timedelta(0)
ROW = re.compile(r'id="search-row-((?:jid|bid)[0-9]{10})"')


def _rows(html: str, key: str) -> list[str]:
    start = html.index(f'id="search-{key}"')
    return ROW.findall(html[start : html.find("</section>", start)])


def test_archived_items_are_found_by_every_field(
    database: str, zk: Any, finished_batch: Any, viewer_client: Client
) -> None:
    batch, made = finished_batch((JobState.COMPLETED, JobState.FAILED), tag="arc")
    list(archive.sweep(older_than=NOW))
    assert ArchivedJob.objects.count() == 2 and not zk.exists(f"/jobs/{made[0].jid}")
    completed, failed = made
    # A file name kept in the archived job's configuration.
    row = ArchivedJob.objects.get(jid=completed.jid)
    row.nodes = {**row.nodes, "configuration": {**row.nodes["configuration"], "filename": "F.TIF"}}
    row.save()

    def found(q: str, key: str, **more: str) -> list[str]:
        response = viewer_client.get("/search/", {"q": q, **more})
        if response.status_code == 302:
            return [response["Location"].rstrip("/").rsplit("/", 1)[-1]]
        assert response.status_code == 200
        return _rows(response.content.decode(), key)

    # Titles and submitter by a part, in any case; newest first.
    assert found("LETTER 1 ARC", "archived-jobs", field="title") == [failed.jid]
    assert found("ada LOVELACE", "archived-jobs", field="submitter") == [failed.jid, completed.jid]
    assert found("ada LOVELACE", "archived-batches", field="submitter") == [batch.bid]
    assert found("f.tif", "archived-jobs", field="filename") == [completed.jid]
    assert found("http 404", "archived-jobs", field="error") == [failed.jid]
    # IDs by their start; ARK and local ID by their start or whole, in any case.
    assert found(completed.jid[:-1].upper(), "archived-jobs") == [
        j for j in (failed.jid, completed.jid) if j.startswith(completed.jid[:-1])
    ]
    assert found("ARK:/99999/FK4ARC", "archived-jobs") == [failed.jid, completed.jid]
    # Whole and alone: the archived item's page.
    assert found("ARK:/99999/FK4ARC001", "archived-jobs") == [failed.jid]
    assert found("ALT-ARC000", "archived-jobs") == [completed.jid]
    assert found(completed.jid.upper(), "archived-jobs") == [completed.jid]
    assert found(batch.uuid.upper(), "archived-batches") == [batch.bid]
    # The batch ID opens the batch (its jobs are on its page, not among the matches).
    opened = viewer_client.get("/search/", {"q": f" {batch.bid.upper()} "})
    assert opened.status_code == 302 and opened["Location"] == f"/batches/{batch.bid}/"
    opened = viewer_client.get(f"/jobs/{completed.jid}/")
    assert opened.status_code == 200 and "archived" in opened.content.decode().lower()

    # A date range narrows the archived rows too (by created, or by last change).
    today = date.today().isoformat()
    long_ago = (date.today() - timedelta(days=400)).isoformat()
    both = found("ada lovelace", "archived-jobs", field="submitter", since=today, until=today)
    assert both == [failed.jid, completed.jid]
    assert found("ada lovelace", "archived-jobs", field="submitter", until=long_ago) == []
    assert found("ada lovelace", "archived-batches", date_of="changed", until=long_ago) == []
    assert ArchivedBatch.objects.count() == 1
