"""The moves that hold and release, and set priorities and caps: queue, node, service and
collection holds (with their reason, author and end), releasing what a hold kept, a job's
priority and a collection's cap on jobs in flight. Like every move (``services``), each takes
keyword-only arguments, works on the process's ZooKeeper client and answers an ``Outcome``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

from queues.core.clock import clock_text
from queues.core.states import INGEST_HELD_MESSAGE, BatchState, JobState
from queues.services.moves import Outcome, job_of
from queues.zk import packed
from queues.zk import paths as zpaths
from queues.zk.batches import batch_ids, batch_load, batch_states, batch_transition
from queues.zk.client import client
from queues.zk.errors import (
    Conflict,
    DomainError,
    ItemLocked,
    NotFound,
    QueueHeld,
    StillLoading,
    StoppedPartway,
    is_connection_error,
)
from queues.zk.jobs import index_entries, job_transition, jobs_load
from queues.zk.locks import (
    collection_held,
    collection_hold_clear,
    collection_hold_set,
    queue_held,
    queue_hold_clear,
    queue_hold_set,
)
from queues.zk.maintenance import (
    check_window_end,
    hold_record_clear,
    hold_record_set,
    node_hold_clear,
    node_hold_set,
    node_number,
    service_hold_clear,
    service_hold_set,
    service_key,
    window_clear,
    window_set,
)
from queues.zk.records import Batch, Broken
from queues.zk.servertime import server_moment

# A hold's reason and author as a window or a node hold keeps them (the forms allow as much).
HOLD_TEXT_MAX = 2000


def _check_hold(until: datetime | None, reason: str, by: str) -> None:
    """Everything a hold is asked with, checked before anything is written: a refused hold
    places nothing (no hold without its end, no end without its hold). An end is judged past
    by the ZooKeeper server's clock, the one the maintenance daemon releases the hold by
    (``servertime``): a web host whose clock is off refuses no end that is ahead, and takes
    none that is past."""
    check_window_end(
        until, lambda: server_moment(client()), show=lambda moment: clock_text(moment, "minutes")
    )
    for name, text in (("reason", reason), ("by", by)):
        if not isinstance(text, str) or len(text) > HOLD_TEXT_MAX:
            raise ValueError(f"a hold's {name} must be text of at most {HOLD_TEXT_MAX} characters")


def queue_hold(
    *, name: str, until: datetime | None = None, reason: str = "", by: str = ""
) -> Outcome:
    """Hold a queue; with ``until``, a maintenance window: released by itself at that time."""
    marker = zpaths.queue_hold(name)
    _check_hold(until, reason, by)
    zk = client()
    changed = queue_hold_set(zk, marker)
    hold_record_set(zk, "queue", name, by=by, reason=reason)
    _window(zk, "queue", name, until, reason, by)
    return _held("queue", name, changed, until)


def _window(zk: Any, kind: str, name: str, until: datetime | None, reason: str, by: str) -> None:
    """Give a hold just made its end, or take an earlier end away (held again without one);
    ``until`` was checked (``_check_hold``) before the hold was placed."""
    if until is None:
        window_clear(zk, kind, name)
        return
    window_set(zk, kind, name, until=until, reason=reason, by=by)


def _until_words(until: datetime | None) -> str:
    return f"until {clock_text(until, 'minutes')}" if until else ""


# The words of a hold or a release that found the item as asked (a form posted twice): nothing
# moved, which the page's message and the audit entry say rather than a bare "held -> held".
ALREADY_HELD = "already held"
NOT_HELD = "was not held"


def _held(kind: str, name: str, changed: bool, until: datetime | None = None) -> Outcome:
    """A hold's outcome; one placed again keeps its hold and notes its reason and end anew."""
    words = [w for w in ("" if changed else ALREADY_HELD, _until_words(until)) if w]
    return Outcome(kind, name, "released" if changed else "held", "held", "; ".join(words))


def _released(kind: str, name: str, changed: bool) -> Outcome:
    return Outcome(
        kind, name, "held" if changed else "released", "released", "" if changed else NOT_HELD
    )


def node_hold(
    *, node: str, until: datetime | None = None, reason: str = "", by: str = ""
) -> Outcome:
    """Hold a storage node: jobs bound for it wait before Storing and Recording."""
    number = node_number(node)
    _check_hold(until, reason, by)
    zk = client()
    changed = node_hold_set(zk, number, by=by, reason=reason)
    _window(zk, "node", str(number), until, reason, by)
    return _held("node", str(number), changed, until)


