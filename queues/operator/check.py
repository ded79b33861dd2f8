"""The consistency check: what Merritt's tools call orphans, and more.

It walks the whole tree once and compares every job, batch and index entry with what the
contract says should exist, reporting each difference as a Finding (``check_findings``, which
also holds the findings on locks). ``check_repairs.repair`` fixes the ones that are safe: the
job's own status node is the truth and index entries are rebuilt from it; nothing that holds
depositor data (a job's configuration, a batch's submission) is deleted unless it is an
abandoned, half-created item.

The walk holds at most a chunk of items at a time (``CHUNK`` jobs or batches, read pipelined, two
chunks in flight): a million-job queue is checked in about the memory of its IDs. What it must
remember about every job -- where the state folders list it, its batch and batch folder -- is
kept in flat arrays indexed by the job's place among the sorted job numbers (``queues.zk.scan``
reads folder listings straight from the answer's bytes into such arrays). Findings go to a sink
as they are found (the database, for a background run: ``queues.operator.consistency``), not into a
list that grows with the damage.

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

import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from queues.core.states import (
    BATCH_INDEX_FOLDERS,
    JOB,
    BatchState,
    job_batch_folder,
    job_index_folder,
)
from queues.operator.check_findings import (
    CONSOLE,
    JOB_INDEX_KINDS,
    MERRITT,
    MERRITT_ADVICE,
    ORPHAN_LOCK_ADVICE,
    UNKNOWN,
    Finding,
    Progress,
    Report,
    age_seconds,
    document_owner,
    jid_in,
    object_lock_findings,
    object_lock_paths,
    orphan_locks,
    owner_of,
    stale_lock_finding,
)
from queues.zk import paths, scan
from queues.zk.batches import batch_load, batches_load
from queues.zk.client import Client
from queues.zk.codecs import decode_str
from queues.zk.consumers import Registration, registrations
from queues.zk.errors import MalformedNode, NotFound, Unavailable
from queues.zk.jobs import jobs_finish_load, jobs_load, load_paths
from queues.zk.nodes import (
    children,
    children_many,
    collect_reads,
    exists_many,
    read_many,
    start_reads,
)
from queues.zk.records import Batch, Broken, Job, decode_each
from queues.zk.servertime import server_now
from queues.zk.store_intents import SIDE_EFFECT_FOLDERS

# The console's own records of a job's side effects outside ZooKeeper, one node per job.
# A half-created item older than this was abandoned by its writer and can be removed.
ABANDONED_SECONDS = 3600
# Jobs or batches read at once (two such reads are in flight while the previous is checked).
CHUNK = 500
# Findings that may be moves in flight kept waiting for their second look; past this many the
# walk pauses to look at the oldest ones, so the queue of them cannot grow with the damage.
RECHECK_MAX = 5000
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


def _jid_path(num: int) -> str:
    return f"jid{num:010d}"


def _bid_path(num: int) -> str:
    return f"bid{num:010d}"


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
            abandoned = age_seconds(stat.ctime, server_now(self.zk)) > ABANDONED_SECONDS
            owner = document_owner(submissions[paths.batch_node(bid, "submission")])
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
            abandoned = age_seconds(stat.ctime, server_now(self.zk)) > ABANDONED_SECONDS
            owner = document_owner(reads.get(paths.job_node(jid, "configuration")))
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
        object_locks = object_lock_paths(self.zk)
        for start in range(0, len(object_locks), self.chunk):
            part = object_locks[start : start + self.chunk]
            stats = exists_many(self.zk, part)
            for finding in object_lock_findings(part, stats):
                self._found(finding)
            self._orphans(stats, server_now(self.zk))
        self._recheck_due()

    def _lock_stats(self, locks: Sequence[str], *, probe: bool = False) -> None:
        """Stale and orphan locks among ``locks`` (item ``lock`` children); ``probe``: they
        may not exist (read anyway), else they were seen."""
        if not locks:
            return
        stats = exists_many(self.zk, locks)
        now = server_now(self.zk)  # the clock of ctime (queues/zk/servertime.py)
        for path in locks:
            stat = stats[path]
            if stat is not None and age_seconds(stat.ctime, now) > self.stale_lock_seconds:
                self._found(stale_lock_finding(path, stat, self.held, now=now))
        self._orphans(stats, now)

    def _orphans(self, stats: Mapping[str, Any], now: float) -> None:
        for orphan in orphan_locks(stats, self.held, now=now):
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


def still_there(
    zk: Client,
    findings: Sequence[Finding],
    owned: Callable[[Finding, str], Finding],
    held: Sequence[Registration],
) -> list[Finding]:
    """The findings (of TRANSIENT_KINDS) that a second look finds again, as it finds them."""
    jids = sorted({jid_in(f.path) for f in findings if f.kind in JOB_INDEX_KINDS} - {""})
    jobs = {j.jid: j for j in jobs_load(zk, jids) if isinstance(j, Job)}
    probe = {p for f in findings for p in f.seen if f.kind in JOB_INDEX_KINDS}
    for job in jobs.values():
        probe.update((job.index_path, job.batch_index_path))
    for finding in findings:
        if finding.kind in ("orphan-index", "orphan-batch-index"):
            probe.update((finding.path, paths.job(jid_in(finding.path))))
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
        gone = stats.get(paths.job(jid_in(path))) is None
        return finding if gone and stats.get(path) is not None else None
    if kind == "orphan-lock":
        stat = stats.get(path)
        if stat is None or (stat.ephemeralOwner, stat.czxid) != (finding.session, finding.czxid):
            return None
        return finding if orphan_locks({path: stat}, held, now=server_now(zk)) else None
    if kind == "batch-complete-not-reporting":
        bid = path.split("/")[2]
        try:
            batch = batch_load(zk, bid)
        except (NotFound, MalformedNode):
            return None
        folder = children_many(zk, [paths.batch_index(bid, "batch-processing")])
        empty = folder[paths.batch_index(bid, "batch-processing")] == []
        return finding if batch.state == BatchState.PROCESSING and empty else None
    job = jobs.get(jid_in(path))
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
