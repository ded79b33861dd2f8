"""Waiting work is watched, not polled (issue 51): ``runconsumer all`` as shipped, over jobs it
may not take, asks ZooKeeper no more than over an empty queue (twice as much, plus a small
constant), for every reason a job waits: a held queue, a held storage node (an operator's hold or
an open breaker's), a depositor's server held by its open breaker, a collection at its cap, a held
collection, a wait for the next try, a depositor server at its download cap, no room on the
working disk.

Each case starts ``runconsumer all`` against a server of its own, counts the requests the server
receives in a window over the empty queue, then loads the waiting jobs and counts windows until
one is as quiet as the target (the loops may look at each job once after it arrives: a first
look is not a rate); on code that polls what it may not take, no window ever is. Where the
reason can go, it goes, and the jobs are taken up at once: the loops were woken. Two quiet
windows in a row are asked for: a polling loop's requests wait for the server's answers, and on
a loaded machine one of its windows may be slow.

The same cases at 100,000 jobs: ``MRT_WAITING_JOBS=100000`` (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bench.loader import load_waiting
from queues.core.states import JobState
from queues.services.zkserver import LocalZooKeeper, four_letter
from queues.zk import client as zkmod
from queues.zk import paths as zpaths
from queues.zk.batches import batch_create
from queues.zk.caps import cap_clear, cap_set, reserve
from queues.zk.locks import collection_hold_set, queue_hold_clear, queue_hold_set
from queues.zk.maintenance import (
    node_hold_clear,
    node_hold_set,
    service_hold_clear,
    service_hold_set,
)
from queues.zk.nodes import read_many

from .conftest import DEMO, wait_for
from .test_end_to_end import Consumers

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

WINDOW = 10.0  # seconds of requests counted, the same for each window
WAITING = int(os.environ.get("MRT_WAITING_JOBS", "300"))
# What a window may hold beyond twice the empty queue's: a watch event or two and the looks of
# the loops they wake.
SLACK = 200
# How long the loops may take over their first look at the jobs that arrived (a loop may claim
# each job once to learn why it waits: a collection's cap, a depositor server's download cap).
SETTLE = max(180.0, WAITING / 100)
# A file no server serves: what a job would fetch if it were taken.
CONFIGURATION = {
    "profile": DEMO,
    "submitter": "tester",
    "payload_url": "http://127.0.0.1:9/a.txt",
    "type": "file",
}


def received(server: LocalZooKeeper) -> int:
    """The requests the server has received since it started (``srvr``)."""
    answer = four_letter(server.port, "srvr") or ""
    found = re.search(r"^Received: (\d+)", answer, re.M)
    assert found, answer
    return int(found.group(1))


def requests_in_window(server: LocalZooKeeper) -> int:
    before = received(server)
    time.sleep(WINDOW)  # a rate is counted over a span of time: nothing to wait for instead
    return received(server) - before


@dataclass
class Case:
    """Why the jobs wait: ``place`` sets the reason and loads the jobs (their IDs); ``release``
    (when the reason can go) ends it, and ``taken`` says whether the jobs were taken up."""

    state: str
    place: Callable[[KazooClient, str], list[str]]
    release: Callable[[KazooClient], object] | None = None
    env: dict[str, str] | None = None  # for runconsumer


class SilentServer:
    """A depositor's server that takes connections and never answers: each download from it
    holds its slot for as long as the consumer waits (``MRT_HTTP_TIMEOUT``)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _address = self.socket.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.socket.close()
        for conn in self.held:
            conn.close()


SILENT = SilentServer()


def _jobs(zk: KazooClient, bid: str, state: str, **kwargs: object) -> list[str]:
    return load_waiting(
        zk, bid=bid, state=state, count=WAITING, configuration=CONFIGURATION, **kwargs
    )  # type: ignore[arg-type]


def _held_queue(zk: KazooClient, bid: str) -> list[str]:
    assert queue_hold_set(zk, "ingest")
    return _jobs(zk, bid, JobState.PENDING)


def _held_node(zk: KazooClient, bid: str) -> list[str]:
    assert node_hold_set(zk, 9501, by="ops", reason="node 9501 down")
    return _jobs(zk, bid, JobState.STORING, store_node=9501)


def _open_breaker(zk: KazooClient, bid: str) -> list[str]:
    assert node_hold_set(zk, 9502, by="breaker", reason="breaker: 5 x 503 from node 9502 in 3 s")
    return _jobs(zk, bid, JobState.RECORDING, store_node=9502)


# The depositor server of CONFIGURATION, as its breaker's hold names it.
DEPOSITOR = "depositor 127.0.0.1:9"


def _held_depositor(zk: KazooClient, bid: str) -> list[str]:
    # Its breaker open (a run of 503s): the jobs whose payload is there wait, and every loop
    # that saw one once passes it over by its ID until the hold goes.
    reason = "breaker: 5 x HTTP 503 from depositor 127.0.0.1:9 in 3 s"
    assert service_hold_set(zk, DEPOSITOR, by="breaker", reason=reason)
    return _jobs(zk, bid, JobState.DOWNLOADING)


def _cap_reached(zk: KazooClient, bid: str) -> list[str]:
    # One job in flight for the collection, its lock held by this test: it stays counted. (Put
    # there while the queue is held: no consumer takes it before the lock is on.)
    cap_set(zk, DEMO, 1, by="ops", reason="one at a time")
    assert queue_hold_set(zk, "ingest")
    (blocker,) = load_waiting(
        zk, bid=bid, state=JobState.ESTIMATING, count=1, configuration=CONFIGURATION
    )
    zk.create(zpaths.job_node(blocker, "lock"), b"", ephemeral=True)
    assert reserve(zk, DEMO, blocker)
    assert queue_hold_clear(zk, "ingest")
    return _jobs(zk, bid, JobState.PENDING)


