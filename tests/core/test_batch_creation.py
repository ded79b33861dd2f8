"""Creating a batch: the sequential ID, the submission, the status and the uuid index."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient

from queues.zk import batches, jobs
from queues.zk.errors import Conflict, InvalidID

from .helpers import BID_RE, assert_batch_status, raw, read_json

SUBMISSION = {
    "profile": "ucb_lib_test",
    "submitter": "dpr/Ada Lovelace",
    "payload_url": "https://example.org/payload.zip",
    "type": "container",
}


def test_batch_gets_a_sequential_id_from_zookeeper(zk: KazooClient) -> None:
    first = batches.batch_create(zk, submission=SUBMISSION)
    second = batches.batch_create(zk, submission=SUBMISSION)
    assert BID_RE.fullmatch(first.bid) and BID_RE.fullmatch(second.bid)
    assert int(second.bid[3:]) == int(first.bid[3:]) + 1
    assert raw(zk, f"/batches/{first.bid}") == b""


def test_batch_submission_is_compact_json_with_its_uuid(zk: KazooClient) -> None:
    created = batches.batch_create(zk, submission=SUBMISSION)
    submission = read_json(zk, f"/batches/{created.bid}/submission")
    batch_uuid = submission.pop("batchID")
    # As Merritt's ingest names batches: "bid-" and a UUID.
    assert batch_uuid.startswith("bid-") and uuid.UUID(batch_uuid.removeprefix("bid-"))
    assert submission == SUBMISSION
    assert created.uuid == batch_uuid


def test_batch_keeps_a_given_uuid(zk: KazooClient) -> None:
    given = str(uuid.uuid4())
    created = batches.batch_create(zk, submission={**SUBMISSION, "batchID": given})
    assert read_json(zk, f"/batches/{created.bid}/submission")["batchID"] == given
    assert raw(zk, f"/batch-uuids/{given}") == created.bid.encode()


def test_new_batch_is_pending_with_an_empty_message(zk: KazooClient) -> None:
    created = batches.batch_create(zk, submission=SUBMISSION)
    assert_batch_status(zk, created.bid, status="Pending")
    assert created.state == "Pending"
    assert created.status.version == 0


def test_batch_uuid_index_holds_the_bid_as_raw_text(zk: KazooClient) -> None:
    created = batches.batch_create(zk, submission=SUBMISSION)
    assert raw(zk, f"/batch-uuids/{created.uuid}") == created.bid.encode("ascii")
    assert batches.batch_id_for_uuid(zk, created.uuid) == created.bid


def test_batch_has_no_states_child_until_jobs_exist(zk: KazooClient) -> None:
    created = batches.batch_create(zk, submission=SUBMISSION)
    assert sorted(zk.get_children(f"/batches/{created.bid}")) == ["status", "submission"]
    assert created.started is False
    jobs.job_create(zk, bid=created.bid, configuration={"profile": "ucb_lib_test"})
    assert zk.exists(f"/batches/{created.bid}/states") is not None
    assert batches.batch_load(zk, created.bid).started is True


def test_batch_with_a_uuid_already_in_use_is_refused_and_leaves_nothing(zk: KazooClient) -> None:
    given = str(uuid.uuid4())
    first = batches.batch_create(zk, submission={**SUBMISSION, "batchID": given})
    with pytest.raises(Conflict):
        batches.batch_create(zk, submission={**SUBMISSION, "batchID": given})
    assert batches.batch_ids(zk) == [first.bid]
    assert raw(zk, f"/batch-uuids/{given}") == first.bid.encode()


def test_batch_with_a_malformed_uuid_is_refused_before_any_write(zk: KazooClient) -> None:
    with pytest.raises(InvalidID):
        batches.batch_create(zk, submission={**SUBMISSION, "batchID": "../../jobs"})
    assert zk.get_children("/batches") == []
