"""The consistency check as background work: runs recorded in the database, walked by a daemon.

A walk over a million jobs takes minutes; held in a web request it took the web process to
5 GB. Instead, an admin's "Check now" (or ``POST /api/consistency`` with ``check``) records a
``ConsistencyRun``; the ``consistency`` consumer daemon (``runconsumer consistency``, part of
``all``; queues/daemons/consistency.py) claims it and walks the tree with ``queues.operator.check``
in bounded memory, writing its progress twice a second and its findings to the database in
batches as it finds them. The page polls the run and pages its findings; repair works from the
findings kept (each one looked at again first). ``manage.py queuecheck`` records a run the same
way and walks it in its own process.

One run at a time, on any host: a partial unique index lets the database hold only one running
row, so a second start (another browser, another host, the command line) gets the run already
going. A run whose walker died stops sending heartbeats; the next start marks it failed and
begins a new one. An outage (ZooKeeper or the database away) does not fail a run: the walker
waits and walks again from the start, the findings so far discarded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from queues.core import clock, transient
from queues.models import ConsistencyFinding, ConsistencyRun, db_now
from queues.operator import check, check_findings, check_repairs
from queues.services.deployment import beside_merritt
from queues.zk.client import Client
from queues.zk.errors import Conflict, is_connection_error

log = logging.getLogger("queues.operator.consistency")

SAVE_EVERY = 0.5  # seconds between two progress writes (also the run's heartbeat)
WRITE_BATCH = 500  # findings written to the database at once
KEEP_RUNS = 5  # finished runs kept with their findings; older ones are deleted
PAGE_SIZE = 50


class Lost(Exception):
    """The run is no longer this walker's (marked failed as interrupted, or deleted)."""


class Interrupted(Exception):
    """An outage stopped the walk; the run stays running and owned, and is walked again."""


def outage_reason(exc: BaseException) -> str | None:
    if transient.is_transient(exc):
        return transient.reason(exc)
    if is_connection_error(exc):
        detail = " ".join((str(exc).strip() or type(exc).__name__).split())
        return f"ZooKeeper unavailable: {detail}"
    return None


# Starting and claiming ---------------------------------------------------------------------


def running() -> ConsistencyRun | None:
    return ConsistencyRun.objects.filter(state=ConsistencyRun.RUNNING).first()


def latest() -> ConsistencyRun | None:
    return ConsistencyRun.objects.first()


def start(*, user: Any, via: str = "web", owner: str = "") -> tuple[ConsistencyRun, bool]:
    """Record a run (claimed at once by ``owner`` when given); (the run, True), or the run
    already going and False. A running run whose walker has gone is failed first."""
    current = running()
    if current is not None and current.interrupted:
        ConsistencyRun.objects.filter(pk=current.pk, heartbeat=current.heartbeat).update(
            state=ConsistencyRun.FAILED,
            error="interrupted: the process walking it has gone",
            finished=timezone.now(),
        )
    _prune()
    try:
        with transaction.atomic():
            run = ConsistencyRun.objects.create(
                user=user if getattr(user, "pk", None) else None,
                via=via,
                owner=owner,
                heartbeat=db_now(),
            )
    except IntegrityError:
        existing = running()
        if existing is None:  # ended between the insert and this look: try once more
            return start(user=user, via=via, owner=owner)
        return existing, False
    return run, True


def _prune() -> None:
    old = ConsistencyRun.objects.exclude(state=ConsistencyRun.RUNNING).values_list("pk", flat=True)
    stale = list(old[KEEP_RUNS:])
    if stale:
        ConsistencyRun.objects.filter(pk__in=stale).delete()


def claim(owner: str) -> ConsistencyRun | None:
    """The waiting run, now ``owner``'s; None when none waits (or another walker took it)."""
    waiting = ConsistencyRun.objects.filter(state=ConsistencyRun.RUNNING, owner="").first()
    if waiting is None:
        return None
    taken = ConsistencyRun.objects.filter(pk=waiting.pk, owner="").update(
        owner=owner, heartbeat=db_now()
    )
    return ConsistencyRun.objects.get(pk=waiting.pk) if taken else None


