"""A move that cannot complete leaves every node exactly as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.core.states import BATCH_INDEX_FOLDERS, JOB
from queues.services import moves
from queues.zk import batches, jobs
from queues.zk.errors import Conflict
from queues.zk.locks import lock_create, lock_release
from queues.zk.paths import job_node
from queues.zk.records import Batch, Job
from queues.zk.store_intents import store_intent_path, store_intent_read, store_intent_record
from tests.jobnodes import set_job_nodes

from .helpers import assert_indexed, raw, snapshot, walk_job


@pytest.fixture(autouse=True)
def folders(zk: KazooClient, batch: Batch) -> None:
    """Every index folder exists up front, so a refused move has nothing at all to create."""
    for state in JOB.states:
        zk.ensure_path(f"/jobs/states/{state.lower()}")
    for folder in BATCH_INDEX_FOLDERS:
        zk.ensure_path(f"/batches/{batch.bid}/states/{folder}")


def tree(zk: KazooClient, bid: str) -> dict:
    return snapshot(zk, "/jobs", f"/batches/{bid}", "/batch-uuids")


def test_move_read_at_an_old_version_is_refused_and_changes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    stale = jobs.job_load(zk, job.jid)
    jobs.job_transition(other_zk, jobs.job_load(other_zk, job.jid), "Estimating")
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_transition(zk, stale, "Failed", message="stale page")
    assert tree(zk, batch.bid) == before
    assert_indexed(zk, job, batch.bid, "Estimating")


def test_stale_move_with_a_priority_change_is_refused_and_changes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    stale = walk_job(zk, job, "Estimating")
    jobs.job_transition(other_zk, jobs.job_load(other_zk, job.jid), "Provisioning")
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_transition(zk, stale, "Provisioning", priority=10)
    assert tree(zk, batch.bid) == before
    assert raw(zk, f"/jobs/{job.jid}/priority") == b"5"


def test_move_whose_job_index_entry_cannot_be_created_changes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    # An ephemeral node cannot have children: the create inside the transaction fails.
    zk.delete("/jobs/states/held")
    other_zk.create("/jobs/states/held", b"", ephemeral=True)
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_transition(zk, job, "Held")
    assert tree(zk, batch.bid) == before
    assert_indexed(zk, job, batch.bid, "Pending")


def test_move_whose_batch_index_entry_cannot_be_created_changes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Downloading")
    zk.delete(f"/batches/{batch.bid}/states/batch-failed")
    other_zk.create(f"/batches/{batch.bid}/states/batch-failed", b"", ephemeral=True)
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_transition(zk, job, "Failed", message="download failed")
    assert tree(zk, batch.bid) == before
    assert_indexed(zk, job, batch.bid, "Downloading")


def test_stale_delete_is_refused_and_removes_nothing(
    zk: KazooClient, other_zk: KazooClient, job: Job, batch: Batch
) -> None:
    failed = jobs.job_transition(zk, job, "Failed")
    set_job_nodes(other_zk, failed, identifiers={"primary_id": "", "local_id": []})
    jobs.job_transition(other_zk, jobs.job_load(other_zk, job.jid), "Estimating", admin=True)
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_remove(zk, failed)
    assert tree(zk, batch.bid) == before


def test_failed_job_creation_leaves_no_job_behind(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    existing = make_job()
    # The next sequential ID is predictable; take its batch-index entry so the transaction fails.
    blocker = f"/batches/{batch.bid}/states/batch-processing/jid{int(existing.jid[3:]) + 1:010d}"
    zk.create(blocker, b"taken")
    before = snapshot(zk, "/jobs/states", f"/batches/{batch.bid}", "/batch-uuids")
    with pytest.raises(Conflict):
        jobs.job_create(zk, bid=batch.bid, configuration={"profile": "p"})
    assert snapshot(zk, "/jobs/states", f"/batches/{batch.bid}", "/batch-uuids") == before
    assert sorted(zk.get_children("/jobs")) == [existing.jid, "states"]


def test_services_refuse_a_page_rendered_from_an_old_version(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    version = job.status.version
    jobs.job_transition(zk, job, "Held")
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict, match="reload"):
        moves.job_release(jid=job.jid, expect_version=version)
    assert tree(zk, batch.bid) == before


def test_batch_creation_that_fails_leaves_no_batch_node(zk: KazooClient, batch: Batch) -> None:
    before = snapshot(zk, "/batches", "/batch-uuids")
    with pytest.raises(Conflict):
        batches.batch_create(zk, submission={"profile": "p", "batchID": batch.uuid})
    assert snapshot(zk, "/batches", "/batch-uuids") == {
        **before,
        "/batches": (b"", before["/batches"][1], before["/batches"][2] + 2),
    }


def test_retried_move_that_already_landed_counts_as_done(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    first = jobs.job_transition(zk, job, "Estimating", message="estimating")
    before = tree(zk, batch.bid)
    again = jobs.job_transition(zk, job, "Estimating", message="estimating")
    assert tree(zk, batch.bid) == before
    assert again.status.raw == first.status.raw
    assert again.status.version == 1


def test_retried_move_with_a_different_outcome_is_a_conflict(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    jobs.job_transition(zk, job, "Estimating", message="estimating")
    before = tree(zk, batch.bid)
    with pytest.raises(Conflict):
        jobs.job_transition(zk, job, "Estimating", message="another estimate")
    assert tree(zk, batch.bid) == before


def test_removing_a_job_removes_its_storage_add_record_with_it(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    storing = walk_job(zk, job, "Storing")
    assert lock_create(zk, job_node(job.jid, "lock"))
    store_intent_record(
        zk,
        storing,
        manifest_url="http://work.example.org/manifest.txt",
        manifest_sha256="0" * 64,
        node="9501",
        ark="ark:/99999/fk4test",
        replace=False,
    )
    lock_release(zk, job_node(job.jid, "lock"))
    failed = jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Failed", message="storage down")
    assert store_intent_read(zk, job.jid) is not None

    jobs.job_remove(zk, failed)

    assert zk.exists(store_intent_path(job.jid)) is None
    assert zk.exists(f"/jobs/{job.jid}") is None
