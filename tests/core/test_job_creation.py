"""Creating a job: every node of the contract and both index entries, or nothing at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.zk import jobs
from queues.zk.errors import InvalidID, NotFound
from queues.zk.locks import lock_create
from queues.zk.records import Batch, Job

from .helpers import JID_RE, assert_indexed, assert_job_status, raw, read_json

CONFIGURATION = {
    "profile": "ucb_lib_test",
    "submitter": "dpr/Ada Lovelace",
    "payload_url": "https://example.org/object.zip",
    "type": "container",
    "localID": "loc001",
}


def test_job_gets_a_sequential_id_from_zookeeper(zk: KazooClient, batch: Batch) -> None:
    first = jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION)
    second = jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION)
    assert JID_RE.fullmatch(first.jid) and JID_RE.fullmatch(second.jid)
    assert int(second.jid[3:]) == int(first.jid[3:]) + 1
    assert raw(zk, f"/jobs/{first.jid}") == b""


def test_job_nodes_have_the_contract_encodings(zk: KazooClient, batch: Batch) -> None:
    job = jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION)
    base = f"/jobs/{job.jid}"
    assert sorted(zk.get_children(base)) == [
        "bid",
        "configuration",
        "priority",
        "space_needed",
        "status",
    ]
    assert raw(zk, f"{base}/bid") == batch.bid.encode()
    assert raw(zk, f"{base}/priority") == b"5"
    assert raw(zk, f"{base}/space_needed") == b"0"
    assert read_json(zk, f"{base}/configuration") == CONFIGURATION
    assert_job_status(zk, job.jid, status="Pending", last_successful=None)


def test_job_writes_identifiers_and_metadata_when_given(zk: KazooClient, batch: Batch) -> None:
    identifiers = {"primary_id": "ark:/99999/fk4abc", "local_id": ["loc001"]}
    metadata = {"erc_who": "Lovelace", "erc_what": "Notes", "erc_when": "1843", "erc_where": ""}
    job = jobs.job_create(
        zk,
        bid=batch.bid,
        configuration=CONFIGURATION,
        identifiers=identifiers,
        metadata=metadata,
    )
    assert read_json(zk, f"/jobs/{job.jid}/identifiers") == identifiers
    assert read_json(zk, f"/jobs/{job.jid}/metadata") == metadata
    assert job.primary_id == "ark:/99999/fk4abc"
    assert job.local_ids == ["loc001"]


def test_new_job_is_indexed_as_pending_in_the_queue_and_its_batch(
    zk: KazooClient, batch: Batch
) -> None:
    job = jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION)
    assert zk.get_children("/jobs/states/pending") == [f"05-{job.jid}"]
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-processing") == [job.jid]
    assert_indexed(zk, job, batch.bid, "Pending")


def test_job_created_with_a_priority_is_indexed_under_it(zk: KazooClient, batch: Batch) -> None:
    job = jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION, priority=0)
    assert raw(zk, f"/jobs/{job.jid}/priority") == b"0"
    assert_indexed(zk, job, batch.bid, "Pending", priority=0)


def test_job_in_a_missing_batch_fails_and_leaves_no_node(zk: KazooClient) -> None:
    with pytest.raises(NotFound, match="/batches/bid0000009999"):
        jobs.job_create(zk, bid="bid0000009999", configuration=CONFIGURATION)
    assert zk.get_children("/jobs") == ["states"]
    assert zk.exists("/batches/bid0000009999") is None
    assert not zk.exists("/jobs/states/pending") or zk.get_children("/jobs/states/pending") == []


def test_job_with_a_malformed_batch_id_is_refused_before_any_write(zk: KazooClient) -> None:
    with pytest.raises(InvalidID):
        jobs.job_create(zk, bid="bid12/../x", configuration=CONFIGURATION)
    assert zk.get_children("/jobs") == ["states"]


@pytest.mark.parametrize("priority", [-1, 100, "5"])
def test_job_with_a_priority_outside_0_to_99_is_refused(
    zk: KazooClient, batch: Batch, priority: object
) -> None:
    with pytest.raises(ValueError):
        jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION, priority=priority)
    assert zk.get_children("/jobs") == ["states"]


def test_loaded_job_matches_what_was_written(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch
) -> None:
    job = make_job()
    loaded = jobs.job_load(zk, job.jid)
    assert loaded == job
    assert loaded.bid == batch.bid
    assert loaded.priority == 5
    assert loaded.space_needed == 0
    assert loaded.state == "Pending"
    assert loaded.profile == "ucb_lib_test"
    assert loaded.lock is None


def test_optional_json_nodes_are_written_later_as_compact_json(zk: KazooClient, job: Job) -> None:
    assert lock_create(zk, f"/jobs/{job.jid}/lock")  # written by the holder of the job's lock
    job = jobs.job_set_json(zk, job, "identifiers", {"primary_id": "", "local_id": ["a"]})
    job = jobs.job_set_json(zk, job, "identifiers", {"primary_id": "ark:/1/b", "local_id": ["a"]})
    jobs.job_set_json(zk, job, "store", {"manifest_url": "https://x/m", "mode": "add"})
    assert read_json(zk, f"/jobs/{job.jid}/identifiers")["primary_id"] == "ark:/1/b"
    assert read_json(zk, f"/jobs/{job.jid}/store") == {"manifest_url": "https://x/m", "mode": "add"}
    assert jobs.job_load(zk, job.jid).primary_id == "ark:/1/b"
    with pytest.raises(ValueError):
        jobs.job_set_json(zk, job, "status", {"status": "Completed"})


def test_space_needed_is_rewritten_as_plain_integer(zk: KazooClient, job: Job) -> None:
    assert lock_create(zk, f"/jobs/{job.jid}/lock")
    jobs.job_set_space_needed(zk, job, 123456789012)
    assert raw(zk, f"/jobs/{job.jid}/space_needed") == b"123456789012"
    with pytest.raises(ValueError):
        jobs.job_set_space_needed(zk, job, -1)
    assert raw(zk, f"/jobs/{job.jid}/space_needed") == b"123456789012"
