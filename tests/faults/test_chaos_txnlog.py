"""The chaos run's transaction-log judge against a real ZooKeeper: two kazoo sessions write,
the server logs, and the judge replays the server's own ``version-2/log.*`` files. An honest
sequence gives no finding; a lock deleted by a session that did not create it and a job written
by a consumer not holding its lock give exactly those findings. The decoder reads what
ZooKeeper's own TxnLogToolkit reads."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from queues.chaos import txnlog
from queues.services.zkserver import ZOOKEEPER_JAR, LocalZooKeeper, free_port

from .test_chaos_small import CLEAN_TXNLOG

# One worker runs this module's tests (tests/workers.py's TOGETHER): its module fixture is made
# once, not once on each worker that is given one of them.
pytestmark = pytest.mark.zookeeper

JOB = "/jobs/jid0000000007"
OTHER = "/jobs/jid0000000008"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    """A server of this module's own: the judge reads every transaction it ever logged."""
    zookeeper = LocalZooKeeper(tmp_path_factory.mktemp("txnlog") / "zk", free_port())
    zookeeper.start()
    yield zookeeper
    zookeeper.stop()


@pytest.fixture
def chroot(server: LocalZooKeeper) -> str:
    """Each test writes under a chroot of its own and the judge looks at that chroot only."""
    path = f"/txnlog-{uuid.uuid4().hex[:10]}"
    root = KazooClient(server.hosts)
    root.start()
    root.ensure_path(path)
    root.stop()
    root.close()
    return path


def session(server: LocalZooKeeper, chroot: str, consumer: str | None = None) -> KazooClient:
    """A kazoo client in ``chroot``; registered as a consumer process when ``consumer``."""
    zk = KazooClient(f"{server.hosts}{chroot}")
    zk.start()
    if consumer:
        zk.create(f"/mrt-console/consumers/{consumer}", b"{}", ephemeral=True, makepath=True)
    return zk


def close(*clients: KazooClient) -> None:
    for zk in clients:
        zk.stop()
        zk.close()


def create_job(zk: KazooClient, path: str) -> None:
    """As ``queues.zk.jobs.job_create``: the sequential-style job node, then one multi."""
    zk.ensure_path("/jobs/states/pending")
    zk.create(path)
    txn = zk.transaction()
    txn.create(f"{path}/bid", b"bid0000000001")
    txn.create(f"{path}/status", b'{"status": "Pending"}')
    txn.create(f"/jobs/states/pending/05-{path.rsplit('/', 1)[1]}")
    assert not [r for r in txn.commit() if isinstance(r, Exception)]


def judged(server: LocalZooKeeper, chroot: str) -> txnlog.Judgement:
    return txnlog.judge_txnlog([server.directory], chroot=chroot)


def test_an_honest_sequence_gives_no_finding(server: LocalZooKeeper, chroot: str) -> None:
    batcher = session(server, chroot, "host-1")
    worker = session(server, chroot, "host-2")
    other = session(server, chroot, "host-3")
    create_job(batcher, JOB)
    # A claim: the lock and the move in one multi; a write fenced by a check; the release.
    jid = JOB.rsplit("/", 1)[1]
    worker.ensure_path("/jobs/states/estimating")
    txn = worker.transaction()
    txn.create(f"{JOB}/lock", b"", ephemeral=True)
    txn.set_data(f"{JOB}/status", b'{"status": "Estimating"}')
    txn.delete(f"/jobs/states/pending/05-{jid}")
    txn.create(f"/jobs/states/estimating/05-{jid}")
    txn.commit()
    txn = worker.transaction()
    txn.check(f"{JOB}/lock", -1)
    txn.create(f"{JOB}/store", b"{}")
    txn.commit()
    # Another consumer finds the job locked: its create is an error in the log, no change.
    with pytest.raises(NodeExistsError):
        other.create(f"{JOB}/lock", b"", ephemeral=True)
    worker.delete(f"{JOB}/lock")
    # The other takes it and its session ends holding it: the server deletes the lock.
    other.create(f"{JOB}/lock", b"", ephemeral=True)
    other.set(f"{JOB}/bid", b"bid0000000001")
    close(other)
    # A session that is no consumer's (an operator's shell) writes a job: not judged.
    operator = session(server, chroot)
    operator.set(f"{JOB}/status", b'{"status": "Held"}')
    close(batcher, worker, operator)

    judgement = judged(server, chroot)
    assert judgement.findings == []
    assert judgement.consumers == 3
    assert judgement.lock_creates == 2
    assert judgement.lock_deletes == 1 and judgement.lock_closes == 1
    assert judgement.fenced_writes == 3
    assert judgement.creations == 1
    assert judgement.other_job_writes == 1
    figures = judgement.figures()
    assert CLEAN_TXNLOG in figures


