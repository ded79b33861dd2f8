"""The console's job lists and a job's page: filters, sorting and paging on the read index's
entries, archived jobs shown after the live ones, and one job's detail. ``Page`` and
``PER_PAGE`` are every list's (batches, reports).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queues.core.states import JOB, JOB_STEPS, JobState
from queues.steps.submission import processing_problem
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk import servertime
from queues.zk.batches import batch_job_ids, batches_load
from queues.zk.client import client, connected_client
from queues.zk.codecs import decode_any
from queues.zk.errors import InvalidTransition, MalformedNode, StillLoading
from queues.zk.jobs import job_load, job_resume_state, jobs_load
from queues.zk.nodes import children, read_many
from queues.zk.packed import Entries, merged_sorted
from queues.zk.records import Batch, Broken, Job, Status

PER_PAGE = 50
SCAN_CHUNK = 500  # jobs loaded at once where a page loads many (a batch's page)


def shown_now() -> float:
    """The ZooKeeper server's time now, for the ages pages and the API show ("5m", seconds in
    a state, a lock's age): node times are that clock's, and a web host's own clock may be
    minutes off (``servertime.shown_now``: no request but one a minute, none per item)."""
    return servertime.shown_now(client())


def _age(moment: datetime | None, now: float | None = None) -> float | None:
    """Seconds from ``moment`` to ``now`` (the server's time now when None), never below 0."""
    if moment is None:
        return None
    return max(0.0, (shown_now() if now is None else now) - moment.timestamp())


JOB_SORTS = {"run": "run order (priority, then age)", "oldest": "oldest first", "newest": "newest"}


@dataclass(frozen=True)
class JobFilter:
    state: str = ""  # "" = every state
    profile: str = ""
    bid: str = ""
    submitter: str = ""
    min_age_hours: float | None = None
    priority: int | None = None
    q: str = ""  # an ARK or local ID (job and batch IDs are turned into bid/redirects by views)
    sort: str = "run"
    stuck: bool = False  # only jobs far past their state's usual time (queues/operator/stuck.py)


@dataclass(frozen=True)
class Page:
    items: list[Any]
    number: int
    per_page: int
    total: int | None  # None when a scan stopped early and the total is not known
    has_next: bool
    scanned: int = 0
    scan_limited: bool = False
    # What the read index is still loading after a start, when that can make the page
    # incomplete (e.g. a search before every job's local ID and ARK are read); "" otherwise.
    loading: str = ""
    # True when the items include the archived ones the filter finds (after the live ones).
    archived_included: bool = False

    @property
    def pages(self) -> int | None:
        return None if self.total is None else max(1, math.ceil(self.total / self.per_page))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def first_index(self) -> int:
        return (self.number - 1) * self.per_page


@dataclass(frozen=True)
class ArchivedJob(Job):
    """An archived job as a read-only job record (status version -1: no node to write)."""

    archived: bool = True
    archived_at: datetime | None = None


@dataclass(frozen=True)
class ArchivedBatch(Batch):
    """An archived batch as a read-only batch record (status version -1)."""

    archived: bool = True
    archived_at: datetime | None = None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def archived_job_item(row: Any) -> ArchivedJob:
    """The record of an ``ArchivedJob`` row, from the nodes it kept."""
    nodes = _dict(row.nodes)
    config = _dict(nodes.get("configuration")) or {
        "profile": row.profile,
        "submitter": row.submitter,
    }
    raw = _dict(nodes.get("status")) or {
        "status": row.final_state,
        "message": row.final_message,
        "retry_count": row.retry_count,
    }
    ids = _dict(nodes.get("identifiers")) or {
        "primary_id": row.primary_id,
        "local_id": list(row.local_ids or []),
    }
    moment = row.last_modified or row.archived_at
    return ArchivedJob(
        jid=row.jid,
        bid=row.bid,
        priority=_int(nodes.get("priority")),
        space_needed=_int(nodes.get("space_needed")),
        configuration=config,
        status=Status(raw, -1, moment),
        created=row.created or moment,
        identifiers=ids,
        metadata=_dict(nodes.get("metadata")) or None,
        inventory=_dict(nodes.get("inventory")) or None,
        store=_dict(nodes.get("store")) or None,
        archived_at=row.archived_at,
    )


def archived_batch_item(row: Any) -> ArchivedBatch:
    """The record of an ``ArchivedBatch`` row, from the nodes it kept."""
    raw = _dict(row.status) or {"status": row.final_state, "message": row.final_message}
    submission = _dict(row.submission) or {
        "batchID": row.batch_uuid,
        "profile": row.profile,
        "submitter": row.submitter,
        "title": row.title,
    }
    moment = row.last_modified or row.archived_at
    return ArchivedBatch(
        bid=row.bid,
        submission=submission,
        status=Status(raw, -1, moment),
        created=row.created or moment,
        started=True,
        report=_dict(row.status_report) or None,
        archived_at=row.archived_at,
    )


def _archived_jobs(flt: JobFilter, live: set[str]) -> list[ArchivedJob]:
    """Archived jobs a search (``q``: job or batch ID, ARK, local ID) or a batch filter finds,
    with the job list's other filters; not those still live (an archiving under way)."""
    from queues.operator import archive

    if flt.q:
        rows = archive.archived_jobs_matching(flt.q)
    elif flt.bid:
        rows = archive.archived_batch_jobs(flt.bid)
    else:
        return []
    now = shown_now() if flt.min_age_hours else 0.0
    found = []
    for row in rows:
        if row.jid in live:
            continue
        if flt.bid and row.bid != flt.bid:
            continue
        if flt.state and row.final_state != flt.state:
            continue
        if flt.profile and row.profile != flt.profile:
            continue
        if flt.submitter and flt.submitter.lower() not in row.submitter.lower():
            continue
        item = archived_job_item(row)
        if flt.priority is not None and item.priority != flt.priority:
            continue
        if flt.min_age_hours and item.status.age_at(now) < flt.min_age_hours * 3600:
            continue
        found.append(item)
    found.sort(key=lambda j: j.jid, reverse=flt.sort == "newest")
    return found


def _job_entries(zk: Any, flt: JobFilter) -> Entries:
    """The (priority, jid) entries a filter takes, in the requested order."""
    return _job_entries_loading(zk, flt)[0]


def _job_entries_loading(zk: Any, flt: JobFilter) -> tuple[Entries, str]:
    """The (priority, jid) entries a filter takes, in the requested order, and what is still
    being read for it ("" when nothing: see ``stuck.entered_before``).

    Every filter is answered by the read index without a look at each entry: profile and
    submitter by its kept matches per listing (each job's configuration read once), several
    states by their merge kept per listings, a priority by bisection (a run of the run
    order), a batch by looking its few jobs up, and the stuck jobs and those in their state
    at least ``min_age_hours`` by the times each entry entered its state
    (``queues/operator/stuck.py``), picked and intersected in C.
    """
    from queues.operator import stuck as zstuck

    idx = zindex.for_client(zk)
    order = flt.sort if flt.sort in ("oldest", "newest") else "run"
    states = [flt.state] if flt.state else [s for s in JOB.states if s != JobState.DELETED]
    in_batch = None
    if flt.bid:
        in_batch = sorted(
            {
                int(j[3:])
                for jids in batch_job_ids(zk, zpaths.bid(flt.bid)).values()
                for j in jids
                if zpaths.JID_RE.fullmatch(j)
            }
        )
    narrowed = bool(flt.profile or flt.submitter or in_batch is not None)
    if (
        (flt.stuck or flt.min_age_hours)
        and order == "run"
        and not narrowed
        and flt.priority is None
    ):
        # Every listed entry of the states may be taken: the times' own keys are the answer
        # (``_among``), and the merge of every state's entries is not made (nor kept: 8 MiB
        # at a million jobs for "stuck only").
        entries = None
    elif len(states) == 1 or in_batch is not None:
        # A batch's few jobs are looked up in each state's entries: the merge of every
        # state's (a million keys) is not needed.
        parts = [
            idx.job_entries_matching(s, profile=flt.profile, submitter=flt.submitter, order=order)
            for s in states
        ]
        entries = (
            parts[0]
            if in_batch is None
            else Entries.merged([part.of_numbers(in_batch) for part in parts])
        )
    else:
        entries = idx.job_entries_all(
            states, profile=flt.profile, submitter=flt.submitter, order=order
        )
    if flt.priority is not None and entries is not None:
        entries = entries.with_priority(flt.priority)
        narrowed = True
    loading: list[str] = []
    if flt.stuck:
        stuck_keys = zstuck.stuck_keys(zk, states, loading=loading)
        entries = _among(entries, stuck_keys, narrowed=narrowed)
        narrowed = True
    if flt.min_age_hours:
        # By the server's clock, which wrote the entries' ctimes (queues/zk/servertime.py).
        cut = servertime.server_now(zk) - flt.min_age_hours * 3600
        older = []
        for state in states:
            found, reading = zstuck.entered_before(zk, state, cut)
            older.append(found)
            if reading:
                loading.append(reading)
        entries = _among(entries, merged_sorted(older), narrowed=narrowed)
    assert entries is not None  # None only with a time filter, which made it
    return entries, "; ".join(loading)


def _among(entries: Entries | None, run_keys: array[int], *, narrowed: bool) -> Entries:
    """``entries`` whose run key is in the sorted ``run_keys`` (all of them from the same
    states' listings): those keys themselves, in the entries' order, when nothing else narrowed
    the entries (every listed entry of the states is among them; None: every entry of the
    states, in run order); else intersected in C."""
    if entries is None:
        return Entries(run_keys)
    if narrowed or entries.by_age:  # by age: only the keys' form differs, made per key found
        return entries.among(run_keys)
    return Entries(run_keys, reverse=entries.reverse)


def _search(zk: Any, flt: JobFilter) -> tuple[list[Job | Broken], str]:
    """Every job whose local ID or ARK is exactly ``flt.q`` and that the other filters take,
    in the filter's order, and what the index is still loading ("" when the answer is
    complete).

    The read index maps every local ID and ARK to its jobs, so this is a dictionary lookup
    and a load of the jobs found, however many jobs the queue holds.
    """
    idx = zindex.for_client(zk)
    jids, complete = idx.find(flt.q)
    now = servertime.server_now(zk) if flt.min_age_hours else 0.0
    found: list[Job | Broken] = []
    for item in jobs_load(zk, sorted(jids)):
        if isinstance(item, Broken):
            found.append(item)
            continue
        if flt.q.strip() not in zindex.search_keys(item.configuration, item.identifiers or {}):
            continue  # the index keeps hashes of the keys: a collision
        if flt.state and item.state != flt.state:
            continue
        if not flt.state and item.state == JobState.DELETED:
            continue
        if flt.profile and item.profile != flt.profile:
            continue
        if flt.submitter and flt.submitter.lower() not in item.submitter.lower():
            continue
        if flt.bid and item.bid != flt.bid:
            continue
        if flt.priority is not None and item.priority != flt.priority:
            continue
        if flt.min_age_hours and item.status.age_at(now) < flt.min_age_hours * 3600:
            continue
        found.append(item)
    if flt.sort == "newest":
        found.reverse()
    elif flt.sort != "oldest":
        found.sort(key=lambda j: (isinstance(j, Broken), getattr(j, "priority", 0)))
    return found, "" if complete else (idx.loading() or "job details")


def jobs_page(*, flt: JobFilter, page: int = 1, per_page: int = PER_PAGE) -> Page:
    """One page of jobs; only the page's jobs are loaded. A search or a batch filter also
    finds archived jobs (``ArchivedJob`` items, after the live ones)."""
    zk = connected_client()
    page = max(1, page)
    start = (page - 1) * per_page
    if flt.q:
        found, loading = _search(zk, flt)
        every: list[Any] = [*found, *_archived_jobs(flt, {_item_id(j) for j in found})]
        return Page(
            items=every[start : start + per_page],
            number=page,
            per_page=per_page,
            total=len(every),
            has_next=start + per_page < len(every),
            loading=loading,
            archived_included=True,
        )
    entries, reading = _job_entries_loading(zk, flt)
    # A collection or submitter filter answered while the index is still being filled counts
    # only the jobs read so far, and the age filter the jobs whose time in their state is read
    # so far: the page says so.
    loading = zindex.for_client(zk).loading() if (flt.profile or flt.submitter) else ""
    loading = "; ".join(x for x in (loading, reading) if x)
    archived: list[ArchivedJob] = []
    if flt.bid and not flt.stuck:
        archived = _archived_jobs(flt, {jid for _p, jid in entries})
    total = len(entries) + len(archived)
    items: list[Any] = jobs_load(zk, [jid for _p, jid in entries[start : start + per_page]])
    if start + per_page > len(entries):
        first = max(0, start - len(entries))
        items += archived[first : first + per_page - len(items)]
    return Page(
        items=items,
        number=page,
        per_page=per_page,
        total=total,
        has_next=start + per_page < total,
        loading=loading,
        archived_included=bool(flt.bid and not flt.stuck),
    )


def _item_id(item: Job | Broken) -> str:
    return item.id if isinstance(item, Broken) else item.jid


def jobs_matching(*, flt: JobFilter) -> tuple[list[str], bool]:
    """Every job ID the filter matches now (for "act on everything matching"), and whether a
    limit cut the list short (never now: every filter is answered by the read index, no
    job's nodes are scanned). StillLoading while the read index fills after a start and
    the filter needs what it has not read yet (a search; a collection or submitter): the
    action would reach only the jobs read so far."""
    zk = connected_client()
    if flt.q:
        found, loading = _search(zk, flt)
        if loading:
            raise StillLoading.about("the jobs this search finds")
        return [j.id if isinstance(j, Broken) else j.jid for j in found], False
    if (flt.profile or flt.submitter) and zindex.for_client(zk).filling:
        raise StillLoading.about("the jobs of this collection or submitter")
    entries, reading = _job_entries_loading(zk, flt)
    if reading:
        raise StillLoading.about("the time each job entered its state")
    return [jid for _p, jid in entries], False


def failing_step(job: Job) -> str:
    """The step a Failed job failed in: the one after its last successful step.

    last_successful_status stays unchanged by a failure, so None means it failed in Pending.
    """
    last = job.status.last_successful_status
    if last is None:
        return JobState.PENDING
    return JOB.successor(last) or last


def job_path(job: Job) -> list[str]:
    """The states the job went through as far as its status tells, ending at its current one."""
    state = job.state
    if state in JOB_STEPS:
        return list(JOB_STEPS[: JOB_STEPS.index(state) + 1])
    if state == JobState.HELD:
        return [JobState.PENDING, JobState.HELD]
    if state == JobState.FAILED:
        step = failing_step(job)
        upto = JOB_STEPS[: JOB_STEPS.index(step) + 1] if step in JOB_STEPS else (JobState.PENDING,)
        return [*upto, JobState.FAILED]
    return [state]


@dataclass(frozen=True)
class JobDetail:
    jid: str
    job: Job | None
    broken: Broken | None
    batch: Batch | Broken | None
    nodes: dict[str, Any]  # every child node decoded, for the raw view and broken jobs
    path: list[str]
    resume_target: str | None
    resume_refusal: str | None
    # Why this console's daemons leave the job alone (one written by Merritt's ingest), or None.
    not_processable: str | None = None


def job_detail(*, jid: str) -> JobDetail:
    """One job with every node decoded; a malformed job comes back as ``broken`` (not an
    error) so the page can show which node is bad."""
    zk = connected_client()
    zpaths.jid(jid)
    kids = [k for k in children(zk, zpaths.job(jid)) if k != "lock"]
    reads = read_many(zk, [zpaths.job_node(jid, k) for k in kids])
    nodes = {k: decode_any(read[0]) for k in kids if (read := reads[zpaths.job_node(jid, k)])}
    try:
        job = job_load(zk, jid)
    except MalformedNode as exc:
        return JobDetail(
            jid, None, Broken("job", jid, exc.path, exc.reason), None, nodes, [], None, None
        )
    batch_items = batches_load(zk, [job.bid])
    target = refusal = None
    if job.state == JobState.FAILED:
        try:
            target = job_resume_state(job)
        except InvalidTransition as exc:  # a permanent failure: the page shows why
            refusal = str(exc)
    return JobDetail(
        jid=jid,
        job=job,
        broken=None,
        batch=batch_items[0] if batch_items else None,
        nodes=nodes,
        path=job_path(job),
        resume_target=target,
        resume_refusal=refusal,
        not_processable=(
            processing_problem(job.configuration)
            if job.state not in (JobState.COMPLETED, JobState.DELETED)
            else None
        ),
    )


def job_one(*, jid: str) -> Job:
    """One job for re-rendering a row after an action."""
    return job_load(connected_client(), zpaths.jid(jid))
