"""Batches: creation, loading, status moves, the job index, reports, locks and deletion.

Why one module (about 860 lines): creation, moves, the job index folders, reports and deletion
all read and write the same nodes of a batch in the contract's form and share its path and
record helpers; a change of the contract's batch layout is a change here, in one place.
"""

from __future__ import annotations

import heapq
import posixpath
import re
import time
import uuid as uuidlib
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeGuard

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from queues.core.retries import RETRY_KEY
from queues.core.states import BATCH, BATCH_INDEX_FOLDERS, JOB, BatchState, JobState
from queues.core.words import LONG_MAX

from . import index as zindex
from . import paths, sized
from .codecs import decode_json, encode_json, now_stamp
from .errors import (
    Conflict,
    DomainError,
    ItemLocked,
    MalformedNode,
    NotFound,
    StaleVersion,
    StoppedPartway,
    is_connection_error,
)
from .fence import Gate, Gated, current_gate, holder_gate, owner_gate
from .finished import CompletedMemory
from .jobs import job_remove, jobs_load
from .kazoo_private import Multi, session_id
from .locks import lock_create, lock_release
from .nodes import (
    checked,
    children,
    children_many,
    commit,
    exists_many,
    first_failure,
    landed,
    lock_info,
    read_many,
    stamp,
)
from .records import Batch, Broken, Job, Status, decode_each

BATCH_NODES = ("submission", "status", "status-report")
REPORT_HISTORY = 20


