"""The consistency check: what Merritt's tools call orphans, and more.

It walks the whole tree once and compares every job, batch and index entry with what the
contract says should exist, reporting each difference as a Finding. ``repair`` fixes the ones
that are safe: the job's own status node is the truth and index entries are rebuilt from it;
nothing that holds depositor data (a job's configuration, a batch's submission) is deleted unless
it is an abandoned, half-created item.

The walk holds at most a chunk of items at a time (``CHUNK`` jobs or batches, read pipelined, two
chunks in flight): a million-job queue is checked in about the memory of its IDs. What it must
remember about every job -- where the state folders list it, its batch and batch folder -- is
kept in flat arrays indexed by the job's place among the sorted job numbers (``queues.zk.scan``
reads folder listings straight from the answer's bytes into such arrays). Findings go to a sink
as they are found (the database, for a background run: ``queues.consistency``), not into a list
that grows with the damage.

The check never repairs an item the console does not own. A batch or job Merritt's ingest wrote
(no ``payload_url``: its payload is on ingest's own disk) is reported with what an operator should
do instead, since Merritt's library reads the tree by its own rules: it takes a batch without a
``states`` marker for a pending one, so creating the marker on a batch Merritt holds strands it
for good once released. Beside Merritt (``beside_merritt``), an item whose writer cannot be told
(half-created, no configuration or submission to read) is not repaired either.

Locks are read once too (items' ``lock`` children and the per-object locks), with their owner
session: a lock held by a live console process (its registration node has the same
``ephemeralOwner``) whose published ledger does not list it is an orphan, a lock no thread of
that process works under and none will release (issue 23). /consumers/ does not read every
lock: each process finds its own orphans (``registration.ProcessObserver.check_unclaimed``).
A lock held far too long by a live session that is not a console process (Merritt's own
consumer at work) is never broken.
"""

from __future__ import annotations

import posixpath
import time
from array import array
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from queues.states import (
    BATCH_INDEX_FOLDERS,
    JOB,
    BatchState,
    job_batch_folder,
    job_index_folder,
)
from queues.zk import paths, scan
from queues.zk.batches import batch_load, batch_transition, batches_load
from queues.zk.client import Client
from queues.zk.codecs import decode_json, decode_str
from queues.zk.consumers import Registration, registrations
from queues.zk.errors import (
    BadVersion,
    MalformedNode,
    NodeExists,
    NoNode,
    NotEmpty,
    NotFound,
    Unavailable,
)
from queues.zk.jobs import jobs_finish_load, jobs_load, load_paths
from queues.zk.locks import lock_break
from queues.zk.nodes import (
    children,
    children_many,
    collect_reads,
    exists_many,
    read_many,
    stamp,
    start_reads,
)
from queues.zk.records import Batch, Broken, Job, decode_each
from queues.zk.side_effects import CALLBACKS
from queues.zk.store_intents import STORE_INTENTS

# The console's own records of a job's side effects outside ZooKeeper, one node per job.
SIDE_EFFECT_FOLDERS = (STORE_INTENTS, CALLBACKS)

# A half-created item older than this was abandoned by its writer and can be removed.
ABANDONED_SECONDS = 3600
# Jobs or batches read at once (two such reads are in flight while the previous is checked).
CHUNK = 500
# Findings that may be moves in flight kept waiting for their second look; past this many the
# walk pauses to look at the oldest ones, so the queue of them cannot grow with the damage.
RECHECK_MAX = 5000

CONSOLE, MERRITT, UNKNOWN = "console", "merritt", "unknown"


@dataclass(frozen=True)
class Finding:
    kind: str
    path: str
    detail: str
    repairable: bool = False
    # An orphan lock's owner and creation zxid: repair deletes that very node, not a lock
    # taken again since under the same path.
    session: int = 0
    czxid: int = 0
    # "merritt" for an item Merritt's ingest wrote: reported with ``advice``, never repaired.
    owner: str = ""
    advice: str = ""
    # The index entries the check found for the job, so repair can remove the wrong ones
    # without listing every state folder again.
    seen: tuple[str, ...] = ()


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    jobs: int = 0
    batches: int = 0
    index_entries: int = 0
    found: int = 0  # findings reported (also when they went to a sink, not to ``findings``)
    checked_at: datetime = field(default_factory=lambda: datetime.now().astimezone())

    @property
    def ok(self) -> bool:
        return not self.findings and not self.found

    def by_kind(self) -> dict[str, list[Finding]]:
        grouped: dict[str, list[Finding]] = defaultdict(list)
        for finding in self.findings:
            grouped[finding.kind].append(finding)
        return dict(grouped)


@dataclass(frozen=True)
class Progress:
    """How far a check got: ``done`` of ``total`` in ``phase``."""

    phase: str
    done: int
    total: int
    findings: int

    def __str__(self) -> str:
        of = f" {self.done}/{self.total}" if self.total else ""
        return f"{self.phase}{of}: {self.findings} finding{'' if self.findings == 1 else 's'}"


def _age(stat_ctime_ms: int) -> float:
    return (datetime.now().astimezone() - stamp(stat_ctime_ms)).total_seconds()


# Findings a move in flight shows for a moment: a consumer's or operator's transaction is
# atomic, but the check reads the index folders and the status nodes at different instants.
# Each is read again RECHECK_SECONDS after it was found and reported only when still there.
TRANSIENT_KINDS = frozenset(
    {
        "job-unindexed",
        "job-multiple-index",
        "job-misindexed",
        "orphan-index",
        "orphan-batch-index",
        "batch-index-wrong",
        "batch-complete-not-reporting",
        # A lock being released: the ledger already let it go, the delete is in flight.
        "orphan-lock",
    }
)
RECHECK_SECONDS = 1.0
JOB_INDEX_KINDS = frozenset(
    {"job-unindexed", "job-multiple-index", "job-misindexed", "batch-index-wrong"}
)

