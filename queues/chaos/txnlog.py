"""ZooKeeper's own transaction logs, read back after a chaos run and judged.

What the consumers believe they did is one story; what the servers committed is the other, and
the one that counts. Every server writes each transaction it accepts to ``version-2/log.<zxid>``
under its data folder, so after a run the judge can replay the whole history and ask, at each
zxid, who held which lock:

(a) an item lock (``/jobs/JID/lock``, ``/batches/BID/lock``, ``/access/<queue>/QID/lock``, the
    per-object locks under ``/locks/storage`` and ``/locks/inventory``) deleted by a session
    that did not create it. The server deleting it when its session closes or expires is fine;
    an operator's ``lock_break`` would be the one legitimate exception, and a chaos run never
    breaks a lock.
(b) a lock created while another live session's lock stood at its path (ZooKeeper refuses
    that; seeing it would mean the replay, or the server, is wrong); and, when the logs hold
    the whole history, a lock delete the server applied although the history had no such
    lock: the server's tree disagreed with its own log (seen once under a storm of leader
    kills on ZooKeeper 3.8.0: a new leader's tree still held a lock the history had deleted,
    listed it among its first owner's ephemerals, and that owner's reconciler deleted it).
(c) a write to a job's nodes (create, setData or delete under ``/jobs/JID/``, other than the
    lock, or a move of its index entry under ``/jobs/states/``) by a consumer session that did
    not hold the job's lock at that zxid. A lock taken in the same multi counts as held. Job
    creation (the multi that creates ``/jobs/JID/status``, after the sequential create of
    ``/jobs/JID``) and job removal (the multi that deletes ``/jobs/JID`` itself, which
    ZooKeeper refuses while a lock child exists) are not lock-fenced by design and are counted,
    not judged.

A consumer session is one that registered under ``/mrt-console/consumers`` or
``/mrt-console/claimers`` (``queues.zk.consumers``), or that took an item lock at any point of
its life; sessions given by the caller are added. Other sessions (the run's own monitor, a web
worker, an operator's shell) are not judged by (c).

The file format is jute, ZooKeeper's serialization (``zookeeper.jute`` in its sources): a file
header (``ZKLG``, version, dbid), then entries of an Adler-32 checksum (long), the entry's bytes
(int length, then a TxnHeader and the record of its type, and in ZooKeeper 3.6+ maybe a tree
digest) and the byte ``B``. A zero length ends the file (the rest is preallocated zeros).

An ensemble member purges its old logs when it starts (``autopurge``: it keeps those of its
three latest snapshots; a standalone server, ZooKeeperServerMain, runs no purge), and takes a
snapshot at each election: a storm of leader kills would leave the early history on no server.
So the chaos run copies each server's logs aside before it starts the server again
(``keep_logs``), and the judge reads a server's current logs and, for the files purged since,
the copies.

Several servers log the same committed transactions. Merged by zxid, a transaction counts when a
majority of the servers whose log files span its zxid hold it: a committed transaction was
logged by a quorum before it was acknowledged, and one a killed leader logged alone (never
committed, normally truncated when it rejoins) is left out and counted.
"""

from __future__ import annotations

import re
import shutil
import struct
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"ZKLG"

# ZooDefs.OpCode, as the transaction log holds them.
CREATE = 1
DELETE = 2
SET_DATA = 5
SET_ACL = 7
CHECK = 13
MULTI = 14
CREATE2 = 15
RECONFIG = 16
CREATE_CONTAINER = 19
DELETE_CONTAINER = 20
CREATE_TTL = 21
CREATE_SESSION = -10
CLOSE_SESSION = -11
ERROR = -1

CREATES = (CREATE, CREATE2, CREATE_CONTAINER, CREATE_TTL)
DELETES = (DELETE, DELETE_CONTAINER)
NAMES = {
    CREATE: "create", DELETE: "delete", SET_DATA: "setData", SET_ACL: "setACL", CHECK: "check",
    MULTI: "multi", CREATE2: "create2", RECONFIG: "reconfig", CREATE_CONTAINER: "createContainer",
    DELETE_CONTAINER: "deleteContainer", CREATE_TTL: "createTTL", CREATE_SESSION: "createSession",
    CLOSE_SESSION: "closeSession", ERROR: "error",
}  # fmt: skip


