"""Reads for the console's pages, the JSON API and /metrics.

Every function takes keyword-only arguments and reads through the process's ZooKeeper client
with pipelined requests. Lists are paged on index names before anything is loaded, so a page of
50 jobs costs 50 loads however many thousand jobs share its state. What would otherwise be read
again for every page -- state-folder listings, batch states, each job's profile, space needed --
comes from the process's watch-kept read index (``queues/zk/index.py``), so a page's cost follows
what it shows, not the size of the queue.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import weakref
from array import array
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any, cast, overload
from urllib.parse import quote

from django.utils.text import slugify

from queues import waits
from queues.states import (
    ACCESS,
    BATCH,
    BATCH_INDEX_FOLDERS,
    JOB,
    JOB_STEPS,
    JOB_WORKING,
    JobState,
    job_batch_folder,
)
from queues.steps.submission import processing_problem
from queues.zk import consumers as zconsumers
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.access import access_ids, access_load, accesses_load
from queues.zk.batches import (
    batch_job_ids,
    batch_jobs_per_state,
    batch_load,
    batches_load,
    report_changes,
    report_counts,
    report_is_whole,
    report_resolve,
)
from queues.zk.client import connected_client
from queues.zk.codecs import decode_any, decode_json
from queues.zk.errors import InvalidTransition, MalformedNode, NotFound, StillLoading
from queues.zk.jobs import job_load, job_resume_state, jobs_load
from queues.zk.locks import Holds, holds_list
from queues.zk.maintenance import NodeHold, ServiceHold, Window, node_holds, service_holds
from queues.zk.maintenance import windows as maintenance_windows
from queues.zk.nodes import children, exists_many, read_many, stamp
from queues.zk.records import AccessRequest, Batch, Broken, Job, Status

PER_PAGE = 50
SCAN_CHUNK = 500
# A filtered job list reads one or two small nodes per job; past this many it stops and says so.
SCAN_LIMIT = 20_000
GB = 1024**3

log = logging.getLogger("queues.selectors")


def _age(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return max(0.0, (datetime.now().astimezone() - moment).total_seconds())


# Counts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateCount:
    state: str
    count: int
    oldest_seconds: float | None = None


def job_state_counts() -> dict[str, int]:
    """Jobs per state, from the read index's listings of the state folders (Deleted too: jobs
    Merritt's library marked Deleted stay until they are removed)."""
    idx = zindex.for_client(connected_client())
    return {s: idx.job_count(s) for s in JOB.states}


def job_state_summary() -> dict[str, StateCount]:
    """Count and age of the oldest entry of every job state.

    The oldest entry is the one with the lowest job ID (IDs are sequential); its index entry was
    created when the job entered the state, so its ctime gives the time spent there. While the
    read index is still filling after a start, a folder not listed yet is counted from its stat
    (no listing, no waiting) and its age is left out.
    """
    zk = connected_client()
    idx = zindex.for_client(zk)
    states = list(JOB.states)
    if idx.filling:
        counts = idx.job_counts_now()
        names = {s: idx.oldest_entry_now(s) for s in states}
    else:
        counts = {s: idx.job_count(s) for s in states}
        names = {s: idx.oldest_entry(s) for s in states}
    oldest = {s: f"{zpaths.job_state_folder(s)}/{name}" for s, name in names.items() if name}
    stats = exists_many(zk, list(oldest.values()))
    result = {}
    for state in states:
        stat = stats.get(oldest.get(state, ""))
        age = _age(stamp(stat.ctime)) if stat else None
        result[state] = StateCount(state, counts[state] or 0, age)
    return result


def _status_summary(
    machine_states: Iterable[str], statuses: Iterable[tuple[str, datetime]]
) -> dict[str, StateCount]:
    counts: Counter[str] = Counter()
    oldest: dict[str, datetime] = {}
    for state, mtime in statuses:
        counts[state] += 1
        if state not in oldest or mtime < oldest[state]:
            oldest[state] = mtime
    result = {s: StateCount(s, counts[s], _age(oldest.get(s))) for s in machine_states}
    for state in counts:  # states the machine does not know are shown, not hidden
        result.setdefault(state, StateCount(state, counts[state], _age(oldest.get(state))))
    return result


def _statuses(zk: Any, node_paths: Sequence[str]) -> list[tuple[str, datetime]]:
    found = []
    for path, read in read_many(zk, node_paths).items():
        if read is None:
            continue
        try:
            state = str(decode_json(path, read[0]).get("status", "?"))
        except MalformedNode:
            state = "?"
        found.append((state, stamp(read[1].mtime)))
    return found


def batch_state_summary() -> dict[str, StateCount]:
    idx = zindex.for_client(connected_client())
    # While the read index fills: the batches read so far (the overview says it is loading).
    summary = idx.batch_summary_now() if idx.filling else idx.batch_summary()
    result = {
        s: StateCount(s, summary[s][0], _age(stamp(summary[s][1])))
        if s in summary
        else StateCount(s, 0, None)
        for s in BATCH.states
    }
    for state, (count, oldest) in summary.items():  # unknown states are shown, not hidden
        result.setdefault(state, StateCount(state, count, _age(stamp(oldest))))
    return result


def access_state_summary() -> dict[str, StateCount]:
    zk = connected_client()
    node_paths = [
        zpaths.access_node(q, qid, "status")
        for q in zpaths.ACCESS_QUEUES
        for qid in access_ids(zk, q)
    ]
    return _status_summary(ACCESS.states, _statuses(zk, node_paths))


def bytes_in_process() -> int:
    """Sum of space_needed over jobs in the working states (read once per job and state);
    while the read index fills, of the states whose sum is known so far."""
    idx = zindex.for_client(connected_client())
    if idx.filling:
        return sum(idx.space_total_now(s) or 0 for s in JOB_WORKING)
    return sum(idx.space_total(s) for s in JOB_WORKING)


