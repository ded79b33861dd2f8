"""ZooKeeper outages under load leave no orphan lock and no stuck job, in both job loops.

Two consumers (each its own client and session, each running two steps) work through the jobs
while the server crashes and comes back within the session timeout (a single server killed and
started again), or while the leader of a three-member ensemble is killed. Requests in flight at
the crash may be applied without an answer: issue 23 saw 20 orphan locks in 13 restarts, and
3-16 jobs stuck after one leader kill, for as long as anyone waited.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import make_job, wait_for
from daemons.test_batched import CONFIG, Step1, Step2
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from queues.core.states import JobState
from queues.daemons.base import SessionGate
from queues.daemons.pipeline import LockKeeper
from queues.services.zkserver import LocalEnsemble, LocalZooKeeper, free_port
from queues.zk import client as zkmod
from queues.zk import paths as zpaths
from queues.zk.locks import ledger_of
from queues.zk.records import Job
from tests.zktree import new_chroot

pytestmark = pytest.mark.slow

JOBS = 60
FAULTS = 3
ANSWER_WAIT = 15.0  # s: the longest the test's own read waits for an answer
WATCHER_SESSION = 30.0  # s: the test's own session, the longest the servers allow
# The one-job loop, and the batched loop with locks kept between a process's steps.
LOOPS = [{"batch": 1, "keep": False}, {"batch": 8, "keep": True}]


class Consumer:
    """One consumer process's worth: a client, its gate, and two steps' loops."""

    def __init__(self, hosts: str, *, batch: int, keep: bool) -> None:
        self.zk = zkmod.connect(hosts, timeout=10)
        self.gate = SessionGate()
        self.zk.add_listener(self.gate.on_state)
        keeper = LockKeeper() if keep else None
        self.daemons = [
            cls(zk=self.zk, gate=self.gate, poll=0.2, batch=batch, keeper=keeper)
            for cls in (Step1, Step2)
        ]
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=d.run, args=(self.stop,), daemon=True) for d in self.daemons
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        alive = [t.name for t in self.threads if t.is_alive()]
        self.zk.stop()
        self.zk.close()
        assert alive == []


def chrooted(hosts: str) -> str:
    return f"{hosts}{new_chroot(hosts)}"


def moved(zk: KazooClient, jobs: list[Job]) -> int:
    """Jobs in Downloading; 0 when the ensemble does not answer within ANSWER_WAIT (a read
    that waits for ever would keep ``wait_for`` from failing with what the servers say).

    The test's own session may expire across a crash on a busy machine (CI saw it once: the
    server came back later than the session's timeout allowed). That says nothing of the
    consumers, whose expiry is part of what is tested; kazoo opens a new session for the
    watcher, and the next poll reads through it.
    """
    folder = zpaths.job_state_folder(JobState.DOWNLOADING)
    try:
        names = set(zk.get_children_async(folder).get(timeout=ANSWER_WAIT))
    except (NoNodeError, KazooTimeoutError, SessionExpiredError, ConnectionLoss):
        return 0
    return sum(zpaths.index_name(j.priority, j.jid) in names for j in jobs)


def serving(zk: KazooClient) -> str:
    """Whether the server ``zk`` is connected to answers a read within 5 s."""
    try:
        zk.exists_async("/").get(timeout=5)
    except Exception as exc:
        return f"a read from the test's own client got no answer in 5 s ({exc!r})"
    return "the test's own client reads"


def loop_state(daemon: Any, jid: str) -> str:
    """What a batched loop of a process with a keeper knows of ``jid``."""
    keeper = getattr(daemon, "keeper", None)
    loop = keeper.loop_for(daemon.state) if keeper is not None else None
    if loop is None:
        return f"{daemon.name}: no batched loop"
    where = [
        name
        for name, found in (
            ("kept", jid in loop.kept),
            ("holding", jid in loop.holding),
            ("handed", any(job.jid == jid for job, _h, _c in loop._handed)),
            ("pending", any(p.jid == jid for b in loop.pending for p in b.picks)),
            ("inflight", any(w.job.jid == jid for f in loop.inflight for w in f.works)),
            (
                "retries",
                any(p.jid == jid for r, _h in loop.retries for ps, _a in r.answers for p in ps),
            ),
            ("transit", jid in keeper.in_transit()),
        )
        if found
    ]
    return f"{daemon.name}: {'/'.join(where) or 'nowhere'}"


def stranded(zk: KazooClient, jobs: list[Job], consumers: list[Consumer]) -> str:
    """Where the jobs not moved stand: their state, their lock's owner, and what each
    consumer's ledger and loops say of them (for the message of a run that gets stuck)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = []
    folder = zpaths.job_state_folder(JobState.DOWNLOADING)
    arrived = set(zk.get_children(folder)) if zk.exists(folder) else set()
    for job in jobs:
        if zpaths.index_name(job.priority, job.jid) in arrived:
            continue
        path = zpaths.job_node(job.jid, "lock")
        stat = zk.exists(path)
        owner = hex(stat.ephemeralOwner) if stat else "none"
        seen = []
        for n, consumer in enumerate(consumers):
            ledger = ledger_of(consumer.zk)
            held = ledger._held.get(path)
            seen.append(
                f"consumer {n} (session {hex((consumer.zk.client_id or (0,))[0])}): "
                f"held by {names.get(held, held)}, doubt {path in ledger.doubtful()}, "
                + ", ".join(loop_state(d, job.jid) for d in consumer.daemons)
            )
        lines.append(f"{job.jid}: lock {owner}; " + "; ".join(seen))
    return "\n".join(lines)


