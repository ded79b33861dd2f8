"""Stuck jobs: far longer in their state, or under one consumer's lock, than is usual there.

"Usual" is the 95th percentile the step history gives for the state (``queues/operator/history.py``,
the last 7 days): a job is stuck when its time in the state is past ``MRT_STUCK_FACTOR`` (3)
times the p95 of waiting plus working there, or its lock is older than that factor times the
p95 of the step's own duration, and never before ``MRT_STUCK_MIN_SECONDS`` (300). A state with
fewer than ``history.MIN_RECORDS`` records uses ``MRT_STUCK_SECONDS`` (3600) for both.

What it costs: the state folders' listings come from the read index; the time a job entered
its state is its index entry's creation time, read once per entry and remembered while the
entry exists (an entry is made anew at every move), as an array of times beside the listing's
own array of entries. A lock is read only where it decides: for the count (the overview card,
/metrics) only for jobs in their state longer than the lock threshold and not yet longer than
the state's; for the list (``find_stuck``: the stuck page and the job list's filter) for every
job past either. Answers are kept ``CACHE_SECONDS``; the overview card and /metrics never count
in the request once there is a count: past that time they get the last one while a thread of
its own counts again (at 1,000,000 jobs a count walks about 290,000 working entries).

The stuck page never walks the entries either: each count also keeps every state's entries
oldest first (``_Oldest``), and a page takes the oldest still listed from those, reading the
locks of those it judges only. Before the first count (after a start, while the read index
fills) the page says what is still loading instead of waiting for it.

The job list's filters use the same times: "stuck only" (``stuck_keys``) picks the entries past
a state's threshold in C; "in state at least" (``entered_before``) orders a state's entries by
the time they entered it once per listing (positions and times: 16 bytes an entry, beside the
times' own 8, for each state the filter was asked of, Completed too), so the entries older
than the cut are a prefix, put in run order in C and kept until the prefix changes. Time in a
state is its entry's age: a priority change (the entry is made anew) starts it again, a retry
written on the job's status does not.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import compress, islice
from operator import and_
from typing import Any

from django.conf import settings

from queues.core.states import JOB_STEPS
from queues.operator import history
from queues.zk import consumers as zconsumers
from queues.zk import index as zindex
from queues.zk import packed
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.nodes import exists_many
from queues.zk.servertime import server_now

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 3600.0
DEFAULT_FACTOR = 3.0
DEFAULT_MIN_SECONDS = 300.0
CACHE_SECONDS = 15.0
READ_CHUNK = 1000
CARRY_BLOCK = 8192  # entries sorted in one go (see _ranked)
# How far ahead of a count the stuck page's order reaches (``_Oldest``): a page looked at
# recounts every CACHE_SECONDS, so an order is normally far younger than this.
HORIZON = 600.0
# Between two chunks of entry times read in the background: page requests sharing the
# connection and the interpreter go first (as the read index's fill does).
READ_PAUSE = 0.004
# The states a consumer works in (Completed is final; Held and Failed wait for an operator).
STATES = JOB_STEPS[:-1]

_lock = threading.Lock()
_owner: list[Any] = [None]  # the client the remembered times were read through
_cached: tuple[float, Any, list[StuckJob]] | None = None  # the list (find_stuck)
_counted: tuple[float, Any, dict[str, int]] | None = None  # the counts per state
_counting = threading.Lock()  # one count at a time
_recount: list[threading.Thread | None] = [None]  # the background recount, while it runs
# Set while prime() counts in the background (after the read index's fill at start): the first
# count reads the creation time of every entry in the working states, seconds at a large queue.
_priming = threading.Event()


class StillCounting(Exception):
    """The overview card and /metrics do not wait for a first count made in the background."""


@dataclass(frozen=True)
class Threshold:
    state: str
    in_state: float  # seconds
    lock: float
    source: str  # "history" | "setting"


@dataclass(frozen=True)
class StuckJob:
    jid: str
    state: str
    in_state: float  # seconds in the state
    lock_age: float | None  # seconds its lock has been held, None: not locked
    threshold: Threshold
    why: str


@dataclass(frozen=True)
class _Times:
    """Creation times (s since the epoch) of a state's entries, in the order of ``keys``, the
    read index's array of that listing (0.0: not read, the entry was gone when asked)."""

    keys: array[int]
    ctimes: array[float]
    whole: bool = False  # every entry's time was read: none to look for again


