"""Downloading: every file into the working folder, digests checked, failures named."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

from queues.daemons.workfolder import object_dir
from queues.services import moves
from queues.zk.jobs import job_load

from .conftest import FileServer, daemon, make_job, md5, object_manifest


def _manifest_job(zk, files: FileServer, rows: list[dict]):
    url = files.put("m.checkm", object_manifest(rows))
    return make_job(zk, {"payload_url": url, "type": "object-manifest"}, state="Downloading")


def test_every_file_lands_in_the_producer_folder(zk, files: FileServer) -> None:
    rows = [
        {
            "url": files.put("a.txt", "alpha"),
            "filename": "a.txt",
            "hash_alg": "md5",
            "hash_value": md5("alpha"),
        },
        {"url": files.put("deep/b.txt", "beta"), "filename": "sub/b.txt"},
    ]
    job = _manifest_job(zk, files, rows)
    assert daemon(zk, "downloading").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Processing"
    producer = object_dir(done) / "producer"
    assert (producer / "a.txt").read_text() == "alpha"
    assert (producer / "sub/b.txt").read_text() == "beta"
    assert done.space_needed == 9


def test_wrong_digest_fails_naming_the_file_and_can_be_resumed(zk, files: FileServer) -> None:
    url = files.put("c.txt", "wrong content")
    rows = [{"url": url, "filename": "c.txt", "hash_alg": "md5", "hash_value": md5("right")}]
    job = _manifest_job(zk, files, rows)
    daemon(zk, "downloading").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert url in failed.status.message
    assert "digest" in failed.status.message
    assert not (object_dir(failed) / "producer" / "c.txt").exists()
    files.put("c.txt", "right")
    moves.job_resume(jid=job.jid)
    assert job_load(zk, job.jid).state == "Downloading"
    daemon(zk, "downloading").run_once()
    assert job_load(zk, job.jid).state == "Processing"


def test_missing_file_fails_naming_it(zk, files: FileServer) -> None:
    rows = [
        {"url": files.put("ok", "ok"), "filename": "ok"},
        {"url": files.url + "/nope", "filename": "nope"},
    ]
    job = _manifest_job(zk, files, rows)
    daemon(zk, "downloading").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert files.url + "/nope" in failed.status.message
    assert "404" in failed.status.message


def test_zip_and_tar_containers_are_unpacked(zk, files: FileServer) -> None:
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("dir/one.txt", "1")
    tarred = io.BytesIO()
    with tarfile.open(fileobj=tarred, mode="w:gz") as tf:
        info = tarfile.TarInfo("two.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"2"))
    for name, data, inside in (
        ("c.zip", zipped.getvalue(), "dir/one.txt"),
        ("c.tgz", tarred.getvalue(), "two.txt"),
    ):
        job = make_job(
            zk,
            {"payload_url": files.put(name, data), "type": "container", "filename": name},
            state="Downloading",
        )
        daemon(zk, "downloading").run_once()
        done = job_load(zk, job.jid)
        assert done.state == "Processing", done.status.message
        producer = object_dir(done) / "producer"
        assert (producer / inside).exists()
        assert not (producer / name).exists()


def test_file_urls_work_for_local_payloads(zk, tmp_path: Path) -> None:
    source = tmp_path / "local.txt"
    source.write_text("local")
    job = make_job(
        zk,
        {"payload_url": source.as_uri(), "type": "file", "filename": "local.txt"},
        state="Downloading",
    )
    daemon(zk, "downloading").run_once()
    done = job_load(zk, job.jid)
    assert (object_dir(done) / "producer" / "local.txt").read_text() == "local"


def test_a_manifest_cannot_list_files_outside_mrt_file_roots(zk, files: FileServer) -> None:
    # The submission check saw only the manifest's HTTP URL; the lines inside it are the
    # depositor's too, and the daemon refuses them.
    for url in ("file:///etc/hostname", "file:///etc/../etc/hostname"):
        job = _manifest_job(zk, files, [{"url": url, "filename": "stolen"}])
        daemon(zk, "downloading").run_once()
        failed = job_load(zk, job.jid)
        assert failed.state == "Failed"
        assert "outside the allowed folders" in failed.status.message
        assert not (object_dir(failed) / "producer" / "stolen").exists()


def test_a_rerun_starts_from_an_empty_object_folder(zk, files: FileServer) -> None:
    job = _manifest_job(zk, files, [{"url": files.put("a", "a"), "filename": "a"}])
    stale = object_dir(job) / "producer" / "stale.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier attempt")
    daemon(zk, "downloading").run_once()
    assert not stale.exists()
    assert (object_dir(job) / "producer" / "a").exists()


def test_a_server_away_for_longer_than_the_deadline_makes_the_job_wait_not_fail(
    zk, files: FileServer, settings, monkeypatch
) -> None:
    """503 every time, and a deadline shorter than the first repeat's back-off: the repeat is
    not made and the job waits to be tried again, its message saying why. Before, the repeat
    began past the deadline, was called too slow, and the job failed for an outage."""
    from queues.core import retries
    from queues.daemons import breakers, downloading

    monkeypatch.setattr(breakers, "_breakers", breakers.Breakers())
    monkeypatch.setattr(downloading, "BACKOFF", 4.0)
    settings.MRT_DOWNLOAD_DEADLINE = 2.0
    settings.MRT_DOWNLOAD_RETRIES = 3
    files.busy = 1_000
    url = files.put("away.txt", "alpha")
    job = make_job(
        zk, {"payload_url": url, "type": "file", "filename": "away.txt"}, state="Downloading"
    )

    daemon(zk, "downloading").run_once()

    waiting = job_load(zk, job.jid)
    assert waiting.state == "Downloading"
    assert retries.current(waiting.status.raw) is not None, waiting.status.message
    assert "waiting to try again" in waiting.status.message
    assert "HTTP 503" in waiting.status.message
    assert "the next repeat would wait 4s, past the exchange's deadline" in waiting.status.message
    assert files.hits("GET", "away.txt") == 1