def simple_status(
    state: str, message: str = "", old: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Status JSON of batches and access requests: {status, last_modified, message}."""
    raw = dict(old or {})
    raw.pop(RETRY_KEY, None)  # a move ends any wait for a retry
    raw["status"] = state
    raw["last_modified"] = now_stamp()
    raw["message"] = message
    return raw


def batch_retry_later(zk: KazooClient, batch: Batch, retry: dict[str, Any], message: str) -> Batch:
    """Record on the batch, still in its state, that its step is to be tried again: ``message``
    and the console's ``RETRY_KEY`` (``queues.core.retries``) on its status, checked against the
    version it was read at (StaleVersion or Conflict when it changed meanwhile), in a multi
    fenced by the batch's lock (``_Fence``: LockLost, Conflict or ItemLocked when the lock is not
    the writer's)."""
    raw = dict(batch.status.raw)
    raw["last_modified"] = now_stamp()
    raw["message"] = message
    raw[RETRY_KEY] = retry
    path = paths.batch_node(batch.bid, "status")
    data = encode_json(raw)
    # Written as the lock's holder, fenced as the batch consumer's other writes (``_Fence``).
    _Fence(zk, batch.bid).write(
        lambda txn: txn.set_data(path, data, version=batch.status.version),
        what=f"retry of {batch.bid}",
    )
    return replace(
        batch,
        status=Status(raw=raw, version=batch.status.version + 1, mtime=datetime.now().astimezone()),
    )


def batch_create(zk: KazooClient, *, submission: dict[str, Any]) -> Batch:
    """Create a Pending batch with its submission, status and ``/batch-uuids`` entry.

    ``submission["batchID"]`` is the batch's external id: any safe node name
    (``paths.batch_uuid``: Merritt's ingest writes ``bid-<uuid>``); a UUID is generated when the
    key is absent. The ``states`` marker is not written: a batch without it is pending, and it
    is created with the batch's first move out of Pending (``batch_transition``).
    """
    submission = dict(submission)
    batch_uuid = paths.batch_uuid(submission.setdefault("batchID", f"bid-{uuidlib.uuid4()}"))
    # The depositor's fields may be larger than a node; refused before anything is created.
    data = sized.check(
        paths.batch_node("bid0000000000", "submission"), encode_json(submission), what="submission"
    )
    created = zk.create(f"{paths.BATCHES}/bid", b"", sequence=True)
    bid = posixpath.basename(created)
    txn = zk.transaction()
    txn.create(paths.batch_node(bid, "submission"), data)
    txn.create(paths.batch_node(bid, "status"), encode_json(simple_status(BatchState.PENDING)))
    txn.create(paths.uuid_entry(batch_uuid), bid.encode())
    try:
        commit(txn, what="create batch")
    except BaseException:
        zk.delete(created)
        raise
    return batch_load(zk, bid)


def _decode(bid: str, reads: dict[str, Any], stats: dict[str, Any]) -> Batch:
    def node(name: str) -> str:
        return paths.batch_node(bid, name)

    batch_stat = stats[paths.batch(bid)]
    if batch_stat is None:
        raise NotFound(f"batch {bid} does not exist")
    if reads[node("status")] is None or reads[node("submission")] is None:
        raise NotFound(f"batch {bid} is incomplete: its status or submission is missing")
    status_data, status_stat = reads[node("status")]
    problems: dict[str, str] = {}
    report = None
    if reads[node("status-report")] is not None:
        try:
            report = report_read(node("status-report"), reads[node("status-report")][0])
        except MalformedNode as exc:
            problems[exc.path] = exc.reason
    return Batch(
        bid=bid,
        submission=decode_json(node("submission"), reads[node("submission")][0]),
        status=Status(
            raw=decode_json(node("status"), status_data),
            version=status_stat.version,
            mtime=stamp(status_stat.mtime),
        ),
        created=stamp(batch_stat.ctime),
        started=stats[node("states")] is not None,
        report=report,
        lock=lock_info(stats[node("lock")]),
        problems=problems,
    )


def batches_load(zk: KazooClient, bids: Sequence[str]) -> list[Batch | Broken]:
    """Load many batches in one pipelined round trip; skip missing or half-created ones."""
    for bid in bids:
        paths.bid(bid)
    reads = read_many(zk, [paths.batch_node(b, n) for b in bids for n in BATCH_NODES])
    stats = exists_many(
        zk,
        [
            p
            for b in bids
            for p in (paths.batch(b), paths.batch_node(b, "states"), paths.batch_node(b, "lock"))
        ],
    )
    return decode_each("batch", bids, lambda bid: _decode(bid, reads, stats))


def batch_load(zk: KazooClient, bid: str) -> Batch:
    paths.bid(bid)
    reads = read_many(zk, [paths.batch_node(bid, n) for n in BATCH_NODES])
    stats = exists_many(
        zk, [paths.batch(bid), paths.batch_node(bid, "states"), paths.batch_node(bid, "lock")]
    )
    return _decode(bid, reads, stats)


def batch_ids(zk: KazooClient) -> list[str]:
    """Every batch ID, oldest first."""
    return sorted(n for n in children(zk, paths.BATCHES) if paths.BID_RE.fullmatch(n))


def batch_id_for_uuid(zk: KazooClient, batch_uuid: str) -> str:
    path = paths.uuid_entry(batch_uuid)
    try:
        data, _ = zk.get(path)
    except NoNodeError as exc:
        raise NotFound(f"no batch has UUID {batch_uuid}") from exc
    bid: str = data.decode("utf-8", errors="replace").strip()
    return bid


def batch_states(zk: KazooClient, bids: Sequence[str]) -> dict[str, str]:
    """The status name of each batch (pipelined); unreadable ones are left out."""
    reads = read_many(zk, [paths.batch_node(b, "status") for b in bids])
    result = {}
    for bid in bids:
        read = reads[paths.batch_node(bid, "status")]
        if read is None:
            continue
        try:
            result[bid] = str(decode_json(paths.batch_node(bid, "status"), read[0]).get("status"))
        except MalformedNode:
            continue
    return result


_completed = CompletedMemory()


def open_batch_states(zk: KazooClient, bids: Sequence[str]) -> dict[str, str]:
    """``batch_states`` of the batches not already seen Completed (by this client)."""
    found = batch_states(zk, _completed.unknown(zk, bids))
    _completed.remember(zk, (b for b, state in found.items() if state == BatchState.COMPLETED))
    return {b: state for b, state in found.items() if state != BatchState.COMPLETED}


def batch_job_ids(zk: KazooClient, bid: str) -> dict[str, list[str]]:
    """The batch's job index: folder name -> sorted job IDs."""
    found = children_many(zk, [paths.batch_index(bid, f) for f in BATCH_INDEX_FOLDERS])
    return {
        f: sorted(j for j in (found[paths.batch_index(bid, f)] or []) if paths.JID_RE.fullmatch(j))
        for f in BATCH_INDEX_FOLDERS
    }


# A batch's jobs as the read index has them ------------------------------------------------
#
# A batch page or API answer shows counts of all the batch's jobs and a page of them. Both come
# from the read index: the batch's index folders (listed once, kept under a child watch) and the
# job state folders (likewise), a job's state found by binary search in memory. So a batch of
# 10,000 jobs costs the requests of a batch of 10: none when the listings are current.

# The state of a job the state folders do not list (moving, or damaged).
UNLISTED = "?"
# Jobs whose state is looked up at once while a page is gathered.
_STATES_CHUNK = 500


@dataclass(frozen=True)
class BatchJobs:
    """A batch's job counts and one page of its jobs (by job ID) with their states."""

    folders: dict[str, int]  # how many jobs each batch index folder lists
    states: dict[str, int]  # how many jobs are in each state (UNLISTED: in no state folder)
    page: list[tuple[str, str]]  # (jid, state), by job ID
    next: str | None  # the ``after`` of the next page; None when this one is the last

    @property
    def total(self) -> int:
        return sum(self.folders.values())

    def by_state(self) -> dict[str, list[str]]:
        """The page's job IDs per state, in the states' order."""
        found: dict[str, list[str]] = {}
        for jid, state in self.page:
            found.setdefault(state, []).append(jid)
        ordered = {s: found.pop(s) for s in (*JOB.states, UNLISTED) if s in found}
        return {**ordered, **found}


def _listed(idx: zindex.ReadIndex, bid: str) -> dict[str, list[str]]:
    """The batch's index folders' sorted names (empty for a folder that does not exist)."""
    folders = [paths.batch_index(bid, f) for f in BATCH_INDEX_FOLDERS]
    listings = idx._member_listings(folders)
    return {
        f: (listing.names if listing is not None else [])
        for f, listing in zip(BATCH_INDEX_FOLDERS, (listings[p] for p in folders), strict=True)
    }


def _merged(listed: dict[str, list[str]], after: str) -> Iterator[tuple[str, bool]]:
    """Each job ID the folders list after ``after``, once, by ID; with whether only
    batch-deleted lists it (a job removed since: not shown when no state folder has it)."""

    def tail(folder: str, names: list[str]) -> Iterator[tuple[str, bool]]:
        deleted = folder == "batch-deleted"
        for i in range(bisect_right(names, after) if after else 0, len(names)):
            if paths.JID_RE.fullmatch(names[i]):
                yield names[i], deleted

    last = ""
    only_deleted = True
    for jid, deleted in heapq.merge(*(tail(f, n) for f, n in listed.items())):
        if jid != last:
            if last:
                yield last, only_deleted
            last, only_deleted = jid, True
        only_deleted = only_deleted and deleted
    if last:
        yield last, only_deleted


def _classified(
    idx: zindex.ReadIndex, listed: dict[str, list[str]], after: str
) -> Iterator[tuple[str, str]]:
    """(jid, state) for the batch's jobs after ``after``, by ID, looked up a chunk at a time."""
    merged = _merged(listed, after)
    while True:
        chunk = [item for _, item in zip(range(_STATES_CHUNK), merged, strict=False)]
        if not chunk:
            return
        states = idx.job_states_of(jid for jid, _deleted in chunk)
        for jid, deleted in chunk:
            state = states.get(jid)
            if state is not None:
                yield jid, state
            elif not deleted:
                yield jid, UNLISTED


def batch_jobs(
    zk: KazooClient,
    bid: str,
    *,
    state: str = "",
    after: str = "",
    skip: int = 0,
    limit: int = 500,
) -> BatchJobs:
    """The batch's job counts, and ``limit`` of its jobs (in ``state`` if given) after the job
    ID ``after`` (else after the first ``skip`` of them), from the read index: no request per
    job, none at all while the listings are current. A job only ``batch-deleted`` lists and no
    state folder does (removed since) is neither counted in ``states`` nor shown."""
    idx = zindex.for_client(zk)
    counts = idx.batch_job_counts([bid])[bid]
    listed = _listed(idx, bid)
    states = dict(counts.states)
    # batch_job_counts leaves out what batch-deleted lists: the jobs still there are Deleted.
    gone = listed["batch-deleted"]
    if gone:
        deleted = sum(1 for s in idx.job_states_of(gone).values() if s == JobState.DELETED)
        if deleted:
            states[JobState.DELETED] = states.get(JobState.DELETED, 0) + deleted
    page: list[tuple[str, str]] = []
    more = False
    for jid, found in _classified(idx, listed, after):
        if state and found != state:
            continue
        if skip:
            skip -= 1
            continue
        if len(page) == limit:
            more = True
            break
        page.append((jid, found))
    return BatchJobs(
        folders=dict(counts.folders),
        states=states,
        page=page,
        next=page[-1][0] if more and page else None,
    )


def batch_jobs_per_state(
    zk: KazooClient, bid: str, per_state: int
) -> tuple[BatchJobs, dict[str, list[str]]]:
    """The batch's job counts and the first ``per_state`` job IDs of each of its states; the
    walk through its IDs (in memory) stops once every state has its rows."""
    whole = batch_jobs(zk, bid, limit=0)
    wanted = {s: min(n, per_state) for s, n in whole.states.items() if n}
    found: dict[str, list[str]] = {}
    missing = sum(wanted.values())
    if not missing:
        return whole, found
    idx = zindex.for_client(zk)
    for jid, state in _classified(idx, _listed(idx, bid), ""):
        rows = found.setdefault(state, [])
        if len(rows) < per_state:
            rows.append(jid)
            missing -= state in wanted
            if missing <= 0:
                break
    return whole, found


def batch_is_complete(zk: KazooClient, bid: str) -> bool:
    """A started batch is complete when its batch-processing folder exists and is empty.

    Asked after every job's last step: the folder's child count, not its listing, which for a
    batch of N jobs would make the batch's whole run read O(N^2) names.
    """
    stat = zk.exists(paths.batch_index(bid, "batch-processing"))
    return stat is not None and stat.numChildren == 0


class CompletionCheck:
    """``batch_is_complete`` asked of several batches at once, without waiting for the answers
    (one round trip for all of them, shared with whatever is sent meanwhile)."""

    def __init__(self, zk: KazooClient, bids: Iterable[str]) -> None:
        self.asked = [
            (b, zk.exists_async(paths.batch_index(paths.bid(b), "batch-processing"))) for b in bids
        ]

    def ready(self) -> bool:
        """Whether every answer is here (the last sent is the last answered)."""
        return not self.asked or bool(self.asked[-1][1].ready())

    def complete(self) -> list[str]:
        """The batches that are complete (waits for the answers)."""
        return [
            b
            for b, answer in self.asked
            if (stat := answer.get()) is not None and not stat.numChildren
        ]


def batch_transition(
    zk: KazooClient,
    batch: Batch,
    new_state: str,
    *,
    message: str = "",
    admin: bool = False,
    holder: bool = False,
) -> Batch:
    """Write the batch's new status, checked against the version it was read at.

    ``holder``: the caller holds the batch's lock (a consumer's move), and the transaction
    checks it is still there, sent through this thread's gate (``fence.fenced``: the claim's
    session) or, outside a step, only in the session just read to own the lock
    (``fence.owner_gate``); LockLost, nothing sent, once that session is gone. Otherwise (an
    operator, a repair, a move after an operator's) the transaction creates the lock and deletes
    it again, so it fails while any session holds the batch (Merritt's ingest, a consumer of
    ours): ItemLocked, nothing written.

    A move to any state but Pending of a batch that has no ``states`` marker (its first move out
    of Pending: to Processing or Held) creates the marker in the same transaction: the library
    takes a batch without it for a pending one. The marker may already exist (the batch's jobs
    were created first, and their index entries live below it), and it may appear between the
    look and the write: then the write is made again without it, still checked against the
    status version.
    """
    if new_state == BatchState.DELETED:
        raise ValueError("use batch_remove to delete a batch")
    return _move(zk, batch, new_state, message=message, admin=admin, holder=holder)


def _move(
    zk: KazooClient,
    batch: Batch,
    new_state: str,
    *,
    message: str = "",
    admin: bool = False,
    holder: bool = False,
) -> Batch:
    """``batch_transition``'s write, to any state the machine allows (``batch_remove`` marks a
    batch Deleted with it before it removes its jobs)."""
    BATCH.check(batch.state, new_state, admin=admin)
    raw = simple_status(new_state, message, batch.status.raw)
    path = paths.batch_node(batch.bid, "status")
    marker = paths.batch_node(batch.bid, "states")
    what = f"move {batch.bid} from {batch.state} to {new_state}"

    lock = paths.batch_node(batch.bid, "lock")

    # The holder's move goes out in the session that took the lock, or not at all (LockLost):
    # the claim's gate while a step runs, else the lock read to be this session's.
    gate = holder_gate(zk, lock) if holder else None

    def attempt(create_marker: bool) -> None:
        txn = Multi(zk)
        txn.set_data(path, encode_json(raw), version=batch.status.version)
        if create_marker:
            txn.create(marker, b"")
        if holder:
            txn.check(lock, -1)
        else:
            txn.create(lock, b"", ephemeral=True)
            txn.delete(lock)
        try:
            commit(txn if gate is None else Gated(txn, gate), what=what)
        except StaleVersion:
            raise
        except Conflict:
            if not holder and zk.exists(lock) is not None:
                raise _locked(batch) from None
            raise

    try:
        # A marker seen when the batch was read is never removed: no need to look again.
        create_marker = (
            new_state != BatchState.PENDING and not batch.started and zk.exists(marker) is None
        )
        try:
            attempt(create_marker)
        except StaleVersion:
            raise
        except Conflict:
            if not create_marker or zk.exists(marker) is None:
                raise
            attempt(False)  # the marker appeared meanwhile (a job was created)
    except Conflict:
        current = batch_load(zk, batch.bid)
        if landed(current.status, batch.status, raw):
            return current
        raise
    return replace(
        batch,
        status=Status(raw=raw, version=batch.status.version + 1, mtime=datetime.now().astimezone()),
        started=batch.started or new_state != BatchState.PENDING,
    )


def batch_write_report(
    zk: KazooClient,
    batch: Batch,
    *,
    failed: Sequence[str],
    successful: Sequence[str],
    marks: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``status-report``; earlier reports are kept (newest first) under ``history``.
    ``marks``: the reporting daemon's own keys (its round, whether it mailed; later changed by
    ``batch_report_update``), written in the same write as the report.

    Returns the report with its lists whole. The node keeps the contract's form
    (``{last_modified, failed_jobs, successful_jobs, history}``) while that fits in one node;
    when it does not, the lists of the oldest reports, then of the new one, move into part
    nodes below it (``docs/zookeeper-contract-notes.md``, "Status reports of any size").
    """
    _check_marks(marks or {})
    fence = _Fence(zk, batch.bid)
    report: dict[str, Any] = {
        "last_modified": now_stamp(),
        "failed_jobs": sorted(failed),
        "successful_jobs": sorted(successful),
        **(marks or {}),
    }
    path = paths.batch_node(batch.bid, "status-report")
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        data, stat = None, None
    head = dict(report)
    if data is not None:
        try:
            previous = report_read(path, data)
        except MalformedNode:
            previous = None
        if isinstance(previous, dict):
            history = previous.pop("history", [])
            history = (
                [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []
            )
            # A report whose parts are not all there (its writer died before writing them)
            # cannot be read back: it is not kept.
            present = set(children(zk, path))
            head["history"] = [h for h in [previous, *history] if set(_parts_of(h)) <= present][
                :REPORT_HISTORY
            ]
    encoded, parts = _fit_report(path, head)
    what = f"status report of {batch.bid}"
    if stat is None:
        # The parts live below the head, so a first report that needs them names them before
        # they exist; a reader meanwhile waits for them (``report_resolve``).
        fence.write(lambda txn: txn.create(path, encoded), what=what)
        fence.put_parts(parts, what=what)
    else:
        fence.put_parts(parts, what=what)
        fence.write(lambda txn: txn.set_data(path, encoded, version=stat.version), what=what)
    _drop_unnamed_parts(zk, fence, path, decode_json(path, encoded))
    if "history" in head:
        report["history"] = decode_json(path, encoded)["history"]
    return report


REPORT_LISTS = ("failed_jobs", "successful_jobs")
# The report's own keys: the contract's, and those of a report whose lists are in parts. A
# daemon's marks (``batch_write_report``, ``batch_report_update``) may not name them.
REPORT_KEYS = frozenset(
    {
        "last_modified",
        "history",
        *REPORT_LISTS,
        "failed_count",
        "successful_count",
        "serial",
        "parts",
    }
)


def _check_marks(marks: Mapping[str, Any]) -> None:
    taken = sorted(REPORT_KEYS.intersection(marks))
    if taken:
        raise ValueError(f"status report marks may not name the report's own keys: {taken}")


REPORT_PART_RE = re.compile(r"r[0-9]{6}-[0-9]{4}")


def _fit_report(path: str, head: dict[str, Any]) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The head's bytes, and the part nodes to write first, such that the head fits one node:
    the lists of the oldest reports move out first, the new report's last, each only once
    (a report already in parts stays as it is)."""
    encoded = encode_json(head)
    if sized.fits(path, encoded):
        return encoded, []
    head = dict(head)
    history: list[dict[str, Any]] = list(head.get("history", []))
    serial = 1 + max((_serial(e) for e in [head, *history]), default=0)
    parts: list[tuple[str, bytes]] = []
    for index in [*reversed(range(len(history))), None]:
        entry = head if index is None else history[index]
        if "parts" in entry:
            continue
        moved, nodes = _to_parts(path, entry, serial)
        serial += 1
        parts += nodes
        if index is None:
            head = moved
        else:
            history[index] = moved
        if history:
            head["history"] = history
        encoded = encode_json(head)
        if sized.fits(path, encoded):
            return encoded, parts
    raise sized.TooLarge(f"{path}: {len(encoded):,} bytes even with every list in parts")


def _serial(entry: dict[str, Any]) -> int:
    value = entry.get("serial")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _to_parts(
    path: str, entry: dict[str, Any], serial: int
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """An inline report as a summary (counts, the names of its parts, empty lists) and the part
    nodes holding its lists: ``<path>/r<serial>-<n>``, JSON ``{failed_jobs, successful_jobs}``,
    each a slice; read in order they give the lists back."""
    lists = {k: _id_list(entry.get(k)) for k in REPORT_LISTS}
    names = []
    nodes = []
    for n, part in enumerate(sized.split_lists(lists)):
        name = f"r{serial:06d}-{n:04d}"
        names.append(name)
        nodes.append((f"{path}/{name}", encode_json(part)))
    summary = {k: v for k, v in entry.items() if k not in REPORT_LISTS}
    summary.update(
        failed_jobs=[],
        successful_jobs=[],
        failed_count=len(lists["failed_jobs"]),
        successful_count=len(lists["successful_jobs"]),
        serial=serial,
        parts=names,
    )
    return summary, nodes


# A report's list of job IDs as one text, one ID a line: checked whole at C speed (60,000 IDs
# one by one took four times their JSON's decoding).
_JID_LINES = re.compile(r"jid[0-9]{10}(?:\njid[0-9]{10})*")


def _id_list(value: Any) -> list[str]:
    """The job IDs of a report's list as read: another client may have written anything there
    (a number, a list of lists, a name that is no job ID), and what is no job ID is left out."""
    if not isinstance(value, list):
        return []
    try:
        text = "\n".join(value)  # TypeError: an item that is no text
    except TypeError:
        text = ""
    # As long as that many IDs and their separators: no item held a line break of its own.
    if len(text) == 14 * len(value) - 1 and _JID_LINES.fullmatch(text):
        return value
    return [v for v in value if isinstance(v, str) and paths.JID_RE.fullmatch(v)]


def report_read(path: str, data: bytes | None) -> dict[str, Any]:
    """A ``status-report`` node as its readers take it: each report's lists (the current one's
    and its history's) job IDs only, its counts whole numbers, its history reports only."""
    head = _report_entry(decode_json(path, data))
    history = head.get("history")
    if "history" in head:
        head["history"] = [
            _report_entry(h)
            for h in (history if isinstance(history, list) else [])
            if isinstance(h, dict)
        ]
    return head


def _report_entry(entry: dict[str, Any]) -> dict[str, Any]:
    out = dict(entry)
    for key in REPORT_LISTS:
        if key in out:
            out[key] = _id_list(out[key])
        count = key.replace("_jobs", "_count")
        if count in out and not _is_count(out[count]):
            del out[count]
    return out


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= LONG_MAX


def _named_parts(head: dict[str, Any]) -> list[str]:
    """Every part name the head and its history refer to."""
    found: list[str] = []
    history = head.get("history")
    for entry in [head, *(history if isinstance(history, list) else [])]:
        names = entry.get("parts") if isinstance(entry, dict) else None
        if isinstance(names, list):
            found += [n for n in names if isinstance(n, str)]
    return found


def _drop_unnamed_parts(zk: KazooClient, fence: _Fence, path: str, head: dict[str, Any]) -> None:
    """Delete the parts no report names any more (a report gone from the history, a writer that
    died before naming its parts). A reader still holding the old head reads it again."""
    named = set(_named_parts(head))
    fence.delete_many([f"{path}/{n}" for n in children(zk, path) if n not in named])


def report_counts(entry: dict[str, Any]) -> tuple[int, int]:
    """(failed, successful) of one report, without reading its parts."""
    counts = []
    for key in REPORT_LISTS:
        inline = len(_id_list(entry.get(key)))
        total = entry.get(key.replace("_jobs", "_count"))
        counts.append(total if _is_count(total) and "parts" in entry else inline)
    return counts[0], counts[1]


def report_is_whole(entry: dict[str, Any]) -> bool:
    """Whether the report's lists are all in it (no part still to read)."""
    return not isinstance(entry.get("parts"), list) or not entry["parts"]


REPORT_READ_TRIES = 5


def report_resolve(
    zk: KazooClient, bid: str, head: dict[str, Any] | None, *, depth: int | None = None
) -> dict[str, Any] | None:
    """``head`` (a ``status-report`` as read) with the lists of its report, and of the first
    ``depth - 1`` reports of its history (all with None), read back from their parts.

    A part may be gone because the node was rewritten since ``head`` was read: the head is then
    read again. A part still missing after that (a writer died between head and parts) raises
    MalformedNode naming it.
    """
    if head is None:
        return None
    path = paths.batch_node(paths.bid(bid), "status-report")
    for attempt in range(REPORT_READ_TRIES):
        entries = _entries(head, depth)
        names = [n for e in entries for n in _parts_of(e)]
        for name in names:
            if not REPORT_PART_RE.fullmatch(name):
                raise MalformedNode(path, f"{name!r} is not the name of a report part")
        if not names:
            return _whole(head, depth, {})
        asked = [(n, zk.get_async(f"{path}/{n}")) for n in names]
        found: dict[str, dict[str, Any]] = {}
        missing = ""
        for name, answer in asked:
            try:
                value = decode_json(f"{path}/{name}", answer.get()[0])
            except NoNodeError:
                missing = missing or name
                continue
            found[name] = value if isinstance(value, dict) else {}
        if not missing:
            return _whole(head, depth, found)
        try:
            fresh = report_read(path, zk.get(path)[0])
        except NoNodeError as exc:
            raise NotFound(f"{path} is gone") from exc
        if fresh == head:
            time.sleep(0.05 * (attempt + 1))  # a first report's parts follow its head
        head = fresh if isinstance(fresh, dict) else {}
    raise MalformedNode(f"{path}/{missing}", "a part of the status report is missing")


def _parts_of(entry: dict[str, Any]) -> list[str]:
    names = entry.get("parts")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _entries(head: dict[str, Any], depth: int | None) -> list[dict[str, Any]]:
    history = head.get("history")
    chain = [
        head,
        *(h for h in (history if isinstance(history, list) else []) if isinstance(h, dict)),
    ]
    return chain if depth is None else chain[:depth]


def _whole(
    head: dict[str, Any], depth: int | None, found: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    def filled(entry: dict[str, Any]) -> dict[str, Any]:
        names = _parts_of(entry)
        if not names:
            return entry
        out = dict(entry)
        for key in REPORT_LISTS:
            out[key] = _id_list(entry.get(key)) + [
                j for n in names for j in _id_list(found.get(n, {}).get(key))
            ]
        del out["parts"]
        return out

    result = filled(head)
    history = head.get("history")
    if isinstance(history, list):
        keep = len(history) if depth is None else max(0, depth - 1)
        result["history"] = [
            filled(h) if i < keep and isinstance(h, dict) else h for i, h in enumerate(history)
        ]
    return result


def report_changes(
    previous: dict[str, Any] | None, current: dict[str, Any]
) -> dict[str, list[str]]:
    """What changed between two reports: jobs that now succeed, still fail, newly fail."""
    before_failed = set((previous or {}).get("failed_jobs") or [])
    before_ok = set((previous or {}).get("successful_jobs") or [])
    now_failed = set(current.get("failed_jobs") or [])
    now_ok = set(current.get("successful_jobs") or [])
    return {
        "newly_successful": sorted(now_ok - before_ok),
        "still_failed": sorted(now_failed & before_failed),
        "newly_failed": sorted(now_failed - before_failed),
        "gone": sorted((before_failed | before_ok) - (now_failed | now_ok)),
    }


def batches_in_state(zk: KazooClient, state: str) -> list[str]:
    """The IDs of the batches in ``state``, oldest first (one pipelined read of every open
    batch's status)."""
    return [bid for bid, found in open_batch_states(zk, batch_ids(zk)).items() if found == state]


def batch_try_acquire(zk: KazooClient, bid: str, state: str) -> Batch | None:
    """Lock and return batch ``bid`` if it is in ``state``; None when it is locked, gone,
    unreadable or in another state (the lock given back)."""
    lock_path = paths.batch_node(bid, "lock")
    if not lock_create(zk, lock_path):
        return None
    try:
        batch = batch_load(zk, bid)
    except (NotFound, MalformedNode):
        lock_release(zk, lock_path)
        return None
    if batch.state != state:
        lock_release(zk, lock_path)
        return None
    return batch


def batch_unlock(zk: KazooClient, batch: Batch) -> None:
    lock_release(zk, paths.batch_node(batch.bid, "lock"))


# The status message of a batch ``batch_remove`` marked Deleted before removing its jobs: one
# left so (the removal stopped part-way) is removed by cleanup whatever its age.
BEING_DELETED = "being deleted by an operator"


def batch_remove(
    zk: KazooClient,
    batch: Batch,
    *,
    check_state: bool = True,
    expect: Mapping[str, int] | None = None,
) -> list[str]:
    """Delete a batch and every job it lists; returns the deleted job IDs.

    ``expect``: the status version of each job as it was read (retention's archive removes what
    it archived, no other version): a job of the batch not in it, or changed since, is a
    Conflict, before the first write or, met later, a stop part-way.

    Everything a removal needs is checked before the first write, and a refusal writes
    nothing: the batch or any of its jobs locked by a session (Merritt's ingest, a consumer:
    ItemLocked), a job in a state this console does not know (Conflict).

    A batch may hold thousands of jobs, more than one transaction may carry, so the jobs go
    each in its own transaction. First the batch is marked Deleted (the contract's move, one
    version-checked write refused while any session holds the batch), so that a delete stopped
    part-way (a lock taken after the look, a change, ZooKeeper lost) never leaves a batch that
    still says Failed or Completed, with a report naming jobs that are gone: it leaves a batch
    marked Deleted with the jobs not yet removed, and StoppedPartway says which were; a second
    delete (or remove, or cleanup) finishes the work. The batch's own nodes go last, in one
    transaction.
    """
    if check_state:
        BATCH.check_delete(batch.state)  # an already Deleted batch is removed
    lock = paths.batch_node(batch.bid, "lock")
    if zk.exists(lock) is not None:
        raise _locked(batch)
    index = batch_job_ids(zk, batch.bid)
    jids = sorted({j for jids in index.values() for j in jids})
    loaded, unread = _refuse_before_removing(zk, batch, jids, expect)
    before = batch
    deleted: list[str] = []
    try:
        # A batch the machine cannot mark Deleted is removed unmarked (``check_state`` False).
        if jids and BATCH.allows(batch.state, BatchState.DELETED, admin=True):
            batch = _move(zk, batch, BatchState.DELETED, message=BEING_DELETED, admin=True)
        for jid in jids:
            try:
                if jid in unread:
                    remove_tree(zk, paths.job(jid), f"job {jid}")
                elif jid in loaded:
                    # As read before the first write: one changed since stops the delete
                    # (Conflict, a stop part-way) rather than going unlooked-at.
                    job_remove(zk, loaded[jid], check_state=False)
                else:
                    continue  # gone already, or another batch's
            except (NotFound, Conflict):
                if zk.exists(paths.job(jid)) is not None:
                    raise
                continue  # gone meanwhile (another delete): nothing of it left to remove
            deleted.append(jid)
        _remove_batch_nodes(zk, batch, lock)
    except Exception as exc:
        wrote = batch.status.version != before.status.version or deleted
        if not wrote or not (isinstance(exc, DomainError) or is_connection_error(exc)):
            raise  # nothing written yet (or a fault of the program: not a refusal)
        gone = set(deleted)
        left = [j for j in jids if j not in gone]
        marked = (
            f"was marked Deleted (it was {before.state})"
            if before.state != BatchState.DELETED
            else "is marked Deleted"
        )
        raise StoppedPartway(
            f"delete of batch {batch.bid} stopped part-way ({str(exc) or type(exc).__name__}): "
            f"the batch {marked} "
            f"and {len(deleted)} of its {len(jids)} jobs removed"
            f"{_named(deleted)}; the batch and {len(left)} jobs{_named(left)} are still there: "
            "delete or remove it again to finish",
            done=(batch.bid, *deleted),
            cause=exc,
        ) from exc
    return deleted


def _named(jids: Sequence[str], most: int = 20) -> str:
    """`` (jid1, jid2, ...)`` for a message, the first ``most`` of them named."""
    if not jids:
        return ""
    more = f" and {len(jids) - most} more" if len(jids) > most else ""
    return f" ({', '.join(jids[:most])}{more})"


def _remove_batch_nodes(zk: KazooClient, batch: Batch, lock: str) -> None:
    """The batch's own nodes and its ``/batch-uuids`` entry, in one transaction checked against
    the status version read (``batch``)."""
    tree = _tree(zk, paths.batch(batch.bid))
    if lock in tree:
        raise _locked(batch)  # taken since the look above; a later one fails the root's delete
    txn = zk.transaction()
    for path in tree:
        if path == paths.batch_node(batch.bid, "status"):
            txn.delete(path, version=batch.status.version)
        else:
            txn.delete(path)
    uuid_entry = _own_uuid_entry(zk, batch)
    if uuid_entry is not None:
        txn.delete(uuid_entry[0], version=uuid_entry[1])
    commit(txn, what=f"delete {batch.bid}")


def _refuse_before_removing(
    zk: KazooClient, batch: Batch, jids: Sequence[str], expect: Mapping[str, int] | None
) -> tuple[dict[str, Job], list[str]]:
    """Before anything is written, the batch's jobs read (pipelined, 500 a round trip): those of
    this batch by ID, and the IDs of those that cannot be read. ItemLocked when a session holds a
    job of the batch (read or not: a job that cannot be read has its lock looked for), Conflict
    when a job is in a state this console does not know (a newer Merritt library's: such a job
    is shown, never modified or removed), or, with ``expect``, is not the version read or cannot
    be read."""
    loaded: dict[str, Job] = {}
    unread: list[str] = []
    for start in range(0, len(jids), 500):
        for job in jobs_load(zk, jids[start : start + 500]):
            if isinstance(job, Broken):
                if expect is not None:
                    raise Conflict(f"batch {batch.bid}: job {job.id} cannot be read")
                unread.append(job.id)
                continue
            if job.bid != batch.bid:
                continue
            _check_expected(batch, job, expect)
            if not JOB.is_state(job.state):
                raise Conflict(
                    f"batch {batch.bid}: job {job.jid} is in a state this console does not know "
                    f"({job.state!r}); the batch and its jobs are left as they are"
                )
            if job.lock is not None:
                raise _job_locked(batch, job.jid)
            loaded[job.jid] = job
    locks = exists_many(zk, [paths.job_node(jid, "lock") for jid in unread])
    for jid in unread:
        if locks[paths.job_node(jid, "lock")] is not None:
            raise _job_locked(batch, jid)
    return loaded, unread


def _check_expected(batch: Batch, job: Job, expect: Mapping[str, int] | None) -> None:
    if expect is not None and expect.get(job.jid) != job.status.version:
        raise Conflict(
            f"batch {batch.bid}: job {job.jid} changed since it was read (or joined the batch "
            "since); it is left as it is"
        )


def _job_locked(batch: Batch, jid: str) -> ItemLocked:
    return ItemLocked(
        f"batch {batch.bid}: job {jid} is locked by a running consumer (of the console or "
        "Merritt's); nothing was deleted, try again once it is free"
    )


def _own_uuid_entry(zk: KazooClient, batch: Batch) -> tuple[str, int] | None:
    """The batch's ``/batch-uuids`` entry and its version, when it names this batch.

    Whatever the batchID looks like: only a name no node can have is skipped. An entry that
    names another batch (a later batch with the same batchID) is left to that batch.
    """
    if not paths.is_batch_uuid(batch.uuid):
        return None
    path = paths.uuid_entry(batch.uuid)
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None
    if data.decode("utf-8", errors="replace").strip() != batch.bid:
        return None
    return path, stat.version


def _tree(zk: KazooClient, root: str) -> list[str]:
    """Every node below and including ``root``, deepest first (the order deletes need)."""
    found: list[str] = []

    def walk(path: str) -> None:
        for kid in children(zk, path):
            walk(f"{path}/{kid}")
        found.append(path)

    walk(root)
    return found


def _locked(batch: Batch) -> ItemLocked:
    return ItemLocked(f"batch {batch.bid} is locked by a running consumer; try again later")


def remove_tree(zk: KazooClient, root: str, what: str) -> None:
    """Every node of ``root`` in one transaction, unless ``root`` has a lock: ItemLocked then
    (a lock is deleted only by its owner; one taken after the listing fails the root's delete:
    Conflict). A malformed job of a batch deleted, an abandoned half-created item repaired."""
    tree = _tree(zk, root)
    if f"{root}/lock" in tree:
        raise ItemLocked(f"{what} is locked by a running consumer; try again later")
    txn = zk.transaction()
    for path in tree:
        txn.delete(path)
    commit(txn, what=f"remove {root}")


def batch_report_update(zk: KazooClient, bid: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into ``/batches/BID/status-report`` (version-checked, other keys kept):
    the reporting daemon's bookkeeping keys (which reporting round the report belongs to,
    whether its mail went out). Returns the node as written (its lists may be in parts)."""
    path = paths.batch_node(paths.bid(bid), "status-report")
    _check_marks(changes)
    fence = _Fence(zk, paths.bid(bid))
    try:
        data, stat = zk.get(path)
    except NoNodeError as exc:
        raise NotFound(f"{path} does not exist") from exc
    value = decode_json(path, data)
    if not isinstance(value, dict):
        raise MalformedNode(path, "expected a JSON object")
    value.update(changes)
    data = sized.check(path, encode_json(value))
    fence.write(lambda txn: txn.set_data(path, data, version=stat.version), what=path)
    return value


class _Fence:
    """How a write to a batch's nodes other than its move is fenced (the contract's "Deleting a
    lock": every other write is fenced like a move), each in a multi of its own:

    - in a step (``fence.fenced``: the batch consumer holds the lock), a ``check`` that the lock
      is still there, sent through the claim's gate: LockLost, nothing sent, once the session
      that took it is gone;
    - outside one, with the lock this session's (read now), the same, sent only in that
      session (``fence.owner_gate``); with another's, ItemLocked and nothing written;
    - with no lock, the lock created and deleted again in the multi, as an operator's move:
      refused (ItemLocked) while any session holds the batch.

    A write refused by the fence (the lock gone, or taken) answers Conflict or ItemLocked; the
    multi wrote nothing."""

    def __init__(self, zk: KazooClient, bid: str) -> None:
        self.zk = zk
        self.bid = bid
        self.lock = paths.batch_node(bid, "lock")
        gate: Gate | None = current_gate()
        if gate is None:
            stat = zk.exists(self.lock)
            if stat is not None:
                if stat.ephemeralOwner != session_id(zk):
                    raise ItemLocked(f"batch {bid} is locked by another session; try again later")
                gate = owner_gate(zk, self.lock)
        self.gate = gate
        self.ops = 1 if gate is not None else 2  # the fence's operations, first in each multi

    def multi(self) -> Multi:
        txn = Multi(self.zk)
        if self.gate is not None:
            txn.check(self.lock, -1)
        else:
            txn.create(self.lock, b"", ephemeral=True)
            txn.delete(self.lock)
        return txn

    def send(self, txns: Sequence[Multi]) -> list[list[Any]]:
        """Each multi's results; all of them sent at once (through the gate)."""

        def queue() -> list[Any]:
            return [txn.commit_async() for txn in txns]

        answers = queue() if self.gate is None else self.gate(queue)
        return [list(answer.get()) for answer in answers]

    def checked(self, results: list[Any], *, what: str) -> list[Any]:
        failed = first_failure(results)
        if failed is not None and failed < self.ops:
            if self.gate is None:
                raise ItemLocked(f"{what}: batch {self.bid} is locked by a consumer meanwhile")
            raise Conflict(f"{what}: the lock of batch {self.bid} is gone")
        return checked(results, what=what)

    def write(self, add: Any, *, what: str) -> list[Any]:
        txn = self.multi()
        add(txn)
        return self.checked(self.send([txn])[0], what=what)

    def put_parts(self, nodes: Sequence[tuple[str, bytes]], *, what: str) -> None:
        """Create each node, or overwrite it when it exists (each in its own multi)."""
        for path, data in nodes:
            sized.check(path, data, what=what)

        def multis(overwrite: bool, todo: Sequence[tuple[str, bytes]]) -> list[Multi]:
            txns = []
            for path, data in todo:
                txn = self.multi()
                if overwrite:
                    txn.set_data(path, data)
                else:
                    txn.create(path, data)
                txns.append(txn)
            return txns

        existing = []
        for node, results in zip(nodes, self.send(multis(False, nodes)), strict=True):
            if first_failure(results) == self.ops and isinstance(
                results[self.ops], NodeExistsError
            ):
                existing.append(node)
                continue
            self.checked(results, what=what)
        for results in self.send(multis(True, existing)):
            self.checked(results, what=what)

    def delete_many(self, paths_: Sequence[str]) -> None:
        """Delete nodes (each in its own multi); one already gone is fine."""
        txns = []
        for path in paths_:
            txn = self.multi()
            txn.delete(path)
            txns.append(txn)
        for path, results in zip(paths_, self.send(txns), strict=True):
            if first_failure(results) == self.ops and isinstance(results[self.ops], NoNodeError):
                continue
            self.checked(results, what=f"delete {path}")
