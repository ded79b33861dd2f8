"""Per-collection caps on jobs in flight (between Estimating and Notify), honoured by every
Pending consumer on every host.

Nodes, all under ``/mrt-console/caps/`` (Merritt's library never reads them):

- ``/mrt-console/caps/<profile>``: the cap, JSON ``{"limit": N, "by": ..., "at": ..., "reason":
  ...}``;
- ``/mrt-console/caps/<profile>/flight``: the count's folder; its data is empty and its version
  is the gate every entry into flight is written against;
- ``/mrt-console/caps/<profile>/flight/<JID>``: one empty marker per job counted in flight.

Entering (``reserve``, the Pending step, before the job's move to Estimating): the cap node, the
folder's stat (version and number of children) and the job's own marker are read in one round
trip; with fewer markers than the limit, ONE multi checks the cap node's version, sets the
folder's data at the version read and creates the marker. Two consumers that read the same
count cannot both get in: the second multi fails on the folder's version and reads again. So
the markers never exceed the limit, and since every job the Pending step moves into flight got
its marker first, neither do the jobs it moved there.

Leaving is not written by the steps at all (no request on any move): markers of jobs that have
left flight are found and deleted by ``verify``, which a consumer runs when it finds the count
at the limit (at most once a second per collection and loop), and which reads the marked jobs'
statuses and locks in one round trip. A marker goes only in a multi checked against the status
version it was read at (and, for a job still Pending, the job's lock being absent: a lock
created and deleted in the same multi fails when one exists), so a job that is moving into
flight, or being resumed there, at that moment keeps its marker.

So the count can be too high for a moment (a job completed since the last verify), never too low
by our own moves. It is low only for jobs that entered flight some other way: an operator's
resume (``count_entry``, right after the move; over ``MARKERS_MAX`` markers it prunes first,
and counts nothing while they are all still in flight), a job moved by Merritt's own
consumers, or jobs already in flight when the cap was set. ``recount`` adds markers for the
in-flight jobs the caller names (the console takes them from its read index when a cap is set,
and on the caps page) and removes stale ones.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from queues.core.states import JOB_WORKING, JobState

from . import paths
from .codecs import decode_json, encode_json, now_stamp, parse_stamp
from .errors import MalformedNode
from .nodes import children, collect_reads, read_many, start_reads

CAPS = f"{paths.CONSOLE}/caps"
IN_FLIGHT = frozenset(JOB_WORKING)  # Estimating .. Notify
# A cap's markers are one folder's children: well within what a client lists in 1 MiB.
LIMIT_MAX = 10_000
# The most markers a resume (``count_entry``) leaves in one count: past it the count is pruned
# first, and a job resumed with it still full is not counted (see ``count_entry``). Twice the
# largest limit, so the gate is shut however it is set; 20,000 names list in 340 KB, far below
# the 1 MiB a client reads (60,717 markers would not list at all, and verify could not run).
MARKERS_MAX = 2 * LIMIT_MAX
CLEAR_CHUNK = 1_000  # marker deletes per multi when a cap is removed
RESERVE_TRIES = 8  # lost races on the count's version before a claim gives up for now
RECHECK = 1.0  # s a collection found at its cap stays so before it is verified again
WAITING_MAX = 200_000  # jobs remembered as waiting for room, per consumer loop


def cap_path(profile: str) -> str:
    return f"{CAPS}/{paths.profile(profile)}"


def flight_path(profile: str) -> str:
    return f"{cap_path(profile)}/flight"


def marker_path(profile: str, jid: str) -> str:
    return f"{flight_path(profile)}/{paths.jid(jid)}"


def check_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIMIT_MAX:
        raise ValueError(f"a cap must be an integer 1..{LIMIT_MAX}, got {limit!r}")
    return limit


@dataclass(frozen=True)
class Cap:
    profile: str
    limit: int
    counted: int  # markers: jobs counted in flight
    by: str = ""
    reason: str = ""
    at: datetime | None = None

    @property
    def full(self) -> bool:
        return self.counted >= self.limit


def _decode_cap(profile: str, data: bytes) -> dict[str, Any]:
    raw = decode_json(cap_path(profile), data)
    limit = raw.get("limit")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise MalformedNode(cap_path(profile), f"limit is not a whole number: {limit!r}")
    return raw


def cap_set(zk: KazooClient, profile: str, limit: int, *, by: str = "", reason: str = "") -> int:
    """Set (or change) a collection's cap; the previous limit, 0 when it had none."""
    check_limit(limit)
    data = encode_json({"limit": limit, "by": by, "at": now_stamp(), "reason": reason})
    zk.ensure_path(CAPS)
    path = cap_path(profile)
    while True:
        found = read_many(zk, [path])[path]
        if found is None:
            txn = zk.transaction()
            txn.create(path, data)
            txn.create(flight_path(profile), b"")
            results = txn.commit()
            if not any(isinstance(r, NodeExistsError) for r in results):
                _raise_first(results)
                return 0
            continue  # set by someone else meanwhile: change theirs
        try:
            old = int(_decode_cap(profile, found[0])["limit"])
        except MalformedNode:
            old = 0
        try:
            zk.set(path, data, version=found[1].version)
        except (BadVersionError, NoNodeError):
            continue
        if zk.exists(flight_path(profile)) is None:
            with contextlib.suppress(NodeExistsError):
                zk.create(flight_path(profile), b"")
        return old