_times: dict[str, _Times] = {}


@dataclass(frozen=True)
class _Oldest:
    """A state's entries that entered it before ``horizon``, oldest first, made by a count
    from the listing ``source``; entries whose time was not read are left out. Only those
    can be on the stuck page until the next count (``HORIZON``): in a queue that flows, a
    few, not every working entry."""

    source: array[int]
    keys: array[int]  # run keys (``packed.Entries``), oldest first
    ctimes: array[float]  # ascending
    horizon: float


_oldest: dict[str, _Oldest] = {}
_oldest_at: list[float] = [0.0]  # time.monotonic() of the count that made ``_oldest``
_reading: list[str] = [""]  # what a count is reading now (the page says it while it waits)


def _setting(name: str, default: float) -> float:
    # Tests and callers may leave a setting out of a trimmed settings object: the default then.
    return float(getattr(settings, name, default))


def default_limit() -> float:
    return _setting("MRT_STUCK_SECONDS", DEFAULT_SECONDS)


def limit_from(p95: float | None, n: int, default: float) -> float:
    """``MRT_STUCK_FACTOR`` times a p95 (at least ``MRT_STUCK_MIN_SECONDS``), or ``default``
    when the history has too few records for it."""
    if p95 is None or n < history.MIN_RECORDS:
        return default
    factor = _setting("MRT_STUCK_FACTOR", DEFAULT_FACTOR)
    return max(_setting("MRT_STUCK_MIN_SECONDS", DEFAULT_MIN_SECONDS), factor * p95)


def thresholds() -> dict[str, Threshold]:
    default = default_limit()
    try:
        usual = history.usual_times()
    except Exception:  # no table yet, database away: the setting still works
        usual = {}
    found: dict[str, Threshold] = {}
    state: str
    for state in STATES:
        u = usual.get(state)
        if u is not None and u.n >= history.MIN_RECORDS and u.step_p95 is not None:
            total = u.total_p95 if u.total_p95 is not None else u.step_p95
            found[state] = Threshold(
                state,
                limit_from(total, u.n, default),
                limit_from(u.step_p95, u.n, default),
                "history",
            )
        else:
            found[state] = Threshold(state, default, default, "setting")
    return found


def _entry_times(
    zk: Any, idx: zindex.ReadIndex, state: str, *, pause: float = 0.0
) -> tuple[packed.Entries, array[float]]:
    """A state's entries (run order) and the creation time of each, read only for entries not
    in the last listing the times were kept for."""
    entries = idx.job_entries(state)
    keys = entries.keys
    with _lock:
        if _owner[0] is not zk:  # another client (another ensemble or chroot): start again
            _times.clear()
            _oldest.clear()
            _by_time.clear()
            _seen.clear()
            _owner[0] = zk
        known = _times.get(state)
    if known is not None and known.keys is keys:
        if known.whole:  # nothing to read: not even a pass over the times for a 0.0
            return entries, known.ctimes
        ctimes = known.ctimes
    elif known is not None:  # the folder changed: keep the times of the entries still there
        ctimes = packed.carried(known.keys, known.ctimes, keys, 0.0)
    else:
        ctimes = array("d", [0.0]) * len(keys)
    missing = packed.positions_of(ctimes, 0.0)
    if missing:
        ctimes = array("d", ctimes)  # a copy: a reader of the kept one never sees it half-read
        folder = zpaths.job_state_folder(state)
        for start in range(0, len(missing), READ_CHUNK):
            _reading[0] = f"{state}: {start:,} of {len(missing):,} entries read"
            part = missing[start : start + READ_CHUNK]
            node_paths = [f"{folder}/{entries.name(keys[i])}" for i in part]
            stats = exists_many(zk, node_paths)
            for i, path in zip(part, node_paths, strict=True):
                stat = stats.get(path)
                if stat is not None:
                    ctimes[i] = stat.ctime / 1000.0
            if pause:
                time.sleep(pause)
    with _lock:
        if _owner[0] is zk:
            _times[state] = _Times(keys, ctimes, 0.0 not in ctimes)
    return entries, ctimes


def _lock_stats(zk: Any, jids: list[str]) -> dict[str, Any]:
    """The stat of each job's lock node, or None (read in chunks)."""
    found: dict[str, Any] = {}
    for start in range(0, len(jids), READ_CHUNK):
        part = jids[start : start + READ_CHUNK]
        stats = exists_many(zk, [zpaths.job_node(j, "lock") for j in part])
        found.update((j, stats.get(zpaths.job_node(j, "lock"))) for j in part)
    return found


