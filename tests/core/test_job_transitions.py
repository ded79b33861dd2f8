"""Every consumer move of a job: the status JSON, the job index and the batch index."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.core.states import JOB_STEPS, JOB_WORKING
from queues.zk import jobs
from queues.zk.errors import InvalidTransition
from queues.zk.records import Batch, Job, evolve
from tests.jobnodes import set_job_nodes

from .helpers import (
    assert_indexed,
    assert_job_status,
    compact,
    raw,
    read_json,
    snapshot,
    walk_job,
)

CHAIN = list(itertools.pairwise(JOB_STEPS))


@pytest.mark.parametrize(("source", "target"), CHAIN, ids=[f"{a}->{b}" for a, b in CHAIN])
def test_successful_step_moves_job_to_the_next_state(
    zk: KazooClient, job: Job, batch: Batch, source: str, target: str
) -> None:
    job = walk_job(zk, job, source)
    moved = jobs.job_transition(zk, job, target, message=f"{source} done")
    assert_job_status(zk, job.jid, status=target, last_successful=source, message=f"{source} done")
    assert_indexed(zk, job, batch.bid, target)
    assert moved.state == target
    loaded = jobs.job_load(zk, job.jid)
    assert (moved.status.raw, moved.status.version) == (loaded.status.raw, loaded.status.version)


def test_notify_to_completed_moves_batch_entry_to_batch_completed(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Completed")
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-processing") == []
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-completed") == [job.jid]
    assert zk.get_children("/jobs/states/completed") == [f"05-{job.jid}"]
    assert zk.get_children("/jobs/states/notify") == []


def test_pending_to_held_keeps_the_batch_entry_in_batch_processing(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    jobs.job_transition(zk, job, "Held", message="collection held")
    assert_job_status(
        zk, job.jid, status="Held", last_successful="Pending", message="collection held"
    )
    assert_indexed(zk, job, batch.bid, "Held")
    assert zk.get_children("/jobs/states/pending") == []


@pytest.mark.quick
def test_operator_hold_and_release_round_trip(zk: KazooClient, job: Job, batch: Batch) -> None:
    held = jobs.job_transition(zk, job, "Held", admin=True, message="by operator")
    released = jobs.job_transition(zk, held, "Pending", admin=True)
    assert_job_status(zk, job.jid, status="Pending", last_successful="Held")
    assert_indexed(zk, job, batch.bid, "Pending")
    assert released.status.version == 2


def test_release_of_a_held_job_is_an_operator_move_only(zk: KazooClient, job: Job) -> None:
    held = jobs.job_transition(zk, job, "Held")
    with pytest.raises(InvalidTransition, match="a consumer cannot"):
        jobs.job_transition(zk, held, "Pending")


def test_estimating_to_provisioning_with_new_priority_renames_the_index_entry(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Estimating")
    job = set_job_nodes(zk, job, space_needed=1_000_000_000)
    moved = jobs.job_transition(zk, job, "Provisioning", priority=10)
    assert raw(zk, f"/jobs/{job.jid}/priority") == b"10"
    assert raw(zk, f"/jobs/{job.jid}/space_needed") == b"1000000000"
    assert zk.get_children("/jobs/states/estimating") == []
    assert zk.get_children("/jobs/states/provisioning") == [f"10-{job.jid}"]
    assert_indexed(zk, job, batch.bid, "Provisioning", priority=10)
    assert_job_status(zk, job.jid, status="Provisioning", last_successful="Estimating")
    assert moved.priority == 10
    assert jobs.job_load(zk, job.jid).space_needed == 1_000_000_000


def test_priority_change_keeps_its_value_through_later_steps(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Estimating")
    job = jobs.job_transition(zk, job, "Provisioning", priority=10)
    job = walk_job(zk, job, "Processing")
    assert_indexed(zk, job, batch.bid, "Processing", priority=10)


@pytest.mark.parametrize("source", ["Pending", *JOB_WORKING])
def test_failure_moves_job_to_failed_and_batch_failed(
    zk: KazooClient, job: Job, batch: Batch, source: str
) -> None:
    job = walk_job(zk, job, source)
    before = job.status.last_successful_status
    jobs.job_transition(zk, job, "Failed", message=f"{source} broke")
    assert_job_status(
        zk, job.jid, status="Failed", last_successful=before, message=f"{source} broke"
    )
    assert_indexed(zk, job, batch.bid, "Failed")
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-processing") == []


def test_downloading_failure_keeps_provisioning_as_last_successful(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Estimating")
    job = jobs.job_transition(zk, job, "Provisioning", priority=10)
    job = walk_job(zk, job, "Downloading")
    jobs.job_transition(zk, job, "Failed", message="GET https://example.org/a.txt: 503")
    assert_job_status(
        zk,
        job.jid,
        status="Failed",
        last_successful="Provisioning",
        message="GET https://example.org/a.txt: 503",
    )
    assert zk.get_children("/jobs/states/failed") == [f"10-{job.jid}"]
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-failed") == [job.jid]


def test_pending_job_can_fail_without_a_successful_step(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    jobs.job_transition(zk, job, "Failed", message="digest mismatch", permanent=True)
    status = read_json(zk, f"/jobs/{job.jid}/status")
    assert status["status"] == "Failed"
    assert status["last_successful_status"] is None
    assert status["retry_count"] == 0
    assert_indexed(zk, job, batch.bid, "Failed")


def test_message_is_replaced_on_every_move(zk: KazooClient, job: Job) -> None:
    job = jobs.job_transition(zk, job, "Estimating", message="estimating")
    job = jobs.job_transition(zk, job, "Provisioning")
    assert read_json(zk, f"/jobs/{job.jid}/status")["message"] == ""


ILLEGAL = [
    ("Pending", "Downloading"),
    ("Pending", "Completed"),
    ("Estimating", "Pending"),
    ("Provisioning", "Estimating"),
    ("Processing", "Recording"),
    ("Notify", "Pending"),
    ("Completed", "Failed"),
    ("Completed", "Pending"),
    ("Held", "Estimating"),
    ("Failed", "Estimating"),
    ("Failed", "Completed"),
    ("Pending", "Bogus"),
]


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_move_raises_and_changes_nothing(
    zk: KazooClient, job: Job, batch: Batch, source: str, target: str
) -> None:
    job = walk_job(zk, job, source)
    before = snapshot(zk, "/jobs", f"/batches/{batch.bid}")
    with pytest.raises(InvalidTransition):
        jobs.job_transition(zk, job, target)
    assert snapshot(zk, "/jobs", f"/batches/{batch.bid}") == before


@pytest.mark.parametrize("target", ["Deleted", "Pending"])
def test_consumer_cannot_delete_or_restart_through_a_transition(
    zk: KazooClient, job: Job, batch: Batch, target: str
) -> None:
    job = jobs.job_transition(zk, job, "Failed")
    before = snapshot(zk, "/jobs", f"/batches/{batch.bid}")
    with pytest.raises(InvalidTransition):
        jobs.job_transition(zk, job, target)
    assert snapshot(zk, "/jobs", f"/batches/{batch.bid}") == before


def test_unknown_keys_in_status_json_survive_a_move(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch
) -> None:
    job = make_job()
    path = f"/jobs/{job.jid}/status"
    status = read_json(zk, path)
    status["java_only"] = {"host": "ingest01", "attempt": [1, 2]}
    zk.set(path, compact(status))
    moved = jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Estimating")
    after = read_json(zk, path)
    assert after["java_only"] == {"host": "ingest01", "attempt": [1, 2]}
    assert after["status"] == "Estimating"
    assert list(after)[:5] == [
        "status",
        "last_modified",
        "last_successful_status",
        "retry_count",
        "message",
    ]
    assert moved.status.raw["java_only"] == {"host": "ingest01", "attempt": [1, 2]}


def test_transition_returns_the_new_status_version(zk: KazooClient, job: Job) -> None:
    moved = jobs.job_transition(zk, job, "Estimating")
    assert moved.status.version == zk.get(f"/jobs/{job.jid}/status")[1].version == 1
    again = jobs.job_transition(zk, moved, "Provisioning")
    assert again.status.version == 2


def test_a_status_mtime_in_seconds_is_its_mtimes_as_read_and_as_made(
    zk: KazooClient, job: Job
) -> None:
    """The step history's wait comes from ``mtime_seconds``, which a status read from the
    server gives without making its datetime; it is the same instant either way."""
    read = jobs.job_load(zk, job.jid).status
    _data, stat = zk.get(f"/jobs/{job.jid}/status")
    assert read.mtime_seconds == stat.mtime / 1000
    assert read.mtime_seconds == pytest.approx(read.mtime.timestamp())
    made = dataclasses.replace(read, version=read.version)  # made again, not read
    assert made.mtime_seconds == pytest.approx(stat.mtime / 1000)
    later = read.mtime + datetime.timedelta(seconds=5)
    fresh = jobs.job_load(zk, job.jid).status
    assert evolve(fresh, mtime=later).mtime_seconds == later.timestamp()
    assert dataclasses.replace(fresh, mtime=later).mtime_seconds == later.timestamp()
