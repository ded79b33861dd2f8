"""Batch moves, completion detection and the status report."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.services import moves
from queues.zk import batches, jobs
from queues.zk.batches import CompletionCheck
from queues.zk.errors import Conflict, InvalidTransition
from queues.zk.records import Batch, Job

from .helpers import assert_batch_status, assert_stamp, compact, raw, read_json, snapshot, walk_job

LEGAL = [
    ("Pending", "Held", False),
    ("Pending", "Processing", False),
    ("Pending", "Failed", False),
    ("Held", "Pending", True),
    ("Processing", "Reporting", False),
    ("Processing", "Failed", False),
    ("Reporting", "Completed", False),
    ("Reporting", "Failed", False),
    ("Failed", "UpdateReporting", True),
    ("UpdateReporting", "Completed", False),
    ("UpdateReporting", "Failed", False),
]

# How to bring a new batch to each state with legal moves only.
ROUTE = {
    "Pending": [],
    "Held": [("Held", False)],
    "Processing": [("Processing", False)],
    "Reporting": [("Processing", False), ("Reporting", False)],
    "Failed": [("Processing", False), ("Reporting", False), ("Failed", False)],
    "Completed": [("Processing", False), ("Reporting", False), ("Completed", False)],
    "UpdateReporting": [
        ("Processing", False),
        ("Reporting", False),
        ("Failed", False),
        ("UpdateReporting", True),
    ],
}


def bring(zk: KazooClient, batch: Batch, state: str) -> Batch:
    for target, admin in ROUTE[state]:
        batch = batches.batch_transition(zk, batch, target, admin=admin)
    return batch


@pytest.mark.parametrize(
    ("source", "target", "admin"), LEGAL, ids=[f"{a}->{b}" for a, b, _ in LEGAL]
)
def test_batch_move_writes_status_json(
    zk: KazooClient, batch: Batch, source: str, target: str, admin: bool
) -> None:
    batch = bring(zk, batch, source)
    moved = batches.batch_transition(zk, batch, target, admin=admin, message=f"to {target}")
    assert_batch_status(zk, batch.bid, status=target, message=f"to {target}")
    assert moved.state == target
    assert moved.status.version == batch.status.version + 1
    assert batches.batch_load(zk, batch.bid).status.raw == moved.status.raw


ILLEGAL = [
    ("Pending", "Completed", False),
    ("Pending", "Reporting", False),
    ("Held", "Processing", False),
    ("Held", "Pending", False),
    ("Processing", "Completed", False),
    ("Completed", "Reporting", False),
    ("Failed", "UpdateReporting", False),
    ("Failed", "Reporting", True),
    ("Completed", "Pending", True),
]


@pytest.mark.parametrize(
    ("source", "target", "admin"), ILLEGAL, ids=[f"{a}->{b}" for a, b, _ in ILLEGAL]
)
def test_illegal_batch_move_raises_and_changes_nothing(
    zk: KazooClient, batch: Batch, source: str, target: str, admin: bool
) -> None:
    batch = bring(zk, batch, source)
    before = snapshot(zk, f"/batches/{batch.bid}")
    with pytest.raises(InvalidTransition):
        batches.batch_transition(zk, batch, target, admin=admin)
    assert snapshot(zk, f"/batches/{batch.bid}") == before


def test_unknown_keys_in_batch_status_survive_a_move(zk: KazooClient, batch: Batch) -> None:
    path = f"/batches/{batch.bid}/status"
    status = read_json(zk, path)
    status["java_host"] = "ingest02"
    zk.set(path, compact(status))
    batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Processing")
    assert read_json(zk, path)["java_host"] == "ingest02"


def test_stale_batch_move_is_a_conflict(zk: KazooClient, batch: Batch) -> None:
    batches.batch_transition(zk, batch, "Held", message="collection held")
    before = snapshot(zk, f"/batches/{batch.bid}")
    with pytest.raises(Conflict):
        batches.batch_transition(zk, batch, "Processing")
    assert snapshot(zk, f"/batches/{batch.bid}") == before


def test_batch_moves_to_reporting_only_when_batch_processing_is_empty(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    first, second = make_job(), make_job()
    bring(zk, batch, "Processing")
    assert moves.batch_complete_if_done(bid=batch.bid) is False
    walk_job(zk, first, "Completed")
    assert moves.batch_complete_if_done(bid=batch.bid) is False
    assert_batch_status(zk, batch.bid, status="Processing")
    jobs.job_transition(zk, second, "Failed", message="bad")
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-processing") == []
    assert moves.batch_complete_if_done(bid=batch.bid) is True
    assert_batch_status(zk, batch.bid, status="Reporting")
    assert moves.batch_complete_if_done(bid=batch.bid) is False


def test_the_completion_check_counts_the_jobs_left_without_listing_them(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It runs after every job's last step: listing a big batch's folder each time would read
    # the batch's job IDs over and over, O(N^2) names for N jobs.
    jobs_made = [make_job() for _ in range(3)]
    bring(zk, batch, "Processing")
    listed = []
    real = zk.get_children_async
    monkeypatch.setattr(zk, "get_children_async", lambda *a, **k: listed.append(a) or real(*a, **k))
    for job in jobs_made:
        assert moves.batch_complete_if_done(bid=batch.bid) is False
        walk_job(zk, job, "Completed")
    listed.clear()
    assert moves.batch_complete_if_done(bid=batch.bid) is True
    assert listed == []
    assert_batch_status(zk, batch.bid, status="Reporting")


def test_several_batches_are_checked_in_one_round_trip_and_only_complete_ones_move(
    zk: KazooClient,
    make_batch: Callable[..., Batch],
    make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done, working, empty = make_batch(), make_batch(), make_batch()
    finished, unfinished = make_job(bid=done.bid), make_job(bid=working.bid)
    for each in (done, working, empty):
        bring(zk, each, "Processing")
    walk_job(zk, finished, "Completed")
    asked = []
    real = zk.exists
    monkeypatch.setattr(zk, "exists", lambda *a, **k: asked.append(a) or real(*a, **k))
    check = CompletionCheck(zk, [done.bid, working.bid, empty.bid])
    moved = moves.batches_to_reporting(check.complete())
    assert moved == [done.bid]
    assert asked == []  # the counts were asked together (exists_async), not one by one
    assert_batch_status(zk, done.bid, status="Reporting")
    assert_batch_status(zk, working.bid, status="Processing")
    assert_batch_status(zk, empty.bid, status="Processing")  # no jobs: not complete
    assert unfinished.state != "Completed"
    assert moves.batches_to_reporting([done.bid]) == []  # moved already
    assert moves.batch_complete_if_done(bid=working.bid) is False
    assert len(asked) == 1  # the one-batch check, by contrast, asks with exists


def test_batch_without_jobs_is_not_complete(zk: KazooClient, batch: Batch) -> None:
    bring(zk, batch, "Processing")
    assert batches.batch_is_complete(zk, batch.bid) is False
    assert moves.batch_complete_if_done(bid=batch.bid) is False


def test_pending_batch_is_not_moved_to_reporting(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    walk_job(zk, make_job(), "Completed")
    assert moves.batch_complete_if_done(bid=batch.bid) is False
    assert_batch_status(zk, batch.bid, status="Pending")


def test_status_report_lists_failed_and_successful_jobs(zk: KazooClient, batch: Batch) -> None:
    written = batches.batch_write_report(
        zk, batch, failed=["jid0000000003"], successful=["jid0000000002", "jid0000000001"]
    )
    report = read_json(zk, f"/batches/{batch.bid}/status-report")
    assert_stamp(report["last_modified"])
    assert raw(zk, f"/batches/{batch.bid}/status-report") == compact(
        {
            "last_modified": report["last_modified"],
            "failed_jobs": ["jid0000000003"],
            "successful_jobs": ["jid0000000001", "jid0000000002"],
        }
    )
    assert written == report
    assert batches.batch_load(zk, batch.bid).report == report


def test_second_report_keeps_the_first_in_history(zk: KazooClient, batch: Batch) -> None:
    first = batches.batch_write_report(
        zk, batch, failed=["jid0000000003", "jid0000000004"], successful=["jid0000000001"]
    )
    second = batches.batch_write_report(
        zk,
        batch,
        failed=["jid0000000004"],
        successful=["jid0000000001", "jid0000000003"],
    )
    stored = read_json(zk, f"/batches/{batch.bid}/status-report")
    assert stored == second
    assert stored["failed_jobs"] == ["jid0000000004"]
    assert stored["history"] == [first]
    third = batches.batch_write_report(zk, batch, failed=[], successful=["jid0000000001"])
    stored = read_json(zk, f"/batches/{batch.bid}/status-report")
    assert [h["failed_jobs"] for h in stored["history"]] == [
        ["jid0000000004"],
        ["jid0000000003", "jid0000000004"],
    ]
    assert "history" not in stored["history"][0]
    assert stored == third


def test_report_history_is_bounded(zk: KazooClient, batch: Batch) -> None:
    for n in range(batches.REPORT_HISTORY + 5):
        batches.batch_write_report(zk, batch, failed=[f"jid{n:010d}"], successful=[])
    stored = read_json(zk, f"/batches/{batch.bid}/status-report")
    assert len(stored["history"]) == batches.REPORT_HISTORY


def test_malformed_old_report_is_replaced_without_history(zk: KazooClient, batch: Batch) -> None:
    zk.create(f"/batches/{batch.bid}/status-report", b"not json")
    batches.batch_write_report(zk, batch, failed=[], successful=["jid0000000001"])
    stored = read_json(zk, f"/batches/{batch.bid}/status-report")
    assert "history" not in stored
    assert stored["successful_jobs"] == ["jid0000000001"]


def test_report_changes_tells_what_the_update_report_must_say() -> None:
    previous = {
        "failed_jobs": ["jid0000000002", "jid0000000003", "jid0000000005"],
        "successful_jobs": ["jid0000000001"],
    }
    current = {
        "failed_jobs": ["jid0000000003", "jid0000000004"],
        "successful_jobs": ["jid0000000001", "jid0000000002"],
    }
    assert batches.report_changes(previous, current) == {
        "newly_successful": ["jid0000000002"],
        "still_failed": ["jid0000000003"],
        "newly_failed": ["jid0000000004"],
        "gone": ["jid0000000005"],
    }
    assert batches.report_changes(None, current)["newly_failed"] == [
        "jid0000000003",
        "jid0000000004",
    ]


def test_batch_job_ids_lists_each_index_folder(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    done, failed, running = make_job(), make_job(), make_job()
    walk_job(zk, done, "Completed")
    jobs.job_transition(zk, failed, "Failed")
    assert batches.batch_job_ids(zk, batch.bid) == {
        "batch-processing": [running.jid],
        "batch-completed": [done.jid],
        "batch-failed": [failed.jid],
        "batch-deleted": [],
    }


def test_two_clients_completing_a_batch_at_once_write_its_status_once(
    zk: KazooClient, other_zk: KazooClient, batch: Batch
) -> None:
    batch = bring(zk, batch, "Processing")
    results: list[object] = []
    barrier = threading.Barrier(2, timeout=10)

    def complete(client: KazooClient) -> None:
        barrier.wait()
        try:
            results.append(batches.batch_transition(client, batch, "Reporting").state)
        except Conflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=complete, args=(c,)) for c in (zk, other_zk)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(results) == 2
    assert all(r == "Reporting" or isinstance(r, Conflict) for r in results)
    assert zk.get(f"/batches/{batch.bid}/status")[1].version == batch.status.version + 1
    assert_batch_status(zk, batch.bid, status="Reporting")


def test_an_operator_failing_the_last_job_moves_the_batch_on_at_once(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    done, last = make_job(), make_job()
    bring(zk, batch, "Processing")
    walk_job(zk, done, "Completed")
    moves.job_fail(jid=last.jid, message="operator gave up")
    # Not left for the reporting consumer's next sweep.
    assert_batch_status(zk, batch.bid, status="Reporting")
