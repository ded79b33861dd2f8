"""What the consistency check (``check``) reports: a ``Finding`` per difference from the
contract, the ``Report`` and ``Progress`` of a run, the advice on an item Merritt's ingest
wrote, and the findings on locks (stale item locks, per-object locks, and the orphans a live
console process holds without working under them).
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from queues.zk import paths
from queues.zk.client import Client
from queues.zk.codecs import decode_json
from queues.zk.consumers import Registration
from queues.zk.errors import MalformedNode
from queues.zk.nodes import children_many

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


def age_seconds(stat_ctime_ms: int, now: float) -> float:
    """A node's age at ``now``: the ZooKeeper server's time (``servertime.server_now``), the
    clock that stamped its ``ctime``, so a host whose clock runs ahead calls nothing old early."""
    return now - stat_ctime_ms / 1000


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


def jid_in(path: str) -> str:
    """The job ID a finding's path names (an index entry's or a job node's)."""
    match = paths.INDEX_ENTRY_RE.fullmatch(posixpath.basename(path))
    if match:
        return match.group(2)
    return next((p for p in path.split("/") if paths.JID_RE.fullmatch(p)), "")


def document_owner(read: Any) -> str:
    if read is None:
        return UNKNOWN
    try:
        document = decode_json("", read[0])
    except MalformedNode:
        return UNKNOWN
    return owner_of(document) if isinstance(document, dict) else UNKNOWN


def stale_lock_finding(
    path: str, stat: Any, held: Sequence[Registration], *, now: float
) -> Finding:
    """A lock held longer than the threshold (``now``: the server's time). One of a live
    session that is not a console process is Merritt's consumer at work: never broken
    (``owner`` merritt)."""
    hours = age_seconds(stat.ctime, now) / 3600
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


def object_lock_paths(zk: Client) -> list[str]:
    roots = paths.OBJECT_LOCK_ROOTS
    return [
        f"{root}/{name}" for root, names in children_many(zk, roots).items() for name in names or []
    ]


def object_lock_findings(object_locks: Sequence[str], stats: Mapping[str, Any]) -> list[Finding]:
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


def orphan_locks(
    stats: Mapping[str, Any], held: Sequence[Registration], *, now: float
) -> list[OrphanLock]:
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
        age = age_seconds(stat.ctime, now)
        every = reg.publish_seconds
        if age > 2 * every and (reg.written_ms - stat.ctime) / 1000 > every:
            found.append(OrphanLock(path, reg.name, stat.ephemeralOwner, stat.czxid, age))
    return found
