"""Jobs: creation, loading, the one-transaction status change, priority, locks and deletion.

Why one module (about 1,000 lines): every function here reads or writes the same nodes of a
job (status, index entry, lock, priority) in the contract's one-transaction form, and they share
the transition plan and the index-entry helpers; a change of the contract's job layout
(design/zookeeper-contract.md) is a change here, in one place.
"""

from __future__ import annotations

import contextlib
import functools
import posixpath
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import ZnodeStat

from queues.core.retries import RETRY_KEY
from queues.core.states import JOB, InvalidTransition, JobState, job_batch_folder, job_resume_target
from queues.core.words import LONG_MAX

from . import caps, paths, sized
from .codecs import (
    decode_int,
    decode_json,
    decode_str,
    encode_int,
    encode_json,
    local_time,
    now_stamp,
)
from .errors import (
    Conflict,
    InvalidID,
    ItemLocked,
    MalformedNode,
    NotFound,
    StaleVersion,
    is_connection_error,
)
from .fence import Gated, Write, write_fenced
from .kazoo_private import Multi
from .locks import ledger_of, lock_release, ours_in_doubt
from .nodes import (
    children,
    collect_reads,
    commit,
    ensure_folder,
    exists_many,
    json_merge,
    landed,
    listing_age,
    lock_info,
    read_many,
    stamp,
    start_reads,
)
from .records import Broken, Job, Status, decode_each, evolve
from .side_effects import callback_record_path
from .store_intents import store_intent_path

DEFAULT_PRIORITY = 5
CROWD_MAX = 8
PRUNE_AHEAD = 16
TAKEN = object()  # a claim attempt lost to another consumer
SKIPPED = object()  # a claim attempt on a job that is not this consumer's to work on
REQUIRED_NODES = ("bid", "priority", "configuration", "status")
OPTIONAL_JSON_NODES = ("identifiers", "metadata", "inventory", "store")
ALL_NODES = (*REQUIRED_NODES, "space_needed", *OPTIONAL_JSON_NODES)
# A job status holds exactly these keys, as Merritt's library writes it.
STATUS_KEYS = ("status", "last_modified", "last_successful_status", "retry_count", "message")
# The message of a failure no resume can help (a digest mismatch, a corrupt manifest) starts
# with this marker. It is how "not resumable" is recorded: the status node keeps the library's
# five keys (docs/zookeeper-contract-notes.md), and the next move replaces the message anyway.
NOT_RESUMABLE = "Not resumable: "
# The key earlier versions of the console added to such a status; still honoured when read,
# dropped by the next write.
LEGACY_RESUMABLE_KEY = "resumable"


class Incomplete(NotFound):
    """A job whose creation has not finished (or was abandoned by another client)."""


def new_status(state: str = JobState.PENDING) -> dict[str, Any]:
    return {
        "status": state,
        "last_modified": now_stamp(),
        "last_successful_status": None,
        "retry_count": 0,
        "message": "",
    }


_ENDED = frozenset({JobState.FAILED, JobState.DELETED})


def next_status(
    old: Status, new_state: str, *, message: str, retry: bool, permanent: bool
) -> dict[str, Any]:
    """The status JSON after a move, by the contract's field rules.

    Unknown keys of the old JSON are kept (the console's own old ``resumable`` key and its
    retry key excepted).
    ``last_successful_status`` records the state left, except that failing/deleting does not
    count as success and leaving Failed/Deleted (a resume or release) keeps the step the job had
    reached. A ``permanent`` failure's message starts with ``NOT_RESUMABLE``.
    """
    raw = dict(old.raw)
    old_state = old.status
    if new_state not in _ENDED and old_state not in _ENDED:
        raw["last_successful_status"] = old_state
    raw.setdefault("last_successful_status", None)
    raw["status"] = new_state
    raw["last_modified"] = now_stamp()
    raw["retry_count"] = old.retry_count + (1 if retry else 0)
    if permanent and new_state == JobState.FAILED and not message.startswith(NOT_RESUMABLE):
        message = NOT_RESUMABLE + message
    raw["message"] = message
    raw.pop(LEGACY_RESUMABLE_KEY, None)
    raw.pop(RETRY_KEY, None)  # a move ends any wait for a retry, whoever makes it
    return raw


def is_permanent_failure(status: Status) -> bool:
    """Whether a Failed job's status says that resuming it cannot help."""
    return status.status == JobState.FAILED and (
        status.message.startswith(NOT_RESUMABLE) or status.raw.get(LEGACY_RESUMABLE_KEY) is False
    )


PRIORITIES = range(100)  # the contract's 0..99


def check_priority(priority: int) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in PRIORITIES:
        raise ValueError(f"priority must be an integer 0..99, got {priority!r}")
    return priority


def decode_priority(path: str, data: bytes | None) -> int:
    """A ``priority`` node: an integer 0..99 (MalformedNode otherwise: a job with another
    would be moved to an index entry no claimer lists)."""
    return decode_int(path, data, PRIORITIES.start, PRIORITIES.stop - 1)