def test_a_non_owner_delete_and_an_unfenced_write_are_exactly_the_findings(
    server: LocalZooKeeper, chroot: str
) -> None:
    owner = session(server, chroot, "host-1")
    intruder = session(server, chroot, "host-2")
    create_job(owner, JOB)
    create_job(owner, OTHER)
    owner.create(f"{JOB}/lock", b"", ephemeral=True)
    # Fenced: the owner's write under its lock.
    owner.set(f"{JOB}/status", b'{"status": "Estimating"}')
    # The intruder writes a job whose lock is someone else's, and one nobody locked.
    intruder.create(f"{JOB}/inventory", b"{}")
    intruder.set(f"{OTHER}/status", b'{"status": "Estimating"}')
    # Then deletes the owner's lock and takes the job (its own lock: fenced from there on).
    intruder.delete(f"{JOB}/lock")
    intruder.create(f"{JOB}/lock", b"", ephemeral=True)
    intruder.set(f"{JOB}/status", b'{"status": "Provisioning"}')
    close(owner, intruder)

    judgement = judged(server, chroot)
    owner_id, intruder_id = (hex(s) for s in registered_sessions(server, chroot))
    found = sorted((f.kind, f.path, hex(f.session)) for f in judgement.findings)
    assert found == sorted(
        [
            (txnlog.NON_OWNER_DELETE, f"{JOB}/lock", intruder_id),
            (txnlog.UNFENCED_WRITE, JOB, intruder_id),
            (txnlog.UNFENCED_WRITE, OTHER, intruder_id),
        ]
    )
    assert judgement.names == {int(owner_id, 16): "host-1", int(intruder_id, 16): "host-2"}
    [deleted] = judgement.of(txnlog.NON_OWNER_DELETE)
    assert f"created by session {owner_id}" in deleted.detail
    unfenced = {f.path: f.detail for f in judgement.of(txnlog.UNFENCED_WRITE)}
    assert unfenced[JOB] == f"create inventory with the lock was session {owner_id}'s (create)"
    assert unfenced[OTHER] == "setData status with no lock (setData), before any claim of it"
    assert judgement.fenced_writes == 2
    assert dict(judgement.patterns()) == {
        f"{txnlog.NON_OWNER_DELETE}: created by another session, still open": 1,
        f"{txnlog.UNFENCED_WRITE}: create inventory with the lock was another session's "
        "(create)": 1,
        f"{txnlog.UNFENCED_WRITE}: setData status with no lock (setData), before any claim "
        "of it": 1,
    }
    assert (
        "non-owner deletes 1, deletes of absent locks 0, locks over live locks 0, "
        "unfenced job writes 2"
    ) in judgement.figures()


def registered_sessions(server: LocalZooKeeper, chroot: str) -> list[int]:
    """The sessions that registered under ``chroot``, in the order they did."""
    registered = []
    for txn in txnlog.merge([server.directory]).txns:
        for op in txn.ops:
            if op.type == txnlog.CREATE and op.path.startswith(f"{chroot}/mrt-console/consumers/"):
                registered.append(txn.session)
    return registered