def node_release(*, node: str) -> Outcome:
    zk = client()
    number = node_number(node)
    changed = node_hold_clear(zk, number)
    window_clear(zk, "node", str(number))
    return _released("node", str(number), changed)


def service_hold(
    *, service: str, reason: str = "", by: str = "", until: datetime | None = None
) -> Outcome:
    """Hold a service outside by hand (opening its breaker): the jobs whose step needs it wait
    before that step. It has no end of its own: a hold placed by hand is released by hand (the
    breaker's probe releases only the breaker's own holds)."""
    key = service_key(service)
    if until is not None:
        raise ValueError("a service's hold has no end: release it by hand")
    _check_hold(None, reason, by)
    changed = service_hold_set(client(), key, by=by, reason=reason)
    return _held("service", key, changed)


def service_release(*, service: str) -> Outcome:
    """Release a service's hold, the breaker's or an operator's (closing its breaker)."""
    key = service_key(service)
    changed = service_hold_clear(client(), key)
    return _released("service", key, changed)


def queue_release(*, name: str, release_held: bool = False) -> list[Outcome]:
    """Clear a queue hold; for the ingest queue with ``release_held``, also release the batches
    batch-pending parked because the queue was held (their collections not held)."""
    zk = client()
    changed = queue_hold_clear(zk, zpaths.queue_hold(name))
    window_clear(zk, "queue", name)
    hold_record_clear(zk, "queue", name)
    outcomes = [_released("queue", name, changed)]
    if release_held and name == "ingest":
        _gather(f"release of queue {name}", outcomes, _ingest_parked())
    return outcomes


def ingest_release_parked() -> list[Outcome]:
    """Release the batches Batch Pending parked while the ingest queue was held, its hold
    already gone (a maintenance window's release finished by another daemon): refused while
    the queue is held again, whose hold they then wait for."""
    if queue_held(client(), "ingest"):
        raise QueueHeld("the ingest queue is held again: its parked batches wait for its release")
    return _gather("release of the ingest queue's parked batches", [], _ingest_parked())


def _ingest_parked() -> Iterator[Outcome]:
    return _release_batches(lambda b: b.status.message == INGEST_HELD_MESSAGE)


# The detail of a held job or batch a release passed over because a session (Merritt's ingest,
# a consumer) holds its lock: it stays Held, and the same release again takes it once free.
SESSION_HOLDS = "left alone: a session holds it"


def _gather(what: str, outcomes: list[Outcome], made: Iterable[Outcome]) -> list[Outcome]:
    """``outcomes`` (what the release did so far: its hold cleared) with those ``made`` yields
    one by one. A release of many items takes one transaction each: when it stops after its
    first move (ZooKeeper lost, an item that cannot be read), StoppedPartway names the moves
    made, so the door answers and audits them; the same release again finishes it."""
    try:
        for outcome in made:
            outcomes.append(outcome)
    except Exception as exc:
        moved = [o for o in outcomes if o.before != o.after]
        if not moved or not (isinstance(exc, DomainError) or is_connection_error(exc)):
            raise  # nothing moved yet (or a fault of the program: not a refusal)
        said = "; ".join(f"{o.kind} {o.id} {o.before} -> {o.after}" for o in moved[:20])
        more = f" and {len(moved) - 20} more" if len(moved) > 20 else ""
        raise StoppedPartway(
            f"{what} stopped part-way ({exc}): {len(moved)} moves made ({said}{more}); "
            "the held items not yet reached are still Held: release again to finish",
            done=tuple(o.id for o in moved),
            cause=exc,
        ) from exc
    return outcomes


def _release_batches(parked: Callable[[Batch], bool]) -> Iterator[Outcome]:
    """Release the Held batches ``parked`` picks whose collection is not held, one outcome
    each as it goes (one a session holds is left Held, and said so)."""
    zk = client()
    for bid, state in batch_states(zk, batch_ids(zk)).items():
        if state != BatchState.HELD:
            continue
        try:
            batch = batch_load(zk, bid)
        except NotFound:
            continue
        if not parked(batch) or collection_held(zk, batch.profile):
            continue
        try:
            batch_transition(zk, batch, BatchState.PENDING, admin=True)
        except ItemLocked:
            yield Outcome("batch", bid, BatchState.HELD, BatchState.HELD, SESSION_HOLDS)
            continue
        except (Conflict, NotFound):
            continue  # moved or removed meanwhile: no longer Held, nothing to release
        yield Outcome("batch", bid, BatchState.HELD, BatchState.PENDING)


