"""Storage-node holds and maintenance windows: nodes of the console's own under
``/mrt-console/holds/``, which Merritt's library never reads (the contract defines queue and
collection holds only; see docs/zookeeper-contract-notes.md).

``/mrt-console/holds/nodes/<node>``
    JSON ``{"at", "by", "reason"}``. Jobs bound for storage node ``<node>`` (the node of their
    ``store`` node's mode) wait in Storing and Recording, unclaimed, until it is released.
``/mrt-console/holds/windows/<kind>:<name>``
    JSON ``{"kind", "name", "until", "reason", "by", "at", "auto_release"}``: a hold (queue,
    collection or storage node) that ends at ``until``. The maintenance daemon releases it then,
    deleting the window and the hold in one transaction checked against the window's version,
    so with any number of daemons on any number of hosts it is released exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from . import paths
from .codecs import decode_json, encode_json
from .errors import InvalidID, MalformedNode
from .nodes import children, stamp
from .records import Job

HOLDS = f"{paths.CONSOLE}/holds"
NODE_HOLDS = f"{HOLDS}/nodes"
WINDOWS = f"{HOLDS}/windows"
NODE_RE = re.compile(r"^[1-9][0-9]{0,8}$")  # a storage node number, as profiles name it
KINDS = ("queue", "collection", "node")

# How far ahead a hold's end may be set. A maintenance window lasts hours or days; a year covers
# any that is planned, and an end past it is a slip (9999-12-31) that means "no end" while
# looking like one. docs/console.md ("Holds") says so to operators.
WINDOW_HORIZON = timedelta(days=365)
# Ends read back from ZooKeeper are kept this far inside what Python's datetime can hold, so
# that no arithmetic or time-zone conversion on a stored end (an older console's 9999-12-31,
# a hand-written node) can overflow.
_EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(days=2)
_LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=2)


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
    info = {"at": datetime.now(UTC).isoformat(), "by": by, "reason": reason}
    try:
        zk.create(node_hold_path(node), encode_json(info), makepath=True)
    except NodeExistsError:
        return False
    return True


def node_hold_clear(zk: KazooClient, node: object) -> bool:
    try:
        zk.delete(node_hold_path(node))
    except NoNodeError:
        return False
    return True


def breaker_hold_clear(zk: KazooClient, node: object, *, by: str) -> bool:
    """Release the hold of ``node`` only if ``by`` placed it (a breaker's, not an operator's
    hold placed meanwhile): deleted at the version read. False when it is not held, or by
    someone else, or changed since the read."""
    path = node_hold_path(node)
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


def node_held(zk: KazooClient, node: object) -> bool:
    """Whether jobs bound for ``node`` wait; a value that is no node number names no hold."""
    try:
        path = node_hold_path(node)
    except InvalidID:
        return False
    return zk.exists(path) is not None


def node_holds(zk: KazooClient) -> dict[int, NodeHold]:
    """Every storage-node hold, by node number (a name that is not a node number is skipped)."""
    found: dict[int, NodeHold] = {}
    for name in children(zk, NODE_HOLDS):
        if not NODE_RE.fullmatch(name):
            continue
        path = f"{NODE_HOLDS}/{name}"
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            continue
        try:
            info = decode_json(path, data)
        except MalformedNode:
            info = {}
        found[int(name)] = NodeHold(
            node=int(name),
            at=stamp(stat.ctime),
            by=str(info.get("by") or ""),
            reason=str(info.get("reason") or ""),
        )
    return dict(sorted(found.items()))


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


def check_window_end(until: datetime | None, now: datetime | None = None) -> None:
    """ValueError unless ``until`` may end a hold being placed now: None (no end), or a time
    with a zone, after now and at most WINDOW_HORIZON ahead. Every door that places a hold
    calls this before it writes anything (``queues/services.py``)."""
    if until is None:
        return
    if not isinstance(until, datetime):
        raise ValueError(f"the end of a maintenance window must be a date and time, not {until!r}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise ValueError("the end of a maintenance window needs a time zone")
    when = now or datetime.now(UTC)
    shown = until.isoformat(timespec="minutes")
    if until <= when:
        raise ValueError(f"the end of a maintenance window must be in the future, not {shown}")
    latest = when + WINDOW_HORIZON
    if until > latest:
        raise ValueError(
            f"the end of a maintenance window may be at most {WINDOW_HORIZON.days} days ahead "
            f"(by {latest.isoformat(timespec='minutes')}), not {shown}"
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

    def seconds_left(self, now: datetime | None = None) -> float:
        return (self.until - (now or datetime.now(UTC))).total_seconds()

    @property
    def ended(self) -> bool:
        return self.seconds_left() <= 0


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


def _window(zk: KazooClient, key: str) -> Window | None:
    kind, _, name = key.partition(":")
    if kind not in KINDS:
        return None
    path = f"{WINDOWS}/{key}"
    try:
        data, stat = zk.get(path)
        info = decode_json(path, data)
        until = datetime.fromisoformat(str(info["until"]))
        window_path(kind, name)
    except (NoNodeError, MalformedNode, KeyError, ValueError, InvalidID):
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
    """A time read from a window, in UTC and kept inside what compares and converts safely:
    any stored end, however far off, then costs no arithmetic or display an OverflowError."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=UTC)
    return min(max(value, _EARLIEST), _LATEST).astimezone(UTC)


