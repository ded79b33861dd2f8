"""Storage-node holds and maintenance windows: nodes of the console's own under
``/mrt-console/holds/``, which Merritt's library never reads (the contract defines queue and
collection holds only; see docs/zookeeper-contract-notes.md).

``/mrt-console/holds/nodes/<node>``
    JSON ``{"at", "by", "reason"}``. Jobs bound for storage node ``<node>`` (the node of their
    ``store`` node's mode) wait in Storing and Recording, unclaimed, until it is released.
``/mrt-console/holds/services/<service>``
    JSON ``{"at", "by", "reason", "probe"}``: a service outside held, by its breaker or by
    hand (``inventory``, ``ezid``, ``depositor:<host>:<port>``, ``callback:<host>:<port>``).
    Jobs whose step needs it wait unclaimed before that step until it is released; ``probe``
    is the URL the breaker's probe asks.
``/mrt-console/holds/windows/<kind>:<name>``
    JSON ``{"kind", "name", "until", "reason", "by", "at", "auto_release"}``: a hold (queue,
    collection or storage node) that ends at ``until``. The maintenance daemon releases it then,
    deleting the window and the hold in one transaction checked against the window's version,
    so with any number of daemons on any number of hosts it is released exactly once.
``/mrt-console/holds/releasing/<kind>:<name>``
    The window's JSON, and an ephemeral ``lock`` child: a window's end that released a hold
    which parks items (the ingest queue's, a collection's), made in the same transaction. The
    releasing session lets the parked items go, then deletes both; one left without its lock
    (that session ended first) is taken over and finished by another maintenance daemon.
``/mrt-console/holds/about/<kind>:<name>``
    JSON ``{"by", "reason", "at", "marker"}``: who placed a queue or collection hold and why
    (the contract's hold markers are empty nodes). ``marker`` is the hold marker's ``czxid``:
    a record whose marker was released and placed again since (by Merritt's own tools, or by
    a window's end) names another hold and is not shown (``hold_records``).
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from queues.core.moments import aware

from . import paths
from .codecs import decode_json, encode_json
from .errors import InvalidID, MalformedNode
from .kazoo_private import session_id
from .nodes import Read, children, exists_many, read_many, stamp
from .records import Job
from .servertime import server_moment

HOLDS = f"{paths.CONSOLE}/holds"
NODE_HOLDS = f"{HOLDS}/nodes"
WINDOWS = f"{HOLDS}/windows"
RELEASING = f"{HOLDS}/releasing"
ABOUT = f"{HOLDS}/about"
NODE_RE = re.compile(r"^[1-9][0-9]{0,8}$")  # a storage node number, as profiles name it
SERVICE_HOLDS = f"{HOLDS}/services"
KINDS = ("queue", "collection", "node")
BREAKER = "breaker"  # the ``by`` of the node holds a breaker places (queues/daemons/breakers.py)
# The services outside a hold can name (storage nodes have holds of their own): a whole service,
# or a depositor's or callback receiver's server, as ``host:port`` with the port always written
# (a host name of at most 100 characters, so the name fits the audit log's item column).
WHOLE_SERVICES = ("inventory", "ezid")
SERVER_SERVICES = ("depositor", "callback")
_SERVER_RE = re.compile(
    r"^(?:\[[0-9a-f:.]{2,45}\]|[a-z0-9](?:[a-z0-9.-]{0,98}[a-z0-9])?):[0-9]{1,5}$"
)

# How far ahead a hold's end may be set. A maintenance window lasts hours or days; a year covers
# any that is planned, and an end past it is a slip (9999-12-31) that means "no end" while
# looking like one. docs/console.md ("Holds") says so to operators.
WINDOW_HORIZON = timedelta(days=365)


def _hold_create(zk: KazooClient, path: str, **fields: str) -> bool:
    """Create a hold's node with its record; False when it exists (left as it was)."""
    info = {"at": datetime.now(UTC).isoformat(), **fields}
    try:
        zk.create(path, encode_json(info), makepath=True)
    except NodeExistsError:
        return False
    return True


def _hold_delete(zk: KazooClient, path: str) -> bool:
    try:
        zk.delete(path)
    except NoNodeError:
        return False
    return True


