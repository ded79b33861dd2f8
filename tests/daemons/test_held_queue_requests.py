"""A held queue is watched, not polled (issue 51): ``runconsumer all`` as shipped sent about
257,000 requests a minute to ZooKeeper over a held ingest queue with 300 jobs waiting, against
495 over an empty queue. The batched loops claimed what the hold then made them give back."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from queues.services.zkserver import LocalZooKeeper, four_letter
from queues.zk import client as zkmod
from queues.zk import paths as zpaths
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create
from queues.zk.locks import queue_hold_clear, queue_hold_set

from .conftest import DEMO, wait_for
from .test_end_to_end import Consumers

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

WINDOW = 10.0  # seconds of requests counted, the same for each case
WAITING = 300
# What a window may hold beyond twice the empty queue's: the hold's own watch events and a
# poll or two of a loop that wakes on them.
SLACK = 200
# A file no server serves: a job goes on from Pending all the same (its size is then unknown).
CONFIGURATION = {"profile": DEMO, "payload_url": "http://127.0.0.1:9/a.txt", "type": "file"}


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


def test_runconsumer_all_asks_no_more_of_a_held_queue_with_waiting_jobs_than_of_an_empty_one(
    server: LocalZooKeeper, tmp_path: Path
) -> None:
    zk: KazooClient = zkmod.connect(server.hosts)
    consumers = Consumers(tmp_path / "var", server.hosts)
    try:
        proc = consumers.start("all")
        log = consumers.procs[-1][1]
        wait_for(lambda: "pending: started" in log.read_text(), timeout=120)
        wait_for(lambda: zk.exists(zpaths.JOB_STATES) is not None, timeout=60)
        empty = requests_in_window(server)

        assert queue_hold_set(zk, "ingest")
        batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
        for _ in range(WAITING):
            job_create(zk, bid=batch.bid, configuration=CONFIGURATION)
        held = requests_in_window(server)
        print(f"requests in {WINDOW:.0f} s: empty queue {empty}, held ({WAITING} waiting) {held}")
        assert proc.poll() is None, consumers.logs()
        assert held <= 2 * empty + SLACK, (held, empty)

        # Released, the jobs go on at once: the hold's watch woke the loops.
        queue_hold_clear(zk, "ingest")
        pending = zpaths.job_state_folder("Pending")
        wait_for(lambda: len(zk.get_children(pending)) < WAITING, timeout=120)
    finally:
        consumers.close()
        zk.stop()
        zk.close()
