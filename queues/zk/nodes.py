"""Small ZooKeeper helpers shared by the item modules: pipelined reads and transactions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    ZookeeperError,
)
from kazoo.protocol.states import ZnodeStat

from . import multiread
from .codecs import decode_json, encode_json, local_time
from .errors import Conflict, MalformedNode, NotFound, StaleVersion
from .kazoo_private import list_children
from .records import LockInfo, Status

Read = tuple[bytes, ZnodeStat] | None


def stamp(ms: int) -> datetime:
    """A ZooKeeper ctime/mtime in milliseconds as local time."""
    return local_time(ms / 1000)


def read_many(zk: KazooClient, node_paths: Sequence[str]) -> dict[str, Read]:
    """Read many nodes in one round trip (one multiRead request); a missing node reads as None."""
    return collect_reads(start_reads(zk, node_paths))


def json_objects(
    zk: KazooClient, node_paths: Sequence[str], chunk: int
) -> Iterator[dict[str, tuple[dict[str, Any], ZnodeStat]]]:
    """Each of ``node_paths`` that exists and holds a JSON object, with its stat, read
    ``chunk`` nodes a request and handed over a chunk at a time: the caller keeps what it needs
    of one before the next is read (many nodes decoded and held at once leave the process that
    much larger after). A missing node or one that is not a JSON object is left out."""
    for start in range(0, len(node_paths), chunk):
        found: dict[str, tuple[dict[str, Any], ZnodeStat]] = {}
        for path, read in read_many(zk, node_paths[start : start + chunk]).items():
            if read is None:
                continue
            try:
                value = decode_json(path, read[0])
            except MalformedNode:
                continue
            if isinstance(value, dict):
                found[path] = (value, read[1])
        yield found


def start_reads(zk: KazooClient, node_paths: Sequence[str]) -> Any:
    """Send the reads without waiting, so that other requests can share the round trip."""
    return multiread.start(zk, node_paths)


def collect_reads(pending: Any) -> dict[str, Read]:
    reads: dict[str, Read] = pending.collect()
    return reads


def exists_many(zk: KazooClient, node_paths: Sequence[str]) -> dict[str, ZnodeStat | None]:
    """The stat of each node, or None; read along with the data (these nodes hold little)."""
    return {p: (read[1] if read else None) for p, read in read_many(zk, node_paths).items()}


def children_many(zk: KazooClient, node_paths: Sequence[str]) -> dict[str, list[str] | None]:
    pending = [(p, zk.get_children_async(p)) for p in node_paths]
    result: dict[str, list[str] | None] = {}
    for path, async_result in pending:
        try:
            result[path] = async_result.get()
        except NoNodeError:
            result[path] = None
    return result


# A listing costs in proportion to its folder: the server sends every name, and the client
# sorts every name out (a million entries: 20 MB, and about 0.7 s of a consumer's CPU). A
# claimer with names of its last listing still to work on lists a folder of more than
# LIST_RATE * max_age entries again only as often as LIST_RATE entries a second would, and at
# least every LIST_AGE_MAX seconds; one whose names ran out lists at once, as before.
LIST_RATE = 10_000
LIST_AGE_MAX = 10.0


def listing_age(max_age: float, entries: int) -> float:
    """How old a listing of ``entries`` names may grow while names of it are left to work on:
    ``max_age``, or longer for a large folder (see LIST_RATE)."""
    return max(max_age, min(LIST_AGE_MAX, entries / LIST_RATE))


def children(zk: KazooClient, path: str) -> list[str]:
    try:
        names: list[str] = list_children(zk, path).get()
        return names
    except NoNodeError:
        return []


def lock_info(stat: ZnodeStat | None) -> LockInfo | None:
    if stat is None:
        return None
    return LockInfo(created=stamp(stat.ctime), session_id=stat.ephemeralOwner)


def commit(txn: TransactionRequest, *, what: str) -> list[Any]:
    """Commit a transaction; turn a failure into the domain error that explains it.

    ZooKeeper applies all of a multi-operation or none of it, so on any error nothing changed.
    """
    results: list[Any] = txn.commit()
    return checked(results, what=what)


def first_failure(results: Any) -> int | None:
    """The place of the operation a failed multi failed on, or None when the answer names none
    (or it went through). The operations before it answer that they were rolled back; those
    after it (``RuntimeInconsistency``, not run) come after it."""
    if not isinstance(results, list):
        return None
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return i
    return None


def checked(results: list[Any], *, what: str) -> list[Any]:
    """A multi's results when it went through; else the domain error that explains its
    failure (nothing changed: ZooKeeper applies all of a multi or none of it)."""
    failed = first_failure(results)
    if failed is None:
        return results
    first = results[failed]
    if isinstance(first, BadVersionError):
        raise StaleVersion(f"{what}: the item changed since it was read; reload and try again")
    if isinstance(first, NoNodeError):
        raise Conflict(f"{what}: a node it depends on is gone (moved or deleted meanwhile)")
    if isinstance(first, NodeExistsError):
        raise Conflict(f"{what}: a node it creates already exists (a concurrent move?)")
    if isinstance(first, NotEmptyError):
        raise Conflict(f"{what}: a node gained children meanwhile; try again")
    if isinstance(first, ZookeeperError):
        raise Conflict(f"{what}: ZooKeeper refused the change ({type(first).__name__})")
    raise first


def landed(current: Status, read: Status, raw: dict[str, Any]) -> bool:
    """Whether ``current`` is the one write of ``raw`` on top of ``read``.

    A move refused with a version conflict may be our own earlier attempt that landed before a
    connection loss: then it is done. The timestamp is left out (a retry computes a new one).
    """

    def content(value: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in value.items() if k != "last_modified"}

    return current.version == read.version + 1 and content(current.raw) == content(raw)


def ensure_folder(zk: KazooClient, root: str, folder: str) -> None:
    """Create ``folder`` and the folders between it and ``root``, but never ``root`` itself.

    ``root`` is the item the folder belongs to. ``ensure_path`` would quietly create a missing
    (or just deleted) item as an empty ghost; this raises NotFound instead.
    """
    if zk.exists(folder) is not None:
        return
    current = root
    for part in folder[len(root) :].strip("/").split("/"):
        current = f"{current}/{part}"
        try:
            zk.create(current, b"")
        except NodeExistsError:
            continue
        except NoNodeError as exc:
            raise NotFound(f"{root} does not exist") from exc


def require(read: Read, path: str, what: str) -> tuple[bytes, ZnodeStat]:
    if read is None:
        raise NotFound(f"{what}: {path} does not exist")
    return read


def json_merge(zk: KazooClient, path: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into the JSON object at ``path``, checked against the version read
    (Conflict when the node changed meanwhile); every other key is kept. Returns the object."""
    try:
        data, stat = zk.get(path)
    except NoNodeError as exc:
        raise NotFound(f"{path} does not exist") from exc
    value = decode_json(path, data)
    if not isinstance(value, dict):
        raise MalformedNode(path, "expected a JSON object")
    value.update(changes)
    try:
        zk.set(path, encode_json(value), version=stat.version)
    except BadVersionError as exc:
        raise Conflict(f"{path} changed while it was being updated") from exc
    return value