def find_stuck(zk: Any, *, fresh: bool = False) -> list[StuckJob]:
    """Every stuck job now, the longest-stuck first (kept ``CACHE_SECONDS`` per process)."""
    global _cached, _counted
    hit = _cached
    if not fresh and hit and hit[1] is zk and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[2]
    idx = zindex.for_client(zk)
    limits = thresholds()
    now = server_now(zk)  # the clock of the entries' ctimes (queues/zk/servertime.py)
    candidates: list[tuple[str, str, float]] = []
    state: str
    for state in STATES:
        limit = limits[state]
        entries, ctimes = _entry_times(zk, idx, state)
        cut = now - min(limit.in_state, limit.lock)
        keys = entries.keys
        candidates += [
            (entries.jid(keys[i]), state, now - t) for i, t in enumerate(ctimes) if 0.0 < t < cut
        ]
    found = _judge(zk, candidates, limits, now)
    found.sort(key=lambda s: -s.in_state)
    counts = Counter(s.state for s in found)
    _cached = (time.monotonic(), zk, found)
    _counted = (time.monotonic(), zk, {s: counts.get(s, 0) for s in STATES})
    return found


def _judge(
    zk: Any, candidates: list[tuple[str, str, float]], limits: dict[str, Threshold], now: float
) -> list[StuckJob]:
    """The candidates (jid, state, seconds in it) that are stuck, with why, in the same order
    (their locks read in chunks)."""
    locks = _lock_stats(zk, [jid for jid, _s, _a in candidates])
    found = []
    for jid, state, age in candidates:
        limit = limits[state]
        stat = locks.get(jid)
        lock_age = max(0.0, now - stat.ctime / 1000.0) if stat is not None else None
        why = []
        if age > limit.in_state:
            why.append(
                f"in {state} for {history.fmt_seconds(age)} "
                f"(stuck past {history.fmt_seconds(limit.in_state)})"
            )
        if lock_age is not None and lock_age > limit.lock:
            why.append(
                f"locked by a consumer for {history.fmt_seconds(lock_age)} "
                f"(stuck past {history.fmt_seconds(limit.lock)})"
            )
        if why:
            found.append(StuckJob(jid, state, age, lock_age, limit, "; ".join(why)))
    return found


PAGE_SIZE = 100


@dataclass(frozen=True)
class StuckPage:
    items: list[StuckJob]
    number: int
    per_page: int
    total: int
    # What is still being read before stuck jobs can be listed (after a start); "" once listed.
    loading: str = ""
    counted_ago: float = 0.0  # seconds since the count the page's order comes from

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def _ranked(
    keys: array[int], ctimes: array[float], low: float, high: float
) -> tuple[array[int], array[float]]:
    """The ``keys`` whose time is in [low, high) (read: not 0.0) with their times, oldest
    first. The candidates are picked in C; they are sorted block by block and merged, so that
    a page request never waits long for the interpreter behind a count."""
    picked = compress(
        range(len(keys)), map(and_, map(high.__gt__, ctimes), map(max(low, 1e-9).__le__, ctimes))
    )
    ranked_keys, ranked_times = array("q"), array("d")
    for i in _time_ordered(ctimes, array("q", picked)):
        ranked_keys.append(keys[i])
        ranked_times.append(ctimes[i])
    return ranked_keys, ranked_times


def _time_ordered(ctimes: array[float], positions: Sequence[int]) -> Iterator[int]:
    """``positions`` in ``ctimes`` ordered by time (ties in their order), sorted block by block
    (each kept as an array) and merged: as fast as one sort, and never more than a block of
    Python ints and floats at once (one sort of a 600,000-entry state held one of each per
    entry: +33 MiB for a moment at a million jobs)."""
    at = ctimes.__getitem__
    blocks = [
        array("q", sorted(positions[s : s + CARRY_BLOCK], key=at))
        for s in range(0, len(positions), CARRY_BLOCK)
    ]
    return heapq.merge(*blocks, key=at)