def _hold_nodes(
    zk: KazooClient, folder: str, names: list[str]
) -> dict[str, tuple[dict[str, Any], Any]]:
    """The record (``{}`` when unreadable) and stat of each hold named, skipping those gone
    (released between the listing and the read), all read in one round trip."""
    reads = read_many(zk, [f"{folder}/{name}" for name in names])
    found: dict[str, tuple[dict[str, Any], Any]] = {}
    for name in names:
        path = f"{folder}/{name}"
        read = reads[path]
        if read is None:
            continue
        try:
            info = decode_json(path, read[0])
        except MalformedNode:
            info = {}
        found[name] = (info, read[1])
    return found


def node_number(value: object) -> int:
    """A storage node number (``9501``), validated before it touches a path."""
    text = str(value).strip()
    if not NODE_RE.fullmatch(text):
        raise InvalidID(f"storage node {value!r} is not a node number")
    return int(text)


def node_hold_path(node: object) -> str:
    return f"{NODE_HOLDS}/{node_number(node)}"


@dataclass(frozen=True)
class NodeHold:
    node: int
    at: datetime | None
    by: str
    reason: str


def node_hold_set(zk: KazooClient, node: object, *, by: str = "", reason: str = "") -> bool:
    """Hold a storage node; False when it was already held (its record is left as it was)."""
    return _hold_create(zk, node_hold_path(node), by=by, reason=reason)


def node_hold_clear(zk: KazooClient, node: object) -> bool:
    return _hold_delete(zk, node_hold_path(node))


def breaker_hold_clear(zk: KazooClient, node: object, *, by: str) -> bool:
    """Release the hold of ``node`` only if ``by`` placed it (a breaker's, not an operator's
    hold placed meanwhile): deleted at the version read. False when it is not held, or by
    someone else, or changed since the read."""
    return _clear_if_by(zk, node_hold_path(node), by)


def node_held(zk: KazooClient, node: object) -> bool:
    """Whether jobs bound for ``node`` wait; a value that is no node number names no hold."""
    try:
        path = node_hold_path(node)
    except InvalidID:
        return False
    return zk.exists(path) is not None


def node_holds(zk: KazooClient) -> dict[int, NodeHold]:
    """Every storage-node hold, by node number (a name that is not a node number is skipped)."""
    names = [n for n in children(zk, NODE_HOLDS) if NODE_RE.fullmatch(n)]
    found = {
        int(name): NodeHold(
            node=int(name),
            at=stamp(stat.ctime),
            by=str(info.get("by") or ""),
            reason=str(info.get("reason") or ""),
        )
        for name, (info, stat) in _hold_nodes(zk, NODE_HOLDS, names).items()
    }
    return dict(sorted(found.items()))


def _clear_if_by(zk: KazooClient, path: str, by: str) -> bool:
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return False
    try:
        info = decode_json(path, data)
    except MalformedNode:
        return False
    if info.get("by") != by:
        return False
    try:
        zk.delete(path, version=stat.version)
    except (NoNodeError, BadVersionError):
        return False
    return True


# Services outside ---------------------------------------------------------------------------


def service_name(value: object) -> str:
    """A service a hold can name, validated before it touches a path: ``inventory``, ``ezid``,
    ``depositor example.org:443`` or ``callback 10.0.0.5:8080`` (``:`` between kind and server
    is taken too, as the node's name spells it). InvalidID otherwise."""
    text = " ".join(str(value).strip().lower().split())
    kind, sep, server = text.partition(" ")
    if not sep:
        kind, _, server = text.partition(":")
    if kind in WHOLE_SERVICES and not server:
        return kind
    if kind in SERVER_SERVICES and server and _SERVER_RE.fullmatch(server):
        port = int(server.rsplit(":", 1)[1])
        if 0 < port < 65536:
            return f"{kind} {server}"
    raise InvalidID(f"{value!r} names no service: inventory, ezid, or depositor/callback host:port")


def service_key(service: object) -> str:
    """A service's name as its hold's node, its URLs and the audit log spell it, without a
    space: ``ezid``, ``depositor:example.org:443``."""
    return service_name(service).replace(" ", ":", 1)


def service_hold_path(service: object) -> str:
    return f"{SERVICE_HOLDS}/{service_key(service)}"


@dataclass(frozen=True)
class ServiceHold:
    service: str
    at: datetime | None
    by: str
    reason: str
    probe: str

    @property
    def key(self) -> str:
        return service_key(self.service)


def service_hold_set(
    zk: KazooClient, service: object, *, by: str = "", reason: str = "", probe: str = ""
) -> bool:
    """Hold a service outside; False when it was already held (its record is left as it was)."""
    return _hold_create(zk, service_hold_path(service), by=by, reason=reason, probe=probe)


