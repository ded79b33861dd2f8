"""Ephemeral item locks and persistent queue / collection holds.

An item lock is the item's ephemeral ``lock`` child: whoever creates it owns the item until it
deletes the node or its session ends. Holds are persistent empty markers under ``/locks``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from . import paths
from .nodes import children, exists_many, stamp


class LockLedger:
    """The ephemeral locks this process believes it holds (chroot-less paths).

    Every place that takes or gives up a lock notes it here, so the process can tell a lock of
    its session that a thread works under from one that nobody claims (an orphan: a create or
    delete answered with ConnectionLoss that the server had in fact applied). The consumer
    registration publishes it; the consistency check and /consumers/ compare it with the
    server's locks and their ``ephemeralOwner``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()

    def taken(self, paths_: Iterable[str]) -> None:
        with self._lock:
            self._held.update(paths_)

    def given_up(self, paths_: Iterable[str]) -> None:
        with self._lock:
            self._held.difference_update(paths_)

    def forget_all(self) -> None:
        """The session is gone, and every ephemeral lock with it."""
        with self._lock:
            self._held.clear()

    def held(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._held)


LEDGER = LockLedger()


def locks_held() -> frozenset[str]:
    """The locks this process believes it holds (see :class:`LockLedger`)."""
    return LEDGER.held()


def lock_create(zk: KazooClient, path: str) -> bool:
    """Take an item's ephemeral lock; False when another client has it or the item is gone."""
    try:
        zk.create(path, b"", ephemeral=True)
    except (NodeExistsError, NoNodeError):
        return False
    return True


def lock_owned(zk: KazooClient, path: str) -> bool:
    stat = zk.exists(path)
    return stat is not None and stat.ephemeralOwner == zk.client_id[0]


def lock_release(zk: KazooClient, path: str) -> None:
    """Delete the lock if this session owns it; another session's lock is left alone."""
    stat = zk.exists(path)
    if stat is None or stat.ephemeralOwner != zk.client_id[0]:
        return
    with contextlib.suppress(NoNodeError):
        zk.delete(path, version=stat.version)


def lock_break(zk: KazooClient, path: str) -> bool:
    """Remove a lock whatever its owner (repair of a lock held far too long)."""
    try:
        zk.delete(path)
    except NoNodeError:
        return False
    return True


@dataclass(frozen=True)
class Holds:
    queues: dict[str, datetime | None]  # every holdable queue -> when it was held, or None
    collections: dict[str, datetime]  # held profile -> when

    def queue_held(self, name: str) -> bool:
        return self.queues.get(name) is not None


def _set(zk: KazooClient, path: str) -> bool:
    try:
        zk.create(path, b"", makepath=True)
    except NodeExistsError:
        return False
    return True


def _clear(zk: KazooClient, path: str) -> bool:
    try:
        zk.delete(path)
    except NoNodeError:
        return False
    return True


def queue_hold_set(zk: KazooClient, name: str) -> bool:
    """Hold a queue ("ingest", "access-small", "access-large"); False if already held."""
    return _set(zk, paths.queue_lock(name))


def queue_hold_clear(zk: KazooClient, name: str) -> bool:
    return _clear(zk, paths.queue_lock(name))


def queue_held(zk: KazooClient, name: str) -> bool:
    return zk.exists(paths.queue_lock(name)) is not None


def collection_hold_set(zk: KazooClient, profile: str) -> bool:
    return _set(zk, paths.collection_lock(profile))


def collection_hold_clear(zk: KazooClient, profile: str) -> bool:
    return _clear(zk, paths.collection_lock(profile))


def collection_held(zk: KazooClient, profile: str) -> bool:
    """The check a consumer makes before starting work for a profile."""
    if not profile or not paths.PROFILE_RE.fullmatch(profile):
        return False
    return zk.exists(paths.collection_lock(profile)) is not None


def holds_list(zk: KazooClient) -> Holds:
    queue_paths = {name: paths.queue_lock(name) for name in paths.QUEUE_HOLDS}
    queue_stats = exists_many(zk, list(queue_paths.values()))
    names = [n for n in children(zk, paths.COLLECTION_LOCKS) if paths.PROFILE_RE.fullmatch(n)]
    coll_stats = exists_many(zk, [f"{paths.COLLECTION_LOCKS}/{n}" for n in names])
    return Holds(
        queues={
            name: stamp(s.ctime) if (s := queue_stats[path]) else None
            for name, path in queue_paths.items()
        },
        collections={
            name: stamp(s.ctime)
            for name in sorted(names)
            if (s := coll_stats[f"{paths.COLLECTION_LOCKS}/{name}"]) is not None
        },
    )