def cap_clear(zk: KazooClient, profile: str) -> int:
    """Remove a collection's cap and its count; the limit it had, 0 when it had none. The
    markers go first, in multis of ``CLEAR_CHUNK`` (the count only falls meanwhile: the cap is
    going anyway), then the folder and the cap node together."""
    path, flight = cap_path(profile), flight_path(profile)
    for _attempt in range(RESERVE_TRIES):
        found = read_many(zk, [path])[path]
        if found is None:
            return 0
        try:
            old = int(_decode_cap(profile, found[0])["limit"])
        except MalformedNode:
            old = 0
        markers = children(zk, flight)
        for start in range(0, len(markers), CLEAR_CHUNK):
            txn = zk.transaction()
            for jid in markers[start : start + CLEAR_CHUNK]:
                txn.delete(f"{flight}/{jid}")
            txn.commit()  # a marker verify deleted meanwhile fails its chunk: looked at again
        txn = zk.transaction()
        if zk.exists(flight) is not None:
            txn.delete(flight)
        txn.delete(path, version=found[1].version)
        results = txn.commit()
        if not any(isinstance(r, Exception) for r in results):
            return old
        # A marker created, or the cap changed, meanwhile: look again.
    raise NotEmptyError(f"{path}: its count kept changing; try again")


def _cap(name: str, node: Any, flight: Any) -> Cap | None:
    """A cap from its node's and its count folder's reads; None when absent or malformed."""
    if node is None:
        return None
    try:
        raw = _decode_cap(name, node[0])
    except MalformedNode:
        return None
    return Cap(
        profile=name,
        limit=int(raw["limit"]),
        counted=flight[1].numChildren if flight is not None else 0,
        by=str(raw.get("by", "")),
        reason=str(raw.get("reason", "")),
        at=parse_stamp(raw.get("at")),
    )


def caps(zk: KazooClient) -> dict[str, Cap]:
    """Every cap with its count, in two round trips (a malformed cap node is left out)."""
    try:
        profiles = [p for p in zk.get_children(CAPS) if paths.PROFILE_RE.fullmatch(p)]
    except NoNodeError:
        return {}
    return caps_of(zk, profiles)


def cap_of(zk: KazooClient, profile: str) -> Cap | None:
    return caps_of(zk, [profile]).get(profile)


def caps_of(zk: KazooClient, profiles: Iterable[str]) -> dict[str, Cap]:
    """The caps of the named collections (those that have one), in one round trip."""
    names = sorted({paths.profile(p) for p in profiles})
    reads = read_many(zk, [p for name in names for p in (cap_path(name), flight_path(name))])
    found = {}
    for name in names:
        cap = _cap(name, reads[cap_path(name)], reads[flight_path(name)])
        if cap is not None:
            found[name] = cap
    return found