# What an operator should do about a finding on an item Merritt's ingest wrote.
_MERRITT_JOB = (
    "Merritt's ingest wrote this job (it has no payload_url) and the console does not change "
    "Merritt's items. Merritt's library writes a move as separate writes, so a consumer that "
    "stopped half-way leaves this; if no Merritt consumer holds the job's lock, ask Merritt's "
    "operators to set it right with their own tools."
)
MERRITT_ADVICE: dict[str, str] = {
    **dict.fromkeys(JOB_INDEX_KINDS, _MERRITT_JOB),
    "batch-states-missing-held": (
        "A batch Merritt's ingest wrote, held by Merritt's library, which writes no states "
        "marker and finds a pending batch by the marker's absence: leave it as it is (creating "
        "the marker would hide it from Merritt's batch consumer for good once released). "
        "Release it here or with Merritt's tools when it should go on."
    ),
    "batch-states-missing": (
        "A batch Merritt's ingest wrote: Merritt's library finds pending batches by the "
        "marker's absence and the console does not write Merritt's items. If Merritt's batch "
        "consumer keeps taking it up again, ask Merritt's operators."
    ),
    "batch-complete-not-reporting": (
        "A batch Merritt's ingest wrote: Merritt's own batch consumer moves it to Reporting "
        "when it next looks. If it stays Processing, ask Merritt's operators."
    ),
    "incomplete-job": (
        "Possibly half-written by Merritt's ingest (its library creates an item in several "
        "writes): check with Merritt's operators before removing it."
    ),
    "stale-lock": (
        "Held by a live session that is not a console process (one of Merritt's services at "
        "work): it goes when that session ends. Ask that service's operators rather than "
        "breaking it, or the item may be worked on twice."
    ),
}
MERRITT_ADVICE["incomplete-batch"] = MERRITT_ADVICE["incomplete-job"]


# Only a lock's owner deletes it (docs/zookeeper-contract-notes.md, "Deleting a lock"): a check
# run from another process reads the owner, but another session's lock may have taken the path
# between that read and a delete. The owning process finds its own orphans and deletes them.
ORPHAN_LOCK_ADVICE = (
    "Its own process deletes it: every consumer looks for locks of its session that no thread "
    "claims at each registration write and deletes them after 30 s. Still here after a minute: "
    "restart that process (its locks go with its session)."
)


def owner_of(document: Mapping[str, Any] | None) -> str:
    """Who wrote a job (its configuration) or batch (its submission): the console gives every
    item a ``payload_url``; Merritt's ingest keeps the payload on its own disk and writes none."""
    if document is None:
        return UNKNOWN
    return CONSOLE if document.get("payload_url") else MERRITT


def _jid_path(num: int) -> str:
    return f"jid{num:010d}"


def _bid_path(num: int) -> str:
    return f"bid{num:010d}"


def _jid_in(path: str) -> str:
    """The job ID a finding's path names (an index entry's or a job node's)."""
    match = paths.INDEX_ENTRY_RE.fullmatch(posixpath.basename(path))
    if match:
        return match.group(2)
    return next((p for p in path.split("/") if paths.JID_RE.fullmatch(p)), "")