def _oldest_of(
    state: str, entries: packed.Entries, ctimes: array[float], horizon: float
) -> _Oldest:
    with _lock:
        kept = _oldest.get(state)
    if kept is None or kept.source is not entries.keys:
        return _Oldest(entries.keys, *_ranked(entries.keys, ctimes, 0.0, horizon), horizon)
    if kept.horizon >= horizon:
        return kept
    # The same listing: the entries that came within the horizon since are all younger than
    # the kept ones, so they go after them.
    more_keys, more_times = _ranked(entries.keys, ctimes, kept.horizon, horizon)
    return _Oldest(kept.source, kept.keys + more_keys, kept.ctimes + more_times, horizon)


def _still_listed(
    state: str, kept: _Oldest, end: int, listed: array[int]
) -> Iterator[tuple[float, str, int]]:
    """(time, state, key) of ``kept``'s first ``end`` entries still in the state's listing."""
    keys, ctimes = kept.keys, kept.ctimes
    for i in range(end):
        key = keys[i]
        if is_in(listed, key):
            yield ctimes[i], state, key


def _page_order(zk: Any, idx: zindex.ReadIndex) -> tuple[dict[str, _Oldest], float, str]:
    """The entries oldest first per state and the age of the count that made them, or what is
    still loading. Never counts in the request while the read index fills or is primed: the
    page says so (and starts a count of its own, once, if none runs), instead of reading
    every working entry's time."""
    with _lock:
        kept = dict(_oldest) if _owner[0] is zk else {}
        made = _oldest_at[0]
    if len(kept) == len(STATES):
        age = time.monotonic() - made
        if age >= CACHE_SECONDS:
            _count_in_background(zk)  # the last order meanwhile: new entries are younger
        return kept, age, ""
    if idx.filling or _priming.is_set() or _counting.locked():
        if not _priming.is_set():
            _count_in_background(zk)
        reading = _reading[0] or "starting"
        stage = idx.loading()
        return (
            {},
            0.0,
            (
                f"the time each working job entered its state ({reading})"
                + (f"; the read index: {stage}" if stage else "")
            ),
        )
    _count(zk)  # nothing counts and nothing will (no warm-up in this process): count now
    with _lock:
        return dict(_oldest), time.monotonic() - _oldest_at[0], ""


def stuck_page(zk: Any, number: int = 1, *, per_page: int = PAGE_SIZE) -> StuckPage:
    """Page ``number`` of ``find_stuck``'s list (the longest in their state first), reading no
    more than that page needs: the oldest entries of each state past its lower threshold, in
    the order the last count kept (``_Oldest``), those no longer listed left out, and the
    locks of those judged only. The total is the last count's (``stuck_counts``)."""
    idx = zindex.for_client(zk)
    oldest, age, loading = _page_order(zk, idx)
    if loading:
        return StuckPage([], number, per_page, 0, loading=loading)
    limits = thresholds()
    now = server_now(zk)  # the clock of the entries' ctimes (queues/zk/servertime.py)
    streams = []
    for state in STATES:
        limit, kept = limits[state], oldest[state]
        end = bisect_left(kept.ctimes, now - min(limit.in_state, limit.lock))
        streams.append(_still_listed(state, kept, end, idx.job_entries(state).keys))
    candidates = heapq.merge(*streams)
    want = number * per_page
    found: list[StuckJob] = []
    while len(found) < want:
        part = list(islice(candidates, max(per_page, want - len(found))))
        if not part:
            break
        judged = [(packed.EMPTY.jid(key), state, now - t) for t, state, key in part]
        found += _judge(zk, judged, limits, now)
    hit = _counted
    counted = sum(hit[2].values()) if hit and hit[1] is zk else 0
    return StuckPage(
        found[want - per_page : want],
        number,
        per_page,
        max(counted, len(found)),
        counted_ago=age,
    )


def _count(zk: Any, *, pause: float = 0.0) -> dict[str, int]:
    """Stuck jobs per state, by ``find_stuck``'s rule, reading a lock only where it decides:
    a job longer in its state than the state's threshold is stuck whatever its lock; one in it
    no longer than the lock threshold cannot be (its lock is younger than its entry)."""
    global _counted
    with _counting:
        idx = zindex.for_client(zk)
        limits = thresholds()
        now = server_now(zk)
        counts: dict[str, int] = {}
        oldest: dict[str, _Oldest] = {}
        state: str
        try:
            for state in STATES:
                limit = limits[state]
                entries, ctimes = _entry_times(zk, idx, state, pause=pause)
                in_cut = now - limit.in_state
                # Known times before the cut (a time not read is 0.0, before every cut).
                count = sum(map(in_cut.__gt__, ctimes)) - ctimes.count(0.0)
                counts[state] = count + len(_stuck_by_lock(zk, state, entries, ctimes, limit, now))
                horizon = now + HORIZON - min(limit.in_state, limit.lock)
                oldest[state] = _oldest_of(state, entries, ctimes, horizon)
        finally:
            _reading[0] = ""
        with _lock:
            if _owner[0] is zk:
                _oldest.clear()
                _oldest.update(oldest)
                _oldest_at[0] = time.monotonic()
        _counted = (time.monotonic(), zk, counts)
        return counts


