"""ZooKeeper watches for the live console: which nodes changed, named by topic.

ZooKeeper is the event bus: every client (our daemons, an operator in another tab, Merritt's Java
ingest) writes the same tree, so the web process learns of a move by watching the tree, not by
being told. ``QueueWatcher`` keeps one-shot ZooKeeper watches on the folders the console shows
and reports each change as ``(topic, detail)`` through a callback:

    jobs:state:<State>   /jobs/states/<state> children (every job state)
    batches              /batches children, and the status of the newest batches
    holds                /locks/queue and /locks/collections children
    access:<queue>       /access/<queue> children, and the status of the newest requests
    batch:<bid>          the batch's status, status-report, lock and states/<folder> children,
                         and the status of each of its jobs still in batch-processing
    job:<jid>            the job's status, priority and lock
    zk:down / zk:up      the connection to ZooKeeper went away / came back

The first four are always watched; ``batch:`` and ``job:`` topics only while someone subscribes
(reference counted), so a page showing one batch costs watches only while it is open.

Why not kazoo's ChildrenWatch/DataWatch recipes: ChildrenWatch stops for good when its folder
does not exist (a batch's ``states/batch-failed`` appears only with its first failed job, and a
fresh ensemble has no ``/jobs/states/failed``) and neither can be switched off and on again by
reference count. The primitive here is small: read with a watch; on any event read again with a
new watch, then report. A missing node is watched for creation instead. The always-watched
folders get persistent watches instead (``kazoo_private.add_persistent_watch``): each event is
reported as it arrives, nothing read, so a change in a folder of 30,000 entries costs what it
costs in an empty one and reaches the browser one hop after ZooKeeper's event (issue 27: the
stat read per event for a count and zxid nobody showed was most of what the console added to a
bare watch). kazoo drops every watch when the connection is suspended
(``kazoo_private.is_dropped_watch``, behaviour 4 there) and a new session has none, so on every
reconnect all active watches are armed again and every active topic is reported as changed, for
whatever happened while we were away.

A watcher wants a session of its own (the live hub makes one): ZooKeeper before 3.9 turns a
session's persistent watch on a path into a one-shot one when the same session sets a one-shot
watch on that path (ZOOKEEPER-4466), as the read index does whenever it lists a folder.

Callbacks run on kazoo's threads and must return quickly; the live hub hands them to its event
loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.protocol.states import KazooState, WatchedEvent

from queues.core.states import BATCH_INDEX_FOLDERS, JOB

from . import paths
from .caps import CAPS
from .errors import InvalidID
from .kazoo_private import add_persistent_watch, is_dropped_watch, list_children, spawn
from .maintenance import ABOUT, NODE_HOLDS

log = logging.getLogger(__name__)

Report = Callable[[str, dict[str, Any]], None]

ZK_DOWN = "zk:down"
ZK_UP = "zk:up"
BATCHES = "batches"
HOLDS = "holds"

# Per-item status watches of the batches list and the access queues cover only the newest items
# (the highest sequence numbers): old items are finished, and a queue of tens of thousands must
# not cost tens of thousands of watches in every web process.
ITEM_WATCH_LIMIT = 2000
# How long subscribe() waits for a new topic's watches to be set before it returns anyway; the
# watches are armed on reconnect when ZooKeeper is away, so nothing is lost by not waiting longer.
ARM_WAIT = 5.0
# Errors that mean "not connected now": the reconnect handler re-arms everything.
_OFFLINE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError)


def job_state_topic(state: str) -> str:
    return f"jobs:state:{state}"


def access_topic(queue: str) -> str:
    return f"access:{paths.access_queue(queue)}"


def batch_topic(bid: str) -> str:
    return f"batch:{paths.bid(bid)}"


def job_topic(jid: str) -> str:
    return f"job:{paths.jid(jid)}"


FIXED_TOPICS: tuple[str, ...] = (
    *(job_state_topic(s) for s in JOB.states),
    BATCHES,
    HOLDS,
    *(access_topic(q) for q in paths.ACCESS_QUEUES),
)


def is_on_demand(topic: str) -> bool:
    return topic.startswith(("batch:", "job:"))


def validate_topic(topic: object) -> str:
    """The topic itself when it is one this module can watch; InvalidID otherwise.

    Item topics go through the ID validators of ``paths``, so a topic can never name a path
    outside the item it is about.
    """
    if not isinstance(topic, str) or len(topic) > 64:
        raise InvalidID(f"topic {str(topic)[:64]!r} is not a live topic")
    if topic in FIXED_TOPICS:
        return topic
    kind, _, ident = topic.partition(":")
    if kind == "batch":
        return batch_topic(ident)
    if kind == "job":
        return job_topic(ident)
    raise InvalidID(f"topic {topic[:64]!r} is not a live topic")


class _Watch:
    """One node kept under watch.

    ``children`` watches a folder's children (reported with their count, the folder's
    ``cversion``, which rises by one per child created or deleted, and its ``pzxid``); ``data``
    watches a node's existence and data (reported with its version and ``mzxid``). A missing
    node gets an exists-watch, which fires when it is created. A one-shot watch reports after
    the read that sets it again, so a change after the report is always reported too.

    A ``children`` watch with ``persistent`` set (the always-watched folders: the job state
    folders hold up to hundreds of thousands of entries) is a persistent watch: set once, and
    each event reported at once with the watch's own detail alone (``folder`` for the holds),
    no count and no zxid: reading them cost a round trip per change before the message could
    go, and the pages refresh from the topic alone. A one-shot child watch can only be set
    again by listing the folder, which cost 77 ms per change at a 30,000-entry folder (issue
    27). kazoo can drop an event that arrives while the previous one is handed to us
    (``add_persistent_watch``); the report of that previous one is made after the dropped one
    arrived, so no change goes unreported, but one report may stand for several changes. A
    folder whose items are followed (``on_children``) is listed after the report has gone out.
    A server older than 3.6 gets one-shot watches.
    """

    def __init__(
        self,
        owner: QueueWatcher,
        topic: str,
        path: str,
        kind: str,
        *,
        on_children: Callable[[list[str]], None] | None = None,
        detail: dict[str, Any] | None = None,
        persistent: bool = False,
    ) -> None:
        self.owner = owner
        self.topic = topic
        self.path = path
        self.kind = kind
        self.on_children = on_children
        self.detail = detail or {}
        self.persistent = persistent and kind == "children"
        self.active = True
        self.armed = threading.Event()

    def arm(self, *, report: bool = False) -> None:
        """Read the node with a watch (never blocks: kazoo answers on its own threads)."""
        zk = self.owner.zk
        try:
            if self.persistent:
                result = add_persistent_watch(zk, self.path, self._event)
                result.rawlink(lambda r: self._persistent_set(r, report))
                return
            if self.kind == "children":
                result = zk.get_children_async(self.path, watch=self._fired, include_data=True)
            else:
                result = zk.exists_async(self.path, watch=self._fired)
        except _OFFLINE:
            return
        result.rawlink(lambda r: self._read(r, report))

    # Persistent watches

    def _persistent_set(self, result: Any, report: bool) -> None:
        try:
            result.get()
        except UnimplementedError:
            log.info("ZooKeeper has no persistent watches: %s is listed on every change", self.path)
            self.persistent = False
            self.arm(report=report)
            return
        except _OFFLINE:
            return
        except Exception:
            log.exception("watching %s failed", self.path)
            return
        # Set: every change from now on is an event. A followed folder counts as set once its
        # items are listed (subscribe() waits for their watches too).
        if self.on_children is None:
            self.armed.set()
        if report:
            self.owner.report(self.topic, dict(self.detail))
        if self.on_children is not None:
            self._list_for_follower()

    def _event(self, event: WatchedEvent) -> bool:
        """A persistent watch's event (kazoo's callback thread); whether to keep the watch.

        Reported at once, nothing read first: the message is on its way one thread hop after
        ZooKeeper's event, whatever the size of the folder."""
        if is_dropped_watch(event):
            return False  # the reconnect sets it again
        if not self.active or self.owner.stopped:
            self.owner.forget(self)
            return False
        self.owner.report(self.topic, dict(self.detail))
        if self.on_children is not None:
            self._list_for_follower()
        return True

    def _list_for_follower(self) -> None:
        try:
            result = self.owner.zk.get_children_async(self.path)
        except _OFFLINE:
            return

        def listed(r: Any) -> None:
            try:
                kids = r.get()
            except NoNodeError:
                kids = []
            except _OFFLINE:
                return
            except Exception:
                log.exception("listing %s failed", self.path)
                return
            if self.on_children is not None:
                self.on_children(kids)
            self.armed.set()

        result.rawlink(listed)

    # One-shot watches

    def _read(self, result: Any, report: bool) -> None:
        try:
            value = result.get()
        except NoNodeError:
            self._watch_creation(report)
            return
        except _OFFLINE:
            return
        except Exception:
            log.exception("watching %s failed", self.path)
            return
        if self.kind == "children":
            kids, stat = value
            if self.on_children is not None:
                self.on_children(kids)  # before armed: subscribe() then waits for these too
            # pzxid: the transaction that last changed the children, so a reader can tell
            # whether a message already reflects a write it knows the zxid of.
            detail = {"count": len(kids), "version": stat.cversion, "zxid": stat.pzxid}
        elif value is None:
            detail = {"exists": False}
        else:
            detail = {"exists": True, "version": value.version, "zxid": value.mzxid}
        self.armed.set()
        if report and self.active:  # a read answered after the last unsubscribe says nothing
            self.owner.report(self.topic, {**self.detail, **detail})

    def _watch_creation(self, report: bool) -> None:
        try:
            result = self.owner.zk.exists_async(self.path, watch=self._fired)
        except _OFFLINE:
            return

        def created(r: Any) -> None:
            try:
                stat = r.get()
            except _OFFLINE:
                return
            except Exception:
                log.exception("watching %s for creation failed", self.path)
                return
            self.armed.set()
            if stat is not None:
                # Created between the two reads: a change whoever asked, and now a folder
                # whose children can be watched after all.
                self.arm(report=True)
            elif report and self.active:
                self.owner.report(self.topic, {**self.detail, "count": 0, "exists": False})

        result.rawlink(created)

    def _fired(self, event: WatchedEvent) -> None:
        # kazoo sends NONE to every watch when the connection drops; the reconnect re-arms them.
        if is_dropped_watch(event):
            return
        if not self.active or self.owner.stopped:
            self.owner.forget(self)
            return
        self.arm(report=True)


