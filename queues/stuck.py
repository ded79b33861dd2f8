"""Stuck jobs: far longer in their state, or under one consumer's lock, than is usual there.

"Usual" is the 95th percentile the step history gives for the state (``queues/history.py``,
the last 7 days): a job is stuck when its time in the state is past ``MRT_STUCK_FACTOR`` (3)
times the p95 of waiting plus working there, or its lock is older than that factor times the
p95 of the step's own duration, and never before ``MRT_STUCK_MIN_SECONDS`` (300). A state with
fewer than ``history.MIN_RECORDS`` records uses ``MRT_STUCK_SECONDS`` (3600) for both.

What it costs: the state folders' listings come from the read index; the time a job entered
its state is its index entry's creation time, read once per entry and remembered while the
entry exists (an entry is made anew at every move); a lock is read only for the jobs already
in their state longer than the lock threshold. The answer is kept ``CACHE_SECONDS``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from queues import history
from queues.states import JOB_STEPS
from queues.zk import consumers as zconsumers
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.nodes import exists_many

DEFAULT_SECONDS = 3600.0
DEFAULT_FACTOR = 3.0
DEFAULT_MIN_SECONDS = 300.0
CACHE_SECONDS = 15.0
READ_CHUNK = 1000
# The states a consumer works in (Completed is final; Held and Failed wait for an operator).
STATES = JOB_STEPS[:-1]

_lock = threading.Lock()
_ctimes: dict[str, dict[str, float]] = {}  # state -> entry name -> ctime (s since the epoch)
_owner: list[Any] = [None]  # the client the remembered times were read through
_cached: tuple[float, Any, list[StuckJob]] | None = None
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


def _entry_times(zk: Any, state: str, names: list[str]) -> dict[str, float]:
    """Creation time of each index entry of ``state`` (remembered while the entry exists)."""
    folder = zpaths.job_state_folder(state)
    with _lock:
        if _owner[0] is not zk:  # another client (another ensemble or chroot): start again
            _ctimes.clear()
            _owner[0] = zk
        known = _ctimes.get(state, {})
    current = {n: known[n] for n in names if n in known}
    missing = [n for n in names if n not in known]
    for start in range(0, len(missing), READ_CHUNK):
        part = missing[start : start + READ_CHUNK]
        stats = exists_many(zk, [f"{folder}/{n}" for n in part])
        for n in part:
            stat = stats.get(f"{folder}/{n}")
            if stat is not None:
                current[n] = stat.ctime / 1000.0
    with _lock:
        _ctimes[state] = current
    return current


def find_stuck(zk: Any, *, fresh: bool = False, wait: bool = True) -> list[StuckJob]:
    """Every stuck job now, the longest-stuck first (kept ``CACHE_SECONDS`` per process).

    With ``wait=False`` (the overview card, /metrics) a count that would have to read every
    entry's time while the read index still fills, or while ``prime`` does that in the
    background, is not made here: the last answer is given, or StillCounting when there is none.
    """
    global _cached
    hit = _cached
    if not fresh and hit and hit[1] is zk and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[2]
    idx = zindex.for_client(zk)
    if not wait and (idx.filling or _priming.is_set()):
        if hit and hit[1] is zk:
            return hit[2]
        raise StillCounting("counted once the read index is filled")
    limits = thresholds()
    now = time.time()
    candidates: list[tuple[str, str, float]] = []
    state: str
    for state in STATES:
        limit = limits[state]
        entries = idx.job_entries(state)
        names = [zpaths.index_name(p, j) for p, j in entries]
        times = _entry_times(zk, state, names)
        lowest = min(limit.in_state, limit.lock)
        for (_p, jid), n in zip(entries, names, strict=False):
            created = times.get(n)
            if created is not None and now - created > lowest:
                candidates.append((jid, state, now - created))
    locks = {}
    for start in range(0, len(candidates), READ_CHUNK):
        part = candidates[start : start + READ_CHUNK]
        locks.update(exists_many(zk, [zpaths.job_node(j, "lock") for j, _s, _a in part]))
    found = []
    for jid, state, age in candidates:
        limit = limits[state]
        stat = locks.get(zpaths.job_node(jid, "lock"))
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
    found.sort(key=lambda s: -s.in_state)
    _cached = (time.monotonic(), zk, found)
    return found


def prime(zk: Any) -> None:
    """The first count, made in the background once the read index is filled (warmup.py)."""
    _priming.set()
    try:
        find_stuck(zk, fresh=True)
    finally:
        _priming.clear()


def stuck_counts(zk: Any, *, wait: bool = True) -> dict[str, int]:
    """Stuck jobs per state (every state a consumer works in, zeros included)."""
    counts = Counter(s.state for s in find_stuck(zk, wait=wait))
    return {state: counts.get(state, 0) for state in STATES}


def stuck_ids(zk: Any) -> set[str]:
    return {s.jid for s in find_stuck(zk)}


def only_stuck(zk: Any, entries: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The job list's ``stuck`` filter: the entries of stuck jobs, order kept."""
    ids = stuck_ids(zk)
    return [e for e in entries if e[1] in ids]


def reset() -> None:
    """Forget the remembered entry times and answer (tests, a new ZooKeeper client)."""
    global _cached
    with _lock:
        _ctimes.clear()
    _cached = None


# Consumer processes (their registrations, queues/zk/consumers.py) -----------------------------

STALE_AFTER = 3  # publish intervals without a write before a registration is called stale


def _seconds_since(stamp: Any, now: float) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return max(0.0, now - datetime.fromisoformat(stamp).timestamp())
    except ValueError:
        return None


def step_limits() -> dict[str, float]:
    """Per daemon step, how long one thread may hold one item before it is flagged: the
    step's p95 duration times MRT_STUCK_FACTOR (queues/stuck.py), or MRT_STUCK_SECONDS."""
    default = default_limit()
    try:
        usual = history.usual_step_times()
    except Exception:  # no table yet, database away: the setting still works
        usual = {}
    return {step: limit_from(u.p95, u.n, default) for step, u in usual.items()}


def consumer_processes() -> dict[str, Any]:
    """Every registered consumer process with its threads, each thread flagged when it has held
    its item past its step's limit: ``{"consumers": [...], "flagged_total": n}``."""
    zk = connected_client()
    now = time.time()
    limits = step_limits()
    default = default_limit()
    procs = []
    flagged_total = 0
    for data in zconsumers.consumers_list(zk):
        threads = []
        for t in data.get("threads") or []:
            if not isinstance(t, dict):
                continue
            held = _seconds_since(t.get("since"), now) if t.get("item") else None
            limit = limits.get(str(t.get("step", "")), default)
            flagged = held is not None and held > limit
            flagged_total += flagged
            threads.append({**t, "held": held, "limit": limit, "flagged": flagged})
        every = float(data.get("publish_seconds") or 5)
        age = _seconds_since(data.get("updated"), now)
        procs.append(
            {
                **data,
                "threads": threads,
                "busy": sum(1 for t in threads if t.get("item")),
                "flagged": sum(1 for t in threads if t["flagged"]),
                "uptime": _seconds_since(data.get("started"), now),
                "updated_ago": age,
                "stale": age is not None and age > STALE_AFTER * every + 5,
            }
        )
    return {"consumers": procs, "flagged_total": flagged_total}
