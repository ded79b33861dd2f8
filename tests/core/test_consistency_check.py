"""The consistency check finds each kind of damage, repairs it, and then finds nothing."""

from __future__ import annotations

import dataclasses
import gc
import json
from array import array
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from queues.operator import check, check_findings, check_repairs
from queues.zk import batches, jobs
from queues.zk.codecs import encode_json, now_stamp
from queues.zk.records import Batch, Job
from tests.daemons.merritt_ingest import merritt_batch, merritt_job

from .helpers import assert_indexed, walk_job


def kinds(report: check_findings.Report) -> dict[str, list[str]]:
    return {kind: sorted(f.path for f in found) for kind, found in report.by_kind().items()}


def repair_and_recheck(
    zk: KazooClient, report: check_findings.Report, **kwargs: object
) -> list[str]:
    lines = check_repairs.repair(zk, report, **kwargs)
    again = check.run_check(zk)
    assert again.ok, again.findings
    return lines


def test_healthy_tree_has_no_findings(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch
) -> None:
    walk_job(zk, make_job(), "Completed")
    jobs.job_transition(zk, make_job(), "Failed")
    walk_job(zk, make_job(), "Storing")
    report = check.run_check(zk)
    assert report.ok, report.findings
    assert (report.jobs, report.batches, report.index_entries) == (3, 1, 3)


def test_job_in_no_state_folder_is_reindexed(zk: KazooClient, job: Job, batch: Batch) -> None:
    zk.delete(f"/jobs/states/pending/05-{job.jid}")
    report = check.run_check(zk)
    assert kinds(report) == {"job-unindexed": [f"/jobs/{job.jid}"]}
    assert report.findings[0].repairable
    lines = repair_and_recheck(zk, report)
    assert lines == [f"created /jobs/states/pending/05-{job.jid}"]
    assert_indexed(zk, job, batch.bid, "Pending")


