"""A session lost in each phase of the batched loop (MRT_CLAIM_BATCH > 1): the loop gives the
jobs up, goes on in the new session and moves every job; nothing hangs.

The consumer's connection goes through a loopback proxy that turns into a black hole at the
phase under test, for longer than the session timeout: the server expires the session, and the
client learns it (LOST) when the black hole ends. Issue 23: a loop giving locks back while the
connection was down waited for the deletes' answers under the session gate's lock, which
kazoo's connection thread needs before it fails those requests; both waited for ever (23 hung
processes, deaf to SIGTERM).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

import pytest
from daemons.conftest import make_job, wait_for
from daemons.test_batched import CONFIG
from kazoo.client import KazooClient

from queues.core.states import JobState
from queues.daemons.base import JobDaemon, Next, SessionGate, Stay, Step
from queues.zk import paths as zpaths
from queues.zk.consumers import claimers_folder
from queues.zk.records import Job
from tests.zkproxy import MULTI, MULTI_READ, ZkProxy, request

pytestmark = pytest.mark.slow

SESSION_TIMEOUT = 2.0  # the server's minimum (minSessionTimeout=2000)


class Phased(JobDaemon):
    """Estimating -> Provisioning; ``on_first`` runs in the step of the first job it gets."""

    name: ClassVar[str] = "test-phased"
    step: ClassVar[str] = "test-phased"
    state: ClassVar[str] = JobState.ESTIMATING

    on_first: Callable[[], Step] | None = None

    def work(self, item: Job) -> Step:
        hook, self.on_first = self.on_first, None
        if hook is not None:
            return hook()
        return Next(JobState.PROVISIONING)


@pytest.fixture
def proxied(proxied_client) -> KazooClient:
    return proxied_client(timeout=SESSION_TIMEOUT)


def session_gone(zk: KazooClient, session: int) -> bool:
    """Whether the server has expired ``session`` (its claimer registration is gone)."""
    folder = claimers_folder(JobState.ESTIMATING)
    for name in zk.get_children(folder) if zk.exists(folder) else []:
        stat = zk.exists(f"{folder}/{name}")
        if stat is not None and stat.ephemeralOwner == session:
            return False
    return True


def all_moved(zk: KazooClient, jobs: list[Job]) -> bool:
    folder = zpaths.job_state_folder(JobState.PROVISIONING)
    names = set(zk.get_children(folder)) if zk.exists(folder) else set()
    return all(zpaths.index_name(j.priority, j.jid) in names for j in jobs)


PHASES = ["claiming", "reading", "working", "moving", "giving back"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_session_lost_in_each_phase_of_the_batched_loop_hangs_nothing_and_loses_no_job(
    zk: KazooClient, proxied: KazooClient, proxy: ZkProxy, phase: str
) -> None:
    jobs = [make_job(zk, CONFIG, state=JobState.ESTIMATING) for _ in range(12)]
    gate = SessionGate()
    proxied.add_listener(gate.on_state)
    worker = Phased(zk=proxied, gate=gate, poll=0.2, batch=8)

    def cut_off_then(result: Step) -> Callable[[], Step]:
        def hook() -> Step:
            proxy.blackhole()
            wait_for(lambda: not gate.connected, timeout=30, every=0.05)
            return result

        return hook

    if phase == "claiming":
        proxy.blackhole_at(request(MULTI, b"/lock", without=b"/status"))
    elif phase == "reading":
        proxy.blackhole_at(lambda opcode, _frame: opcode == MULTI_READ)
    elif phase == "working":
        worker.on_first = cut_off_then(Next(JobState.PROVISIONING))
    elif phase == "moving":
        proxy.blackhole_at(request(MULTI, b"/status"))
    else:  # a job that waits is given back, while the connection is down
        worker.on_first = cut_off_then(Stay("waiting for the test"))
    session = proxied.client_id[0]
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(proxy.fired.is_set, timeout=30)
        wait_for(lambda: session_gone(zk, session), timeout=60)
        proxy.heal()
        wait_for(lambda: all_moved(zk, jobs), timeout=90)
        assert proxied.client_id[0] != session
        assert gate.generation >= 1
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert [j.jid for j in jobs if zk.exists(zpaths.job_node(j.jid, "lock"))] == []