def _stuck_by_lock(
    zk: Any,
    state: str,
    entries: packed.Entries,
    ctimes: array[float],
    limit: Threshold,
    now: float,
) -> list[int]:
    """Positions of the entries stuck by their lock alone: in the state longer than the lock
    threshold but not than the state's, under a lock older than the lock threshold (the only
    jobs whose lock is read)."""
    if limit.lock >= limit.in_state:
        return []
    keys = entries.keys
    picked = _band(state, keys, ctimes, now - limit.in_state, now - limit.lock)
    band = {entries.jid(keys[i]): i for i in picked}
    return [
        band[jid]
        for jid, stat in _lock_stats(zk, list(band)).items()
        if stat is not None and now - stat.ctime / 1000.0 > limit.lock
    ]


def _band(
    state: str, keys: array[int], ctimes: array[float], in_cut: float, lock_cut: float
) -> Iterable[int]:
    """Positions of the entries whose time is at or after ``in_cut`` and before ``lock_cut``.
    Once ``_before`` has ordered the state's entries by time, a run of that order found by
    bisection (a pass over 600,000 times was most of a warm "stuck only" at 1M); else a pass
    in C."""
    with _lock:
        made = _by_time.get(state)
    if made is not None and made.keys is keys and made.ctimes is ctimes:
        at, order = ctimes.__getitem__, made.order
        return order[bisect_left(order, in_cut, key=at) : bisect_left(order, lock_cut, key=at)]
    return compress(
        range(len(ctimes)), map(and_, map(in_cut.__le__, ctimes), map(lock_cut.__gt__, ctimes))
    )


def _one_in_background(
    slot: list[threading.Thread | None], target: Any, zk: Any, name: str
) -> None:
    """Run ``target(zk)`` in a thread of its own unless ``slot``'s thread still runs (under
    ``_lock``, which the caller holds)."""
    running = slot[0]
    if running is not None and running.is_alive():
        return
    thread = threading.Thread(target=target, args=(zk,), name=name, daemon=True)
    slot[0] = thread
    thread.start()


def _count_in_background(zk: Any) -> None:
    """Count again in a thread of its own (one at a time); the last count stays meanwhile."""
    with _lock:
        _one_in_background(_recount, _recount_logged, zk, "count-stuck-jobs")


def _recount_logged(zk: Any) -> None:
    from django.db import connections

    try:
        _count(zk, pause=READ_PAUSE)
    except Exception as exc:  # ZooKeeper away: the last count stays, the next view tries again
        log.warning("stuck jobs not counted again: %s", exc)
    finally:
        connections.close_all()  # this thread's own (the step history's thresholds)


def prime(zk: Any) -> None:
    """The first count, made in the background once the read index is filled (warmup.py)."""
    _priming.set()
    try:
        _count(zk, pause=READ_PAUSE)
    finally:
        _priming.clear()


def stuck_counts(zk: Any, *, wait: bool = True) -> dict[str, int]:
    """Stuck jobs per state (every state a consumer works in, zeros included).

    With ``wait=False`` (the overview card, /metrics) this never counts in the request once a
    count was made: a count older than ``CACHE_SECONDS`` is given while a background thread
    counts again. Before the first count, while the read index still fills or ``prime`` makes
    it, StillCounting.
    """
    hit = _counted
    if hit and hit[1] is zk:
        if time.monotonic() - hit[0] < CACHE_SECONDS:
            return hit[2]
        if not wait:
            _count_in_background(zk)
            return hit[2]
    elif not wait and (zindex.for_client(zk).filling or _priming.is_set()):
        raise StillCounting("counted once the read index is filled")
    return _count(zk)


