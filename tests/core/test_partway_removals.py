"""An operator's removal that takes more than one transaction (a batch delete removes its jobs
one by one): refused with nothing written when a job of the batch is held by a session, and,
when it is stopped after its first write (a lock taken after the look, ZooKeeper lost), it
leaves a batch marked Deleted, says what it did and what it did not, and the same action again
finishes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.core.states import BatchState, JobState
from queues.services import moves
from queues.zk import batches, jobs, locks
from queues.zk import paths as zpaths
from queues.zk.errors import ItemLocked, StoppedPartway, is_connection_error
from queues.zk.records import Batch, Job
from tests.zkproxy import request

from .test_fencing_operators import hold_lock, still_held

MULTI = 14  # ZooKeeper's opcode of a multi-operation


def failed_batch(zk: KazooClient, batch: Batch, make_job: Callable[..., Job]) -> list[Job]:
    """``batch`` Failed with three Failed jobs, oldest first (the order a delete takes them)."""
    made = [jobs.job_transition(zk, make_job(), JobState.FAILED) for _ in range(3)]
    batch = batches.batch_transition(zk, batch, BatchState.PROCESSING)
    batches.batch_transition(zk, batch, BatchState.FAILED)
    return sorted(made, key=lambda j: j.jid)


def present(zk: KazooClient, made: list[Job]) -> list[str]:
    return [j.jid for j in made if zk.exists(zpaths.job(j.jid)) is not None]


def test_a_batch_delete_with_a_job_another_session_holds_deletes_nothing(
    zk: KazooClient, other_zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    """The last job it would come to is held (Merritt's ingest took it): the delete is refused
    before its first write, not after the jobs before it are gone."""
    made = failed_batch(zk, batch, make_job)
    stat = hold_lock(other_zk, zpaths.job_node(made[-1].jid, "lock"))
    status = zk.get(zpaths.batch_node(batch.bid, "status"))
    with pytest.raises(ItemLocked, match=f"{made[-1].jid}.*nothing was deleted"):
        moves.batch_delete(bid=batch.bid)
    assert present(zk, made) == [j.jid for j in made]
    assert zk.get(zpaths.batch_node(batch.bid, "status")) == status
    still_held(zk, zpaths.job_node(made[-1].jid, "lock"), stat)


def test_a_batch_delete_with_an_unreadable_job_another_session_holds_deletes_nothing(
    zk: KazooClient, other_zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    made = failed_batch(zk, batch, make_job)
    zk.set(zpaths.job_node(made[-1].jid, "status"), b"not json")
    hold_lock(other_zk, zpaths.job_node(made[-1].jid, "lock"))
    with pytest.raises(ItemLocked, match="nothing was deleted"):
        moves.batch_delete(bid=batch.bid)
    assert present(zk, made) == [j.jid for j in made]
    assert batches.batch_load(zk, batch.bid).state == BatchState.FAILED


def lock_taken_at_listing(
    monkeypatch: pytest.MonkeyPatch, other_zk: KazooClient, jid: str
) -> list[Any]:
    """A session takes ``jid``'s lock once the delete has looked (as a claim would, between
    the look and the job's removal); its stat once taken."""
    taken: list[Any] = []
    real_children = jobs.children

    def children_after_a_claim(client: KazooClient, path: str) -> list[str]:
        if path == zpaths.job(jid) and not taken:
            taken.append(hold_lock(other_zk, zpaths.job_node(jid, "lock")))
        return real_children(client, path)

    monkeypatch.setattr(jobs, "children", children_after_a_claim)
    return taken


def test_a_batch_delete_stopped_by_a_lock_taken_part_way_says_what_it_did_and_again_finishes(
    zk: KazooClient,
    other_zk: KazooClient,
    batch: Batch,
    make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = failed_batch(zk, batch, make_job)
    taken = lock_taken_at_listing(monkeypatch, other_zk, made[1].jid)
    with pytest.raises(StoppedPartway) as stopped:
        moves.batch_delete(bid=batch.bid)
    said = str(stopped.value)
    assert "marked Deleted (it was Failed)" in said
    assert f"1 of its 3 jobs removed ({made[0].jid})" in said
    assert f"2 jobs ({made[1].jid}, {made[2].jid}) are still there" in said
    assert "again to finish" in said
    assert stopped.value.done == (batch.bid, made[0].jid)
    # What it leaves says no lie: the batch is Deleted, not a Failed one whose jobs are gone.
    assert batches.batch_load(zk, batch.bid).state == BatchState.DELETED
    assert present(zk, made) == [made[1].jid, made[2].jid]
    still_held(zk, zpaths.job_node(made[1].jid, "lock"), taken[0])
    # Once the session lets the job go, the same action goes on; stopped again, it says so.
    other_zk.delete(zpaths.job_node(made[1].jid, "lock"))
    lock_taken_at_listing(monkeypatch, other_zk, made[2].jid)
    with pytest.raises(
        StoppedPartway, match=f"is marked Deleted and 1 of its 2 jobs removed \\({made[1].jid}\\)"
    ):
        moves.batch_delete(bid=batch.bid)
    assert present(zk, made) == [made[2].jid]
    other_zk.delete(zpaths.job_node(made[2].jid, "lock"))
    outcome = moves.batch_delete(bid=batch.bid)
    assert (outcome.before, outcome.after) == (BatchState.DELETED, moves.REMOVED)
    assert zk.exists(zpaths.batch(batch.bid)) is None
    assert present(zk, made) == []


def test_a_batch_delete_cut_off_from_zookeeper_part_way_says_so_and_again_finishes(
    zk: KazooClient,
    batch: Batch,
    make_job: Callable[..., Job],
    proxy: Any,
    proxied_client: Any,
) -> None:
    made = failed_batch(zk, batch, make_job)
    cut_off = proxied_client()
    proxy.cut_before(request(MULTI, made[1].jid.encode()))
    with pytest.raises(StoppedPartway) as stopped:
        batches.batch_remove(cut_off, batches.batch_load(cut_off, batch.bid))
    assert proxy.fired.is_set()
    assert is_connection_error(stopped.value)  # the doors answer 503: ZooKeeper was away
    assert f"1 of its 3 jobs removed ({made[0].jid})" in str(stopped.value)
    assert batches.batch_load(zk, batch.bid).state == BatchState.DELETED
    assert present(zk, made) == [made[1].jid, made[2].jid]
    assert batches.batch_remove(zk, batches.batch_load(zk, batch.bid)) == [
        made[1].jid,
        made[2].jid,
    ]
    assert zk.exists(zpaths.batch(batch.bid)) is None


def test_a_batch_without_jobs_is_deleted_in_one_transaction_without_being_marked_first(
    zk: KazooClient, batch: Batch
) -> None:
    held = batches.batch_transition(zk, batch, BatchState.HELD)
    assert batches.batch_remove(zk, held) == []
    assert zk.exists(zpaths.batch(batch.bid)) is None


@pytest.mark.django_db
def test_a_cleanup_stopped_part_way_on_a_batch_says_so_audits_it_and_again_finishes_it(
    zk: KazooClient,
    other_zk: KazooClient,
    batch: Batch,
    make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
    ops: Any,
) -> None:
    from queues.operator.audit import AuditEntry

    from .test_commands import queue

    made = sorted(
        (jobs.job_transition(zk, make_job(), JobState.HELD) for _ in range(2)),
        key=lambda j: j.jid,
    )
    for state in (BatchState.PROCESSING, BatchState.REPORTING, BatchState.COMPLETED):
        batch = batches.batch_transition(zk, batch, state)
    lock_taken_at_listing(monkeypatch, other_zk, made[1].jid)
    out = queue("cleanup", "--reason", "housekeeping").splitlines()
    assert out[0].startswith(f"batch {batch.bid}: Completed -> Deleted (stopped part-way")
    assert out[-1] == (
        "0 completed batches cleaned up, 0 items marked Deleted removed, 1 batches stopped "
        "part-way (marked Deleted; cleanup again finishes them)"
    )
    entry = AuditEntry.objects.get(action="cleanup", item_id=batch.bid)
    assert (entry.before, entry.after) == (BatchState.COMPLETED, BatchState.DELETED)
    assert f"1 of its 2 jobs removed ({made[0].jid})" in entry.detail
    assert present(zk, made) == [made[1].jid]
    other_zk.delete(zpaths.job_node(made[1].jid, "lock"))
    # Again, even when asked only for batches older than a month: it was marked just now.
    out = queue("cleanup", "--older-than-days", "30", "--reason", "housekeeping").splitlines()
    assert out[0] == f"batch {batch.bid}: Deleted -> removed (1 jobs deleted)"
    assert zk.exists(zpaths.batch(batch.bid)) is None and present(zk, made) == []


# A collection's release of its held items moves them one transaction each.


def held_jobs(zk: KazooClient, make_job: Callable[..., Job]) -> list[Job]:
    """Three Held jobs of one collection, in the order a release takes them."""
    made = [jobs.job_transition(zk, make_job(), JobState.HELD) for _ in range(3)]
    return sorted(made, key=lambda j: j.jid)


def states_of(zk: KazooClient, made: list[Job]) -> list[str]:
    return [jobs.job_load(zk, j.jid).state for j in made]


def test_a_collection_release_cut_off_part_way_names_what_it_released_and_again_finishes(
    zk: KazooClient,
    make_job: Callable[..., Job],
    proxy: Any,
    proxied_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queues.services import hold_moves

    made = held_jobs(zk, make_job)
    profile = made[0].profile
    locks.collection_hold_set(zk, zpaths.profile(profile))
    cut_off = proxied_client()
    monkeypatch.setattr(hold_moves, "client", lambda: cut_off)
    proxy.cut_before(request(MULTI, made[1].jid.encode()))
    with pytest.raises(StoppedPartway) as stopped:
        hold_moves.collection_release(profile=profile, release_jobs=True)
    assert proxy.fired.is_set()
    assert is_connection_error(stopped.value)
    said = str(stopped.value)
    assert f"collection {profile} held -> released; job {made[0].jid} Held -> Pending" in said
    assert "release again to finish" in said
    assert stopped.value.done == (profile, made[0].jid)
    assert states_of(zk, made) == [JobState.PENDING, JobState.HELD, JobState.HELD]
    monkeypatch.undo()
    outcomes = hold_moves.collection_release(profile=profile, release_jobs=True)
    assert [(o.id, o.before, o.after) for o in outcomes[1:]] == [
        (made[1].jid, JobState.HELD, JobState.PENDING),
        (made[2].jid, JobState.HELD, JobState.PENDING),
    ]
    assert states_of(zk, made) == [JobState.PENDING] * 3


@pytest.mark.django_db
def test_a_release_held_stopped_part_way_is_audited_with_what_it_released(
    zk: KazooClient,
    make_job: Callable[..., Job],
    proxy: Any,
    proxied_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    ops: Any,
) -> None:
    from django.core.management.base import CommandError

    from queues.operator.audit import AuditEntry
    from queues.services import hold_moves

    from .test_commands import queue

    made = held_jobs(zk, make_job)
    cut_off = proxied_client()
    monkeypatch.setattr(hold_moves, "client", lambda: cut_off)
    proxy.cut_before(request(MULTI, made[2].jid.encode()))
    with pytest.raises((CommandError, StoppedPartway)):
        queue("release-held", made[0].profile, "--reason", "window over")
    entry = AuditEntry.objects.get(action="release-held")
    assert not entry.ok and entry.detail.startswith("stopped: ")
    assert f"job {made[0].jid} Held -> Pending; job {made[1].jid} Held -> Pending" in entry.detail
    monkeypatch.undo()
    queue("release-held", made[0].profile, "--reason", "window over")
    assert states_of(zk, made) == [JobState.PENDING] * 3


def test_a_batch_delete_removes_its_jobs_as_it_read_them_before_its_first_write(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job], monkeypatch: Any
) -> None:
    """The jobs are read once, before the first write, and removed as read: one removed by
    another delete meanwhile is passed over; one changed meanwhile stops the delete, named,
    instead of going unlooked-at; the same delete again finishes."""
    made = failed_batch(zk, batch, make_job)
    looked = batches._refuse_before_removing

    def then_others_act(*args: Any, **kwargs: Any) -> Any:
        seen = looked(*args, **kwargs)
        jobs.job_remove(zk, jobs.job_load(zk, made[0].jid), check_state=False)
        jobs.job_transition(zk, jobs.job_load(zk, made[1].jid), JobState.ESTIMATING, admin=True)
        return seen

    monkeypatch.setattr(batches, "_refuse_before_removing", then_others_act)
    with pytest.raises(StoppedPartway, match=f"{made[1].jid}"):
        moves.batch_delete(bid=batch.bid)
    assert present(zk, made) == [made[1].jid, made[2].jid]
    monkeypatch.setattr(batches, "_refuse_before_removing", looked)
    assert batches.batch_load(zk, batch.bid).state == BatchState.DELETED
    moves.batch_remove_deleted(bid=batch.bid)
    assert present(zk, made) == []
