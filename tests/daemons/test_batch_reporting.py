"""Reporting and Update Reporting: the status report, one summary mail, the final state."""

from __future__ import annotations

import json
import time

import pytest

from queues.core.states import JOB_STEPS
from queues.daemons.batch_reporting import SWEEP_EVERY as BATCH_SWEEP_EVERY
from queues.daemons.batch_reporting import BatchReporting
from queues.services import moves
from queues.zk import batches
from queues.zk.batches import batch_create, batch_load, batch_transition
from queues.zk.jobs import job_create, job_load, job_transition
from tests.zkproxy import MULTI, request

from .conftest import DEMO, daemon


def _batch(zk, outcomes: list[str], state: str = "Processing"):
    """A started batch whose jobs ended as ``outcomes`` ("Completed" or "Failed")."""
    batch = batch_create(
        zk,
        submission={"profile": DEMO, "submitter": "depositor@example.org", "title": "My batch"},
    )
    jids = []
    for outcome in outcomes:
        job = job_create(zk, bid=batch.bid, configuration={"profile": DEMO})
        for step in JOB_STEPS[1:]:
            if outcome == "Failed" and step == "Downloading":
                job = job_transition(zk, job, "Failed", message="broken")
                break
            job = job_transition(zk, job, step)
        jids.append(job.jid)
    batch = batch_transition(zk, batch_load(zk, batch.bid), "Processing")
    if state == "Reporting":
        batch_transition(zk, batch, "Reporting")
    return batch.bid, jids


def test_report_mail_and_failed_batch(zk, mailoutbox) -> None:
    bid, jids = _batch(zk, ["Completed", "Completed", "Failed"], state="Reporting")
    assert daemon(zk, "batch-reporting").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert batch.report["successful_jobs"] == sorted(jids[:2])
    assert batch.report["failed_jobs"] == [jids[2]]
    assert batch.report["mailed"] is True
    [mail] = mailoutbox
    assert mail.to == ["depositor@example.org", "merritt-demo@example.org"]
    assert bid in mail.subject
    assert jids[2] in mail.body


def test_report_mail_is_merritts_subject_and_json_attachments(zk, mailoutbox) -> None:
    """As Merritt's batch report (mrt-ingest batchReport/HandlerNotification): the subject
    ``Ingest: Fail -- Submission Processed: <batchID>;``, then ``failed.json`` and
    ``completed.json``, ``application/json; header=present``, each job's configuration, a
    failed one's with its ``Status`` and ``Message``."""
    bid, jids = _batch(zk, ["Completed", "Completed", "Failed"], state="Reporting")
    uuid = batch_load(zk, bid).uuid
    assert daemon(zk, "batch-reporting").run_once()
    [mail] = mailoutbox
    assert mail.subject.startswith(f"Ingest: Fail -- Submission Processed: {uuid}; ")
    assert f"Merritt batch {bid} failed: My batch (2/3 ok)" in mail.subject
    names = [name for name, _content, _type in mail.attachments]
    assert names == ["failed.json", "completed.json"]
    types = {name: kind for name, _content, kind in mail.attachments}
    assert types == dict.fromkeys(names, "application/json; header=present")
    found = {name: json.loads(content) for name, content, _type in mail.attachments}
    configuration = {jid: job_load(zk, jid).configuration for jid in jids}
    [failed] = found["failed.json"]["failedJobs"]
    assert failed == {**configuration[jids[2]], "Status": "Failed", "Message": "broken"}
    completed = found["completed.json"]["completedJobs"]
    assert completed == [configuration[j] for j in sorted(jids[:2])]


def test_an_all_completed_report_has_no_failed_attachment(zk, mailoutbox) -> None:
    bid, [jid] = _batch(zk, ["Completed"], state="Reporting")
    daemon(zk, "batch-reporting").run_once()
    [mail] = mailoutbox
    uuid = batch_load(zk, bid).uuid
    assert mail.subject.startswith(f"Ingest: OK -- Submission Processed: {uuid}; ")
    [(name, content, _type)] = mail.attachments
    assert name == "completed.json"
    assert json.loads(content) == {"completedJobs": [job_load(zk, jid).configuration]}


def test_a_report_of_more_jobs_than_are_attached_says_where_they_are(
    zk, mailoutbox, monkeypatch
) -> None:
    # Each job's configuration is a kilobyte or two: a batch of tens of thousands would make a
    # mail of tens of megabytes, refused by the mail server or past the exchange's deadline for
    # ever. Over the bound (made 2 here) nothing is loaded or attached, and the body says so.
    from queues.daemons import batch_reporting

    monkeypatch.setattr(batch_reporting, "ATTACHED_JOBS_MOST", 2)
    bid, jids = _batch(zk, ["Completed", "Completed", "Failed"], state="Reporting")
    assert daemon(zk, "batch-reporting").run_once()
    [mail] = mailoutbox
    assert mail.attachments == []
    assert "failed.json and completed.json are left out for a batch of 3 jobs" in (
        mail.body.replace("\n", " ")
    )
    assert all(jid in mail.body for jid in jids)
    assert batch_load(zk, bid).report["mailed"] is True


def test_all_completed_batch_is_completed(zk, mailoutbox) -> None:
    bid, _ = _batch(zk, ["Completed"], state="Reporting")
    daemon(zk, "batch-reporting").run_once()
    assert batch_load(zk, bid).state == "Completed"
    assert len(mailoutbox) == 1