def held_jobs_by_collection() -> dict[str, int]:
    """How many Held jobs each collection (profile) has (while the read index fills: of the
    Held jobs whose collection is read so far)."""
    counts = zindex.for_client(connected_client()).profile_counts_so_far(JobState.HELD)
    return dict(sorted(((p or "(none)"), n) for p, n in counts.items()))


@dataclass(frozen=True)
class Overview:
    jobs: dict[str, StateCount]
    batches: dict[str, StateCount]
    access: dict[str, StateCount]
    holds: Holds
    held_by_collection: dict[str, int]
    bytes_in_process: int
    # Every hold with who placed it, why and until when; the jobs each hold or cap keeps
    # waiting per step (queues/waits.py).
    details: waits.Holds = field(default_factory=lambda: waits.Holds({}, {}, {}))
    kept: list[waits.Wait] = field(default_factory=list)
    # What the read index is still loading after a start ("" when nothing): counts of job
    # states not listed yet come from their folders' stats, without ages; batch states,
    # GB in process and held jobs per collection count what is read so far.
    loading: str = ""

    @property
    def gb_in_process(self) -> float:
        return self.bytes_in_process / GB


def overview() -> Overview:
    loading = zindex.for_client(connected_client()).loading()
    details = waits.holds_now()
    return Overview(
        details=details,
        kept=waits.waits(holds=details),
        jobs=job_state_summary(),
        batches=batch_state_summary(),
        access=access_state_summary(),
        holds=holds_list(connected_client()),
        held_by_collection=held_jobs_by_collection(),
        bytes_in_process=bytes_in_process(),
        loading=loading,
    )


# Jobs ---------------------------------------------------------------------------------------

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
    stuck: bool = False  # only jobs far past their state's usual time (queues/stuck.py)

    @property
    def scans(self) -> bool:
        """True when matching needs each job's nodes, not only the read index (the age)."""
        return bool(self.min_age_hours)


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


# Archived items: finished batches and jobs that retention moved out of ZooKeeper into the
# database (queues/archive.py). Lists and searches show them after the live ones, marked
# ``archived``, as the records pages already know; nothing can be done to them.


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
    from queues import archive

    if flt.q:
        rows = archive.archived_jobs_matching(flt.q)
    elif flt.bid:
        rows = archive.archived_batch_jobs(flt.bid)
    else:
        return []
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
        if flt.min_age_hours and item.status.age_seconds < flt.min_age_hours * 3600:
            continue
        found.append(item)
    found.sort(key=lambda j: j.jid, reverse=flt.sort == "newest")
    return found


def _job_entries(zk: Any, flt: JobFilter) -> Sequence[tuple[int, str]]:
    """The (priority, jid) entries a filter starts from, in the requested order.

    Profile and submitter are answered by the read index (facts of each job's configuration,
    read once); only age, ARK and local ID still need a scan of the jobs' nodes.
    """
    idx = zindex.for_client(zk)
    order = flt.sort if flt.sort in ("oldest", "newest") else "run"
    states = [flt.state] if flt.state else [s for s in JOB.states if s != JobState.DELETED]
    if len(states) == 1:
        entries = idx.job_entries_matching(
            states[0], profile=flt.profile, submitter=flt.submitter, order=order
        )
    else:
        entries = idx.job_entries_all(
            states, profile=flt.profile, submitter=flt.submitter, order=order
        )
    if flt.priority is not None:
        wanted = flt.priority
        entries = entries.where(lambda p, _n: p == wanted)
    if flt.bid:
        in_batch = {
            int(j[3:])
            for jids in batch_job_ids(zk, zpaths.bid(flt.bid)).values()
            for j in jids
            if zpaths.JID_RE.fullmatch(j)
        }
        entries = entries.where(lambda _p, n: n in in_batch)
    if flt.stuck:
        from queues.stuck import is_in, stuck_numbers

        stuck = stuck_numbers(zk, states)
        entries = entries.where(lambda _p, n: is_in(stuck, n))
    return entries


def _scan_nodes(flt: JobFilter) -> tuple[str, ...]:
    return ("status",) if flt.min_age_hours else ()


def _scan_match(flt: JobFilter, jid: str, reads: dict[str, Any]) -> bool:
    if flt.min_age_hours:
        read = reads.get(zpaths.job_node(jid, "status"))
        if read is None or (_age(stamp(read[1].mtime)) or 0) < flt.min_age_hours * 3600:
            return False
    return True


def _search(zk: Any, flt: JobFilter) -> tuple[list[Job | Broken], str]:
    """Every job whose local ID or ARK is exactly ``flt.q`` and that the other filters take,
    in the filter's order, and what the index is still loading ("" when the answer is
    complete).

    The read index maps every local ID and ARK to its jobs, so this is a dictionary lookup
    and a load of the jobs found, however many jobs the queue holds.
    """
    idx = zindex.for_client(zk)
    jids, complete = idx.find(flt.q)
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
        if flt.min_age_hours and item.status.age_seconds < flt.min_age_hours * 3600:
            continue
        found.append(item)
    if flt.sort == "newest":
        found.reverse()
    elif flt.sort != "oldest":
        found.sort(key=lambda j: (isinstance(j, Broken), getattr(j, "priority", 0)))
    return found, "" if complete else (idx.loading() or "job details")