class QueueWatcher:
    """Watches of the console's topics on one kazoo client, reported through ``report``."""

    def __init__(
        self, zk: KazooClient, report: Report, *, item_limit: int = ITEM_WATCH_LIMIT
    ) -> None:
        self.zk = zk
        self._report = report
        self.item_limit = item_limit
        self.stopped = False
        self._lock = threading.RLock()
        # (topic, path) -> watch. Inactive watches stay until they fire or the connection
        # drops, so a page opened again reuses the watch kazoo still holds instead of adding one.
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._refs: dict[str, int] = {}
        self._items: dict[str, set[str]] = {}  # topic -> items whose status it watches
        self._up = False

    # Lifecycle

    def start(self) -> None:
        """Arm the fixed topics' watches and follow the connection state.

        Returns once the watches are set (bounded by ARM_WAIT), so that a change made after
        this returns is reported: a socket subscribed to a fixed topic is told of every change
        after its subscription, the first one included.
        """
        self._up = bool(self.zk.connected)
        self.zk.add_listener(self._on_state)
        watches: list[_Watch] = []
        with self._lock:
            for topic in FIXED_TOPICS:
                self._refs[topic] = 1
                watches.extend(self._add_topic(topic))
        self._wait_armed(watches, time.monotonic() + ARM_WAIT)

    def stop(self) -> None:
        """Stop reporting. Watches already set in ZooKeeper fire once more and are ignored."""
        self.stopped = True
        self.zk.remove_listener(self._on_state)
        with self._lock:
            for watch in self._watches.values():
                watch.active = False
            self._watches.clear()
            self._refs.clear()

    @property
    def connected(self) -> bool:
        return self._up

    def active_topics(self) -> list[str]:
        with self._lock:
            return sorted(t for t, n in self._refs.items() if n > 0)

    # Subscriptions

    def subscribe(self, topic: str) -> None:
        """Watch an item topic while at least one subscriber wants it (fixed topics: no-op).

        Blocks until the new watches are set (bounded by ARM_WAIT), so that a change made after
        this returns is reported.
        """
        topic = validate_topic(topic)
        if not is_on_demand(topic):
            return
        with self._lock:
            self._refs[topic] = self._refs.get(topic, 0) + 1
            if self._refs[topic] > 1:
                return
            watches = self._add_topic(topic)
        deadline = time.monotonic() + ARM_WAIT
        if not self._wait_armed(watches, deadline):
            return
        # The topic's own watches have listed their folders: now also the items found there.
        with self._lock:
            followers = [w for (t, _p), w in self._watches.items() if t == topic and w.active]
        self._wait_armed(followers, deadline)

    def _wait_armed(self, watches: list[_Watch], deadline: float) -> bool:
        for watch in watches:
            if not watch.armed.wait(max(0.0, deadline - time.monotonic())):
                log.info("watch of %s not set yet (ZooKeeper unavailable?)", watch.path)
                return False
        return True

    def unsubscribe(self, topic: str) -> None:
        topic = validate_topic(topic)
        if not is_on_demand(topic):
            return
        with self._lock:
            refs = self._refs.get(topic, 0) - 1
            if refs > 0:
                self._refs[topic] = refs
                return
            self._refs.pop(topic, None)
            self._items.pop(topic, None)
            for (t, _path), watch in self._watches.items():
                if t == topic:
                    watch.active = False

    def refs(self, topic: str) -> int:
        with self._lock:
            return self._refs.get(topic, 0)

    # Internals

    def report(self, topic: str, detail: dict[str, Any]) -> None:
        if self.stopped:
            return
        try:
            self._report(topic, detail)
        except Exception:
            log.exception("live report of %s failed", topic)

    def forget(self, watch: _Watch) -> None:
        with self._lock:
            key = (watch.topic, watch.path)
            if self._watches.get(key) is watch and not watch.active:
                del self._watches[key]

    def _add_topic(self, topic: str) -> list[_Watch]:
        watches = [self._watch(topic, path, kind, **extra) for path, kind, extra in _plan(topic)]
        if topic == BATCHES:
            watches[0].on_children = self._items_follower(topic, paths.BATCHES, paths.BID_RE)
        elif topic.startswith("access:"):
            folder = f"{paths.ACCESS}/{topic.partition(':')[2]}"
            watches[0].on_children = self._items_follower(topic, folder, paths.QID_RE)
        elif topic.startswith("batch:"):
            # A job's steps (Estimating -> ... -> Notify) all happen inside batch-processing,
            # so the folders alone would miss them: watch the status of the jobs in there.
            processing = next(w for w in watches if w.path.endswith("/batch-processing"))
            processing.on_children = self._items_follower(topic, paths.JOBS, paths.JID_RE)
        for watch in watches:
            watch.arm()
        return watches

    def _watch(self, topic: str, path: str, kind: str, **extra: Any) -> _Watch:
        """The watch for (topic, path): the dormant one reactivated, or a new one."""
        watch = self._watches.get((topic, path))
        if watch is None:
            watch = _Watch(self, topic, path, kind, **extra)
            self._watches[(topic, path)] = watch
        watch.active = True
        return watch

    def _items_follower(self, topic: str, folder: str, pattern: Any) -> Callable[[list[str]], None]:
        """Keep a status watch on each of the newest items of a collection folder."""

        def follow(children: list[str]) -> None:
            newest = set(sorted(c for c in children if pattern.fullmatch(c))[-self.item_limit :])
            with self._lock:
                if self.stopped:
                    return
                if self._refs.get(topic, 0) <= 0:
                    return  # a late answer for a topic nobody watches any more
                before = self._items.get(topic, set())
                for item in before - newest:
                    watch = self._watches.get((topic, f"{folder}/{item}/status"))
                    if watch is not None:
                        watch.active = False
                added = [
                    self._watch(topic, f"{folder}/{item}/status", "data", detail={"item": item})
                    for item in newest - before
                ]
                self._items[topic] = newest
            for watch in added:
                watch.arm()

        return follow

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: no ZooKeeper calls here, hand them over.
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            if self._up:
                self._up = False
                self.report(ZK_DOWN, {"state": str(state)})
        elif state == KazooState.CONNECTED and not self._up:
            self._up = True
            spawn(self.zk, self._rearm)

    def _rearm(self) -> None:
        """After a reconnect: set every active watch again and report every topic changed."""
        if self.stopped:
            return
        self.report(ZK_UP, {})
        with self._lock:
            for key, watch in list(self._watches.items()):
                if not watch.active:
                    del self._watches[key]  # kazoo dropped it with the connection
            watches = list(self._watches.values())
            topics = sorted(t for t, n in self._refs.items() if n > 0)
        for watch in watches:
            watch.armed.clear()
            watch.arm()
        # Report once the watches are set, so that a page refreshing on this report cannot
        # miss a change made after its refresh (bounded: on failure the next reconnect retries).
        deadline = time.monotonic() + ARM_WAIT
        for watch in watches:
            if not watch.armed.wait(max(0.0, deadline - time.monotonic())):
                break
        for topic in topics:
            self.report(topic, {"reconnected": True})