def collection_hold(
    *,
    profile: str,
    until: datetime | None = None,
    reason: str = "",
    by: str = "",
    keep_record: bool = False,
) -> Outcome:
    """Hold a collection; who and why are noted beside the hold (with ``keep_record``, only
    when this call placed it: the alert fuse finding it held, by an operator or by Merritt's
    own tools, claims nothing)."""
    checked = zpaths.profile(profile)
    _check_hold(until, reason, by)
    zk = client()
    changed = collection_hold_set(zk, checked)
    if changed or not keep_record:
        hold_record_set(zk, "collection", checked, by=by, reason=reason)
    _window(zk, "collection", profile, until, reason, by)
    return _held("collection", profile, changed, until)


def collection_release(*, profile: str, release_jobs: bool = False) -> list[Outcome]:
    """Clear a collection hold; with ``release_jobs`` also release its held jobs and batches."""
    changed = collection_hold_clear(client(), zpaths.profile(profile))
    window_clear(client(), "collection", profile)
    hold_record_clear(client(), "collection", profile)
    outcomes = [_released("collection", profile, changed)]
    if release_jobs:
        _check_released(profile)
        _gather(f"release of collection {profile}", outcomes, _release_held(profile))
    return outcomes


def collection_release_held(*, profile: str) -> list[Outcome]:
    """Release every Held job and Held batch of a collection (after its hold was cleared).

    One outcome per held item: released (Held -> Pending), or left Held because a session
    holds it (``SESSION_HOLDS``). Stopped after its first move, StoppedPartway names the moves
    made; the same release again finishes it."""
    _check_released(profile)
    return _gather(f"release of collection {profile}'s held items", [], _release_held(profile))


def _check_released(profile: str) -> None:
    zpaths.profile(profile)
    if collection_held(client(), profile):
        raise QueueHeld(f"collection {profile} is still held; release the collection first")


def _release_held(profile: str) -> Iterator[Outcome]:
    zk = client()
    held = [jid for _p, jid in index_entries(zk, JobState.HELD)]
    for job in jobs_load(zk, held):
        if isinstance(job, Broken) or job.profile != profile or job.state != JobState.HELD:
            continue
        try:
            job_transition(zk, job, JobState.PENDING, admin=True)
        except ItemLocked:
            yield Outcome("job", job.jid, JobState.HELD, JobState.HELD, SESSION_HOLDS)
            continue
        except (Conflict, NotFound):
            continue  # moved or removed meanwhile: no longer Held, nothing to release
        yield Outcome("job", job.jid, JobState.HELD, JobState.PENDING)
    yield from _release_batches(lambda b: b.profile == profile)


def job_priority_set(*, jid: str, priority: int, expect_version: int | None = None) -> Outcome:
    """A waiting (Pending or Held) job's priority, its index entry renamed to match."""
    from queues.zk.priorities import priority_set_waiting

    zk, job = job_of(jid, expect_version)
    changed = priority_set_waiting(zk, job, priority)
    detail = "" if changed.priority != job.priority else "unchanged"
    return Outcome("job", jid, f"priority {job.priority}", f"priority {priority}", detail)


class WaitingJobs(Sequence[str]):
    """A collection's waiting jobs in run order (priority, then job number), merged when asked
    from the read index's entries of each waiting state (each already in that order): their
    number, the first few and the count per priority cost no pass over the jobs, so the
    collection's page is the same work at 100 waiting jobs as at 100,000; the whole list is
    made once, when a priority change goes through them."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self._parts = [p for p in parts if len(p)]  # index Entries in run order
        self._all: list[str] | None = None

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def _first(self, count: int) -> list[str]:
        import heapq
        from itertools import islice

        jid = packed.EMPTY.jid
        return [jid(key) for key in islice(heapq.merge(*(p.keys for p in self._parts)), count)]

    def _list(self) -> list[str]:
        if self._all is None:
            self._all = self._first(len(self))
        return self._all

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if (
            isinstance(i, slice)
            and self._all is None
            and not i.start
            and i.step in (None, 1)
            and i.stop is not None
            and 0 <= i.stop < len(self)
        ):
            return self._first(i.stop)
        return self._list()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())

    def by_priority(self) -> dict[int, int]:
        """How many wait at each priority, lowest first: two look-ups per priority present in
        each state's entries (sorted by priority), none per job."""
        from bisect import bisect_left

        shift = packed.NUM_BITS
        found: dict[int, int] = {}
        for part in self._parts:
            keys, start = part.keys, 0
            while start < len(keys):
                priority = keys[start] >> shift
                end = bisect_left(keys, (priority + 1) << shift, start)
                found[priority] = found.get(priority, 0) + end - start
                start = end
        return dict(sorted(found.items()))


