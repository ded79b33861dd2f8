"""The batch consumers' idle loops wait on watches (docs/benchmarks.md, "At rest"): batches have
no state folders, so each idle loop listed ``/batches`` and read every open batch's status at
every poll (the three of them about 38 listings a minute in an idle ``runconsumer all``, half
of what it sent that was not the job loops'). Now a loop over an empty queue sends nothing
between the watches' news and the index's fallback (a minute), and a batch that arrives, or
moves into a loop's state by another client's hand, is still taken at once."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from queues.core.states import JOB_STEPS, BatchState
from queues.daemons.base import BatchDaemon
from queues.daemons.batch_pending import BatchPending
from queues.daemons.batch_reporting import BatchReporting, BatchUpdateReporting
from queues.zk import paths as zpaths
from queues.zk.batches import batch_create, batch_load, batch_transition
from queues.zk.jobs import job_create, job_transition
from queues.zk.locks import collection_hold_set

from .conftest import DEMO, wait_for

pytestmark = [pytest.mark.zookeeper, pytest.mark.django_db]

PING = 11
GET_DATA = 4
# The span requests are counted over: at the poll below, some 40 looks of each loop.
WINDOW = 2.0
POLL = 0.05
SUBMISSION = {"profile": DEMO, "type": "file", "payload_url": "http://127.0.0.1:9/a.txt"}


def _requests(proxy: Any) -> int:
    """The requests that passed the proxy so far, the client's pings left out."""
    return sum(n for op, n in proxy.counts.items() if op != PING)


class Loops:
    """The three batch consumers' loops, running as ``runconsumer`` runs them."""

    def __init__(self, zk: Any, *, poll: float) -> None:
        self.daemons: list[BatchDaemon] = [
            cls(zk=zk, poll=poll) for cls in (BatchPending, BatchReporting, BatchUpdateReporting)
        ]
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=d.run, args=(self.stop,), daemon=True) for d in self.daemons
        ]

    def __enter__(self) -> Loops:
        for thread in self.threads:
            thread.start()
        for d in self.daemons:
            assert d.loop_started.wait(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def _wait_idle(loops: Any) -> None:
    """Until every loop has looked and found nothing in its state."""
    wait_for(lambda: all(getattr(d, "_listed_some", False) is False for d in loops.daemons))


def _wait_completed(zk: Any, bid: str) -> None:
    wait_for(lambda: batch_load(zk, bid).state == BatchState.COMPLETED, timeout=30, every=0.05)


def test_idle_batch_loops_over_an_empty_queue_send_nothing(proxy, proxied_client) -> None:
    client = proxied_client()
    with Loops(client, poll=POLL) as loops:
        # Each loop's first look (it lists /batches and sets the watches) is over once it
        # found nothing in its state.
        wait_for(lambda: _requests(proxy) > 0)
        _wait_idle(loops)
        before = _requests(proxy)
        time.sleep(WINDOW)  # a rate is counted over a span of time: nothing to wait for instead
        sent = _requests(proxy) - before
    print(f"{WINDOW:.0f} s of three idle batch loops at a {POLL} s poll: {sent} requests")
    assert sent == 0, dict(proxy.counts)


def _reporting_batch(zk: Any, *, finished: bool = True) -> str:
    """A batch in Processing whose one job is Completed (or, not ``finished``, in Notify: the
    reporting sweep leaves it be)."""
    batch = batch_create(zk, submission={"profile": DEMO, "submitter": "depositor@example.org"})
    job = job_create(zk, bid=batch.bid, configuration={"profile": DEMO})
    for step in JOB_STEPS[1:] if finished else JOB_STEPS[1:-1]:
        job = job_transition(zk, job, step)
    batch_transition(zk, batch_load(zk, batch.bid), BatchState.PROCESSING)
    return batch.bid


def _parked(zk: Any, bid: str) -> bool:
    """Whether batch-pending parked the batch as Held and gave its lock back."""
    batch = batch_load(zk, bid)
    return batch.state == BatchState.HELD and batch.lock is None


def test_batches_arriving_or_moved_in_are_taken_without_a_poll(
    zk, proxied_client, mailoutbox
) -> None:
    """A poll far longer than the test: only the watches can wake the loops."""
    collection_hold_set(zk, DEMO)  # batch-pending parks the batches as Held
    with Loops(proxied_client(), poll=3600):
        # A new batch: /batches' child watch.
        bid = batch_create(zk, submission=SUBMISSION).bid
        wait_for(lambda: _parked(zk, bid), timeout=30, every=0.05)

        # Moved back to Pending by an operator: the batch's status watch.
        pending = batch_transition(zk, batch_load(zk, bid), BatchState.PENDING, admin=True)
        wait_for(
            lambda: (
                _parked(zk, bid) and batch_load(zk, bid).status.version > pending.status.version
            ),
            timeout=30,
            every=0.05,
        )

        # Moved to Reporting by another client (a job loop's completion check): the same.
        reporting = _reporting_batch(zk)
        batch_transition(zk, batch_load(zk, reporting), BatchState.REPORTING)
        _wait_completed(zk, reporting)
    assert len(mailoutbox) == 1


def test_a_move_made_while_the_loops_are_cut_off_is_taken_once_they_are_back(
    zk, proxy, proxied_client, mailoutbox
) -> None:
    """The connection lost (a partition, healed within the session's timeout), the watches go
    with it: a batch moved meanwhile is still taken when the loops are back, not a poll later.
    (A guard for the watches, not a fix: the loops before them woke on the dropped children
    watch of /batches and listed everything.)"""
    reporting = _reporting_batch(zk, finished=False)
    with Loops(proxied_client(timeout=30), poll=3600) as loops:
        _wait_idle(loops)
        proxy.blackhole()
        batch_transition(zk, batch_load(zk, reporting), BatchState.REPORTING)
        proxy.heal()
        _wait_completed(zk, reporting)
    assert len(mailoutbox) == 1


def test_a_batch_whose_status_is_written_after_its_node_is_taken_when_it_is(
    zk, proxy, proxied_client, mailoutbox
) -> None:
    """Merritt's library creates a batch a node at a time: the loops may read a batch whose
    status is not there yet. Its creation is watched, so the batch is taken once it is
    written, not at the index's fallback a minute later."""
    with Loops(proxied_client(), poll=3600) as loops:
        _wait_idle(loops)
        node = zk.create(f"{zpaths.BATCHES}/bid", sequence=True)
        bid = node.rsplit("/", 1)[-1]
        status = zpaths.batch_node(bid, "status")
        # The loops read the batch's status and found none.
        wait_for(lambda: any(op == GET_DATA and p.endswith(status) for op, p in proxy.paths))
        zk.create(
            zpaths.batch_node(bid, "submission"),
            json.dumps({"profile": DEMO, "submitter": "depositor@example.org"}).encode(),
        )
        zk.create(status, json.dumps({"status": BatchState.REPORTING, "message": ""}).encode())
        _wait_completed(zk, bid)
    assert len(mailoutbox) == 1