def job_create(
    zk: KazooClient,
    *,
    bid: str,
    configuration: dict[str, Any],
    priority: int = DEFAULT_PRIORITY,
    space_needed: int = 0,
    identifiers: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    configure: Callable[[str], dict[str, Any]] | None = None,
) -> Job:
    """Create a Pending job in a batch: all its nodes and both index entries in one transaction.

    The sequential ``/jobs/jid`` node has to exist first to learn the ID; if the transaction
    then fails the empty node is removed again (and a crash in between leaves an empty job node
    that listings skip and the consistency check removes). ``configure`` gives the keys of the
    configuration that name the job's ID (its working folder): written in the same transaction,
    never after the job is there for a consumer to claim.
    """
    paths.bid(bid)
    check_priority(priority)
    ensure_folder(zk, paths.JOB_STATES, paths.job_state_folder(JobState.PENDING))
    ensure_folder(zk, paths.batch(bid), paths.batch_index(bid, job_batch_folder(JobState.PENDING)))
    created = zk.create(f"{paths.JOBS}/jid", b"", sequence=True)
    jid = posixpath.basename(created)
    try:
        nodes = _creating_nodes(
            jid, bid, configuration, priority, space_needed, identifiers, metadata, configure
        )
        txn = zk.transaction()
        txn.check(paths.batch(bid), -1)
        for path, data in nodes:
            txn.create(path, data)
        commit(txn, what=f"create job in {bid}")
    except BaseException:
        zk.delete(created)
        raise
    return job_load(zk, jid)


def job_create_check(
    *,
    bid: str,
    configuration: dict[str, Any],
    priority: int = DEFAULT_PRIORITY,
    space_needed: int = 0,
    identifiers: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    configure: Callable[[str], dict[str, Any]] | None = None,
) -> None:
    """TooLarge when ``job_create`` with these arguments could not send its transaction (a
    title of a megabyte, written by another client): asked of a batch's every job before the
    first is made, so that a batch is refused whole, not half made."""
    _creating_nodes(
        "jid0000000000",  # as long as every job ID
        bid,
        configuration,
        priority,
        space_needed,
        identifiers,
        metadata,
        configure,
    )


def _creating_nodes(
    jid: str,
    bid: str,
    configuration: dict[str, Any],
    priority: int,
    space_needed: int,
    identifiers: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
    configure: Callable[[str], dict[str, Any]] | None,
) -> list[tuple[str, bytes]]:
    """The nodes creating a Pending job writes, checked to fit one request together."""
    if configure is not None:
        configuration = {**configuration, **configure(jid)}
    nodes = [
        (paths.job_node(jid, "bid"), bid.encode()),
        (paths.job_node(jid, "priority"), encode_int(priority)),
        (paths.job_node(jid, "space_needed"), encode_int(space_needed)),
        (paths.job_node(jid, "configuration"), encode_json(configuration)),
        (paths.job_node(jid, "status"), encode_json(new_status())),
    ]
    if identifiers is not None:
        nodes.append((paths.job_node(jid, "identifiers"), encode_json(identifiers)))
    if metadata is not None:
        nodes.append((paths.job_node(jid, "metadata"), encode_json(metadata)))
    nodes.append((paths.job_index_entry(JobState.PENDING, priority, jid), b""))
    nodes.append((paths.batch_index_entry(bid, JobState.PENDING, jid), b""))
    sized.check_many(nodes, what=f"the nodes of a new job of {bid}")
    return nodes


def _decode(jid: str, reads: dict[str, Any], job_stat: Any, lock_stat: Any) -> Job:
    node = job_nodes(jid).named.__getitem__  # the node paths, validated and built once
    if job_stat is None:
        raise NotFound(f"job {jid} does not exist")
    missing = [n for n in REQUIRED_NODES if reads[node(n)] is None]
    if missing:
        raise Incomplete(f"job {jid} is incomplete: {', '.join(node(n) for n in missing)} missing")
    status = _status(node("status"), reads[node("status")])
    bid = decode_str(node("bid"), reads[node("bid")][0]).strip()
    if not paths.BID_RE.fullmatch(bid):
        raise MalformedNode(node("bid"), f"expected a batch ID, found {bid[:40]!r}")
    space = reads[node("space_needed")]
    configuration = reads[node("configuration")]
    problems: dict[str, str] = {}
    optional: dict[str, dict[str, Any] | None] = {}
    for name in OPTIONAL_JSON_NODES:
        read = reads[node(name)]
        if read is None:
            optional[name] = None
            continue
        try:
            optional[name] = decode_json(node(name), read[0])
        except MalformedNode as exc:
            problems[exc.path] = exc.reason
            optional[name] = None
    space_needed = 0
    if space is not None:
        try:
            space_needed = decode_int(node("space_needed"), space[0], 0, LONG_MAX)
        except MalformedNode as exc:
            problems[exc.path] = exc.reason
    return Job(
        jid=jid,
        bid=bid,
        priority=decode_priority(node("priority"), reads[node("priority")][0]),
        space_needed=space_needed,
        configuration=decode_json(node("configuration"), configuration[0]),
        status=status,
        created=stamp(job_stat.ctime),
        lock=lock_info(lock_stat),
        problems=problems,
        configuration_version=configuration[1].version,
        **optional,
    )


def _status(path: str, read: Any) -> Status:
    data, stat = read
    return Status.from_server(decode_json(path, data), stat.version, stat.mtime)


