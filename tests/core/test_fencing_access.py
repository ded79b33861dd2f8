"""Access requests under the fencing rule (the contract's "Deleting a lock" and the paragraph
after it): every write to a request's nodes and every lock delete is made by the lock's owner,
in a multi that checks the lock is still the writer's.

Merritt's storage claims a request by taking its ephemeral ``lock`` (mrt-zk ``Access.java``,
``acquirePendingAssembly``; ``QueueItem.lock``) and keeps it until after its last move. Here a
second client with its own session takes that lock, as storage would: an operator's move or
removal is refused (ItemLocked, nothing written, the lock left), and a consumer of ours writes
only under a lock of its own session, through its claim's session gate."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.core.states import AccessState
from queues.daemons.access import AccessSmall
from queues.daemons.shared import Next, SessionGate
from queues.services import moves
from queues.zk import access
from queues.zk import paths as zpaths
from queues.zk.errors import Conflict, ItemLocked, LockLost
from queues.zk.fence import fenced
from queues.zk.kazoo_private import session_id
from queues.zk.records import AccessRequest

from .test_fencing_operators import hold_lock, still_held

TOKEN = {"token": "6b1f", "cloud-content-byte": 1234, "delivery-node": 7001}


def lock_of(item: AccessRequest) -> str:
    return zpaths.access_node(item.queue, item.qid, "lock")


def nodes_of(zk: KazooClient, item: AccessRequest) -> dict[str, Any]:
    """The request's token and status as stored (data and version)."""
    found = {}
    for name in ("token", "status"):
        data, stat = zk.get(zpaths.access_node(item.queue, item.qid, name))
        found[name] = (data, stat.version)
    return found


def walk(zk: KazooClient, item: AccessRequest, *states: str) -> AccessRequest:
    for state in states:
        item = access.access_transition(zk, item, state)
    return item


@pytest.fixture
def request_(zk: KazooClient) -> AccessRequest:
    return access.access_create(zk, queue="small", token=TOKEN)


# An operator's moves and removals ----------------------------------------------------------------


def test_an_operator_resume_of_a_request_another_session_holds_is_refused(
    zk: KazooClient, other_zk: KazooClient, request_: AccessRequest
) -> None:
    """Merritt's storage holds a Failed request it has not unlocked yet (its consumer keeps the
    lock until after its last move)."""
    failed = walk(zk, request_, AccessState.PROCESSING, AccessState.FAILED)
    stat = hold_lock(other_zk, lock_of(failed))
    before = nodes_of(zk, failed)
    with pytest.raises(ItemLocked):
        moves.access_resume(queue="small", qid=failed.qid)
    assert nodes_of(zk, failed) == before
    still_held(zk, lock_of(failed), stat)


def test_a_lock_taken_after_an_operator_read_the_request_stops_the_move(
    zk: KazooClient, other_zk: KazooClient, request_: AccessRequest
) -> None:
    failed = walk(zk, request_, AccessState.PROCESSING, AccessState.FAILED)
    assert failed.lock is None
    stat = hold_lock(other_zk, lock_of(failed))
    with pytest.raises(ItemLocked):
        access.access_transition(zk, failed, AccessState.PENDING, admin=True)
    assert access.access_load(zk, "small", failed.qid).state == AccessState.FAILED
    still_held(zk, lock_of(failed), stat)


def test_an_unlocked_operator_move_goes_through_and_leaves_no_lock(
    zk: KazooClient, request_: AccessRequest
) -> None:
    failed = walk(zk, request_, AccessState.PROCESSING, AccessState.FAILED)
    moves.access_resume(queue="small", qid=failed.qid)
    assert access.access_load(zk, "small", failed.qid).state == AccessState.PENDING
    assert zk.exists(lock_of(failed)) is None


