"""Jobs whose nodes another client wrote oddly (found by feeding the daemons odd values): the
odd job is passed over or failed for its own reason, and the healthy jobs claimed beside it
keep moving."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kazoo.client import KazooClient

from queues.core.states import BatchState, JobState
from queues.daemons.pipeline import JobPipeline
from queues.models import InventoryObject
from queues.services import moves
from queues.steps.storage import LocalStorage
from queues.zk import paths as zpaths
from queues.zk.batches import batch_job_ids, batch_load
from queues.zk.errors import MalformedNode
from queues.zk.jobs import job_load
from queues.zk.records import Job

from .conftest import DEMO, FileServer, batch_manifest, daemon, drive, object_manifest
from .test_batch_reporting import _batch as reporting_batch
from .test_batched import Step1, cycle_until_idle, jobs_in
from .test_storing_recording import _processed


def raw_json_edit(zk: KazooClient, path: str, tail: bytes) -> None:
    """Add ``tail`` (raw JSON text, ``,"key":value``) to the object stored at ``path``."""
    data, _ = zk.get(path)
    zk.set(path, data.rstrip()[:-1] + tail + b"}")


def only_the_odd_job_stays(zk: KazooClient, jobs: list[Job], odd: Job, why: str) -> None:
    """A batched loop's claims of all ``jobs``: every one moves on but ``odd``, which is
    unreadable for ``why``, left unlocked and never stepped."""
    worker = Step1(zk=zk, batch=len(jobs))
    cycle_until_idle(JobPipeline(worker))
    for job in jobs:
        if job is odd:
            with pytest.raises(MalformedNode, match=why):
                job_load(zk, job.jid)
            assert zk.exists(zpaths.job_node(job.jid, "lock")) is None
        else:
            assert job_load(zk, job.jid).state == JobState.PROVISIONING
    assert odd.jid not in worker.seen


def test_a_lone_surrogate_escape_in_a_status_passes_that_job_over_and_no_other(
    zk: KazooClient,
) -> None:
    jobs = jobs_in(zk, 4)
    odd = jobs[1]
    # Valid JSON, as Jackson or Ruby may write it, but no character: it cannot be written back.
    raw_json_edit(zk, zpaths.job_node(odd.jid, "status"), b',"note":"x\\ud800y"')
    only_the_odd_job_stays(zk, jobs, odd, "lone surrogate")


def test_a_surrogate_pair_escape_is_a_character_and_the_job_moves(zk: KazooClient) -> None:
    [job] = jobs_in(zk, 1)
    raw_json_edit(zk, zpaths.job_node(job.jid, "status"), b',"note":"\\ud83d\\ude00"')
    cycle_until_idle(JobPipeline(Step1(zk=zk, batch=4)))
    assert job_load(zk, job.jid).state == JobState.PROVISIONING


def set_node(zk: KazooClient, jid: str, name: str, value: dict[str, Any]) -> None:
    """A job's JSON node as another client might write it."""
    zk.set(zpaths.job_node(jid, name), json.dumps(value).encode())


NO_ARKS = ["not-an-ark", "ark:/13030/../../etc", "ark:/13030/a b", "ark:/13030/x\x00y", "ark:/"]


@pytest.mark.django_db
@pytest.mark.parametrize("primary_id", NO_ARKS)
def test_a_primary_id_that_is_no_ark_is_neither_stored_nor_recorded(
    zk: KazooClient, files: FileServer, settings: Any, primary_id: str
) -> None:
    to_record = _processed(zk, files)
    drive(zk, lambda: job_load(zk, to_record.jid).state == "Recording", names=["storing"])
    to_store = _processed(zk, files, "b.txt", "other")
    for job in (to_record, to_store):
        set_node(zk, job.jid, "identifiers", {"primary_id": primary_id, "local_id": []})
    daemon(zk, "storing").run_once()
    daemon(zk, "recording").run_once()
    for job in (to_record, to_store):
        failed = job_load(zk, job.jid)
        assert failed.state == JobState.FAILED
        assert f"the job's primary_id {primary_id[:80]!r} is no ARK" in failed.status.message
    assert LocalStorage(Path(settings.MRT_STORAGE_ROOT)).versions(to_store.primary_id) == []
    assert not InventoryObject.objects.exists()
    assert zk.connected  # kazoo was sent no path it could not encode (a NUL, a surrogate)