# A job's nodes that another client may change while this process holds the job's lock: an
# operator's hold, resume or delete (status), priority, configuration. The others are written by
# the step that holds the lock (space_needed, identifiers, metadata, store, inventory) or never
# change (bid, the job node, the lock itself).
REFRESHED_NODES = ("status", "priority", "configuration")


class JobNodes:
    """One job's node paths, built once: a consumer needs them at every step of every job."""

    __slots__ = (
        "base",
        "configuration",
        "load",
        "lock",
        "named",
        "priority",
        "refresh",
        "status",
    )

    def __init__(self, jid: str) -> None:
        self.base = base = paths.job(jid)  # validates the ID; the paths below are built on it
        # Each of ALL_NODES by name, as ``paths.job_node`` names them.
        self.named = named = {name: f"{base}/{name}" for name in ALL_NODES}
        self.status = named["status"]
        self.priority = named["priority"]
        self.configuration = named["configuration"]
        self.lock = f"{base}/lock"
        # What ``jobs_finish_load`` reads, and what ``job_refresh`` reads.
        self.load = (*named.values(), base, self.lock)
        self.refresh = (self.status, self.priority, self.configuration)


@functools.lru_cache(maxsize=16384)
def job_nodes(jid: str) -> JobNodes:
    """``JobNodes`` of ``jid`` (InvalidID for a malformed one)."""
    return JobNodes(jid)


def refresh_paths(jids: Sequence[str]) -> list[str]:
    """What ``job_refresh`` reads of each job (send them with ``start_reads``)."""
    reads: list[str] = []
    for j in jids:
        reads += job_nodes(j).refresh
    return reads


def load_paths(jids: Sequence[str]) -> list[str]:
    """What ``jobs_finish_load`` reads of each job (send them with ``start_reads``)."""
    reads: list[str] = []
    for j in jids:
        reads += job_nodes(j).load
    return reads


def job_refresh(known: Job, reads: dict[str, Any]) -> Job:
    """``known`` (loaded and moved by this process, its lock held since, nothing of it written
    by this process meanwhile: ``written_since``) with the nodes others may have changed read
    again (``refresh_paths``); NotFound when the job is gone."""
    nodes = job_nodes(known.jid)
    status = reads[nodes.status]
    priority = reads[nodes.priority]
    configuration = reads[nodes.configuration]
    if status is None or priority is None or configuration is None:
        raise NotFound(f"job {known.jid} does not exist")
    number = decode_priority(nodes.priority, priority[0])
    version = configuration[1].version
    if (
        status[1].version == known.status.version
        and number == known.priority
        and version == known.configuration_version
    ):
        # Nobody wrote it since this process moved it (a status and a configuration change
        # only with their versions): ``known`` as it is, its status as the move's answer
        # stamped it.
        return known
    if status[1].version == known.status.version:
        current = known.status  # as this process wrote it: not decoded again
    else:
        current = _status(nodes.status, status)
    if version == known.configuration_version:
        settings = known.configuration  # unchanged since it was decoded
    else:
        settings = decode_json(nodes.configuration, configuration[0])
    return evolve(
        known,
        status=current,
        priority=number,
        configuration=settings,
        configuration_version=version,
    )


class _LocalWrites:
    """This process's writes of jobs' nodes outside a move (a step's space_needed or
    identifiers, an operator's priority): what was loaded before one of them is out of date.
    Remembers the last ``keep`` jobs written; anything older counts as written."""

    def __init__(self, keep: int = 100_000) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._seq = 0
        self._last: dict[str, int] = {}  # jid -> sequence number of its last write, oldest first
        self._forgotten = 0  # the newest sequence number dropped from _last

    def note(self, jid: str) -> None:
        with self._lock:
            self._seq += 1
            self._last.pop(jid, None)
            self._last[jid] = self._seq
            if len(self._last) > self.keep:
                self._forgotten = self._last.pop(next(iter(self._last)))

    def mark(self) -> int:
        return self._seq

    def since(self, jid: str, mark: int) -> bool:
        return self._last.get(jid, self._forgotten) > mark


_local_writes = _LocalWrites()


def write_mark() -> int:
    """A mark to give ``written_since`` later (take it before loading a job)."""
    return _local_writes.mark()


def written_since(jid: str, mark: int) -> bool:
    """Whether this process wrote a node of ``jid`` (outside a move) since ``mark``."""
    return _local_writes.since(jid, mark)


def _start_load(zk: KazooClient, jids: Sequence[str]) -> Any:
    """Send every read a load needs, without waiting (one round trip however many jobs).

    The job node and its lock are read for their stats (creation time, lock owner).
    """
    return start_reads(zk, load_paths(jids))


def jobs_finish_load(jid: str, reads: dict[str, Any]) -> Job:
    """One job out of collected reads; NotFound (missing, incomplete) or MalformedNode."""
    return _finish_load(jid, reads)


def _finish_load(jid: str, reads: dict[str, Any]) -> Job:
    nodes = job_nodes(jid)
    job, lock = reads[nodes.base], reads[nodes.lock]
    return _decode(jid, reads, job and job[1], lock and lock[1])


