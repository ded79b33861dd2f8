"""The backlog ahead: what waits in each step, how fast jobs finished lately, when the current
backlog will be through at that pace, and whether the working disk holds what is waiting.

Counts and bytes come from the read index (per state, kept current by watches; bytes are the
estimates of jobs from Estimating on, summed once per folder change); rates from the step
history in the database (one grouped query for the last day, kept ``CACHE_SECONDS``); the disk
from the working folder's file system. Nothing here walks jobs.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count

from queues import history
from queues.models import StepRecord
from queues.states import JOB_STEPS, JOB_WORKING, JobState
from queues.steps.workdisk import provision_room
from queues.zk import index as zindex
from queues.zk.client import connected_client

log = logging.getLogger(__name__)

WINDOW_HOURS = 3  # the pace a drain estimate assumes: steps done over the last three hours
DAY_HOURS = 24
CACHE_SECONDS = 30.0
FINAL_STEP = JobState.NOTIFY.lower()  # a job whose notify step is done has finished the pipeline
WAITING = JOB_STEPS[:-1]  # Pending .. Notify: jobs not through yet


@dataclass(frozen=True)
class StepBacklog:
    state: str
    jobs: int
    bytes: int | None  # None: not estimated yet (Pending, Estimating)
    per_hour: float  # jobs this step finished per hour over the last WINDOW_HOURS
    drain_seconds: float | None  # jobs / per_hour; None when the step did nothing lately

    @property
    def step(self) -> str:
        return self.state.lower()


@dataclass(frozen=True)
class Disk:
    path: str
    total: int
    free: int
    used: int  # blocks in use (not counting those the file system keeps for root)
    high_water: float
    to_provision: int  # bytes the jobs waiting for Provisioning will ask for
    unestimated: int  # jobs whose size nobody knows yet (Pending, Estimating)

    @property
    def room(self) -> int:
        """What provisioning may still hand out before the high-water mark, by its own rule."""
        return max(0, provision_room(self, self.high_water))

    @property
    def fits(self) -> bool:
        return self.to_provision <= self.room


@dataclass(frozen=True)
class Backlog:
    steps: list[StepBacklog]
    hour_labels: list[str]  # the last DAY_HOURS hours, oldest first
    finished_per_hour: list[int]  # jobs through their last step, per hour
    rate_per_hour: float  # jobs finished per hour over the last WINDOW_HOURS
    disk: Disk | None
    loading: bool  # the read index still fills: counts and bytes are what is read so far
    history_error: str = ""  # the step history could not be read: no pace, no estimate

    @property
    def waiting_jobs(self) -> int:
        return sum(s.jobs for s in self.steps)

    @property
    def waiting_bytes(self) -> int:
        return sum(s.bytes or 0 for s in self.steps)

    @property
    def finished_last_day(self) -> int:
        return sum(self.finished_per_hour)

    @property
    def drain_seconds(self) -> float | None:
        """The whole backlog through at the recent pace; None when nothing finished lately.
        A backlog moves only as fast as its slowest step, so the slowest step's own estimate
        bounds it from below."""
        if not self.waiting_jobs:
            return 0.0
        if self.rate_per_hour <= 0:
            return None
        whole = self.waiting_jobs / self.rate_per_hour * 3600
        return max([whole, *(s.drain_seconds or 0 for s in self.steps)])

    @property
    def bottleneck(self) -> StepBacklog | None:
        slow = [s for s in self.steps if s.jobs and s.drain_seconds is not None]
        return max(slow, key=lambda s: s.drain_seconds or 0, default=None)


@dataclass(frozen=True)
class _Rates:
    labels: list[str]
    finished: list[int]
    recent: dict[str, int]  # step -> done over the last WINDOW_HOURS
    error: str = ""  # the step history could not be read: no pace, no estimate


_cache: tuple[float, _Rates] | None = None
_cache_lock = threading.Lock()


def _rates(now: datetime | None = None) -> _Rates:
    """Done per step over the window, and finished jobs per hour over the day (cached)."""
    global _cache
    clock = time.monotonic()
    with _cache_lock:
        if now is None and _cache is not None and clock - _cache[0] < CACHE_SECONDS:
            return _cache[1]
    when = now or datetime.now(UTC)
    try:
        return _read_rates(when, cache=now is None, clock=clock)
    except DatabaseError as exc:
        log.warning("backlog: step history not read: %s", exc)
        with _cache_lock:
            if _cache is not None:
                return _cache[1]
        return _Rates(labels=[], finished=[], recent={}, error=str(exc) or type(exc).__name__)


def _read_rates(when: datetime, *, cache: bool, clock: float) -> _Rates:
    global _cache
    day = history.throughput("24h", "hour", now=when)
    finished = next((s.done for s in day.steps if s.step == FINAL_STEP), [0] * len(day.starts))
    recent: dict[str, int] = {}
    rows = (
        StepRecord.objects.filter(
            started__gte=when - timedelta(hours=WINDOW_HOURS), outcome__in=history.DONE
        )
        .values("step")
        .annotate(n=Count("*"))
        .order_by()
    )
    for row in rows:
        recent[row["step"]] = row["n"]
    rates = _Rates(labels=day.labels[-DAY_HOURS:], finished=finished[-DAY_HOURS:], recent=recent)
    if cache:
        with _cache_lock:
            _cache = (clock, rates)
    return rates


def clear_cache() -> None:
    global _cache
    with _cache_lock:
        _cache = None


def _disk(to_provision: int, unestimated: int) -> Disk | None:
    root = Path(settings.MRT_WORK_DIR)
    probe = root if root.exists() else root.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        log.warning("working disk %s not measured: %s", root, exc)
        return None
    return Disk(
        path=str(root),
        total=usage.total,
        free=usage.free,
        used=usage.used,
        high_water=float(settings.MRT_PROVISION_HIGH_WATER),
        to_provision=to_provision,
        unestimated=unestimated,
    )


def backlog(*, now: datetime | None = None) -> Backlog:
    idx = zindex.for_client(connected_client())
    loading = idx.filling
    listed = idx.job_counts_now() if loading else {s: idx.job_count(s) for s in WAITING}
    counts = {state: listed.get(state) or 0 for state in WAITING}
    sizes: dict[str, int | None] = {}
    for state in WAITING:
        if state in JOB_WORKING and state != JobState.ESTIMATING:
            sizes[state] = (idx.space_total_now(state) or 0) if loading else idx.space_total(state)
        else:
            sizes[state] = None
    rates = _rates(now)
    steps = []
    for state in WAITING:
        per_hour = rates.recent.get(state.lower(), 0) / WINDOW_HOURS
        jobs = counts[state]
        steps.append(
            StepBacklog(
                state=state,
                jobs=jobs,
                bytes=sizes[state],
                per_hour=per_hour,
                drain_seconds=jobs / per_hour * 3600 if per_hour > 0 else None,
            )
        )
    unestimated = counts[JobState.PENDING] + counts[JobState.ESTIMATING]
    return Backlog(
        steps=steps,
        hour_labels=rates.labels,
        finished_per_hour=rates.finished,
        rate_per_hour=rates.recent.get(FINAL_STEP, 0) / WINDOW_HOURS,
        disk=_disk(sizes[JobState.PROVISIONING] or 0, unestimated),
        loading=loading,
        history_error=rates.error,
    )


def as_json(b: Backlog) -> dict[str, Any]:
    """The backlog for ``/api/overview``."""
    disk = b.disk
    return {
        "steps": [
            {
                "state": s.state,
                "jobs": s.jobs,
                "bytes": s.bytes,
                "done_per_hour": round(s.per_hour, 2),
                "drain_seconds": None if s.drain_seconds is None else round(s.drain_seconds),
            }
            for s in b.steps
        ],
        "waiting_jobs": b.waiting_jobs,
        "waiting_bytes": b.waiting_bytes,
        "finished_per_hour": dict(zip(b.hour_labels, b.finished_per_hour, strict=False)),
        "finished_last_day": b.finished_last_day,
        "rate_per_hour": round(b.rate_per_hour, 2),
        "rate_window_hours": WINDOW_HOURS,
        "drain_seconds": None if b.drain_seconds is None else round(b.drain_seconds),
        "bottleneck": b.bottleneck.state if b.bottleneck else None,
        "disk": None
        if disk is None
        else {
            "path": disk.path,
            "total": disk.total,
            "free": disk.free,
            "high_water": disk.high_water,
            "room": disk.room,
            "to_provision": disk.to_provision,
            "unestimated_jobs": disk.unestimated,
            "fits": disk.fits,
        },
        "loading": b.loading,
        "history_error": b.history_error or None,
    }