class Checker:
    """One walk over the tree; ``run`` gives the Report (findings in it only without a sink)."""

    def __init__(
        self,
        zk: Client,
        *,
        sink: Callable[[Finding], None] | None = None,
        progress: Callable[[Progress], None] | None = None,
        stale_lock_seconds: float = 6 * 3600,
        recheck_seconds: float = RECHECK_SECONDS,
        chunk: int = CHUNK,
        beside_merritt: bool = False,
    ) -> None:
        self.zk = zk
        self.report = Report()
        self._sink = sink if sink is not None else self.report.findings.append
        self._progress = progress or (lambda _p: None)
        self.stale_lock_seconds = stale_lock_seconds
        self.recheck_seconds = recheck_seconds
        self.chunk = chunk
        self.beside_merritt = beside_merritt
        self._waiting: deque[tuple[float, Finding]] = deque()
        self.held: list[Registration] = []
        # The most jobs or batches decoded at once: what the walk holds of the tree.
        self.largest_chunk = 0
        self.chunks = 0
        self._phase = ("starting", 0, 0)

    # Output --------------------------------------------------------------------------------

    def _say(self, phase: str, done: int = 0, total: int = 0) -> None:
        # kazoo queues requests while it reconnects: without this a walk would hang through
        # an outage instead of saying that ZooKeeper is gone.
        if not self.zk.connected:
            raise Unavailable("the connection to ZooKeeper is down; reconnecting")
        self._phase = (phase, done, total)
        self._progress(Progress(phase, done, total, self.report.found))

    def _emit(self, finding: Finding) -> None:
        self.report.found += 1
        self._sink(finding)

    def _found(self, finding: Finding) -> None:
        if finding.kind in TRANSIENT_KINDS and self.recheck_seconds > 0:
            self._waiting.append((time.monotonic() + self.recheck_seconds, finding))
            if len(self._waiting) > RECHECK_MAX:
                time.sleep(max(0.0, self._waiting[0][0] - time.monotonic()))
                self._recheck_due()
        else:
            self._emit(finding)

    def _ours(self, owner: str) -> bool:
        return owner == CONSOLE or (owner == UNKNOWN and not self.beside_merritt)

    def _owned(self, finding: Finding, owner: str, advice_key: str = "") -> Finding:
        """``finding`` as repairable only when the item is ours; Merritt's get advice instead."""
        if self._ours(owner):
            return finding
        return replace(
            finding,
            repairable=False,
            owner=MERRITT if owner == MERRITT else UNKNOWN,
            advice=MERRITT_ADVICE.get(advice_key or finding.kind, ""),
        )

    def _noted(self, loaded: Sequence[Any]) -> None:
        self.chunks += 1
        self.largest_chunk = max(self.largest_chunk, len(loaded))

    # The walk ------------------------------------------------------------------------------

    def run(self) -> Report:
        self._say("reading the console processes' registrations")
        self.held = registrations(self.zk)
        self._say("listing jobs and state folders")
        self._list_jobs()
        self._check_batches()
        self._check_jobs()
        self._check_batch_indexes()
        self._check_uuids()
        self._check_side_effect_records()
        self._check_other_locks()
        if self._waiting:
            self._say(f"re-checking {len(self._waiting)} findings that may be moves in flight")
            time.sleep(self.recheck_seconds)
            self._recheck_due(everything=True)
        self._say("done")
        return self.report

    def _pos(self, num: int) -> int:
        """The job's place among the listed jobs, or -1."""
        i = bisect_left(self.jobs, num)
        return i if i < len(self.jobs) and self.jobs[i] == num else -1

    def _bpos(self, num: int) -> int:
        i = bisect_left(self.batches, num)
        return i if i < len(self.batches) and self.batches[i] == num else -1

    def _list_jobs(self) -> None:
        zk = self.zk
        self.jobs = scan.list_ids(zk, paths.JOBS, "jid").numbers
        count = len(self.jobs)
        known = {job_index_folder(s) for s in JOB.states}
        self.folders = sorted(children(zk, paths.JOB_STATES))[:254]
        # Where the state folders list each job: the first entry as (folder + 1, priority),
        # any further ones by path (a healthy tree has none).
        self.first = bytearray(count)
        self.priority = bytearray(count)
        self.more: dict[int, list[str]] = {}
        pending = scan.start(zk, [f"{paths.JOB_STATES}/{f}" for f in self.folders])
        for code, (folder, (path, answer)) in enumerate(zip(self.folders, pending, strict=True)):
            if folder not in known:
                self._found(Finding("unknown-state-folder", path, "not a job state"))
            listing = scan.entry_listing(scan.collect(answer))
            self.report.index_entries += len(listing)
            for name in listing.others:
                self._found(Finding("bad-index-name", f"{path}/{name}", "not PP-jidNNNNNNNNNN"))
            for key in listing.numbers:
                prio, num = scan.entry_key(key)
                pos = self._pos(num)
                if pos < 0:
                    jid = _jid_path(num)
                    self._found(
                        Finding(
                            "orphan-index",
                            f"{path}/{prio:02d}-{jid}",
                            f"job {jid} does not exist",
                            True,
                        )
                    )
                elif not self.first[pos]:
                    self.first[pos], self.priority[pos] = code + 1, prio
                else:
                    self.more.setdefault(pos, []).append(f"{path}/{prio:02d}-{_jid_path(num)}")
            del listing
        self._recheck_due()

    def _state_entries(self, pos: int, jid: str) -> list[str]:
        found = []
        if self.first[pos]:
            folder = self.folders[self.first[pos] - 1]
            found.append(f"{paths.JOB_STATES}/{folder}/{self.priority[pos]:02d}-{jid}")
        return found + self.more.get(pos, [])

    # Batches -------------------------------------------------------------------------------

    def _check_batches(self) -> None:
        zk = self.zk
        listing = scan.list_ids(zk, paths.BATCHES, "bid")
        self.batches = listing.numbers
        self.other_batches = frozenset(listing.others)
        total = len(self.batches)
        self.batch_names = [str(s) for s in BatchState]
        # Per batch: its state's code + 1 (0: it did not load) and whether it is ours.
        self.batch_state = bytearray(total)
        self.batch_ours = bytearray(total)
        self._say("reading batches", 0, total)
        for start, loaded in self._pipelined_batches():
            self._noted(loaded)
            part = [_bid_path(n) for n in self.batches[start : start + self.chunk]]
            place = {bid: start + i for i, bid in enumerate(part)}
            got: set[str] = set()
            locks: list[str] = []
            for item in loaded:
                if isinstance(item, Broken):
                    got.add(item.id)
                    self._found(Finding("malformed-node", item.path, item.reason))
                    continue
                got.add(item.bid)
                self._batch_loaded(place[item.bid], item)
                if item.lock is not None:
                    locks.append(paths.batch_node(item.bid, "lock"))
            self._batches_missing([b for b in part if b not in got])
            self._lock_stats(locks)
            self.report.batches += sum(1 for b in loaded if not isinstance(b, Broken))
            self._recheck_due()
            self._say("reading batches", min(start + self.chunk, total), total)

    def _pipelined_batches(self) -> Iterator[tuple[int, list[Batch | Broken]]]:
        for start in range(0, len(self.batches), self.chunk):
            part = [_bid_path(n) for n in self.batches[start : start + self.chunk]]
            yield start, batches_load(self.zk, part)

    def _batch_loaded(self, pos: int, batch: Batch) -> None:
        bid = batch.bid
        state = str(batch.state)
        if state not in self.batch_names:
            self.batch_names.append(state)
        self.batch_state[pos] = self.batch_names.index(state) + 1
        owner = owner_of(batch.submission)
        self.batch_ours[pos] = self._ours(owner)
        for path, reason in batch.problems.items():
            self._found(Finding("malformed-node", path, reason))
        if batch.state != BatchState.PENDING and not batch.started:
            held = batch.state == BatchState.HELD
            finding = Finding(
                "batch-states-missing",
                paths.batch_node(bid, "states"),
                f"{batch.state} batch without its states marker: Merritt's library takes it "
                "for a pending batch (repair creates the marker)",
                True,
            )
            if not self._ours(owner):
                finding = replace(
                    finding,
                    detail=f"{batch.state} batch written by Merritt's ingest, without a states "
                    "marker (the console creates none on Merritt's batches)",
                )
            key = "batch-states-missing-held" if held else ""
            self._found(self._owned(finding, owner, key))

    def _batches_missing(self, bids: Sequence[str]) -> None:
        """Batches listed that did not load: gone since, or half-created."""
        if not bids:
            return
        stats = exists_many(self.zk, [paths.batch(b) for b in bids])
        submissions = read_many(self.zk, [paths.batch_node(b, "submission") for b in bids])
        for bid in bids:
            stat = stats[paths.batch(bid)]
            if stat is None:
                continue
            abandoned = _age(stat.ctime) > ABANDONED_SECONDS
            owner = _document_owner(submissions[paths.batch_node(bid, "submission")])
            finding = Finding(
                "incomplete-batch",
                paths.batch(bid),
                "batch has no status or submission"
                + (" (abandoned: safe to remove)" if abandoned else " (may still be in creation)"),
                repairable=abandoned and not children(self.zk, paths.batch_node(bid, "states")),
            )
            self._found(self._owned(finding, owner))

    # Jobs ----------------------------------------------------------------------------------

    def _pipelined_jobs(self) -> Iterator[tuple[int, list[str], dict[str, Any]]]:
        """Each chunk of jobs with its reads; the next chunk's reads are sent before the
        current one is handed out, so the server works while this process decodes."""
        total = len(self.jobs)
        starts = range(0, total, self.chunk)

        def send(start: int) -> tuple[int, list[str], Any]:
            jids = [_jid_path(n) for n in self.jobs[start : start + self.chunk]]
            return start, jids, start_reads(self.zk, load_paths(jids))

        ahead: deque[tuple[int, list[str], Any]] = deque()
        for start in starts:
            ahead.append(send(start))
            if len(ahead) < 2 and start + self.chunk < total:
                continue
            first, jids, pending = ahead.popleft()
            yield first, jids, collect_reads(pending)
        while ahead:
            first, jids, pending = ahead.popleft()
            yield first, jids, collect_reads(pending)

    def _check_jobs(self) -> None:
        total = len(self.jobs)
        # Per job, for the batch index pass: its batch's place + 1 (0: no loaded batch), its
        # batch folder + 1 (0: not loaded), its state's code + 1, and whether it is ours.
        self.job_batch = array("i", bytes(4 * total))
        self.job_folder = bytearray(total)
        self.job_state = bytearray(total)
        self.job_ours = bytearray(total)
        self.state_names: list[str] = []
        self._say("reading jobs", 0, total)
        for start, jids, reads in self._pipelined_jobs():
            self._check_job_chunk(start, jids, reads)
            self._recheck_due()
            self._say("reading jobs", min(start + self.chunk, total), total)

    def _check_job_chunk(self, start: int, jids: list[str], reads: dict[str, Any]) -> None:
        loaded = decode_each("job", jids, lambda jid: jobs_finish_load(jid, reads))
        self._noted(loaded)
        place = {jid: start + i for i, jid in enumerate(jids)}
        got: set[str] = set()
        locks: list[str] = []
        for item in loaded:
            if isinstance(item, Broken):
                got.add(item.id)
                self._found(Finding("malformed-node", item.path, item.reason))
                continue
            got.add(item.jid)
            self._job_loaded(place[item.jid], item)
            if item.lock is not None:
                locks.append(paths.job_node(item.jid, "lock"))
        self._jobs_missing([j for j in jids if j not in got], reads)
        self._lock_stats(locks)

    def _job_loaded(self, pos: int, job: Job) -> None:
        self.report.jobs += 1
        jid = job.jid
        for path, reason in job.problems.items():
            self._found(Finding("malformed-node", path, reason))
        owner = owner_of(job.configuration)
        ours = self._ours(owner)
        self.job_ours[pos] = ours
        state = str(job.state)
        if state not in self.state_names and len(self.state_names) < 254:
            self.state_names.append(state)
        self.job_state[pos] = self.state_names.index(state) + 1 if state in self.state_names else 0
        self.job_folder[pos] = BATCH_INDEX_FOLDERS.index(job_batch_folder(job.state)) + 1
        if not JOB.is_state(job.state):
            self._found(
                Finding("unknown-state", paths.job_node(jid, "status"), f"status {job.state!r}")
            )
        else:
            finding = self.index_finding(job, self._state_entries(pos, jid))
            if finding is not None:
                self._found(self._owned(finding, owner))
        bpos = self._bpos(int(job.bid[3:])) if paths.BID_RE.fullmatch(job.bid) else -1
        if bpos < 0 or not self.batch_state[bpos]:
            self._found(
                Finding(
                    "job-without-batch",
                    paths.job_node(jid, "bid"),
                    f"batch {job.bid} does not exist",
                )
            )
            self.job_folder[pos] = 0
        else:
            self.job_batch[pos] = bpos + 1

    def _jobs_missing(self, jids: Sequence[str], reads: Mapping[str, Any]) -> None:
        """Jobs listed that did not load: gone since, or half-created."""
        for jid in jids:
            read = reads.get(paths.job(jid))
            if read is None:
                continue
            stat = read[1]
            abandoned = _age(stat.ctime) > ABANDONED_SECONDS
            owner = _document_owner(reads.get(paths.job_node(jid, "configuration")))
            finding = Finding(
                "incomplete-job",
                paths.job(jid),
                "job is missing required nodes"
                + (" (abandoned: safe to remove)" if abandoned else " (may still be in creation)"),
                repairable=abandoned,
            )
            self._found(self._owned(finding, owner))

    @staticmethod
    def index_finding(job: Job, have: Sequence[str]) -> Finding | None:
        """What is wrong with a job's entries in the state folders (``have``), if anything."""
        expected = job.index_path
        jid = job.jid
        if not have:
            return Finding(
                "job-unindexed", paths.job(jid), f"in no state folder; expected {expected}", True
            )
        if len(have) > 1:
            return Finding(
                "job-multiple-index",
                paths.job(jid),
                f"in {len(have)} state folders: {', '.join(sorted(have))}",
                True,
                seen=tuple(sorted(have)),
            )
        if have[0] != expected:
            return Finding(
                "job-misindexed", have[0], f"status says {expected}", True, seen=tuple(have)
            )
        return None

    @staticmethod
    def batch_index_finding(job: Job, have: Sequence[str]) -> Finding | None:
        """What is wrong with a job's entries in batch folders (``have``), if anything."""
        expected = job.batch_index_path
        if list(have) == [expected]:
            return None
        where = ", ".join(sorted(have)) or "no batch folder"
        return Finding(
            "batch-index-wrong",
            expected,
            f"{job.state} job belongs in {job_batch_folder(job.state)}; found in {where}",
            True,
            seen=tuple(sorted(p for p in have if p != expected)),
        )

    # Batch index folders -------------------------------------------------------------------

    def _check_batch_indexes(self) -> None:
        zk = self.zk
        loaded = [pos for pos in range(len(self.batches)) if self.batch_state[pos]]
        # Per job: how many entries at the expected place (2 = more than one), others by path.
        right = bytearray(len(self.jobs))
        wrong: dict[int, list[str]] = {}
        processing = self.batch_names.index(BatchState.PROCESSING) + 1
        self._say("reading batch folders", 0, len(loaded))
        for start in range(0, len(loaded), self.chunk):
            part = loaded[start : start + self.chunk]
            every = [
                (bpos, code, paths.batch_index(_bid_path(self.batches[bpos]), folder))
                for bpos in part
                for code, folder in enumerate(BATCH_INDEX_FOLDERS, 1)
            ]
            # Each folder's stat first (read with its empty data: one multiRead per 200
            # folders), then only the folders that have children are listed. Most of a
            # batch's four folders are empty or missing: one listing request each was most of
            # this pass's requests. A folder filled between the two reads shows as a move in
            # flight, looked at again like any other.
            stats = exists_many(zk, [path for _b, _c, path in every])
            folders = [f for f in every if (stat := stats[f[2]]) is not None and stat.numChildren]
            pending = dict(scan.start(zk, [path for _b, _c, path in folders]))
            for bpos, code, path in every:
                if stats[path] is None:
                    listing = scan.Listing(exists=False)
                elif path in pending:
                    listing = scan.id_listing(scan.collect(pending[path]), "jid")
                else:
                    listing = scan.Listing()
                for name in listing.others:
                    self._found(Finding("bad-index-name", f"{path}/{name}", "not jidNNNNNNNNNN"))
                folder = BATCH_INDEX_FOLDERS[code - 1]
                if (
                    folder == "batch-processing"
                    and listing.exists
                    and not len(listing)
                    and self.batch_state[bpos] == processing
                ):
                    self._found(self._complete_finding(path, bool(self.batch_ours[bpos])))
                for num in listing.numbers:
                    pos = self._pos(num)
                    if pos < 0:
                        if folder != "batch-deleted":
                            jid = _jid_path(num)
                            self._found(
                                Finding(
                                    "orphan-batch-index",
                                    f"{path}/{jid}",
                                    f"job {jid} does not exist",
                                    True,
                                )
                            )
                    elif self.job_batch[pos] == bpos + 1 and self.job_folder[pos] == code:
                        right[pos] = min(right[pos] + 1, 2)
                    else:
                        wrong.setdefault(pos, []).append(f"{path}/{_jid_path(num)}")
                del listing
            self._recheck_due()
            self._say("reading batch folders", min(start + self.chunk, len(loaded)), len(loaded))
        self._batch_index_verdicts(right, wrong)

    def _complete_finding(self, processing_folder: str, ours: bool) -> Finding:
        bid = processing_folder.split("/")[2]
        finding = Finding(
            "batch-complete-not-reporting",
            paths.batch_node(bid, "status"),
            "every job finished but the batch is still Processing",
            True,
        )
        return self._owned(finding, CONSOLE if ours else MERRITT)

    def _batch_index_verdicts(self, right: bytearray, wrong: dict[int, list[str]]) -> None:
        """batch-index-wrong for every job not in exactly its one batch folder."""
        for pos in range(len(self.jobs)):
            if not self.job_batch[pos] or (right[pos] == 1 and pos not in wrong):
                continue
            jid = _jid_path(self.jobs[pos])
            bid = _bid_path(self.batches[self.job_batch[pos] - 1])
            folder = BATCH_INDEX_FOLDERS[self.job_folder[pos] - 1]
            expected = f"{paths.batch_index(bid, folder)}/{jid}"
            have = [expected] * right[pos] + wrong.get(pos, [])
            state = self.state_names[self.job_state[pos] - 1] if self.job_state[pos] else "?"
            where = ", ".join(sorted(have)) or "no batch folder"
            finding = Finding(
                "batch-index-wrong",
                expected,
                f"{state} job belongs in {folder}; found in {where}",
                True,
                seen=tuple(sorted(p for p in have if p != expected)),
            )
            self._found(self._owned(finding, CONSOLE if self.job_ours[pos] else MERRITT))

    # The uuid index and the locks not under a job or batch ----------------------------------

    def _check_uuids(self) -> None:
        self._say("reading the batch uuid index")
        part: list[str] = []
        for name in scan.list_names(self.zk, paths.BATCH_UUIDS):
            part.append(f"{paths.BATCH_UUIDS}/{name}")
            if len(part) >= self.chunk:
                self._check_uuid_part(part)
                part = []
        self._check_uuid_part(part)

    def _check_uuid_part(self, part: list[str]) -> None:
        if not part:
            return
        reads = read_many(self.zk, part)
        for path in part:
            read = reads[path]
            if read is None:
                continue
            target = decode_str(path, read[0]).strip()
            listed = target in self.other_batches or (
                paths.BID_RE.fullmatch(target) is not None and self._bpos(int(target[3:])) >= 0
            )
            if not listed:
                self._found(Finding("orphan-uuid", path, f"batch {target!r} does not exist", True))
        self._recheck_due()

    def _check_side_effect_records(self) -> None:
        """The console's records of storage adds and callbacks (``queues.zk.side_effects``)
        whose job is gone: deleted by a tool that does not know them (Merritt's own). A job
        listed after the walk began is looked up before its record is called an orphan."""
        self._say("reading the records of storage adds and callbacks")
        for folder in SIDE_EFFECT_FOLDERS:
            unlisted = [
                name
                for name in scan.list_names(self.zk, folder)
                if not (paths.JID_RE.fullmatch(name) and self._pos(int(name[3:])) >= 0)
            ]
            jobs = [paths.job(n) for n in unlisted if paths.JID_RE.fullmatch(n)]
            stats = exists_many(self.zk, jobs)
            for name in unlisted:
                if paths.JID_RE.fullmatch(name) is None:
                    detail = "not named by a job ID"
                elif stats[paths.job(name)] is None:
                    detail = f"job {name} does not exist"
                else:
                    continue
                self._found(Finding("orphan-record", f"{folder}/{name}", detail, True))

    def _check_other_locks(self) -> None:
        self._say("reading access request and object locks")
        queues = [f"{paths.ACCESS}/{q}" for q in paths.ACCESS_QUEUES]
        access: list[str] = []
        for folder, qids in children_many(self.zk, queues).items():
            access += [f"{folder}/{q}/lock" for q in qids or [] if paths.QID_RE.fullmatch(q)]
        for start in range(0, len(access), self.chunk):
            self._lock_stats(access[start : start + self.chunk], probe=True)
        object_locks = _object_lock_paths(self.zk)
        for start in range(0, len(object_locks), self.chunk):
            part = object_locks[start : start + self.chunk]
            stats = exists_many(self.zk, part)
            for finding in _object_lock_findings(part, stats):
                self._found(finding)
            self._orphans(stats)
        self._recheck_due()

    def _lock_stats(self, locks: Sequence[str], *, probe: bool = False) -> None:
        """Stale and orphan locks among ``locks`` (item ``lock`` children); ``probe``: they
        may not exist (read anyway), else they were seen."""
        if not locks:
            return
        stats = exists_many(self.zk, locks)
        for path in locks:
            stat = stats[path]
            if stat is not None and _age(stat.ctime) > self.stale_lock_seconds:
                self._found(stale_lock_finding(path, stat, self.held))
        self._orphans(stats)

    def _orphans(self, stats: Mapping[str, Any]) -> None:
        for orphan in orphan_locks(stats, self.held):
            self._found(
                Finding(
                    "orphan-lock",
                    orphan.path,
                    orphan.detail,
                    session=orphan.session,
                    czxid=orphan.czxid,
                    advice=ORPHAN_LOCK_ADVICE,
                )
            )

    # The second look at findings that may be moves in flight ------------------------------

    def _recheck_due(self, *, everything: bool = False) -> None:
        now = time.monotonic()
        due: list[Finding] = []
        while self._waiting and (everything or self._waiting[0][0] <= now):
            due.append(self._waiting.popleft()[1])
        for start in range(0, len(due), self.chunk):
            for finding in still_there(
                self.zk, due[start : start + self.chunk], self._owned, self.held
            ):
                self._emit(finding)
        if due:
            self._progress(Progress(*self._phase, self.report.found))