def jobs_load(zk: KazooClient, jids: Sequence[str]) -> list[Job | Broken]:
    """Load many jobs in one pipelined round trip, in the order given.

    Jobs that vanished or are still being created are left out; jobs whose nodes do not decode
    come back as Broken records naming the bad node.
    """
    for jid in jids:
        paths.jid(jid)
    reads = collect_reads(_start_load(zk, jids))
    return decode_each("job", jids, lambda jid: _finish_load(jid, reads))


def job_load(zk: KazooClient, jid: str) -> Job:
    """Load one job; NotFound (missing or incomplete) or MalformedNode naming the bad path."""
    paths.jid(jid)
    return _finish_load(jid, collect_reads(_start_load(zk, [jid])))


def _index_moves(
    zk: KazooClient, job: Job, new_state: str, new_priority: int
) -> tuple[list[str], list[str]]:
    """Index entries to delete and to create for a move; only what exists is deleted."""
    old = [job.index_path, job.batch_index_path]
    new = [
        paths.job_index_entry(new_state, new_priority, job.jid),
        paths.batch_index_entry(job.bid, new_state, job.jid),
    ]
    present = exists_many(zk, old + new)
    deletes = [p for p in old if p not in new and present[p] is not None]
    creates = [p for p in new if present[p] is None]
    return deletes, creates


@dataclass(slots=True)  # made for every job a consumer moves: not frozen (a third of the cost)
class TransitionPlan:
    """One job's move, worked out but not yet written: exactly the writes ``job_transition``
    makes, so a batched move (several jobs in one multi, ``queues.zk.pipeline``) writes the
    same bytes as the one-job path. Not changed once made (``dataclasses.replace`` makes
    another).

    ``lock`` says what happens to the job's ephemeral lock in the same transaction: ``None``
    (an operator's move, or anyone's who holds no lock) creates it and deletes it again, so the
    transaction fails while any session holds the job (Merritt's ingest, a consumer of ours);
    ``"release"`` deletes it (a consumer's last step), ``"keep"`` checks it still exists and
    leaves it (a consumer that keeps the job for its next step). With ``"release"`` or
    ``"keep"`` the transaction fails when the lock is gone.
    """

    job: Job
    new_state: str
    raw: dict[str, Any]
    new_priority: int
    lock: str | None = None  # None | "release" | "keep"
    # Nodes of the job's own (records of side effects the move ends) deleted in the same
    # multi; each must exist, or the move is tried again without the missing ones.
    drops: tuple[str, ...] = ()

    @property
    def lock_path(self) -> str:
        return job_nodes(self.job.jid).lock

    @property
    def what(self) -> str:
        return f"move {self.job.jid} from {self.job.state} to {self.new_state}"

    def index_changes(self) -> tuple[list[str], list[str]]:
        """Index entries to delete and to create when the index is where the status says."""
        job = self.job
        state, new_state = job.state, self.new_state
        priority, new_priority = job.priority, self.new_priority
        old_entry = new_entry = job.index_path
        if state != new_state or priority != new_priority:
            new_entry = paths.job_index_entry(new_state, new_priority, job.jid)
        old_folder, new_folder = job_batch_folder(state), job_batch_folder(new_state)
        if old_folder == new_folder:
            if old_entry == new_entry:
                return [], []
            return [old_entry], [new_entry]
        batches = paths.batch(job.bid)
        old_batch = f"{batches}/states/{old_folder}/{job.jid}"
        new_batch = f"{batches}/states/{new_folder}/{job.jid}"
        if old_entry == new_entry:
            return [old_batch], [new_batch]
        return [old_entry, old_batch], [new_entry, new_batch]

    def add_to(
        self,
        txn: TransactionRequest,
        deletes: Sequence[str] | None = None,
        creates: Sequence[str] | None = None,
        *,
        lock: str | None,
        status: bytes | None = None,
    ) -> None:
        """Append this move's operations to ``txn``: the index changes as given (else the usual
        ones), and ``lock`` (None | "release" | "keep") for the lock. ``status``: the status
        JSON already encoded (``encode_json(self.raw)``)."""
        if deletes is None or creates is None:
            deletes, creates = self.index_changes()
        job = self.job
        nodes = job_nodes(job.jid)
        if status is None:
            status = encode_json(self.raw)
        txn.set_data(nodes.status, status, job.status.version)
        if self.new_priority != job.priority:
            txn.set_data(nodes.priority, encode_int(self.new_priority))
        for path in deletes:
            txn.delete(path)
        for path in creates:
            txn.create(path, b"")
        for path in self.drops:
            txn.delete(path)
        if lock == "release":
            txn.delete(nodes.lock)
        elif lock == "keep":
            txn.check(nodes.lock, -1)
        else:
            # No lock of the writer's: none may exist (the contract's "every other write to a
            # job's nodes is fenced"). The ephemeral create fails while anyone holds the job.
            txn.create(nodes.lock, b"", ephemeral=True)
            txn.delete(nodes.lock)

    def moved(self, stat: ZnodeStat | None = None) -> Job:
        """The job as this move leaves it: its status as the server stamped it (``stat``, the
        status write's answer), or else one version up and written now."""
        job = self.job
        if stat is None:
            status = Status(raw=self.raw, version=job.status.version + 1, mtime=local_time())
        else:
            status = Status.from_server(self.raw, stat.version, stat.mtime)
        return evolve(job, status=status, priority=self.new_priority)