def _raise_first(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            raise result


def reserve(zk: KazooClient, profile: str, jid: str) -> bool:
    """Count ``jid`` in flight for its capped collection before it moves there: True when it is
    counted (now, or already: a marker left by an earlier attempt), or the collection has no
    cap; False when the collection is at its cap (or the count kept changing under it)."""
    cap, flight, marker = cap_path(profile), flight_path(profile), marker_path(profile, jid)
    for _attempt in range(RESERVE_TRIES):
        # In this order: a count read after the versions can only be newer than they are, so
        # a multi written against stale versions fails instead of passing on a stale count.
        reads = read_many(zk, [cap, flight, marker])
        node, folder = reads[cap], reads[flight]
        if node is None or folder is None:
            return True  # no cap (or it is being removed)
        if reads[marker] is not None:
            return True
        try:
            limit = int(_decode_cap(profile, node[0])["limit"])
        except MalformedNode:
            return True  # an unreadable cap limits nothing; the caps page shows it
        if folder[1].numChildren >= limit:
            return False
        txn = zk.transaction()
        txn.check(cap, node[1].version)
        txn.set_data(flight, b"", version=folder[1].version)
        txn.create(marker, b"")
        results = txn.commit()
        if not any(isinstance(r, Exception) for r in results):
            return True
        if isinstance(results[2], NodeExistsError):
            return True
    return False


def count_entry(zk: KazooClient, profile: str, jid: str) -> bool:
    """Count a job that entered flight without ``reserve`` (an operator's resume), over the cap
    if need be: the operator's move stands, and the collection's Pending jobs wait for it.

    Markers past the limit are pruned here, where they are written: with ``MARKERS_MAX``
    markers already there, ``verify`` first drops those of jobs that have left flight (nothing
    else would while no Pending job of the collection meets its cap), and when they are all
    still in flight the job is not counted: the count stays at ``MARKERS_MAX``, above any
    limit, so the gate is shut all the same, and the folder stays listable. True when the job
    is counted."""
    flight, most = flight_path(profile), MARKERS_MAX
    folder = zk.exists(flight)
    if folder is None:
        return False  # no cap
    if folder.numChildren >= most:
        verify(zk, profile)
        folder = zk.exists(flight)
        if folder is None or folder.numChildren >= most:
            return False
    try:
        zk.create(marker_path(profile, jid), b"")
    except NodeExistsError:
        return True  # counted already
    except NoNodeError:
        return False  # the cap removed meanwhile
    return True


def _stale(state: str | None, locked: bool) -> bool:
    """Whether a marked job with this status no longer counts: gone or malformed (None), out of
    flight, or Pending with nobody working on it (a reservation whose move never came)."""
    if state is None:
        return True
    if state in IN_FLIGHT:
        return False
    return not (state == JobState.PENDING and locked)


def verify(zk: KazooClient, profile: str) -> int:
    """Delete the markers of jobs that no longer count (``_stale``); how many went. Each in a
    multi checked against the status version read (a Pending job's also against its lock)."""
    flight = flight_path(profile)
    try:
        jids = [j for j in zk.get_children(flight) if paths.JID_RE.fullmatch(j)]
    except NoNodeError:
        return 0
    reads = read_many(
        zk, [p for j in jids for p in (paths.job_node(j, "status"), paths.job_node(j, "lock"))]
    )
    sent = []
    for jid in jids:
        status = reads[paths.job_node(jid, "status")]
        state: str | None = None
        if status is not None:
            try:
                state = str(decode_json(paths.job_node(jid, "status"), status[0]).get("status"))
            except MalformedNode:
                state = None
        locked = reads[paths.job_node(jid, "lock")] is not None
        if not _stale(state, locked):
            continue
        txn = zk.transaction()
        if status is not None:
            txn.check(paths.job_node(jid, "status"), status[1].version)
            if state == JobState.PENDING:
                lock = paths.job_node(jid, "lock")
                txn.create(lock, b"", ephemeral=True)
                txn.delete(lock)
        txn.delete(f"{flight}/{jid}")
        sent.append(txn.commit_async())
    removed = 0
    for answer in sent:
        try:
            results = answer.get()
        except NoNodeError:
            continue
        if not any(isinstance(r, Exception) for r in results):
            removed += 1
    return removed


def recount(zk: KazooClient, profile: str, in_flight: Iterable[str]) -> tuple[int, int]:
    """Bring the count in line: add markers for the jobs of ``in_flight`` (the collection's jobs
    the caller found in flight) that are still there and not counted, then ``verify``. Returns
    (added, removed). A marker is added in a multi checked against the status version that
    showed the job in flight, so a job that left meanwhile is not counted."""
    flight = flight_path(profile)
    if zk.exists(flight) is None:
        return 0, 0
    jids = sorted({paths.jid(j) for j in in_flight})
    reads = collect_reads(
        start_reads(
            zk, [p for j in jids for p in (paths.job_node(j, "status"), marker_path(profile, j))]
        )
    )
    sent = []
    for jid in jids:
        status = reads[paths.job_node(jid, "status")]
        if status is None or reads[marker_path(profile, jid)] is not None:
            continue
        try:
            state = decode_json(paths.job_node(jid, "status"), status[0]).get("status")
        except MalformedNode:
            continue
        if state not in IN_FLIGHT:
            continue
        txn = zk.transaction()
        txn.check(paths.job_node(jid, "status"), status[1].version)
        txn.create(marker_path(profile, jid), b"")
        sent.append(txn.commit_async())
    added = 0
    for answer in sent:
        results = answer.get()
        if not any(isinstance(r, Exception) for r in results):
            added += 1
    return added, verify(zk, profile)


class CapGate:
    """One Pending consumer loop's view of the caps: which collections have one (listed again
    at most every ``RECHECK`` s), which are at it, and which jobs wait for room (remembered by
    job ID, so the loop passes them over without claiming them again).

    ``admit`` is the cheap check before a job is worked on (no request unless its collection
    has a cap and was not found full lately); ``enter`` is the exact one, right before the move
    into flight; ``waits`` is what the claim's listing asks of each entry before claiming it.
    The batched loop asks ``admit`` and ``waits`` in its own thread and ``enter`` in its step
    thread: what is remembered changes under a lock, never held across a request.
    """

    def __init__(self, zk: KazooClient, *, recheck: float = RECHECK) -> None:
        self.zk = zk
        self.recheck = recheck
        self._lock = threading.Lock()
        self._capped: frozenset[str] = frozenset()
        self._listed_at = float("-inf")
        self._full_until: dict[str, float] = {}
        self._waiting: dict[str, str] = {}  # jid -> profile

    def capped(self, profile: str) -> bool:
        if time.monotonic() - self._listed_at >= self.recheck:
            try:
                found = frozenset(self.zk.get_children(CAPS))
            except NoNodeError:
                found = frozenset()
            with self._lock:
                self._capped = found
                self._listed_at = time.monotonic()
                for gone in [p for p in self._full_until if p not in found]:
                    del self._full_until[gone]
        return profile in self._capped

    def _found(self, profile: str, full: bool) -> bool:
        with self._lock:
            if full:
                self._full_until[profile] = time.monotonic() + self.recheck
            else:
                self._full_until.pop(profile, None)
        return full

    def full(self, profile: str) -> bool:
        """Whether ``profile`` is at its cap: as found within the last ``RECHECK`` s, else
        verified and counted now."""
        until = self._full_until.get(profile)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        if not self.capped(profile):
            return self._found(profile, False)
        verify(self.zk, profile)
        cap = cap_of(self.zk, profile)
        return self._found(profile, cap is not None and cap.full)

    def waits(self, jid: str) -> bool:
        """Whether to pass ``jid`` over unclaimed: its collection was at its cap when it was
        last seen and still is."""
        profile = self._waiting.get(jid)
        if profile is None:
            return False
        if self.full(profile):
            return True
        with self._lock:
            self._waiting.pop(jid, None)
        return False

    def _wait(self, profile: str, jid: str) -> None:
        with self._lock:
            if len(self._waiting) >= WAITING_MAX:
                self._waiting.clear()  # forgotten ones are claimed once more, then remembered
            self._waiting[jid] = profile
            self._full_until.setdefault(profile, time.monotonic() + self.recheck)

    def admit(self, profile: str, jid: str) -> bool:
        """The cheap check (no request for a collection without a cap, one read for one with
        a cap not found full lately): False when the collection is at its cap."""
        if not profile or not self.capped(profile):
            return True
        if not self.full(profile):
            cap = cap_of(self.zk, profile)
            if cap is None or not cap.full:
                return True
        self._wait(profile, jid)
        return False

    def enter(self, profile: str, jid: str) -> bool:
        """Count the job in flight (``reserve``), verifying the count once when it is at the
        cap; False (and the job remembered as waiting) when there is no room."""
        if not profile or not self.capped(profile):
            return True
        if reserve(self.zk, profile, jid):
            return True
        verify(self.zk, profile)
        if reserve(self.zk, profile, jid):
            return True
        self._found(profile, True)
        self._wait(profile, jid)
        return False
