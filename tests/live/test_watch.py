"""QueueWatcher on a real ZooKeeper: reports, folders that appear later, and lost sessions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.zk import jobs
from queues.zk.records import Batch, Job
from queues.zk.watch import ZK_DOWN, ZK_UP, QueueWatcher


class Recorder:
    """Every report the watcher made, in order; waits look at all of them, in any order."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self._changed = threading.Condition()

    def __call__(self, topic: str, detail: dict[str, Any]) -> None:
        with self._changed:
            self.reports.append((topic, detail))
            self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return len(self.reports)

    def wait(
        self, *wanted: Callable[[str, dict[str, Any]], bool], since: int = 0, timeout: float = 20.0
    ) -> list[tuple[str, dict[str, Any]]]:
        """Wait until each condition matches some report made after ``since``; return those."""

        def met() -> bool:
            later = self.reports[since:]
            return all(any(w(t, d) for t, d in later) for w in wanted)

        with self._changed:
            if not self._changed.wait_for(met, timeout):
                raise AssertionError(f"reports not seen; got {self.reports[since:]}")
            return list(self.reports[since:])


@pytest.fixture
def reports() -> Recorder:
    return Recorder()


@pytest.fixture
def watcher(zk: KazooClient, reports: Recorder) -> Iterator[QueueWatcher]:
    w = QueueWatcher(zk, reports)
    w.start()
    yield w
    w.stop()


def expire_session(zk: KazooClient, hosts: str) -> None:
    """End ``zk``'s session on the server, as a long network outage would.

    A second client attaches to the same session and closes it; kazoo then sees the session
    expired (LOST) and opens a new one.
    """
    thief = KazooClient(hosts=hosts, client_id=zk.client_id)
    thief.start(timeout=10)
    thief.stop()
    thief.close()


def test_moves_by_another_client_are_reported_for_both_state_folders(
    watcher: QueueWatcher,
    reports: Recorder,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    job = make_job(make_batch())
    reports.wait(lambda t, d: t == "jobs:state:Pending")  # the job's creation
    since = reports.mark()
    jobs.job_transition(other_zk, job, "Estimating")
    seen = reports.wait(
        lambda t, d: t == "jobs:state:Estimating",
        lambda t, d: t == "jobs:state:Pending",
        since=since,
    )
    assert all(t != f"job:{job.jid}" for t, _ in seen)  # not subscribed


def test_an_item_topic_is_watched_only_while_subscribed(
    watcher: QueueWatcher,
    reports: Recorder,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    job = make_job(make_batch())
    topic = f"job:{job.jid}"
    watcher.subscribe(topic)
    watcher.subscribe(topic)
    watcher.unsubscribe(topic)
    since = reports.mark()
    job = jobs.job_transition(other_zk, job, "Estimating")
    # The move's status write and its fencing lock (created and deleted in the move's
    # transaction: the lock's watch fires too) are both reported before the unsubscribe.
    reports.wait(
        lambda t, d: t == topic and d.get("exists") is True,
        lambda t, d: t == topic and d.get("exists") is False,
        lambda t, d: t == "jobs:state:Estimating",
        since=since,
    )
    watcher.unsubscribe(topic)
    assert watcher.refs(topic) == 0
    since = reports.mark()
    jobs.job_transition(other_zk, job, "Provisioning")
    # The status watch set before the last unsubscribe fires once more and is dropped.
    seen = reports.wait(
        lambda t, d: t == "jobs:state:Provisioning",
        lambda t, d: t == "jobs:state:Estimating",
        since=since,
    )
    assert all(t != topic for t, _ in seen)


def test_a_batch_folder_created_after_subscribing_is_watched(
    watcher: QueueWatcher,
    reports: Recorder,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    job = make_job(batch)
    assert other_zk.exists(f"/batches/{batch.bid}/states/batch-failed") is None
    watcher.subscribe(f"batch:{batch.bid}")
    jobs.job_transition(other_zk, job, "Failed", admin=True)
    reports.wait(
        lambda t, d: (
            t == f"batch:{batch.bid}" and d.get("folder") == "batch-failed" and d.get("count") == 1
        )
    )


def test_watches_are_set_again_after_the_session_is_lost(
    watcher: QueueWatcher,
    reports: Recorder,
    zk: KazooClient,
    zk_hosts: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    job = make_job(make_batch())
    topic = f"job:{job.jid}"
    watcher.subscribe(topic)
    old_session = zk.client_id[0]
    since = reports.mark()
    expire_session(zk, zk_hosts)
    seen = reports.wait(
        lambda t, d: t == ZK_DOWN,
        lambda t, d: t == ZK_UP,
        lambda t, d: t == topic and d.get("reconnected"),
        since=since,
    )
    topics = [t for t, _ in seen]
    assert topics.index(ZK_DOWN) < topics.index(ZK_UP)
    assert zk.client_id[0] != old_session
    since = reports.mark()
    jobs.job_transition(other_zk, job, "Estimating")
    reports.wait(
        lambda t, d: t == topic and not d.get("reconnected"),
        lambda t, d: t == "jobs:state:Estimating" and not d.get("reconnected"),
        since=since,
    )


def test_a_batch_topic_reports_its_jobs_steps_inside_batch_processing(
    watcher: QueueWatcher,
    reports: Recorder,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    job = make_job(batch)
    topic = f"batch:{batch.bid}"
    watcher.subscribe(topic)
    since = reports.mark()
    jobs.job_transition(other_zk, job, "Estimating")  # stays in batch-processing
    reports.wait(lambda t, d: t == topic and d.get("item") == job.jid, since=since)
