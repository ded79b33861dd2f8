"""Access requests: the small and large queues of object assembly requests."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient

from queues.core.states import ACCESS, AccessState

from . import paths
from .batches import simple_status
from .codecs import decode_json, encode_json
from .errors import Conflict, ItemLocked, MalformedNode, NotFound
from .fence import Gated, holder_gate
from .finished import CompletedMemory
from .kazoo_private import Multi
from .locks import lock_create, lock_release
from .nodes import children, commit, exists_many, landed, lock_info, read_many, stamp
from .records import AccessRequest, Broken, Status, decode_each


def access_create(zk: KazooClient, *, queue: str, token: dict[str, Any]) -> AccessRequest:
    paths.access_queue(queue)
    created = zk.create(f"{paths.ACCESS}/{queue}/qid", b"", sequence=True)
    qid = posixpath.basename(created)
    txn = zk.transaction()
    txn.create(paths.access_node(queue, qid, "token"), encode_json(token))
    txn.create(
        paths.access_node(queue, qid, "status"), encode_json(simple_status(AccessState.PENDING))
    )
    try:
        commit(txn, what=f"create access request in {queue}")
    except BaseException:
        zk.delete(created)
        raise
    return access_load(zk, queue, qid)


def _token(path: str, read: tuple[bytes, Any] | None) -> dict[str, Any]:
    """The token node as Merritt's Java library reads it (``Access.loadProperties``: an absent
    or empty node is an empty object; Ruby's ``create_assembly`` writes an empty node for an
    empty token). Anything else must be a JSON object."""
    if read is None or not read[0]:
        return {}
    return decode_json(path, read[0])


def _decode(queue: str, qid: str, reads: dict[str, Any], stats: dict[str, Any]) -> AccessRequest:
    def node(name: str) -> str:
        return paths.access_node(queue, qid, name)

    if stats[paths.access(queue, qid)] is None:
        raise NotFound(f"access request {queue}/{qid} does not exist")
    if reads[node("status")] is None:
        raise NotFound(f"access request {queue}/{qid} is incomplete")
    status_data, status_stat = reads[node("status")]
    return AccessRequest(
        queue=queue,
        qid=qid,
        token=_token(node("token"), reads[node("token")]),
        status=Status(
            raw=decode_json(node("status"), status_data),
            version=status_stat.version,
            mtime=stamp(status_stat.mtime),
        ),
        created=stamp(stats[paths.access(queue, qid)].ctime),
        lock=lock_info(stats[node("lock")]),
    )


def accesses_load(zk: KazooClient, queue: str, qids: Sequence[str]) -> list[AccessRequest | Broken]:
    paths.access_queue(queue)
    for qid in qids:
        paths.qid(qid)
    reads = read_many(
        zk, [paths.access_node(queue, q, n) for q in qids for n in ("token", "status")]
    )
    stats = exists_many(
        zk, [p for q in qids for p in (paths.access(queue, q), paths.access_node(queue, q, "lock"))]
    )
    return decode_each("access", qids, lambda qid: _decode(queue, qid, reads, stats))


def access_load(zk: KazooClient, queue: str, qid: str) -> AccessRequest:
    found = accesses_load(zk, queue, [qid])
    if not found:
        raise NotFound(f"access request {queue}/{qid} does not exist")
    item = found[0]
    if isinstance(item, Broken):
        raise MalformedNode(item.path, item.reason)
    return item


def access_ids(zk: KazooClient, queue: str) -> list[str]:
    paths.access_queue(queue)
    return sorted(n for n in children(zk, f"{paths.ACCESS}/{queue}") if paths.QID_RE.fullmatch(n))


def access_transition(
    zk: KazooClient,
    item: AccessRequest,
    new_state: str,
    *,
    message: str = "",
    admin: bool = False,
    holder: bool = False,
) -> AccessRequest:
    """Write the request's new status, checked against the version it was read at.

    ``holder``: the caller holds the request's lock (our consumer's moves). The multi checks
    the lock is there and is sent through the holder's gate (``fence.holder_gate``: the step's
    claim session, or outside a step a lock read to be this session's), so it is the owner's
    write or none (Conflict, or LockLost once the claim's session is gone). Otherwise (an
    operator) the multi creates the lock and deletes it again, so it fails while any session
    holds the request (Merritt's storage, a consumer of ours): ItemLocked, nothing written.
    """
    if new_state == AccessState.DELETED:
        raise ValueError("use access_remove to delete an access request")
    ACCESS.check(item.state, new_state, admin=admin)
    raw = simple_status(new_state, message, item.status.raw)
    lock = _lock_path(item)
    txn = Multi(zk)
    txn.set_data(
        paths.access_node(item.queue, item.qid, "status"),
        encode_json(raw),
        version=item.status.version,
    )
    if holder:
        txn.check(lock, -1)
    else:
        txn.create(lock, b"", ephemeral=True)
        txn.delete(lock)
    what = f"move {item.qid} from {item.state} to {new_state}"
    try:
        commit(Gated(txn, holder_gate(zk, lock)) if holder else txn, what=what)
    except Conflict:
        current = access_load(zk, item.queue, item.qid)
        if landed(current.status, item.status, raw):
            return current
        if not holder and current.lock is not None:
            raise _locked(item) from None
        raise
    return replace(
        item,
        status=Status(raw=raw, version=item.status.version + 1, mtime=datetime.now().astimezone()),
    )


def access_set_token(zk: KazooClient, item: AccessRequest, token: dict[str, Any]) -> AccessRequest:
    """Write the request's token as the holder of its lock: one multi that checks the lock and
    that the status is at the version ``item`` was read at, sent through the holder's gate
    (``fence.holder_gate``). Conflict or StaleVersion when either changed, LockLost when the
    claim's session is gone: nothing written."""
    lock = _lock_path(item)
    txn = Multi(zk)
    txn.check(lock, -1)
    txn.check(paths.access_node(item.queue, item.qid, "status"), item.status.version)
    txn.set_data(paths.access_node(item.queue, item.qid, "token"), encode_json(token))
    commit(Gated(txn, holder_gate(zk, lock)), what=f"write the token of {item.qid}")
    return replace(item, token=token)


def access_remove(zk: KazooClient, item: AccessRequest) -> None:
    """Remove a Failed, Completed or (as Merritt's library leaves it) Deleted request.

    The lock is never among the deletes: a lock listed is ItemLocked, and one taken after the
    listing makes the delete of the request's own node fail (NotEmpty: Conflict), so the
    removal is made only while no session holds the request."""
    ACCESS.check_delete(item.state)
    base = paths.access(item.queue, item.qid)
    kids = children(zk, base)
    if "lock" in kids:
        raise _locked(item)
    txn = zk.transaction()
    for kid in kids:
        if kid == "status":
            txn.delete(f"{base}/status", version=item.status.version)
        else:
            txn.delete(f"{base}/{kid}")
    txn.delete(base)
    commit(txn, what=f"delete {item.qid}")


def _lock_path(item: AccessRequest) -> str:
    return paths.access_node(item.queue, item.qid, "lock")


def _locked(item: AccessRequest) -> ItemLocked:
    return ItemLocked(
        f"access request {item.qid} is locked by a running consumer (ours or Merritt's "
        "storage); try again later"
    )


_completed = {queue: CompletedMemory() for queue in paths.ACCESS_QUEUES}


def access_acquire(zk: KazooClient, queue: str, *states: str) -> AccessRequest | None:
    """Lock and return the oldest request in the first of ``states`` (Pending by default) that
    has one unlocked; every request is read once, Completed ones only the first time."""
    states = states or (AccessState.PENDING,)
    memory = _completed[paths.access_queue(queue)]
    loaded = accesses_load(zk, queue, memory.unknown(zk, access_ids(zk, queue)))
    items = [i for i in loaded if isinstance(i, AccessRequest)]
    memory.remember(zk, (i.qid for i in items if i.state == AccessState.COMPLETED))
    candidates = [i for i in items if i.state in states and i.lock is None]
    candidates.sort(key=lambda i: states.index(i.state))  # stable: oldest first within a state
    for item in candidates:
        state = item.state
        lock_path = paths.access_node(queue, item.qid, "lock")
        if not lock_create(zk, lock_path):
            continue
        try:
            fresh = access_load(zk, queue, item.qid)
        except (NotFound, MalformedNode):
            lock_release(zk, lock_path)
            continue
        if fresh.state != state:
            lock_release(zk, lock_path)
            continue
        return fresh
    return None


def access_unlock(zk: KazooClient, item: AccessRequest) -> None:
    lock_release(zk, paths.access_node(item.queue, item.qid, "lock"))
