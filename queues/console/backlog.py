"""The backlog ahead: what waits in each step, how fast each step is going now, when the
current backlog will be through at that pace (or what keeps it), and whether the working disk
holds what is waiting.

Counts and bytes come from the read index (per state, kept current by watches; bytes are the
estimates of jobs from Estimating on, summed once per folder change); what keeps jobs waiting
from ``queues/console/waits.py``; the disk from the working folder's file system. Nothing here walks
jobs.

**The pace** of a step (issue 53) is measured on its latest runs in the step history (at most
``PACE_SAMPLE`` of the last ``PACE_WINDOW``): the runs that took an item out of the step (done,
held or failed) over the time the step was at work, the union of the runs' own spans with every
pause longer than ``PACE_GAP`` left out. Hours the consumers were down, or idle with nothing to
do, do not dilute it; a step that has done nothing in the window has no pace.

**The forecast** is for the jobs that can move: those a hold or a full cap keeps are named
instead ("blocked: node 9501 held", "capped: campaign_scans 10/10", "waiting for a breaker").
Every job waiting in a step or before it must still pass that step, so a step needs (jobs at or
before it) / (its pace); the backlog is through when the slowest of these is (``forecast``).
``bench/forecast_replay.py`` measures the error against replayed runs (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from queues.console import waits
from queues.core import clock
from queues.core.states import JOB_STEPS, JOB_WORKING, JobState
from queues.models import StepRecord
from queues.operator import history
from queues.steps.workdisk import provision_room
from queues.zk import index as zindex
from queues.zk.client import connected_client

log = logging.getLogger(__name__)

PACE_WINDOW = timedelta(minutes=30)  # the runs a pace is measured on: at most this old ...
PACE_SAMPLE = 500  # ... and at most this many, the latest, per step
PACE_GAP = 60.0  # s: a pause between runs longer than this is no work time (idle, or down)
MIN_SPAN = 1.0  # s: the least work time a stretch of runs counts for
STALL_SECONDS = 300.0  # a step with jobs and no run ended for this long is said to be idle
WINDOW_MINUTES = int(PACE_WINDOW.total_seconds() // 60)
DAY_HOURS = 24
CACHE_SECONDS = 30.0
FINAL_STEP = JobState.NOTIFY.lower()  # a job whose notify step is done has finished the pipeline
WAITING = JOB_STEPS[:-1]  # Pending .. Notify: jobs not through yet


@dataclass(frozen=True)
class Pace:
    """How fast one step went while it was at work lately."""

    step: str
    done: int  # runs that took an item out of the step
    busy_seconds: float  # the time the step was at work over them
    last_end: float | None = None  # when the latest of them ended (seconds since the epoch)

    @property
    def per_hour(self) -> float:
        if self.done <= 0 or self.busy_seconds <= 0:
            return 0.0
        return self.done / self.busy_seconds * 3600


def pace_of(step: str, runs: Iterable[tuple[float, float]], *, gap: float = PACE_GAP) -> Pace:
    """The pace of ``step`` from its runs, each (start, seconds it took) with starts in
    seconds since the epoch: runs closer than ``gap`` to the stretch before them extend it,
    and the pace is the runs over the stretches' length (each at least ``MIN_SPAN``)."""
    ordered = sorted((float(start), max(0.0, float(took))) for start, took in runs)
    busy = 0.0
    first: float | None = None
    last = 0.0
    for start, took in ordered:
        if first is None or start > last + gap:
            if first is not None:
                busy += max(MIN_SPAN, last - first)
            first, last = start, start + took
        else:
            last = max(last, start + took)
    if first is not None:
        busy += max(MIN_SPAN, last - first)
    ends = [start + took for start, took in ordered]
    return Pace(
        step=step, done=len(ordered), busy_seconds=busy, last_end=max(ends) if ends else None
    )


@dataclass(frozen=True)
class Forecast:
    """When the jobs that can move will be through, and what keeps the others."""

    seconds: float | None  # None: nothing can move, or a step they need has no pace
    bottleneck: str | None  # the step whose pace sets ``seconds``
    no_pace: str | None  # the first step that jobs must pass and that has no recent pace
    moving: int  # jobs the estimate is for
    blocked: list[waits.Wait] = field(default_factory=list)
    # Steps with jobs of their own to pass whose last run ended more than STALL_SECONDS ago:
    # (state, seconds since). The pace is of the time they were at work; while none is (the
    # consumers down, a run far longer than usual) the time left grows and this says so.
    stalled: list[tuple[str, float]] = field(default_factory=list)

    @property
    def kept(self) -> int:
        return sum(w.jobs for w in self.blocked)

    @property
    def nothing_waits(self) -> bool:
        return not self.moving and not self.blocked


