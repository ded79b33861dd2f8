"""A change in a large state folder reaches the watcher without the folder being read again
(issue 27: a 30,000-entry folder listed per change made live updates 20 times slower at a
million jobs, and the stat read per change after that still cost a round trip before each
message), and keeps reaching it change after change."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from bench.loader import bulk_load
from queues.core.states import JobState
from queues.live.hub import current_hub, get_hub
from queues.zk import client as zkmod
from queues.zk import index as zindex
from queues.zk import jobs
from queues.zk.watch import QueueWatcher, job_state_topic

from .conftest import run

FOLDER_JOBS = 3000
MOVES = 6


class Requests:
    """The requests a client sends, by kind and path under its chroot (counted as they are
    queued; kazoo's pings do not pass here)."""

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self.sent: Counter[tuple[str, str]] = Counter()
        self._original = zk._call

    def __enter__(self) -> Requests:
        def counting(request: Any, async_object: Any) -> Any:
            path = getattr(request, "path", "")
            self.sent[type(request).__name__, self.zk.unchroot(path) if path else ""] += 1
            return self._original(request, async_object)

        self.zk._call = counting
        return self

    def __exit__(self, *_exc: object) -> None:
        self.zk._call = self._original


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.changed = threading.Condition()

    def __call__(self, topic: str, detail: dict[str, Any]) -> None:
        with self.changed:
            self.seen.append((topic, detail))
            self.changed.notify_all()

    def mark(self) -> int:
        with self.changed:
            return len(self.seen)

    def wait(self, topic: str, since: int, timeout: float = 20.0) -> dict[str, Any]:
        """The first report of ``topic`` made after the ``since``-th one."""

        def found() -> dict[str, Any] | None:
            return next((d for t, d in self.seen[since:] if t == topic), None)

        with self.changed:
            if not self.changed.wait_for(lambda: found() is not None, timeout):
                raise AssertionError(f"no report of {topic}: {self.seen[-5:]}")
            detail = found()
            assert detail is not None
            return detail


@pytest.fixture
def large_folder(zk: KazooClient) -> Any:
    """FOLDER_JOBS jobs in Estimating, and a few Pending to move in."""
    zindex.reset()
    return bulk_load(
        zk,
        batches=30,
        jobs=FOLDER_JOBS + MOVES,
        distribution={JobState.ESTIMATING: FOLDER_JOBS, JobState.PENDING: MOVES},
    )


@pytest.fixture
def own_client(zk_hosts: str) -> Iterator[KazooClient]:
    client = zkmod.connect(zk_hosts)
    yield client
    client.stop()
    client.close()


def test_each_change_of_a_large_state_folder_is_reported_without_reading_it(
    large_folder: Any, own_client: KazooClient, other_zk: KazooClient
) -> None:
    reports = Reports()
    watcher = QueueWatcher(own_client, reports)
    watcher.start()  # returns once its watches are set
    topic = job_state_topic(JobState.ESTIMATING)
    moved = 0
    try:
        with Requests(own_client) as requests:
            for jid in large_folder.jobs_by_state[JobState.PENDING]:
                since = reports.mark()
                jobs.job_transition(other_zk, jobs.job_load(other_zk, jid), "Estimating")
                assert reports.wait(topic, since) == {}  # the topic alone: nothing was read
                moved += 1
    finally:
        watcher.stop()
    assert moved == MOVES
    # Not a listing of its 3,000 names, not even its stat: no request at all per change.
    assert sum(requests.sent.values()) == 0, requests.sent


def test_the_live_hub_watches_on_a_session_the_read_index_does_not_share(
    live: None, zk: KazooClient, other_zk: KazooClient, large_folder: Any
) -> None:
    """ZooKeeper 3.8 turns a persistent watch into a one-shot one when the same session sets a
    one-shot watch on the path (the read index does, at every listing): the hub's watches must
    keep firing while pages are read."""
    hub = run(get_hub())
    assert hub.watcher is not None and hub.watcher.zk is not zk
    reports = Reports()
    hub.watcher._report = reports
    topic = job_state_topic(JobState.ESTIMATING)
    index = zindex.for_client(zkmod.client())
    for jid in large_folder.jobs_by_state[JobState.PENDING][:3]:
        index.job_count(JobState.ESTIMATING)  # a page's read: a one-shot watch on the folder
        since = reports.mark()
        jobs.job_transition(other_zk, jobs.job_load(other_zk, jid), "Estimating")
        reports.wait(topic, since)
    assert current_hub() is hub