def test_job_in_two_state_folders_keeps_only_the_one_its_status_names(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Downloading")
    zk.create(f"/jobs/states/pending/05-{job.jid}", b"", makepath=True)
    report = check.run_check(zk)
    assert kinds(report) == {"job-multiple-index": [f"/jobs/{job.jid}"]}
    repair_and_recheck(zk, report)
    assert_indexed(zk, job, batch.bid, "Downloading")


def test_job_in_the_wrong_state_folder_is_moved(zk: KazooClient, job: Job, batch: Batch) -> None:
    job = walk_job(zk, job, "Estimating")
    zk.delete(f"/jobs/states/estimating/05-{job.jid}")
    zk.create(f"/jobs/states/processing/10-{job.jid}", b"", makepath=True)
    report = check.run_check(zk)
    assert kinds(report) == {"job-misindexed": [f"/jobs/states/processing/10-{job.jid}"]}
    repair_and_recheck(zk, report)
    assert_indexed(zk, job, batch.bid, "Estimating")


def test_index_entry_without_its_job_is_deleted(zk: KazooClient, job: Job) -> None:
    zk.create("/jobs/states/pending/05-jid0000000777", b"")
    zk.ensure_path("/jobs/states/failed")
    zk.create("/jobs/states/failed/00-jid0000000778", b"")
    report = check.run_check(zk)
    assert kinds(report) == {
        "orphan-index": [
            "/jobs/states/failed/00-jid0000000778",
            "/jobs/states/pending/05-jid0000000777",
        ]
    }
    repair_and_recheck(zk, report)
    assert zk.get_children("/jobs/states/pending") == [f"05-{job.jid}"]


def test_batch_index_entry_in_the_wrong_folder_is_moved(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    job = walk_job(zk, job, "Completed")
    zk.delete(f"/batches/{batch.bid}/states/batch-completed/{job.jid}")
    zk.create(f"/batches/{batch.bid}/states/batch-processing/{job.jid}", b"")
    report = check.run_check(zk)
    assert kinds(report) == {
        "batch-index-wrong": [f"/batches/{batch.bid}/states/batch-completed/{job.jid}"]
    }
    repair_and_recheck(zk, report)
    assert_indexed(zk, job, batch.bid, "Completed")


def test_batch_index_entry_without_its_job_is_deleted(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    zk.create(f"/batches/{batch.bid}/states/batch-failed/jid0000000555", b"", makepath=True)
    report = check.run_check(zk)
    assert kinds(report) == {
        "orphan-batch-index": [f"/batches/{batch.bid}/states/batch-failed/jid0000000555"]
    }
    repair_and_recheck(zk, report)
    assert zk.get_children(f"/batches/{batch.bid}/states/batch-failed") == []


def test_uuid_without_its_batch_is_deleted(zk: KazooClient, batch: Batch) -> None:
    ghost = "/batch-uuids/0b7c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3"
    zk.create(ghost, b"bid0000000404")
    report = check.run_check(zk)
    assert kinds(report) == {"orphan-uuid": [ghost]}
    repair_and_recheck(zk, report)
    assert zk.exists(ghost) is None
    assert zk.exists(f"/batch-uuids/{batch.uuid}") is not None


def test_a_uuid_naming_no_node_is_deleted_and_the_run_goes_on(
    zk: KazooClient, batch: Batch
) -> None:
    """Another client's uuid entry whose data is no node name at all (".." made kazoo refuse
    the path, a NUL the server): an orphan like any other, not the end of the repair run."""
    hostile = ["/batch-uuids/dotdot", "/batch-uuids/nul", "/batch-uuids/slash"]
    for path, data in zip(hostile, [b"..", b"bid\x00x", b"bid0000000001/status"], strict=True):
        zk.create(path, data)
    report = check.run_check(zk)
    assert kinds(report) == {"orphan-uuid": hostile}
    repair_and_recheck(zk, report)
    assert all(zk.exists(path) is None for path in hostile)
    assert zk.exists(f"/batch-uuids/{batch.uuid}") is not None


def test_a_side_effect_record_without_its_job_is_deleted(zk: KazooClient, job: Job) -> None:
    # Records of a storage add and a callback: one for a job deleted by a tool that does not
    # know them, one for a job that exists (left alone), and a node no job could have.
    gone = "jid0000000666"
    orphans = [f"/mrt-console/store-intents/{gone}", f"/mrt-console/callbacks/{gone}"]
    for path in orphans:
        zk.create(path, b"{}", makepath=True)
    zk.create(f"/mrt-console/callbacks/{job.jid}", b"{}")
    zk.create("/mrt-console/callbacks/junk", b"")
    report = check.run_check(zk)
    assert kinds(report) == {"orphan-record": sorted([*orphans, "/mrt-console/callbacks/junk"])}
    assert {f.detail for f in report.findings} == {
        f"job {gone} does not exist",
        "not named by a job ID",
    }
    repair_and_recheck(zk, report)
    assert zk.get_children("/mrt-console/store-intents") == []
    assert zk.get_children("/mrt-console/callbacks") == [job.jid]


def test_lock_older_than_the_threshold_is_reported_and_broken_on_request(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    # Persistent: left by a writer that is gone, no session will ever remove it.
    zk.create(f"/jobs/{job.jid}/lock", b"")
    zk.create(f"/batches/{batch.bid}/lock", b"")
    assert check.run_check(zk).ok
    report = check.run_check(zk, stale_lock_seconds=0)
    assert kinds(report) == {
        "stale-lock": sorted([f"/jobs/{job.jid}/lock", f"/batches/{batch.bid}/lock"])
    }
    assert not any(f.repairable for f in report.findings)
    assert check_repairs.repair(zk, report) == []
    assert zk.exists(f"/jobs/{job.jid}/lock") is not None
    lines = check_repairs.repair(zk, report, break_stale_locks=True)
    assert sorted(lines) == sorted(
        [f"broke /jobs/{job.jid}/lock", f"broke /batches/{batch.bid}/lock"]
    )
    assert check.run_check(zk, stale_lock_seconds=0).ok


def test_a_stale_lock_of_a_live_session_that_is_no_console_process_is_never_broken(
    zk: KazooClient, other_zk: KazooClient, job: Job
) -> None:
    # Merritt's own consumer at work holds it: breaking it would let the job be worked twice.
    other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    report = check.run_check(zk, stale_lock_seconds=0)
    [finding] = report.findings
    assert (finding.kind, finding.owner) == ("stale-lock", "merritt")
    assert "not a console process" in finding.detail and "Ask that service" in finding.advice
    assert check_repairs.repair(zk, report, break_stale_locks=True) == []
    assert zk.exists(f"/jobs/{job.jid}/lock") is not None


def test_abandoned_half_created_job_is_removed(
    zk: KazooClient, job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk.create("/jobs/jid0000000321", b"")
    zk.create("/jobs/jid0000000321/bid", b"bid0000000000")
    young = check.run_check(zk)
    assert kinds(young) == {"incomplete-job": ["/jobs/jid0000000321"]}
    assert not young.findings[0].repairable
    assert check_repairs.repair(zk, young) == []
    assert zk.exists("/jobs/jid0000000321") is not None
    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    report = check.run_check(zk)
    assert report.findings[0].repairable
    assert check_repairs.repair(zk, report) == ["removed abandoned /jobs/jid0000000321"]
    assert zk.exists("/jobs/jid0000000321") is None
    assert check.run_check(zk).ok
    assert jobs.job_load(zk, job.jid).state == "Pending"


def test_abandoned_half_created_batch_is_removed(
    zk: KazooClient, batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk.create("/batches/bid0000000321", b"")
    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    report = check.run_check(zk)
    assert kinds(report) == {"incomplete-batch": ["/batches/bid0000000321"]}
    repair_and_recheck(zk, report)
    assert batches.batch_ids(zk) == [batch.bid]


def test_processing_batch_whose_jobs_all_finished_is_moved_to_reporting(
    zk: KazooClient, job: Job, batch: Batch
) -> None:
    batch = batches.batch_transition(zk, batch, "Processing")
    jobs.job_transition(zk, job, "Failed")
    report = check.run_check(zk)
    assert kinds(report) == {"batch-complete-not-reporting": [f"/batches/{batch.bid}/status"]}
    assert check_repairs.repair(zk, report) == [f"moved {batch.bid} to Reporting"]
    assert batches.batch_load(zk, batch.bid).state == "Reporting"
    assert check.run_check(zk).ok


def test_malformed_job_is_reported_not_repaired(zk: KazooClient, job: Job) -> None:
    zk.set(f"/jobs/{job.jid}/status", b"not json")
    report = check.run_check(zk)
    assert kinds(report) == {"malformed-node": [f"/jobs/{job.jid}/status"]}
    assert check_repairs.repair(zk, report) == []
    assert zk.get(f"/jobs/{job.jid}/status")[0] == b"not json"


def test_several_kinds_of_damage_are_all_found_and_repaired_at_once(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    unindexed, doubled, done = make_job(), make_job(), make_job()
    zk.delete(f"/jobs/states/pending/05-{unindexed.jid}")
    zk.create(f"/jobs/states/held/05-{doubled.jid}", b"", makepath=True)
    done = walk_job(zk, done, "Completed")
    zk.delete(f"/batches/{batch.bid}/states/batch-completed/{done.jid}")
    zk.create("/jobs/states/pending/05-jid0000000888", b"")
    zk.create("/batch-uuids/0b7c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3", b"bid0000000404")
    zk.create("/jobs/jid0000000889", b"")
    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    report = check.run_check(zk)
    assert set(kinds(report)) == {
        "job-unindexed",
        "job-multiple-index",
        "batch-index-wrong",
        "orphan-index",
        "orphan-uuid",
        "incomplete-job",
    }
    repair_and_recheck(zk, report)
    for job, state in ((unindexed, "Pending"), (doubled, "Pending"), (done, "Completed")):
        assert_indexed(zk, job, batch.bid, state)


# Items the console does not own: Merritt's ingest wrote them (no payload_url) ----------------


def _library_hold(zk: KazooClient, bid: str, state: str) -> None:
    """A batch status written as Merritt's library writes it: the node only, no marker."""
    zk.set(
        f"/batches/{bid}/status",
        encode_json({"status": state, "last_modified": now_stamp(), "message": ""}),
    )


def _library_acquire_pending_batch(zk: KazooClient) -> str | None:
    """mrt-zk's ``acquirePendingBatch``: the first batch without a ``states`` child whose status
    is Pending and whose ephemeral lock can be created."""
    for bid in sorted(zk.get_children("/batches")):
        if zk.exists(f"/batches/{bid}/states") is not None:
            continue
        if json.loads(zk.get(f"/batches/{bid}/status")[0])["status"] != "Pending":
            continue
        try:
            zk.create(f"/batches/{bid}/lock", b"", ephemeral=True)
        except NodeExistsError:
            continue
        return bid
    return None


def test_a_batch_merritt_holds_is_reported_with_advice_and_never_marked(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    held = merritt_batch(zk)
    _library_hold(zk, held.bid, "Held")
    report = check.run_check(zk)
    [finding] = report.findings
    assert (finding.kind, finding.path) == ("batch-states-missing", f"/batches/{held.bid}/states")
    assert (finding.repairable, finding.owner) == (False, "merritt")
    assert "leave it as it is" in finding.advice and "Merritt's ingest" in finding.detail
    assert check_repairs.repair(zk, report, break_stale_locks=True) == []
    # Even a finding that claims to be repairable (kept from an older check) is looked at again.
    assert (
        check_repairs.repair_one(zk, dataclasses.replace(finding, repairable=True, owner="")) == ""
    )
    assert zk.exists(f"/batches/{held.bid}/states") is None
    # Released by Merritt's tools: Merritt's batch consumer takes it up again.
    _library_hold(zk, held.bid, "Pending")
    assert _library_acquire_pending_batch(other_zk) == held.bid


def test_a_batch_the_console_wrote_still_gets_its_marker(zk: KazooClient, batch: Batch) -> None:
    _library_hold(zk, batch.bid, "Held")
    report = check.run_check(zk)
    assert [(f.kind, f.repairable, f.owner) for f in report.findings] == [
        ("batch-states-missing", True, "")
    ]
    assert check_repairs.repair(zk, report) == [f"created /batches/{batch.bid}/states"]


def test_a_job_merritt_wrote_out_of_its_folder_is_reported_not_reindexed(
    zk: KazooClient,
) -> None:
    job = merritt_job(zk, state="Estimating")
    zk.delete(job.index_path)  # a Merritt consumer stopped between its separate writes
    report = check.run_check(zk)
    [finding] = report.findings
    assert (finding.kind, finding.owner, finding.repairable) == ("job-unindexed", "merritt", False)
    assert "Merritt's operators" in finding.advice
    assert check_repairs.repair(zk, report) == []
    assert check_repairs.repair_one(
        zk, dataclasses.replace(finding, repairable=True, owner="")
    ) == (f"left /jobs/{job.jid}: Merritt's job, not the console's to repair")
    assert zk.exists(job.index_path) is None


def test_beside_merritt_an_item_of_unknown_writer_is_not_removed(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk.create("/jobs/jid0000000321", b"")  # half-created, no configuration to tell whose
    monkeypatch.setattr(check, "ABANDONED_SECONDS", -1)
    beside = check.run_check(zk, beside_merritt=True)
    assert [(f.kind, f.repairable, f.owner) for f in beside.findings] == [
        ("incomplete-job", False, "unknown")
    ]
    assert check_repairs.repair(zk, beside, beside_merritt=True) == []
    assert zk.exists("/jobs/jid0000000321") is not None
    assert check_repairs.repair(zk, check.run_check(zk)) == [
        "removed abandoned /jobs/jid0000000321"
    ]


# Bounded memory -------------------------------------------------------------------------------


def test_the_walk_holds_one_chunk_of_jobs_at_a_time(
    zk: KazooClient, make_batch: Callable[..., Batch], make_job: Callable[..., Job]
) -> None:
    for _ in range(9):
        batch = make_batch()
        for _ in range(7):
            make_job(bid=batch.bid)
    alive: list[int] = []

    def count_jobs(_progress: check_findings.Progress) -> None:
        alive.append(sum(1 for o in gc.get_objects() if type(o) is Job))

    gc.collect()
    before = sum(1 for o in gc.get_objects() if type(o) is Job)
    checker = check.Checker(zk, progress=count_jobs, chunk=5)
    report = checker.run()
    assert report.ok and (report.jobs, report.batches) == (63, 10)
    # 63 jobs and 10 batches read five at a time: never more than one chunk decoded at once.
    assert checker.largest_chunk == 5
    assert checker.chunks == 13 + 2
    assert max(alive) - before <= 5
    # What it keeps of every job is flat arrays, not records.
    assert isinstance(checker.jobs, array) and isinstance(checker.job_batch, array)


def test_findings_go_to_the_sink_as_found_not_into_the_report(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch
) -> None:
    lost = [make_job() for _ in range(12)]
    for job in lost:
        zk.delete(job.index_path)
    sunk: list[check_findings.Finding] = []
    report = check.run_check(zk, sink=sunk.append, chunk=4, recheck_seconds=0)
    assert report.findings == [] and report.found == 12 and not report.ok
    assert sorted(f.path for f in sunk) == sorted(f"/jobs/{j.jid}" for j in lost)
