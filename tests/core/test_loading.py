"""Reading items: missing and malformed nodes give clear errors; listings skip and flag them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from queues.zk import access, batches, jobs
from queues.zk.errors import InvalidID, InvalidTransition, MalformedNode, NotFound
from queues.zk.records import Batch, Broken, Job


def test_missing_job_is_not_found(zk: KazooClient) -> None:
    with pytest.raises(NotFound, match="jid0000000042"):
        jobs.job_load(zk, "jid0000000042")


def test_half_created_job_is_not_found_naming_the_missing_nodes(zk: KazooClient) -> None:
    zk.create("/jobs/jid0000000042", b"")
    zk.create("/jobs/jid0000000042/bid", b"bid0000000001")
    with pytest.raises(NotFound, match="/jobs/jid0000000042/status"):
        jobs.job_load(zk, "jid0000000042")


@pytest.mark.parametrize(
    ("node", "data"),
    [
        ("status", b"not json"),
        ("status", b"[1, 2]"),
        ("status", b""),
        ("configuration", b"{"),
        ("priority", b"x"),
        ("priority", b""),
        ("bid", b"../../etc"),
        ("bid", b"\xff\xfe"),
    ],
)
def test_malformed_node_is_named_by_its_path(
    zk: KazooClient, job: Job, node: str, data: bytes
) -> None:
    path = f"/jobs/{job.jid}/{node}"
    zk.set(path, data)
    with pytest.raises(MalformedNode) as caught:
        jobs.job_load(zk, job.jid)
    assert caught.value.path == path
    assert path in str(caught.value)


@pytest.mark.parametrize("node", ["identifiers", "metadata", "inventory", "store", "space_needed"])
def test_malformed_optional_node_is_reported_but_the_job_loads(
    zk: KazooClient, job: Job, node: str
) -> None:
    path = f"/jobs/{job.jid}/{node}"
    if zk.exists(path):
        zk.set(path, b"lots")
    else:
        zk.create(path, b"{broken")
    loaded = jobs.job_load(zk, job.jid)
    assert path in loaded.problems
    assert loaded.state == "Pending"


def test_job_without_space_needed_loads_as_zero(zk: KazooClient, job: Job) -> None:
    zk.delete(f"/jobs/{job.jid}/space_needed")
    assert jobs.job_load(zk, job.jid).space_needed == 0


def test_job_listing_skips_half_created_and_flags_malformed_jobs(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    good, bad_status, bad_priority = make_job(), make_job(), make_job()
    zk.set(f"/jobs/{bad_status.jid}/status", b"not json")
    zk.set(f"/jobs/{bad_priority.jid}/priority", b"x")
    half = "jid0000000999"
    zk.create(f"/jobs/{half}", b"")
    zk.create(f"/jobs/{half}/bid", b"bid0000000000")
    empty = "jid0000000998"
    zk.create(f"/jobs/{empty}", b"")
    listed = jobs.jobs_load(
        zk, [good.jid, bad_status.jid, half, bad_priority.jid, empty, "jid0000000997"]
    )
    assert [type(item).__name__ for item in listed] == ["Job", "Broken", "Broken"]
    assert listed[0] == jobs.job_load(zk, good.jid)
    assert listed[1] == Broken(
        "job",
        bad_status.jid,
        f"/jobs/{bad_status.jid}/status",
        listed[1].reason,
    )
    assert "JSON" in listed[1].reason
    assert isinstance(listed[2], Broken) and listed[2].path == f"/jobs/{bad_priority.jid}/priority"


def test_job_in_an_unknown_state_loads_and_refuses_to_move(zk: KazooClient, job: Job) -> None:
    zk.set(f"/jobs/{job.jid}/status", b'{"status":"Quarantined","retry_count":"two"}')
    loaded = jobs.job_load(zk, job.jid)
    assert loaded.state == "Quarantined"
    assert loaded.status.retry_count == 0
    assert loaded.status.last_modified == loaded.status.mtime
    with pytest.raises(InvalidTransition, match="unknown current state"):
        jobs.job_transition(zk, loaded, "Estimating")


def test_status_without_a_state_name_loads_as_unknown(zk: KazooClient, job: Job) -> None:
    zk.set(f"/jobs/{job.jid}/status", b'{"status":5}')
    assert jobs.job_load(zk, job.jid).state == "?"


def test_listing_with_a_malformed_id_is_refused(zk: KazooClient) -> None:
    with pytest.raises(InvalidID):
        jobs.jobs_load(zk, ["jid0000000001", "../batches"])


def test_missing_batch_is_not_found(zk: KazooClient) -> None:
    with pytest.raises(NotFound, match="bid0000000042"):
        batches.batch_load(zk, "bid0000000042")


def test_batch_listing_skips_half_created_and_flags_malformed_batches(
    zk: KazooClient, make_batch: Callable[..., Batch]
) -> None:
    good, bad = make_batch(), make_batch()
    zk.set(f"/batches/{bad.bid}/status", b"not json")
    zk.create("/batches/bid0000000999", b"")
    zk.create("/batches/bid0000000999/submission", b"{}")
    listed = batches.batches_load(zk, batches.batch_ids(zk))
    assert [getattr(i, "bid", None) or i.id for i in listed] == [good.bid, bad.bid]
    assert isinstance(listed[1], Broken)
    assert listed[1].path == f"/batches/{bad.bid}/status"
    with pytest.raises(MalformedNode, match=f"/batches/{bad.bid}/status"):
        batches.batch_load(zk, bad.bid)
    with pytest.raises(NotFound):
        batches.batch_load(zk, "bid0000000999")


def test_malformed_status_report_is_reported_but_the_batch_loads(
    zk: KazooClient, batch: Batch
) -> None:
    zk.create(f"/batches/{batch.bid}/status-report", b"oops")
    loaded = batches.batch_load(zk, batch.bid)
    assert loaded.report is None
    assert f"/batches/{batch.bid}/status-report" in loaded.problems


def test_batch_states_skips_unreadable_batches(
    zk: KazooClient, make_batch: Callable[..., Batch]
) -> None:
    good, bad = make_batch(), make_batch()
    zk.set(f"/batches/{bad.bid}/status", b"\x00")
    assert batches.batch_states(zk, [good.bid, bad.bid, "bid0000000999"]) == {good.bid: "Pending"}


def test_unknown_batch_uuid_is_not_found(zk: KazooClient) -> None:
    with pytest.raises(NotFound):
        batches.batch_id_for_uuid(zk, "6f1c2a4e-0000-4000-8000-000000000000")


def test_access_listing_skips_half_created_and_flags_malformed_requests(zk: KazooClient) -> None:
    good = access.access_create(zk, queue="small", token={"token": "a"})
    bad = access.access_create(zk, queue="small", token={"token": "b"})
    zk.set(f"/access/small/{bad.qid}/token", b"not json")
    zk.create("/access/small/qid0000000999", b"")
    listed = access.accesses_load(zk, "small", access.access_ids(zk, "small"))
    assert [type(i).__name__ for i in listed] == ["AccessRequest", "Broken"]
    assert listed[0] == access.access_load(zk, "small", good.qid)
    assert listed[1].path == f"/access/small/{bad.qid}/token"
    with pytest.raises(MalformedNode):
        access.access_load(zk, "small", bad.qid)
    with pytest.raises(NotFound):
        access.access_load(zk, "small", "qid0000000999")
    assert access.access_acquire(zk, "small").qid == good.qid
    assert access.access_acquire(zk, "small") is None


def test_acquire_skips_a_malformed_job_and_leaves_it_unlocked(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    broken, good = make_job(), make_job()
    zk.set(f"/jobs/{broken.jid}/configuration", b"[]")
    acquired = jobs.job_acquire(zk, "Pending")
    assert acquired is not None and acquired.jid == good.jid
    assert zk.exists(f"/jobs/{broken.jid}/lock") is None
