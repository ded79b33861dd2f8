"""A change in a large state folder reaches the watcher without the folder being listed again
(issue 27: a 30,000-entry folder listed per change made live updates 20 times slower at a
million jobs), and keeps reaching it change after change."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from bench.loader import bulk_load
from queues.live.hub import current_hub, get_hub
from queues.states import JobState
from queues.zk import client as zkmod
from queues.zk import index as zindex
from queues.zk import jobs, paths
from queues.zk.watch import QueueWatcher, job_state_topic

from .conftest import run

FOLDER_JOBS = 3000
MOVES = 6


class Listings:
    """The child listings a client asks for, per path under its chroot (counted as the
    requests are queued)."""

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self.paths: Counter[str] = Counter()
        self._original = zk._call

    def __enter__(self) -> Listings:
        def counting(request: Any, async_object: Any) -> Any:
            if type(request).__name__.startswith("GetChildren"):
                self.paths[self.zk.unchroot(request.path)] += 1
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

    def wait_zxid(self, topic: str, zxid: int, timeout: float = 20.0) -> dict[str, Any]:
        """The first report of ``topic`` reflecting the transaction ``zxid``."""

        def found() -> dict[str, Any] | None:
            return next((d for t, d in self.seen if t == topic and d.get("zxid", 0) >= zxid), None)

        with self.changed:
            if not self.changed.wait_for(lambda: found() is not None, timeout):
                raise AssertionError(f"no report of {topic} at zxid {zxid}: {self.seen[-5:]}")
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


def test_each_change_of_a_large_state_folder_is_reported_without_listing_it(
    large_folder: Any, own_client: KazooClient, other_zk: KazooClient
) -> None:
    reports = Reports()
    watcher = QueueWatcher(own_client, reports)
    watcher.start()
    folder = paths.job_state_folder(JobState.ESTIMATING)
    topic = job_state_topic(JobState.ESTIMATING)
    try:
        with Listings(own_client) as listings:
            for n, jid in enumerate(large_folder.jobs_by_state[JobState.PENDING], start=1):
                job = jobs.job_transition(other_zk, jobs.job_load(other_zk, jid), "Estimating")
                entry = other_zk.exists(f"{folder}/{paths.index_name(job.priority, jid)}")
                assert entry is not None
                detail = reports.wait_zxid(topic, entry.czxid)
                assert detail["count"] == FOLDER_JOBS + n
    finally:
        watcher.stop()
    # The stat of the folder for each report; its 3,000 names never.
    assert listings.paths[folder] == 0, listings.paths


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
    folder = paths.job_state_folder(JobState.ESTIMATING)
    index = zindex.for_client(zkmod.client())
    for jid in large_folder.jobs_by_state[JobState.PENDING][:3]:
        index.job_count(JobState.ESTIMATING)  # a page's read: a one-shot watch on the folder
        job = jobs.job_transition(other_zk, jobs.job_load(other_zk, jid), "Estimating")
        entry = other_zk.exists(f"{folder}/{paths.index_name(job.priority, jid)}")
        assert entry is not None
        reports.wait_zxid(topic, entry.czxid)
    assert current_hub() is hub
