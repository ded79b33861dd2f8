"""Access requests in the small and large queues: creation, moves, resume and delete."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues.services import moves
from queues.zk import access
from queues.zk.errors import InvalidID, InvalidTransition, ItemLocked, NotFound
from queues.zk.records import AccessRequest

from .helpers import QID_RE, assert_stamp, compact, raw, read_json, snapshot

TOKEN = {"token": "6b1f", "cloud-content-byte": 1234, "anticipated-availability-time": "soon"}


def assert_access_status(zk: KazooClient, queue: str, qid: str, status: str, message: str = ""):
    path = f"/access/{queue}/{qid}/status"
    value = read_json(zk, path)
    assert_stamp(value["last_modified"])
    assert raw(zk, path) == compact(
        {"status": status, "last_modified": value["last_modified"], "message": message}
    )


@pytest.mark.parametrize("queue", ["small", "large"])
def test_access_request_gets_sequential_id_token_and_pending_status(
    zk: KazooClient, queue: str
) -> None:
    first = access.access_create(zk, queue=queue, token=TOKEN)
    second = access.access_create(zk, queue=queue, token=TOKEN)
    assert QID_RE.fullmatch(first.qid)
    assert int(second.qid[3:]) == int(first.qid[3:]) + 1
    assert raw(zk, f"/access/{queue}/{first.qid}") == b""
    assert sorted(zk.get_children(f"/access/{queue}/{first.qid}")) == ["status", "token"]
    assert raw(zk, f"/access/{queue}/{first.qid}/token") == compact(TOKEN)
    assert_access_status(zk, queue, first.qid, "Pending")
    assert access.access_ids(zk, queue) == [first.qid, second.qid]


def test_access_queues_are_separate(zk: KazooClient) -> None:
    small = access.access_create(zk, queue="small", token=TOKEN)
    assert access.access_ids(zk, "large") == []
    with pytest.raises(NotFound):
        access.access_load(zk, "large", small.qid)


def test_unknown_access_queue_is_refused(zk: KazooClient) -> None:
    with pytest.raises(InvalidID):
        access.access_create(zk, queue="medium", token=TOKEN)


@pytest.mark.parametrize("outcome", ["Completed", "Failed"])
def test_access_request_runs_pending_processing_and_finishes(zk: KazooClient, outcome: str) -> None:
    item = access.access_create(zk, queue="large", token=TOKEN)
    item = access.access_transition(zk, item, "Processing")
    assert_access_status(zk, "large", item.qid, "Processing")
    item = access.access_transition(zk, item, outcome, message=f"{outcome.lower()}!")
    assert_access_status(zk, "large", item.qid, outcome, f"{outcome.lower()}!")
    assert access.access_load(zk, "large", item.qid).status.raw == item.status.raw


@pytest.mark.parametrize(
    ("route", "target"),
    [([], "Completed"), ([], "Failed"), (["Processing", "Completed"], "Processing")],
)
def test_illegal_access_move_raises_and_changes_nothing(
    zk: KazooClient, route: list[str], target: str
) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    for state in route:
        item = access.access_transition(zk, item, state)
    before = snapshot(zk, "/access")
    with pytest.raises(InvalidTransition):
        access.access_transition(zk, item, target)
    assert snapshot(zk, "/access") == before


@pytest.mark.parametrize("to", ["Pending", "Processing"])
def test_operator_resumes_a_failed_access_request(zk: KazooClient, to: str) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    item = access.access_transition(zk, item, "Processing")
    item = access.access_transition(zk, item, "Failed", message="assembly failed")
    outcome = moves.access_resume(queue="small", qid=item.qid, to=to)
    assert (outcome.before, outcome.after) == ("Failed", to)
    assert_access_status(zk, "small", item.qid, to)


def test_access_resume_refuses_a_request_that_did_not_fail(zk: KazooClient) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    with pytest.raises(InvalidTransition):
        moves.access_resume(queue="small", qid=item.qid, to="Pending")
    with pytest.raises(InvalidTransition):
        access.access_transition(
            zk, access.access_transition(zk, item, "Processing"), "Pending", admin=True
        )


@pytest.mark.parametrize("outcome", ["Completed", "Failed"])
def test_operator_deletes_a_finished_access_request(zk: KazooClient, outcome: str) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    item = access.access_transition(zk, item, "Processing")
    access.access_transition(zk, item, outcome)
    result = moves.access_delete(queue="small", qid=item.qid)
    assert result.after == "Deleted"
    assert zk.exists(f"/access/small/{item.qid}") is None


def test_running_access_request_cannot_be_deleted(zk: KazooClient) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    item = access.access_transition(zk, item, "Processing")
    with pytest.raises(InvalidTransition):
        moves.access_delete(queue="small", qid=item.qid)
    assert zk.exists(f"/access/small/{item.qid}/status") is not None


def test_locked_access_request_cannot_be_deleted(zk: KazooClient, other_zk: KazooClient) -> None:
    item = access.access_create(zk, queue="small", token=TOKEN)
    item = access.access_transition(zk, item, "Processing")
    access.access_transition(zk, item, "Completed")
    other_zk.create(f"/access/small/{item.qid}/lock", b"", ephemeral=True)
    with pytest.raises(ItemLocked):
        moves.access_delete(queue="small", qid=item.qid)
    assert zk.exists(f"/access/small/{item.qid}/token") is not None


def test_access_token_can_be_rewritten(zk: KazooClient) -> None:
    access.access_create(zk, queue="small", token=TOKEN)
    item = access.access_acquire(zk, "small")  # only the lock's holder writes the token
    assert item is not None
    access.access_set_token(zk, item, {**TOKEN, "url": "https://example.org/a.zip"})
    access.access_unlock(zk, item)
    assert read_json(zk, f"/access/small/{item.qid}/token")["url"] == "https://example.org/a.zip"


def _merritt_request(zk: KazooClient, token: bytes | None) -> str:
    """A request as mrt-zk's libraries create one: a sequential ``qid`` node, its token node, then
    its status (Java ``Access.createAssembly``, Ruby ``MerrittZK::Access.create_assembly``)."""
    qid = zk.create("/access/small/qid", b"", sequence=True).rsplit("/", 1)[1]
    if token is not None:
        zk.create(f"/access/small/{qid}/token", token)
    zk.create(
        f"/access/small/{qid}/status",
        b'{"status":"Failed","last_modified":"2026-11-21 10:02:03 -0800","message":""}',
    )
    return qid


# Ruby's create_assembly writes an empty token as an empty node (QueueItem.serialize gives nil
# for an empty Hash); Java's Access.loadProperties reads an empty or absent token node as {}.
@pytest.mark.parametrize("token", [b"", None], ids=["empty-node", "no-node"])
def test_a_request_with_an_empty_or_absent_token_loads_as_merritts_library_loads_it(
    zk: KazooClient, token: bytes | None
) -> None:
    qid = _merritt_request(zk, token)

    [item] = access.accesses_load(zk, "small", access.access_ids(zk, "small"))
    assert isinstance(item, AccessRequest)
    assert (item.qid, item.token, item.state) == (qid, {}, "Failed")
    moves.access_delete(queue="small", qid=qid)
    assert zk.exists(f"/access/small/{qid}") is None


@pytest.mark.parametrize("bad", ["qid1", "../jobs", "small"])
def test_malformed_access_id_is_refused(zk: KazooClient, bad: str) -> None:
    with pytest.raises(InvalidID):
        moves.access_resume(queue="small", qid=bad)