def forecast(
    counts: Mapping[str, int],
    blocked: Sequence[waits.Wait],
    paces: Mapping[str, Pace],
    *,
    now: float | None = None,
) -> Forecast:
    """The backlog through, from the jobs waiting per state, those a hold or cap keeps, and
    each step's pace (by step name: the state in lower case); with ``now`` (seconds since the
    epoch), also the steps that have done nothing for a while (``Forecast.stalled``)."""
    kept: dict[str, int] = {}
    for wait in blocked:
        kept[wait.state] = kept.get(wait.state, 0) + wait.jobs
    ahead = 0
    worst: tuple[float, str] | None = None
    no_pace = None
    stalled: list[tuple[str, float]] = []
    for state in WAITING:
        own = max(0, (counts.get(state) or 0) - kept.get(state, 0))
        ahead += own
        if not ahead:
            continue
        pace = paces.get(state.lower())
        last = pace.last_end if pace else None
        if own and now is not None and last is not None and now - last > STALL_SECONDS:
            stalled.append((str(state), now - last))
        rate = pace.per_hour if pace else 0.0
        if rate <= 0:
            no_pace = no_pace or state
            continue
        need = ahead / rate * 3600
        if worst is None or need > worst[0]:
            worst = (need, state)
    return Forecast(
        seconds=None if no_pace or worst is None else worst[0],
        bottleneck=worst[1] if worst and not no_pace else None,
        no_pace=no_pace,
        moving=ahead,
        blocked=list(blocked),
        stalled=stalled,
    )


@dataclass(frozen=True)
class StepBacklog:
    state: str
    jobs: int
    bytes: int | None  # None: not estimated yet (Pending, Estimating)
    per_hour: float  # the step's pace while at work lately (``Pace``)
    drain_seconds: float | None  # jobs / per_hour; None when the step did nothing lately
    waits: list[waits.Wait] = field(default_factory=list)  # jobs here a hold or cap keeps

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
    rate_per_hour: float  # jobs through their last step per hour, at its pace lately
    disk: Disk | None
    loading: bool  # the read index still fills: counts and bytes are what is read so far
    history_error: str = ""  # the step history could not be read: no pace, no estimate
    forecast: Forecast | None = None
    waits_error: str = ""  # the holds could not be read: the forecast takes every job as moving
    hour_starts: list[int] = field(default_factory=list)  # hours since the epoch, as hour_labels

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
        """The jobs that can move through at the recent pace; None when there is no estimate
        (nothing can move, or a step they need did nothing lately)."""
        return self.forecast.seconds if self.forecast else None

    @property
    def bottleneck(self) -> StepBacklog | None:
        name = self.forecast.bottleneck if self.forecast else None
        return next((s for s in self.steps if s.state == name), None)


@dataclass(frozen=True)
class _Rates:
    labels: list[str]
    finished: list[int]
    paces: dict[str, Pace]  # step -> its pace lately
    error: str = ""  # the step history could not be read: no pace, no estimate
    starts: list[int] = field(default_factory=list)  # hours since the epoch, as labels


_cache: tuple[float, _Rates] | None = None
_cache_lock = threading.Lock()


def _rates(now: datetime | None = None) -> _Rates:
    """Each step's pace lately, and finished jobs per hour over the day (cached)."""
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
        return _Rates(labels=[], finished=[], paces={}, error=str(exc) or type(exc).__name__)


