"""Nodes written by another client with garbage in them: listings show the item as broken or skip
it, the consistency check names the node, and every service refuses with a clear domain error
instead of crashing or writing anything; but an admin's delete naming no status version removes a
job that cannot be read."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues.operator.check import run_check
from queues.services import moves
from queues.zk.access import access_create, accesses_load
from queues.zk.batches import batch_create, batches_load
from queues.zk.errors import DomainError
from queues.zk.jobs import job_acquire, job_create, jobs_load
from queues.zk.records import AccessRequest, Batch, Broken, Job

GARBAGE = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe\x00garbage", id="binary"),
    pytest.param(b"[1, 2, 3]", id="json-list"),
    pytest.param(b"[" * 20_000, id="deep-nesting"),
]
REQUIRED_JOB_NODES = ["status", "configuration", "priority", "bid"]
OPTIONAL_JOB_NODES = ["identifiers", "metadata", "space_needed"]


@pytest.fixture
def job(zk: KazooClient) -> Job:
    batch = batch_create(zk, submission={"profile": "garbage_test", "submitter": "tester"})
    return job_create(
        zk,
        bid=batch.bid,
        configuration={"profile": "garbage_test", "submitter": "tester"},
        identifiers={"primary_id": "", "local_id": ["x"]},
        metadata={"erc_what": "x"},
    )


def _snapshot(zk: KazooClient) -> dict[str, bytes]:
    """Every node under the chroot with its data, to prove nothing was written."""
    found: dict[str, bytes] = {}

    def walk(path: str) -> None:
        data, _stat = zk.get(path)
        found[path] = data
        for kid in zk.get_children(path):
            walk(f"{path.rstrip('/')}/{kid}")

    walk("/")
    return found


def _refused_by_every_job_service(zk: KazooClient, jid: str) -> None:
    before = _snapshot(zk)
    for action in (
        lambda: moves.job_hold(jid=jid),
        lambda: moves.job_release(jid=jid),
        lambda: moves.job_resume(jid=jid),
        lambda: moves.job_fail(jid=jid, message="x"),
        # A version is a page's or a client's view of the job from before it became unreadable.
        lambda: moves.job_delete(jid=jid, expect_version=0),
    ):
        with pytest.raises(DomainError) as caught:
            action()
        # Said in words a person can act on: the broken node, or the state that forbids it.
        assert jid in str(caught.value) or "state" in str(caught.value)
    assert _snapshot(zk) == before


@pytest.mark.parametrize("node", REQUIRED_JOB_NODES)
@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_in_a_required_job_node_makes_a_broken_job(
    zk: KazooClient, job: Job, node: str, data: bytes
) -> None:
    path = f"/jobs/{job.jid}/{node}"
    zk.set(path, data)

    [item] = jobs_load(zk, [job.jid])
    assert isinstance(item, Broken)
    assert item.path == path

    report = run_check(zk)
    assert ("malformed-node", path) in {(f.kind, f.path) for f in report.findings}

    _refused_by_every_job_service(zk, job.jid)
    assert job_acquire(zk, "Pending") is None
    assert zk.exists(f"/jobs/{job.jid}/lock") is None

    outcome = moves.job_delete(jid=job.jid)
    assert (outcome.before, outcome.after) == (moves.UNREADABLE, moves.REMOVED)
    assert zk.exists(f"/jobs/{job.jid}") is None
    assert job.index_path.rsplit("/", 1)[1] not in zk.get_children("/jobs/states/pending")


@pytest.mark.parametrize("node", OPTIONAL_JOB_NODES)
@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_in_an_optional_job_node_is_reported_and_the_job_still_loads(
    zk: KazooClient, job: Job, node: str, data: bytes
) -> None:
    path = f"/jobs/{job.jid}/{node}"
    zk.set(path, data)

    [item] = jobs_load(zk, [job.jid])
    if node == "space_needed" and data == b"":
        # An empty integer node reads as nothing needed: a value, not a problem.
        assert isinstance(item, Job)
        return
    assert isinstance(item, Job)
    assert path in item.problems
    assert path in {f.path for f in run_check(zk).findings}


@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_status_in_a_batch_makes_a_broken_batch(zk: KazooClient, data: bytes) -> None:
    batch = batch_create(zk, submission={"profile": "garbage_test", "submitter": "tester"})
    path = f"/batches/{batch.bid}/status"
    zk.set(path, data)

    [item] = batches_load(zk, [batch.bid])
    assert isinstance(item, Broken)
    assert path in {f.path for f in run_check(zk).findings}
    before = _snapshot(zk)
    for action in (
        lambda: moves.batch_release(bid=batch.bid),
        lambda: moves.batch_update_reporting(bid=batch.bid),
        lambda: moves.batch_delete(bid=batch.bid),
    ):
        with pytest.raises(DomainError):
            action()
    assert _snapshot(zk) == before


@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_status_report_is_reported_and_the_batch_still_loads(
    zk: KazooClient, data: bytes
) -> None:
    batch = batch_create(zk, submission={"profile": "garbage_test", "submitter": "tester"})
    path = f"/batches/{batch.bid}/status-report"
    zk.create(path, data)

    [item] = batches_load(zk, [batch.bid])
    if data == b"":
        assert isinstance(item, Batch)
        return
    assert isinstance(item, Batch)
    assert path in item.problems
    assert path in {f.path for f in run_check(zk).findings}


@pytest.mark.parametrize("node", ["status", "token"])
@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_in_an_access_request_makes_it_broken(
    zk: KazooClient, node: str, data: bytes
) -> None:
    request = access_create(zk, queue="small", token={"token": "t"})
    zk.set(f"/access/small/{request.qid}/{node}", data)

    [item] = accesses_load(zk, "small", [request.qid])
    if (node, data) == ("token", b""):  # Merritt's libraries write and read it: an empty token
        assert isinstance(item, AccessRequest) and item.token == {}
        return
    assert isinstance(item, Broken)
    before = _snapshot(zk)
    with pytest.raises(DomainError):
        moves.access_delete(queue="small", qid=request.qid)
    assert _snapshot(zk) == before


@pytest.mark.parametrize(
    "status",
    [
        b'{"status": 42}',
        b'{"status": "Bogus", "retry_count": "many", "last_successful_status": []}',
        b'{"no_status": true}',
    ],
)
def test_well_formed_status_with_nonsense_values_is_refused_by_the_state_machine(
    zk: KazooClient, job: Job, status: bytes
) -> None:
    zk.set(f"/jobs/{job.jid}/status", status)

    [item] = jobs_load(zk, [job.jid])
    assert isinstance(item, Job)
    kinds = {f.kind for f in run_check(zk).findings}
    assert "unknown-state" in kinds
    _refused_by_every_job_service(zk, job.jid)


def test_garbage_names_in_state_folders_are_reported_and_skipped(zk: KazooClient, job: Job) -> None:
    for name in ("garbage", "5-jid1", "05-jid0000000001-extra", "99-jid9999999999"):
        zk.create(f"/jobs/states/pending/{name}", b"\xff")

    kinds = {(f.kind, f.path.rsplit("/", 1)[1]) for f in run_check(zk).findings}
    assert ("bad-index-name", "garbage") in kinds
    assert ("bad-index-name", "5-jid1") in kinds
    assert ("bad-index-name", "05-jid0000000001-extra") in kinds
    assert ("orphan-index", "99-jid9999999999") in kinds
    acquired = job_acquire(zk, "Pending")
    assert acquired is not None
    assert acquired.jid == job.jid


def test_a_garbage_id_never_reaches_zookeeper(zk: KazooClient) -> None:
    before = _snapshot(zk)
    for bad in ("../../zookeeper", "jid0000000001/lock", "jid1", "", "jid0000000001\n"):
        with pytest.raises(DomainError):
            moves.job_resume(jid=bad)
        with pytest.raises(DomainError):
            moves.batch_delete(bid=bad)
    with pytest.raises(DomainError):
        moves.access_delete(queue="../small", qid="qid0000000001")
    assert _snapshot(zk) == before
