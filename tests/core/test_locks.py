"""Item locks: ephemeral markers, priority order, races between clients, session loss."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.chaos import txnlog
from queues.zk import access, batches, jobs, paths
from queues.zk.locks import is_item_lock, lock_create, lock_owned, lock_release
from queues.zk.records import Batch, Job

from .helpers import walk_job


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def assert_ephemeral_marker(zk: KazooClient, path: str, owner: KazooClient) -> None:
    data, stat = zk.get(path)
    assert data == b""
    assert stat.ephemeralOwner == owner.client_id[0]


def test_acquire_returns_jobs_in_priority_order_then_by_jid(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    low = make_job(priority=10)
    normal_a = make_job()
    urgent = make_job(priority=0)
    normal_b = make_job()
    got = [jobs.job_acquire(zk, "Pending") for _ in range(4)]
    assert [j.jid for j in got if j] == [urgent.jid, normal_a.jid, normal_b.jid, low.jid]
    assert jobs.job_acquire(zk, "Pending") is None


def test_acquired_job_holds_an_ephemeral_empty_lock(zk: KazooClient, job: Job) -> None:
    acquired = jobs.job_acquire(zk, "Pending")
    assert acquired is not None and acquired.jid == job.jid
    assert_ephemeral_marker(zk, f"/jobs/{job.jid}/lock", zk)
    assert acquired.lock is not None and acquired.lock.session_id == zk.client_id[0]
    jobs.job_unlock(zk, acquired)
    assert zk.exists(f"/jobs/{job.jid}/lock") is None


@pytest.mark.quick
def test_acquire_skips_a_job_locked_by_another_client(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    head, second = make_job(), make_job()
    theirs = jobs.job_acquire(other_zk, "Pending")
    assert theirs is not None and theirs.jid == head.jid
    mine = jobs.job_acquire(zk, "Pending")
    assert mine is not None and mine.jid == second.jid
    assert jobs.job_acquire(zk, "Pending") is None


def test_acquire_only_looks_at_the_requested_state(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    pending = make_job()
    walk_job(zk, make_job(), "Downloading")
    assert jobs.job_acquire(zk, "Estimating") is None
    acquired = jobs.job_acquire(zk, "Pending")
    assert acquired is not None and acquired.jid == pending.jid


def test_acquire_skips_a_job_the_accept_filter_refuses(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    first = make_job(profile="collection_a")
    second = make_job(profile="collection_b")
    acquired = jobs.job_acquire(zk, "Pending", accept=lambda j: j.profile == "collection_b")
    assert acquired is not None and acquired.jid == second.jid
    assert zk.exists(f"/jobs/{first.jid}/lock") is None


def test_acquire_skips_a_job_that_moved_on_since_the_listing(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    # A stale index entry (the job already moved) must not hand the job to a second consumer.
    jobs.job_transition(zk, job, "Estimating")
    zk.create(f"/jobs/states/pending/05-{job.jid}", b"")
    assert jobs.job_acquire(zk, "Pending") is None
    assert zk.exists(f"/jobs/{job.jid}/lock") is None


def test_lock_release_leaves_another_sessions_lock_alone(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    path = f"/jobs/{job.jid}/lock"
    assert lock_create(other_zk, path)
    assert not lock_create(zk, path)
    lock_release(zk, path)
    assert zk.exists(path) is not None
    assert lock_owned(other_zk, path) and not lock_owned(zk, path)


def race(clients: tuple[KazooClient, KazooClient], take: Callable[[KazooClient], object]) -> list:
    """Run ``take`` on both clients at the same moment; return both results."""
    got: list[object] = [None, None]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=10)

    def run(index: int) -> None:
        try:
            barrier.wait()
            got[index] = take(clients[index])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors
    return got


def race_winner(clients: tuple[KazooClient, KazooClient], take: Callable[[KazooClient], Any]):
    """Race ``take`` on both clients; exactly one may get an item: (its client, the item)."""
    got = race(clients, take)
    winners = [(client, item) for client, item in zip(clients, got, strict=True) if item]
    assert len(winners) == 1, got
    return winners[0]


def test_two_clients_racing_for_the_head_never_both_get_it(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    for _ in range(25):
        head = make_job()
        client, winner = race_winner((zk, other_zk), lambda c: jobs.job_acquire(c, "Pending"))
        assert winner.jid == head.jid
        jobs.job_unlock(client, jobs.job_transition(client, winner, "Estimating", keep_lock=True))


def test_workers_on_two_clients_process_every_job_exactly_once(
    zk: KazooClient, other_zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    created = {make_job().jid for _ in range(30)}
    done: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def worker(client: KazooClient, seen: list[str]) -> None:
        try:
            while (job := jobs.job_acquire(client, "Pending")) is not None:
                jobs.job_transition(client, job, "Estimating", keep_lock=True)
                jobs.job_unlock(client, job)
                seen.append(job.jid)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(client, seen))
        for client, seen in zip((zk, other_zk), done, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    everything = done[0] + done[1]
    assert sorted(everything) == sorted(created)
    assert zk.get_children("/jobs/states/pending") == []


def test_lock_of_a_client_whose_session_ends_is_released(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    theirs = jobs.job_acquire(other_zk, "Pending")
    assert theirs is not None
    assert jobs.job_acquire(zk, "Pending") is None
    other_zk.stop()
    assert wait_until(lambda: zk.exists(f"/jobs/{job.jid}/lock") is None)
    mine = jobs.job_acquire(zk, "Pending")
    assert mine is not None and mine.jid == job.jid
    assert_ephemeral_marker(zk, f"/jobs/{job.jid}/lock", zk)


def test_batches_in_a_state_oldest_first_and_a_locked_one_not_taken_until_its_session_ends(
    zk: KazooClient, other_zk: KazooClient, make_batch: Callable[..., Batch]
) -> None:
    first, second, third = make_batch(), make_batch(), make_batch()
    batches.batch_transition(zk, second, "Held")
    assert batches.batches_in_state(zk, "Pending") == [first.bid, third.bid]
    theirs = batches.batch_try_acquire(other_zk, first.bid, "Pending")
    assert theirs is not None and theirs.bid == first.bid
    assert_ephemeral_marker(zk, f"/batches/{first.bid}/lock", other_zk)
    assert batches.batch_try_acquire(zk, first.bid, "Pending") is None  # theirs
    assert batches.batch_try_acquire(zk, second.bid, "Pending") is None  # Held: not taken
    assert zk.exists(f"/batches/{second.bid}/lock") is None  # and its lock given back
    mine = batches.batch_try_acquire(zk, third.bid, "Pending")
    assert mine is not None and mine.lock is not None
    other_zk.stop()
    assert wait_until(lambda: zk.exists(f"/batches/{first.bid}/lock") is None)
    again = batches.batch_try_acquire(zk, first.bid, "Pending")
    assert again is not None and again.bid == first.bid
    batches.batch_unlock(zk, again)
    assert zk.exists(f"/batches/{first.bid}/lock") is None


@pytest.mark.parametrize("queue", ["small", "large"])
def test_access_acquire_takes_pending_requests_in_order_and_skips_locked(
    zk: KazooClient, other_zk: KazooClient, queue: str
) -> None:
    token = {"token": "t"}
    first = access.access_create(zk, queue=queue, token=token)
    second = access.access_create(zk, queue=queue, token=token)
    theirs = access.access_acquire(other_zk, queue)
    assert theirs is not None and theirs.qid == first.qid
    assert_ephemeral_marker(zk, f"/access/{queue}/{first.qid}/lock", other_zk)
    mine = access.access_acquire(zk, queue)
    assert mine is not None and mine.qid == second.qid
    assert access.access_acquire(zk, queue) is None
    other_zk.stop()
    assert wait_until(lambda: zk.exists(f"/access/{queue}/{first.qid}/lock") is None)
    again = access.access_acquire(zk, queue)
    assert again is not None and again.qid == first.qid
    access.access_unlock(zk, again)
    assert zk.exists(f"/access/{queue}/{first.qid}/lock") is None


def test_access_acquire_prefers_the_first_state_and_reads_a_completed_request_once(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = {"token": "t"}
    done, waiting, interrupted = (
        access.access_create(zk, queue="small", token=token) for _ in "abc"
    )
    access.access_transition(zk, access.access_transition(zk, done, "Processing"), "Completed")
    access.access_transition(zk, interrupted, "Processing")
    loaded: list[list[str]] = []
    real = access.accesses_load
    monkeypatch.setattr(
        access, "accesses_load", lambda c, q, ids: loaded.append(list(ids)) or real(c, q, ids)
    )
    first = access.access_acquire(zk, "small", "Processing", "Pending")
    assert first is not None and first.qid == interrupted.qid  # younger, but Processing first
    second = access.access_acquire(zk, "small", "Processing", "Pending")
    assert second is not None and second.qid == waiting.qid
    assert access.access_acquire(zk, "small", "Processing", "Pending") is None
    assert done.qid in loaded[0]
    assert all(done.qid not in ids for ids in loaded[1:])  # Completed: not read again


def test_two_clients_racing_for_a_batch_never_both_get_it(
    zk: KazooClient, other_zk: KazooClient, make_batch: Callable[..., Batch]
) -> None:
    for _ in range(10):
        created = make_batch()
        client, winner = race_winner(
            (zk, other_zk), lambda c, bid=created.bid: batches.batch_try_acquire(c, bid, "Pending")
        )
        assert winner.bid == created.bid
        batches.batch_unlock(
            client, batches.batch_transition(client, winner, "Processing", holder=True)
        )


def test_two_clients_racing_for_an_access_request_never_both_get_it(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    for _ in range(10):
        created = access.access_create(zk, queue="small", token={"token": "t"})
        client, winner = race_winner((zk, other_zk), lambda c: access.access_acquire(c, "small"))
        assert winner.qid == created.qid
        access.access_unlock(
            client, access.access_transition(client, winner, "Processing", holder=True)
        )


def test_a_move_that_keeps_the_lock_leaves_it_in_place_and_needs_it(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    from queues.zk.errors import Conflict
    from queues.zk.locks import lock_break

    acquired = jobs.job_acquire(zk, "Pending")
    assert acquired is not None
    moved = jobs.job_transition(zk, acquired, "Estimating", keep_lock=True)
    assert_ephemeral_marker(zk, f"/jobs/{job.jid}/lock", zk)  # kept for the next step
    # Without the lock (gone with a session, or broken) a move that keeps it writes nothing.
    lock_break(zk, f"/jobs/{job.jid}/lock", zk.client_id[0])
    with pytest.raises(Conflict):
        jobs.job_transition(zk, moved, "Provisioning", keep_lock=True)
    with pytest.raises(Conflict):
        jobs.transition_apply(
            zk, jobs.transition_plan(moved, "Provisioning", lock="release"), require_lock=True
        )
    current = jobs.job_load(zk, job.jid)
    assert current.state == "Estimating"
    assert current.status.version == moved.status.version
    assert zk.exists(f"/jobs/states/estimating/05-{job.jid}") is not None


def test_a_batched_move_and_the_one_job_move_write_the_same_bytes(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from queues.zk.pipeline import PendingMove

    one, two, three = make_job(), make_job(), make_job()
    jobs.job_transition(zk, one, "Estimating", priority=7)
    plans = [jobs.transition_plan(j, "Estimating", priority=7) for j in (two, three)]
    PendingMove(zk, plans).collect(lambda fn: fn())

    def content(jid: str) -> tuple[dict, bytes]:
        raw = json.loads(zk.get(f"/jobs/{jid}/status")[0])
        raw.pop("last_modified")
        return raw, zk.get(f"/jobs/{jid}/priority")[0]

    assert content(two.jid) == content(one.jid) == content(three.jid)
    for j in (one, two, three):
        assert zk.exists(f"/jobs/states/estimating/07-{j.jid}") is not None
        assert zk.exists(f"/jobs/states/pending/05-{j.jid}") is None
        assert zk.exists(f"/batches/{j.bid}/states/batch-processing/{j.jid}") is not None


def test_a_batched_move_writes_each_job_its_own_status_bytes(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    # The move encodes a status once for a run of equal ones: an equal status with its keys in
    # another order, and a different one, are still written as their own JSON.
    import dataclasses

    from queues.zk.codecs import encode_json
    from queues.zk.pipeline import PendingMove

    one, two, three, four = (make_job() for _ in range(4))
    plans = [jobs.transition_plan(j, "Estimating") for j in (one, two, three, four)]
    plans[1] = dataclasses.replace(plans[1], raw=dict(plans[0].raw))
    plans[2] = dataclasses.replace(plans[2], raw=dict(reversed(list(plans[0].raw.items()))))
    plans[3] = dataclasses.replace(plans[3], raw={**plans[0].raw, "message": "other"})
    PendingMove(zk, plans).collect(lambda fn: fn())
    for plan in plans:
        assert zk.get(f"/jobs/{plan.job.jid}/status")[0] == encode_json(plan.raw)
    assert encode_json(plans[2].raw) != encode_json(plans[0].raw)  # the order counts


def test_a_batched_move_makes_the_batch_folder_its_first_ended_jobs_go_into(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    """A batch's ``batch-completed`` folder is made when its first job ends. A multi creating
    an entry in a missing folder fails whole, and each job was then moved on its own, round trip
    by round trip: the move makes the folder first, and its multi goes through."""
    from queues.zk.pipeline import PendingMove

    two = [walk_job(zk, make_job(), "Notify") for _ in range(2)]
    zk.ensure_path("/jobs/states/completed")  # as every installation has it (ensure_layout)
    folder = f"/batches/{two[0].bid}/states/batch-completed"
    assert zk.exists(folder) is None
    move = PendingMove(zk, [jobs.transition_plan(j, "Completed") for j in two])
    moved = move.collect(lambda fn: fn())
    assert not move.fell_back
    assert [m.state for m in moved if isinstance(m, Job)] == ["Completed", "Completed"]
    assert sorted(zk.get_children(folder)) == sorted(j.jid for j in two)


def test_a_batched_move_never_makes_a_deleted_batch_again(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from queues.zk.errors import NotFound
    from queues.zk.pipeline import PendingMove

    job = walk_job(zk, make_job(), "Notify")
    plan = jobs.transition_plan(job, "Completed")
    zk.delete(f"/batches/{job.bid}", recursive=True)
    [outcome] = PendingMove(zk, [plan]).collect(lambda fn: fn())
    assert isinstance(outcome, NotFound)
    assert zk.exists(f"/batches/{job.bid}") is None


def test_every_per_object_lock_folder_is_a_lock_to_the_ledger_and_the_judge() -> None:
    # Recording's own lock (/mrt-console/locks/recording) is kept like Merritt's object locks:
    # by the ledger (a lock in doubt after a connection loss) and by the chaos judge.
    for root in paths.OBJECT_LOCK_ROOTS:
        lock = f"{root}/ark_13030_m5abc"
        assert is_item_lock(lock), lock
        assert txnlog.is_item_lock(lock), lock
        assert not txnlog.is_item_lock(root)
        assert not txnlog.is_item_lock(f"{lock}/child")
