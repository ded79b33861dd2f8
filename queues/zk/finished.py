"""What a client remembers of items that have reached a state they leave only by deletion.

Batches have no state folders in the contract, and access requests are kept in one folder per
queue, so a consumer finds its work by reading every item's status. Completed batches and
access requests stay until someone deletes them, often for weeks, and no consumer works on them:
once seen Completed, an item need not be read again by that client.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence

from kazoo.client import KazooClient


class CompletedMemory:
    """Per client (the consumers of one process share theirs), the IDs seen Completed."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[KazooClient, set[str]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def unknown(self, zk: KazooClient, ids: Sequence[str]) -> list[str]:
        """``ids`` (a full listing) without those seen Completed; forgets IDs no longer listed."""
        with self._lock:
            known = self._ids.setdefault(zk, set())
            known.intersection_update(ids)
            return [i for i in ids if i not in known]

    def remember(self, zk: KazooClient, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids.setdefault(zk, set()).update(ids)