def stuck_keys(
    zk: Any, states: list[str] | tuple[str, ...] = STATES, *, loading: list[str] | None = None
) -> array[int]:
    """The run keys (``packed.Entries``: priority << 34 | number) of the stuck jobs in
    ``states``, sorted: ``find_stuck``'s rule without a record per job, reading a lock only
    where it decides, as the count does. The entries past the state's threshold are picked
    in C (``compress``), not by a call per entry.

    With ``loading`` (the job list's "stuck only"), a state with more entry times unknown than
    a request reads itself (the first look after a start) is answered from the times known so
    far, the rest read in the background (``entered_before``), and what is being read is
    added to ``loading``; without it, every time is read first."""
    idx = zindex.for_client(zk)
    limits = thresholds()
    now = server_now(zk)  # the clock of the entries' ctimes (queues/zk/servertime.py)
    parts: list[array[int]] = []
    by_lock: list[int] = []
    for state in states:
        if state not in STATES:
            continue
        limit = limits[state]
        reading = ""
        if loading is None:
            entries, ctimes = _entry_times(zk, idx, state)
        else:
            entries, ctimes, reading = _known_times(zk, idx, state)
        keys = entries.keys
        cut = now - limit.in_state
        if loading is not None and reading:  # a part read: nothing kept (see ``_before``)
            loading.append(reading)
            parts.append(_picked(keys, ctimes, cut, strict=True))
        else:
            parts.append(_before(state, keys, ctimes, cut, strict=True))
        by_lock.extend(keys[i] for i in _stuck_by_lock(zk, state, entries, ctimes, limit, now))
    return _joined(parts, by_lock)


# The last answer of ``_joined``: the states' parts it was made of, the keys stuck by their
# lock, and the keys sorted.
_last_joined: list[tuple[list[array[int]], list[int], array[int]]] = []


def _joined(parts: list[array[int]], by_lock: list[int]) -> array[int]:
    """The keys of ``parts`` (each sorted) and ``by_lock``, sorted; shared, never changed. The
    states' parts are ``_before``'s kept answers while no entry crosses a cut: the last answer
    is given again when made of the same parts, and one state's part is its own answer. (At
    1,000,000 jobs sorting the stuck keys of every state again was 70% of a warm "stuck
    only".)"""
    full = [part for part in parts if len(part)]
    if len(full) <= 1 and not by_lock:
        return full[0] if full else array("q")
    with _lock:
        last = _last_joined[0] if _last_joined else None
    if (
        last is not None
        and len(last[0]) == len(full)
        and all(a is b for a, b in zip(last[0], full, strict=True))
        and last[1] == by_lock
    ):
        return last[2]
    joined = packed.merged_sorted([*full, sorted(by_lock)])
    with _lock:
        _last_joined[:] = [(full, by_lock, joined)]
    return joined


def stuck_numbers(zk: Any, states: list[str] | tuple[str, ...] = STATES) -> array[int]:
    """The read index's numbers of the stuck jobs in ``states``, sorted (``stuck_keys``'
    jobs; ``is_in`` looks one up by bisection)."""
    return array("q", sorted(map(packed.NUM_MASK.__and__, stuck_keys(zk, states))))


@dataclass(frozen=True)
class _ByTime:
    """A state's entries ordered by the time they entered it (``_entry_times``), made once per
    listing and times: positions in the listing, and the times in that order (ascending)."""

    keys: array[int]
    ctimes: array[float]
    order: array[int]  # positions, by time (bisected with their times as the key)
    # The last answers: (where they start and end in ``order``) -> their keys in run order.
    kept: dict[tuple[int, int], array[int]] = field(default_factory=dict)


_by_time: dict[str, _ByTime] = {}
# The listing and times each state was last asked about (``_before``).
_seen: dict[str, tuple[array[int], array[float]]] = {}


def entered_before(zk: Any, state: str, cut: float) -> tuple[array[int], str]:
    """The run keys of the state's entries that entered it at or before ``cut`` (s since the
    epoch), sorted (run order): the job list's "in state at least" filter, and what is still
    being read ("" when the answer is whole).

    The entries ordered by time are a prefix up to ``cut`` (bisection); that prefix in run
    order is sorted in C and kept until the prefix or the listing changes. Entries whose time
    could not be read (gone when asked) are left out. When more than ``READ_IN_REQUEST``
    entries' times are not known yet (a state never asked about since a start), they are read
    by a thread of its own, and the answer is of the entries known so far, saying so."""
    entries, ctimes, reading = _known_times(zk, zindex.for_client(zk), state)
    if reading:  # times of this listing, part read: nothing kept (see ``_before``)
        return _picked(entries.keys, ctimes, cut, strict=False), reading
    return _before(state, entries.keys, ctimes, cut, strict=False), ""


