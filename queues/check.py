"""The consistency check: what Merritt's tools call orphans, and more.

It reads the whole tree once (pipelined), compares every job, batch and index entry with what
the contract says should exist, and reports each difference as a Finding. ``repair`` fixes the
ones that are safe: the job's own status node is the truth and index entries are rebuilt from
it; nothing that holds depositor data (a job's configuration, a batch's submission) is deleted
unless it is an abandoned, half-created item.

Locks are read once too (items' ``lock`` children and the per-object locks), with their owner
session: a lock held by a live console process (its registration node has the same
``ephemeralOwner``) whose published ledger does not list it is an orphan, a lock no thread of
that process works under and none will release (issue 23). /consumers/ does not read every
lock: each process finds its own orphans (``registration.ProcessObserver.check_unclaimed``).
"""

from __future__ import annotations

import posixpath
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queues.states import (
    BATCH_INDEX_FOLDERS,
    JOB,
    BatchState,
    job_batch_folder,
    job_index_folder,
)
from queues.zk import paths
from queues.zk.batches import batch_ids, batch_load, batch_transition, batches_load
from queues.zk.client import Client
from queues.zk.codecs import decode_str
from queues.zk.consumers import Registration, registrations
from queues.zk.errors import BadVersion, NodeExists, NoNode, NotEmpty
from queues.zk.jobs import jobs_load
from queues.zk.locks import lock_break
from queues.zk.nodes import children, children_many, exists_many, read_many, stamp
from queues.zk.records import Broken, Job

# A half-created item older than this was abandoned by its writer and can be removed.
ABANDONED_SECONDS = 3600


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


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    jobs: int = 0
    batches: int = 0
    index_entries: int = 0
    checked_at: datetime = field(default_factory=lambda: datetime.now().astimezone())

    @property
    def ok(self) -> bool:
        return not self.findings

    def by_kind(self) -> dict[str, list[Finding]]:
        grouped: dict[str, list[Finding]] = defaultdict(list)
        for finding in self.findings:
            grouped[finding.kind].append(finding)
        return dict(grouped)


def _age(stat_ctime_ms: int) -> float:
    return (datetime.now().astimezone() - stamp(stat_ctime_ms)).total_seconds()


# Findings a move in flight shows for a moment: a consumer's or operator's transaction is
# atomic, but the check reads the index folders and the status nodes at different instants.
# Each is read again after RECHECK_SECONDS and reported only when still there.
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


def run_check(
    zk: Client,
    *,
    stale_lock_seconds: float = 6 * 3600,
    progress: Callable[[str], None] | None = None,
    recheck_seconds: float = RECHECK_SECONDS,
) -> Report:
    """The check; findings of the transient kinds are re-checked once after a pause and
    dropped when gone (a job that was only moving), so a busy queue raises no false alarm."""
    report = _check_once(zk, stale_lock_seconds=stale_lock_seconds, progress=progress)
    transient = [f for f in report.findings if f.kind in TRANSIENT_KINDS]
    if not transient or recheck_seconds <= 0:
        return report
    say = progress or (lambda _msg: None)
    say(f"re-checking {len(transient)} findings that may be moves in flight")
    time.sleep(recheck_seconds)
    again = _check_once(zk, stale_lock_seconds=stale_lock_seconds)
    still = {(f.kind, f.path) for f in again.findings if f.kind in TRANSIENT_KINDS}
    report.findings = [
        f for f in report.findings if f.kind not in TRANSIENT_KINDS or (f.kind, f.path) in still
    ]
    say(f"{len(report.findings)} findings after the re-check")
    return report