class TxnLogError(ValueError):
    """A file that is not a ZooKeeper transaction log, or an entry that does not decode."""


@dataclass(frozen=True)
class Op:
    """One change: a plain transaction's, or one of a multi's."""

    type: int
    path: str = ""
    ephemeral: bool = False  # a create's
    error: int = 0  # an error's code


@dataclass(frozen=True)
class Txn:
    zxid: int
    session: int
    cxid: int
    time: int  # milliseconds since the epoch, the leader's clock
    type: int
    ops: tuple[Op, ...] = ()  # one for a plain change, each of a multi's; none for sessions
    closed: tuple[str, ...] = ()  # a closeSession's ephemerals, when the server logs them

    @property
    def failed(self) -> bool:
        """An error logged in place of a change (a create of an existing node, a multi with a
        failed op: ZooKeeper then logs every op of it as an error and applies none)."""
        return self.type == ERROR or any(op.type == ERROR for op in self.ops)

    @property
    def epoch(self) -> int:
        return self.zxid >> 32

    def describe(self) -> str:
        ops = ", ".join(f"{NAMES.get(o.type, o.type)} {o.path}".strip() for o in self.ops)
        return (
            f"zxid 0x{self.zxid:x} session 0x{self.session:x} {NAMES.get(self.type, self.type)}"
            + (f" [{ops}]" if ops else "")
        )


