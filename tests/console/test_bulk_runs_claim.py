"""Bulk runs are claimed by the bulk-runs daemons in the database: each run by exactly one."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError

from queues.operator import bulkrun
from queues.operator.bulkrun import BulkRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_daemons_claiming_at_once_take_each_waiting_run_exactly_once() -> None:
    runs = [
        BulkRun.objects.create(
            kind="job", action="resume", items=[["jid0000000001", None]], total=1
        )
        for _ in range(20)
    ]
    taken: dict[str, list[int]] = {"a:1:1": [], "b:1:1": [], "c:1:1": []}
    start = threading.Barrier(len(taken))

    def claimer(owner: str) -> None:
        start.wait()
        while True:
            try:
                run = bulkrun.claim(owner)
            except OperationalError:
                # The test database (SQLite in memory, shared cache) answers a concurrent write
                # with "table is locked" at once; the daemon's loop logs it and claims again.
                time.sleep(0.01)
                continue
            if run is None:
                break
            taken[owner].append(run.pk)
        from django.db import connection

        connection.close()

    threads = [threading.Thread(target=claimer, args=(o,)) for o in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    claimed = sorted(pk for pks in taken.values() for pk in pks)
    assert claimed == sorted(r.pk for r in runs), "every run once, none twice"
    for owner, pks in taken.items():
        assert set(BulkRun.objects.filter(pk__in=pks).values_list("owner", flat=True)) <= {owner}


def test_a_run_that_is_not_waiting_is_never_claimed() -> None:
    claimed = BulkRun.objects.create(
        kind="job", action="resume", items=[["jid0000000001", None]], total=1, owner="x:1:1"
    )
    BulkRun.objects.create(
        kind="job",
        action="resume",
        items=[["jid0000000001", None]],
        total=1,
        state=BulkRun.FINISHED,
    )
    assert bulkrun.claim("y:1:1") is None
    assert BulkRun.objects.get(pk=claimed.pk).owner == "x:1:1"