def _read_rates(when: datetime, *, cache: bool, clock: float) -> _Rates:
    global _cache
    day = history.throughput("24h", "hour", now=when)
    finished = next((s.done for s in day.steps if s.step == FINAL_STEP), [0] * len(day.starts))
    paces: dict[str, Pace] = {}
    for state in WAITING:
        step = state.lower()
        runs = (
            StepRecord.objects.filter(
                kind="job",
                step=step,
                started__gte=when - PACE_WINDOW,
                started__lte=when,
                outcome__in=history.RAN,
            )
            .order_by("-started")
            .values_list("started", "duration")[:PACE_SAMPLE]
        )
        paces[step] = pace_of(step, ((s.timestamp(), d) for s, d in runs))
    rates = _Rates(
        labels=day.labels[-DAY_HOURS:],
        finished=finished[-DAY_HOURS:],
        paces=paces,
        starts=day.starts[-DAY_HOURS:],
    )
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
    waits_error = ""
    try:
        kept = waits.waits()
    except Exception as exc:  # the backlog still shows; it says the holds were not read
        log.warning("backlog: holds not read: %s", exc)
        kept, waits_error = [], str(exc) or type(exc).__name__
    grouped = waits.by_state(kept)
    steps = []
    for state in WAITING:
        pace = rates.paces.get(state.lower())
        per_hour = pace.per_hour if pace else 0.0
        jobs = counts[state]
        steps.append(
            StepBacklog(
                state=state,
                jobs=jobs,
                bytes=sizes[state],
                per_hour=per_hour,
                drain_seconds=jobs / per_hour * 3600 if per_hour > 0 else None,
                waits=grouped.get(state, []),
            )
        )
    unestimated = counts[JobState.PENDING] + counts[JobState.ESTIMATING]
    final = rates.paces.get(FINAL_STEP)
    return Backlog(
        steps=steps,
        hour_labels=rates.labels,
        hour_starts=rates.starts,
        finished_per_hour=rates.finished,
        rate_per_hour=final.per_hour if final else 0.0,
        disk=_disk(sizes[JobState.PROVISIONING] or 0, unestimated),
        loading=loading,
        history_error=rates.error,
        forecast=forecast(
            {str(k): v for k, v in counts.items()},
            kept,
            rates.paces,
            now=(now or datetime.now(UTC)).timestamp(),
        ),
        waits_error=waits_error,
    )


def as_json(b: Backlog) -> dict[str, Any]:
    """The backlog for ``/api/overview``."""
    disk = b.disk
    f = b.forecast
    return {
        "steps": [
            {
                "state": s.state,
                "jobs": s.jobs,
                "bytes": s.bytes,
                "done_per_hour": round(s.per_hour, 2),
                "drain_seconds": None if s.drain_seconds is None else round(s.drain_seconds),
                "waits": [w.as_json() for w in s.waits],
            }
            for s in b.steps
        ],
        "waiting_jobs": b.waiting_jobs,
        "waiting_bytes": b.waiting_bytes,
        # Keyed by each hour's start in the API's one ISO form.
        "finished_per_hour": {
            clock.exact(datetime.fromtimestamp(h * 3600, UTC)): n
            for h, n in zip(b.hour_starts, b.finished_per_hour, strict=False)
        },
        "finished_last_day": b.finished_last_day,
        "rate_per_hour": round(b.rate_per_hour, 2),
        "pace_window_minutes": WINDOW_MINUTES,
        "drain_seconds": None if b.drain_seconds is None else round(b.drain_seconds),
        "bottleneck": b.bottleneck.state if b.bottleneck else None,
        "forecast": None
        if f is None
        else {
            "seconds": None if f.seconds is None else round(f.seconds),
            "jobs": f.moving,
            "bottleneck": f.bottleneck,
            "no_pace": f.no_pace,
            "kept": f.kept,
            "blocked": [w.as_json() for w in f.blocked],
            "stalled": [{"state": st, "seconds": round(sec)} for st, sec in f.stalled],
            "words": forecast_words(f),
        },
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
        "waits_error": b.waits_error or None,
    }


def forecast_words(f: Forecast) -> str:
    """The forecast in one line, as the overview's card says it: "" when nothing waits."""
    if f.nothing_waits:
        return ""
    parts = []
    if f.moving:
        if f.seconds is not None:
            parts.append(
                f"{f.moving} job{'s' if f.moving != 1 else ''} through in "
                f"{history.fmt_seconds(f.seconds)} (slowest step: {f.bottleneck})"
            )
        else:
            parts.append(
                f"{f.moving} job{'s' if f.moving != 1 else ''}: no estimate, {f.no_pace} did "
                f"nothing in the last {WINDOW_MINUTES} min"
            )
    parts += [f"{w.jobs} {w.state}: {w.words}" for w in f.blocked]
    parts += [f"no {st} run has ended for {history.fmt_seconds(sec)}" for st, sec in f.stalled]
    return "; ".join(parts)
