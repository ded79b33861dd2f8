"""A 100,000-job batch reported, then update-reported 25 times, by the reporting daemons on a
ZooKeeper that takes no request past its default 1 MiB (as Merritt's ensemble most likely
runs): every round succeeds, no node grows past the limit, and every report reads back whole.

The batch's index entries are made directly (the reports are built from them), 1,000 to a
transaction, since 100,000 jobs through every step would take the test an hour.
"""

from __future__ import annotations

from typing import Any

import pytest

from queues.services import moves
from queues.zk import batches, sized
from queues.zk.batches import batch_create, batch_load, batch_transition

from .conftest import DEMO, daemon

pytestmark = pytest.mark.slow

JOBS = 100_000
FAILED = 5_000
ROUNDS = 25
FIXED_PER_ROUND = 100  # failed jobs an operator resumed that completed before the next round


def _index(zk: Any, bid: str, folder: str, jids: list[str]) -> None:
    zk.ensure_path(f"/batches/{bid}/states/{folder}")
    for start in range(0, len(jids), 1_000):
        txn = zk.transaction()
        for jid in jids[start : start + 1_000]:
            txn.create(f"/batches/{bid}/states/{folder}/{jid}", b"")
        assert all(r is True or isinstance(r, str) for r in txn.commit())


def _fix(zk: Any, bid: str, jids: list[str]) -> None:
    """Jobs that moved from Failed to Completed: their batch index entries move with them."""
    txn = zk.transaction()
    for jid in jids:
        txn.delete(f"/batches/{bid}/states/batch-failed/{jid}")
        txn.create(f"/batches/{bid}/states/batch-completed/{jid}", b"")
    txn.commit()


def _largest_node(zk: Any, bid: str) -> int:
    path = f"/batches/{bid}/status-report"
    return max(
        [len(zk.get(path)[0])] + [len(zk.get(f"{path}/{n}")[0]) for n in zk.get_children(path)]
    )


def test_a_100000_job_batch_is_reported_and_update_reported_25_times_within_1_mib(
    zk_own_1mib: Any, mailoutbox: list[Any]
) -> None:
    # A server of its own: 100,000 jobs' index nodes and 26 reports would stay in the session's
    # shared server (and its 512 MiB heap) for every test after this one.
    zk = zk_own_1mib
    batch = batch_create(
        zk, submission={"profile": DEMO, "submitter": "depositor@example.org", "title": "big"}
    )
    jids = [f"jid{n:010d}" for n in range(1, JOBS + 1)]
    failed = jids[:FAILED]
    _index(zk, batch.bid, "batch-processing", [])
    _index(zk, batch.bid, "batch-failed", failed)
    _index(zk, batch.bid, "batch-completed", jids[FAILED:])
    batch = batch_transition(zk, batch_load(zk, batch.bid), "Processing")
    batch_transition(zk, batch, "Reporting")

    assert daemon(zk, "batch-reporting").run_once()
    first = batch_load(zk, batch.bid)
    assert first.state == "Failed" and first.report is not None
    assert batches.report_counts(first.report) == (FAILED, JOBS - FAILED)
    assert first.report["mailed"] is True
    assert _largest_node(zk, batch.bid) <= sized.NODE_BUDGET

    updater = daemon(zk, "batch-update-reporting")
    for round_ in range(1, ROUNDS + 1):
        fixed = failed[:FIXED_PER_ROUND]
        failed = failed[FIXED_PER_ROUND:]
        _fix(zk, batch.bid, fixed)
        moves.batch_update_reporting(bid=batch.bid)
        assert updater.run_once(), f"update report {round_} was not made"
        now = batch_load(zk, batch.bid)
        assert now.state == "Failed", now.status.message
        assert f"{FIXED_PER_ROUND} completed since the last report" in now.status.message
        assert _largest_node(zk, batch.bid) <= sized.NODE_BUDGET
        assert zk.connected

    assert len(mailoutbox) == ROUNDS + 1
    assert "Completed since the last report" in mailoutbox[-1].body
    final = batch_load(zk, batch.bid)
    assert final.report is not None
    whole = batches.report_resolve(zk, batch.bid, final.report)
    assert whole is not None
    assert whole["failed_jobs"] == failed
    assert whole["successful_jobs"] == sorted(set(jids) - set(failed))
    history = whole["history"]
    assert len(history) == batches.REPORT_HISTORY
    # Newest first: each earlier report still had the jobs fixed after it as failed.
    for back, earlier in enumerate(history, start=1):
        assert len(earlier["failed_jobs"]) == len(failed) + back * FIXED_PER_ROUND
        assert len(earlier["successful_jobs"]) == JOBS - len(earlier["failed_jobs"])