def service_hold_clear(zk: KazooClient, service: object, *, by: str | None = None) -> bool:
    """Release a service's hold (only if ``by`` placed it, when given: a breaker releases its
    own hold, never an operator's placed meanwhile); False when nothing was released."""
    path = service_hold_path(service)
    return _clear_if_by(zk, path, by) if by is not None else _hold_delete(zk, path)


def service_holds(zk: KazooClient) -> dict[str, ServiceHold]:
    """Every service hold, by service name (a node whose name names no service is skipped)."""
    names = {}
    for name in children(zk, SERVICE_HOLDS):
        with contextlib.suppress(InvalidID):
            names[name] = service_name(name)
    found = {
        names[name]: ServiceHold(
            service=names[name],
            at=stamp(stat.ctime),
            by=str(info.get("by") or ""),
            reason=str(info.get("reason") or ""),
            probe=str(info.get("probe") or ""),
        )
        for name, (info, stat) in _hold_nodes(zk, SERVICE_HOLDS, list(names)).items()
    }
    return dict(sorted(found.items()))


class HeldServices:
    """The services held now, as a watch on ``/mrt-console/holds/services`` keeps them: asked
    for every job a step looks at, so it costs no request."""

    def __init__(self, zk: KazooClient) -> None:
        self.names: frozenset[str] = frozenset()
        self.failed = False
        self._events: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        self._events_lock = threading.Lock()
        # Set up in a thread of its own: the caller (a claim's turn) never waits for ZooKeeper.
        # Until the watch's first answer nothing counts as held: a job taken meanwhile meets its
        # service's outage, if there is one, and waits for its next try.
        threading.Thread(target=self._start, args=(zk,), name="held-services", daemon=True).start()

    def _start(self, zk: KazooClient) -> None:
        try:
            zk.ensure_path(SERVICE_HOLDS)
            ChildrenWatch(zk, SERVICE_HOLDS, self._changed)
        except Exception:  # ZooKeeper away or the client closed: the next call tries again
            self.failed = True

    def _changed(self, children: list[str] | None) -> None:
        names = set()
        for child in children or ():
            try:
                names.add(service_name(child))
            except InvalidID:
                continue
        released = bool(self.names - names)
        self.names = frozenset(names)
        if released:
            with self._events_lock:
                events = list(self._events)
            for event in events:
                event.set()

    def subscribe(self, event: threading.Event) -> None:
        """Set ``event`` whenever a service's hold goes (its jobs may be taken up again)."""
        with self._events_lock:
            self._events.add(event)


class FolderWatch:
    """Whether some folders have children, as watches on them keep it: a daemon that reads
    them every round reads nothing while they are empty (the usual idle queue's case).

    Until a folder's watch has answered, and after its folder is deleted, it counts as not
    empty, so the caller reads as it would without the watch; kazoo's ``ChildrenWatch`` reads
    the folder again when a lost session's replacement connects."""

    def __init__(self, zk: KazooClient, folders: tuple[str, ...]) -> None:
        self._counts: dict[str, int | None] = dict.fromkeys(folders)
        for folder in folders:
            zk.ensure_path(folder)
            ChildrenWatch(zk, folder, functools.partial(self._changed, folder))

    def _changed(self, folder: str, children: list[str] | None) -> None:
        self._counts[folder] = None if children is None else len(children)

    def empty(self, *folders: str) -> bool:
        """True when every one of ``folders`` is known, from its watch, to have no child."""
        return all(self._counts.get(folder) == 0 for folder in folders)


_held: weakref.WeakKeyDictionary[Any, HeldServices] = weakref.WeakKeyDictionary()
_held_lock = threading.Lock()


def held_services_watch(zk: KazooClient) -> HeldServices:
    """The ``HeldServices`` of this client, made at the first call (again after it failed)."""
    watch = _held.get(zk)
    if watch is None or watch.failed:
        with _held_lock:
            watch = _held.get(zk)
            if watch is None or watch.failed:
                watch = _held[zk] = HeldServices(zk)
    return watch


def held_services(zk: KazooClient) -> frozenset[str]:
    """The services held now (``HeldServices`` of this client, made at the first call)."""
    return held_services_watch(zk).names


def job_store_node(job: Job) -> int | None:
    """The storage node a job is bound for: the node in its ``store`` node's mode
    (``add/<node>/<ark>``, as Merritt's storage consumer splits it); None when it names none."""
    return mode_node((job.store or {}).get("mode"))