def _known_times(
    zk: Any, idx: zindex.ReadIndex, state: str
) -> tuple[packed.Entries, array[float], str]:
    """``_entry_times``, unless more than ``READ_IN_REQUEST`` entries' times are not known yet
    (or the background reader is at them): then the times known so far (0.0 for the others),
    the rest read by a thread of its own, and what is being read ("" when the times are
    whole)."""
    entries = idx.job_entries(state)
    keys = entries.keys
    with _lock:
        known = _times.get(state) if _owner[0] is zk else None
        reader = _age_reader[0]
    if known is None or known.keys is not keys:
        reading = reader is not None and reader.is_alive()
        ctimes = (
            packed.carried(known.keys, known.ctimes, keys, 0.0)
            if known is not None
            else array("d", [0.0]) * len(keys)
        )
        missing = ctimes.count(0.0)
        if missing > READ_IN_REQUEST or (reading and missing):
            _read_times_in_background(zk, state)
            read = f"{len(keys) - missing:,} of {len(keys):,} read"
            return entries, ctimes, f"the time each job entered {state} ({read})"
    entries, ctimes = _entry_times(zk, idx, state)
    return entries, ctimes, ""


def _picked(keys: array[int], ctimes: array[float], cut: float, *, strict: bool) -> array[int]:
    """The ``keys`` whose time in ``ctimes`` is known and before ``cut`` (``strict``) or at
    it, in their order: one pass in C."""
    below = cut.__gt__ if strict else cut.__ge__
    return array("q", compress(keys, map(and_, map(below, ctimes), map((0.0).__lt__, ctimes))))


def _before(
    state: str, keys: array[int], ctimes: array[float], cut: float, *, strict: bool
) -> array[int]:
    """The ``keys`` (a state's run keys, sorted) whose time in ``ctimes`` is known and before
    ``cut`` (``strict``) or at it, sorted.

    A listing asked about for the first time is picked from in C, a pass over its times; asked
    again unchanged, its entries are ordered by time once (``_ByTime``), after which the
    answer is a prefix found by bisection, and the same prefix's keys are kept. A state whose
    listing changes between every two requests (a busy queue) so costs a pass in C per
    request, never a sort per change; one that holds still costs no pass."""
    with _lock:
        made = _by_time.get(state)
        seen = _seen.get(state)
        _seen[state] = (keys, ctimes)
    if made is None or made.keys is not keys or made.ctimes is not ctimes:
        if seen is None or seen[0] is not keys or seen[1] is not ctimes:
            return _picked(keys, ctimes, cut, strict=strict)
        made = _ByTime(keys, ctimes, array("i", _time_ordered(ctimes, range(len(ctimes)))))
        with _lock:
            _by_time[state] = made
    at = made.ctimes.__getitem__
    low = bisect_right(made.order, 0.0, key=at)
    high = max(low, (bisect_left if strict else bisect_right)(made.order, cut, key=at))
    kept = made.kept.get((low, high))
    if kept is not None:
        return kept
    # The cut moves on with the clock: the last answer of a shorter prefix, with the few
    # entries that have crossed the cut since put in their places, instead of sorting the whole
    # prefix again at every request (at 1,000,000 jobs "stuck only" took 1.9 times as long as
    # at 1,000 for the same page).
    shorter = max((h for (lo, h) in made.kept if lo == low and h < high), default=None)
    if shorter is not None and high - shorter <= GROWN_AT_MOST:
        found = array("q", made.kept[(low, shorter)])  # a copy: answers are shared
        for key in sorted(map(made.keys.__getitem__, made.order[shorter:high])):
            found.insert(bisect_left(found, key), key)
    else:  # the keys of that prefix in their own order: a pass in C, not a sort of Python ints
        found = _picked(made.keys, made.ctimes, cut, strict=strict)
    if len(made.kept) >= 4:
        made.kept.clear()
    made.kept[(low, high)] = found
    return found


GROWN_AT_MOST = 1000  # entries put in their places one by one; more: the prefix sorted again


