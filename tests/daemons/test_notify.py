"""Notify: the profile's callback, Completed, the working folder removed, the batch moved on."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from queues.core.retries import service_at
from queues.daemons import notify as notify_module
from queues.daemons.workfolder import FOLDER_REMOVALS, FolderRemovals, workdir
from queues.steps.profiles import load_profile
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
    assert FOLDER_REMOVALS.settle(timeout=30)  # removed by the process's remover
    assert not workdir(job).exists()
    # It was the batch's only job: the batch moves on to Reporting.
    assert batch_load(zk, job.bid).state == "Reporting"


def test_the_callback_is_in_the_jobs_notification_format(
    zk, files: FileServer, profiles: Path
) -> None:
    # Merritt's ingest writes the format into every batch (the request's, else the profile's,
    # else xml) and its Notify posts the job's state in it.
    _with_callback(profiles, files.url + "/hook")
    job = make_job(
        zk,
        {"payload_url": "http://x/a", "type": "file", "notificationFormat": "xml"},
        state="Notify",
    )
    daemon(zk, "notify").run_once()
    assert job_load(zk, job.jid).state == "Completed"
    [(_path, body)] = files.posts
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<job:jobState ')
    assert f"<job:jobID>{job.jid}</job:jobID>".encode() in body
    assert b"<job:jobStatus>COMPLETED</job:jobStatus>" in body


def test_the_callback_tells_what_merritts_job_state_displays(
    zk, files: FileServer, profiles: Path
) -> None:
    # Filled from the job's configuration and identifiers, as Merritt's Notify fills its
    # JobState; what that JobState no longer displays (batch ID, submitter, profile, object
    # state) is not told.
    _with_callback(profiles, files.url + "/hook")
    job = make_job(
        zk,
        {
            "payload_url": "http://x/a.txt",
            "type": "file",
            "batchID": "bid-8c6d2d4e",
            "filename": "a.txt",
            "title": "Letter one",
            "creator": "Ada Lovelace",
            "note": "from a script",
            "DCtitle": "Letter one, 1843",
            "notificationFormat": "json",
        },
        state="Notify",
        identifiers={"primary_id": "ark:/99999/fk4a", "local_id": ["letters-001"]},
    )
    daemon(zk, "notify").run_once()
    assert job_load(zk, job.jid).state == "Completed"
    [(_path, body)] = files.posts
    state = json.loads(body)["job:jobState"]
    assert set(state) == {
        "xmlns:job",
        "job:jobID",
        "job:packageName",
        "job:submissionDate",
        "job:jobStatus",
        "job:primaryID",
        "job:localID",
        "job:objectCreator",
        "job:objectTitle",
        "job:note",
        "job:dCtitle",
    }
    assert (state["job:primaryID"], state["job:localID"]) == ("ark:/99999/fk4a", "letters-001")
    assert (state["job:note"], state["job:dCtitle"]) == ("from a script", "Letter one, 1843")


def test_without_a_callback_the_job_simply_completes(zk) -> None:
    job = _notify_job(zk)
    daemon(zk, "notify").run_once()
    assert job_load(zk, job.jid).state == "Completed"


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_callback_the_receiver_refuses_is_logged_and_the_job_completes(
    zk, files: FileServer, profiles: Path, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Merritt's ingest logs a receiver's 4xx and its Notify step succeeds (HandlerCallback,
    CDLUC3/mrt-ingest 23a6bfd5 and 741379c3: docs/merritt-services.md, "Callbacks"); this
    console failed the job, stricter than the service it stands beside. The receiver answering
    401 or 403 (its credentials in the profile's URL refused) or 404 is posted to once, and the
    job completes, the refusal in its status message and the log."""
    _with_callback(profiles, files.url + "/hook")
    files.post_status = status
    job = _notify_job(zk)
    batch_transition(zk, batch_load(zk, job.bid), "Processing")
    with caplog.at_level("WARNING", logger="queues.daemons"):
        daemon(zk, "notify").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Completed", done.status.message
    assert done.status.message.startswith("callback not taken by the receiver: ")
    assert f"HTTP {status}" in done.status.message
    assert len(files.posts) == 1  # a refusal is not repeated
    assert any(
        job.jid in r.getMessage() and f"HTTP {status}" in r.getMessage() for r in caplog.records
    )
    assert batch_load(zk, job.bid).state == "Reporting"


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