@dataclass(frozen=True)
class PriorityScope:
    """The waiting jobs a batch's or a collection's priority change would touch, in run order,
    and whether the read index was still filling (then the list may be short)."""

    kind: str  # "batch" | "collection"
    name: str
    jids: Sequence[str]
    by_priority: dict[int, int]
    loading: bool


def priority_scope(*, kind: str, name: str) -> PriorityScope:
    """The waiting jobs of batch ``name`` (kind "batch") or collection ``name`` ("collection")."""
    from queues.zk import index as zindex
    from queues.zk.priorities import WAITING, batch_waiting

    zk = client()
    index = zindex.for_client(zk)
    if kind == "collection":
        profile = zpaths.profile(name)
        waiting = WaitingJobs(
            [index.job_entries_matching(s, profile=profile) for s in sorted(WAITING)]
        )
        return PriorityScope(kind, name, waiting, waiting.by_priority(), index.filling)
    if kind != "batch":
        raise ValueError(f"a priority is changed for a batch or a collection, not a {kind!r}")
    entries = sorted(batch_waiting(zk, zpaths.bid(name), index.job_states_of))
    by_priority: dict[int, int] = {}
    for priority, _jid in entries:
        by_priority[priority] = by_priority.get(priority, 0) + 1
    return PriorityScope(kind, name, [jid for _p, jid in entries], by_priority, index.filling)


def _in_flight_of(profile: str) -> list[str]:
    """The collection's jobs in flight, from the read index; StillLoading while it fills after a
    start (it would name only the jobs read so far, and the count would come out short)."""
    from queues.zk import index as zindex
    from queues.zk.caps import IN_FLIGHT

    index = zindex.for_client(client())
    if index.filling:
        raise StillLoading.about(f"the jobs of collection {profile} in flight")
    return [
        jid
        for s in sorted(IN_FLIGHT)
        for jid in index.job_entries_matching(s, profile=profile).jids()
    ]


def collection_cap_set(*, profile: str, limit: int, reason: str = "", by: str = "") -> Outcome:
    """Cap a collection's jobs in flight (Estimating to Notify) at ``limit``, and count the
    jobs in flight now (queues/zk/caps.py)."""
    from queues.zk import caps

    zk = client()
    in_flight = _in_flight_of(profile)  # first: nothing is written while the index fills
    old = caps.cap_set(zk, zpaths.profile(profile), caps.check_limit(limit), by=by, reason=reason)
    added, _removed = caps.recount(zk, profile, in_flight)
    cap = caps.cap_of(zk, profile)
    counted = cap.counted if cap is not None else added
    return Outcome(
        "collection",
        profile,
        f"cap {old}" if old else "no cap",
        f"cap {limit}",
        _in_flight_words(counted, limit),
    )


def _in_flight_words(in_flight: int, limit: int) -> str:
    """The cap's one figure in plain words, as the pages say it
    (``queues.console.waits.CapFigure``): right after a count the cap's own count and the jobs in
    flight are the same number."""
    text = f"{in_flight} of {limit} in flight now"
    if in_flight > limit:
        return f"{text}, over its cap"
    return f"{text}, at its cap" if in_flight == limit else text


def collection_cap_clear(*, profile: str) -> Outcome:
    from queues.zk import caps

    old = caps.cap_clear(client(), zpaths.profile(profile))
    return Outcome("collection", profile, f"cap {old}" if old else "no cap", "no cap")


def collection_cap_recount(*, profile: str) -> Outcome:
    """Count again: jobs in flight without a marker (resumed, moved by Merritt's consumers) are
    added, markers of jobs gone from flight removed."""
    from queues.zk import caps

    zk = client()
    added, removed = caps.recount(zk, zpaths.profile(profile), _in_flight_of(profile))
    cap = caps.cap_of(zk, profile)
    if cap is None:
        raise NotFound(f"collection {profile} has no cap")
    return Outcome(
        "collection",
        profile,
        f"cap {cap.limit}",
        f"cap {cap.limit}",
        _in_flight_words(cap.counted, cap.limit)
        + (f" (counted again: {added} added, {removed} gone)" if added or removed else ""),
    )


__all__ = [
    "SESSION_HOLDS",
    "PriorityScope",
    "collection_cap_clear",
    "collection_cap_recount",
    "collection_cap_set",
    "collection_hold",
    "collection_release",
    "collection_release_held",
    "job_priority_set",
    "node_hold",
    "node_release",
    "priority_scope",
    "queue_hold",
    "queue_release",
]