def transition_plan(
    job: Job,
    new_state: str,
    *,
    message: str = "",
    admin: bool = False,
    retry: bool = False,
    permanent: bool = False,
    priority: int | None = None,
    lock: str | None = None,
    drops: tuple[str, ...] = (),
) -> TransitionPlan:
    """Check a move against the state machine and work out its writes (nothing is sent).
    ``drops``: records of the job's deleted with the move (``TransitionPlan.drops``)."""
    if new_state == JobState.DELETED:
        raise InvalidTransition("job: use job_remove to delete a job")
    if lock not in (None, "release", "keep"):
        raise ValueError(f"lock must be None, 'release' or 'keep', got {lock!r}")
    state = job.state
    JOB.check(state, new_state, admin=admin)
    if state == JobState.FAILED:
        _check_resumable(job)  # a permanent failure stays failed, whoever moves it
    new_priority = job.priority if priority is None else check_priority(priority)
    raw = next_status(job.status, new_state, message=message, retry=retry, permanent=permanent)
    return TransitionPlan(job, new_state, raw, new_priority, lock, drops)


def job_transition(
    zk: KazooClient,
    job: Job,
    new_state: str,
    *,
    message: str = "",
    admin: bool = False,
    retry: bool = False,
    permanent: bool = False,
    priority: int | None = None,
    release_lock: bool = False,
    keep_lock: bool = False,
    drops: tuple[str, ...] = (),
) -> Job:
    """Move a job to ``new_state`` in ONE transaction.

    The transaction writes the status JSON (checked against the version ``job`` was read at),
    moves ``/jobs/states/<old>/PP-JID`` to ``/jobs/states/<new>/PP-JID`` and moves the batch
    index entry. A stale ``job`` raises Conflict and changes nothing. With ``release_lock`` the
    caller's ephemeral lock is deleted in the same transaction (a consumer's last step); with
    ``keep_lock`` the transaction checks the lock is still there and leaves it (a consumer that
    keeps the job for its next step): without the lock nothing is written.
    """
    plan = transition_plan(
        job,
        new_state,
        message=message,
        admin=admin,
        retry=retry,
        permanent=permanent,
        priority=priority,
        lock="keep" if keep_lock else "release" if release_lock else None,
        drops=drops,
    )
    moved = transition_apply(zk, plan)
    if admin:
        _count_admin_entry(zk, job, new_state)
    return moved


def _count_admin_entry(zk: KazooClient, job: Job, new_state: str) -> None:
    """An operator's move into flight (a resume) counts against its collection's cap."""
    if new_state in caps.IN_FLIGHT and job.state not in caps.IN_FLIGHT and job.profile:
        with contextlib.suppress(InvalidID):
            caps.count_entry(zk, job.profile, job.jid)


def transition_apply(
    zk: KazooClient,
    plan: TransitionPlan,
    *,
    require_lock: bool = False,
    gate: Callable[[Callable[[], Any]], Any] | None = None,
) -> Job:
    """Write one planned move (see ``job_transition``), repairing the index when it must.

    A plan that releases the lock goes ahead without it when the lock has vanished meanwhile,
    unless ``require_lock``: then, as for a kept lock, nothing is written without it. ``gate``
    is handed each write's sending (``SessionGate.send_if_current`` of the daemons: it refuses
    once the session that took the lock is gone); the answer is waited for outside it.
    """

    def attempt(
        plan: TransitionPlan, deletes: Sequence[str], creates: Sequence[str], lock: str | None
    ) -> list[Any]:
        txn = Multi(zk)
        plan.add_to(txn, deletes, creates, lock=lock)
        return commit(txn if gate is None else Gated(txn, gate), what=plan.what)

    try:
        moved = _apply(zk, plan, attempt, require_lock=require_lock)
    except Exception as exc:
        if plan.lock == "release" and is_connection_error(exc):
            # Unanswered: the lock may be gone with the move or still there; no one works
            # under it any more, and the reconciler looks once the connection is back.
            ledger_of(zk).in_doubt((plan.lock_path,))
        raise
    if plan.lock == "release":
        ledger_of(zk).given_up((plan.lock_path,))
    return moved


def _apply(
    zk: KazooClient,
    plan: TransitionPlan,
    attempt: Callable[[TransitionPlan, Sequence[str], Sequence[str], str | None], list[Any]],
    *,
    require_lock: bool,
) -> Job:
    job = plan.job
    try:
        try:
            # The usual case, in one round trip: the index is where the status says and the
            # target folders exist. Only when ZooKeeper refuses that is the index looked at.
            answer = attempt(plan, *plan.index_changes(), plan.lock)
        except StaleVersion:
            raise
        except Conflict:
            strict = plan.lock == "keep" or (plan.lock == "release" and require_lock)
            lock_stat = zk.exists(plan.lock_path)
            if strict and lock_stat is None:
                raise
            if plan.lock is None and lock_stat is not None:
                raise _locked(job) from None
            deletes, creates = _index_moves(zk, job, plan.new_state, plan.new_priority)
            # Folders are created below their owner only: a job whose batch was deleted
            # meanwhile gets NotFound instead of recreating an empty ghost of the batch.
            for path in creates:
                root = (
                    paths.JOB_STATES if path.startswith(paths.JOB_STATES) else paths.batch(job.bid)
                )
                ensure_folder(zk, root, posixpath.dirname(path))
            lock = plan.lock
            if lock == "release" and lock_stat is None:
                lock = None  # gone meanwhile: the move is made only while no one holds the job
            if plan.drops:
                found = exists_many(zk, list(plan.drops))
                plan = replace(plan, drops=tuple(p for p in plan.drops if found[p] is not None))
            answer = attempt(plan, deletes, creates, lock)
    except StaleVersion:
        # After a connection loss the first attempt may have landed: that is success.
        current = job_load(zk, job.jid)
        if landed(current.status, job.status, plan.raw) and current.priority == plan.new_priority:
            return current
        raise
    # The status write answers first among the move's writes that answer a stat.
    return plan.moved(next((r for r in answer if isinstance(r, ZnodeStat)), None))