class _Reader:
    """Jute's binary encoding: big-endian ints and longs, length-prefixed strings and buffers
    (-1 for null), vectors as a count and their items."""

    def __init__(self, data: bytes, offset: int = 0) -> None:
        self.data = data
        self.at = offset

    def _take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.data):
            raise TxnLogError(f"entry ends at byte {len(self.data)}, {end} needed")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def read_int(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def read_long(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def read_bool(self) -> bool:
        return self._take(1) != b"\0"

    def read_buffer(self) -> bytes:
        size = self.read_int()
        return b"" if size < 0 else self._take(size)

    def read_string(self) -> str:
        return self.read_buffer().decode("utf-8", errors="replace")

    def read_acl(self) -> None:
        for _ in range(max(self.read_int(), 0)):
            self.read_int()  # perms
            self.read_string()  # scheme
            self.read_string()  # id


def _record(kind: int, data: _Reader) -> Op:
    """The record of one change of type ``kind``; only what the judge needs is kept."""
    if kind in (CREATE, CREATE2):
        path = data.read_string()
        data.read_buffer()
        data.read_acl()
        return Op(kind, path, ephemeral=data.read_bool())
    if kind in (CREATE_CONTAINER, CREATE_TTL):
        path = data.read_string()
        return Op(kind, path)
    if kind in (DELETE, DELETE_CONTAINER, SET_DATA, SET_ACL, CHECK, RECONFIG):
        return Op(kind, data.read_string())
    if kind == ERROR:
        return Op(kind, error=data.read_int())
    return Op(kind)  # a kind the judge has no use for (setMaxChildren, ...)


def decode_entry(entry: bytes) -> Txn:
    """One entry's bytes (without checksum and length): a TxnHeader and its record."""
    data = _Reader(entry)
    session, cxid, zxid, time, kind = (
        data.read_long(),
        data.read_int(),
        data.read_long(),
        data.read_long(),
        data.read_int(),
    )
    ops: tuple[Op, ...] = ()
    closed: tuple[str, ...] = ()
    if kind == MULTI:
        found = []
        for _ in range(max(data.read_int(), 0)):
            sub_kind = data.read_int()
            found.append(_record(sub_kind, _Reader(data.read_buffer())))
        ops = tuple(found)
    elif kind == CLOSE_SESSION:
        if data.at < len(entry):  # CloseSessionTxn, ZooKeeper 3.6+ (closeSessionTxn.enabled)
            closed = tuple(data.read_string() for _ in range(max(data.read_int(), 0)))
    elif kind == CREATE_SESSION:
        pass  # CreateSessionTxn: the timeout only
    else:
        ops = (_record(kind, data),)
    return Txn(zxid, session, cxid, time, kind, ops, closed)


def read_log(path: Path) -> Iterator[Txn]:
    """Every transaction of one log file, in order; a torn last entry (a server killed while
    writing it) ends the file, as it ends ZooKeeper's own reading of it."""
    raw = Path(path).read_bytes()
    if raw[:4] != MAGIC:
        raise TxnLogError(f"{path}: not a ZooKeeper transaction log (no ZKLG header)")
    at = 16  # magic, version (int), dbid (long)
    while at + 12 <= len(raw):
        crc, size = struct.unpack(">qi", raw[at : at + 12])
        if size <= 0:  # the preallocated, zeroed rest of the file
            return
        end = at + 12 + size
        if end + 1 > len(raw) or raw[end : end + 1] != b"B":
            return  # the last entry is partial
        entry = raw[at + 12 : end]
        if zlib.adler32(entry) != crc & 0xFFFFFFFF:
            raise TxnLogError(f"{path}: checksum mismatch at byte {at}")
        yield decode_entry(entry)
        at = end + 1


def log_files(data_dir: Path, kept: Path | None = None) -> list[Path]:
    """A server's log files, oldest first: ``data_dir`` may be the server's folder (with
    ``data/``), its data folder or the ``version-2`` folder itself. ``kept``: a folder of
    copies (``keep_logs``), whose files count where the server no longer has them."""
    base = Path(data_dir)
    found: list[Path] = []
    for candidate in (base / "data" / "version-2", base / "version-2", base):
        found = [p for p in candidate.glob("log.*") if re.fullmatch(r"log\.[0-9a-f]+", p.name)]
        if found:
            break
    if kept is not None and kept.is_dir():
        current = {p.name for p in found}
        found += [p for p in log_files(kept) if p.name not in current]
    return sorted(found, key=lambda p: int(p.name[4:], 16))


def keep_logs(data_dir: Path, into: Path) -> int:
    """Copy a server's log files into ``into`` (before it starts again and purges some);
    a file copied before is copied again, having grown since. Returns the files copied."""
    into.mkdir(parents=True, exist_ok=True)
    copied = 0
    for path in log_files(data_dir):
        shutil.copyfile(path, into / path.name)
        copied += 1
    return copied


@dataclass
class History:
    """The servers' logs merged by zxid."""

    txns: list[Txn]
    servers: int
    entries: int  # entries read over every server's logs
    minority: list[Txn] = field(default_factory=list)  # left out: logged by too few servers
    conflicts: int = 0  # zxids whose entries differ between servers


def merge(data_dirs: Iterable[Path], kept: Path | None = None) -> History:
    """Every server's log read and merged (see the module's docstring for the majority rule).
    ``kept``: the folder of ``keep_logs`` copies, one subfolder per server named as its
    folder.

    A server counts for a zxid when its logs begin at or before it and end at or after it: a
    server down for a while and brought up to date from a snapshot has a gap it still counts
    for, and holds a committed transaction's fellow holders to two of three; one whose old
    files were purged does not count for what they held. Servers that logged one failed
    request differently (a multi's ops turned to errors or not) agree: both were not applied."""
    spans: list[tuple[int, int]] = []
    holders: dict[int, list[Txn]] = defaultdict(list)
    entries = 0
    dirs = list(data_dirs)
    for data_dir in dirs:
        zxids = []
        copies = kept / Path(data_dir).name if kept is not None else None
        for path in log_files(data_dir, copies):
            for txn in read_log(path):
                zxids.append(txn.zxid)
                holders[txn.zxid].append(txn)
        entries += len(zxids)
        if zxids:
            spans.append((min(zxids), max(zxids)))
    txns, minority, conflicts = [], [], 0
    for zxid in sorted(holders):
        held = holders[zxid]
        covering = sum(1 for first, last in spans if first <= zxid <= last)
        meanings = Counter(_meaning(t) for t in held)
        if len(meanings) > 1:
            conflicts += 1
        if len(held) * 2 > covering:
            meaning = meanings.most_common(1)[0][0]
            txns.append(next(t for t in held if _meaning(t) == meaning))
        else:
            minority.append(held[0])
    return History(txns, len(dirs), entries, minority, conflicts)


def _meaning(txn: Txn) -> tuple[object, ...]:
    """What a transaction did: nothing when it failed, whatever its ops were logged as."""
    if txn.failed:
        return (txn.session, txn.cxid, "failed")
    return (txn.session, txn.cxid, txn.type, txn.ops, txn.closed)


# The judge ----------------------------------------------------------------------------------

JOB_NODE_RE = re.compile(r"^/jobs/(jid[0-9]{10})/([^/]+)")
JOB_INDEX_RE = re.compile(r"^/jobs/states/[^/]+/[0-9]{2}-(jid[0-9]{10})$")
JOB_RE = re.compile(r"^/jobs/(jid[0-9]{10})$")
REGISTRATIONS = ("/mrt-console/consumers/", "/mrt-console/claimers/")


def is_item_lock(path: str) -> bool:
    """The locks of ``queues.zk.locks.is_item_lock``, matched on the server's paths."""
    if path.startswith(("/locks/storage/", "/locks/inventory/")):
        return path.count("/") == 3
    if path.startswith("/mrt-console/locks/recording/"):
        return path.count("/") == 4
    return bool(
        re.fullmatch(r"/jobs/jid[0-9]{10}/lock|/batches/bid[0-9]{10}/lock", path)
        or re.fullmatch(r"/access/[^/]+/qid[0-9]{10}/lock", path)
    )


@dataclass(frozen=True)
class Finding:
    kind: str  # NON_OWNER_DELETE, OVER_LIVE_LOCK or UNFENCED_WRITE
    zxid: int
    session: int
    path: str
    detail: str

    def __str__(self) -> str:
        return (
            f"{self.kind}: {self.path} at zxid 0x{self.zxid:x} by session "
            f"0x{self.session:x}: {self.detail}"
        )


NON_OWNER_DELETE = "lock deleted by a session that did not create it"
ABSENT_DELETE = "lock deleted that the committed history had already removed"
OVER_LIVE_LOCK = "lock created over another live session's lock"
UNFENCED_WRITE = "job written by a consumer not holding its lock"


@dataclass
class Judgement:
    history: History
    sessions: int = 0
    consumers: int = 0
    lock_creates: int = 0
    lock_deletes: int = 0  # explicit deletes by the lock's own session
    lock_closes: int = 0  # deleted by the server as their session closed or expired
    unknown_deletes: int = 0  # deletes of locks whose create the logs do not hold
    fenced_writes: int = 0  # consumer txns writing a job they held
    creations: int = 0
    removals: int = 0
    other_job_writes: int = 0  # by sessions that are no consumer's
    failed: int = 0  # errors logged in place of changes
    findings: list[Finding] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # session -> its registration's name

    def of(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def patterns(self) -> list[tuple[str, int]]:
        """The findings grouped by what they say, sessions and lock holders left out: the
        few code paths behind many findings, most frequent first."""
        shapes = Counter(
            f"{f.kind}: " + re.sub(r"session 0x[0-9a-f]+", "another session", f.detail)
            for f in self.findings
        )
        return shapes.most_common()

    def figures(self) -> str:
        h = self.history
        left_out = f", {len(h.minority)} logged by too few servers left out" if h.minority else ""
        if h.conflicts:
            left_out += f", {h.conflicts} logged differently by the servers (the majority's taken)"
        return (
            f"txn log: {h.entries} entries from {h.servers} server(s), {len(h.txns)} txns "
            f"({self.failed} errors){left_out}; {self.sessions} sessions, {self.consumers} "
            f"consumers; lock creates {self.lock_creates}, deletes {self.lock_deletes} by "
            f"their owner and {self.lock_closes} with their session"
            + (f", {self.unknown_deletes} created before the logs" if self.unknown_deletes else "")
            + "; non-owner deletes "
            f"{len(self.of(NON_OWNER_DELETE))}, deletes of absent locks "
            f"{len(self.of(ABSENT_DELETE))}, locks over live locks "
            f"{len(self.of(OVER_LIVE_LOCK))}, unfenced job writes "
            f"{len(self.of(UNFENCED_WRITE))} (fenced {self.fenced_writes}; job creations "
            f"{self.creations}, removals {self.removals}, by other sessions "
            f"{self.other_job_writes})"
        )


def _relative(path: str, chroot: str) -> str | None:
    if not chroot:
        return path
    if path == chroot:
        return "/"
    return path[len(chroot) :] if path.startswith(chroot + "/") else None


def judge_history(
    history: History, *, chroot: str = "", consumers: Iterable[int] = ()
) -> Judgement:
    """Replay ``history`` and judge it (see the module's docstring)."""
    chroot = chroot.rstrip("/")
    applied = [t for t in history.txns if not t.failed]
    judged = Judgement(history, failed=len(history.txns) - len(applied))

    def local(path: str) -> str | None:
        return _relative(path, chroot)

    consumer_sessions = set(consumers)
    sessions: set[int] = set()
    for txn in applied:
        sessions.add(txn.session)
        for op in txn.ops:
            path = local(op.path)
            if (
                op.type in CREATES
                and path is not None
                and (path.startswith(REGISTRATIONS) or is_item_lock(path))
            ):
                consumer_sessions.add(txn.session)
                if path.startswith(REGISTRATIONS[0]):
                    judged.names[txn.session] = path.rsplit("/", 1)[1]
    judged.sessions = len(sessions)
    judged.consumers = len(consumer_sessions & sessions)

    # The logs begin with the server's very first transaction (zxid 1 of a standalone server,
    # of epoch 1 of an ensemble): every node's create is in them.
    complete = bool(history.txns) and history.txns[0].zxid in (1, 1 << 32 | 1)
    creators: dict[str, int] = {}  # JID -> the session whose multi created it
    ever_locked: set[str] = set()  # JIDs whose lock was taken at least once
    ephemerals: dict[str, int] = {}  # path (server's) -> owner session
    owned: dict[int, set[str]] = defaultdict(set)
    for txn in applied:
        if txn.type == CLOSE_SESSION:
            for path in owned.pop(txn.session, set()) | set(txn.closed):
                if ephemerals.get(path) == txn.session:
                    del ephemerals[path]
                    where = local(path)
                    if where is not None and is_item_lock(where):
                        judged.lock_closes += 1
            continue
        before = dict(ephemerals) if txn.type == MULTI else ephemerals
        created_locks: set[str] = set()
        for op in txn.ops:
            path = local(op.path) if op.path else None
            if op.type in CREATES:
                if path is not None and is_item_lock(path):
                    _lock_create(judged, txn, op.path, path, ephemerals)
                    created_locks.add(path)
                if op.ephemeral:
                    ephemerals[op.path] = txn.session
                    owned[txn.session].add(op.path)
            elif op.type in DELETES:
                owner = ephemerals.pop(op.path, None)
                if owner is not None:
                    owned[owner].discard(op.path)
                if path is not None and is_item_lock(path):
                    _lock_delete(judged, txn, path, owner, complete)
        if txn.session in consumer_sessions:
            _judge_job_writes(
                judged, txn, local, before, created_locks, chroot, creators, ever_locked
            )
        else:
            _count_other(judged, txn, local, creators)
        ever_locked.update(p.split("/")[2] for p in created_locks if p.startswith("/jobs/"))
    return judged


def _lock_create(
    judged: Judgement, txn: Txn, server_path: str, path: str, live: dict[str, int]
) -> None:
    """ZooKeeper refuses a create over an existing node, so a lock standing here means the
    replay (or the server) went wrong: its delete or its session's close was never seen."""
    judged.lock_creates += 1
    holder = live.get(server_path)
    if holder is not None:
        judged.findings.append(
            Finding(
                OVER_LIVE_LOCK, txn.zxid, txn.session, path,
                f"session 0x{holder:x}'s lock stood there, neither deleted nor closed",
            )
        )  # fmt: skip


def _lock_delete(judged: Judgement, txn: Txn, path: str, owner: int | None, complete: bool) -> None:
    if owner is None and complete:
        judged.findings.append(
            Finding(
                ABSENT_DELETE, txn.zxid, txn.session, path,
                "the server applied it, its tree disagreeing with its own log",
            )
        )  # fmt: skip
    elif owner is None:
        judged.unknown_deletes += 1
    elif owner == txn.session:
        judged.lock_deletes += 1
    else:
        judged.findings.append(
            Finding(
                NON_OWNER_DELETE, txn.zxid, txn.session, path,
                f"created by session 0x{owner:x}, still open",
            )
        )  # fmt: skip


def _job_of(path: str) -> tuple[str, str] | None:
    """(JID, node name) of a write to a job: one of its nodes, or its index entry ("index")."""
    node = JOB_NODE_RE.match(path)
    if node:
        return node.group(1), node.group(2)
    index = JOB_INDEX_RE.match(path)
    return (index.group(1), "index") if index else None


def _written_jobs(
    txn: Txn, local: Callable[[str], str | None]
) -> tuple[dict[str, list[str]], set[str], set[str]]:
    """The jobs ``txn`` writes (JID -> nodes written), those it creates (their ``status``)
    and those it removes (``/jobs/JID`` itself)."""
    written: dict[str, list[str]] = defaultdict(list)
    created, removed = set(), set()
    for op in txn.ops:
        if op.type not in (*CREATES, *DELETES, SET_DATA):
            continue
        path = local(op.path)
        if path is None:
            continue
        whole = JOB_RE.match(path)
        if whole and op.type in DELETES:
            removed.add(whole.group(1))
            continue
        found = _job_of(path)
        if found is None or found[1] == "lock":
            continue
        jid, name = found
        written[jid].append(f"{NAMES[op.type]} {name}")
        if name == "status" and op.type in CREATES:
            created.add(jid)
    return written, created, removed


def _judge_job_writes(
    judged: Judgement,
    txn: Txn,
    local: Callable[[str], str | None],
    before: dict[str, int],
    created_locks: set[str],
    chroot: str,
    creators: dict[str, int],
    ever_locked: set[str],
) -> None:
    written, created, removed = _written_jobs(txn, local)
    for jid, what in written.items():
        if jid in created:
            judged.creations += 1
            creators[jid] = txn.session
            continue
        if jid in removed:
            judged.removals += 1
            continue
        lock = f"/jobs/{jid}/lock"
        if before.get(chroot + lock) == txn.session or lock in created_locks:
            judged.fenced_writes += 1
            continue
        holder = before.get(chroot + lock)
        held = f"the lock was session 0x{holder:x}'s" if holder is not None else "no lock"
        # What helps find the writer: the job's own creator completing it after the creation
        # multi, while the job could already be claimed, is a pattern of its own.
        when = []
        if creators.get(jid) == txn.session:
            when.append("by the session that created the job")
        if jid not in ever_locked:
            when.append("before any claim of it")
        judged.findings.append(
            Finding(
                UNFENCED_WRITE, txn.zxid, txn.session, f"/jobs/{jid}",
                f"{', '.join(what)} with {held} ({NAMES.get(txn.type, txn.type)})"
                + (f", {' and '.join(when)}" if when else ""),
            )
        )  # fmt: skip


def _count_other(
    judged: Judgement, txn: Txn, local: Callable[[str], str | None], creators: dict[str, int]
) -> None:
    written, created, removed = _written_jobs(txn, local)
    judged.creations += len(set(written) & created)
    creators.update((jid, txn.session) for jid in set(written) & created)
    judged.removals += len(removed)
    judged.other_job_writes += len(set(written) - created - removed)


def judge_txnlog(
    data_dirs: Iterable[Path],
    *,
    kept: Path | None = None,
    chroot: str = "",
    consumers: Iterable[int] = (),
) -> Judgement:
    """Read every server's transaction log under ``data_dirs`` (and the copies under ``kept``)
    and judge the merged history. ``chroot``: the connection string's chroot, whose nodes are
    judged (none: the whole tree). ``consumers``: sessions to judge as consumers besides those
    the log shows."""
    return judge_history(merge(data_dirs, kept), chroot=chroot, consumers=consumers)
