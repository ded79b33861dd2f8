"""The shared loop: holds, session states, failures, conflicts, many copies, the log line."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import ClassVar

import pytest

from queues.daemons.base import JobDaemon, Next, SessionGate, Step
from queues.daemons.registry import DAEMONS
from queues.services import moves
from queues.zk import paths as zpaths
from queues.zk.errors import ItemLocked, Unavailable
from queues.zk.jobs import job_load
from queues.zk.kazoo_private import session_id
from queues.zk.locks import lock_break, lock_create, queue_hold_set
from queues.zk.records import Job

from .conftest import expire_session, make_job, wait_for


class Recorder(JobDaemon):
    """A test step on Estimating jobs: records what it saw, then does what ``action`` says."""

    name: ClassVar[str] = "recorder"
    step: ClassVar[str] = "recorder"
    state: ClassVar[str] = "Estimating"

    def __init__(self, *args, action=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []
        self.action = action

    def work(self, item: Job) -> Step:
        self.seen.append(item.jid)
        if self.action is not None:
            self.action(self, item)
        return Next("Provisioning")


def _job(zk, **kw) -> Job:
    return make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Estimating", **kw)


@pytest.mark.quick
def test_one_item_one_move_and_one_log_line(zk, caplog) -> None:
    job = _job(zk)
    caplog.set_level(logging.INFO, logger="queues.daemons")
    worker = Recorder(zk=zk)
    assert worker.run_once()
    assert job_load(zk, job.jid).state == "Provisioning"
    assert job_load(zk, job.jid).lock is None
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(job.jid)]
    jid, step, outcome, duration = line.split()[:4]
    assert (jid, step, outcome) == (job.jid, "recorder", "ok")
    assert duration.endswith("s")
    assert not worker.run_once()


def test_held_ingest_queue_stops_claiming(zk) -> None:
    job = _job(zk)
    queue_hold_set(zk, "ingest")
    for name in ("pending", "estimating", "downloading", "batch-reporting"):
        assert not DAEMONS[name](zk=zk).run_once()
    assert not Recorder(zk=zk).run_once()
    assert job_load(zk, job.jid).state == "Estimating"


def test_exception_fails_the_item_and_the_daemon_goes_on(zk) -> None:
    def boom(_daemon, _item):
        raise RuntimeError("disk on fire")

    first, second = _job(zk), _job(zk)
    worker = Recorder(zk=zk, action=boom, poll=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Failed" for j in (first, second)))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    failed = job_load(zk, first.jid)
    assert failed.status.message == "recorder: disk on fire"
    assert failed.lock is None


def test_operator_move_during_the_step_is_refused_and_the_holder_moves_the_job(zk) -> None:
    """Only the lock's owner writes a job: an operator's move of a job a consumer holds is
    refused (ItemLocked, nothing written) and the consumer's own move goes through."""
    refused: list[Exception] = []

    def operator_fails_it(_daemon, item):
        try:
            moves.job_fail(jid=item.jid, message="stopped by an operator")
        except ItemLocked as exc:
            refused.append(exc)

    job = _job(zk)
    worker = Recorder(zk=zk, action=operator_fails_it)
    worker.run_once()
    assert len(refused) == 1
    assert worker.last is not None and worker.last.outcome == "ok"
    moved = job_load(zk, job.jid)
    assert moved.state == "Provisioning"
    assert moved.lock is None


def test_zookeeper_trouble_in_a_step_fails_nothing(zk) -> None:
    def unreachable(_daemon, _item):
        raise Unavailable("cannot reach ZooKeeper")

    job = _job(zk)
    worker = Recorder(zk=zk, action=unreachable)
    worker.run_once()
    assert worker.last is not None and worker.last.outcome == "dropped"
    assert job_load(zk, job.jid).state == "Estimating"
    assert job_load(zk, job.jid).lock is None


def test_suspended_session_stops_claiming_until_connected(zk) -> None:
    job = _job(zk)
    gate = SessionGate()
    worker = Recorder(zk=zk, gate=gate)
    gate.on_state("SUSPENDED")
    assert not worker.run_once()
    assert job_load(zk, job.jid).state == "Estimating"
    gate.on_state("CONNECTED")
    assert worker.run_once()
    assert job_load(zk, job.jid).state == "Provisioning"


def test_lost_session_retakes_the_lock_before_moving(zk) -> None:
    def session_lost(daemon, item):
        # What ZooKeeper does when a session expires: the ephemeral lock disappears.
        lock_break(zk, zpaths.job_node(item.jid, "lock"), zk.client_id[0])
        daemon.gate.on_state("LOST")
        daemon.gate.on_state("CONNECTED")

    job = _job(zk)
    worker = Recorder(zk=zk, action=session_lost)
    worker.run_once()
    assert worker.last is not None and worker.last.outcome == "ok"
    assert job_load(zk, job.jid).state == "Provisioning"
    assert job_load(zk, job.jid).lock is None


def test_lost_session_leaves_the_item_to_whoever_took_it(zk, other_zk) -> None:
    def taken_meanwhile(daemon, item):
        lock = zpaths.job_node(item.jid, "lock")
        lock_break(zk, lock, zk.client_id[0])
        daemon.gate.on_state("LOST")
        assert lock_create(other_zk, lock)
        daemon.gate.on_state("CONNECTED")

    job = _job(zk)
    worker = Recorder(zk=zk, action=taken_meanwhile)
    worker.run_once()
    assert worker.last is not None and worker.last.outcome == "dropped"
    current = job_load(zk, job.jid)
    assert current.state == "Estimating"
    assert current.lock is not None  # still the other consumer's


class LosingBeforeTheMove(Recorder):
    """A step whose session ends (on the server) after the loop's look at the session and
    before its move is sent: ``lose`` runs first thing in ``move``."""

    lose: Callable[[], None] | None = None

    def move(self, item: Job, step: Next) -> bool:
        if self.lose is not None:
            self.lose()
        return super().move(item, step)


def test_a_move_whose_session_went_after_the_loops_look_leaves_the_new_holders_lock(
    zk, zk_hosts, other_zk, own_zk
) -> None:
    """The one-job loop's move goes through the claim's gate, as the batched loop's does: sent
    in the client's new session, its delete of the lock would delete the next consumer's."""
    client, gate = own_zk
    job = _job(zk)
    lock = zpaths.job_node(job.jid, "lock")

    def lose() -> None:
        old = session_id(client)
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and session_id(client) not in (None, old), timeout=30)
        assert lock_create(other_zk, lock)  # the next consumer holds the job now

    worker = LosingBeforeTheMove(zk=client, gate=gate)
    worker.lose = lose
    worker.run_once()
    assert worker.last is not None and worker.last.outcome == "dropped"
    assert job_load(zk, job.jid).state == "Estimating"
    stat = zk.exists(lock)
    assert stat is not None and stat.ephemeralOwner == other_zk.client_id[0]


def test_many_copies_share_the_work_without_doubling(zk, other_zk) -> None:
    seen: Counter[str] = Counter()
    guard = threading.Lock()

    def slow(_daemon, item):
        with guard:
            seen[item.jid] += 1
        time.sleep(0.05)

    jobs = [_job(zk) for _ in range(12)]
    workers = [
        Recorder(zk=client, action=slow, poll=0.05) for client in (zk, zk, other_zk, other_zk)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Provisioning" for j in jobs))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert seen == Counter({j.jid: 1 for j in jobs})
    assert sum(1 for w in workers if w.seen) > 1