def _document_owner(read: Any) -> str:
    if read is None:
        return UNKNOWN
    try:
        document = decode_json("", read[0])
    except MalformedNode:
        return UNKNOWN
    return owner_of(document) if isinstance(document, dict) else UNKNOWN


def still_there(
    zk: Client,
    findings: Sequence[Finding],
    owned: Callable[[Finding, str], Finding],
    held: Sequence[Registration],
) -> list[Finding]:
    """The findings (of TRANSIENT_KINDS) that a second look finds again, as it finds them."""
    jids = sorted({_jid_in(f.path) for f in findings if f.kind in JOB_INDEX_KINDS} - {""})
    jobs = {j.jid: j for j in jobs_load(zk, jids) if isinstance(j, Job)}
    probe = {p for f in findings for p in f.seen if f.kind in JOB_INDEX_KINDS}
    for job in jobs.values():
        probe.update((job.index_path, job.batch_index_path))
    for finding in findings:
        if finding.kind in ("orphan-index", "orphan-batch-index"):
            probe.update((finding.path, paths.job(_jid_in(finding.path))))
        elif finding.kind == "orphan-lock":
            probe.add(finding.path)
    stats = exists_many(zk, sorted(probe))
    kept: list[Finding] = []
    for finding in findings:
        again = _look_again(zk, finding, jobs, stats, held)
        if again is not None and (again.kind, again.path) == (finding.kind, finding.path):
            owner = finding.owner or CONSOLE
            kept.append(owned(again, owner) if owner != CONSOLE else again)
    return kept