# Entry times a job list request reads itself (as many as the old scan of status nodes read at
# most); a state with more not known yet is read in the background (``entered_before``).
READ_IN_REQUEST = 20_000
_age_reader: list[threading.Thread | None] = [None]
_age_wanted: set[str] = set()


def _read_times_in_background(zk: Any, state: str) -> None:
    """Read the entry times of ``state`` (and of any other state asked for meanwhile) in a
    thread of its own, one at a time, pausing between chunks as the count does."""
    with _lock:
        _age_wanted.add(state)
        _one_in_background(_age_reader, _read_times, zk, "read-entry-times")


def _read_times(zk: Any) -> None:
    try:
        idx = zindex.for_client(zk)
        while True:
            with _lock:
                if not _age_wanted:
                    _age_reader[0] = None
                    return
                state = _age_wanted.pop()
            try:
                _entry_times(zk, idx, state, pause=READ_PAUSE)
            finally:
                _reading[0] = ""
    except Exception as exc:  # ZooKeeper away: the next request asks again
        log.warning("entry times not read: %s", exc)
        with _lock:
            _age_wanted.clear()
            _age_reader[0] = None


def is_in(numbers: array[int], value: int) -> bool:
    """Whether the sorted ``numbers`` hold ``value``."""
    at = bisect_left(numbers, value)
    return at < len(numbers) and numbers[at] == value


def reset() -> None:
    """Forget the remembered entry times and answers (tests, a new ZooKeeper client)."""
    global _cached, _counted
    with _lock:
        _times.clear()
        _oldest.clear()
        _by_time.clear()
        _seen.clear()
        _last_joined.clear()
        _age_wanted.clear()
        _oldest_at[0] = 0.0
        _owner[0] = None
    _cached = None
    _counted = None


# Consumer processes (their registrations, queues/zk/consumers.py) -----------------------------

STALE_AFTER = 3  # publish intervals without a write before a registration is called stale


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except (ValueError, OverflowError):
        return None


def _seconds_since(stamp: Any, now: float, offset: float = 0.0) -> float | None:
    """Seconds from ``stamp`` (an ISO time a process wrote by its own clock, ``offset`` behind
    the server's) to ``now`` (the server's)."""
    moment = _epoch(stamp)
    return None if moment is None else max(0.0, now - (moment + offset))


def step_limits() -> dict[str, float]:
    """Per daemon step, how long one thread may hold one item before it is flagged: the
    step's p95 duration times MRT_STUCK_FACTOR (queues/operator/stuck.py), or MRT_STUCK_SECONDS."""
    default = default_limit()
    try:
        usual = history.usual_step_times()
    except Exception:  # no table yet, database away: the setting still works
        usual = {}
    return {step: limit_from(u.p95, u.n, default) for step, u in usual.items()}


def consumer_processes() -> dict[str, Any]:
    """Every registered consumer process with its threads, each thread flagged when it has held
    its item past its step's limit: ``{"consumers": [...], "flagged_total": n}``.

    Each process wrote its times by its own host's clock; the node's ``mtime`` is the server's
    at that write, so their difference puts them on the server's clock, which "now" is read
    from too: a host whose clock is minutes off shows no thread stuck, nor itself stale, for it."""
    zk = connected_client()
    now = server_now(zk)
    limits = step_limits()
    default = default_limit()
    procs = []
    flagged_total = 0
    for data, written_ms in zconsumers.consumers_written(zk):
        written = written_ms / 1000
        updated = _epoch(data.get("updated"))
        offset = 0.0 if updated is None else written - updated
        threads = []
        for t in data.get("threads") or []:
            if not isinstance(t, dict):
                continue
            held = _seconds_since(t.get("since"), now, offset) if t.get("item") else None
            limit = limits.get(str(t.get("step", "")), default)
            flagged = held is not None and held > limit
            flagged_total += flagged
            threads.append({**t, "held": held, "limit": limit, "flagged": flagged})
        every = float(data.get("publish_seconds") or 5)
        age = max(0.0, now - written)  # since its last write, by the server's clock
        procs.append(
            {
                **data,
                "threads": threads,
                "busy": sum(1 for t in threads if t.get("item")),
                "flagged": sum(1 for t in threads if t["flagged"]),
                "uptime": _seconds_since(data.get("started"), now, offset),
                "updated_ago": age,
                "stale": age is not None and age > STALE_AFTER * every + 5,
            }
        )
    return {"consumers": procs, "flagged_total": flagged_total}