# Walking -----------------------------------------------------------------------------------


class _Recorder:
    """The walk's sink and progress: findings written in batches, progress every SAVE_EVERY
    seconds, both only while the run is still this walker's."""

    def __init__(self, run: ConsistencyRun, owner: str, say: Callable[[str], None]) -> None:
        self.run = run
        self.owner = owner
        self.say = say
        self.batch: list[ConsistencyFinding] = []
        self.kinds: dict[str, int] = {}
        self.count = 0
        self.repairable = 0
        self.saved = 0.0
        self.progress: check_findings.Progress | None = None

    def add(self, finding: check_findings.Finding) -> None:
        self.count += 1
        self.repairable += finding.repairable
        self.kinds[finding.kind] = self.kinds.get(finding.kind, 0) + 1
        self.batch.append(
            ConsistencyFinding(
                run_id=self.run.pk,
                kind=finding.kind,
                path=finding.path,
                detail=finding.detail,
                repairable=finding.repairable,
                session=finding.session,
                czxid=finding.czxid,
                owner=finding.owner,
                advice=finding.advice,
                seen=list(finding.seen),
            )
        )
        if len(self.batch) >= WRITE_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            ConsistencyFinding.objects.bulk_create(self.batch)
            self.batch = []

    def step(self, progress: check_findings.Progress) -> None:
        self.progress = progress
        now = time.monotonic()
        if now - self.saved >= SAVE_EVERY:
            self.save()
            self.say(str(progress))

    def save(self, **final: Any) -> None:
        self.flush()
        progress = self.progress
        fields: dict[str, Any] = {
            "findings": self.count,
            "repairable": self.repairable,
            "kinds": dict(sorted(self.kinds.items())),
            "heartbeat": db_now(),
            "error": "",
        }
        if progress is not None:
            fields.update(phase=progress.phase[:200], done=progress.done, total=progress.total)
        fields.update(final)
        mine = ConsistencyRun.objects.filter(
            pk=self.run.pk, owner=self.owner, state=ConsistencyRun.RUNNING
        )
        if not mine.update(**fields):
            raise Lost(f"consistency check {self.run.pk} is no longer walked by {self.owner}")
        self.saved = time.monotonic()


def walk(
    run: ConsistencyRun,
    zk: Client,
    *,
    owner: str,
    say: Callable[[str], None] = lambda _line: None,
    stale_lock_seconds: float = 6 * 3600,
    chunk: int = check.CHUNK,
) -> ConsistencyRun:
    """Walk the tree for ``run`` (owned by ``owner``), keeping its findings and progress.

    An outage raises Interrupted (the run stays running, its findings so far gone, to be walked
    again); anything else fails the run and is raised."""
    recorder = _Recorder(run, owner, say)
    recorder.save()  # Lost unless the run is still this walker's: its findings are not ours
    ConsistencyFinding.objects.filter(run=run).delete()  # those of a walk an outage cut short
    try:
        report = check.run_check(
            zk,
            stale_lock_seconds=stale_lock_seconds,
            progress=recorder.step,
            sink=recorder.add,
            chunk=chunk,
            beside_merritt=beside_merritt(),
        )
        recorder.save(
            state=ConsistencyRun.FINISHED,
            phase="done",
            jobs=report.jobs,
            batches=report.batches,
            index_entries=report.index_entries,
            finished=timezone.now(),
        )
    except Lost:
        raise
    except Exception as exc:
        why = outage_reason(exc)
        if why is None:
            log.exception("consistency check %s failed", run.pk)
            ConsistencyRun.objects.filter(pk=run.pk, owner=owner).update(
                state=ConsistencyRun.FAILED,
                error=str(exc) or type(exc).__name__,
                finished=timezone.now(),
            )
            raise
        _show_outage(run, owner, why)
        raise Interrupted(f"consistency check {run.pk} waits: {why}") from exc
    say(f"done: {recorder.count} findings")
    return ConsistencyRun.objects.get(pk=run.pk)