def _look_again(
    zk: Client,
    finding: Finding,
    jobs: Mapping[str, Job],
    stats: Mapping[str, Any],
    held: Sequence[Registration],
) -> Finding | None:
    kind, path = finding.kind, finding.path
    if kind in ("orphan-index", "orphan-batch-index"):
        gone = stats.get(paths.job(_jid_in(path))) is None
        return finding if gone and stats.get(path) is not None else None
    if kind == "orphan-lock":
        stat = stats.get(path)
        if stat is None or (stat.ephemeralOwner, stat.czxid) != (finding.session, finding.czxid):
            return None
        return finding if orphan_locks({path: stat}, held) else None
    if kind == "batch-complete-not-reporting":
        bid = path.split("/")[2]
        try:
            batch = batch_load(zk, bid)
        except (NotFound, MalformedNode):
            return None
        folder = children_many(zk, [paths.batch_index(bid, "batch-processing")])
        empty = folder[paths.batch_index(bid, "batch-processing")] == []
        return finding if batch.state == BatchState.PROCESSING and empty else None
    job = jobs.get(_jid_in(path))
    if job is None:
        return None
    if kind == "batch-index-wrong":
        candidates = {*finding.seen, job.batch_index_path}
        have = [p for p in sorted(candidates) if stats.get(p) is not None]
        return Checker.batch_index_finding(job, have)
    candidates = {*finding.seen, job.index_path}
    have = [p for p in sorted(candidates) if stats.get(p) is not None]
    return Checker.index_finding(job, have)