def _stored_at(value: object) -> datetime | None:
    """When a window was set, if it says so readably (it is shown, never acted on)."""
    if not isinstance(value, str):
        return None
    try:
        return _stored_time(datetime.fromisoformat(value))
    except ValueError:
        return None


def windows(zk: KazooClient) -> list[Window]:
    """Every maintenance window, the soonest end first (unreadable ones are skipped)."""
    found = [w for key in children(zk, WINDOWS) if (w := _window(zk, key)) is not None]
    return sorted(found, key=lambda w: w.until)


def release_window(zk: KazooClient, window: Window) -> bool:
    """End ``window`` and its hold in one transaction checked against the window's version:
    True for the one caller that did it, False when another did first (or the window changed).
    A hold already released by hand ends only its window."""
    path = window_path(window.kind, window.name)
    marker = hold_marker(window.kind, window.name)
    txn = zk.transaction()
    txn.delete(path, version=window.version)
    if zk.exists(marker) is not None:
        txn.delete(marker)
    results = txn.commit()
    if any(isinstance(r, Exception) for r in results):
        failed = [r for r in results if isinstance(r, Exception)]
        if any(isinstance(r, NoNodeError | BadVersionError) for r in failed):
            # Gone or changed since it was read: someone else released or moved it. A hold
            # released by hand between the look and the commit is picked up next time round.
            return False
        raise failed[0]
    return True


def due(zk: KazooClient, now: datetime | None = None) -> list[Window]:
    """Windows past their end that release themselves."""
    when = now or datetime.now(UTC)
    return [w for w in windows(zk) if w.auto_release and w.until <= when]


def overrun(zk: KazooClient, grace: timedelta, now: datetime | None = None) -> list[Window]:
    """Windows more than ``grace`` past their end whose hold is still there: not released by a
    daemon (none runs, or the window does not release itself)."""
    when = now or datetime.now(UTC)
    try:
        ended_by = when - grace
    except OverflowError:  # a grace longer than the calendar: nothing can be past it
        return []
    late = [w for w in windows(zk) if w.until <= ended_by]
    return [w for w in late if zk.exists(hold_marker(w.kind, w.name)) is not None]


def window_info(w: Window) -> dict[str, Any]:
    return {
        "kind": w.kind,
        "name": w.name,
        "until": w.until.isoformat(),
        "reason": w.reason,
        "by": w.by,
        "auto_release": w.auto_release,
    }