@pytest.mark.django_db
@pytest.mark.parametrize("version", [10**30, -1, True])
def test_a_stored_version_out_of_range_is_not_recorded(
    zk: KazooClient, files: FileServer, version: object
) -> None:
    job = _processed(zk, files)
    drive(zk, lambda: job_load(zk, job.jid).state == "Recording", names=["storing"])
    stored = job_load(zk, job.jid)
    set_node(zk, job.jid, "inventory", {**stored.inventory, "version": version})
    daemon(zk, "recording").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == JobState.FAILED
    assert f"the stored version {version} is out of range" in failed.status.message
    assert not InventoryObject.objects.exists()


@pytest.mark.parametrize("priority", [b"100", b"-1", b"9" * 21, "\u0665".encode(), b"5.0"])
def test_a_priority_outside_0_to_99_passes_that_job_over_and_no_other(
    zk: KazooClient, priority: bytes
) -> None:
    jobs = jobs_in(zk, 4)
    odd = jobs[2]
    zk.set(zpaths.job_node(odd.jid, "priority"), priority)
    only_the_odd_job_stays(zk, jobs, odd, "priority")
    # No index entry was written for a priority the contract does not have.
    assert all(
        name[:2].isdigit() and 0 <= int(name[:2]) <= 99
        for state in (JobState.ESTIMATING, JobState.PROVISIONING)
        for name in zk.get_children(zpaths.job_state_folder(state))
    )


@pytest.mark.parametrize("odd", [5, [[1]], ["not-a-job"]], ids=repr)
def test_an_earlier_report_with_odd_lists_does_not_fail_a_completed_batch(
    zk: KazooClient, mailoutbox: Any, odd: Any
) -> None:
    bid, jids = reporting_batch(zk, ["Completed", "Completed"], state="Reporting")
    zk.create(
        zpaths.batch_node(bid, "status-report"),
        json.dumps({"failed_jobs": odd, "successful_jobs": odd, "round": "earlier"}).encode(),
    )
    assert daemon(zk, "batch-reporting").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == BatchState.COMPLETED
    assert batch.report["successful_jobs"] == sorted(jids)
    assert batch.report["failed_jobs"] == []
    assert len(mailoutbox) == 1


class LastStep(Step1):
    name: ClassVar[str] = "test-notify"
    step: ClassVar[str] = "test-notify"
    state: ClassVar[str] = JobState.NOTIFY
    target: ClassVar[str] = JobState.COMPLETED