def run_check(
    zk: Client,
    *,
    stale_lock_seconds: float = 6 * 3600,
    progress: Callable[[Any], None] | None = None,
    recheck_seconds: float = RECHECK_SECONDS,
    sink: Callable[[Finding], None] | None = None,
    chunk: int = CHUNK,
    beside_merritt: bool = False,
) -> Report:
    """The check; findings of the transient kinds are looked at again after a pause and
    dropped when gone (a job that was only moving), so a busy queue raises no false alarm.
    Findings go to ``sink`` when one is given, else into the report."""
    return Checker(
        zk,
        sink=sink,
        progress=progress,
        stale_lock_seconds=stale_lock_seconds,
        recheck_seconds=recheck_seconds,
        chunk=chunk,
        beside_merritt=beside_merritt,
    ).run()


def stale_lock_finding(path: str, stat: Any, held: Sequence[Registration]) -> Finding:
    """A lock held longer than the threshold. One of a live session that is not a console
    process is Merritt's consumer at work: never broken (``owner`` merritt)."""
    hours = _age(stat.ctime) / 3600
    finding = Finding(
        "stale-lock",
        path,
        f"held for {hours:.1f} h by {lock_holder(stat.ephemeralOwner, held)}",
        session=stat.ephemeralOwner,
        czxid=stat.czxid,
    )
    console = {reg.session for reg in held if reg.session}
    if stat.ephemeralOwner and stat.ephemeralOwner not in console:
        return replace(finding, owner=MERRITT, advice=MERRITT_ADVICE["stale-lock"])
    return finding