def _check_once(
    zk: Client,
    *,
    stale_lock_seconds: float = 6 * 3600,
    progress: Callable[[str], None] | None = None,
) -> Report:
    report = Report()
    say = progress or (lambda _msg: None)

    # Jobs and their index entries in /jobs/states/*.
    job_ids = sorted(n for n in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(n))
    say(f"reading {len(job_ids)} jobs")
    state_folders = children(zk, paths.JOB_STATES)
    listed = children_many(zk, [f"{paths.JOB_STATES}/{f}" for f in state_folders])
    entries: dict[str, list[str]] = defaultdict(list)
    known_folders = {job_index_folder(s) for s in JOB.states}
    for folder in state_folders:
        if folder not in known_folders:
            report.findings.append(
                Finding("unknown-state-folder", f"{paths.JOB_STATES}/{folder}", "not a job state")
            )
        for name in listed[f"{paths.JOB_STATES}/{folder}"] or []:
            report.index_entries += 1
            match = paths.INDEX_ENTRY_RE.fullmatch(name)
            path = f"{paths.JOB_STATES}/{folder}/{name}"
            if not match:
                report.findings.append(Finding("bad-index-name", path, "not PP-jidNNNNNNNNNN"))
                continue
            entries[match.group(2)].append(path)

    jobs: dict[str, Job] = {}
    loaded_ids: set[str] = set()
    chunk = 500
    for start in range(0, len(job_ids), chunk):
        part = job_ids[start : start + chunk]
        for item in jobs_load(zk, part):
            loaded_ids.add(item.id if isinstance(item, Broken) else item.jid)
            if isinstance(item, Broken):
                report.findings.append(Finding("malformed-node", item.path, item.reason))
            else:
                jobs[item.jid] = item
                # Optional nodes that do not decode leave the job usable, but still need a look.
                for path, reason in item.problems.items():
                    report.findings.append(Finding("malformed-node", path, reason))
        say(f"checked {min(start + chunk, len(job_ids))}/{len(job_ids)} jobs")
    report.jobs = len(jobs)

    # Jobs that did not load: vanished meanwhile, or half-created.
    for jid in sorted(set(job_ids) - loaded_ids):
        stat = zk.exists(paths.job(jid))
        if stat is None:
            continue
        abandoned = _age(stat.ctime) > ABANDONED_SECONDS
        report.findings.append(
            Finding(
                "incomplete-job",
                paths.job(jid),
                "job is missing required nodes"
                + (" (abandoned: safe to remove)" if abandoned else " (may still be in creation)"),
                repairable=abandoned,
            )
        )

    for jid, job in jobs.items():
        expected = job.index_path
        have = entries.get(jid, [])
        if not JOB.is_state(job.state):
            report.findings.append(
                Finding("unknown-state", paths.job_node(jid, "status"), f"status {job.state!r}")
            )
            continue
        if not have:
            report.findings.append(
                Finding(
                    "job-unindexed",
                    paths.job(jid),
                    f"in no state folder; expected {expected}",
                    True,
                )
            )
        elif len(have) > 1:
            report.findings.append(
                Finding(
                    "job-multiple-index",
                    paths.job(jid),
                    f"in {len(have)} state folders: {', '.join(sorted(have))}",
                    True,
                )
            )
        elif have[0] != expected:
            report.findings.append(
                Finding("job-misindexed", have[0], f"status says {expected}", True)
            )
    existing_ids = set(job_ids)
    for jid, found in entries.items():
        if jid not in existing_ids:
            for path in found:
                report.findings.append(
                    Finding("orphan-index", path, f"job {jid} does not exist", True)
                )

    # Batches, their job index and the uuid index.
    bids = batch_ids(zk)
    say(f"reading {len(bids)} batches")
    batches = {}
    for loaded in batches_load(zk, bids):
        if isinstance(loaded, Broken):
            report.findings.append(Finding("malformed-node", loaded.path, loaded.reason))
        else:
            batches[loaded.bid] = loaded
            for path, reason in loaded.problems.items():
                report.findings.append(Finding("malformed-node", path, reason))
    report.batches = len(batches)
    batch_stats = exists_many(zk, [paths.batch(b) for b in bids])
    for bid in bids:
        stat = batch_stats[paths.batch(bid)]
        if (
            bid in batches
            or stat is None
            or any(f.path.startswith(paths.batch(bid)) for f in report.findings)
        ):
            continue
        abandoned = _age(stat.ctime) > ABANDONED_SECONDS
        report.findings.append(
            Finding(
                "incomplete-batch",
                paths.batch(bid),
                "batch has no status or submission"
                + (" (abandoned: safe to remove)" if abandoned else " (may still be in creation)"),
                repairable=abandoned and not children(zk, paths.batch_node(bid, "states")),
            )
        )
    folders = children_many(
        zk, [paths.batch_index(b, f) for b in batches for f in BATCH_INDEX_FOLDERS]
    )
    batch_entries: dict[str, list[str]] = defaultdict(list)
    for bid in batches:
        for folder in BATCH_INDEX_FOLDERS:
            for jid in folders[paths.batch_index(bid, folder)] or []:
                path = f"{paths.batch_index(bid, folder)}/{jid}"
                if not paths.JID_RE.fullmatch(jid):
                    report.findings.append(Finding("bad-index-name", path, "not jidNNNNNNNNNN"))
                    continue
                batch_entries[jid].append(path)
                if jid not in existing_ids and folder != "batch-deleted":
                    report.findings.append(
                        Finding("orphan-batch-index", path, f"job {jid} does not exist", True)
                    )
    for jid, job in jobs.items():
        if job.bid not in batches:
            report.findings.append(
                Finding(
                    "job-without-batch",
                    paths.job_node(jid, "bid"),
                    f"batch {job.bid} does not exist",
                )
            )
            continue
        expected = job.batch_index_path
        have = batch_entries.get(jid, [])
        if have != [expected]:
            where = ", ".join(sorted(have)) or "no batch folder"
            report.findings.append(
                Finding(
                    "batch-index-wrong",
                    expected,
                    f"{job.state} job belongs in {job_batch_folder(job.state)}; found in {where}",
                    True,
                )
            )
    for bid, batch in batches.items():
        if batch.state != BatchState.PENDING and not batch.started:
            report.findings.append(
                Finding(
                    "batch-states-missing",
                    paths.batch_node(bid, "states"),
                    f"{batch.state} batch without its states marker: Merritt's library takes it "
                    "for a pending batch (repair creates the marker)",
                    True,
                )
            )
        if (
            batch.state == BatchState.PROCESSING
            and folders.get(paths.batch_index(bid, "batch-processing")) == []
        ):
            report.findings.append(
                Finding(
                    "batch-complete-not-reporting",
                    paths.batch_node(bid, "status"),
                    "every job finished but the batch is still Processing",
                    True,
                )
            )

    uuids = children(zk, paths.BATCH_UUIDS)
    uuid_reads = read_many(zk, [f"{paths.BATCH_UUIDS}/{u}" for u in uuids])
    for u in uuids:
        path = f"{paths.BATCH_UUIDS}/{u}"
        read = uuid_reads[path]
        if read is None:
            continue
        target = decode_str(path, read[0]).strip()
        if target not in batches and target not in bids:
            report.findings.append(
                Finding("orphan-uuid", path, f"batch {target!r} does not exist", True)
            )

    # Locks: held far too long (a consumer stuck in a step: reported, not broken
    # automatically), or held by a console process that no thread of it claims.
    held = registrations(zk)
    item_locks = _item_lock_paths(zk, job_ids, bids)
    object_locks = _object_lock_paths(zk)
    stats = exists_many(zk, item_locks + object_locks)
    for path in item_locks:
        stat = stats[path]
        if stat is not None and _age(stat.ctime) > stale_lock_seconds:
            hours = _age(stat.ctime) / 3600
            report.findings.append(
                Finding(
                    "stale-lock",
                    path,
                    f"held for {hours:.1f} h by {lock_holder(stat.ephemeralOwner, held)}",
                )
            )
    _check_object_locks(object_locks, stats, report)
    for orphan in orphan_locks(stats, held):
        report.findings.append(
            Finding(
                "orphan-lock",
                orphan.path,
                orphan.detail,
                repairable=True,
                session=orphan.session,
                czxid=orphan.czxid,
            )
        )
    say(f"{len(report.findings)} findings")
    return report