def _show_outage(run: ConsistencyRun, owner: str, why: str) -> None:
    """Say on the run why it waits (when the database can take it)."""
    try:
        ConsistencyRun.objects.filter(pk=run.pk, owner=owner).update(
            error=f"waiting: {why}; the walk starts again once it is back",
            heartbeat=db_now(),
        )
    except Exception as exc:
        if outage_reason(exc) is None:
            raise


# Reading and repairing ---------------------------------------------------------------------


def findings_page(
    run: ConsistencyRun, *, kind: str = "", page: int = 1
) -> tuple[list[ConsistencyFinding], bool]:
    """One page of the run's findings (of ``kind``), and whether there is a next page."""
    rows = ConsistencyFinding.objects.filter(run=run)
    if kind:
        rows = rows.filter(kind=kind)
    first = (max(page, 1) - 1) * PAGE_SIZE
    found = list(rows.order_by("id")[first : first + PAGE_SIZE + 1])
    return found[:PAGE_SIZE], len(found) > PAGE_SIZE


def as_finding(row: ConsistencyFinding) -> check_findings.Finding:
    return check_findings.Finding(
        kind=row.kind,
        path=row.path,
        detail=row.detail,
        repairable=row.repairable,
        session=row.session,
        czxid=row.czxid,
        owner=row.owner,
        advice=row.advice,
        seen=tuple(row.seen or ()),
    )


def _repairable_rows(run: ConsistencyRun, *, stale_locks: bool) -> Iterator[ConsistencyFinding]:
    """The run's findings repair acts on, a batch at a time (never all of them in memory)."""
    rows = ConsistencyFinding.objects.filter(run=run).exclude(owner=check_findings.MERRITT)
    if stale_locks:
        rows = rows.filter(repairable=True) | rows.filter(kind="stale-lock")
    else:
        rows = rows.filter(repairable=True)
    last = 0
    while True:
        part = list(rows.filter(id__gt=last).order_by("id")[:WRITE_BATCH])
        if not part:
            return
        yield from part
        last = part[-1].id


def repair(run: ConsistencyRun, zk: Client, *, break_stale_locks: bool = False) -> list[str]:
    """Repair the run's repairable findings (each looked at again first); every change made,
    also kept on its finding's row."""
    beside = beside_merritt()
    lines: list[str] = []
    for row in _repairable_rows(run, stale_locks=break_stale_locks):
        line = check_repairs.repair_one(
            zk, as_finding(row), break_stale_locks=break_stale_locks, beside_merritt=beside
        )
        row.repair = line or "nothing to do: already right"
        row.save(update_fields=["repair"])
        if line:
            lines.append(line)
    ConsistencyRun.objects.filter(pk=run.pk).update(repaired=timezone.now())
    return lines


def repair_latest(zk: Client) -> tuple[ConsistencyRun, list[str]]:
    """Repair from the findings of the latest finished run (the one the page shows)."""
    run = ConsistencyRun.objects.filter(state=ConsistencyRun.FINISHED).first()
    if run is None:
        raise Conflict("no finished consistency check to repair from: run the check first")
    return run, repair(run, zk)


def run_dict(run: ConsistencyRun | None, *, kind: str = "", page: int = 1) -> dict[str, Any]:
    """A run and one page of its findings, as ``/api/consistency`` answers."""
    if run is None:
        return {"run": None, "findings": [], "next_page": None}
    rows, more = findings_page(run, kind=kind, page=page)
    return {
        "run": {
            "id": run.pk,
            "state": run.shown_state,
            "phase": run.phase,
            "done": run.done,
            "total": run.total,
            "started": clock.exact(run.started),
            "finished": clock.exact(run.finished) or None,
            "jobs": run.jobs,
            "batches": run.batches,
            "index_entries": run.index_entries,
            "findings": run.findings,
            "repairable": run.repairable,
            "kinds": run.kinds,
            "error": run.error,
        },
        "ok": run.state == ConsistencyRun.FINISHED and not run.findings,
        "findings": [
            {
                "kind": f.kind,
                "path": f.path,
                "detail": f.detail,
                "repairable": f.repairable,
                "owner": f.owner,
                "advice": f.advice,
                "repair": f.repair,
            }
            for f in rows
        ],
        "next_page": page + 1 if more else None,
    }