def _scan(
    zk: Any, flt: JobFilter, entries: Sequence[tuple[int, str]], want: Callable[[int], bool]
) -> tuple[list[str], int, int, bool]:
    """Walk entries in chunks reading only the nodes the filter needs.

    ``want(n)`` says whether the n-th match (0-based) should be kept. Returns the kept job IDs,
    the number of matches, the number of entries scanned and whether the limit cut the scan.
    """
    if not flt.min_age_hours:
        # Everything asked was answered by _job_entries from the index: every entry matches.
        return [jid for n, (_p, jid) in enumerate(entries) if want(n)], len(entries), 0, False
    kept: list[str] = []
    matches = 0
    scanned = 0
    names = _scan_nodes(flt)
    for start in range(0, len(entries), SCAN_CHUNK):
        if scanned >= SCAN_LIMIT:
            return kept, matches, scanned, True
        part = [jid for _p, jid in entries[start : start + SCAN_CHUNK]]
        reads = read_many(zk, [zpaths.job_node(j, n) for j in part for n in names])
        for jid in part:
            if _scan_match(flt, jid, reads):
                if want(matches):
                    kept.append(jid)
                matches += 1
        scanned += len(part)
    return kept, matches, scanned, False


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
    entries = _job_entries(zk, flt)
    # A collection or submitter filter answered while the index is still being filled counts
    # only the jobs read so far: the page says so.
    loading = zindex.for_client(zk).loading() if (flt.profile or flt.submitter) else ""
    if not flt.scans:
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
    kept, matches, scanned, limited = _scan(
        zk, flt, entries, lambda n: start <= n < start + per_page
    )
    return Page(
        items=jobs_load(zk, kept),
        number=page,
        per_page=per_page,
        total=None if limited else matches,
        has_next=matches > start + per_page or limited,
        scanned=scanned,
        scan_limited=limited,
        loading=loading,
    )


def _item_id(item: Job | Broken) -> str:
    return item.id if isinstance(item, Broken) else item.jid


def jobs_matching(*, flt: JobFilter) -> tuple[list[str], bool]:
    """Every job ID the filter matches now (for "act on everything matching"), and whether the
    scan limit cut the list short. StillLoading while the read index fills after a start and
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
    entries = _job_entries(zk, flt)
    if not flt.scans:
        return [jid for _p, jid in entries], False
    kept, _matches, _scanned, limited = _scan(zk, flt, entries, lambda _n: True)
    return kept, limited


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


# Failed jobs --------------------------------------------------------------------------------

# Rows of one group shown per page, and groups per page. The API pages its rows the same way.
FAILED_ROWS_PER_PAGE = 50
FAILED_GROUPS_PER_PAGE = 50
FAILED_GROUPINGS = ("batch", "collection", "step")


@dataclass(frozen=True)
class FailedGroup:
    key: str
    count: int
    slug: str = ""  # the key as an HTML id
    quoted: str = ""  # the key as a URL's query value


@dataclass(frozen=True)
class FailedView:
    """The Failed jobs a filter matches, grouped, with rows only where asked for.

    Counts come from the read index (each Failed job's batch, collection and failing step,
    read once per job); only the rows shown are loaded, at most ``FAILED_ROWS_PER_PAGE``.
    """

    group: str  # "batch", "collection" or "step"
    groups: list[FailedGroup]  # this page of groups
    group_page: Page  # paging of the groups (items: the same FailedGroup list)
    total: int  # Failed jobs the filter matches
    failed_total: int  # every job in the Failed state
    # Rows: key -> (page of that group's jobs); every group when all matches fit in one page,
    # else only the open one.
    rows: dict[str, Page]
    open: str  # the group whose rows were asked for ("" when none)
    steps: dict[str, str]  # jid -> failing step, for the rows shown
    unindexed: list[Job | Broken]  # Failed jobs whose batch or status cannot be read
    loading: str = ""

    @property
    def broken(self) -> list[Broken]:
        return [j for j in self.unindexed if isinstance(j, Broken)]

    @property
    def shown(self) -> int:
        return sum(len(p.items) for p in self.rows.values())


class FailedMatches(Sequence[tuple[str, str, str, str]]):
    """(jid, batch, collection, step) of Failed jobs, oldest first: a job number each and one
    shared (batch, collection, step) triple per distinct triple, items made when asked for."""

    __slots__ = ("infos", "numbers")

    def __init__(self, numbers: array[int], infos: list[tuple[str, str, str]]) -> None:
        self.numbers = numbers
        self.infos = infos

    def __len__(self) -> int:
        return len(self.numbers)

    @overload
    def __getitem__(self, i: int) -> tuple[str, str, str, str]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, str, str, str]]: ...

    def __getitem__(
        self, i: int | slice
    ) -> tuple[str, str, str, str] | list[tuple[str, str, str, str]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self.numbers)))]
        info = self.infos[i]
        return (f"jid{self.numbers[i]:010d}", *info)

    def __iter__(self) -> Iterator[tuple[str, str, str, str]]:
        for number, info in zip(self.numbers, self.infos, strict=True):
            yield (f"jid{number:010d}", *info)

    def jids(self) -> list[str]:
        return [f"jid{n:010d}" for n in self.numbers]


def _failed_matches(zk: Any, *, bid: str = "", profile: str = "", step: str = "") -> FailedMatches:
    """(jid, batch, collection, step) of every Failed job the filter takes, oldest first;
    from the read index, computed once per change of the Failed folder and filter. While the
    read index fills, of the Failed jobs read so far (not kept)."""
    idx = zindex.for_client(zk)
    filling = idx.filling

    def build() -> FailedMatches:
        failed = idx.failed_numbers(wait=not filling)
        numbers = sorted(failed)
        facts = idx.job_facts_by_number(numbers, read=not filling)
        shared: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        kept = array("q")
        infos = []
        for number in numbers:
            ff = failed[number]
            collection = facts[number].profile if number in facts else ""
            if bid and ff.bid != bid:
                continue
            if profile and collection != profile:
                continue
            if step and ff.step != step:
                continue
            info = (ff.bid, collection, ff.step)
            kept.append(number)
            infos.append(shared.setdefault(info, info))
        return FailedMatches(kept, infos)

    if filling:
        return build()
    return cast(
        "FailedMatches", idx.derived(JobState.FAILED, ("failed", bid, profile, step), build)
    )


def failed_matching(*, bid: str = "", profile: str = "", step: str = "") -> list[str]:
    """Every Failed job ID the filter matches now (for "resume everything matching");
    StillLoading while the read index fills after a start (it knows the Failed jobs read so
    far only)."""
    zk = connected_client()
    if zindex.for_client(zk).filling:
        raise StillLoading.about("the Failed jobs")
    return _failed_matches(zk, bid=bid, profile=profile, step=step).jids()


def _failed_key(match: tuple[str, str, str, str], group: str) -> str:
    if group == "collection":
        return match[2] or "(none)"
    return match[3] if group == "step" else match[1]


@dataclass(frozen=True)
class FailedGroups:
    """One filter's matches under one grouping: the groups in the page's order, each with the
    places of its jobs in the matches (oldest first). A page of groups, or a page of one
    group's rows, is then a slice, not a pass over every Failed job."""

    keys: list[str]
    counts: dict[str, int]  # in the order of ``keys``
    where: dict[str, int]  # key -> its place in ``keys``
    members: dict[str, array[int]]  # key -> places in the matches
    # The groups shown so far, made once per change (a page of 50 groups shows each key in
    # an id and in links: made in the template, that was most of the page's time).
    shown: dict[str, FailedGroup] = field(default_factory=dict)

    def group(self, key: str) -> FailedGroup:
        found = self.shown.get(key)
        if found is None:
            found = self.shown[key] = FailedGroup(
                key, self.counts[key], slugify(key), quote(key, safe="/")
            )
        return found


