"""The operator's moves through the service layer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from kazoo.client import KazooClient

from queues.operator import catalogue
from queues.operator.catalogue import Call
from queues.services import hold_moves, moves
from queues.zk import batches, jobs, locks
from queues.zk.errors import Conflict, InvalidID, InvalidTransition, ItemLocked, NotFound, QueueHeld
from queues.zk.records import Batch, Job
from tests.jobnodes import set_job_nodes

from .helpers import (
    assert_batch_status,
    assert_indexed,
    assert_job_status,
    job_index_paths,
    snapshot,
    walk_job,
)


def job_tree(zk: KazooClient, bid: str) -> dict:
    return snapshot(zk, "/jobs", f"/batches/{bid}")


# Jobs ---------------------------------------------------------------------------------------


def test_operator_holds_a_pending_job(zk: KazooClient, job: Job, batch: Batch) -> None:
    outcome = moves.job_hold(jid=job.jid)
    assert str(outcome) == f"job {job.jid}: Pending -> Held"
    assert_job_status(
        zk, job.jid, status="Held", last_successful="Pending", message="held by an operator"
    )
    assert_indexed(zk, job, batch.bid, "Held")


def test_only_a_pending_job_can_be_held(zk: KazooClient, job: Job, batch: Batch) -> None:
    walk_job(zk, job, "Estimating")
    before = job_tree(zk, batch.bid)
    with pytest.raises(InvalidTransition):
        moves.job_hold(jid=job.jid)
    assert job_tree(zk, batch.bid) == before


def test_operator_releases_a_held_job(zk: KazooClient, job: Job, batch: Batch) -> None:
    moves.job_hold(jid=job.jid)
    outcome = moves.job_release(jid=job.jid)
    assert (outcome.before, outcome.after) == ("Held", "Pending")
    assert_indexed(zk, job, batch.bid, "Pending")


def test_release_is_refused_while_the_collection_is_held(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    moves.job_hold(jid=job.jid)
    locks.collection_hold_set(zk, job.profile)
    before = job_tree(zk, batch.bid)
    with pytest.raises(QueueHeld, match=job.profile):
        moves.job_release(jid=job.jid)
    assert job_tree(zk, batch.bid) == before
    locks.collection_hold_clear(zk, job.profile)
    moves.job_release(jid=job.jid)
    assert_indexed(zk, job, batch.bid, "Pending")


def test_release_of_a_job_that_is_not_held_is_refused(zk: KazooClient, job: Job) -> None:
    with pytest.raises(InvalidTransition):
        moves.job_release(jid=job.jid)


@pytest.mark.parametrize("state", ["Pending", "Estimating", "Downloading", "Notify"])
def test_operator_fails_a_job_with_a_reason(
    zk: KazooClient, job: Job, batch: Batch, state: str
) -> None:
    job = walk_job(zk, job, state)
    moves.job_fail(jid=job.jid, message="stuck on a bad host")
    assert_job_status(
        zk,
        job.jid,
        status="Failed",
        last_successful=job.status.last_successful_status,
        message="stuck on a bad host",
    )
    assert_indexed(zk, job, batch.bid, "Failed")


@pytest.mark.parametrize("state", ["Completed", "Held"])
def test_operator_cannot_fail_a_finished_or_held_job(zk: KazooClient, job: Job, state: str) -> None:
    walk_job(zk, job, state)
    with pytest.raises(InvalidTransition):
        moves.job_fail(jid=job.jid, message="x")


@pytest.mark.parametrize("state", ["Failed", "Held", "Completed"])
def test_delete_removes_every_node_and_both_index_entries(
    zk: KazooClient, job: Job, batch: Batch, state: str, make_job: Callable[..., Job]
) -> None:
    other = make_job()
    job = walk_job(zk, job, state)
    set_job_nodes(zk, job, identifiers={"primary_id": "ark:/1/x", "local_id": []})
    outcome = moves.job_delete(jid=job.jid)
    assert (outcome.before, outcome.after) == (state, "Deleted")
    assert zk.exists(f"/jobs/{job.jid}") is None
    assert job_index_paths(zk, job.jid) == []
    for folder in zk.get_children(f"/batches/{batch.bid}/states"):
        assert job.jid not in zk.get_children(f"/batches/{batch.bid}/states/{folder}")
    assert_indexed(zk, other, batch.bid, "Pending")


@pytest.mark.parametrize("state", ["Pending", "Estimating", "Notify"])
def test_delete_of_a_job_still_in_the_queue_is_refused(
    zk: KazooClient, job: Job, batch: Batch, state: str
) -> None:
    walk_job(zk, job, state)
    before = job_tree(zk, batch.bid)
    with pytest.raises(InvalidTransition):
        moves.job_delete(jid=job.jid)
    assert job_tree(zk, batch.bid) == before


def test_delete_of_a_locked_job_is_refused(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    jobs.job_transition(zk, job, "Failed")
    other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    before = job_tree(zk, batch.bid)
    with pytest.raises(ItemLocked):
        moves.job_delete(jid=job.jid)
    assert job_tree(zk, batch.bid) == before


@pytest.mark.parametrize("action", ["hold", "release", "resume", "delete"])
def test_action_on_a_page_rendered_from_an_old_version_is_refused(
    zk: KazooClient, job: Job, batch: Batch, action: str
) -> None:
    version = job.status.version
    jobs.job_transition(zk, job, "Failed")
    before = job_tree(zk, batch.bid)
    with pytest.raises(Conflict, match="reload"):
        catalogue.find("job", action).run(Call(job.jid, version))
    assert job_tree(zk, batch.bid) == before


def test_action_with_the_current_version_goes_ahead(zk: KazooClient, job: Job) -> None:
    failed = jobs.job_transition(zk, job, "Failed")
    moves.job_resume(jid=job.jid, expect_version=failed.status.version)
    assert jobs.job_load(zk, job.jid).state == "Estimating"


@pytest.mark.parametrize("bad", ["jid1", "bid0000000001", "jid0000000001/lock", "../jobs"])
@pytest.mark.parametrize("action", ["hold", "release", "resume", "delete"])
def test_malformed_job_id_is_refused(zk: KazooClient, bad: str, action: str) -> None:
    with pytest.raises(InvalidID):
        catalogue.find("job", action).run(Call(bad))


def test_unknown_job_is_not_found(zk: KazooClient) -> None:
    with pytest.raises(NotFound, match="jid0000009999"):
        moves.job_resume(jid="jid0000009999")


# Batches ------------------------------------------------------------------------------------


def test_operator_releases_a_held_batch(zk: KazooClient, batch: Batch) -> None:
    batches.batch_transition(zk, batch, "Held")
    outcome = moves.batch_release(bid=batch.bid)
    assert (outcome.before, outcome.after) == ("Held", "Pending")
    assert_batch_status(zk, batch.bid, status="Pending")


def test_batch_release_is_refused_while_the_collection_is_held(
    zk: KazooClient, batch: Batch
) -> None:
    batches.batch_transition(zk, batch, "Held")
    locks.collection_hold_set(zk, batch.profile)
    with pytest.raises(QueueHeld):
        moves.batch_release(bid=batch.bid)
    assert_batch_status(zk, batch.bid, status="Held")


def test_operator_starts_update_reporting_of_a_failed_batch(zk: KazooClient, batch: Batch) -> None:
    for state in ("Processing", "Reporting", "Failed"):
        batch = batches.batch_transition(zk, batch, state)
    outcome = moves.batch_update_reporting(bid=batch.bid)
    assert (outcome.before, outcome.after) == ("Failed", "UpdateReporting")
    assert_batch_status(zk, batch.bid, status="UpdateReporting")


def test_update_reporting_of_a_completed_batch_is_refused(zk: KazooClient, batch: Batch) -> None:
    for state in ("Processing", "Reporting", "Completed"):
        batch = batches.batch_transition(zk, batch, state)
    with pytest.raises(InvalidTransition):
        moves.batch_update_reporting(bid=batch.bid)


def test_batch_delete_removes_the_batch_its_jobs_and_its_uuid(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job], make_batch: Callable[..., Batch]
) -> None:
    other_batch = make_batch()
    bystander = make_job(bid=other_batch.bid)
    done, failed = make_job(), make_job()
    walk_job(zk, done, "Completed")
    jobs.job_transition(zk, failed, "Failed")
    for state in ("Processing", "Reporting", "Failed"):
        batch = batches.batch_transition(zk, batch, state)
    batches.batch_write_report(zk, batch, failed=[failed.jid], successful=[done.jid])
    outcome = moves.batch_delete(bid=batch.bid)
    assert outcome.detail == "2 jobs deleted"
    assert zk.exists(f"/batches/{batch.bid}") is None
    assert zk.exists(f"/batch-uuids/{batch.uuid}") is None
    for job in (done, failed):
        assert zk.exists(f"/jobs/{job.jid}") is None
        assert job_index_paths(zk, job.jid) == []
    assert_indexed(zk, bystander, other_batch.bid, "Pending")
    assert zk.exists(f"/batch-uuids/{other_batch.uuid}") is not None


def test_held_batch_without_jobs_can_be_deleted(zk: KazooClient, batch: Batch) -> None:
    batches.batch_transition(zk, batch, "Held")
    moves.batch_delete(bid=batch.bid)
    assert batches.batch_ids(zk) == []
    assert zk.get_children("/batch-uuids") == []


@pytest.mark.parametrize("state", ["Pending", "Processing", "Reporting"])
def test_running_batch_cannot_be_deleted(zk: KazooClient, batch: Batch, state: str) -> None:
    for target in {"Pending": [], "Processing": ["Processing"]}.get(
        state, ["Processing", "Reporting"]
    ):
        batch = batches.batch_transition(zk, batch, target)
    with pytest.raises(InvalidTransition):
        moves.batch_delete(bid=batch.bid)
    assert zk.exists(f"/batches/{batch.bid}/status") is not None


def test_locked_batch_cannot_be_deleted(
    zk: KazooClient, other_zk: KazooClient, batch: Batch
) -> None:
    batches.batch_transition(zk, batch, "Held")
    other_zk.create(f"/batches/{batch.bid}/lock", b"", ephemeral=True)
    with pytest.raises(ItemLocked):
        moves.batch_delete(bid=batch.bid)
    assert zk.exists(f"/batches/{batch.bid}/status") is not None


def test_cleanup_deletes_only_completed_batches(
    zk: KazooClient, make_batch: Callable[..., Batch], make_job: Callable[..., Job]
) -> None:
    completed, failed = make_batch(), make_batch()
    job = make_job(bid=completed.bid)
    walk_job(zk, job, "Completed")
    for state in ("Processing", "Reporting", "Completed"):
        completed = batches.batch_transition(zk, completed, state)
    for state in ("Processing", "Reporting", "Failed"):
        failed = batches.batch_transition(zk, failed, state)
    assert list(moves.batches_cleanup(older_than=timedelta(days=1))) == []
    done = list(moves.batches_cleanup())
    assert [(o.id, o.after, o.detail) for o in done] == [
        (completed.bid, "Deleted", "1 jobs deleted")
    ]
    assert zk.exists(f"/jobs/{job.jid}") is None
    remaining = batches.batch_ids(zk)
    assert completed.bid not in remaining and failed.bid in remaining


@pytest.mark.parametrize("action", ["release", "update-reporting", "delete"])
def test_batch_action_on_an_old_version_is_refused(
    zk: KazooClient, batch: Batch, action: str
) -> None:
    version = batch.status.version
    batches.batch_transition(zk, batch, "Held")
    with pytest.raises(Conflict):
        catalogue.find("batch", action).run(Call(batch.bid, version))
    assert_batch_status(zk, batch.bid, status="Held")


@pytest.mark.parametrize("action", ["release", "update-reporting", "delete"])
def test_malformed_batch_id_is_refused(zk: KazooClient, action: str) -> None:
    with pytest.raises(InvalidID):
        catalogue.find("batch", action).run(Call("bid12"))


# Collections --------------------------------------------------------------------------------


def test_collection_release_held_releases_every_held_job_and_batch_of_the_collection(
    zk: KazooClient,
    make_batch: Callable[..., Batch],
    make_job: Callable[..., Job],
) -> None:
    mine_batch = make_batch(profile="coll_a")
    their_batch = make_batch(profile="coll_b")
    batches.batch_transition(zk, mine_batch, "Held")
    batches.batch_transition(zk, their_batch, "Held")
    mine = [make_job(profile="coll_a") for _ in range(3)]
    theirs = make_job(profile="coll_b")
    for job in [*mine, theirs]:
        jobs.job_transition(zk, job, "Held")
    running = walk_job(zk, make_job(profile="coll_a"), "Estimating")
    locks.collection_hold_set(zk, "coll_a")
    with pytest.raises(QueueHeld):
        hold_moves.collection_release_held(profile="coll_a")
    outcomes = hold_moves.collection_release(profile="coll_a", release_jobs=True)
    assert str(outcomes[0]) == "collection coll_a: held -> released"
    released = {(o.kind, o.id) for o in outcomes[1:]}
    assert released == {("job", j.jid) for j in mine} | {("batch", mine_batch.bid)}
    for job in mine:
        assert jobs.job_load(zk, job.jid).state == "Pending"
    assert jobs.job_load(zk, theirs.jid).state == "Held"
    assert jobs.job_load(zk, running.jid).state == "Estimating"
    assert_batch_status(zk, mine_batch.bid, status="Pending")
    assert_batch_status(zk, their_batch.bid, status="Held")


def test_cleanup_leaves_a_locked_batch_alone_and_goes_on(
    zk: KazooClient, other_zk: KazooClient, make_batch: Callable[..., Batch]
) -> None:
    first, second = make_batch(), make_batch()
    for state in ("Processing", "Reporting", "Completed"):
        first = batches.batch_transition(zk, first, state)
        second = batches.batch_transition(zk, second, state)
    other_zk.create(f"/batches/{first.bid}/lock", b"", ephemeral=True)  # someone works on it
    done = {o.id: o for o in moves.batches_cleanup()}
    assert done[first.bid].after == "Completed" and "left alone" in done[first.bid].detail
    assert done[second.bid].after == "Deleted"
    assert batches.batch_ids(zk) == [first.bid]