@pytest.mark.parametrize("batched", [False, True], ids=["one-job loop", "batched loop"])
def test_a_job_whose_batch_is_gone_is_stepped_once_and_not_again_until_it_is_back(
    zk: KazooClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    batched: bool,
) -> None:
    # The last step: a move to Completed writes the batch's index (an earlier one need not).
    jobs = jobs_in(zk, 3, state=JobState.NOTIFY)
    odd = jobs[:2]  # two jobs of one batch that is gone
    for job in odd:
        zk.set(zpaths.job_node(job.jid, "bid"), b"bid9999999999")
    worker = LastStep(zk=zk, batch=3 if batched else 1)
    with caplog.at_level(logging.WARNING, logger="queues.daemons"):
        if batched:
            cycle_until_idle(JobPipeline(worker))
            cycle_until_idle(JobPipeline(worker))  # a loop started again, as after a restart
        else:
            for _ in range(6):  # a claim each: the odd jobs, the other, then nothing
                worker.run_once()
    # Each step ran once (its move then found the batch gone), and not again in this process.
    assert [worker.seen.count(job.jid) for job in odd] == [1, 1]
    for job in odd:
        assert job_load(zk, job.jid).state == JobState.NOTIFY
        assert zk.exists(zpaths.job_node(job.jid, "lock")) is None
    assert job_load(zk, jobs[2].jid).state == JobState.COMPLETED
    warnings = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert f"{odd[0].jid} test-notify: its batch bid9999999999 is gone" in warnings[0]
    assert f"{odd[1].jid} test-notify: its batch bid9999999999 is gone" in warnings[1]
    assert "job-without-batch" in warnings[0]

    reads: list[str] = []
    exists = zk.exists

    def counted(path: str, *args: object, **kwargs: object) -> object:
        if "bid9999999999" in path:
            reads.append(path)
        return exists(path, *args, **kwargs)

    monkeypatch.setattr(zk, "exists", counted)

    def looked_at_again() -> None:
        for job in odd:
            worker.retry_waits.note(job.jid, time.time() - 1)  # their ORPHAN_WAIT is over
        if batched:
            cycle_until_idle(JobPipeline(worker))
        else:
            for _ in range(3):
                worker.run_once()

    # Looked at again, their batch is read first, once for both: still gone, no step runs
    # again only for its move to fail (a download, a storage add each time), and both wait.
    with caplog.at_level(logging.WARNING, logger="queues.daemons"):
        looked_at_again()
    assert len(reads) == 1
    assert [worker.seen.count(job.jid) for job in odd] == [1, 1]
    assert all(worker.retry_waits.waits(job.jid) for job in odd)
    assert all(zk.exists(zpaths.job_node(job.jid, "lock")) is None for job in odd)
    assert any(
        "test-notify: its batch bid9999999999 is still gone, so its step is not run again "
        "(nor 1 more)" in r.getMessage()
        for r in caplog.records
    )
    # Their batch back (an operator's repair), the jobs go on at their next look.
    for job in odd:
        zk.set(zpaths.job_node(job.jid, "bid"), job.bid.encode())
    looked_at_again()
    assert [worker.seen.count(job.jid) for job in odd] == [2, 2]
    assert all(job_load(zk, job.jid).state == JobState.COMPLETED for job in odd)
    assert worker.orphans == {}


@pytest.mark.parametrize("where", ["the submission", "the third object"])
def test_a_batch_whose_jobs_would_not_fit_a_request_fails_whole_and_makes_no_job(
    zk: KazooClient, files: FileServer, where: str
) -> None:
    # 600 KB fit in one node, but not twice in one job's creating transaction (a title is the
    # job's metadata and its configuration's both).
    huge = "x" * 600_000
    if where == "the submission":
        bid = moves.batch_submit(
            profile=DEMO,
            submitter="depositor@example.org",
            payload_url=files.put("a.txt", "a"),
            submission_type="file",
        )
        # As another client might have written it.
        path = zpaths.batch_node(bid, "submission")
        submission = json.loads(zk.get(path)[0])
        zk.set(path, json.dumps({**submission, "title": huge}).encode())
    else:
        rows = [
            {
                "url": files.put(f"m{n}.checkm", object_manifest([{"url": f"{files.url}/f{n}"}])),
                "title": huge if n == 2 else f"Object {n}",
                "creator": huge if n == 2 else "",
            }
            for n in range(3)
        ]
        bid = moves.batch_submit(
            profile=DEMO,
            submitter="depositor@example.org",
            payload_url=files.put("batch.checkm", batch_manifest(rows)),
            submission_type="batch-manifest",
        )
    assert daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == BatchState.FAILED
    seq = 3 if where == "the third object" else 1
    assert f"object {seq} (" in batch.status.message
    assert "more than ZooKeeper takes in one" in batch.status.message
    assert not any(batch_job_ids(zk, bid).values())  # no job made, none half made
    assert not [name for name in zk.get_children(zpaths.JOBS) if name.startswith("jid")]
    assert zk.connected