def _plan(topic: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(path, kind, extra) of each watch a topic needs; the first one leads collections."""
    # The fixed topics' folders are watched for the life of the watcher: persistent watches.
    kept: dict[str, Any] = {"persistent": True}
    if topic.startswith("jobs:state:"):
        return [(paths.job_state_folder(topic.rpartition(":")[2]), "children", kept)]
    if topic == BATCHES:
        return [(paths.BATCHES, "children", kept)]
    if topic == HOLDS:
        return [
            (paths.QUEUE_LOCKS, "children", {**kept, "detail": {"folder": "queue"}}),
            (paths.COLLECTION_LOCKS, "children", {**kept, "detail": {"folder": "collections"}}),
            # The console's own: storage-node holds, who placed a hold and why, caps.
            (NODE_HOLDS, "children", {**kept, "detail": {"folder": "nodes"}}),
            (ABOUT, "children", {**kept, "detail": {"folder": "about"}}),
            (CAPS, "children", {**kept, "detail": {"folder": "caps"}}),
        ]
    if topic.startswith("access:"):
        folder = f"{paths.ACCESS}/{paths.access_queue(topic.partition(':')[2])}"
        return [(folder, "children", kept)]
    if topic.startswith("batch:"):
        bid = paths.bid(topic.partition(":")[2])
        return [
            *((paths.batch_node(bid, n), "data", {}) for n in ("status", "status-report", "lock")),
            *(
                (paths.batch_index(bid, f), "children", {"detail": {"folder": f}})
                for f in BATCH_INDEX_FOLDERS
            ),
        ]
    if topic.startswith("job:"):
        jid = paths.jid(topic.partition(":")[2])
        return [(paths.job_node(jid, n), "data", {}) for n in ("status", "priority", "lock")]
    raise InvalidID(f"topic {topic!r} is not a live topic")


class ChangeSignal:
    """Wakes an idle consumer when the children of its folder change.

    One ZooKeeper watch at a time is kept per signal (a watch fires once and is then re-armed),
    so an idle daemon costs one registered watch, not one per poll. The poll interval stays the
    fallback for what a children watch cannot see (a session that expired, a status change).
    ``event`` is the event a change sets: the signal's own, or one the caller shares with other
    wake-ups (the batched job loop's).
    """

    def __init__(self, zk: KazooClient, path: str, event: threading.Event | None = None) -> None:
        self._zk = zk
        self._path = path
        self._fired = event if event is not None else threading.Event()
        self._armed = False
        # When the watch now set was asked for (monotonic): a listing sent after it has seen
        # every change the watch has not fired for.
        self.armed_at = float("-inf")
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """Whether a watch is set and has not fired yet."""
        return self._armed

    def arm(self) -> list[str] | None:
        """Set the watch unless it is set already. Returns the folder's children as the watch
        was set ([] when the folder does not exist), or None when no watch was set now."""
        with self._lock:
            if self._armed:
                return None
            self._armed = True
            self.armed_at = time.monotonic()
        try:
            try:
                names: list[str] = list_children(self._zk, self._path, self._fire).get()
                return names
            except NoNodeError:
                self._zk.exists(self._path, watch=self._fire)
                return []
        except Exception:
            # Unreachable ZooKeeper: fall back to polling; the next arm() tries again.
            with self._lock:
                self._armed = False
            return None

    def _fire(self, _event: Any) -> None:
        with self._lock:
            self._armed = False
        self._fired.set()

    def wait(self, stop: threading.Event, timeout: float) -> bool:
        """Sleep until the folder changes, ``stop`` is set or ``timeout`` passes.

        Returns whether the folder changed.
        """
        self.arm()
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._fired.wait(min(remaining, 0.25)):
                break
        changed = self._fired.is_set()
        self._fired.clear()
        return changed


_T = TypeVar("_T")


class KeptAnswer(Generic[_T]):
    """An answer read with a one-shot watch, kept until the watch fires (or ``fire`` is called
    for a lost session); ``on_fire`` is told of each fire.

    An answer is kept only when the watch its read set has not fired since the read began: a
    change right after the server answered fires that watch (its callback runs in kazoo's own
    thread) before the reader goes on, and an answer marked kept after that would stay until
    the session ended (a queue hold released at that moment held its loop for good). Then the
    answer serves that look only, and the next look reads again."""

    def __init__(self, on_fire: Callable[[], None]) -> None:
        self._on_fire = on_fire
        self._lock = threading.Lock()
        self._fired = 0  # how many times the watch fired
        self._value: _T | None = None
        self._read_at = -1  # ``_fired`` when the kept value's read began: kept while equal

    def get(self, read: Callable[[Callable[[Any], None]], _T | None]) -> _T | None:
        """The kept answer, or ``read(watcher)``'s (``watcher``: the callback to set as the
        read's watch). A None answer is not kept; ``read``'s errors are the caller's."""
        with self._lock:
            if self._read_at == self._fired:
                return self._value
            fired = self._fired
        value = read(self.fire)
        if value is not None:
            with self._lock:
                self._value, self._read_at = value, fired
        return value

    def fire(self, _event: Any = None) -> None:
        with self._lock:
            self._fired += 1
        self._on_fire()


class PresenceWatch:
    """Whether a node exists (a queue hold), as an exists watch last saw it: one request when
    the node comes or goes, not one a look. Each change (and a lost session, which takes the
    watch with it) sets ``event``, so a loop waiting on it wakes when the answer may differ."""

    def __init__(self, zk: KazooClient, path: str, event: threading.Event) -> None:
        self._zk = zk
        self._path = path
        self._answer: KeptAnswer[bool] = KeptAnswer(event.set)
        zk.add_listener(self._on_state)

    def present(self) -> bool | None:
        """Whether the node exists; None when ZooKeeper could not be asked (then the caller's
        own reads decide, as without the watch)."""
        try:
            return self._answer.get(
                lambda watch: self._zk.exists(self._path, watch=watch) is not None
            )
        except Exception:
            return None

    def close(self) -> None:
        self._zk.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._answer.fire()