def _grouped(matches: FailedMatches, group: str) -> FailedGroups:
    # Jobs share a few thousand (batch, collection, step) triples: each triple's key once.
    key_of: dict[int, str] = {}
    members: dict[str, array[int]] = {}
    for place, info in enumerate(matches.infos):
        key = key_of.get(id(info))
        if key is None:
            key = key_of[id(info)] = _failed_key(("", *info), group)
        found = members.get(key)
        if found is None:
            found = members[key] = array("q")
        found.append(place)
    if group == "step":
        keys = [s for s in JOB.states if s in members] + sorted(
            s for s in members if not JOB.is_state(s)
        )
    else:
        keys = sorted(members)
    return FailedGroups(
        keys, {k: len(members[k]) for k in keys}, {k: i for i, k in enumerate(keys)}, members
    )


def _failed_groups(
    zk: Any, group: str, *, bid: str = "", profile: str = "", step: str = ""
) -> tuple[FailedMatches, FailedGroups]:
    """A filter's matches with their groups, computed together (the groups' places refer to
    those matches) once per change of the Failed folder; while the read index fills, of the
    Failed jobs read so far (not kept)."""
    idx = zindex.for_client(zk)

    def build() -> tuple[FailedMatches, FailedGroups]:
        matches = _failed_matches(zk, bid=bid, profile=profile, step=step)
        return matches, _grouped(matches, group)

    if idx.filling:
        return build()
    return cast(
        "tuple[FailedMatches, FailedGroups]",
        idx.derived(JobState.FAILED, ("failed-groups", bid, profile, step, group), build),
    )


def _failed_unindexed(zk: Any) -> list[str]:
    """Failed jobs whose batch or status the index could not read (no batch node, an
    unreadable status), at most a page of them, found once per change of the Failed folder."""
    idx = zindex.for_client(zk)
    if idx.filling:
        return []

    def build() -> list[str]:
        failed = idx.failed_numbers()
        entries = idx.job_entries(JobState.FAILED).numbers()
        return [f"jid{n:010d}" for n in entries if n not in failed][:FAILED_ROWS_PER_PAGE]

    return cast("list[str]", idx.derived(JobState.FAILED, ("failed-unindexed",), build))


def failed_jobs(
    *,
    bid: str = "",
    profile: str = "",
    step: str = "",
    group: str = "batch",
    group_page: int = 1,
    open_group: str = "",
    row_page: int = 1,
) -> FailedView:
    """The failed list: groups with counts (a page of them), and rows of at most one page.

    When everything the filter matches fits in one page of rows, every group shows its rows;
    otherwise only ``open_group`` does, ``row_page`` of it.
    """
    zk = connected_client()
    idx = zindex.for_client(zk)
    group = group if group in FAILED_GROUPINGS else "batch"
    matches, grouped = _failed_groups(zk, group, bid=bid, profile=profile, step=step)
    keys, counts = grouped.keys, grouped.counts
    group_page = max(1, group_page)
    if open_group in grouped.where:  # the page of groups that holds the open one
        group_page = grouped.where[open_group] // FAILED_GROUPS_PER_PAGE + 1
    first = (group_page - 1) * FAILED_GROUPS_PER_PAGE
    shown = [grouped.group(k) for k in keys[first : first + FAILED_GROUPS_PER_PAGE]]
    paging = Page(
        shown,
        group_page,
        FAILED_GROUPS_PER_PAGE,
        len(keys),
        first + FAILED_GROUPS_PER_PAGE < len(keys),
    )

    row_page = max(1, row_page)
    row_first = (row_page - 1) * FAILED_ROWS_PER_PAGE
    # key -> (this page of the group's matches, how many the group has)
    wanted: dict[str, tuple[list[tuple[str, str, str, str]], int]] = {}
    if len(matches) <= FAILED_ROWS_PER_PAGE:
        row_page, row_first = 1, 0
        for m in matches:
            key = _failed_key(m, group)
            wanted.setdefault(key, ([], counts[key]))[0].append(m)
    elif open_group in grouped.members:
        places = grouped.members[open_group]
        shown_places = places[row_first : row_first + FAILED_ROWS_PER_PAGE]
        wanted[open_group] = ([matches[p] for p in shown_places], len(places))
    loaded = {
        (j.id if isinstance(j, Broken) else j.jid): j
        for j in jobs_load(zk, [m[0] for ms, _n in wanted.values() for m in ms])
    }
    rows: dict[str, Page] = {}
    shown_steps: dict[str, str] = {}
    for key, (part, count) in wanted.items():
        rows[key] = Page(
            [loaded[m[0]] for m in part if m[0] in loaded],
            row_page,
            FAILED_ROWS_PER_PAGE,
            count,
            row_first + FAILED_ROWS_PER_PAGE < count,
        )
        shown_steps.update((m[0], m[3]) for m in part if isinstance(loaded.get(m[0]), Job))
    # Listed so that nothing failed is hidden; there are normally none.
    unindexed: list[Job | Broken] = []
    if not (bid or profile or step):
        missing = _failed_unindexed(zk)
        unindexed = jobs_load(zk, missing) if missing else []
    return FailedView(
        group=group,
        groups=shown,
        group_page=paging,
        total=len(matches),
        failed_total=idx.job_count(JobState.FAILED),
        rows=rows,
        open=open_group if open_group in grouped.where else "",
        steps=shown_steps,
        unindexed=unindexed,
        loading=idx.loading(),
    )


