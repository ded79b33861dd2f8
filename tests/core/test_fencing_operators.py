"""Writes made outside a consumer's step (an operator's moves and removals, the consistency
check's repairs) against items another session holds the lock of, as Merritt's ingest would:
a second client with its own session takes the ephemeral ``lock`` child. Such a write is
refused and changes nothing; above all, it never deletes that lock (the contract: only its
owner deletes a lock; every other write is fenced like a move)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.core.states import BatchState, JobState
from queues.services import moves
from queues.zk import batches, jobs
from queues.zk import paths as zpaths
from queues.zk.errors import Conflict, ItemLocked
from queues.zk.records import Batch, Job

from .helpers import walk_job


def hold_lock(other: KazooClient, path: str) -> Any:
    """``path`` locked by ``other``'s session (Merritt's ingest, or a consumer on another host);
    the lock's stat."""
    other.create(path, b"", ephemeral=True)
    stat = other.exists(path)
    assert stat is not None and stat.ephemeralOwner == other.client_id[0]
    return stat


def still_held(zk: KazooClient, path: str, stat: Any) -> None:
    now = zk.exists(path)
    assert now is not None, f"{path} was deleted by a session that does not own it"
    assert (now.czxid, now.ephemeralOwner) == (stat.czxid, stat.ephemeralOwner)


