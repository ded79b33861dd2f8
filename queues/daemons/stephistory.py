"""The step history, written from the daemons: every step run becomes one ``StepRecord`` row.

A daemon thread never touches the database for this: it appends a plain tuple to an in-memory
list (one lock, no I/O). A background writer thread of the process flushes the list in one
``bulk_create`` every ``FLUSH_SECONDS`` or as soon as ``FLUSH_ROWS`` are waiting, and once an
hour deletes the records older than ``MRT_STEP_HISTORY_DAYS`` (default 30). A database that is
away costs records, never the daemons' work: rows that cannot be written are kept for the next
flush and dropped only once more than ``MAX_PENDING`` wait; an outage is logged once when it
starts and once when the records are written again, not at every flush in between.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from queues.zk.records import AccessRequest, Batch, Job

log = logging.getLogger("queues.daemons")

FLUSH_SECONDS = 2.0
FLUSH_ROWS = 500
MAX_PENDING = 50_000
PRUNE_EVERY = 3600.0
RETRY_FIRST = 0.25  # seconds to the first try again after a failed write


def retention_days() -> float:
    return float(settings.MRT_STEP_HISTORY_DAYS)


def prune(*, now: datetime | None = None) -> int:
    """Delete records older than the retention; returns how many went."""
    from queues.models import StepRecord

    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days())
    deleted, _ = StepRecord.objects.filter(started__lt=cutoff).delete()
    return deleted


class StepRecorder:
    """Collects step records in memory and writes them in batches from its own thread."""

    def __init__(
        self,
        *,
        consumer: str = "",
        host: str | None = None,
        flush_seconds: float = FLUSH_SECONDS,
        flush_rows: int = FLUSH_ROWS,
        prune_every: float = PRUNE_EVERY,
    ) -> None:
        self.host = host or socket.gethostname()
        self.consumer = consumer
        self.flush_seconds = flush_seconds
        self.flush_rows = flush_rows
        self.prune_every = prune_every
        self._rows: list[tuple] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.batches = 0
        self.dropped = 0
        self._last_prune = 0.0
        self.failing = False  # the last flush could not write (its outage was logged)

    # The daemons' side: no I/O --------------------------------------------------------------

    def add(
        self,
        kind: str,
        item_id: str,
        step: str,
        state: str,
        outcome: str,
        started: float,
        duration: float,
        waited: float | None = None,
        nbytes: int | None = None,
        detail: str = "",
    ) -> None:
        """One step run; ``started`` is a wall-clock time (seconds since the epoch)."""
        self.add_many(
            [(kind, item_id, step, state, outcome, started, duration, waited, nbytes, detail)]
        )

    def add_many(self, rows: list[tuple]) -> None:
        """Step runs, each as ``add``'s arguments in their order."""
        with self._lock:
            before = len(self._rows)
            room = MAX_PENDING - before
            if room < len(rows):
                self.dropped += len(rows) - max(0, room)
                rows = rows[: max(0, room)]
            self._rows += rows
            full = before < self.flush_rows <= len(self._rows)
        if full:
            # Once, as they reach it: the writer takes them all (or, failing, tries again on
            # its own time); a wake-up for every later row cost half the rows a thread switch.
            self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._rows)

    # The writer ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="step-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is waiting and stop the writer."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        else:
            self.flush()

    def _run(self) -> None:
        try:
            retry = RETRY_FIRST
            while not self._stop.is_set():
                # After a failed write, the next try comes sooner (doubling up to the flush
                # interval): an outage of a few seconds holds the rows for seconds, not a minute.
                self._wake.wait(
                    min(retry, self.flush_seconds) if self.failing else self.flush_seconds
                )
                self._wake.clear()
                self.flush()
                retry = min(retry * 2, self.flush_seconds) if self.failing else RETRY_FIRST
                if time.monotonic() - self._last_prune >= self.prune_every:
                    self._last_prune = time.monotonic()
                    try:
                        n = prune()
                        if n:
                            log.info(
                                "step history: %d records older than %g days removed",
                                n,
                                retention_days(),
                            )
                    except Exception as exc:
                        log.warning("step history: prune failed: %s", exc)
            self.flush()
        finally:
            close_old_connections()

    def flush(self) -> int:
        """Write every waiting record: one ``executemany`` of a prepared INSERT per
        ``flush_rows``, in one transaction (no model instances: this thread shares the
        interpreter with the daemons). Returns how many were written."""
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return 0
        stamp = started_value()
        host, consumer = self.host[:255], self.consumer[:255]
        params = [
            (
                kind,
                item_id[:40],
                step[:40],
                state[:40],
                outcome[:10],
                stamp(started),
                max(0.0, duration),
                None if waited is None else max(0.0, waited),
                int(started // 3600),
                host,
                consumer,
                nbytes,
                (detail or "")[:500],
            )
            for (
                kind,
                item_id,
                step,
                state,
                outcome,
                started,
                duration,
                waited,
                nbytes,
                detail,
            ) in rows
        ]
        try:
            sql = _insert_sql()
            with transaction.atomic(), connection.cursor() as cursor:
                for start in range(0, len(params), self.flush_rows):
                    cursor.executemany(sql, params[start : start + self.flush_rows])
        except Exception as exc:
            # Keep them for the next flush unless too many wait; the daemons go on either way.
            if self.failing:
                log.debug("step history: %d records not written yet: %s", len(rows), exc)
            else:
                log.warning(
                    "step history: %d records not written yet, kept until they can be: %s",
                    len(rows),
                    exc,
                )
            self.failing = True
            close_old_connections()
            with self._lock:
                room = MAX_PENDING - len(self._rows)
                kept = rows[: max(0, room)]
                self.dropped += len(rows) - len(kept)
                self._rows = kept + self._rows
            return 0
        self.written += len(rows)
        self.batches += 1
        if self.failing:
            self.failing = False
            log.info("step history: written again (%d records)", len(rows))
        return len(rows)


COLUMNS = (
    "kind",
    "item_id",
    "step",
    "state",
    "outcome",
    "started",
    "duration",
    "waited",
    "hour",
    "host",
    "consumer",
    "bytes",
    "detail",
)


def started_value() -> Callable[[float], Any]:
    """How a record's start (seconds since the epoch) goes to the database: as Django's
    ``adapt_datetimefield_value`` gives it, and for SQLite in UTC (the console's setting) the
    same text made directly, without the time zone checks Django makes for every value."""
    adapt = connection.ops.adapt_datetimefield_value
    if connection.vendor == "sqlite" and settings.USE_TZ and connection.timezone_name == "UTC":
        return _sqlite_utc
    return lambda started: adapt(datetime.fromtimestamp(started, UTC))


def _sqlite_utc(started: float) -> str:
    """``str`` of the naive UTC datetime ``datetime.fromtimestamp`` makes of ``started`` (its
    microseconds rounded half to even, as it rounds them), the whole seconds' text kept: a
    flush writes thousands of rows a second, most within the same few seconds."""
    fraction, whole = math.modf(started)
    micro = round(fraction * 1_000_000)
    if micro >= 1_000_000:
        whole, micro = whole + 1, micro - 1_000_000
    elif micro < 0:
        whole, micro = whole - 1, micro + 1_000_000
    seconds = _utc_seconds(int(whole))
    return f"{seconds}.{micro:06d}" if micro else seconds


@functools.lru_cache(maxsize=64)
def _utc_seconds(whole: int) -> str:
    return str(datetime.fromtimestamp(whole, UTC).replace(tzinfo=None))


def _insert_sql() -> str:
    from queues.models import StepRecord

    qn = connection.ops.quote_name
    meta = StepRecord._meta
    columns = ", ".join(qn(str(getattr(meta.get_field(name), "column", name))) for name in COLUMNS)
    marks = ", ".join(["%s"] * len(COLUMNS))
    return f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({marks})"  # noqa: S608


def record_of(daemon: Any, item: Any, now: float) -> tuple[str, str, float | None, int | None]:
    """What is known of an item when a step takes it at ``now`` (wall clock): kind, state, the
    time it waited in that state (from its status node's modification time) and the bytes the
    step moves, if known. A batched loop asks this of every job it takes: no dict, no import."""
    kind = _KIND_OF.get(type(item))
    if kind is None:
        kind = next((k for cls, k in _KINDS if isinstance(item, cls)), "item")
    state = getattr(item, "state", "") or ""
    waited = None
    status = getattr(item, "status", None)
    mtime = getattr(status, "mtime_seconds", None)
    if mtime is not None:
        waited = max(0.0, now - mtime)
    nbytes = None
    if kind == "job" and daemon.step in BYTES_STEPS:
        nbytes = getattr(item, "space_needed", None) or None
    return kind, str(state), waited, nbytes


_KINDS = ((Job, "job"), (Batch, "batch"), (AccessRequest, "access"))
_KIND_OF: dict[type, str] = {cls: kind for cls, kind in _KINDS}


# The steps whose work is moving the object's bytes: the job's space_needed is what they move.
BYTES_STEPS = frozenset({"downloading", "storing"})
