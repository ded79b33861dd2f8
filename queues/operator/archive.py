"""Retention: finished batches and their jobs archived out of ZooKeeper into the database.

ZooKeeper is a coordination service, not an archive. A batch that is finished (Completed,
Failed or Deleted) and all of whose jobs are finished (Completed, Failed or Deleted), none of
them locked and none changed for at least ``MRT_RETENTION_DAYS``, is

1. written to the database: one ``ArchivedBatch`` row and one ``ArchivedJob`` row per job (ids,
   profile, submitter, ARK, local ids, title, the states it went through with the times
   ZooKeeper knows, the audit log's actions on it, retries, final state and message), in one
   committed transaction, keyed by the IDs (``update_or_create``: archiving the same batch again
   after a crash between the two steps updates the same rows, never duplicates them);
2. then removed from ZooKeeper by the existing removers, in the contract's delete order: each
   job in its own transaction (``job_remove``: checked against the status version that was
   archived, refused while locked), then the batch's own nodes and its ``/batch-uuids`` entry in
   one transaction (``batch_remove``).

Nothing live moves to the database: only items that are finished, after they are finished. An
item that changed between the two steps (an operator resumed a job, a consumer locked it) stops
the batch's removal; its row is dropped again while it lives on in ZooKeeper, so the console
shows ZooKeeper's version, and the next sweep archives it once it has finished again.

The console reads archived items through ``archived_job``, ``archived_batch`` and
``archived_jobs_matching`` (exact job ID, batch ID, ARK or local ID, all indexed columns); the
header search through ``archived_jobs_search`` and ``archived_batches_search`` (every field,
in any case, by prefix or part).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from queues.core import clock
from queues.core.states import JOB_STEPS, JobState
from queues.steps.uploads import remove_uploads
from queues.zk import paths as zpaths
from queues.zk.batches import (
    BEING_DELETED,
    batch_ids,
    batch_job_ids,
    batch_load,
    batch_remove,
    batch_states,
    report_resolve,
)
from queues.zk.client import client
from queues.zk.codecs import parse_stamp
from queues.zk.errors import (
    Conflict,
    ItemLocked,
    MalformedNode,
    NotFound,
    StoppedPartway,
    is_connection_error,
)
from queues.zk.jobs import jobs_load
from queues.zk.records import Batch, Broken, Job
from queues.zk.servertime import server_moment

log = logging.getLogger("queues.operator.archive")

FINISHED = (JobState.COMPLETED, JobState.FAILED, JobState.DELETED)
# What a sweep says of a batch whose removal stopped part-way.
PARTWAY = "stopped part-way"
LOAD_CHUNK = 500
SEARCH_LIMIT = 200


@dataclass(frozen=True)
class ArchiveOutcome:
    """What one batch's archiving did: ``archived`` (rows written and nodes removed) or
    ``left alone`` with the reason."""

    bid: str
    state: str
    done: bool
    jobs: int = 0
    detail: str = ""
    seconds: float = 0.0
    # Its removal stopped after its first write: the batch is marked Deleted with ``jobs`` of
    # its jobs removed (``detail`` says which); the next sweep finishes it. ``cause``: what
    # stopped it (ZooKeeper lost ends the sweep after this batch).
    partway: bool = False
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        if self.done:
            text = f"batch {self.bid}: {self.state}, archived with {self.jobs} jobs"
            text += " and removed from ZooKeeper"
        elif self.partway:
            text = f"batch {self.bid}: {self.state} -> Deleted, {PARTWAY}: {self.detail}"
        else:
            text = f"batch {self.bid}: {self.state}, left alone: {self.detail}"
        return f"{text} ({self.seconds:.2f}s)"


def retention_age() -> timedelta:
    days = float(settings.MRT_RETENTION_DAYS)
    if days < 0:
        raise ValueError(f"MRT_RETENTION_DAYS must not be negative, got {days:g}")
    return timedelta(days=days)


# Reading what the console shows ---------------------------------------------------------------


def archived_job(jid: str) -> Any:
    """The archived row of ``jid``, or None."""
    from queues.models import ArchivedJob

    return ArchivedJob.objects.filter(jid=jid).first()


def archived_batch(bid: str) -> Any:
    from queues.models import ArchivedBatch

    return ArchivedBatch.objects.filter(bid=bid).first()


def archived_batch_jobs(bid: str) -> list[Any]:
    from queues.models import ArchivedJob

    return list(ArchivedJob.objects.filter(bid=bid).order_by("jid"))


def archived_jobs_matching(q: str, *, limit: int = SEARCH_LIMIT) -> list[Any]:
    """Archived jobs whose job ID, batch ID, ARK or one local ID is exactly ``q``.

    Every comparison is on an indexed column, so it costs the same with millions of rows.
    """
    from django.db.models import Q

    from queues.models import ArchivedJob

    q = (q or "").strip()
    if not q:
        return []
    query = Q(jid=q) | Q(bid=q) | Q(primary_id=q) | Q(local_id_rows__value=q)
    return list(ArchivedJob.objects.filter(query).distinct().order_by("-jid")[:limit])


def job_json(row: Any) -> dict[str, Any]:
    """The API's answer for an archived job (``"archived": true``)."""
    return {
        "id": row.jid,
        "archived": True,
        "archived_at": clock.exact(row.archived_at),
        "batch": row.bid,
        "state": row.final_state,
        "profile": row.profile,
        "submitter": row.submitter,
        "primary_id": row.primary_id,
        "local_ids": row.local_ids,
        "title": row.title,
        "message": row.final_message,
        "last_successful_status": row.last_successful_status or None,
        "retry_count": row.retry_count,
        "created": clock.exact(row.created) or None,
        "last_modified": clock.exact(row.last_modified) or None,
        "states": row.states,
        "audit": row.audit,
        "nodes": row.nodes,
        "locked": False,
    }


