"""Jobs that wait for a reason to go, watched rather than polled (issue 51).

A consumer loop that may not take the jobs it lists (bound for a held storage node, or one whose
breaker is open: both are node holds) must not claim them to find that out again at every look:
with 300 jobs waiting that was a lock, a read and an unlock a job, as fast as the loop went
round. Here:

- ``NodeHoldsWatch``: the storage nodes held now, as a children watch of
  ``/mrt-console/holds/nodes`` last saw them (one request when a hold comes or goes, none a
  look), one per client; each change, and a lost session (which takes the watch with it), sets
  the events of the loops that wait on it, so they look again at once.
- ``NodeScreen``: what a listing of Storing or Recording passes over unclaimed while some node
  is held. The node a job is bound for is in its ``store`` node (``add/<node>/<ark>``), read for
  the jobs not seen before, 200 to a request (``multiRead``), and remembered while the job stays
  in the listing: a look costs no request after the first. With no node held, nothing is read.

The check under the job's lock (``node_held``) stays: a hold placed after the listing still
stops the job.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

from queues.core.per_key import PerKey

from . import paths
from .codecs import decode_json
from .errors import MalformedNode
from .maintenance import NODE_HOLDS, NODE_RE, mode_node
from .nodes import read_many
from .watch import KeptAnswer


class NodeHoldsWatch:
    """The storage nodes held, as a children watch last saw them (see the module's docstring)."""

    def __init__(self, zk: KazooClient) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._answer: KeptAnswer[frozenset[int]] = KeptAnswer(self._tell)
        self._events: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        zk.add_listener(self._on_state)

    def subscribe(self, event: threading.Event) -> None:
        """Set ``event`` whenever the holds may have changed."""
        with self._lock:
            self._events.add(event)

    def held(self) -> frozenset[int] | None:
        """The nodes held now; None when ZooKeeper could not be asked (the caller's own checks
        decide then)."""
        try:
            return self._answer.get(self._read)
        except Exception:
            return None

    def _read(self, watch: Callable[[Any], None]) -> frozenset[int] | None:
        try:
            names = self._zk.get_children(NODE_HOLDS, watch=watch)
        except NoNodeError:
            if self._zk.exists(NODE_HOLDS, watch=watch) is not None:
                return None  # made in between: the watch just set fires, the next look lists
            names = []
        return frozenset(int(n) for n in names if NODE_RE.fullmatch(n))

    def _tell(self) -> None:
        with self._lock:
            events = list(self._events)
        for event in events:
            event.set()

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._answer.fire()


_watches: PerKey[KazooClient, NodeHoldsWatch] = PerKey(NodeHoldsWatch)


def node_holds_watch(zk: KazooClient) -> NodeHoldsWatch:
    """The client's watch of the node holds (one per client, shared by its loops)."""
    return _watches(zk)


class NodeScreen:
    """Passes over, unclaimed, the listed jobs bound for a held storage node (see the module's
    docstring). One per loop: it is called from the loop's thread only."""

    CHUNK = 200  # store nodes read a request

    def __init__(self, zk: KazooClient, watch: NodeHoldsWatch | None = None) -> None:
        self._zk = zk
        self.watch = watch or node_holds_watch(zk)
        self._nodes: dict[str, int | None] = {}  # jid -> the node its store node names

    def __call__(self, names: list[str]) -> list[str]:
        held = self.watch.held()
        if not held:
            self._nodes.clear()
            return names
        jids = {name: paths.entry_jid(name) for name in names}
        listed = {jid for jid in jids.values() if jid is not None}
        # Forget the jobs gone from the folder: one that comes back is read again.
        self._nodes = {jid: node for jid, node in self._nodes.items() if jid in listed}
        unknown = [jid for jid in listed if jid not in self._nodes]
        for start in range(0, len(unknown), self.CHUNK):
            part = unknown[start : start + self.CHUNK]
            found = read_many(self._zk, [paths.job_node(jid, "store") for jid in part])
            for jid in part:
                self._nodes[jid] = _store_node(jid, found[paths.job_node(jid, "store")])
        return [
            name for name, jid in jids.items() if jid is None or self._nodes.get(jid) not in held
        ]


def _store_node(jid: str, read: tuple[bytes, Any] | None) -> int | None:
    if read is None:
        return None
    try:
        store = decode_json(paths.job_node(jid, "store"), read[0])
    except MalformedNode:
        return None
    return mode_node(store.get("mode")) if isinstance(store, dict) else None