def test_an_operator_hold_of_a_job_another_session_holds_is_refused(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    lock = zpaths.job_node(job.jid, "lock")
    stat = hold_lock(other_zk, lock)
    before = zk.get(zpaths.job_node(job.jid, "status"))
    with pytest.raises(ItemLocked):
        moves.job_hold(jid=job.jid)
    assert zk.get(zpaths.job_node(job.jid, "status")) == before
    assert jobs.job_load(zk, job.jid).state == JobState.PENDING
    still_held(zk, lock, stat)


def test_an_operator_fail_of_a_job_at_work_under_another_session_is_refused(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    job = walk_job(zk, job, JobState.DOWNLOADING)
    lock = zpaths.job_node(job.jid, "lock")
    stat = hold_lock(other_zk, lock)
    with pytest.raises(ItemLocked):
        moves.job_fail(jid=job.jid, message="stuck")
    assert jobs.job_load(zk, job.jid).state == JobState.DOWNLOADING
    still_held(zk, lock, stat)


def test_a_lock_taken_just_before_an_operator_move_is_sent_stops_the_move(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    """The job was read unlocked (the page, the service's load); the lock is taken after."""
    loaded = jobs.job_load(zk, job.jid)
    assert loaded.lock is None
    stat = hold_lock(other_zk, zpaths.job_node(job.jid, "lock"))
    with pytest.raises(ItemLocked):
        jobs.job_transition(zk, loaded, JobState.HELD, admin=True)
    assert jobs.job_load(zk, job.jid).state == JobState.PENDING
    still_held(zk, zpaths.job_node(job.jid, "lock"), stat)


def test_an_unlocked_operator_move_still_goes_through_and_leaves_no_lock(
    zk: KazooClient, job: Job
) -> None:
    moves.job_hold(jid=job.jid)
    assert jobs.job_load(zk, job.jid).state == JobState.HELD
    assert zk.exists(zpaths.job_node(job.jid, "lock")) is None


def test_a_job_removal_never_deletes_a_lock_taken_after_its_look(
    zk: KazooClient,
    other_zk: KazooClient,
    job: Job,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The removal looked for a lock, found none, then listed the job's children: a lock taken
    in between was listed, and deleted with the job's nodes."""
    job = walk_job(zk, job, JobState.HELD)
    lock = zpaths.job_node(job.jid, "lock")
    taken: list[Any] = []
    real_children = jobs.children

    def children_after_a_claim(client: KazooClient, path: str) -> list[str]:
        if path == zpaths.job(job.jid) and not taken:
            taken.append(hold_lock(other_zk, lock))
        return real_children(client, path)

    monkeypatch.setattr(jobs, "children", children_after_a_claim)
    with pytest.raises((ItemLocked, Conflict)):
        jobs.job_remove(zk, job)
    assert taken
    assert zk.exists(zpaths.job(job.jid)) is not None
    still_held(zk, lock, taken[0])


def test_a_batch_delete_never_deletes_the_lock_of_an_unreadable_job(
    zk: KazooClient,
    other_zk: KazooClient,
    batch: Batch,
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    job = walk_job(zk, job, JobState.HELD)
    zk.set(zpaths.job_node(job.jid, "status"), b"not json")
    lock = zpaths.job_node(job.jid, "lock")
    stat = hold_lock(other_zk, lock)
    batches.batch_transition(zk, batch, BatchState.HELD)
    held = batches.batch_load(zk, batch.bid)
    with pytest.raises(ItemLocked):
        batches.batch_remove(zk, held)
    still_held(zk, lock, stat)
    assert zk.exists(zpaths.job(job.jid)) is not None


def test_a_batch_delete_never_deletes_a_batch_lock_taken_after_its_look(
    zk: KazooClient,
    other_zk: KazooClient,
    batch: Batch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches.batch_transition(zk, batch, BatchState.HELD)
    held = batches.batch_load(zk, batch.bid)
    lock = zpaths.batch_node(batch.bid, "lock")
    taken: list[Any] = []
    real_children = batches.children

    def children_after_a_claim(client: KazooClient, path: str) -> list[str]:
        if path == zpaths.batch(batch.bid) and not taken:
            taken.append(hold_lock(other_zk, lock))
        return real_children(client, path)

    monkeypatch.setattr(batches, "children", children_after_a_claim)
    with pytest.raises((ItemLocked, Conflict)):
        batches.batch_remove(zk, held)
    assert taken
    still_held(zk, lock, taken[0])
    assert zk.exists(zpaths.batch(batch.bid)) is not None


def test_an_operator_move_of_a_batch_another_session_holds_is_refused(
    zk: KazooClient, other_zk: KazooClient, batch: Batch
) -> None:
    batches.batch_transition(zk, batch, BatchState.HELD)
    held = batches.batch_load(zk, batch.bid)
    lock = zpaths.batch_node(batch.bid, "lock")
    stat = hold_lock(other_zk, lock)
    with pytest.raises(ItemLocked):
        batches.batch_transition(zk, held, BatchState.PENDING, admin=True)
    assert batches.batch_load(zk, batch.bid).state == BatchState.HELD
    still_held(zk, lock, stat)


# Items a newer Merritt may write ----------------------------------------------------------------


def test_a_batch_with_a_job_in_a_state_we_do_not_know_is_never_removed(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    """mrt-zk reads its job states from a YAML list (``merritt_zk_job_state.rb``): a newer
    library may add one. A batch holding such a job is left alone by a delete and by cleanup,
    and no job of it is removed, known or not."""
    known, newer = make_job(), make_job()
    walk_job(zk, known, JobState.HELD)
    # As a newer library might write it: a state and a key this console does not know.
    zk.set(
        zpaths.job_node(newer.jid, "status"),
        b'{"status":"Verifying","last_modified":"2026-11-21 10:02:03 -0800",'
        b'"last_successful_status":"Recording","retry_count":0,"message":"","verifier":"v2"}',
    )
    before = zk.get(zpaths.job_node(newer.jid, "status"))[0]
    batches.batch_transition(zk, batch, BatchState.HELD)
    held = batches.batch_load(zk, batch.bid)
    with pytest.raises(Conflict, match="Verifying"):
        batches.batch_remove(zk, held)
    assert zk.exists(zpaths.job(known.jid)) is not None
    assert zk.get(zpaths.job_node(newer.jid, "status"))[0] == before
    assert zk.exists(zpaths.batch(batch.bid)) is not None


def test_a_complete_batch_another_session_holds_is_not_moved_to_reporting_under_it(
    zk: KazooClient, other_zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    """After an operator's fail, and at the completion sweep: a Processing batch whose jobs
    all ended moves to Reporting, but not while Merritt's ingest holds the batch."""
    job = make_job()
    batches.batch_transition(zk, batch, BatchState.PROCESSING)
    walk_job(zk, job, JobState.FAILED)
    lock = zpaths.batch_node(batch.bid, "lock")
    stat = hold_lock(other_zk, lock)
    assert moves.batch_complete_if_done(bid=batch.bid) is False
    assert batches.batch_load(zk, batch.bid).state == BatchState.PROCESSING
    still_held(zk, lock, stat)
    other_zk.delete(lock)
    assert moves.batch_complete_if_done(bid=batch.bid) is True
    assert batches.batch_load(zk, batch.bid).state == BatchState.REPORTING


def test_a_release_of_a_collection_passes_over_a_held_job_another_session_holds(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from queues.services import hold_moves

    locked, free = make_job(), make_job()
    for job in (locked, free):
        walk_job(zk, job, JobState.HELD)
    stat = hold_lock(other_zk, zpaths.job_node(locked.jid, "lock"))
    outcomes = hold_moves.collection_release_held(profile=locked.profile)
    # The one passed over is said, not dropped: the operator learns it stays Held, and why.
    assert {(o.id, o.after, o.detail) for o in outcomes if o.kind == "job"} == {
        (free.jid, JobState.PENDING, ""),
        (locked.jid, JobState.HELD, "left alone: a session holds it"),
    }
    assert jobs.job_load(zk, locked.jid).state == JobState.HELD
    still_held(zk, zpaths.job_node(locked.jid, "lock"), stat)


# The consistency check's repairs: each is made only while no session holds the item, and none
# deletes a lock.


def _repair(zk: KazooClient, kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from queues.operator import check, check_repairs

    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    [finding] = [f for f in check.run_check(zk).findings if f.kind == kind]
    assert finding.repairable
    return check_repairs.repair_one(zk, finding)


def test_a_reindex_repair_of_a_job_another_session_holds_writes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = f"/jobs/states/pending/05-{job.jid}"
    zk.delete(entry)
    lock = zpaths.job_node(job.jid, "lock")
    stat = hold_lock(other_zk, lock)
    assert _repair(zk, "job-unindexed", monkeypatch).startswith(f"skipped /jobs/{job.jid}")
    assert zk.exists(entry) is None
    still_held(zk, lock, stat)
    other_zk.delete(lock)
    assert _repair(zk, "job-unindexed", monkeypatch) == f"created {entry}"
    assert zk.exists(lock) is None


@pytest.mark.parametrize("kind", ["incomplete-job", "incomplete-batch"])
def test_the_removal_of_an_abandoned_item_never_deletes_a_lock(
    zk: KazooClient, other_zk: KazooClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    root = "/jobs/jid0000000321" if kind == "incomplete-job" else "/batches/bid0000000321"
    zk.create(root, b"")
    lock = f"{root}/lock"
    stat = hold_lock(other_zk, lock)
    assert _repair(zk, kind, monkeypatch) == f"skipped {root}: a session holds its item's lock"
    still_held(zk, lock, stat)
    other_zk.delete(lock)
    assert _repair(zk, kind, monkeypatch) == f"removed abandoned {root}"
    assert zk.exists(root) is None


def test_the_states_marker_repair_of_a_batch_another_session_holds_writes_nothing(
    zk: KazooClient, other_zk: KazooClient, batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queues.zk.codecs import encode_json, now_stamp

    status = {"status": "Held", "last_modified": now_stamp(), "message": ""}
    zk.set(zpaths.batch_node(batch.bid, "status"), encode_json(status))  # as the library writes
    marker = zpaths.batch_node(batch.bid, "states")
    lock = zpaths.batch_node(batch.bid, "lock")
    stat = hold_lock(other_zk, lock)
    line = _repair(zk, "batch-states-missing", monkeypatch)
    assert line == f"skipped {marker}: a session holds its item's lock"
    assert zk.exists(marker) is None
    still_held(zk, lock, stat)
    other_zk.delete(lock)
    assert _repair(zk, "batch-states-missing", monkeypatch) == f"created {marker}"
