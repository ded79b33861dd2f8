"""Which open batch is in which state, kept by watches: what the batch consumers' idle loops
look at instead of listing ``/batches`` and reading every open batch's status each poll.

The contract gives batches no state folders: a batch's state is in its status node only, and
``/batches`` changes only when a batch is created or removed. So the index watches both:

- ``/batches`` itself (a child watch): a batch created or removed;
- the status of each open batch it has read (a data watch): the batch moved.

A look (``in_state``) sends nothing when no watch has fired since the last one and its full
read is younger than ``refresh``: the answer is the states in memory. A fired watch marks what
it watched as to be read again; the next look reads only that (the listing, or the statuses of
the batches whose watch fired, and of batches new to it), each read setting its watch again in
the same request, so a change after the server's answer fires the new watch: nothing is missed
between a read and its watch. A batch seen Completed is not read again (it never moves back).

A watch can be lost (a bug, a server that drops it): once ``refresh`` has passed, a look lists
``/batches`` again and reads the statuses it knows in one multiRead, so a lost watch delays a
batch by ``refresh`` at most, never stalls it. A connection that drops fires every kazoo watch
with an event of no path: then everything is read again, with watches, at the next look.

One index per client (``batch_states``): the batch consumers of a process share it, its reads
and its watches; each subscribes an event, set at every change, that wakes its idle loop.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from queues.core.states import BatchState

from . import paths
from .codecs import decode_json
from .errors import MalformedNode
from .kazoo_private import is_dropped_watch, list_children
from .nodes import read_many

# How old the index's last full read may be before a look reads everything again (seconds):
# the bound on how long a lost watch can keep a batch waiting.
REFRESH = 60.0


class BatchStates:
    """The state of each open batch, kept by watches (this module's docstring)."""

    def __init__(self, zk: KazooClient, *, refresh: float = REFRESH) -> None:
        self._zk = zk
        self.refresh = refresh
        self._look_lock = threading.Lock()  # one look reads at a time
        self._lock = threading.Lock()  # the fields below, also written by watch callbacks
        self._events: set[threading.Event] = set()
        self._ids: list[str] = []  # the batch IDs of the last listing, oldest first
        self._folder_fired = 1  # fires of the folder's watch (1: never listed)
        self._folder_seen = 0  # ``_folder_fired`` when the last listing was sent
        self._states: dict[str, str] = {}  # open batch -> its state as last read
        self._watched: set[str] = set()  # open batches whose status watch is set, not fired
        self._completed: set[str] = set()  # batches seen Completed: not read again
        self._full_at = float("-inf")  # when everything was last read (monotonic)

    # Watches --------------------------------------------------------------------------------

    def subscribe(self, event: threading.Event) -> None:
        """Set ``event`` at every change the index's watches see."""
        with self._lock:
            self._events.add(event)

    def unsubscribe(self, event: threading.Event) -> None:
        with self._lock:
            self._events.discard(event)

    def _wake(self) -> None:
        with self._lock:
            events = list(self._events)
        for event in events:
            event.set()

    def _on_folder(self, event: WatchedEvent) -> None:
        with self._lock:
            if is_dropped_watch(event):
                self._forget_watches()
            self._folder_fired += 1
        self._wake()

    def _on_status(self, event: WatchedEvent) -> None:
        with self._lock:
            if is_dropped_watch(event) or not event.path:
                self._forget_watches()
                self._folder_fired += 1
            else:
                # /batches/BID/status (kazoo gives the path without its chroot)
                self._watched.discard(event.path.rsplit("/", 2)[-2])
        self._wake()

    def _forget_watches(self) -> None:
        """The connection dropped every watch: every status is to be read again."""
        self._watched.clear()

    # Looks ----------------------------------------------------------------------------------

    def due_in(self) -> float:
        """Seconds until a look reads everything again (the fallback for a watch lost)."""
        return max(0.0, self._full_at + self.refresh - time.monotonic())

    def in_state(self, state: str) -> list[str]:
        """The IDs of the batches in ``state``, oldest first, as the watches left them."""
        with self._look_lock:
            self._look()
            with self._lock:
                return [b for b in self._ids if self._states.get(b) == state]

    def _look(self) -> None:
        now = time.monotonic()
        full = now - self._full_at >= self.refresh
        with self._lock:
            list_again = full or self._folder_seen != self._folder_fired
            seen = self._folder_fired
        if list_again:
            try:
                names = list_children(self._zk, paths.BATCHES, self._on_folder).get()
            except NoNodeError:
                names = []
                self._zk.exists(paths.BATCHES, watch=self._on_folder)
            ids = sorted(n for n in names if paths.BID_RE.fullmatch(n))
            with self._lock:
                self._ids = ids
                self._folder_seen = seen
                listed = set(ids)
                for gone in [b for b in self._states if b not in listed]:
                    del self._states[gone]
                    self._watched.discard(gone)
                self._completed &= listed
        with self._lock:
            open_ids = [b for b in self._ids if b not in self._completed]
            # Marked watched before the read that sets the watch: a fire after the server's
            # answer takes the mark off again, and the next look reads the batch again.
            unwatched = [b for b in open_ids if b not in self._watched]
            self._watched.update(unwatched)
            known = [b for b in open_ids if b not in unwatched] if full else []
        found: dict[str, str | None] = {}
        try:
            if unwatched:
                pending = [
                    (b, self._zk.get_async(paths.batch_node(b, "status"), watch=self._on_status))
                    for b in unwatched
                ]
                missing = []
                for bid, result in pending:
                    try:
                        data, _stat = result.get()
                    except NoNodeError:
                        found[bid] = None
                        missing.append(bid)
                    else:
                        found[bid] = _state(bid, data)
                # A batch whose status is not written yet (another client's creation, step by
                # step): a read sets no watch on a missing node, an exists does, and its
                # creation fires it; written since the read, it is read again at once.
                written = [
                    self._zk.exists_async(paths.batch_node(b, "status"), watch=self._on_status)
                    for b in missing
                ]
                if any([result.get() is not None for result in written]):
                    self._wake()
        except Exception:
            # Not read (ZooKeeper away): not known to be watched either.
            with self._lock:
                self._watched.difference_update(b for b in unwatched if b not in found)
            raise
        if known:
            # The fallback for a watch lost: the known statuses in one request, no watches
            # (theirs are set); an answer that differs is newer than the watch's news.
            reads = read_many(self._zk, [paths.batch_node(b, "status") for b in known])
            for bid in known:
                read = reads[paths.batch_node(bid, "status")]
                found[bid] = None if read is None else _state(bid, read[0])
        with self._lock:
            for bid, found_state in found.items():
                if found_state is None:  # half-created, or gone: read again at the next look
                    self._states.pop(bid, None)
                    self._watched.discard(bid)
                elif found_state == BatchState.COMPLETED:
                    self._states.pop(bid, None)
                    self._watched.discard(bid)
                    self._completed.add(bid)
                else:
                    self._states[bid] = found_state
        if full:
            self._full_at = now


def _state(bid: str, data: bytes) -> str | None:
    try:
        value: Any = decode_json(paths.batch_node(bid, "status"), data)
    except MalformedNode:
        return None
    status = value.get("status") if isinstance(value, dict) else None
    return str(status) if status is not None else None


_indexes: weakref.WeakKeyDictionary[KazooClient, BatchStates] = weakref.WeakKeyDictionary()
_indexes_lock = threading.Lock()


def batch_states(zk: KazooClient) -> BatchStates:
    """The client's one index (the batch consumers of a process share it)."""
    with _indexes_lock:
        index = _indexes.get(zk)
        if index is None:
            index = _indexes[zk] = BatchStates(zk)
        return index