def mode_node(mode: object) -> int | None:
    """The storage node of a ``store`` node's mode (``add/<node>/<ark>``); None when it names
    none."""
    parts = mode.split("/") if isinstance(mode, str) else []
    if len(parts) != 3 or not NODE_RE.fullmatch(parts[1]):
        return None
    return int(parts[1])


# Who placed a queue or collection hold, and why ---------------------------------------------


@dataclass(frozen=True)
class HoldRecord:
    kind: str  # queue | collection
    name: str
    by: str
    reason: str
    at: datetime | None


def about_path(kind: str, name: str) -> str:
    if kind not in ("queue", "collection"):
        raise InvalidID(f"a hold record is of a queue or a collection, not {kind!r}")
    hold_marker(kind, name)  # validates the name
    return f"{ABOUT}/{kind}:{name}"


def hold_record_set(zk: KazooClient, kind: str, name: str, *, by: str, reason: str) -> bool:
    """Note who placed the hold of ``kind``/``name`` (which must be there) and why, replacing
    an earlier note; False when the hold is not there."""
    path = about_path(kind, name)
    marker = zk.exists(hold_marker(kind, name))
    if marker is None:
        return False
    info = {"by": by, "reason": reason, "at": datetime.now(UTC).isoformat(), "marker": marker.czxid}
    try:
        zk.create(path, encode_json(info), makepath=True)
    except NodeExistsError:
        # Made again rather than changed, so that the pages watching the folder's children
        # (the live "holds" topic) hear of it.
        txn = zk.transaction()
        txn.delete(path)
        txn.create(path, encode_json(info))
        txn.commit()
    return True


def hold_record_clear(zk: KazooClient, kind: str, name: str) -> None:
    with contextlib.suppress(NoNodeError):
        zk.delete(about_path(kind, name))


def _hold_records(
    zk: KazooClient, wanted: list[tuple[str, str]]
) -> dict[tuple[str, str], HoldRecord]:
    records = [about_path(k, n) for k, n in wanted]
    markers = [hold_marker(k, n) for k, n in wanted]
    reads = read_many(zk, records + markers)
    found = {}
    for (kind, name), rpath, mpath in zip(wanted, records, markers, strict=True):
        record, marker = reads[rpath], reads[mpath]
        if record is None or marker is None:
            continue
        try:
            info = decode_json(rpath, record[0])
        except MalformedNode:
            continue
        if info.get("marker") != marker[1].czxid:
            continue  # the record of an earlier hold of the same name
        found[(kind, name)] = HoldRecord(
            kind=kind,
            name=name,
            by=str(info.get("by") or ""),
            reason=str(info.get("reason") or ""),
            at=_stored_at(info.get("at")),
        )
    return found


def hold_records(zk: KazooClient) -> dict[tuple[str, str], HoldRecord]:
    """Who placed each queue and collection hold now there, and why, by (kind, name), in two
    round trips; a hold placed without the console has none."""
    wanted = []
    for key in children(zk, ABOUT):
        kind, _, name = key.partition(":")
        try:
            about_path(kind, name)
        except InvalidID:
            continue
        wanted.append((kind, name))
    return _hold_records(zk, wanted) if wanted else {}


# Maintenance windows ------------------------------------------------------------------------


def hold_marker(kind: str, name: str) -> str:
    """The hold node a window ends: the contract's queue and collection markers, ours for nodes."""
    if kind == "queue":
        return paths.queue_lock(name)
    if kind == "collection":
        return paths.collection_lock(name)
    if kind == "node":
        return node_hold_path(name)
    raise InvalidID(f"a hold is of a queue, a collection or a storage node, not {kind!r}")


def window_path(kind: str, name: str) -> str:
    hold_marker(kind, name)  # validates both
    return f"{WINDOWS}/{kind}:{name}"


