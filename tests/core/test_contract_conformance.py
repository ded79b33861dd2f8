"""Conformance with the contract page, point by point (issue 11), read back through
``library_reader``: a reader that applies Merritt's library rules to the raw tree."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from kazoo.client import KazooClient

from queues.core.states import ACCESS, BATCH, JOB, REMOVE
from queues.operator import check, check_repairs
from queues.services import moves
from queues.zk import access, batches, jobs, paths
from queues.zk.codecs import encode_json, now_stamp
from queues.zk.errors import InvalidID, InvalidTransition
from queues.zk.priorities import priority_set_waiting
from queues.zk.records import Batch, Job

from . import library_reader as lib
from .conftest import OPS
from .helpers import compact, raw, read_json

TOKEN = {
    "token": "c2a1",
    "delivery-node": 7777,
    "cloud-content-byte": 2048,
    "status": 201,
    "url": "https://example.org/downloads/c2a1",
    "anticipated-availability-time": "2026-11-21 10:02:03 -0800",
}


# ``manage.py queue`` moves as a console user, and a destructive move says why.
AS_OPS = ("--user", OPS, "--reason", "conformance test")


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def submission(**extra: str) -> dict[str, str]:
    return {"profile": "ucb_lib_test", "submitter": "dpr/Ada", "type": "file", **extra}


# 1. Batch IDs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch_id",
    [
        # As Merritt's ingest writes them. Fixed: pytest-xdist's workers must each collect the
        # same test names, and a batch ID is in the name.
        "bid-191f0e59-cafe-4ee6-bad4-1e28bd55ec25",
        "ca363741-44e8-4f8c-83d8-c96b9f406864",
        "scans-2026",
        "Scans of 1906, box 3 (ü)",
        "x" * 200,
        "...",
    ],
)
def test_any_safe_batch_id_is_accepted_and_indexed(zk: KazooClient, batch_id: str) -> None:
    created = batches.batch_create(zk, submission=submission(batchID=batch_id))
    assert raw(zk, f"/batch-uuids/{batch_id}") == created.bid.encode()
    assert batches.batch_id_for_uuid(zk, batch_id) == created.bid
    assert lib.read_batch(zk, created.bid).submission["batchID"] == batch_id


@pytest.mark.parametrize(
    ("batch_id", "reason"),
    [
        ("", "non-empty"),
        ("/", "slash"),
        ("a/b", "slash"),
        (".", "not a node name"),
        ("..", "not a node name"),
        ("line\nbreak", "control character U+000A"),
        ("nul\x00", "control character U+0000"),
        ("tab\there", "control character U+0009"),
        ("del\x7f", "control character U+007F"),
        ("c1\x85", "control character U+0085"),
        ("x" * 201, "at most 200"),
    ],
)
def test_unsafe_batch_ids_are_refused_with_the_reason(
    zk: KazooClient, batch_id: str, reason: str
) -> None:
    with pytest.raises(InvalidID, match=re.escape(reason)):
        batches.batch_create(zk, submission=submission(batchID=batch_id))
    assert batches.batch_ids(zk) == []
    assert zk.get_children("/batch-uuids") == []


def test_the_submit_service_uses_the_same_validator(zk: KazooClient, tmp_path) -> None:
    payload = tmp_path / "a.txt"
    payload.write_text("a")
    common = {
        "profile": "merritt_demo_content",
        "submitter": "dpr/Ada",
        "payload_url": payload.as_uri(),
    }
    with pytest.raises(InvalidID, match="slash"):
        moves.batch_submit(**common, extra={"batchID": "a/b"})
    bid = moves.batch_submit(**common, extra={"batchID": "bid-from-a-script"})
    assert raw(zk, "/batch-uuids/bid-from-a-script") == bid.encode()
    for bad in ("a/b", "..", "\x01", "y" * 201, ""):
        assert not paths.is_batch_uuid(bad)
        with pytest.raises(InvalidID):
            paths.uuid_entry(bad)


def test_batch_delete_removes_the_uuid_entry_whatever_its_format(zk: KazooClient) -> None:
    batch_id = f"bid-{uuid.uuid4()}"
    batch = batches.batch_create(zk, submission=submission(batchID=batch_id))
    batch = batches.batch_transition(zk, batch, "Held")
    moves.batch_delete(bid=batch.bid)
    assert zk.exists(f"/batch-uuids/{batch_id}") is None


def test_batch_delete_leaves_a_uuid_entry_that_names_another_batch(zk: KazooClient) -> None:
    first = batches.batch_create(zk, submission=submission(batchID="shared-name"))
    zk.delete("/batch-uuids/shared-name")
    second = batches.batch_create(zk, submission=submission(batchID="shared-name"))
    batches.batch_transition(zk, first, "Held")
    moves.batch_delete(bid=first.bid)
    assert raw(zk, "/batch-uuids/shared-name") == second.bid.encode()


# 2. Per-object locks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ark", "name"),
    [
        ("ark:/13030/m5abc", "ark_13030_m5abc"),
        ("ark:/99999/fk4/x/y", "ark_99999_fk4_x_y"),
        ("ark:13030/m5abc", "ark:13030_m5abc"),
    ],
)
def test_per_object_lock_names_follow_the_regular_expression(ark: str, name: str) -> None:
    assert paths.object_lock_name(ark) == lib.object_lock_name(ark) == name
    assert paths.storage_lock(ark) == f"/locks/storage/{name}"
    assert paths.inventory_lock(ark) == f"/locks/inventory/{name}"


def test_locks_in_the_old_form_are_reported_and_persistent_ones_repaired(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    zk.ensure_path("/locks/storage")
    zk.ensure_path("/locks/inventory")
    zk.create("/locks/storage/ark__13030_m5old", b"")  # left over: persistent
    other_zk.create("/locks/inventory/ark__13030_m5busy", b"", ephemeral=True)  # at work
    zk.create(paths.storage_lock("ark:/13030/m5new"), b"", ephemeral=True)  # the contract's
    report = check.run_check(zk)
    found = {f.path: f for f in report.findings if f.kind == "legacy-object-lock"}
    assert set(found) == {"/locks/storage/ark__13030_m5old", "/locks/inventory/ark__13030_m5busy"}
    assert found["/locks/storage/ark__13030_m5old"].repairable
    assert "/locks/storage/ark_13030_m5old" in found["/locks/storage/ark__13030_m5old"].detail
    assert not found["/locks/inventory/ark__13030_m5busy"].repairable
    assert "session" in found["/locks/inventory/ark__13030_m5busy"].detail
    lines = check_repairs.repair(zk, report)
    assert "deleted /locks/storage/ark__13030_m5old" in lines
    assert zk.exists("/locks/storage/ark__13030_m5old") is None
    assert zk.exists("/locks/inventory/ark__13030_m5busy") is not None
    assert zk.exists("/locks/storage/ark_13030_m5new") is not None


# 3. The batch states marker ---------------------------------------------------------------------


def _marker_written_with_status(zk: KazooClient, bid: str) -> bool:
    """The states marker was created by the very transaction that last wrote the status."""
    marker = zk.exists(f"/batches/{bid}/states")
    status = zk.exists(f"/batches/{bid}/status")
    return marker is not None and marker.czxid == status.mzxid


def test_a_new_batch_has_no_states_marker(zk: KazooClient, batch: Batch) -> None:
    assert zk.exists(f"/batches/{batch.bid}/states") is None
    assert not lib.read_batch(zk, batch.bid).started


@pytest.mark.parametrize("target", ["Processing", "Held"])
def test_first_move_out_of_pending_creates_the_marker_in_its_transaction(
    zk: KazooClient, batch: Batch, target: str
) -> None:
    moved = batches.batch_transition(zk, batch, target)
    assert _marker_written_with_status(zk, batch.bid)
    assert moved.started and batches.batch_load(zk, batch.bid).started
    assert lib.read_batch(zk, batch.bid).started


def test_the_marker_stays_through_a_release_and_is_not_written_again(
    zk: KazooClient, batch: Batch
) -> None:
    held = batches.batch_transition(zk, batch, "Held")
    created = zk.exists(f"/batches/{batch.bid}/states").czxid
    pending = batches.batch_transition(zk, held, "Pending", admin=True)
    lib.read_batch(zk, batch.bid)
    batches.batch_transition(zk, pending, "Processing")
    assert zk.exists(f"/batches/{batch.bid}/states").czxid == created


def test_a_marker_that_jobs_created_already_does_not_stop_the_move(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    job = make_job()  # its index entry lives below states: the marker exists already
    before = zk.exists(f"/batches/{batch.bid}/states")
    assert before is not None
    batches.batch_transition(zk, batch, "Processing")
    assert zk.exists(f"/batches/{batch.bid}/states").czxid == before.czxid
    assert lib.read_batch(zk, batch.bid).jobs["batch-processing"] == [job.jid]
    lib.read_job(zk, job.jid)


def test_a_marker_created_between_the_look_and_the_write_is_not_a_conflict(
    zk: KazooClient, batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_exists = zk.exists

    def exists_then_race(path: str, *args, **kwargs):
        stat = real_exists(path, *args, **kwargs)
        if path == f"/batches/{batch.bid}/states" and stat is None:
            zk.create(path, b"")  # a job created at this moment makes the folder
        return stat

    monkeypatch.setattr(zk, "exists", exists_then_race)
    batches.batch_transition(zk, batch, "Processing")
    monkeypatch.undo()
    assert batches.batch_load(zk, batch.bid).state == "Processing"
    lib.read_batch(zk, batch.bid)


def test_a_started_batch_without_the_marker_is_reported_and_repaired(
    zk: KazooClient, batch: Batch
) -> None:
    # As earlier versions left a batch held before it had jobs.
    zk.set(
        f"/batches/{batch.bid}/status",
        encode_json({"status": "Held", "last_modified": now_stamp(), "message": ""}),
    )
    with pytest.raises(lib.LayoutError, match="states marker"):
        lib.read_batch(zk, batch.bid)
    report = check.run_check(zk)
    assert [(f.kind, f.path, f.repairable) for f in report.findings] == [
        ("batch-states-missing", f"/batches/{batch.bid}/states", True)
    ]
    assert check_repairs.repair(zk, report) == [f"created /batches/{batch.bid}/states"]
    assert lib.read_batch(zk, batch.bid).started
    assert check.run_check(zk).ok


# 4. Deleted -------------------------------------------------------------------------------------


def mark_deleted_like_the_library(zk: KazooClient, job: Job) -> None:
    """What Merritt's library writes when a job is deleted by a state change: the status
    Deleted, its index entries moved, every node left in place."""
    status = dict(job.status.raw, status="Deleted", last_modified=now_stamp(), message="")
    zk.ensure_path("/jobs/states/deleted")
    zk.ensure_path(f"/batches/{job.bid}/states/batch-deleted")
    txn = zk.transaction()
    txn.set_data(f"/jobs/{job.jid}/status", encode_json(status))
    txn.delete(job.index_path)
    txn.delete(job.batch_index_path)
    txn.create(f"/jobs/states/deleted/{job.priority:02d}-{job.jid}", b"")
    txn.create(f"/batches/{job.bid}/states/batch-deleted/{job.jid}", b"")
    assert not any(isinstance(r, Exception) for r in txn.commit())


def mark_status(zk: KazooClient, path: str, state: str) -> None:
    zk.set(path, encode_json({"status": state, "last_modified": now_stamp(), "message": ""}))


def test_deleted_is_a_state_an_admin_can_remove(zk: KazooClient) -> None:
    for machine in (JOB, BATCH, ACCESS):
        assert machine.is_state("Deleted")
        assert machine.actions_for("Deleted") == (REMOVE,)
        assert REMOVE in machine.actions
        assert machine.action_sources(REMOVE) == {"Deleted"}
        assert REMOVE not in machine.actions_for("Completed")
        machine.check_delete("Deleted")  # never "Deleted to Deleted"
    from queues.operator.auth import ACTION_ROLES, ADMIN

    assert {ACTION_ROLES[(k, REMOVE)] for k in ("job", "batch", "access")} == {ADMIN}


def test_a_job_the_library_marked_deleted_loads_shows_and_is_removed(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    job = jobs.job_transition(zk, make_job(), "Failed", message="broken")
    mark_deleted_like_the_library(zk, jobs.job_load(zk, job.jid))
    assert lib.read_job(zk, job.jid).status["status"] == "Deleted"
    loaded = jobs.job_load(zk, job.jid)
    assert loaded.state == "Deleted"
    assert loaded.batch_index_path == f"/batches/{batch.bid}/states/batch-deleted/{job.jid}"
    from queues.console import selectors

    assert selectors.job_state_counts()["Deleted"] == 1
    assert check.run_check(zk).ok
    with pytest.raises(InvalidTransition, match="only an item in Deleted can be removed"):
        moves.job_remove_deleted(jid=make_job().jid)
    outcome = moves.job_remove_deleted(jid=job.jid, expect_version=loaded.status.version)
    assert (outcome.before, outcome.after) == ("Deleted", moves.REMOVED)
    assert zk.exists(f"/jobs/{job.jid}") is None
    assert zk.get_children("/jobs/states/deleted") == []
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-deleted") == []


def test_delete_of_a_deleted_job_removes_it_instead_of_failing(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    job = make_job()
    mark_deleted_like_the_library(zk, job)
    out = run("queue", "delete", job.jid, *AS_OPS)
    assert out.strip() == f"job {job.jid}: Deleted -> removed (was marked Deleted; batch {job.bid})"
    assert zk.exists(f"/jobs/{job.jid}") is None


def test_deleted_batches_and_access_requests_are_removed_by_delete_and_remove(
    zk: KazooClient, make_batch: Callable[..., Batch], make_job: Callable[..., Job], ops: Any
) -> None:
    deleted = make_batch()
    job = make_job(bid=deleted.bid)
    deleted = batches.batch_transition(zk, deleted, "Held")
    mark_status(zk, f"/batches/{deleted.bid}/status", "Deleted")
    mark_deleted_like_the_library(zk, job)
    lib.read_batch(zk, deleted.bid)
    assert run("queue", "remove", deleted.bid, *AS_OPS).strip() == (
        f"batch {deleted.bid}: Deleted -> removed (1 jobs deleted)"
    )
    assert deleted.bid not in batches.batch_ids(zk) and zk.exists(f"/jobs/{job.jid}") is None

    other = batches.batch_transition(zk, make_batch(), "Held")
    mark_status(zk, f"/batches/{other.bid}/status", "Deleted")
    out = run("queue", "delete", other.bid, *AS_OPS)
    assert out.strip().endswith("Deleted -> removed (0 jobs deleted)")

    for action in ("delete", "remove"):
        item = access.access_create(zk, queue="small", token=TOKEN)
        mark_status(zk, f"/access/small/{item.qid}/status", "Deleted")
        assert lib.read_access(zk, "small", item.qid).status["status"] == "Deleted"
        out = run("queue", action, f"small/{item.qid}", *AS_OPS)
        assert out.strip() == f"access {item.qid}: Deleted -> removed"
        assert access.access_ids(zk, "small") == []


def test_cleanup_removes_deleted_items_like_completed_batches(
    zk: KazooClient, make_batch: Callable[..., Batch], make_job: Callable[..., Job], ops: Any
) -> None:
    live = make_batch()
    lone = make_job(bid=live.bid)  # a Deleted job of a batch still at work
    keep = make_job(bid=live.bid)
    mark_deleted_like_the_library(zk, lone)
    gone_batch = batches.batch_transition(zk, make_batch(), "Held")
    mark_status(zk, f"/batches/{gone_batch.bid}/status", "Deleted")
    busy_batch = make_batch()
    busy_job = make_job(bid=busy_batch.bid)  # still processing: the batch is left alone
    busy_batch = batches.batch_transition(zk, busy_batch, "Processing")
    mark_status(zk, f"/batches/{busy_batch.bid}/status", "Deleted")
    item = access.access_create(zk, queue="large", token=TOKEN)
    mark_status(zk, f"/access/large/{item.qid}/status", "Deleted")

    quiet = run("queue", "cleanup", "--older-than-days", "1", *AS_OPS)
    assert (
        quiet.splitlines()[-1] == "0 completed batches cleaned up, 0 items marked Deleted removed"
    )
    out = run("queue", "cleanup", *AS_OPS).splitlines()
    assert f"batch {gone_batch.bid}: Deleted -> removed (0 jobs deleted)" in out
    assert f"batch {busy_batch.bid}: Deleted -> Deleted (left alone: 1 jobs at work)" in out
    assert f"job {lone.jid}: Deleted -> removed (batch {live.bid})" in out
    assert f"access {item.qid}: Deleted -> removed (large queue)" in out
    assert out[-1] == "0 completed batches cleaned up, 3 items marked Deleted removed"
    # Each item taken away is in the audit log (the one left alone did not move), an access
    # request under its queue as the console names it.
    from queues.operator.audit import AuditEntry

    audited = AuditEntry.objects.filter(action="cleanup", user=ops, via="command", ok=True)
    assert {(e.kind, e.item_id, e.after) for e in audited} == {
        ("batch", gone_batch.bid, moves.REMOVED),
        ("job", lone.jid, moves.REMOVED),
        ("access", f"large/{item.qid}", moves.REMOVED),
    }
    remaining = set(batches.batch_ids(zk))
    assert live.bid in remaining and busy_batch.bid in remaining
    assert gone_batch.bid not in remaining
    assert zk.exists(f"/jobs/{lone.jid}") is None
    assert jobs.job_load(zk, keep.jid).state == "Pending"
    assert jobs.job_load(zk, busy_job.jid).state == "Pending"
    assert access.access_ids(zk, "large") == []


@pytest.mark.django_db
def test_remove_runs_through_the_operator_actions_with_role_reason_and_audit(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    from django.contrib.auth import get_user_model
    from django.core.exceptions import PermissionDenied

    from queues.operator import actions
    from queues.operator.audit import AuditEntry
    from queues.operator.auth import ensure_groups

    groups = ensure_groups()
    users = {}
    for role in ("operator", "admin"):
        users[role] = get_user_model().objects.create_user(username=role, password="x" * 20)
        users[role].groups.add(groups[role])
    job = make_job()
    mark_deleted_like_the_library(zk, job)
    with pytest.raises(PermissionDenied):
        actions.perform(
            user=users["operator"], kind="job", action=REMOVE, item_id=job.jid, reason="old"
        )
    with pytest.raises(actions.ReasonRequired):
        actions.perform(user=users["admin"], kind="job", action=REMOVE, item_id=job.jid)
    [outcome] = actions.perform(
        user=users["admin"], kind="job", action=REMOVE, item_id=job.jid, reason="library left it"
    )
    assert outcome.after == moves.REMOVED
    entry = AuditEntry.objects.filter(ok=True).get()
    assert (entry.action, entry.before, entry.after) == (REMOVE, "Deleted", "removed")
    assert zk.exists(f"/jobs/{job.jid}") is None


# 7. Status nodes hold exactly the contract's keys -----------------------------------------------


def test_a_permanent_failure_keeps_the_five_keys_and_cannot_be_resumed(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = jobs.job_transition(zk, make_job(), "Estimating")
    failed = jobs.job_transition(zk, job, "Failed", message="digest mismatch", permanent=True)
    value = read_json(zk, f"/jobs/{job.jid}/status")
    assert tuple(value) == lib.JOB_STATUS_KEYS
    assert value["message"] == jobs.NOT_RESUMABLE + "digest mismatch"
    assert jobs.is_permanent_failure(failed.status)
    lib.read_job(zk, job.jid)
    with pytest.raises(InvalidTransition, match=r"failed permanently \(digest mismatch\)"):
        moves.job_resume(jid=job.jid)
    with pytest.raises(InvalidTransition, match="failed permanently"):
        jobs.job_transition(zk, failed, "Estimating", admin=True, retry=True)
    # Failing it again (an operator's fail does not apply to Failed) keeps one marker only.
    assert (
        jobs.next_status(
            failed.status, "Failed", message=value["message"], retry=False, permanent=True
        )["message"]
        == value["message"]
    )


def test_an_ordinary_failure_is_resumed_with_the_five_keys(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = jobs.job_transition(zk, make_job(), "Estimating")
    jobs.job_transition(zk, job, "Failed", message="timeout")
    assert moves.job_resume(jid=job.jid).after == "Estimating"
    assert tuple(read_json(zk, f"/jobs/{job.jid}/status")) == lib.JOB_STATUS_KEYS


# The contract's resume rule: the state after last_successful_status (null/Pending: Estimating).
_AFTER = {
    None: "Estimating",
    "Pending": "Estimating",
    "Estimating": "Provisioning",
    "Provisioning": "Downloading",
    "Downloading": "Processing",
    "Processing": "Storing",
    "Storing": "Recording",
    "Recording": "Notify",
}


def test_a_resume_from_an_earlier_step_leaves_the_library_resuming_there(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = make_job()
    for step in ("Estimating", "Provisioning", "Downloading", "Processing", "Storing"):
        job = jobs.job_transition(zk, job, step)
    jobs.job_transition(zk, job, "Failed", message="storage refused the manifest")
    assert moves.job_resume(jid=job.jid, to="Processing").after == "Processing"
    moved = lib.read_job(zk, job.jid)
    assert tuple(moved.status) == lib.JOB_STATUS_KEYS
    assert (moved.status["status"], moved.status["retry_count"]) == ("Processing", 1)
    # Failing again in the repeated step, the library's own resume restarts it there.
    again = jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Failed", message="again")
    assert _AFTER[lib.read_job(zk, job.jid).status["last_successful_status"]] == "Processing"
    assert again.status.last_successful_status == "Downloading"


def test_an_old_resumable_key_is_still_honoured_and_dropped_by_the_next_write(
    zk: KazooClient, make_job: Callable[..., Job]
) -> None:
    job = jobs.job_transition(zk, make_job(), "Failed", message="corrupt manifest")
    old = dict(read_json(zk, f"/jobs/{job.jid}/status"), resumable=False)
    zk.set(f"/jobs/{job.jid}/status", compact(old))
    with pytest.raises(lib.LayoutError, match="extra \\['resumable'\\]"):
        lib.read_job(zk, job.jid)
    with pytest.raises(InvalidTransition, match="failed permanently"):
        moves.job_resume(jid=job.jid)
    after = jobs.next_status(
        jobs.job_load(zk, job.jid).status, "Failed", message="x", retry=False, permanent=False
    )
    assert tuple(after) == lib.JOB_STATUS_KEYS


# The reader itself: it does reject what the library would ---------------------------------------


@pytest.mark.parametrize(
    ("node", "data", "complaint"),
    [
        ("priority", b'"5"', "plain decimal"),
        ("priority", b"05", "plain decimal"),
        ("space_needed", b" 0", "plain decimal"),
        ("bid", None, "raw"),  # the batch ID in JSON quotes
        ("configuration", b'{"a": 1}', "compact"),
        ("status", None, "last_modified"),  # an ISO-8601 timestamp
    ],
)
def test_the_reader_rejects_what_the_contract_forbids(
    zk: KazooClient, job: Job, node: str, data: bytes | None, complaint: str
) -> None:
    lib.read_job(zk, job.jid)
    if node == "bid":
        data = b'"' + job.bid.encode() + b'"'
    if node == "status":
        data = compact(dict(job.status.raw, last_modified="2026-11-21T10:02:03-08:00"))
    zk.set(f"/jobs/{job.jid}/{node}", data)
    with pytest.raises(lib.LayoutError, match=complaint):
        lib.read_job(zk, job.jid)


def test_the_reader_rejects_a_misplaced_or_uppercase_index(zk: KazooClient, job: Job) -> None:
    zk.ensure_path("/jobs/states/Pending")
    zk.create(f"/jobs/states/Pending/05-{job.jid}", b"")
    with pytest.raises(lib.LayoutError) as caught:
        lib.read_job(zk, job.jid)
    text = str(caught.value)
    assert "lowercase" in text and "one index entry" in text


# Proof: items our services move load in the library's reader at every step ----------------------


def test_a_job_moved_through_every_state_loads_at_every_step(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    job = make_job(
        identifiers={"primary_id": "", "local_id": ["loc-1"]},
        metadata={"erc_who": "Ada", "erc_what": "Notes", "erc_when": "1843", "erc_where": ""},
    )
    seen = []

    def step(moved: Job | None = None) -> None:
        loaded = lib.read_job(zk, job.jid)
        seen.append(loaded.status["status"])
        if moved is not None:
            assert loaded.status == read_json(zk, f"/jobs/{job.jid}/status")
            assert loaded.priority == moved.priority

    step()
    moves.job_hold(jid=job.jid)
    step()
    step(priority_set_waiting(zk, jobs.job_load(zk, job.jid), 2))
    moves.job_release(jid=job.jid)
    step()
    batches.batch_transition(zk, batch, "Processing")
    current = jobs.job_load(zk, job.jid)
    for state in ("Estimating", "Provisioning", "Downloading"):
        current = jobs.job_transition(zk, current, state)
        step(current)
    current = jobs.job_transition(zk, current, "Failed", message="downloading: 404")
    step(current)
    moves.job_resume(jid=job.jid)
    step()
    moves.job_fail(jid=job.jid, message="stopped by an operator")
    step()
    moves.job_resume(jid=job.jid)
    step()
    current = jobs.job_load(zk, job.jid)
    for state in ("Processing", "Storing", "Recording", "Notify", "Completed"):
        current = jobs.job_transition(zk, current, state)
        step(current)
    final = lib.read_job(zk, job.jid).status
    assert (final["retry_count"], final["last_successful_status"]) == (2, "Notify")
    mark_deleted_like_the_library(zk, jobs.job_load(zk, job.jid))
    step()
    assert seen == [
        "Pending",
        "Held",
        "Held",
        "Pending",
        "Estimating",
        "Provisioning",
        "Downloading",
        "Failed",
        "Downloading",
        "Failed",
        "Downloading",
        "Processing",
        "Storing",
        "Recording",
        "Notify",
        "Completed",
        "Deleted",
    ]
    moves.job_delete(jid=job.jid)
    with pytest.raises(lib.LayoutError, match="does not exist"):
        lib.read_job(zk, job.jid)


def test_a_batch_we_report_loads_at_every_step(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    lib.read_batch(zk, batch.bid)
    ok, bad = make_job(), make_job()
    batch = batches.batch_transition(zk, batch, "Processing")
    lib.read_batch(zk, batch.bid)
    jobs.job_transition(zk, jobs.job_transition(zk, ok, "Estimating"), "Failed", message="x")
    moves.job_resume(jid=ok.jid)
    current = jobs.job_load(zk, ok.jid)
    for state in ("Provisioning", "Downloading", "Processing", "Storing", "Recording"):
        current = jobs.job_transition(zk, current, state)
    current = jobs.job_transition(zk, jobs.job_transition(zk, current, "Notify"), "Completed")
    moves.job_fail(jid=bad.jid, message="bad object")  # the batch's last job: on to Reporting
    reporting = batches.batch_load(zk, batch.bid)
    assert lib.read_batch(zk, batch.bid).status["status"] == "Reporting"
    batches.batch_write_report(zk, reporting, failed=[bad.jid], successful=[ok.jid])
    batches.batch_transition(zk, reporting, "Completed", message="1 completed, 1 failed")
    loaded = lib.read_batch(zk, batch.bid)
    assert loaded.status["status"] == "Completed"
    assert loaded.report is not None
    assert (loaded.report["failed_jobs"], loaded.report["successful_jobs"]) == ([bad.jid], [ok.jid])
    assert loaded.jobs == {
        "batch-processing": [],
        "batch-completed": [ok.jid],
        "batch-failed": [bad.jid],
    }
    for jid in (ok.jid, bad.jid):
        lib.read_job(zk, jid)


@pytest.mark.parametrize("queue", ["small", "large"])
def test_an_access_request_we_complete_loads_at_every_step(zk: KazooClient, queue: str) -> None:
    item = access.access_create(zk, queue=queue, token={"token": "c2a1", "cloud-content-byte": 1})
    lib.read_access(zk, queue, item.qid)
    item = access.access_transition(zk, item, "Processing")
    lib.read_access(zk, queue, item.qid)
    item = access.access_transition(zk, item, "Failed", message="storage was away")
    lib.read_access(zk, queue, item.qid)
    moves.access_resume(queue=queue, qid=item.qid, to="Processing")
    item = access.access_acquire(zk, queue, "Processing")  # as our consumer takes it again
    assert item is not None
    item = access.access_set_token(zk, item, TOKEN)
    item = access.access_transition(zk, item, "Completed", holder=True)
    access.access_unlock(zk, item)
    loaded = lib.read_access(zk, queue, item.qid)
    assert loaded.status["status"] == "Completed" and loaded.token == TOKEN
    assert tuple(loaded.status) == lib.SIMPLE_STATUS_KEYS


@pytest.mark.django_db
def test_the_console_shows_deleted_items_with_a_remove_button(
    zk: KazooClient, batch: Batch, make_job: Callable[..., Job]
) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from queues.operator.auth import ensure_groups

    admin = get_user_model().objects.create_user(username="admin-user", password="x" * 20)
    admin.groups.add(ensure_groups()["admin"])
    browser = Client()
    browser.force_login(admin)
    job = make_job()
    mark_deleted_like_the_library(zk, job)
    page = browser.get(f"/jobs/{job.jid}/").content.decode()
    assert 'data-state="Deleted"' in page
    assert f'href="/jobs/{job.jid}/remove/' in page
    confirm = browser.get(f"/jobs/{job.jid}/remove/").content.decode()
    assert "marked Deleted" in confirm
    overview = browser.get("/").content.decode()
    assert re.search(r'id="count-[^"]*-Deleted">1 job<', overview)
    batch_page = browser.get(f"/batches/{batch.bid}/").content.decode()
    assert "1 deleted" in batch_page
    listed = browser.get("/jobs/", {"state": "Deleted"})
    assert listed.status_code == 200
    assert f'href="/jobs/{job.jid}/"' in listed.content.decode()
    response = browser.post(f"/jobs/{job.jid}/remove/", {"reason": "left by the library"})
    assert (response.status_code, response["Location"]) == (303, "/jobs/")
    assert zk.exists(f"/jobs/{job.jid}") is None
