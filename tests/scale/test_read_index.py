"""The watch-kept read index answers like a fresh read of ZooKeeper, once watches arrive."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.zk import index
from queues.zk.batches import batch_create, batch_load, batch_transition
from queues.zk.jobs import index_entries, job_create, job_load, job_transition
from queues.zk.records import Job


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Watch events arrive asynchronously (milliseconds): poll until ``check`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.fixture
def idx(zk: KazooClient):
    made = index.ReadIndex(zk)
    yield made
    made.close()


@pytest.fixture
def make_job(zk: KazooClient) -> Callable[..., Job]:
    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})

    def make(profile: str = "coll_a", priority: int = 5, submitter: str = "Ada") -> Job:
        return job_create(
            zk,
            bid=batch.bid,
            configuration={"profile": profile, "submitter": submitter},
            priority=priority,
        )

    return make


def test_entries_follow_creations_and_moves(zk, idx, make_job) -> None:
    first = make_job(priority=7)
    assert idx.job_entries("Pending") == index_entries(zk, "Pending")

    second = make_job(priority=2)
    assert eventually(lambda: idx.job_entries("Pending") == [(2, second.jid), (7, first.jid)])

    job_transition(zk, job_load(zk, first.jid), "Estimating")
    assert eventually(lambda: idx.job_entries("Pending") == [(2, second.jid)])
    assert eventually(lambda: idx.job_entries("Estimating") == [(7, first.jid)])
    assert idx.job_count("Estimating") == 1


def test_orders_and_oldest_entry(idx, make_job) -> None:
    jobs = [make_job(priority=p) for p in (9, 1, 5)]
    assert eventually(lambda: idx.job_count("Pending") == 3)

    assert [j for _p, j in idx.job_entries("Pending", order="oldest")] == [j.jid for j in jobs]
    assert [j for _p, j in idx.job_entries("Pending", order="newest")] == [
        j.jid for j in reversed(jobs)
    ]
    assert idx.oldest_entry("Pending") == f"09-{jobs[0].jid}"
    assert idx.oldest_entry("Completed") is None


def test_a_missing_folder_is_empty_until_it_is_created(zk, idx, make_job) -> None:
    if zk.exists("/jobs/states/notify"):
        zk.delete("/jobs/states/notify", recursive=True)
    assert idx.job_entries("Notify") == []

    job = make_job()
    for step in (
        "Estimating",
        "Provisioning",
        "Downloading",
        "Processing",
        "Storing",
        "Recording",
        "Notify",
    ):
        job = job_transition(zk, job, step)
    assert eventually(lambda: idx.job_entries("Notify") == [(5, job.jid)])


def test_filters_by_profile_and_submitter(zk, idx, make_job) -> None:
    a = make_job(profile="coll_a", submitter="Ada Lovelace")
    b = make_job(profile="coll_b", submitter="Charles Babbage")
    assert eventually(lambda: idx.job_count("Pending") == 2)

    assert idx.job_entries_matching("Pending", profile="coll_a") == [(5, a.jid)]
    assert idx.job_entries_matching("Pending", submitter="babb") == [(5, b.jid)]
    assert idx.job_entries_matching("Pending", profile="coll_a", submitter="babb") == []

    c = make_job(profile="coll_a")
    assert eventually(
        lambda: idx.job_entries_matching("Pending", profile="coll_a") == [(5, a.jid), (5, c.jid)]
    )


def test_batch_states_follow_status_changes(zk, idx) -> None:
    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    assert idx.batch_states()[batch.bid].state == "Pending"

    batch_transition(zk, batch_load(zk, batch.bid), "Processing")
    assert eventually(lambda: idx.batch_states()[batch.bid].state == "Processing")

    zk.set(f"/batches/{batch.bid}/status", b"garbage")
    assert eventually(lambda: idx.batch_states()[batch.bid].state == "?")

    other = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    assert eventually(lambda: set(idx.batch_states()) == {batch.bid, other.bid})

    # Nothing changed since: the same answer again, not a look at every batch per page.
    assert idx.batch_states() is idx.batch_states()
    kept = idx.batch_states()
    batch_transition(zk, batch_load(zk, other.bid), "Processing")
    assert eventually(lambda: idx.batch_states()[other.bid].state == "Processing")
    assert kept[other.bid].state == "Pending"  # an answer given out is never changed
    # A dropped connection: every batch is read again.
    kept = idx.batch_states()
    idx.mark_all_stale()
    assert idx.batch_states() is not kept and idx.batch_states() == kept


def test_a_report_is_seen_when_the_reporting_step_moves_its_batch_on(zk, idx) -> None:
    """Whether a batch has a status report is read with its status, under the status's watch
    only: the reporting steps write a report and then move the batch, so one watch a batch
    sees both (no watch is kept on any report)."""
    from queues.zk.batches import batch_write_report

    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    batch = batch_transition(zk, batch, "Processing")
    batch = batch_transition(zk, batch, "Reporting")
    assert idx.reported_batch_ids() == [] and idx.batch_states()[batch.bid].state == "Reporting"
    batch_write_report(zk, batch_load(zk, batch.bid), failed=[], successful=[])
    batch_transition(zk, batch_load(zk, batch.bid), "Completed")
    assert eventually(lambda: idx.reported_batch_ids() == [batch.bid])
    watched = [p for p in zk._data_watchers if "/batches/" in p]  # full paths: the chroot too
    assert [p.split("/batches/", 1)[1] for p in watched] == [f"{batch.bid}/status"]


def test_space_needed_is_read_again_when_a_job_changes_state(zk, idx, make_job) -> None:
    job = make_job()
    assert idx.space_needed("Pending", [job.jid]) == {job.jid: 0}

    zk.set(f"/jobs/{job.jid}/space_needed", b"1234")
    job_transition(zk, job, "Estimating")
    assert idx.space_needed("Estimating", [job.jid]) == {job.jid: 1234}


def test_space_needed_is_kept_as_two_arrays_and_only_new_jobs_are_read(
    zk, idx, make_job, monkeypatch
) -> None:
    """What is kept per state is the jobs' numbers, sorted, and their values (16 bytes a job,
    not a dictionary of ints); a job that left is forgotten, and only jobs not known are read."""
    from array import array

    from queues.zk import index as zindex

    jobs = [make_job() for _ in range(5)]
    for n, job in enumerate(jobs):
        zk.set(f"/jobs/{job.jid}/space_needed", str(100 + n).encode())
    jids = [j.jid for j in jobs]
    assert idx.space_needed("Pending", reversed(jids)) == {j: 100 + n for n, j in enumerate(jids)}
    kept = idx._space["Pending"]
    assert isinstance(kept.numbers, array) and isinstance(kept.values, array)
    assert list(kept.numbers) == sorted(kept.numbers) and len(kept.values) == 5

    read: list[str] = []
    real = zindex.read_many
    monkeypatch.setattr(zindex, "read_many", lambda zk, p: read.extend(p) or real(zk, p))
    # The same jobs: nothing read, the kept values given back.
    assert idx.space_needed("Pending", jids) == {j: 100 + n for n, j in enumerate(jids)}
    assert read == []
    # One left, one new: only the new one is read; the one that left is forgotten.
    new = make_job()
    zk.set(f"/jobs/{new.jid}/space_needed", b"7")
    assert idx.space_needed("Pending", [*jids[1:], new.jid]) == {
        **{j: 101 + n for n, j in enumerate(jids[1:])},
        new.jid: 7,
    }
    assert read == [f"/jobs/{new.jid}/space_needed"]
    assert len(idx._space["Pending"].numbers) == 5


def test_a_dropped_connection_makes_every_entry_stale(zk, idx, make_job) -> None:
    make_job()
    assert idx.job_count("Pending") == 1
    # What kazoo does when the connection drops: fire every watch with an empty event, forget
    # them all. Changes made meanwhile must still be seen afterwards.
    zk._child_watchers.clear()
    idx._on_folder_event(SimpleNamespace(path=None, type="NONE"))
    make_job()
    assert idx.job_count("Pending") == 2


def test_a_session_event_makes_every_entry_stale(zk, idx, make_job) -> None:
    make_job()
    assert idx.job_count("Pending") == 1
    zk._child_watchers.clear()
    idx._on_session("SUSPENDED")
    make_job()
    assert idx.job_count("Pending") == 2


def test_one_index_per_client(zk: KazooClient, other_zk: KazooClient) -> None:
    assert index.for_client(zk) is index.for_client(zk)
    assert index.for_client(zk) is not index.for_client(other_zk)
    index.reset()


def test_summaries_follow_changes(zk, idx, make_job) -> None:
    batch = batch_create(zk, submission={"profile": "p", "submitter": "s"})
    assert idx.batch_summary()["Pending"][0] >= 1
    batch_transition(zk, batch_load(zk, batch.bid), "Processing")
    assert eventually(lambda: idx.batch_summary().get("Processing", (0, 0))[0] == 1)

    a = make_job(profile="coll_a")
    make_job(profile="coll_b")
    assert eventually(lambda: idx.profile_counts("Pending") == {"coll_a": 1, "coll_b": 1})

    zk.set(f"/jobs/{a.jid}/space_needed", b"100")
    job_transition(zk, job_load(zk, a.jid), "Estimating")
    assert eventually(lambda: idx.space_total("Estimating") == 100)
    assert eventually(lambda: idx.profile_counts("Pending") == {"coll_b": 1})