def check_window_end(
    until: datetime | None,
    now: Callable[[], datetime],
    show: Callable[[datetime], str] = lambda d: d.isoformat(timespec="minutes"),
) -> None:
    """ValueError unless ``until`` may end a hold being placed now: None (no end), or a time
    with a zone, after ``now()`` and at most WINDOW_HORIZON ahead. ``now`` is asked only for an
    end to judge: the ZooKeeper server's time (``servertime.server_moment``), the clock the
    maintenance daemon releases the hold by. Every door that places a hold
    calls this before it writes anything (``queues/services/moves.py``), ``show`` writing the times
    its refusal names (the console's clock; this layer imports no Django)."""
    if until is None:
        return
    if not isinstance(until, datetime):
        raise ValueError(f"the end of a maintenance window must be a date and time, not {until!r}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise ValueError("the end of a maintenance window needs a time zone")
    when = now()
    shown = show(until)
    if until <= when:
        raise ValueError(f"the end of a maintenance window must be in the future, not {shown}")
    latest = when + WINDOW_HORIZON
    if until > latest:
        raise ValueError(
            f"the end of a maintenance window may be at most {WINDOW_HORIZON.days} days ahead "
            f"(by {show(latest)}), not {shown}"
        )


@dataclass(frozen=True)
class Window:
    kind: str
    name: str
    until: datetime
    reason: str
    by: str
    at: datetime | None
    auto_release: bool
    version: int

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


def window_set(
    zk: KazooClient,
    kind: str,
    name: str,
    *,
    until: datetime,
    reason: str = "",
    by: str = "",
    auto_release: bool = True,
) -> None:
    """Give the hold of ``kind``/``name`` an end (replacing an earlier one)."""
    if until.tzinfo is None:
        raise ValueError("a maintenance window's end needs a time zone")
    path = window_path(kind, name)
    info = {
        "kind": kind,
        "name": name,
        "until": until.astimezone(UTC).isoformat(),
        "reason": reason,
        "by": by,
        "at": datetime.now(UTC).isoformat(),
        "auto_release": auto_release,
    }
    try:
        zk.create(path, encode_json(info), makepath=True)
    except NodeExistsError:
        zk.set(path, encode_json(info))


def window_clear(zk: KazooClient, kind: str, name: str) -> bool:
    try:
        zk.delete(window_path(kind, name))
    except NoNodeError:
        return False
    return True


def _window(key: str, read: Read) -> Window | None:
    """The window named ``key`` from its node's read; None when gone or unreadable."""
    kind, _, name = key.partition(":")
    if kind not in KINDS or read is None:
        return None
    path = f"{WINDOWS}/{key}"
    data, stat = read
    try:
        info = decode_json(path, data)
        until = datetime.fromisoformat(str(info["until"]))
        window_path(kind, name)
    except (MalformedNode, KeyError, ValueError, InvalidID):
        return None
    return Window(
        kind=kind,
        name=name,
        until=_stored_time(until),
        reason=str(info.get("reason") or ""),
        by=str(info.get("by") or ""),
        at=_stored_at(info.get("at")),
        auto_release=info.get("auto_release") is not False,
        version=stat.version,
    )


def _stored_time(value: datetime) -> datetime:
    """A time read from a window, in UTC and kept inside what compares and converts safely
    (``queues.core.moments``): an older console's 9999-12-31 or a hand-written node's end then
    costs no arithmetic or display an OverflowError."""
    return aware(value, local=False).astimezone(UTC)


def _stored_at(value: object) -> datetime | None:
    """When a window was set, if it says so readably (it is shown, never acted on)."""
    if not isinstance(value, str):
        return None
    try:
        return _stored_time(datetime.fromisoformat(value))
    except ValueError:
        return None


def windows(zk: KazooClient) -> list[Window]:
    """Every maintenance window, the soonest end first (unreadable ones, and those gone
    between the listing and the read, are skipped), read in one round trip."""
    keys = children(zk, WINDOWS)
    reads = read_many(zk, [f"{WINDOWS}/{key}" for key in keys])
    found = [w for key in keys if (w := _window(key, reads[f"{WINDOWS}/{key}"])) is not None]
    return sorted(found, key=lambda w: w.until)


def parks(window: Window) -> bool:
    """Whether the hold ``window`` ends parks items its release lets go: the ingest queue's
    (the batches Batch Pending held while it was held) and a collection's (its Held jobs and
    batches)."""
    return window.kind == "collection" or (window.kind, window.name) == ("queue", "ingest")


def _release_path(window: Window) -> str:
    return f"{RELEASING}/{window.key}"


def release_window(zk: KazooClient, window: Window) -> bool:
    """End ``window`` and its hold in one transaction checked against the window's version:
    True for the one caller that did it, False when another did first (or the window changed).
    A hold already released by hand ends only its window.

    A hold that parks items (``parks``) leaves, in the same transaction, a record of the
    release under ``RELEASING`` with an ephemeral lock of the caller's session in it: the caller
    lets the parked items go and then ends the record (``finish_release``). Should its session
    end first, the record stays without its lock, and another daemon finishes the release
    (``unfinished_releases``). While a release of the same hold is unfinished, the window waits
    (False)."""
    path = window_path(window.kind, window.name)
    marker = hold_marker(window.kind, window.name)
    parking = parks(window)
    if parking:
        zk.ensure_path(RELEASING)
    txn = zk.transaction()
    txn.delete(path, version=window.version)
    if zk.exists(marker) is not None:
        txn.delete(marker)
    if parking:
        record = _release_path(window)
        txn.create(record, encode_json(_window_fields(window)))
        txn.create(f"{record}/lock", b"", ephemeral=True)
    results = txn.commit()
    if any(isinstance(r, Exception) for r in results):
        failed = [r for r in results if isinstance(r, Exception)]
        if any(isinstance(r, NoNodeError | BadVersionError | NodeExistsError) for r in failed):
            # Gone or changed since it was read: someone else released or moved it. A hold
            # released by hand between the look and the commit is picked up next time round,
            # as is one whose earlier release is still being finished.
            return False
        raise failed[0]
    return True


def _window_fields(window: Window) -> dict[str, Any]:
    """A window's node's JSON, as ``window_set`` writes it (``_window`` reads it back)."""
    return {
        "kind": window.kind,
        "name": window.name,
        "until": window.until.astimezone(UTC).isoformat(),
        "reason": window.reason,
        "by": window.by,
        "at": window.at.isoformat() if window.at else None,
        "auto_release": window.auto_release,
    }


def unfinished_releases(zk: KazooClient) -> list[Window]:
    """The windows whose release ended their hold but whose parked items the releasing
    session did not get to let go before it ended (their record's lock gone with it). One
    listing of an empty folder when there are none."""
    keys = children(zk, RELEASING)
    if not keys:
        return []
    reads = read_many(zk, [f"{RELEASING}/{key}" for key in keys])
    locks = exists_many(zk, [f"{RELEASING}/{key}/lock" for key in keys])
    return [
        w
        for key in keys
        if locks[f"{RELEASING}/{key}/lock"] is None
        and (w := _window(key, reads[f"{RELEASING}/{key}"])) is not None
    ]


def take_release(zk: KazooClient, window: Window) -> bool:
    """Take over an unfinished release (its record's lock, in this session); False when
    another session took it first or finished it."""
    try:
        zk.create(f"{_release_path(window)}/lock", b"", ephemeral=True)
    except (NodeExistsError, NoNodeError):
        return False
    return True


def finish_release(zk: KazooClient, window: Window) -> None:
    """End the record of a release whose parked items were let go: its lock (this session's,
    from ``release_window`` or ``take_release``) and the record, in one transaction. A record
    whose lock is not this session's (that session ended, and another daemon may have taken
    the release over) is left to whoever holds or takes its lock."""
    record = _release_path(window)
    stat = zk.exists(f"{record}/lock")
    if stat is None or stat.ephemeralOwner != session_id(zk):
        return
    txn = zk.transaction()
    txn.delete(f"{record}/lock")
    txn.delete(record)
    results = txn.commit()
    failed = [r for r in results if isinstance(r, Exception)]
    if failed and not all(isinstance(r, NoNodeError) for r in failed):
        raise failed[0]


def due(zk: KazooClient, now: datetime | None = None) -> list[Window]:
    """Windows past their end that release themselves: past it by the ZooKeeper server's
    clock, which every host reads alike (``servertime``), so a host whose clock runs ahead
    releases no hold before its end."""
    when = now or server_moment(zk)
    return [w for w in windows(zk) if w.auto_release and w.until <= when]


def overrun(zk: KazooClient, grace: timedelta, now: datetime | None = None) -> list[Window]:
    """Windows more than ``grace`` past their end whose hold is still there: not released by a
    daemon (none runs, or the window does not release itself). By the server's clock unless
    ``now`` is given."""
    when = now or server_moment(zk)
    try:
        ended_by = when - grace
    except OverflowError:  # a grace longer than the calendar: nothing can be past it
        return []
    late = [w for w in windows(zk) if w.until <= ended_by]
    held = exists_many(zk, [hold_marker(w.kind, w.name) for w in late])
    return [w for w in late if held[hold_marker(w.kind, w.name)] is not None]


def window_info(w: Window) -> dict[str, Any]:
    return {
        "kind": w.kind,
        "name": w.name,
        # The API's one form (queues.core.clock.exact): UTC, to the second.
        "until": w.until.astimezone(UTC).isoformat(timespec="seconds"),
        "reason": w.reason,
        "by": w.by,
        "auto_release": w.auto_release,
    }
