"""Notify: the profile's callback, Completed, the working folder removed, the batch moved on."""

from __future__ import annotations

import json
from pathlib import Path

from queues.daemons.workfolder import workdir
from queues.zk.batches import batch_load, batch_transition
from queues.zk.jobs import job_load

from .conftest import DEMO, FileServer, daemon, make_job


def _notify_job(zk):
    job = make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Notify")
    folder = workdir(job)
    folder.mkdir(parents=True)
    (folder / "leftover").write_text("x")
    return job


def _with_callback(profiles: Path, url: str) -> None:
    path = profiles / f"{DEMO}.json"
    data = json.loads(path.read_text())
    data["callback_url"] = url
    path.write_text(json.dumps(data))


def test_callback_is_posted_then_completed_and_folder_removed(
    zk, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    job = _notify_job(zk)
    batch_transition(zk, batch_load(zk, job.bid), "Processing")
    daemon(zk, "notify").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Completed"
    [(path, body)] = files.posts
    assert path == f"/hook/mc/{job.jid}"
    state = json.loads(body)["job:jobState"]
    assert state["job:jobID"] == job.jid
    assert state["job:jobStatus"] == "COMPLETED"
    assert not workdir(job).exists()
    # It was the batch's only job: the batch moves on to Reporting.
    assert batch_load(zk, job.bid).state == "Reporting"


def test_without_a_callback_the_job_simply_completes(zk) -> None:
    job = _notify_job(zk)
    daemon(zk, "notify").run_once()
    assert job_load(zk, job.jid).state == "Completed"


def test_failing_callback_fails_the_job_and_keeps_the_folder(
    zk, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    files.post_status = 404
    job = _notify_job(zk)
    daemon(zk, "notify").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "404" in failed.status.message
    assert failed.status.message.startswith("notify: ")
    assert workdir(job).exists()


def test_a_callback_to_a_refused_address_fails_the_job_without_a_request(
    zk, files: FileServer, profiles: Path, settings
) -> None:
    settings.MRT_FETCH_ALLOW = ""
    _with_callback(profiles, files.url + "/hook")
    job = _notify_job(zk)
    daemon(zk, "notify").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "a loopback address, which is not fetched for depositors" in failed.status.message
    assert files.posts == []
