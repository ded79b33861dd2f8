"""Resuming a failed job: the step after its last success, one more retry, back in processing."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues.core.states import job_resume_target
from queues.services import moves
from queues.zk import jobs
from queues.zk.errors import InvalidTransition
from queues.zk.records import Batch, Job

from .helpers import assert_indexed, assert_job_status, failed_after, snapshot, walk_job

RESUMES = [
    (None, "Estimating"),
    ("Pending", "Estimating"),
    ("Estimating", "Provisioning"),
    ("Provisioning", "Downloading"),
    ("Downloading", "Processing"),
    ("Processing", "Storing"),
    ("Storing", "Recording"),
    ("Recording", "Notify"),
]


@pytest.mark.parametrize(
    ("last_successful", "target"), RESUMES, ids=[f"{a}->{b}" for a, b in RESUMES]
)
def test_resume_moves_failed_job_back_to_its_step(
    zk: KazooClient, job: Job, batch: Batch, last_successful: str | None, target: str
) -> None:
    failed = failed_after(zk, job, last_successful)
    outcome = moves.job_resume(jid=job.jid)
    assert (outcome.before, outcome.after) == ("Failed", target)
    assert_job_status(zk, job.jid, status=target, last_successful=last_successful, retry=1)
    assert_indexed(zk, job, batch.bid, target)
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-failed") == []
    assert jobs.job_resume_state(failed) == target


def test_resume_after_provisioning_restarts_downloading_at_its_priority(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Estimating")
    job = jobs.job_transition(zk, job, "Provisioning", priority=10)
    job = walk_job(zk, job, "Downloading")
    jobs.job_transition(zk, job, "Failed", message="download failed")
    moves.job_resume(jid=job.jid)
    assert zk.get_children("/jobs/states/downloading") == [f"10-{job.jid}"]
    assert zk.get_children("/jobs/states/failed") == []
    assert_job_status(zk, job.jid, status="Downloading", last_successful="Provisioning", retry=1)
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-processing") == [job.jid]


def test_retry_count_rises_on_every_resume_and_is_never_reset(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Downloading")
    for attempt in (1, 2, 3):
        job = jobs.job_transition(zk, job, "Failed", message=f"attempt {attempt}")
        moves.job_resume(jid=job.jid)
        job = jobs.job_load(zk, job.jid)
        assert job.status.retry_count == attempt
    job = walk_job(zk, job, "Completed")
    assert_job_status(zk, job.jid, status="Completed", last_successful="Notify", retry=3)


def test_resume_keeps_last_successful_and_clears_the_failure_message(
    zk: KazooClient, job: Job
) -> None:
    failed = failed_after(zk, job, "Processing")
    assert failed.status.message == "Storing broke"
    moves.job_resume(jid=job.jid)
    assert_job_status(zk, job.jid, status="Storing", last_successful="Processing", retry=1)


def test_permanent_failure_cannot_be_resumed(zk: KazooClient, job: Job, batch: Batch) -> None:
    failed = jobs.job_transition(zk, job, "Failed", message="corrupt manifest", permanent=True)
    before = snapshot(zk, "/jobs", f"/batches/{batch.bid}")
    with pytest.raises(InvalidTransition, match="corrupt manifest"):
        moves.job_resume(jid=job.jid)
    with pytest.raises(InvalidTransition):
        jobs.job_resume_state(failed)
    with pytest.raises(InvalidTransition):
        jobs.job_transition(zk, failed, "Estimating", admin=True, retry=True)
    assert snapshot(zk, "/jobs", f"/batches/{batch.bid}") == before


def test_only_a_failed_job_can_be_resumed(zk: KazooClient, job: Job, batch: Batch) -> None:
    before = snapshot(zk, "/jobs", f"/batches/{batch.bid}")
    with pytest.raises(InvalidTransition, match="only a Failed job"):
        moves.job_resume(jid=job.jid)
    assert snapshot(zk, "/jobs", f"/batches/{batch.bid}") == before


def test_resume_target_follows_last_successful_status() -> None:
    assert job_resume_target(None) == "Estimating"
    assert job_resume_target("Held") == "Estimating"
    assert job_resume_target("Recording") == "Notify"
    with pytest.raises(InvalidTransition):
        job_resume_target("Notify")
    with pytest.raises(InvalidTransition):
        job_resume_target("Bogus")