def _item_lock_paths(zk: Client, job_ids: Sequence[str], bids: Sequence[str]) -> list[str]:
    """The ``lock`` child of every job, batch and access request (whether there or not)."""
    found = [paths.job_node(j, "lock") for j in job_ids]
    found += [paths.batch_node(b, "lock") for b in bids]
    queues = [f"{paths.ACCESS}/{q}" for q in paths.ACCESS_QUEUES]
    for folder, qids in children_many(zk, queues).items():
        found += [f"{folder}/{q}/lock" for q in qids or [] if paths.QID_RE.fullmatch(q)]
    return found


def _object_lock_paths(zk: Client) -> list[str]:
    roots = (paths.STORAGE_LOCKS, paths.INVENTORY_LOCKS)
    return [
        f"{root}/{name}" for root, names in children_many(zk, roots).items() for name in names or []
    ]


def _check_object_locks(
    object_locks: Sequence[str], stats: Mapping[str, Any], report: Report
) -> None:
    """Per-object locks named by the console's old rule (every ':' and '/' on its own became
    '_': ``ark__13030_m5abc``). Merritt's storage and inventory services lock
    ``ark_13030_m5abc`` and never see them. A persistent one is left over and can go; an
    ephemeral one belongs to a session ZooKeeper still counts as live (a consumer of an older
    version at work) and goes with it: it is reported, never broken."""
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
        report.findings.append(
            Finding("legacy-object-lock", path, detail, repairable=not stat.ephemeralOwner)
        )


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