def run_through_faults(
    hosts: str,
    loop: dict[str, Any],
    fault: Callable[[], None],
    servers: Callable[[], str] = lambda: "",
) -> None:
    """Jobs worked on by two consumers while ``fault`` strikes FAULTS times, each once more
    jobs have moved; then every job must arrive, with no lock left anywhere. ``servers`` says
    what the servers answer, for the message of a run that gets stuck."""
    watcher = zkmod.connect(hosts, timeout=WATCHER_SESSION)
    consumers: list[Consumer] = []
    try:
        jobs = [make_job(watcher, CONFIG, state=JobState.ESTIMATING) for _ in range(JOBS)]
        consumers = [Consumer(hosts, **loop) for _ in range(2)]
        for consumer in consumers:
            consumer.start()
        for n in range(1, FAULTS + 2):
            target = JOBS if n > FAULTS else n * JOBS // (FAULTS + 2)
            try:
                wait_for(lambda target=target: moved(watcher, jobs) >= target, timeout=120)
            except AssertionError:
                raise AssertionError(
                    f"{moved(watcher, jobs)} of {target} jobs moved after 120 s; "
                    f"{serving(watcher)}; {servers()}; "
                    f"{stranded(watcher, jobs, consumers)}"
                ) from None
            if n <= FAULTS:
                fault()
        locked = [j.jid for j in jobs if watcher.exists(zpaths.job_node(j.jid, "lock"))]
        assert locked == []

        # A move's answer reaches its thread after the server applied it (and after the test
        # saw the job arrive): the thread then notes its lock given up. Wait for that.
        def ledgers_empty() -> bool:
            return all(ledger_of(c.zk).held() == frozenset() for c in consumers)

        try:
            wait_for(ledgers_empty, timeout=60)
        except AssertionError:
            raise AssertionError(
                "locks still noted as held 60 s after every job arrived: "
                + "; ".join(
                    f"consumer {n}: {sorted(ledger_of(c.zk).held())}"
                    for n, c in enumerate(consumers)
                )
            ) from None
    finally:
        for consumer in consumers:
            consumer.close()
        watcher.stop()
        watcher.close()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    server = LocalZooKeeper(tmp_path / "zookeeper", free_port())
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("loop", LOOPS, ids=["one-job", "batched"])
def test_a_server_crashing_under_load_leaves_no_orphan_lock_and_no_stuck_job(
    own_server: LocalZooKeeper, loop: dict[str, Any]
) -> None:
    def crash() -> None:
        own_server.kill()
        own_server.start()

    run_through_faults(chrooted(own_server.hosts), loop, crash)


# The batched case stalled twice in 36 runs on two cores at load averages above 20, with every
# client waiting for answers from the ensemble; not reproduced in 14 runs at load 10-17 after the
# fenced deletes. Nothing here runs a failure again: the test's own reads are bounded, so a stuck
# ensemble fails the run with what the servers and the jobs' locks say.
@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[LocalEnsemble]:
    """An ensemble of this test's own, new for every run of it: a member that did not come back
    after a kill (seen once in a full run on two busy cores) takes only that case down, not the
    next case with it, as a module's shared ensemble did."""
    servers = LocalEnsemble(tmp_path / "ensemble")
    servers.start()
    yield servers
    servers.stop()


@pytest.mark.parametrize("loop", LOOPS, ids=["one-job", "batched"])
def test_a_leader_killed_during_claims_leaves_no_orphan_lock_and_no_stuck_job(
    ensemble: LocalEnsemble,
    loop: dict[str, Any],
) -> None:
    ensemble.start()
    ensemble.wait_for_leader()

    def kill_leader() -> None:
        leader = ensemble.wait_for_leader()
        ensemble.kill(leader)
        ensemble.wait_for_leader(other_than=leader)
        ensemble.start_one(leader)

    def modes() -> str:
        return ", ".join(f"zk{n}: {m.mode() or 'not serving'}" for n, m in ensemble.members.items())

    run_through_faults(chrooted(ensemble.hosts), loop, kill_leader, modes)