def test_a_removal_never_deletes_a_lock_taken_after_its_look(
    zk: KazooClient,
    other_zk: KazooClient,
    request_: AccessRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The removal looked for a lock, found none, then listed the request's children: a lock
    taken in between was listed, and deleted with the request's nodes."""
    done = walk(zk, request_, AccessState.PROCESSING, AccessState.COMPLETED)
    lock = lock_of(done)
    taken: list[Any] = []
    real_children = access.children

    def children_after_a_claim(client: KazooClient, path: str) -> list[str]:
        if path == zpaths.access("small", done.qid) and not taken:
            taken.append(hold_lock(other_zk, lock))
        return real_children(client, path)

    monkeypatch.setattr(access, "children", children_after_a_claim)
    with pytest.raises((ItemLocked, Conflict)):
        access.access_remove(zk, done)
    assert taken
    assert zk.exists(zpaths.access("small", done.qid)) is not None
    still_held(zk, lock, taken[0])


def test_a_lock_taken_after_the_removals_listing_fails_the_requests_delete(
    zk: KazooClient,
    other_zk: KazooClient,
    request_: AccessRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done = walk(zk, request_, AccessState.PROCESSING, AccessState.COMPLETED)
    lock = lock_of(done)
    taken: list[Any] = []
    real_children = access.children

    def children_then_a_claim(client: KazooClient, path: str) -> list[str]:
        found = real_children(client, path)
        if path == zpaths.access("small", done.qid) and not taken:
            taken.append(hold_lock(other_zk, lock))
        return found

    monkeypatch.setattr(access, "children", children_then_a_claim)
    with pytest.raises(Conflict):
        access.access_remove(zk, done)
    assert taken
    assert zk.exists(zpaths.access_node("small", done.qid, "token")) is not None
    still_held(zk, lock, taken[0])


# A consumer's writes ---------------------------------------------------------------------------


def test_the_consumers_move_is_refused_under_another_sessions_lock(
    zk: KazooClient, other_zk: KazooClient, request_: AccessRequest
) -> None:
    """The consumer's lock went (its session ended) and Merritt's storage took the request: the
    consumer's Completed move would be a second writer's."""
    processing = walk(zk, request_, AccessState.PROCESSING)
    stat = hold_lock(other_zk, lock_of(processing))
    before = nodes_of(zk, processing)
    daemon = AccessSmall(zk=zk)
    with pytest.raises(Conflict):
        daemon.move(processing, Next(AccessState.COMPLETED))
    assert nodes_of(zk, processing) == before
    still_held(zk, lock_of(processing), stat)


def test_the_consumers_move_without_any_lock_writes_nothing(
    zk: KazooClient, request_: AccessRequest
) -> None:
    processing = walk(zk, request_, AccessState.PROCESSING)
    before = nodes_of(zk, processing)
    with pytest.raises(Conflict):
        AccessSmall(zk=zk).move(processing, Next(AccessState.COMPLETED))
    assert nodes_of(zk, processing) == before


def test_the_consumers_token_write_is_refused_under_another_sessions_lock(
    zk: KazooClient, other_zk: KazooClient, request_: AccessRequest
) -> None:
    processing = walk(zk, request_, AccessState.PROCESSING)
    stat = hold_lock(other_zk, lock_of(processing))
    before = nodes_of(zk, processing)
    with pytest.raises(Conflict):
        access.access_set_token(zk, processing, {**TOKEN, "url": "https://example.org/a.zip"})
    assert nodes_of(zk, processing) == before
    still_held(zk, lock_of(processing), stat)


@pytest.mark.parametrize("write", ["prepare", "token"])
def test_a_consumers_write_after_its_claims_session_is_gone_is_not_sent(
    zk: KazooClient, request_: AccessRequest, write: str
) -> None:
    """Inside a step, the consumer's writes go through its claim's session gate, as a job
    step's do (``queues.zk.fence``): once the claim's session is lost, nothing is sent."""
    claimed = access.access_acquire(zk, "small")
    assert claimed is not None and claimed.qid == request_.qid
    gate = SessionGate()
    fence = gate.fence(zk, gate.generation, session_id(zk))
    daemon = AccessSmall(zk=zk, gate=gate)
    if write == "token":
        claimed = daemon.prepare(claimed)  # in the claim's session: goes through
    before = nodes_of(zk, claimed)
    gate.on_state("LOST")  # the claim's session is gone; the lock is the server's to drop
    with fenced(fence), pytest.raises(LockLost):
        if write == "prepare":
            daemon.prepare(claimed)
        else:
            access.access_set_token(zk, claimed, {**TOKEN, "url": "https://example.org/a.zip"})
    assert nodes_of(zk, claimed) == before
    access.access_unlock(zk, claimed)


def test_the_consumers_writes_under_its_own_lock_go_through(
    zk: KazooClient, request_: AccessRequest
) -> None:
    claimed = access.access_acquire(zk, "small")
    assert claimed is not None
    gate = SessionGate()
    daemon = AccessSmall(zk=zk, gate=gate)
    with fenced(gate.fence(zk, gate.generation, session_id(zk))):
        claimed = daemon.prepare(claimed)
        claimed = access.access_set_token(zk, claimed, {**TOKEN, "url": "u"})
    daemon.move(claimed, Next(AccessState.COMPLETED))
    daemon.unlock(claimed)
    done = access.access_load(zk, "small", claimed.qid)
    assert (done.state, done.token["url"], done.lock) == (AccessState.COMPLETED, "u", None)