def test_the_decoder_reads_what_zookeepers_own_toolkit_reads(
    server: LocalZooKeeper, chroot: str
) -> None:
    zk = session(server, chroot, "host-9")
    create_job(zk, JOB)
    zk.create(f"{JOB}/lock", b"", ephemeral=True)
    close(zk)
    ours, theirs = [], []
    for log in txnlog.log_files(server.directory):
        ours += [(t.zxid, t.session, txnlog.NAMES[t.type]) for t in txnlog.read_log(log)]
        listing = subprocess.run(
            ["java", "-cp", str(ZOOKEEPER_JAR),
             "org.apache.zookeeper.server.persistence.TxnLogToolkit", str(log)],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        theirs += [
            (int(z, 16), int(s, 16), kind)
            for s, z, kind in re.findall(
                r"session 0x([0-9a-f]+) cxid 0x[0-9a-f]+ zxid 0x([0-9a-f]+) (\w+)", listing
            )
        ]
    assert ours == theirs
    assert len(ours) > 10
    kinds = {kind for _z, _s, kind in ours}
    assert {"createSession", "create", "multi", "closeSession"} <= kinds


def test_a_txn_logged_by_one_server_of_three_is_left_out(tmp_path: Path) -> None:
    """The majority rule of the merge, on a log written by a real server: copies of it stand
    for three servers, and one entry (a killed leader's proposal that nobody acknowledged)
    is in one copy only, the others going on past it."""
    zookeeper = LocalZooKeeper(tmp_path / "zk", free_port())
    zookeeper.start()
    try:
        zk = KazooClient(zookeeper.hosts)
        zk.start()
        zk.create("/jobs/jid0000000001/status", b"{}", makepath=True)
        zk.create("/jobs/jid0000000001/lock", b"", ephemeral=True)
        zk.set("/jobs/jid0000000001/status", b"{}")
        close(zk)
    finally:
        zookeeper.stop()
    [log] = txnlog.log_files(zookeeper.directory)
    entries = list(txnlog.read_log(log))
    raw = log.read_bytes()
    alone = next(i for i, t in enumerate(entries) if t.ops and t.ops[0].path.endswith("/lock"))
    start, end = _entry_end(raw, alone), _entry_end(raw, alone + 1)
    for number in (1, 2, 3):
        folder = tmp_path / f"s{number}" / "version-2"
        folder.mkdir(parents=True)
        (folder / log.name).write_bytes(raw if number == 1 else raw[:start] + raw[end:])
    history = txnlog.merge([tmp_path / f"s{n}" for n in (1, 2, 3)])
    assert [t.zxid for t in history.minority] == [entries[alone].zxid]
    assert history.txns == entries[:alone] + entries[alone + 1 :]
    assert history.entries == 3 * len(entries) - 2
    assert history.conflicts == 0


def _entry_end(raw: bytes, count: int) -> int:
    """The byte offset just after the first ``count`` entries of a log file."""
    at = 16
    for _ in range(count):
        size = int.from_bytes(raw[at + 8 : at + 12], "big")
        at += 12 + size + 1
    return at


def test_logs_a_restarted_server_purged_are_read_from_their_copies(tmp_path: Path) -> None:
    """A member of an ensemble purges its old logs when it starts (autopurge keeps those of its
    three latest snapshots, and it takes one at each election): started again and again, as in
    a storm, it loses the early history, which the copies made before each start keep for the
    judge. A standalone server (ZooKeeperServerMain) runs no purge, so here the files a purge
    would take are removed by hand after the copy, as the purge does at the next start."""
    zookeeper = LocalZooKeeper(tmp_path / "zk", free_port())
    kept = tmp_path / "kept" / zookeeper.directory.name
    for start in range(3):
        zookeeper.start()
        try:
            zk = KazooClient(zookeeper.hosts)
            zk.start()
            zk.create(f"/jobs/jid000000000{start}/status", b"{}", makepath=True)
            close(zk)
        finally:
            zookeeper.stop()
        assert txnlog.keep_logs(zookeeper.directory, kept) == start + 1
    purged = txnlog.log_files(zookeeper.directory)[:2]
    for path in purged:
        path.unlink()

    alone = txnlog.judge_txnlog([zookeeper.directory])
    whole = txnlog.judge_txnlog([zookeeper.directory], kept=kept.parent)
    assert alone.creations + alone.other_job_writes == 1
    assert whole.creations + whole.other_job_writes == 3
    assert {p.name for p in txnlog.log_files(zookeeper.directory, kept)} == {
        p.name for p in kept.iterdir()
    }
    assert whole.findings == []


def test_a_lock_deleted_after_the_history_removed_it_is_the_servers_disagreement() -> None:
    """What a storm of leader kills on ZooKeeper 3.8.0 produced (run of 2026-12-02): a lock
    taken and given up by one session, taken and given up by another, then deleted again by
    the first after an election, the server applying it. The history here is the entries of
    that run, renumbered."""
    first, second = 0x100001C2D6A0000, 0x200001C2ACF0000
    lock = "/jobs/jid0000000072/lock"
    status = "/jobs/jid0000000072/status"

    def txn(zxid: int, session: int, kind: int, *ops: txnlog.Op) -> txnlog.Txn:
        return txnlog.Txn(zxid, session, 0, 0, kind, tuple(ops))

    history = txnlog.History(
        [
            txn(0x100000001, first, txnlog.CREATE_SESSION),
            txn(0x100000002, second, txnlog.CREATE_SESSION),
            txn(0x100000003, first, txnlog.CREATE, txnlog.Op(txnlog.CREATE, lock, True)),
            txn(
                0x100000004, first, txnlog.MULTI, txnlog.Op(txnlog.SET_DATA, status),
                txnlog.Op(txnlog.DELETE, lock),
            ),
            txn(0x100000005, second, txnlog.CREATE, txnlog.Op(txnlog.CREATE, lock, True)),
            txn(
                0x100000006, second, txnlog.MULTI, txnlog.Op(txnlog.SET_DATA, status),
                txnlog.Op(txnlog.DELETE, lock),
            ),
            txn(0x200000001, first, txnlog.DELETE, txnlog.Op(txnlog.DELETE, lock)),
        ],
        servers=3,
        entries=21,
    )  # fmt: skip
    judged = txnlog.judge_history(history)
    assert [(f.kind, f.zxid, f.session, f.path) for f in judged.findings] == [
        (txnlog.ABSENT_DELETE, 0x200000001, first, lock)
    ]
    assert judged.fenced_writes == 2
    # A history whose beginning was purged cannot tell: a delete of a lock whose create it
    # does not hold is only counted.
    history.txns = history.txns[3:]
    judged = txnlog.judge_history(history)
    assert judged.findings == []
    assert judged.unknown_deletes == 2