def failed_group_counts(
    *, bid: str = "", profile: str = "", step: str = ""
) -> dict[str, dict[str, int]]:
    """The matches of a filter counted per batch, collection and failing step (the API's
    ``groups``), each sorted by key; shared answers, not to be modified."""
    zk = connected_client()
    # While the read index fills nothing is kept: the matches of what is read so far, once.
    matches = (
        _failed_matches(zk, bid=bid, profile=profile, step=step)
        if zindex.for_client(zk).filling
        else None
    )
    found = {}
    for name in FAILED_GROUPINGS:
        if matches is not None:
            counts = _grouped(matches, name).counts
        else:
            counts = _failed_groups(zk, name, bid=bid, profile=profile, step=step)[1].counts
        # Batches and collections are kept sorted by key already; steps in the machine's order.
        found[name] = dict(sorted(counts.items())) if name == "step" else counts
    return found


def failed_page(
    *,
    bid: str = "",
    profile: str = "",
    step: str = "",
    page: int = 1,
    per_page: int = FAILED_ROWS_PER_PAGE,
) -> tuple[Page, dict[str, str]]:
    """One page of every matching Failed job, oldest first (the API's paging), with each
    shown job's failing step."""
    zk = connected_client()
    matches = _failed_matches(zk, bid=bid, profile=profile, step=step)
    page = max(1, page)
    first = (page - 1) * per_page
    part = matches[first : first + per_page]
    items = jobs_load(zk, [m[0] for m in part])
    return (
        Page(
            items,
            page,
            per_page,
            len(matches),
            first + per_page < len(matches),
            loading=zindex.for_client(zk).loading(),
        ),
        {m[0]: m[3] for m in part},
    )


# Batches ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRow:
    item: Batch | Broken
    folders: dict[str, int]  # jobs per batch index folder
    states: dict[str, int]  # jobs per job state, in the machine's order

    @property
    def bid(self) -> str:
        return self.item.id if isinstance(self.item, Broken) else self.item.bid

    @property
    def total_jobs(self) -> int:
        return sum(self.folders.values())

    @property
    def finished_jobs(self) -> int:
        """Jobs that ended: completed, failed or deleted."""
        return sum(n for f, n in self.folders.items() if f != "batch-processing")

    @property
    def percent_done(self) -> int | None:
        total = self.total_jobs
        return None if not total else (100 * self.finished_jobs) // total

    @property
    def elapsed_seconds(self) -> float | None:
        """From submission to now, or to its last change once the batch has ended."""
        if isinstance(self.item, Broken):
            return None
        batch = self.item
        ended = batch.state in BATCH.terminal
        until = batch.status.last_modified if ended else None
        until = until or datetime.now().astimezone()
        return max(0.0, (until - batch.created).total_seconds())


def batch_rows(zk: Any, bids: Sequence[str]) -> list[BatchRow]:
    """The rows of a batch list: each batch with its jobs counted per folder and per state.

    Counted by the read index from the batches' index folders (kept under watches) and the
    state folders, so no job's node is read and a row shown again costs no listing.
    """
    counts = zindex.for_client(zk).batch_job_counts(bids)
    rows = []
    for item in batches_load(zk, bids):
        found = counts.get(item.id if isinstance(item, Broken) else item.bid)
        folders = found.folders if found else dict.fromkeys(BATCH_INDEX_FOLDERS, 0)
        rows.append(BatchRow(item, folders, found.states if found else {}))
    return rows


@dataclass(frozen=True)
class BatchFilter:
    state: str = ""
    profile: str = ""
    submitter: str = ""
    q: str = ""  # batch UUID or title fragment


def _archived_batches(flt: BatchFilter) -> Any:
    """The archived batches a batch filter takes, newest first (a query: nothing read yet)."""
    from django.db.models import Q

    from queues.models import ArchivedBatch as Row

    rows = Row.objects.all()
    if flt.state:
        rows = rows.filter(final_state=flt.state)
    if flt.profile:
        rows = rows.filter(profile=flt.profile)
    if flt.submitter:
        rows = rows.filter(submitter__icontains=flt.submitter)
    if flt.q:
        rows = rows.filter(Q(batch_uuid=flt.q) | Q(title__icontains=flt.q))
    return rows.order_by("-bid")


def archived_batch_rows(bids: Sequence[str]) -> list[BatchRow]:
    """Rows of archived batches for a batch list: each batch's jobs counted per final state
    (one grouped query) and per the batch index folder each state belongs in."""
    from django.db.models import Count

    from queues.models import ArchivedBatch as Row
    from queues.models import ArchivedJob as JobRow

    rows = {r.bid: r for r in Row.objects.filter(bid__in=list(bids))}
    counted: dict[str, Counter[str]] = defaultdict(Counter)
    for found in (
        JobRow.objects.filter(bid__in=list(bids))
        .values("bid", "final_state")
        .annotate(n=Count("id"))
    ):
        counted[found["bid"]][found["final_state"]] += found["n"]
    result = []
    for bid in bids:
        row = rows.get(bid)
        if row is None:
            continue
        counts = counted[bid]
        folders: Counter[str] = Counter()
        for state, n in counts.items():
            folders[job_batch_folder(state) if JOB.is_state(state) else "?"] += n
        states = {s: counts[s] for s in (*JOB.states, *sorted(counts)) if counts.get(s)}
        result.append(BatchRow(archived_batch_item(row), dict(folders), states))
    return result