def batch_json(row: Any) -> dict[str, Any]:
    return {
        "id": row.bid,
        "archived": True,
        "archived_at": clock.exact(row.archived_at),
        "uuid": row.batch_uuid,
        "state": row.final_state,
        "message": row.final_message,
        "profile": row.profile,
        "submitter": row.submitter,
        "title": row.title,
        "created": clock.exact(row.created) or None,
        "last_modified": clock.exact(row.last_modified) or None,
        "report_modified": clock.exact(row.report_modified) or None,
        "successful_jobs": row.successful_jobs,
        "failed_jobs": row.failed_jobs,
        "jobs": row.job_ids,
    }


# Writing the rows -----------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _iso(value: datetime | None) -> str | None:
    return clock.exact(value) or None if value is not None else None


def states_through(job: Job) -> list[dict[str, Any]]:
    """The states the job went through as far as ZooKeeper knows: Pending at its creation, the
    steps up to its last successful one and, for a failure, the step it failed in (ZooKeeper
    keeps no time for those), and its final state at its status's last modification."""
    last = job.status.last_successful_status
    final = job.state
    passed: list[str]
    if final == JobState.COMPLETED:
        passed = list(JOB_STEPS[:-1])
    elif last in JOB_STEPS:
        passed = list(JOB_STEPS[: JOB_STEPS.index(last) + 1])
    else:
        passed = [JobState.PENDING]
    if passed[:1] != [JobState.PENDING]:
        passed.insert(0, JobState.PENDING)
    if final == JobState.FAILED and last in JOB_STEPS[:-2]:
        passed.append(JOB_STEPS[JOB_STEPS.index(last) + 1])  # the step it failed in
    result = [{"state": JobState.PENDING.value, "at": _iso(job.created)}]
    result += [{"state": s, "at": None} for s in passed[1:]]
    result.append({"state": final, "at": _iso(job.status.last_modified)})
    return result


def _audit(item_id: str) -> list[dict[str, Any]]:
    from queues.operator.audit import AuditEntry

    return [
        {
            "at": clock.exact(e.at),
            "user": e.username,
            "action": e.action,
            "before": e.before,
            "after": e.after,
            "reason": e.reason,
            "ok": e.ok,
        }
        for e in AuditEntry.objects.filter(item_id=item_id).order_by("at", "id")
    ]