def _locked(job: Job) -> ItemLocked:
    return ItemLocked(
        f"job {job.jid} is locked by a running consumer (ours or Merritt's); try again later"
    )


def job_resume_state(job: Job) -> str:
    """Where an admin resume takes this failed job, or InvalidTransition with the reason."""
    if job.state != JobState.FAILED:
        raise InvalidTransition(f"job: only a Failed job can be resumed; {job.jid} is {job.state}")
    _check_resumable(job)
    return job_resume_target(job.status.last_successful_status)


def _check_resumable(job: Job) -> None:
    if is_permanent_failure(job.status):
        reason = job.status.message.removeprefix(NOT_RESUMABLE) or "no reason given"
        raise InvalidTransition(
            f"job: {job.jid} failed permanently ({reason}); submit the object again"
        )


def job_set_space_needed(zk: KazooClient, job: Job, space_needed: int) -> Job:
    """Write the job's ``space_needed`` as the holder of its lock (``fence.write_fenced``);
    nothing when the job as read has that size already (downloading finds the size estimating
    wrote): the move after it is fenced all the same."""
    if space_needed < 0:
        raise ValueError("space_needed cannot be negative")
    if space_needed == job.space_needed:
        return job
    return job_write(zk, job, {"space_needed": encode_int(space_needed)}, space_needed=space_needed)


def job_set_nodes(zk: KazooClient, job: Job, values: dict[str, dict[str, Any]]) -> Job:
    """Write optional JSON nodes (identifiers, metadata, inventory, store) in one fenced
    transaction as the holder of the job's lock (Processing's ``store`` and ``inventory``,
    which Merritt's storage and inventory services read: both or neither)."""
    if not set(values) <= set(OPTIONAL_JSON_NODES):
        raise ValueError(f"only {', '.join(OPTIONAL_JSON_NODES)} may be written this way")
    encoded = {name: encode_json(value) for name, value in values.items()}
    return job_write(zk, job, encoded, **values)


def job_set_json(zk: KazooClient, job: Job, name: str, value: dict[str, Any]) -> Job:
    """``job_set_nodes`` for one node."""
    return job_set_nodes(zk, job, {name: value})


def job_write(zk: KazooClient, job: Job, nodes: dict[str, bytes], **fields: Any) -> Job:
    """Every write to a job's own nodes but its moves: under its lock, checked in the same
    multi (``fence.write_fenced``); the job with ``fields`` changed. LockLost when the claim's
    session is gone, Conflict or StaleVersion when the job is no longer the writer's."""
    _local_writes.note(job.jid)
    writes = [Write(paths.job_node(job.jid, name), data) for name, data in nodes.items()]
    write_fenced(zk, job, writes, what=f"write {', '.join(nodes)} of {job.jid}")
    return replace(job, **fields)


def job_remove(zk: KazooClient, job: Job, *, check_state: bool = True) -> None:
    """Delete every node of a job, both its index entries and its records of side effects
    (``store_intents``, ``side_effects``) in one transaction.

    With ``check_state`` the state machine must allow the delete (Held, Failed, Completed, or
    Deleted: a job Merritt's library marked Deleted); a batch delete removes its jobs whatever
    their state. A locked job is never removed.
    """
    if check_state:
        JOB.check_delete(job.state)
    _remove(
        zk,
        job.jid,
        [job.index_path, job.batch_index_path],
        status_version=job.status.version,
        what=f"delete {job.jid}",
    )


def _remove(
    zk: KazooClient,
    jid: str,
    entries: list[str],
    *,
    status_version: int | None,
    what: str,
) -> None:
    """Delete the job's nodes, those of ``entries`` (index entries) that exist and its records
    of side effects, in one transaction. ItemLocked when it is locked. With
    ``status_version`` the status must still be that one.

    The lock is never among the deletes: a lock listed is ItemLocked, and one taken after the
    listing makes the delete of the job's own node fail (NotEmpty), so the transaction is made
    only while no session holds the job."""
    root = paths.job(jid)
    kids = children(zk, root)
    if "lock" in kids:
        raise ItemLocked(f"job {jid} is locked by a running consumer; try again later")
    candidates = [*entries, store_intent_path(jid), callback_record_path(jid)]
    found = [p for p, stat in exists_many(zk, candidates).items() if stat is not None]
    txn = zk.transaction()
    for kid in kids:
        if kid == "status" and status_version is not None:
            txn.delete(f"{root}/{kid}", version=status_version)
        else:
            txn.delete(f"{root}/{kid}")
    txn.delete(root)
    for path in found:
        txn.delete(path)
    commit(txn, what=what)