def test_the_callback_service_is_kept_for_a_moment_by_profile(
    zk, profiles: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``services_of`` (asked whether the receiver is held, and told it answered: twice a job)
    looks the profile up once for the jobs of a collection within SERVICES_FOR s, and sees a
    changed callback once that has passed."""
    _with_callback(profiles, "http://127.0.0.1:9/hook")
    loaded: list[str] = []

    def counting(name: str) -> Any:
        loaded.append(name)
        return load_profile(name)

    monkeypatch.setattr(notify_module, "load_profile", counting)
    step = notify_module.Notify(zk=zk, poll=0.05)
    jobs = [_notify_job(zk) for _ in range(3)]
    first = step.services_of(jobs[0])
    assert first == (service_at("callback", "http://127.0.0.1:9/hook"),)
    assert [step.services_of(j) for j in jobs] == [first] * 3
    assert loaded == [DEMO]
    _with_callback(profiles, "http://127.0.0.2:9/hook")
    monkeypatch.setattr(notify_module, "SERVICES_FOR", 0.0)  # what kept it has passed
    assert step.services_of(jobs[1]) == (service_at("callback", "http://127.0.0.2:9/hook"),)
    assert loaded == [DEMO, DEMO]


def test_folders_are_removed_in_the_removers_thread_the_batch_folder_with_its_last_job(
    tmp_path: Path,
) -> None:
    """The loop that completes jobs hands their folders over and goes on (a large object's
    folder takes seconds to remove, and that loop's thread is the other short steps' too)."""
    threads: list[str] = []

    class Noting(FolderRemovals):
        def work(self, piece: tuple[Path, Path | None]) -> None:
            threads.append(threading.current_thread().name)
            super().work(piece)

    removals = Noting("removals-under-test")
    batch = tmp_path / "bid0000000001"
    first, second = batch / "jid0000000001", batch / "jid0000000002"
    for folder in (first, second):
        (folder / "object" / "producer").mkdir(parents=True)
        (folder / "object" / "producer" / "a.txt").write_text("x")
    removals.put((first, batch))
    assert removals.settle(timeout=30)
    assert not first.exists()
    assert second.exists()  # the batch folder stays while another job uses it
    removals.put((second, batch))
    assert removals.settle(timeout=30)
    assert not batch.exists()
    assert threads == ["removals-under-test"] * 2


def test_a_callback_receiver_away_is_asked_within_the_deadline_and_the_job_waits(
    zk, files: FileServer, profiles: Path, settings, monkeypatch
) -> None:
    """A receiver answering 503: the callback's attempts (0.5 s, then 1 s apart) share the
    depositor policy's deadline, here 1.4 s, so the third is not made (before, each attempt had
    a deadline of its own and all three were waited for); the job waits, it does not fail."""
    from queues.core import retries
    from queues.daemons import breakers

    monkeypatch.setattr(breakers, "_breakers", breakers.Breakers())
    settings.MRT_DOWNLOAD_DEADLINE = 1.4
    _with_callback(profiles, files.url + "/hook")
    files.post_status = 503
    job = _notify_job(zk)

    daemon(zk, "notify").run_once()

    waiting = job_load(zk, job.jid)
    assert waiting.state == "Notify"
    assert retries.current(waiting.status.raw) is not None, waiting.status.message
    assert "HTTP 503 (gave up after 2 attempts: the next repeat would wait 1s" in (
        waiting.status.message
    )
    assert len(files.posts) == 2
    assert workdir(job).exists()