def repair(zk: Client, report: Report, *, break_stale_locks: bool = False) -> list[str]:
    """Fix every repairable finding; returns one line per change made."""
    done: list[str] = []
    for finding in report.findings:
        try:
            line = _repair_one(zk, finding, break_stale_locks=break_stale_locks)
        except (NoNode, NodeExists, NotEmpty, BadVersion) as exc:
            line = f"skipped {finding.path}: changed meanwhile ({type(exc).__name__})"
        if line:
            done.append(line)
    return done


def _delete(zk: Client, path: str) -> str:
    try:
        zk.delete(path)
    except NoNode:
        return ""
    return f"deleted {path}"


def _reindex(zk: Client, jid: str) -> list[str]:
    """Make a job's two index entries match its status and priority exactly."""
    loaded = jobs_load(zk, [jid])
    if not loaded or isinstance(loaded[0], Broken):
        return []
    job = loaded[0]
    lines = []
    for folder in children(zk, paths.JOB_STATES):
        for name in children(zk, f"{paths.JOB_STATES}/{folder}"):
            path = f"{paths.JOB_STATES}/{folder}/{name}"
            if name.endswith(f"-{jid}") and path != job.index_path:
                lines.append(_delete(zk, path))
    for folder in BATCH_INDEX_FOLDERS:
        path = f"{paths.batch_index(job.bid, folder)}/{jid}"
        if path != job.batch_index_path and zk.exists(path) is not None:
            lines.append(_delete(zk, path))
    for path in (job.index_path, job.batch_index_path):
        if zk.exists(path) is None:
            zk.create(path, b"", makepath=True)
            lines.append(f"created {path}")
    return [line for line in lines if line]


def _repair_one(zk: Client, finding: Finding, *, break_stale_locks: bool) -> str:
    if finding.kind == "stale-lock" and break_stale_locks:
        return f"broke {finding.path}" if lock_break(zk, finding.path) else ""
    if not finding.repairable:
        return ""
    kind, path = finding.kind, finding.path
    if kind in ("orphan-index", "orphan-batch-index", "orphan-uuid"):
        return _delete(zk, path)
    if kind in ("job-unindexed", "job-multiple-index", "job-misindexed", "batch-index-wrong"):
        match = paths.INDEX_ENTRY_RE.fullmatch(posixpath.basename(path))
        jid = (
            match.group(2)
            if match
            else next((p for p in path.split("/") if paths.JID_RE.fullmatch(p)), "")
        )
        return "; ".join(_reindex(zk, jid)) if jid else ""
    if kind in ("incomplete-job", "incomplete-batch"):
        zk.delete(path, recursive=True)
        return f"removed abandoned {path}"
    if kind == "orphan-lock":
        stat = zk.exists(path)
        if stat is None or (stat.ephemeralOwner, stat.czxid) != (finding.session, finding.czxid):
            return ""
        zk.delete(path, version=stat.version)
        return f"deleted orphan lock {path} of session {finding.session:#x}"
    if kind == "legacy-object-lock":
        stat = zk.exists(path)
        if stat is None or stat.ephemeralOwner:
            return ""
        zk.delete(path, version=stat.version)
        return f"deleted {path}"
    if kind == "batch-states-missing":
        if zk.exists(path) is not None:
            return ""
        zk.create(path, b"")
        return f"created {path}"
    if kind == "batch-complete-not-reporting":
        bid = path.split("/")[2]
        batch_transition(zk, batch_load(zk, bid), BatchState.REPORTING)
        return f"moved {bid} to Reporting"
    return ""