def _local_ids(job: Job) -> list[str]:
    found = list(job.local_ids)
    for key in ("localID", "localId", "local_id"):
        value = job.configuration.get(key)
        if isinstance(value, str) and value and value not in found:
            found.append(value)
    return [v[:255] for v in found]


def _primary_id(job: Job) -> str:
    return (
        job.primary_id
        or _text(job.configuration.get("primaryID"))
        or _text(job.configuration.get("objectID"))
    )[:255]


def _job_title(job: Job) -> str:
    return _text(job.configuration.get("title")) or _text((job.metadata or {}).get("erc_what"))


def _job_defaults(job: Job, now: datetime) -> dict[str, Any]:
    return {
        "bid": job.bid,
        "profile": job.profile[:255],
        "submitter": job.submitter[:255],
        "primary_id": _primary_id(job),
        "title": _job_title(job),
        "final_state": job.state[:40],
        "final_message": job.status.message,
        "last_successful_status": (job.status.last_successful_status or "")[:40],
        "retry_count": job.status.retry_count,
        "created": job.created,
        "last_modified": job.status.last_modified,
        "states": states_through(job),
        "audit": _audit(job.jid),
        "local_ids": _local_ids(job),
        "nodes": {
            "configuration": job.configuration,
            "status": job.status.raw,
            "identifiers": job.identifiers,
            "metadata": job.metadata,
            "store": job.store,
            "inventory": job.inventory,
            "priority": job.priority,
            "space_needed": job.space_needed,
        },
        "archived_at": now,
    }