# The batch IDs of each state, newest first, grouped once per answer of the read index (its
# batch list and batch states are the same objects while no batch came, went or changed state),
# so a state's page (the held batches on /holds/, the batch list filtered by state) does not
# look at every batch per request.
_by_state: tuple[list[str], dict[str, Any], dict[str, list[str]]] | None = None


def _batches_by_state(bids: list[str], states: dict[str, Any]) -> dict[str, list[str]]:
    global _by_state
    kept = _by_state
    if kept is not None and kept[0] is bids and kept[1] is states:
        return kept[2]
    grouped: dict[str, list[str]] = {}
    for bid in reversed(bids):
        found = states.get(bid)
        if found is not None:
            grouped.setdefault(found.state, []).append(bid)
    _by_state = (bids, states, grouped)
    return grouped


# A batch's submission never changes: its profile, submitter, title and own ID are read once
# per batch for the batch list's filters, and forgotten when the batch is gone. Each filter's
# answer is kept for as long as the read index's batch list (and, for a state, its batch
# states) are the same objects, so a filtered page asked again costs what an unfiltered one
# does, whatever the number of batches.
class _BatchFilters:
    def __init__(self) -> None:
        self.submissions: dict[str, tuple[str, str, str, str]] = {}
        self.filtered: OrderedDict[tuple[Any, ...], tuple[Any, list[str]]] = OrderedDict()


# Per read index (one per ZooKeeper client: batch IDs of another queue are other batches).
_batch_filters: weakref.WeakKeyDictionary[Any, _BatchFilters] = weakref.WeakKeyDictionary()
_filter_lock = threading.Lock()
FILTERS_KEPT = 32


def _batch_submissions(zk: Any, idx: Any, bids: list[str]) -> dict[str, tuple[str, str, str, str]]:
    with _filter_lock:
        kept = _batch_filters.get(idx)
        if kept is None:
            kept = _batch_filters[idx] = _BatchFilters()
        _submissions = kept.submissions
        todo = [b for b in bids if b not in _submissions]
    for start in range(0, len(todo), zindex.READ_CHUNK):
        part = todo[start : start + zindex.READ_CHUNK]
        reads = read_many(zk, [zpaths.batch_node(b, "submission") for b in part])
        fresh = {}
        for b in part:
            read = reads[zpaths.batch_node(b, "submission")]
            try:
                sub = decode_json("submission", read[0]) if read else {}
            except MalformedNode:
                sub = {}
            if not isinstance(sub, dict):
                sub = {}
            fresh[b] = (
                str(sub.get("profile") or ""),
                str(sub.get("submitter") or "").lower(),
                str(sub.get("title") or "").lower(),
                str(sub.get("batchID") or ""),
            )
        with _filter_lock:
            _submissions.update(fresh)
    with _filter_lock:
        return {b: found for b in bids if (found := _submissions.get(b)) is not None}


def _batches_filtered(
    zk: Any, idx: Any, bids: list[str], flt: BatchFilter, states: Any
) -> list[str]:
    """``bids`` (newest first; of ``states``' state when the filter has one) whose submission
    matches the filter's profile, submitter and title or own ID, kept per batch list and batch
    states."""
    every = idx.batch_ids()
    key = (flt.state, flt.profile, flt.submitter.lower(), flt.q)
    basis = (every, states if flt.state else None)
    with _filter_lock:
        filters = _batch_filters.get(idx)
        if filters is None:
            filters = _batch_filters[idx] = _BatchFilters()
        _filtered, _submissions = filters.filtered, filters.submissions
        kept = _filtered.get(key)
        if kept is not None and kept[0][0] is basis[0] and kept[0][1] is basis[1]:
            _filtered.move_to_end(key)
            return list(kept[1])
    subs = _batch_submissions(zk, idx, bids)
    submitter, q = flt.submitter.lower(), flt.q
    keep = []
    for b in bids:
        profile, sub_submitter, title, own_id = subs.get(b, ("", "", "", ""))
        if flt.profile and profile != flt.profile:
            continue
        if submitter and submitter not in sub_submitter:
            continue
        if q and not (q == own_id or q.lower() in title):
            continue
        keep.append(b)
    with _filter_lock:
        live = set(every)
        for gone in [b for b in _submissions if b not in live]:
            del _submissions[gone]
        if not flt.state or not idx.filling:  # a state's answer while filling is partial
            _filtered[key] = (basis, keep)
        while len(_filtered) > FILTERS_KEPT:
            _filtered.popitem(last=False)
    return keep


def batches_page(*, flt: BatchFilter, page: int = 1, per_page: int = PER_PAGE) -> Page:
    """Batches newest first, the archived ones among them (``ArchivedBatch`` items, by batch
    ID like the others). Without a filter only the page is loaded; the state filter uses the
    read index's batch states, the other filters read the submissions of every batch (batches
    number in thousands, not millions); archived batches are filtered by the database."""
    zk = connected_client()
    idx = zindex.for_client(zk)
    states: Any = None
    if flt.state:
        # While the read index fills after a start: the batches whose state is read so far.
        states = idx.batch_states_now() if idx.filling else idx.batch_states()
        bids = list(_batches_by_state(idx.batch_ids(), states).get(flt.state, ()))
    else:
        bids = list(reversed(idx.batch_ids()))
    if flt.profile or flt.submitter or flt.q:
        bids = _batches_filtered(zk, idx, bids, flt, states if flt.state else None)
    page = max(1, page)
    start = (page - 1) * per_page
    end = start + per_page
    # Archived batch IDs down to this page (IDs only), merged with the live ones by ID; a batch
    # in both (being archived right now) is shown live.
    archived_rows = _archived_batches(flt)
    live = set(bids)
    fetched = list(archived_rows.values_list("bid", flat=True)[: end + per_page])
    archived = [b for b in fetched if b not in live]
    total = len(bids) + archived_rows.count() - (len(fetched) - len(archived))
    window = list(islice(heapq.merge(bids, archived, reverse=True), start, end))
    archived_set = set(archived)
    live_rows = {r.bid: r for r in batch_rows(zk, [b for b in window if b not in archived_set])}
    old_rows = {r.bid: r for r in archived_batch_rows([b for b in window if b in archived_set])}
    items = [row for b in window if (row := live_rows.get(b) or old_rows.get(b)) is not None]
    return Page(
        items=items,
        number=page,
        per_page=per_page,
        total=total,
        has_next=end < total,
    )