def test_a_rerun_after_mailing_does_not_mail_again(zk, mailoutbox) -> None:
    bid, _ = _batch(zk, ["Completed"], state="Reporting")
    worker = BatchReporting(zk=zk)
    batch = worker.claim()
    assert batch is not None
    worker.work(batch)  # mailed, then the consumer "dies" before moving the batch
    worker.unlock(batch)
    assert batch_load(zk, bid).state == "Reporting"
    worker.run_once()
    assert batch_load(zk, bid).state == "Completed"
    assert len(mailoutbox) == 1


def test_a_summary_sent_again_for_the_same_report_is_the_same_message(zk, mailoutbox) -> None:
    """A consumer killed between sending the summary and recording ``mailed`` leaves the mail
    to be sent again by the next: it goes under the same Message-ID, which mail systems and
    readers take for the same message. Another report of the batch is another message."""
    bid, jids = _batch(zk, ["Completed", "Failed"], state="Reporting")
    worker = BatchReporting(zk=zk)
    batch = worker.claim()
    assert batch is not None
    worker.work(batch)
    batches.batch_report_update(zk, bid, {"mailed": False})  # killed before recording it
    worker.unlock(batch)
    worker.run_once()
    assert batch_load(zk, bid).state == "Failed"
    first, again = (m.message()["Message-ID"] for m in mailoutbox)
    assert first == again
    assert first.startswith(f"<batch-summary.{bid}.Reporting-") and first.endswith(">")

    moves.job_resume(jid=jids[1])
    moves.batch_update_reporting(bid=bid)
    job = job_load(zk, jids[1])
    while job.state != "Completed":
        job = job_transition(zk, job, JOB_STEPS[JOB_STEPS.index(job.state) + 1])
    assert daemon(zk, "batch-update-reporting").run_once()
    update = mailoutbox[2].message()["Message-ID"]
    assert update.startswith(f"<batch-summary.{bid}.UpdateReporting-")
    assert update != first


def test_sweep_moves_a_finished_processing_batch_to_reporting(zk, mailoutbox) -> None:
    bid, _jids = _batch(zk, ["Completed", "Completed"])
    # The batch is Processing with no job left working (e.g. an operator failed the last one).
    assert batch_load(zk, bid).state == "Processing"
    daemon(zk, "batch-reporting").run_once()
    assert batch_load(zk, bid).state == "Completed"


def test_update_reporting_waits_for_resumed_jobs_then_reports_changes(zk, mailoutbox) -> None:
    bid, jids = _batch(zk, ["Completed", "Failed"], state="Reporting")
    daemon(zk, "batch-reporting").run_once()
    assert batch_load(zk, bid).state == "Failed"
    moves.job_resume(jid=jids[1])
    moves.batch_update_reporting(bid=bid)
    updater = daemon(zk, "batch-update-reporting")
    assert not updater.run_once()  # the resumed job is still being worked on
    assert batch_load(zk, bid).state == "UpdateReporting"
    job = job_load(zk, jids[1])
    while job.state != "Completed":
        job = job_transition(zk, job, JOB_STEPS[JOB_STEPS.index(job.state) + 1])
    assert updater.run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Completed"
    assert batch.report["successful_jobs"] == sorted(jids)
    assert batch.report["history"][0]["failed_jobs"] == [jids[1]]
    assert len(mailoutbox) == 2
    assert "Completed since the last report" in mailoutbox[1].body
    assert "batch-update-reporting" not in batch.status.message
    assert "1 completed since the last report" in batch.status.message


def test_the_sweep_runs_every_sweep_every_seconds_not_per_claim(zk, monkeypatch) -> None:
    worker = daemon(zk, "batch-reporting")
    swept = []
    monkeypatch.setattr(worker, "sweep", lambda: swept.append(1))
    for _ in range(5):
        worker.claim()
    assert len(swept) == 1
    monkeypatch.setattr(worker, "_swept", worker._swept - BATCH_SWEEP_EVERY)
    worker.claim()
    assert len(swept) == 2


def test_consumers_read_a_completed_batch_once(zk, mailoutbox, monkeypatch) -> None:
    done, _ = _batch(zk, ["Completed"], state="Reporting")
    open_bid, _ = _batch(zk, ["Failed"])
    daemon(zk, "batch-reporting").run_once()  # reports `done`; the sweep moves `open_bid` on
    assert batch_load(zk, done).state == "Completed"
    asked = []
    real = batches.batch_states
    monkeypatch.setattr(
        batches, "batch_states", lambda zk_, bids: asked.append(list(bids)) or real(zk_, bids)
    )
    assert batches.open_batch_states(zk, batches.batch_ids(zk)) == {open_bid: "Reporting"}
    assert batches.open_batch_states(zk, batches.batch_ids(zk)) == {open_bid: "Reporting"}
    assert done not in asked[-1]


@pytest.mark.django_db  # the loop closes stale database connections
def test_a_report_the_server_wrote_without_answering_is_not_written_again(
    zk, proxy, proxied_client, mailoutbox
) -> None:
    # ZooKeeper applies the report's write, and the connection is cut before the answer (a
    # server restart). The round the report belongs to travels in that same write, so the
    # next claim finds this round's report and does not add a second one: the chaos run saw
    # a batch "reported 2 times" when the round went in a write of its own.
    bid, _ = _batch(zk, ["Completed"], state="Reporting")
    proxy.cut_after(request(MULTI, b"status-report"))  # its fenced multi
    worker = BatchReporting(zk=proxied_client(), poll=0.05)
    for _ in range(100):
        if batch_load(zk, bid).state == "Completed":
            break
        worker._run_once_logged()
        time.sleep(0.05)
    assert proxy.fired.is_set()
    batch = batch_load(zk, bid)
    assert batch.state == "Completed"
    assert not batch.report.get("history")
    assert len(mailoutbox) == 1
