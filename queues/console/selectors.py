"""Reads for the console's overview and its smaller pages: state counts, the overview's figures,
access requests, holds, the consistency report, consumers and the incidents page. The job,
failed-job and batch lists are in ``job_reads``, ``failed_reads`` and ``batch_reads``.

Every function takes keyword-only arguments and reads through the process's ZooKeeper client
with pipelined requests. Lists are paged on index names before anything is loaded, so a page of
50 jobs costs 50 loads however many thousand jobs share its state. What would otherwise be read
again for every page -- state-folder listings, batch states, each job's profile, space needed --
comes from the process's watch-kept read index (``queues/zk/index.py``), so a page's cost follows
what it shows, not the size of the queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queues.console import waits
from queues.console.failed_reads import _failed_matches
from queues.console.job_reads import _age
from queues.core.states import ACCESS, BATCH, JOB, JOB_WORKING, JobState
from queues.core.words import digits
from queues.zk import consumers as zconsumers
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.access import access_ids, access_load, accesses_load
from queues.zk.client import connected_client
from queues.zk.codecs import decode_json
from queues.zk.errors import MalformedNode, NotFound
from queues.zk.jobs import jobs_load
from queues.zk.locks import Holds, holds_list
from queues.zk.maintenance import NodeHold, ServiceHold, Window, node_holds, service_holds
from queues.zk.maintenance import windows as maintenance_windows
from queues.zk.nodes import exists_many, read_many, stamp
from queues.zk.records import AccessRequest, Broken, Job

GB = 1024**3


@dataclass(frozen=True)
class StateCount:
    state: str
    count: int
    oldest_seconds: float | None = None


def zookeeper_answers() -> None:
    """One small round trip to ZooKeeper (the job states folder's stat); a connection error
    when it does not answer."""
    connected_client().exists(zpaths.JOB_STATES)


def job_state_counts(*, wait: bool = True) -> dict[str, int]:
    """Jobs per state, from the read index's listings of the state folders (Deleted too: jobs
    Merritt's library marked Deleted stay until they are removed). ``wait=False``: while the
    index fills after a start, each folder not listed yet is counted from its stat instead."""
    idx = zindex.for_client(connected_client())
    if not wait and idx.filling:
        return {s: n or 0 for s, n in idx.job_counts_now().items()}
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
    # waiting per step (queues/console/waits.py).
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


@dataclass(frozen=True)
class HoldsView:
    holds: Holds
    held_jobs: dict[str, int]  # collection -> Held jobs
    collections: list[str] = field(default_factory=list)  # every collection worth listing
    nodes: dict[int, NodeHold] = field(default_factory=dict)  # held storage nodes
    services: dict[str, ServiceHold] = field(default_factory=dict)  # held services outside
    windows: dict[str, Window] = field(default_factory=dict)  # "<kind>:<name>" -> its window
    # Every hold with who placed it, why and until when (queues/console/waits.py).
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


def collection_known(profile: str) -> bool:
    """Whether the console knows collection ``profile``: a profile in the profiles folder, a
    hold, a window or a cap on it, a job of it in ZooKeeper's queue (the read index, any state),
    or a job or batch of it archived. Cheapest first; an action's read waits for the index."""
    from queues.models import ArchivedBatch, ArchivedJob
    from queues.zk import caps as zcaps

    if profile in known_profiles():
        return True
    zk = connected_client()
    cap = zcaps.cap_path(profile)  # a cap node unreadable is a cap on it still, to be removed
    if profile in holds_list(zk).collections or exists_many(zk, [cap])[cap] is not None:
        return True
    if any(w.kind == "collection" and w.name == profile for w in maintenance_windows(zk)):
        return True
    if (
        ArchivedJob.objects.filter(profile=profile).exists()
        or ArchivedBatch.objects.filter(profile=profile).exists()
    ):
        return True
    index = zindex.for_client(zk)
    return any(index.profile_counts(state).get(profile) for state in JOB.states)


def known_collection(profile: str) -> str:
    """``profile`` when the console knows that collection (``collection_known``); else NotFound
    (404), for the notes on it, its page and its priority alike."""
    if not collection_known(profile):
        raise NotFound(
            f"collection {profile} is not known: no profile, hold, window, cap or job (live or "
            "archived) names it"
        )
    return profile


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
        node = digits(p.storage_node)
        if node is not None and 0 < node < 10**9:
            named.setdefault(node, []).append(p.name)
    for node in held:
        named.setdefault(int(node), [])
    return [
        (node, ", ".join(sorted(names)[:5]) + (" …" if len(names) > 5 else ""))
        for node, names in sorted(named.items())
    ]


def consistency_report(*, kind: str = "", page: int = 1) -> dict[str, Any]:
    """The latest consistency check run (walked in the background: ``queues.operator.consistency``)
    with one page of its findings; never a walk of the tree in this process."""
    from queues.operator import consistency

    return consistency.run_dict(consistency.latest(), kind=kind, page=page)


def consumers_overview() -> dict[str, Any]:
    """The /consumers/ page's and ``/api/consumers``'s data: every registered process with its
    threads (``queues.operator.stuck.consumer_processes``) and the orphan locks it found in its own
    session (``orphan_locks``: each process asks the server for its session's locks at every
    publish, so this page reads the registrations only, never every lock in the tree)."""
    from queues.operator import stuck

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