def _clean(value: Any) -> Any:
    """``value`` with every NUL character replaced: PostgreSQL stores none, in text or JSON,
    and a depositor's title may carry one."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _id_list(report: dict[str, Any] | None, key: str) -> list[str]:
    value = (report or {}).get(key)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _batch_defaults(batch: Batch, jobs: list[Job], now: datetime) -> dict[str, Any]:
    report = batch.report
    return {
        "batch_uuid": batch.uuid[:255],
        "profile": batch.profile[:255],
        "submitter": batch.submitter[:255],
        "title": batch.title,
        "final_state": batch.state[:40],
        "final_message": batch.status.message,
        "created": batch.created,
        "last_modified": batch.status.last_modified,
        "report_modified": parse_stamp((report or {}).get("last_modified")),
        "successful_jobs": _id_list(report, "successful_jobs"),
        "failed_jobs": _id_list(report, "failed_jobs"),
        "submission": batch.submission,
        "status": batch.status.raw,
        "status_report": report,
        "job_ids": [j.jid for j in jobs],
        "archived_at": now,
    }


def write_rows(batch: Batch, jobs: list[Job]) -> None:
    """Write (or rewrite) the batch's and its jobs' rows in one committed transaction."""
    from queues.models import ArchivedJob, ArchivedLocalId

    now = timezone.now()
    for attempt in range(2):
        try:
            with transaction.atomic():
                _write_batch_row(batch, jobs, now)
                for job in jobs:
                    row, _ = ArchivedJob.objects.update_or_create(
                        jid=job.jid, defaults=_clean(_job_defaults(job, now))
                    )
                    row.local_id_rows.exclude(value__in=row.local_ids).delete()
                    have = set(row.local_id_rows.values_list("value", flat=True))
                    ArchivedLocalId.objects.bulk_create(
                        [ArchivedLocalId(job=row, value=v) for v in row.local_ids if v not in have]
                    )
            return
        except IntegrityError:
            # Another archiver wrote the same rows a moment ago: the second try updates them.
            if attempt:
                raise


def _write_batch_row(batch: Batch, jobs: list[Job], now: datetime) -> None:
    from queues.models import ArchivedBatch

    row = ArchivedBatch.objects.filter(bid=batch.bid).first()
    # Jobs removed before a crash or a stop are no longer listed by the batch: keep them.
    job_ids = sorted(set(row.job_ids or []) | {j.jid for j in jobs}) if row else []
    if row is not None and _being_removed(batch):
        # Marked Deleted by the archive's own removal, which stopped part-way: the row keeps
        # what was archived before the mark (its state, message and report).
        row.job_ids = job_ids
        row.save(update_fields=["job_ids"])
        return
    defaults = _clean(_batch_defaults(batch, jobs, now))
    if row is not None:
        defaults["job_ids"] = job_ids
    ArchivedBatch.objects.update_or_create(bid=batch.bid, defaults=defaults)


def _being_removed(batch: Batch) -> bool:
    """Marked Deleted by a removal (``batch_remove``) that stopped part-way."""
    return batch.state == JobState.DELETED and batch.status.message == BEING_DELETED


def _archived_before(bid: str) -> bool:
    from queues.models import ArchivedBatch

    return ArchivedBatch.objects.filter(bid=bid).exists()


def _drop_rows(bid: str | None, jids: list[str]) -> None:
    from queues.models import ArchivedBatch, ArchivedJob

    with transaction.atomic():
        if jids:
            ArchivedJob.objects.filter(jid__in=jids).delete()
        if bid:
            ArchivedBatch.objects.filter(bid=bid).delete()


# Sweeping ZooKeeper ---------------------------------------------------------------------------


class LeftAlone(Exception):
    pass


def _finished_jobs(zk: Any, batch: Batch, cutoff: datetime) -> list[Job]:
    """Every job of a finished batch, loaded; LeftAlone when any is not ready to archive."""
    index = batch_job_ids(zk, batch.bid)
    working = index.get("batch-processing") or []
    if working:
        raise LeftAlone(f"{len(working)} jobs not finished")
    jids = sorted({j for jids in index.values() for j in jids})
    jobs: list[Job] = []
    for start in range(0, len(jids), LOAD_CHUNK):
        for job in jobs_load(zk, jids[start : start + LOAD_CHUNK]):
            if isinstance(job, Broken):
                raise LeftAlone(f"job {job.id} cannot be read ({job.path}: {job.reason})")
            if job.bid != batch.bid:
                continue  # listed here but another batch's: not ours to archive
            if job.state not in FINISHED:
                raise LeftAlone(f"job {job.jid} is {job.state}")
            if job.lock is not None:
                raise LeftAlone(f"job {job.jid} is locked")
            if job.status.mtime > cutoff:
                raise LeftAlone(f"job {job.jid} finished too recently")
            jobs.append(job)
    return jobs


def _still_live(zk: Any, batch: Batch, jobs: list[Job]) -> tuple[str | None, list[str]]:
    """After a refused removal: the archived items that still exist in ZooKeeper and changed
    since they were archived (their rows must go; the unchanged ones' rows are still right)."""
    changed = []
    for start in range(0, len(jobs), LOAD_CHUNK):
        part = jobs[start : start + LOAD_CHUNK]
        archived = {j.jid: j.status.version for j in part}
        for now in jobs_load(zk, [j.jid for j in part]):
            if isinstance(now, Broken) or now.status.version != archived[now.jid]:
                changed.append(now.id if isinstance(now, Broken) else now.jid)
    try:
        current = batch_load(zk, batch.bid)
    except (NotFound, MalformedNode):
        return None, changed
    return (batch.bid if current.status.version != batch.status.version else None), changed


def ready_to_archive(zk: Any, bid: str, *, older_than: timedelta) -> tuple[Batch, list[Job]]:
    """The batch and its jobs when all are finished, unlocked and old enough; else LeftAlone.
    Old enough by the ZooKeeper server's clock, which stamped their ``mtime``: a host whose own
    clock runs ahead archives nothing early (``queues/zk/servertime.py``)."""
    cutoff = server_moment(zk) - older_than
    try:
        batch = batch_load(zk, bid)
    except (NotFound, MalformedNode) as exc:
        raise LeftAlone(str(exc)) from None
    if batch.state not in FINISHED:
        raise LeftAlone("not finished")
    if batch.lock is not None:
        raise LeftAlone("locked")
    # One whose archiving stopped part-way (rows written, the batch marked Deleted) is finished
    # whatever the mark's age.
    resumed = _being_removed(batch) and _archived_before(bid)
    if batch.status.mtime > cutoff and not resumed:
        raise LeftAlone("finished too recently")
    jobs_cutoff = datetime.max.replace(tzinfo=cutoff.tzinfo) if resumed else cutoff
    return _with_whole_report(zk, batch), _finished_jobs(zk, batch, jobs_cutoff)


def _with_whole_report(zk: Any, batch: Batch) -> Batch:
    """The batch with its latest report's lists whole: a large report keeps them in part
    nodes, which go with the batch. One whose parts cannot be read is kept as it stands."""
    try:
        return replace(batch, report=report_resolve(zk, batch.bid, batch.report, depth=1))
    except MalformedNode as exc:
        log.warning("%s: archived with its report as it stands: %s", batch.bid, exc)
        return batch


def remove_archived(zk: Any, batch: Batch, jobs: list[Job]) -> tuple[bool, int, str]:
    """Remove what was archived, through the batch delete (``batch_remove``), checked against
    the status versions that were archived: every job is looked at (its lock, its version)
    before the first write; the batch is then marked Deleted, its jobs removed one transaction
    each, and its own nodes last.

    Returns (done, jobs removed, why not). Refused before its first write (a lock, a change),
    everything stays in ZooKeeper and the rows of the items that changed are dropped again.
    Stopped after it (a lock taken meanwhile, ZooKeeper lost), StoppedPartway: the batch stays
    marked Deleted with the jobs not reached, its row stays, and the next sweep finishes it.
    """
    expect = {j.jid: j.status.version for j in jobs}
    try:
        removed = batch_remove(zk, batch, expect=expect)
        remove_uploads(settings.MRT_WORK_DIR, batch.submission)
    except (Conflict, ItemLocked, NotFound) as exc:
        if not zk.exists(zpaths.batch(batch.bid)):
            return True, 0, "removed meanwhile by another archiver"
        live_bid, live_jids = _still_live(zk, batch, jobs)
        if live_bid is not None and _being_removed(batch_load(zk, batch.bid)):
            live_bid = None  # marked by another archiver's (or a delete's) removal: row kept
        _drop_rows(live_bid, live_jids)
        return False, 0, f"changed while being archived ({exc}); nothing removed"
    return True, len(removed), ""


def _stopped(zk: Any, batch: Batch, jobs: list[Job], exc: StoppedPartway) -> int:
    """After a removal stopped part-way: the rows of the jobs not removed that changed since
    they were archived are dropped (the batch's row stays: the next sweep finishes it); the
    number of jobs removed."""
    gone = set(exc.done)
    if not is_connection_error(exc):
        _, live_jids = _still_live(zk, batch, [j for j in jobs if j.jid not in gone])
        _drop_rows(None, live_jids)
    return len(gone - {batch.bid})


def archive_batch(zk: Any, bid: str, *, older_than: timedelta, state: str = "?") -> ArchiveOutcome:
    """Archive one batch with its jobs, then remove them from ZooKeeper (see the module doc)."""
    started = time.monotonic()
    try:
        batch, jobs = ready_to_archive(zk, bid, older_than=older_than)
    except LeftAlone as exc:
        return ArchiveOutcome(bid, state, False, 0, str(exc), time.monotonic() - started)
    # 1. The rows, committed before anything is removed.
    write_rows(batch, jobs)
    # 2. The nodes.
    try:
        done, removed, detail = remove_archived(zk, batch, jobs)
    except StoppedPartway as exc:
        removed = _stopped(zk, batch, jobs, exc)
        return ArchiveOutcome(
            bid,
            batch.state,
            False,
            removed,
            str(exc),
            time.monotonic() - started,
            partway=True,
            cause=exc.cause,  # what stopped it: a lost ZooKeeper then ends the sweep as itself
        )
    count = len(jobs) if done else removed
    return ArchiveOutcome(bid, batch.state, done, count, detail, time.monotonic() - started)


def sweep(*, older_than: timedelta | None = None, zk: Any = None) -> Iterator[ArchiveOutcome]:
    """Archive every batch ready for it, oldest first; one outcome per finished batch."""
    zk = zk if zk is not None else client()
    age = retention_age() if older_than is None else older_than
    cutoff = server_moment(zk) - age
    ids = batch_ids(zk)
    for bid, state in batch_states(zk, ids).items():
        if state not in FINISHED:
            continue
        try:
            found = archive_batch(zk, bid, older_than=age, state=state)
        except (Conflict, ItemLocked, NotFound) as exc:
            found = ArchiveOutcome(bid, state, False, detail=str(exc))
        except Exception as exc:
            if is_connection_error(exc):
                raise
            # One batch the database refuses must not stop the sweep for every other batch.
            log.warning("%s: archiving failed", bid, exc_info=True)
            found = ArchiveOutcome(bid, state, False, detail=f"archiving failed: {exc}")
        if not found.done and found.detail == "finished too recently":
            continue  # the common case, said once per sweep in the summary instead
        yield found
        if found.cause is not None and is_connection_error(found.cause):
            raise found.cause  # ZooKeeper gone: the sweep ends after saying what it did
    log.debug("retention sweep done (cutoff %s)", cutoff.isoformat())


# The console's search (``queues/console/search.py``)
# ------------------------------------------------


@dataclass(frozen=True)
class ArchivedSearch:
    """What the search asks of the archive: the text (stripped, any case), the fields to look
    in ("id", "submitter", "title", "filename", "error"; none: all) and a time range on the
    items' creation (``date_of`` "created") or last change ("changed")."""

    text: str
    fields: frozenset[str]
    since: datetime | None = None
    until: datetime | None = None
    date_of: str = "created"


def _wants(search: ArchivedSearch, name: str) -> bool:
    return not search.fields or name in search.fields


def _dated(rows: Any, search: ArchivedSearch) -> Any:
    column = "created" if search.date_of == "created" else "last_modified"
    if search.since is not None:
        rows = rows.filter(**{f"{column}__gte": search.since})
    if search.until is not None:
        rows = rows.filter(**{f"{column}__lt": search.until})
    return rows


def archived_jobs_search(search: ArchivedSearch) -> Any:
    """Archived jobs the search finds, newest first (a query: the caller counts and slices).

    The job ID by prefix in any case (stored in lower case, so the prefix uses the unique
    index; a batch ID finds the batch, not its jobs); ARK and local ID by prefix, in any case;
    submitter, title, the configuration's file name and the final message by a part of them.
    """
    from django.db.models import Q

    from queues.models import ArchivedJob

    text = search.text.strip()
    if not text:
        return ArchivedJob.objects.none()
    folded = text.casefold()
    query = Q(pk__in=[])
    if _wants(search, "id"):
        query |= Q(jid__startswith=folded) | Q(primary_id__istartswith=text)
        query |= Q(local_id_rows__value__istartswith=text)
    if _wants(search, "submitter"):
        query |= Q(submitter__icontains=text)
    if _wants(search, "title"):
        query |= Q(title__icontains=text)
    if _wants(search, "filename"):
        query |= Q(nodes__configuration__filename__icontains=text)
    if _wants(search, "error"):
        query |= Q(final_message__icontains=text)
    return _dated(ArchivedJob.objects.filter(query), search).distinct().order_by("-jid")


def archived_batches_search(search: ArchivedSearch) -> Any:
    """Archived batches the search finds, newest first: batch ID and the batch's own ID
    (Merritt's ``bid-…`` or a UUID) by prefix in any case; submitter, title, the submission's
    file name and the final message by a part of them."""
    from django.db.models import Q

    from queues.models import ArchivedBatch

    text = search.text.strip()
    if not text:
        return ArchivedBatch.objects.none()
    folded = text.casefold()
    query = Q(pk__in=[])
    if _wants(search, "id"):
        query |= Q(bid__startswith=folded) | Q(batch_uuid__istartswith=text)
    if _wants(search, "submitter"):
        query |= Q(submitter__icontains=text)
    if _wants(search, "title"):
        query |= Q(title__icontains=text)
    if _wants(search, "filename"):
        query |= Q(submission__filename__icontains=text)
    if _wants(search, "error"):
        query |= Q(final_message__icontains=text)
    return _dated(ArchivedBatch.objects.filter(query), search).order_by("-bid")