def _object_lock_paths(zk: Client) -> list[str]:
    roots = (paths.STORAGE_LOCKS, paths.INVENTORY_LOCKS)
    return [
        f"{root}/{name}" for root, names in children_many(zk, roots).items() for name in names or []
    ]


def _object_lock_findings(object_locks: Sequence[str], stats: Mapping[str, Any]) -> list[Finding]:
    """Per-object locks named by the console's old rule (every ':' and '/' on its own became
    '_': ``ark__13030_m5abc``). Merritt's storage and inventory services lock
    ``ark_13030_m5abc`` and never see them. A persistent one is left over and can go; an
    ephemeral one belongs to a session ZooKeeper still counts as live (a consumer of an older
    version at work) and goes with it: it is reported, never broken."""
    found = []
    for path in sorted(object_locks):
        root, name = posixpath.split(path)
        stat = stats[path]
        if stat is None or not paths.is_legacy_object_lock_name(name):
            continue
        detail = (
            f"per-object lock in the old name form; the contract's is "
            f"{root}/ark_{name[len('ark__') :]}"
        )
        if stat.ephemeralOwner:
            detail += (
                f"; held by session {stat.ephemeralOwner:#x} (a consumer of an older version "
                "at work): it goes when that session ends"
            )
        else:
            detail += "; persistent, so nothing will remove it: safe to delete"
        found.append(
            Finding("legacy-object-lock", path, detail, repairable=not stat.ephemeralOwner)
        )
    return found


@dataclass(frozen=True)
class OrphanLock:
    """A lock of a live console process's session that no thread of that process claims."""

    path: str
    consumer: str
    session: int
    czxid: int
    age: float  # seconds since the lock was created

    @property
    def detail(self) -> str:
        return (
            f"orphan lock held by {self.consumer} (session {self.session:#x}) that no thread "
            f"of it claims, for {self.age:.0f} s: nothing will release it while that process "
            "runs (repair deletes it)"
        )


def lock_holder(session: int, held: Sequence[Registration]) -> str:
    """Who holds a lock of ``session``, in words."""
    if not session:
        return "no session (a persistent node)"
    for reg in held:
        if reg.session == session:
            return f"{reg.name} (session {session:#x})"
    return f"session {session:#x}, a session that is not a console process"


def orphan_locks(stats: Mapping[str, Any], held: Sequence[Registration]) -> list[OrphanLock]:
    """The locks among ``stats`` (path -> stat or None) that are orphans.

    A lock counts only once it is older than two of its process's publish intervals and the
    process's registration was written at least one interval after the lock was made: a lock
    just taken is not in the ledger the process last published. A process that does not
    publish its whole ledger (an older version, a list cut short, a bad node) is not judged;
    a session with no registration (Merritt's own consumers) is never an orphan's owner.
    """
    by_session = {reg.session: reg for reg in held if reg.session}
    found = []
    for path, stat in sorted(stats.items()):
        if stat is None or not stat.ephemeralOwner:
            continue
        reg = by_session.get(stat.ephemeralOwner)
        ledger = reg.ledger if reg is not None else None
        if reg is None or ledger is None or path in ledger:
            continue
        age = _age(stat.ctime)
        every = reg.publish_seconds
        if age > 2 * every and (reg.written_ms - stat.ctime) / 1000 > every:
            found.append(OrphanLock(path, reg.name, stat.ephemeralOwner, stat.czxid, age))
    return found


def repair(
    zk: Client,
    found: Report | Iterable[Finding],
    *,
    break_stale_locks: bool = False,
    beside_merritt: bool = False,
) -> list[str]:
    """Fix every repairable finding (of a report, or kept ones); one line per change made.

    Findings may be minutes old: each repair looks at the item again first and leaves it alone
    when it is no longer wrong, no longer there, or not the console's."""
    findings = found.findings if isinstance(found, Report) else found
    done: list[str] = []
    for finding in findings:
        line = repair_one(
            zk, finding, break_stale_locks=break_stale_locks, beside_merritt=beside_merritt
        )
        if line:
            done.append(line)
    return done


def repair_one(
    zk: Client, finding: Finding, *, break_stale_locks: bool = False, beside_merritt: bool = False
) -> str:
    """Repair one finding; the change made in words, or "" when none was needed or allowed."""
    try:
        return _repair_one(
            zk, finding, break_stale_locks=break_stale_locks, beside_merritt=beside_merritt
        )
    except (NoNode, NodeExists, NotEmpty, BadVersion) as exc:
        return f"skipped {finding.path}: changed meanwhile ({type(exc).__name__})"


