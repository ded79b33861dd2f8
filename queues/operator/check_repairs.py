"""``repair``: the findings of the consistency check (``check``) that are safe to fix, fixed.
A job's own status node is the truth and index entries are rebuilt from it; nothing that
holds depositor data is deleted unless it is an abandoned, half-created item; an item Merritt's
ingest wrote (or, beside Merritt, one whose writer cannot be told) is never repaired.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from typing import Any

from queues.core.states import BATCH_INDEX_FOLDERS, BatchState
from queues.operator import check  # its ABANDONED_SECONDS, read when used (tests lower it)
from queues.operator.check_findings import (
    CONSOLE,
    JOB_INDEX_KINDS,
    MERRITT,
    UNKNOWN,
    Finding,
    Report,
    age_seconds,
    document_owner,
    jid_in,
    owner_of,
)
from queues.zk import paths
from queues.zk.batches import batch_load, batch_transition, batches_load, remove_tree
from queues.zk.client import Client
from queues.zk.codecs import decode_str
from queues.zk.errors import (
    BadVersion,
    Conflict,
    InvalidID,
    ItemLocked,
    MalformedNode,
    NodeExists,
    NoNode,
    NotEmpty,
    NotFound,
)
from queues.zk.fence import commit_unheld
from queues.zk.jobs import jobs_load
from queues.zk.locks import lock_break
from queues.zk.nodes import children, children_many, exists_many, read_many
from queues.zk.records import Batch, Broken
from queues.zk.servertime import server_now


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
    except (NoNode, NodeExists, NotEmpty, BadVersion, Conflict) as exc:
        return f"skipped {finding.path}: changed meanwhile ({type(exc).__name__})"
    except ItemLocked:
        return f"skipped {finding.path}: a session holds its item's lock"


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
    others = [f"{paths.batch_index(job.bid, f)}/{jid}" for f in BATCH_INDEX_FOLDERS]
    stale = sorted({*seen, *others} - set(expected))
    stats = exists_many(zk, [*stale, *expected])
    deletes = [p for p in stale if stats[p] is not None and p.rsplit("-", 1)[-1].endswith(jid)]
    creates = [p for p in expected if stats[p] is None]
    if not deletes and not creates:
        return []
    for path in creates:
        zk.ensure_path(posixpath.dirname(path))  # a folder, no write to the job

    def rebuild(txn: Any) -> None:
        # Made only while no session holds the job, against the status it was rebuilt from.
        txn.check(paths.job_node(jid, "status"), job.status.version)
        for path in deletes:
            txn.delete(path)
        for path in creates:
            txn.create(path, b"")

    commit_unheld(zk, paths.job_node(jid, "lock"), rebuild, what=f"reindex {jid}")
    return [*(f"deleted {p}" for p in deletes), *(f"created {p}" for p in creates)]


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
        if zk.exists(paths.job(jid_in(path))) is not None:
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
        # Another client's data: its batch looked up only when it is a node name at all (".."
        # or a NUL aborted the whole repair run); one that is not names no batch (nor does one
        # of 1,000 characters: both clients' batch names are a few dozen).
        try:
            named: str | None = f"{paths.BATCHES}/{paths.node_name(target, 'batch', 1000)}"
        except InvalidID:
            named = None
        if named is not None and zk.exists(named) is not None:
            return ""
        zk.delete(path, version=read[1].version)
        return f"deleted {path}"
    if kind in JOB_INDEX_KINDS:
        jid = jid_in(path)
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

        bid, version = batch.bid, batch.status.version

        def marker(txn: Any) -> None:
            txn.check(paths.batch_node(bid, "status"), version)
            txn.create(path, b"")

        commit_unheld(zk, paths.batch_node(bid, "lock"), marker, what=f"create {path}")
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
    jid = jid_in(path)
    if not jid or jobs_load(zk, [jid]):
        return ""  # complete now (or unreadable: reported as malformed, never removed)
    reads = read_many(zk, [paths.job(jid), paths.job_node(jid, "configuration")])
    node = reads[paths.job(jid)]
    if node is None or age_seconds(node[1].ctime, server_now(zk)) <= check.ABANDONED_SECONDS:
        return ""
    if not _ours(document_owner(reads[paths.job_node(jid, "configuration")]), beside_merritt):
        return ""
    remove_tree(zk, paths.job(jid), f"job {jid}")  # never a lock: ItemLocked for one
    return f"removed abandoned {path}"


def _remove_incomplete_batch(zk: Client, path: str, beside_merritt: bool) -> str:
    bid = path.split("/")[2]
    if batches_load(zk, [bid]):
        return ""
    reads = read_many(zk, [paths.batch(bid), paths.batch_node(bid, "submission")])
    node = reads[paths.batch(bid)]
    if node is None or age_seconds(node[1].ctime, server_now(zk)) <= check.ABANDONED_SECONDS:
        return ""
    if not _ours(document_owner(reads[paths.batch_node(bid, "submission")]), beside_merritt):
        return ""
    if children(zk, paths.batch_node(bid, "states")):
        return ""
    remove_tree(zk, paths.batch(bid), f"batch {bid}")  # never a lock: ItemLocked for one
    return f"removed abandoned {path}"