def job_remove_unreadable(zk: KazooClient, jid: str) -> None:
    """Delete every node of a job that cannot be read (a node another client wrote oddly), and
    every index entry that names it, in one transaction. Nothing of the job
    is trusted: its entries are looked for under every priority of every state folder and in
    every index folder of the batch its ``bid`` names (a ``bid`` that is no batch ID leaves
    that entry to the consistency check's ``orphan-batch-index``). A locked job is never
    removed. NotFound when there is no such job."""
    if zk.exists(paths.job(jid)) is None:
        raise NotFound(f"job {jid} does not exist")
    entries = [
        paths.job_index_entry(state, priority, jid)
        for state in JOB.states
        for priority in PRIORITIES
    ]
    bid_path = paths.job_node(jid, "bid")
    bid_read = read_many(zk, [bid_path])[bid_path]
    bid = bid_read[0].decode("ascii", "replace").strip() if bid_read is not None else ""
    with contextlib.suppress(InvalidID):
        # Every index folder of the batch, each named once (several states share one).
        entries += dict.fromkeys(paths.batch_index_entry(bid, s, jid) for s in JOB.states)
    _remove(zk, jid, entries, status_version=None, what=f"delete {jid}, which cannot be read")


def index_entries(zk: KazooClient, state: str) -> list[tuple[int, str]]:
    """The (priority, jid) entries of a state folder, in run order (priority, then age)."""
    result = []
    for name in children(zk, paths.job_state_folder(state)):
        match = paths.INDEX_ENTRY_RE.fullmatch(name)
        if match:
            result.append((int(match.group(1)), match.group(2)))
    result.sort()
    return result


