"""The console's batch list and a batch's page: rows from the read index's batch states and job
counts, filters on what a batch's submission says, archived batches after the live ones, the
status reports and a batch's jobs per state.
"""

from __future__ import annotations

import heapq
import logging
import threading
from array import array
from bisect import bisect_right
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from queues.console import submissions
from queues.console.job_reads import PER_PAGE, SCAN_CHUNK, Page, archived_batch_item, shown_now
from queues.console.submissions import NONE as NO_SUBMISSION
from queues.console.submissions import Submission
from queues.core.per_key import PerKey
from queues.core.states import BATCH, BATCH_INDEX_FOLDERS, JOB, job_batch_folder
from queues.zk import index as zindex
from queues.zk import paths as zpaths
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
from queues.zk.errors import MalformedNode, NotFound, StillReading
from queues.zk.jobs import jobs_load
from queues.zk.records import Batch, Broken, Job

log = logging.getLogger("queues.console.batch_reads")


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
        # Until now by the server's clock, which stamped the batch's nodes (servertime).
        end = until.timestamp() if until else shown_now()
        return max(0.0, end - batch.created.timestamp())


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
# per batch for the batch list's filters, and forgotten when the batch is gone. They are
# prepared once per change of the read index's batch list (``_Prepared``), so that a filter
# asked for the first time looks at the batches it may match, not at every batch; and each
# filter's answer is kept for as long as the batch list (and, for a state, its batch states)
# are the same objects, so a filtered page asked again costs what an unfiltered one does.
_NL, _SEP = "\n", "\x1f"


@dataclass(frozen=True)
class _Prepared:
    """Every live batch's submission facts, newest first, for the filters: the submitters and
    titles as one string of lines (``str.find`` in C finds the batches holding a text), and
    the batches of each collection and each own ID."""

    every: list[str]  # the read index's batch list these were made of (oldest first)
    newest: list[str]
    subs: list[Submission]
    blob: str  # per batch: newline, submitter, separator, title
    starts: array[int]  # where each batch's line starts in ``blob``
    by_profile: dict[str, list[int]]  # collection -> lines, in order
    by_own_id: dict[str, list[int]]

    @classmethod
    def of(cls, every: list[str], subs: dict[str, Submission]) -> _Prepared:
        newest = list(reversed(every))
        facts = [subs.get(b, NO_SUBMISSION) for b in newest]
        parts, starts, at = [], array("q"), 0
        by_profile: dict[str, list[int]] = {}
        by_own_id: dict[str, list[int]] = {}
        for i, sub in enumerate(facts):
            line = _NL + _flat(sub.submitter.lower()) + _SEP + _flat(sub.title.lower())
            starts.append(at)
            at += len(line)
            parts.append(line)
            by_profile.setdefault(sub.profile, []).append(i)
            if sub.own_id:
                by_own_id.setdefault(sub.own_id, []).append(i)
        return cls(every, newest, facts, "".join(parts), starts, by_profile, by_own_id)

    def holding(self, text: str) -> Iterator[int]:
        """The lines whose submitter or title holds ``text`` (lowered), in order."""
        if _NL in text or _SEP in text:  # never in the string: every line is looked at
            yield from range(len(self.newest))
            return
        blob, starts = self.blob, self.starts
        at = blob.find(text)
        while at >= 0:
            i = bisect_right(starts, at) - 1
            yield i
            if i + 1 >= len(starts):
                return
            at = blob.find(text, starts[i + 1])

    def candidates(self, flt: BatchFilter) -> Iterable[int]:
        """Lines that may match ``flt`` (a superset, in order), from its most telling part."""
        if flt.q:
            own = self.by_own_id.get(flt.q, [])
            return (
                sorted({*self.holding(flt.q.lower()), *own}) if own else self.holding(flt.q.lower())
            )
        if flt.submitter:
            return self.holding(flt.submitter.lower())
        return self.by_profile.get(flt.profile, [])


def _flat(text: str) -> str:
    return text.replace(_NL, " ").replace(_SEP, " ")


class _BatchFilters:
    def __init__(self) -> None:
        self.prepared: _Prepared | None = None
        self.filtered: OrderedDict[tuple[Any, ...], tuple[Any, list[str]]] = OrderedDict()


# Per read index (one per ZooKeeper client: batch IDs of another queue are other batches).
_filters_of: PerKey[Any, _BatchFilters] = PerKey(lambda _idx: _BatchFilters())
_filter_lock = threading.Lock()  # what a _BatchFilters holds


FILTERS_KEPT = 32


def _prepared(zk: Any, idx: Any) -> _Prepared:
    """The filters' facts of every live batch, made again when the batch list changed (the
    submissions of new batches read, those of gone batches forgotten)."""
    kept = _filters_of(idx)
    every = idx.batch_ids()
    with _filter_lock:
        prepared = kept.prepared
        if prepared is not None and prepared.every is every:
            return prepared

    def between(known: int) -> None:
        if idx.filling and zindex.past_answer_time():
            # Right after a start the fill shares the connection: what is read is kept, and
            # the next request (the loading page asks again) reads on from there.
            raise StillReading(
                f"the submissions of the batches, for the batch list's filters: "
                f"{min(known, len(every)):,} of {len(every):,} read"
            )

    # While the index fills, in the fill's smaller parts: a request stops nearer its deadline.
    chunk = zindex.FILL_CHUNK if idx.filling else zindex.READ_CHUNK
    subs = submissions.read(zk, every, chunk=chunk, between=between)
    submissions.forget_gone(zk, every)
    prepared = _Prepared.of(every, subs)
    with _filter_lock:
        kept.prepared = prepared
    return prepared


def _batches_filtered(
    zk: Any, idx: Any, bids: list[str], flt: BatchFilter, states: Any
) -> list[str]:
    """``bids`` (newest first; of ``states``' state when the filter has one) whose submission
    matches the filter's profile, submitter and title or own ID, kept per batch list and batch
    states."""
    kept = _filters_of(idx)
    every = idx.batch_ids()
    key = (flt.state, flt.profile, flt.submitter.lower(), flt.q)
    basis = (every, states if flt.state else None)
    with _filter_lock:
        found = kept.filtered.get(key)
        if found is not None and found[0][0] is basis[0] and found[0][1] is basis[1]:
            kept.filtered.move_to_end(key)
            return list(found[1])
    prepared = _prepared(zk, idx)
    allowed = set(bids) if flt.state else None
    submitter, q = flt.submitter.lower(), flt.q
    keep = []
    for i in prepared.candidates(flt):
        b = prepared.newest[i]
        if allowed is not None and b not in allowed:
            continue
        sub = prepared.subs[i]
        if flt.profile and sub.profile != flt.profile:
            continue
        if submitter and submitter not in sub.submitter.lower():
            continue
        if q and not (q == sub.own_id or q.lower() in sub.title.lower()):
            continue
        keep.append(b)
    with _filter_lock:
        if not flt.state or not idx.filling:  # a state's answer while filling is partial
            kept.filtered[key] = (basis, keep)
        while len(kept.filtered) > FILTERS_KEPT:
            kept.filtered.popitem(last=False)
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
    # Those of the loaded jobs that cannot be read (a node another client wrote oddly).
    unreadable: list[Broken] = field(default_factory=list)

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
    unreadable: list[Broken] = []
    for start in range(0, len(jids), SCAN_CHUNK):
        for job in jobs_load(zk, jids[start : start + SCAN_CHUNK]):
            if isinstance(job, Job):
                by_state[job.state].append(job)
            elif isinstance(job, Broken):
                unreadable.append(job)
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
        unreadable=unreadable,
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
