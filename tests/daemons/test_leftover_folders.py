"""The working folders no job will use again, removed by the retention sweep
(``workfolder.leftover_folders``): a completed job's a killed process did not remove, a deleted
job's, a removed job's; never a folder a job may still use, nor one the sweep cannot name."""

from __future__ import annotations

from pathlib import Path

from queues.daemons.workfolder import leftover_folders, remove_leftover_folders, workdir
from queues.zk.jobs import job_remove, job_transition
from tests.core.test_contract_conformance import mark_deleted_like_the_library

from .conftest import daemon, make_job


def _folder(path: Path) -> Path:
    (path / "object" / "producer").mkdir(parents=True)
    (path / "object" / "producer" / "a.txt").write_text("payload")
    return path


def test_the_folders_of_ended_and_removed_jobs_go_and_the_others_stay(zk, settings, tmp_path):
    settings.MRT_WORK_DIR = str(tmp_path / "work")
    config = {"payload_url": "http://x/a", "type": "file"}
    completed = make_job(zk, config, state="Completed")
    failed = job_transition(zk, make_job(zk, config, state="Downloading"), "Failed")
    deleted = make_job(zk, config, state="Downloading")
    mark_deleted_like_the_library(zk, job_transition(zk, deleted, "Failed"))
    downloading = make_job(zk, config, state="Downloading")
    processing = make_job(zk, config, state="Processing")
    gone = make_job(zk, config, state="Completed")
    job_remove(zk, gone)
    for job in (completed, failed, deleted, downloading, processing, gone):
        _folder(workdir(job))
    # Under another batch's folder than its own: not this sweep's to judge.
    stray = _folder(workdir(completed).parent.parent / processing.bid / completed.jid)
    # A job still being made (its node, no status yet): not judged.
    zk.create("/jobs/jid0000000777")
    half = _folder(tmp_path / "work" / processing.bid / "jid0000000777")
    # Names that are no IDs, and a link that looks like a job's folder: left alone.
    odd = _folder(tmp_path / "work" / "lost+found" / "jid0000000001")
    notes = tmp_path / "work" / deleted.bid / "notes.txt"
    notes.write_text("kept")
    outside = _folder(tmp_path / "elsewhere")
    link = workdir(gone).parent / "jid0000009999"
    link.symlink_to(outside, target_is_directory=True)

    assert sorted(leftover_folders(zk)) == sorted(
        [workdir(completed), workdir(deleted), workdir(gone)]
    )
    assert remove_leftover_folders(zk) == 3
    for job in (completed, deleted, gone):
        assert not workdir(job).exists()
    assert not workdir(completed).parent.exists()  # its batch folder went with its last job
    assert workdir(deleted).parent.exists()  # another file still in it
    for job in (failed, downloading, processing):
        assert (workdir(job) / "object" / "producer" / "a.txt").read_text() == "payload"
    assert stray.exists() and half.exists() and odd.exists() and notes.exists()
    assert (outside / "object" / "producer" / "a.txt").exists()
    assert link.is_symlink()
    assert leftover_folders(zk) == []  # nothing more the next time


def test_no_working_folder_yet_is_nothing_to_sweep(zk, settings, tmp_path):
    settings.MRT_WORK_DIR = str(tmp_path / "not-made-yet")
    assert leftover_folders(zk) == []


def test_the_retention_sweep_removes_them_and_says_how_many(zk, db, settings, tmp_path):
    settings.MRT_WORK_DIR = str(tmp_path / "work")
    job = make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Completed")
    _folder(workdir(job))
    retention = daemon(zk, "retention")
    retention.run_once()
    assert retention.last is not None and retention.last.outcome == "ok"
    assert "1 working folders of ended or removed jobs removed" in retention.last.detail
    assert not workdir(job).exists()