class JobClaimer:
    """Claims the jobs of one state, first in priority order, for one consumer.

    The state folder's listing is kept between claims for up to ``max_age`` seconds (longer for a
    large folder: ``nodes.listing_age``) and walked from where the last claim stopped, instead of
    listed anew for every claim: a folder holding 100,000 jobs is a 2 MB answer. A job that arrives
    meanwhile (even one of higher priority) waits that long at most for the next listing, and a walk
    that finds nothing to claim lists the folder again before it gives up, so no work is missed.
    ``max_age=0`` lists every time.

    A claim is one write, then one read: the lock is created in a multi-operation that first
    checks the job's index entry is still in this state's folder, so a job that another consumer
    has meanwhile moved on is never locked (where it would hold up the next step's consumer);
    then the job's nodes are read in one multiRead. The job is checked after that: its status
    must be this state, and ``accept`` must take it. With one consumer the walk follows the
    listing's order exactly; once it has lost a race to another, it reads which of the next
    jobs are free before it tries one, and picks among them at random unless ``strict``.
    """

    def __init__(
        self,
        zk: KazooClient,
        state: str,
        *,
        max_age: float = 1.0,
        strict: bool = False,
        skip: Callable[[str], bool] | None = None,
        screen: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.zk = zk
        self.state = state
        self.strict = strict
        # Jobs to pass over unclaimed (a collection at its cap: zk/caps.py; jobs waiting for
        # their next try). A skip that is false (nothing to pass over now) costs no call a name.
        self.skip = skip
        # The same for a whole listing at once (jobs bound for a held storage node: zk/waits.py),
        # where what decides is read for many jobs in one request.
        self.screen = screen
        self.folder = paths.job_state_folder(state)
        self.max_age = max_age
        self._names: list[str] = []  # not yet tried, in reverse run order (the next is last)
        self._crowd = 0  # races lost to other consumers lately (see _walk)
        self._listed_at = float("-inf")
        self._listed = 0  # names in the last listing

    def _list(self) -> None:
        # "PP-jidNNNNNNNNNN" sorts as text in run order; only the names tried are parsed.
        names = children(self.zk, self.folder)
        if self.skip:
            names = [n for n in names if not self.skip(n[3:])]
        if self.screen is not None:
            names = self.screen(names)
        self._names = sorted(names, reverse=True)
        self._listed = len(self._names)
        self._listed_at = time.monotonic()

    def claim(self, accept: Callable[[Job], bool] | None = None) -> Job | None:
        age = time.monotonic() - self._listed_at
        fresh = self.max_age <= 0 or age >= listing_age(self.max_age, self._listed)
        if fresh:
            self._list()
        while True:
            job = self._walk(accept)
            if job is not None or fresh:
                return job
            # Nothing left in a listing from an earlier claim: look again before giving up.
            self._list()
            fresh = True

    def _walk(self, accept: Callable[[Job], bool] | None) -> Job | None:
        # Once a lock tried here has been lost to another consumer, much of the listing may be
        # locked or gone, and every lock tried on such a job is a failed write the server has
        # to log: the entries ahead and their locks are read first, in one read, and (unless
        # the claimer is ``strict``) the pick is spread at random over the entries found free,
        # so that consumers walking the same listing do not all go for its head.
        crowd = self._crowd
        taken = 0
        free = 0  # entries at the end of the walk found present and unlocked by the last read
        while self._names:
            if (crowd or taken) and not free:
                free = self._prune(PRUNE_AHEAD)
                continue
            spread = not self.strict and free > 1
            name = self._names.pop(-1 - random.randint(0, free - 1) if spread else -1)
            free = max(0, free - 1)
            match = paths.INDEX_ENTRY_RE.fullmatch(name)
            if match is None:
                continue
            if self.skip and self.skip(match.group(2)):
                # Asked again as the walk comes to it: what the listing let through may wait
                # again since (a slot freed at the listing, taken by another loop meanwhile).
                continue
            job = self._try(f"{self.folder}/{name}", match.group(2), accept)
            if isinstance(job, Job):
                break
            if job is TAKEN:
                taken += 1
                free = 0  # read again: the others are moving fast
        else:
            job = None
        # Lost races count fully; a claim without one halves the memory of earlier ones.
        self._crowd = min(CROWD_MAX, taken + crowd // 2)
        return job

    def _prune(self, count: int) -> int:
        """Drop those of the next ``count`` entries that are gone or locked; how many are left."""
        ahead = []
        for name in self._names[-count:]:
            match = paths.INDEX_ENTRY_RE.fullmatch(name)
            if match is not None:
                ahead.append((name, f"{self.folder}/{name}", paths.job_node(match[2], "lock")))
        reads = read_many(self.zk, [p for _, entry, lock in ahead for p in (entry, lock)])
        free = [n for n, entry, lock in ahead if reads[entry] is not None and reads[lock] is None]
        self._names[-count:] = free
        return len(free)

    def _try(self, entry: str, jid: str, accept: Callable[[Job], bool] | None) -> Job | object:
        """The job, locked; TAKEN when another consumer has it; SKIPPED when it is not for us."""
        lock_path = paths.job_node(jid, "lock")
        ledger = ledger_of(self.zk)
        if not ledger.claim(lock_path):
            return TAKEN  # another thread of this process has it
        txn = self.zk.transaction()
        txn.check(entry, -1)
        txn.create(lock_path, b"", ephemeral=True)
        try:
            results = txn.commit()
        except (NodeExistsError, NoNodeError):
            results = [NoNodeError()]
        except Exception as exc:
            # Unanswered: the server may hold the lock for this session (the reconciler looks).
            (ledger.in_doubt if is_connection_error(exc) else ledger.given_up)((lock_path,))
            raise
        locked = not any(isinstance(r, Exception) for r in results)
        if not locked and not self._ours_already(results, lock_path):
            ledger.given_up((lock_path,))
            return TAKEN  # locked by another consumer, moved on, or deleted
        try:
            job = job_load(self.zk, jid)
            wanted = job.state == self.state and (accept is None or accept(job))
        except (NotFound, MalformedNode):
            wanted = False
        except Exception as exc:
            if is_connection_error(exc):
                # The caller never sees the job: nobody works under its lock any more.
                ledger.in_doubt((lock_path,))
            else:
                lock_release(self.zk, lock_path)
            raise
        if not wanted:
            lock_release(self.zk, lock_path)
            return SKIPPED
        return job

    def _ours_already(self, results: list[Any], lock_path: str) -> bool:
        """Whether a claim refused only for its lock found this session's own lock there (a
        create answered with ConnectionLoss that the server had applied): then it is ours.
        Only a lock in doubt can be: one of this session's that no thread holds and whose
        create was answered is some other thread's work, never taken over."""
        if len(results) != 2 or not isinstance(results[1], NodeExistsError):
            return False
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            return False
        return ours_in_doubt(self.zk, lock_path)


def job_acquire(
    zk: KazooClient, state: str, *, accept: Callable[[Job], bool] | None = None
) -> Job | None:
    """Lock and return the first job of ``state`` in priority order, skipping locked ones."""
    return JobClaimer(zk, state, max_age=0, strict=True).claim(accept)


def job_retry_later(zk: KazooClient, job: Job, retry: dict[str, Any], message: str) -> Job:
    """Record on the job, as the holder of its lock, that its step is to be tried again: the
    status keeps its state and Merritt's keys (``retry_count`` untouched: it counts an
    operator's resumes), with ``message`` and the console's ``RETRY_KEY`` (``queues.core.retries``).
    The job as written; LockLost, Conflict or StaleVersion as ``write_fenced``."""
    raw = dict(job.status.raw)
    raw["last_modified"] = now_stamp()
    raw["message"] = message
    raw[RETRY_KEY] = retry
    path = paths.job_node(job.jid, "status")
    results = write_fenced(zk, job, [Write(path, encode_json(raw), replace=True)], what=path)
    stat = results[-1]
    version = stat.version if isinstance(stat, ZnodeStat) else job.status.version + 1
    return evolve(job, status=Status.from_server(raw, version, int(time.time() * 1000)))


def job_unlock(zk: KazooClient, job: Job) -> None:
    lock_release(zk, paths.job_node(job.jid, "lock"))


def job_configuration_update(zk: KazooClient, jid: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Merge ``changes`` into ``/jobs/JID/configuration`` (version-checked, other keys kept),
    without the job's lock: an operator's or another client's edit, never a consumer's (the
    batch consumer writes ``working_dir`` in ``job_create``'s own multi: ``configure``).
    """
    _local_writes.note(paths.jid(jid))
    return json_merge(zk, paths.job_node(jid, "configuration"), changes)