def _delete(zk: Client, path: str) -> str:
    try:
        zk.delete(path)
    except NoNode:
        return ""
    return f"deleted {path}"


def _ours(owner: str, beside_merritt: bool) -> bool:
    return owner == CONSOLE or (owner == UNKNOWN and not beside_merritt)


def _reindex(zk: Client, jid: str, seen: Sequence[str], beside_merritt: bool) -> list[str]:
    """Make a job's two index entries match its status and priority exactly: the entries the
    check saw elsewhere go, the job's own batch folders are looked at too."""
    loaded = jobs_load(zk, [jid])
    if not loaded or isinstance(loaded[0], Broken):
        return []
    job = loaded[0]
    if not _ours(owner_of(job.configuration), beside_merritt):
        return [f"left {paths.job(jid)}: Merritt's job, not the console's to repair"]
    expected = (job.index_path, job.batch_index_path)
    lines = []
    others = [f"{paths.batch_index(job.bid, f)}/{jid}" for f in BATCH_INDEX_FOLDERS]
    stale = sorted({*seen, *others} - set(expected))
    stats = exists_many(zk, [*stale, *expected])
    for path in stale:
        if stats[path] is not None and path.rsplit("-", 1)[-1].endswith(jid):
            lines.append(_delete(zk, path))
    for path in expected:
        if stats[path] is None:
            zk.create(path, b"", makepath=True)
            lines.append(f"created {path}")
    return [line for line in lines if line]


def _batch_ours(zk: Client, bid: str, beside_merritt: bool) -> Batch | None:
    """The batch when it loads and is the console's to repair."""
    try:
        batch = batch_load(zk, bid)
    except (NotFound, MalformedNode):
        return None
    return batch if _ours(owner_of(batch.submission), beside_merritt) else None


def _repair_one(
    zk: Client, finding: Finding, *, break_stale_locks: bool, beside_merritt: bool
) -> str:
    kind, path = finding.kind, finding.path
    if kind == "stale-lock" and break_stale_locks:
        if finding.owner == MERRITT:
            return ""
        return f"broke {path}" if lock_break(zk, path, finding.session) else ""
    if not finding.repairable or finding.owner == MERRITT:
        return ""
    if kind in ("orphan-index", "orphan-batch-index"):
        if zk.exists(paths.job(_jid_in(path))) is not None:
            return ""
        return _delete(zk, path)
    if kind == "orphan-record":
        name = posixpath.basename(path)
        if paths.JID_RE.fullmatch(name) and zk.exists(paths.job(name)) is not None:
            return ""
        return _delete(zk, path)
    if kind == "orphan-uuid":
        read = read_many(zk, [path])[path]
        if read is None:
            return ""
        target = decode_str(path, read[0]).strip()
        if target and "/" not in target and zk.exists(f"{paths.BATCHES}/{target}") is not None:
            return ""
        zk.delete(path, version=read[1].version)
        return f"deleted {path}"
    if kind in JOB_INDEX_KINDS:
        jid = _jid_in(path)
        return "; ".join(_reindex(zk, jid, finding.seen, beside_merritt)) if jid else ""
    if kind == "incomplete-job":
        return _remove_incomplete_job(zk, path, beside_merritt)
    if kind == "incomplete-batch":
        return _remove_incomplete_batch(zk, path, beside_merritt)
    if kind == "orphan-lock":
        return ""  # its owner's to delete (ORPHAN_LOCK_ADVICE); a run recorded before says so
    if kind == "legacy-object-lock":
        stat = zk.exists(path)
        if stat is None or stat.ephemeralOwner:
            return ""
        zk.delete(path, version=stat.version)
        return f"deleted {path}"
    if kind == "batch-states-missing":
        batch = _batch_ours(zk, path.split("/")[2], beside_merritt)
        if batch is None or batch.state == BatchState.PENDING or batch.started:
            return ""
        zk.create(path, b"")
        return f"created {path}"
    if kind == "batch-complete-not-reporting":
        bid = path.split("/")[2]
        batch = _batch_ours(zk, bid, beside_merritt)
        if batch is None or batch.state != BatchState.PROCESSING:
            return ""
        if children_many(zk, [paths.batch_index(bid, "batch-processing")]).popitem()[1] != []:
            return ""
        batch_transition(zk, batch, BatchState.REPORTING)
        return f"moved {bid} to Reporting"
    return ""


def _remove_incomplete_job(zk: Client, path: str, beside_merritt: bool) -> str:
    jid = _jid_in(path)
    if not jid or jobs_load(zk, [jid]):
        return ""  # complete now (or unreadable: reported as malformed, never removed)
    reads = read_many(zk, [paths.job(jid), paths.job_node(jid, "configuration")])
    node = reads[paths.job(jid)]
    if node is None or _age(node[1].ctime) <= ABANDONED_SECONDS:
        return ""
    if not _ours(_document_owner(reads[paths.job_node(jid, "configuration")]), beside_merritt):
        return ""
    zk.delete(path, recursive=True)
    return f"removed abandoned {path}"


def _remove_incomplete_batch(zk: Client, path: str, beside_merritt: bool) -> str:
    bid = path.split("/")[2]
    if batches_load(zk, [bid]):
        return ""
    reads = read_many(zk, [paths.batch(bid), paths.batch_node(bid, "submission")])
    node = reads[paths.batch(bid)]
    if node is None or _age(node[1].ctime) <= ABANDONED_SECONDS:
        return ""
    if not _ours(_document_owner(reads[paths.batch_node(bid, "submission")]), beside_merritt):
        return ""
    if children(zk, paths.batch_node(bid, "states")):
        return ""
    zk.delete(path, recursive=True)
    return f"removed abandoned {path}"