def _held_collection(zk: KazooClient, bid: str) -> list[str]:
    assert collection_hold_set(zk, DEMO)
    jids = _jobs(zk, bid, JobState.PENDING)
    held = zpaths.job_state_folder(JobState.HELD)
    wait_for(lambda: len(zk.get_children(held)) == WAITING if zk.exists(held) else 0, timeout=300)
    return jids


def _retry_later(zk: KazooClient, bid: str) -> list[str]:
    return _jobs(zk, bid, JobState.DOWNLOADING, retry_next=round(time.time() + 3600, 3))


def _download_cap(zk: KazooClient, bid: str) -> list[str]:
    # Every job's file on one server that never answers: two downloads (its cap) wait on it,
    # the others wait for a slot.
    configuration = {**CONFIGURATION, "payload_url": f"{SILENT.url}/a.txt"}
    return load_waiting(
        zk, bid=bid, state=JobState.DOWNLOADING, count=WAITING, configuration=configuration
    )


def _disk_full(zk: KazooClient, bid: str) -> list[str]:
    # The consumer's high-water mark (a millionth of the disk) is below what the disk holds:
    # no job fits until downloads end or the disk is cleared.
    return _jobs(zk, bid, JobState.PROVISIONING)


CASES = {
    "held queue": Case(JobState.PENDING, _held_queue, lambda zk: queue_hold_clear(zk, "ingest")),
    "held node": Case(JobState.STORING, _held_node, lambda zk: node_hold_clear(zk, 9501)),
    "open breaker": Case(JobState.RECORDING, _open_breaker, lambda zk: node_hold_clear(zk, 9502)),
    "held depositor": Case(
        JobState.DOWNLOADING,
        _held_depositor,
        lambda zk: service_hold_clear(zk, DEPOSITOR),
        # Its breaker's hold outlives the test (it ends by itself after the depositor's
        # retry window): the jobs stay passed over until the test releases it.
        env={"MRT_RETRY_DEPOSITOR": "within=1d"},
    ),
    "cap reached": Case(JobState.PENDING, _cap_reached, lambda zk: cap_clear(zk, DEMO)),
    "held collection": Case(JobState.HELD, _held_collection),
    "retry later": Case(JobState.DOWNLOADING, _retry_later),
    "disk full": Case(
        JobState.PROVISIONING, _disk_full, env={"MRT_PROVISION_HIGH_WATER": "0.000001"}
    ),
    "download cap": Case(
        JobState.DOWNLOADING,
        _download_cap,
        # The silent server's downloads hold their slots for the whole test (by default the
        # headers' minimum-rate window ends them after 60 s, failing their jobs).
        env={"MRT_HTTP_TIMEOUT": "3600", "MRT_DOWNLOAD_RATE_WINDOW": "3600"},
    ),
}


def taken_up(zk: KazooClient, jids: list[str]) -> bool:
    """Whether a loop has taken any of (the first 200 of) ``jids`` since they were loaded: a
    status written, or a lock on one."""
    looked = jids[:200]
    found = read_many(zk, [zpaths.job_node(j, n) for j in looked for n in ("status", "lock")])
    for jid in looked:
        status = found[zpaths.job_node(jid, "status")]
        if found[zpaths.job_node(jid, "lock")] is not None or (status and status[1].version):
            return True
    return False


@pytest.mark.parametrize("name", list(CASES))
def test_runconsumer_all_asks_no_more_of_waiting_jobs_than_of_an_empty_queue(
    name: str, server: LocalZooKeeper, tmp_path: Path
) -> None:
    case = CASES[name]
    zk: KazooClient = zkmod.connect(server.hosts)
    consumers = Consumers(tmp_path / "var", server.hosts)
    try:
        proc = consumers.start("all", **(case.env or {}))
        log = consumers.procs[-1][1]
        wait_for(lambda: "pending: started" in log.read_text(), timeout=120)
        wait_for(lambda: zk.exists(zpaths.JOB_STATES) is not None, timeout=60)
        empty = requests_in_window(server)

        batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
        before = received(server)
        jids = case.place(zk, batch.bid)
        windows: list[int] = []

        def quiet() -> bool:
            # Two windows in a row: a loop that polls what it may not take can have one slow
            # window on a loaded machine (its requests wait for the server's answers).
            windows.append(requests_in_window(server))
            return len(windows) >= 2 and all(w <= 2 * empty + SLACK for w in windows[-2:])

        try:
            wait_for(quiet, timeout=SETTLE, every=0)
        finally:
            print(
                f"{name}, {WAITING} waiting: requests in {WINDOW:.0f} s, empty queue {empty}, "
                f"waiting {windows}; {received(server) - before} from the load on"
            )
        assert proc.poll() is None, consumers.logs()
        assert len(zk.get_children(zpaths.job_state_folder(case.state))) >= WAITING
        if case.release is not None:
            assert not taken_up(zk, jids), "a waiting job was written or locked"
            # The reason goes: the loops were woken and take the jobs up.
            case.release(zk)
            wait_for(lambda: taken_up(zk, jids), timeout=120)
    finally:
        consumers.close()
        zk.stop()
        zk.close()