@dataclass(frozen=True)
class ReportView:
    last_modified: str
    failed_jobs: list[str]  # all of them when ``whole``; else the first ones, or none
    successful_jobs: list[str]
    changes: dict[str, list[str]] | None  # against the report before it; None for the first
    failed_count: int
    successful_count: int
    # Every job ID is in the lists above. False: the report keeps its lists in part nodes that
    # were not read (a large one on a page of many batches), or they were cut to ``shown``.
    whole: bool = True


def report_views(report: dict[str, Any] | None, *, shown: int | None = None) -> list[ReportView]:
    """The current report and its history, newest first, each with what changed since the one
    before it (where both lists are at hand). ``shown``: at most that many IDs of each list
    (a page of many batches shows counts and the first IDs)."""
    if not report:
        return []
    given = report.get("history")
    history: list[Any] = given if isinstance(given, list) else []
    chain = [report, *[h for h in history if isinstance(h, dict)]]
    views = []
    for i, rep in enumerate(chain):
        previous = chain[i + 1] if i + 1 < len(chain) else None
        failed = [str(j) for j in rep.get("failed_jobs") or []]
        successful = [str(j) for j in rep.get("successful_jobs") or []]
        whole = report_is_whole(rep)
        changes = None
        if previous is not None and whole and report_is_whole(previous):
            changes = report_changes(previous, rep)
        failed_count, successful_count = report_counts(rep)
        if shown is not None and max(len(failed), len(successful)) > shown:
            failed, successful, whole = failed[:shown], successful[:shown], False
        views.append(
            ReportView(
                last_modified=str(rep.get("last_modified", "")),
                failed_jobs=failed,
                successful_jobs=successful,
                changes=changes,
                failed_count=failed_count,
                successful_count=successful_count,
                whole=whole,
            )
        )
    return views


# Jobs a batch's page loads per state (its rows); the counts are of every job.
BATCH_ROWS_PER_STATE = 25


@dataclass(frozen=True)
class BatchDetail:
    batch: Batch
    folders: dict[str, int]  # batch index folder -> how many jobs it lists
    counts: dict[str, int]  # job state -> how many of the batch's jobs are in it (all of them)
    # The first ``BATCH_ROWS_PER_STATE`` jobs of each state, loaded, by the state they are in.
    by_state: dict[str, list[Job]]
    reports: list[ReportView]
    # ``status-report`` with the lists of its latest two reports whole (read from their parts).
    report: dict[str, Any] | None = None

    @property
    def total_jobs(self) -> int:
        return sum(self.folders.values())


def batch_detail(*, bid: str, per_state: int = BATCH_ROWS_PER_STATE) -> BatchDetail:
    """A batch, the counts of its jobs per state and per index folder (the read index: no
    read of each job), and a page of rows per state: the first ``per_state`` job IDs of each
    state are loaded, whatever the batch's size."""
    zk = connected_client()
    batch = batch_load(zk, zpaths.bid(bid))
    counted, rows = batch_jobs_per_state(zk, bid, per_state)
    jids = sorted(j for ids in rows.values() for j in ids)
    by_state: dict[str, list[Job]] = defaultdict(list)
    for start in range(0, len(jids), SCAN_CHUNK):
        for job in jobs_load(zk, jids[start : start + SCAN_CHUNK]):
            if isinstance(job, Job):
                by_state[job.state].append(job)
    ordered = {s: by_state[s] for s in JOB.states if s in by_state}
    ordered.update({s: v for s, v in by_state.items() if s not in ordered})
    # The latest report whole, and the one before it for what changed; older ones as counts.
    try:
        report = report_resolve(zk, batch.bid, batch.report, depth=2)
    except MalformedNode as exc:
        log.warning("%s: %s", exc.path, exc.reason)
        report = batch.report  # shown by its counts
    return BatchDetail(
        batch=batch,
        folders=counted.folders,
        counts={s: n for s, n in counted.states.items() if n},
        by_state=ordered,
        reports=report_views(report),
        report=report,
    )


def batch_one(*, bid: str) -> BatchRow:
    zk = connected_client()
    rows = batch_rows(zk, [zpaths.bid(bid)])
    if not rows:
        raise NotFound(f"batch {bid} does not exist")
    return rows[0]


def batch_preview(*, bid: str) -> tuple[Batch, dict[str, list[str]]]:
    """What a batch delete would remove: the batch and the job IDs it lists."""
    zk = connected_client()
    return batch_load(zk, zpaths.bid(bid)), batch_job_ids(zk, bid)


@dataclass(frozen=True)
class ReportRow:
    batch: Batch
    reports: list[ReportView]


def status_reports(*, page: int = 1, per_page: int = 20, shown: int | None = None) -> Page:
    """Batches that have a status report, newest batch first: which ones comes from the read
    index (each batch's report is looked for once, again only when a watch says it changed);
    only the page's batches are loaded, one round trip, and no report's parts are read: a
    report that keeps its lists in parts is shown by its counts. ``shown``: see report_views."""
    zk = connected_client()
    idx = zindex.for_client(zk)
    bids = idx.reported_batch_ids(wait=not idx.filling)
    page = max(1, page)
    start = (page - 1) * per_page
    rows = [
        ReportRow(b, report_views(b.report, shown=shown))
        for b in batches_load(zk, bids[start : start + per_page])
        if isinstance(b, Batch)
    ]
    return Page(
        rows, page, per_page, len(bids), start + per_page < len(bids), loading=idx.loading()
    )


# Access requests ----------------------------------------------------------------------------


def access_requests(*, queue: str = "", state: str = "") -> list[AccessRequest | Broken]:
    zk = connected_client()
    queues = [zpaths.access_queue(queue)] if queue else list(zpaths.ACCESS_QUEUES)
    items: list[AccessRequest | Broken] = []
    for q in queues:
        items += accesses_load(zk, q, access_ids(zk, q))
    if state:
        items = [i for i in items if isinstance(i, Broken) or i.state == state]
    return items


def access_one(*, queue: str, qid: str) -> AccessRequest:
    return access_load(connected_client(), zpaths.access_queue(queue), zpaths.qid(qid))


# Holds --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldsView:
    holds: Holds
    held_jobs: dict[str, int]  # collection -> Held jobs
    collections: list[str] = field(default_factory=list)  # every collection worth listing
    nodes: dict[int, NodeHold] = field(default_factory=dict)  # held storage nodes
    services: dict[str, ServiceHold] = field(default_factory=dict)  # held services outside
    windows: dict[str, Window] = field(default_factory=dict)  # "<kind>:<name>" -> its window
    # Every hold with who placed it, why and until when (queues/waits.py).
    details: waits.Holds = field(default_factory=lambda: waits.Holds({}, {}, {}))


def holds_view() -> HoldsView:
    zk = connected_client()
    holds = holds_list(zk)
    held = held_jobs_by_collection()
    names = sorted(set(holds.collections) | {c for c in held if c != "(none)"})
    return HoldsView(
        holds=holds,
        held_jobs=held,
        collections=names,
        nodes=node_holds(zk),
        services=service_holds(zk),
        windows={w.key: w for w in maintenance_windows(zk)},
        details=waits.holds_now(zk),
    )


def known_profiles() -> list[str]:
    """Profile names from the profiles folder, for form suggestions; never fails a page."""
    from queues.steps.profiles import ProfileError, all_profiles

    try:
        return [p.name for p in all_profiles()]
    except (ProfileError, OSError):
        return []


def known_nodes(held: Iterable[int] = ()) -> list[tuple[int, str]]:
    """The storage nodes this console knows, for the node-hold field's suggestions: those the
    collection profiles name (with the collections) and those held or given a window in
    ZooKeeper (``held``); never fails a page."""
    from queues.steps.profiles import ProfileError, all_profiles

    named: dict[int, list[str]] = {}
    try:
        profiles = all_profiles()
    except (ProfileError, OSError):
        profiles = []
    for p in profiles:
        if p.storage_node.isdigit() and 0 < int(p.storage_node) < 10**9:
            named.setdefault(int(p.storage_node), []).append(p.name)
    for node in held:
        named.setdefault(int(node), [])
    return [
        (node, ", ".join(sorted(names)[:5]) + (" …" if len(names) > 5 else ""))
        for node, names in sorted(named.items())
    ]


# Consistency --------------------------------------------------------------------------------


def consistency_report(*, kind: str = "", page: int = 1) -> dict[str, Any]:
    """The latest consistency check run (walked in the background: ``queues.consistency``)
    with one page of its findings; never a walk of the tree in this process."""
    from queues import consistency

    return consistency.run_dict(consistency.latest(), kind=kind, page=page)


# Consumers ----------------------------------------------------------------------------------


def consumers_overview() -> dict[str, Any]:
    """The /consumers/ page's and ``/api/consumers``'s data: every registered process with its
    threads (``queues.stuck.consumer_processes``) and the orphan locks it found in its own
    session (``orphan_locks``: each process asks the server for its session's locks at every
    publish, so this page reads the registrations only, never every lock in the tree)."""
    from queues import stuck

    found = stuck.consumer_processes()
    held = orphans = 0
    for process in found["consumers"]:
        paths_ = process.get("orphans") or []
        process["orphan_locks"] = [
            {"path": path, "session": process.get("session", ""), "detail": _orphan_words(process)}
            for path in paths_
        ]
        orphans += process.get("orphans_count", len(paths_))
        held += process.get("locks_count", len(process.get("locks") or []))
    found["orphan_total"] = orphans
    found["locks"] = {
        "held": held,
        "orphans": orphans,
        "heal_seconds": zconsumers.ORPHAN_HEAL_SECONDS,
    }
    return found


def _orphan_words(process: dict[str, Any]) -> str:
    return (
        f"orphan lock held by {process.get('name', '?')} (session {process.get('session', '?')}) "
        "that no thread of it claims: the process deletes it itself after a while, or the "
        "consistency check's repair does"
    )


# Incidents ----------------------------------------------------------------------------------

NODE_FAILURES_MAX = 5000  # jobs one "resume what failed on node N" run lists and resumes


def node_failures(*, node: int, since: datetime, before: datetime) -> tuple[list[Job], bool]:
    """Failed jobs bound for storage node ``node`` that failed in Storing or Recording (the
    steps that reach the node) between ``since`` and ``before``, oldest failure first; and
    whether there were more than ``NODE_FAILURES_MAX``. Only the jobs the index lists as failed
    in those steps are read, a chunk at a time."""
    from queues.zk.maintenance import job_store_node

    zk = connected_client()
    candidates = [
        jid
        for step in (JobState.STORING, JobState.RECORDING)
        for jid in _failed_matches(zk, step=step).jids()
    ]
    found: list[Job] = []
    for start in range(0, len(candidates), 500):
        for job in jobs_load(zk, candidates[start : start + 500]):
            if not isinstance(job, Job) or job.state != JobState.FAILED:
                continue
            failed_at = job.status.last_modified
            if job_store_node(job) != node or failed_at is None:
                continue
            if since <= failed_at <= before:
                found.append(job)
    found.sort(key=lambda j: j.status.last_modified or since)
    return found[:NODE_FAILURES_MAX], len(found) > NODE_FAILURES_MAX
