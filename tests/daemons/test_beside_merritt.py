"""The two deployment modes, and living beside Merritt's own services on one ZooKeeper.

* A batch and jobs written as Merritt's ingest writes them (its keys, no payload_url) are never
  moved or failed by this console's consumers, in any state, and not looked at again until
  they change.
* Processing writes ``store`` and ``inventory`` nodes that parse the way Merritt's storage
  consumer parses them (``StoreConsumeData.run`` in CDLUC3/mrt-store: ``mode`` split on ``/``
  into action, integer node, URL-decoded ARK; ``delete`` read as a string).
* Beside Merritt, ``all`` leaves Storing and Recording to Merritt's services: a job our
  Processing finished stays in Storing for Merritt's storage service.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import unquote_plus

import pytest
from django.core.management import CommandError, call_command

from queues.core.states import JOB_STEPS
from queues.daemons.registry import DAEMONS, daemon_classes, owned_steps
from queues.daemons.workfolder import object_dir
from queues.zk import paths as zpaths
from queues.zk.batches import batch_load
from queues.zk.jobs import job_configuration_update, job_load

from .conftest import FileServer, daemon, drive, make_job, md5
from .merritt_ingest import merritt_batch, merritt_job

pytestmark = pytest.mark.django_db

WORKING = [s for s in JOB_STEPS if s != "Completed"]


def _snapshot(zk: Any, jid: str) -> tuple[str, int, dict[str, Any]]:
    job = job_load(zk, jid)
    return job.state, job.status.version, job.configuration


def test_jobs_written_by_merritt_ingest_are_never_moved_or_failed(zk) -> None:
    batch = merritt_batch(zk)
    made = [merritt_job(zk, batch, state=state) for state in WORKING]
    before = {j.jid: _snapshot(zk, j.jid) for j in made}
    batch_version = batch_load(zk, batch.bid).status.version
    consumers = [daemon(zk, name) for name in DAEMONS]
    for _ in range(3):
        for consumer in consumers:
            consumer.run_once()
    assert {j.jid: _snapshot(zk, j.jid) for j in made} == before
    assert all(zk.exists(zpaths.job_node(j.jid, "lock")) is None for j in made)
    assert batch_load(zk, batch.bid).state == "Pending"
    assert batch_load(zk, batch.bid).status.version == batch_version
    assert zk.exists(zpaths.batch_node(batch.bid, "lock")) is None


def test_a_merritt_job_is_passed_over_once_with_the_reason_then_left_until_it_changes(
    zk, caplog: pytest.LogCaptureFixture
) -> None:
    job = merritt_job(zk)
    pending = daemon(zk, "pending")
    assert pending.run_once()
    assert pending.last is not None and pending.last.outcome == "skipped"
    reason = pending.last.detail
    assert reason.startswith("not processable by this console's daemons: written by Merritt")
    assert f"queue/{job.configuration['batchID']}/{job.configuration['jobID']}/producer" in reason
    assert reason in caplog.text  # one log line says so
    # Not claimed again, so no consumer spins on it: nothing to do.
    assert not pending.run_once()
    assert pending.last is None
    assert not pending.run_once()
    # Once it changes (here it gains a payload this console can reach) it is looked at again.
    job_configuration_update(zk, job.jid, {"payload_url": "http://h/letters.pdf"})
    assert pending.run_once()
    assert job_load(zk, job.jid).state == "Estimating"


def test_a_merritt_batch_is_left_for_merritt_ingest_not_failed(zk) -> None:
    batch = merritt_batch(zk)
    consumer = daemon(zk, "batch-pending")
    assert consumer.run_once()
    assert consumer.last is not None and consumer.last.outcome == "skipped"
    assert "written by Merritt's ingest" in consumer.last.detail
    assert not consumer.run_once()  # passed over until it changes
    assert batch_load(zk, batch.bid).state == "Pending"


def _java_store_consumer_reads(store: dict[str, Any]) -> tuple[str, str, int, str, str]:
    """What Merritt's StoreConsumeData.run takes from the store node (getString on each key:
    a value that is not a string makes it fail the job)."""
    manifest_url = store["manifest_url"]
    mode = store["mode"]
    assert isinstance(manifest_url, str) and isinstance(mode, str)
    strarr = mode.split("/")
    action = strarr[0]
    node = int(strarr[1])
    object_id = unquote_plus(strarr[2])  # URLDecoder.decode(..., UTF-8)
    delete = store["delete"]
    assert isinstance(delete, str)
    return manifest_url, action, node, object_id, delete


def _beside(settings: Any, **more: Any) -> None:
    settings.MRT_DEPLOYMENT = "beside-merritt"
    # These tests are about our intake daemons beside Merritt's storage and inventory.
    settings.MRT_BATCH_INTAKE = "console"
    settings.MRT_WORK_URL = "http://ingest.example.org/work"
    settings.MRT_STORAGE_URL = "http://store.example.org:35121"
    for key, value in more.items():
        setattr(settings, key, value)


def test_beside_merritt_processing_writes_merritts_nodes_and_leaves_the_job_in_storing(
    zk, files: FileServer, settings
) -> None:
    _beside(settings, MRT_OWN_STEPS="")
    names = [cls.name for cls in daemon_classes("all")]
    assert "storing" not in names and "recording" not in names
    job = make_job(
        zk,
        {"payload_url": files.put("a.txt", "content"), "type": "file", "filename": "a.txt"},
        state="Downloading",
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=names)
    for _ in range(3):  # everything this console serves, again: the job stays for Merritt
        for name in names:
            daemon(zk, name).run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Storing", done.status.message
    assert zk.exists(zpaths.job_node(job.jid, "lock")) is None
    ark = done.primary_id
    assert set(done.store) == {"manifest_url", "mode", "delete"}
    manifest_url, action, node, object_id, delete = _java_store_consumer_reads(done.store)
    assert (action, node, object_id, delete) == ("add", 9501, ark, "")
    assert manifest_url.startswith("http://ingest.example.org/work/")
    assert manifest_url.endswith("/mrt-storage-manifest.txt")
    assert done.inventory == {
        "manifest_url": "http://store.example.org:35121/manifest/9501/"
        + ark.replace(":", "%3A").replace("/", "%2F"),
        "mode": "",
    }


def test_processing_writes_an_update_with_its_delete_list_as_merritt_does(
    zk, files: FileServer
) -> None:
    job = make_job(
        zk,
        {"payload_url": "http://x/a.txt", "type": "file", "filename": "a.txt", "update": True},
        state="Processing",
        identifiers={"primary_id": "ark:/99999/fk4upd", "local_id": []},
    )
    producer = object_dir(job) / "producer"
    producer.mkdir(parents=True)
    (producer / "a.txt").write_text("new")
    (producer / "mrt-delete.txt").write_text("old.txt\nproducer/sub/older.txt\n\n")
    assert daemon(zk, "processing").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Storing", done.status.message
    _url, action, node, object_id, delete = _java_store_consumer_reads(done.store)
    assert (action, node, object_id) == ("update", 9501, "ark:/99999/fk4upd")
    assert delete == "producer/old.txt\nproducer/sub/older.txt\n"
    assert (object_dir(done) / "system" / "mrt-delete.txt").is_file()
    assert not (producer / "mrt-delete.txt").exists()


def test_standalone_storing_and_recording_read_the_nodes_processing_wrote(
    zk, files: FileServer
) -> None:
    job = make_job(
        zk,
        {"payload_url": files.put("b.txt", "bee"), "type": "file", "filename": "b.txt"},
        state="Downloading",
        metadata={"erc_what": "Bee"},
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Notify", names=list(DAEMONS)[:8])
    done = job_load(zk, job.jid)
    assert done.inventory["mode"] == ""
    assert done.inventory["version"] == 1
    assert isinstance(done.store["delete"], str)


def test_runconsumer_refuses_a_step_the_deployment_leaves_to_merritt(zk, settings) -> None:
    _beside(settings, MRT_OWN_STEPS="")
    for name in ("storing", "recording", "access-small", "access-large"):
        with pytest.raises(CommandError, match=f"{name} is not a step this deployment serves"):
            call_command("runconsumer", name, "--once")
    call_command("runconsumer", "pending", "--once")  # an owned one runs
    # MRT_OWN_STEPS names exactly what runs.
    settings.MRT_OWN_STEPS = "processing,storing"
    assert owned_steps() == ["processing", "storing"]
    call_command("runconsumer", "storing", "--once")
    with pytest.raises(CommandError, match="MRT_OWN_STEPS does not name it"):
        call_command("runconsumer", "pending", "--once")


def test_runconsumer_refuses_settings_that_cannot_work(zk, settings) -> None:
    settings.MRT_OWN_STEPS = "pending,nonsense"
    with pytest.raises(CommandError, match="MRT_OWN_STEPS names no daemon 'nonsense'"):
        call_command("runconsumer", "all", "--once")
    settings.MRT_OWN_STEPS = ""
    settings.MRT_DEPLOYMENT = "somewhere"
    with pytest.raises(CommandError, match="MRT_DEPLOYMENT must be one of"):
        call_command("runconsumer", "all", "--once")
    _beside(settings, MRT_WORK_URL="", MRT_OWN_STEPS="")
    with pytest.raises(CommandError, match="set MRT_WORK_URL"):
        call_command("runconsumer", "all", "--once")


def test_standalone_serves_every_step(settings) -> None:
    settings.MRT_DEPLOYMENT = "standalone"
    settings.MRT_OWN_STEPS = ""
    assert owned_steps() == list(DAEMONS)
    assert [cls.name for cls in daemon_classes("all")] == list(DAEMONS)


def test_a_digest_in_merritts_keys_is_checked(zk, files: FileServer) -> None:
    # A job whose configuration has only Merritt's digest keys (and a payload we can reach).
    job = make_job(
        zk,
        {
            "payload_url": files.put("c.txt", "sea"),
            "type": "file",
            "filename": "c.txt",
            "digestType": "MD5",
            "digestValue": md5("not sea"),
        },
        state="Downloading",
    )
    daemon(zk, "downloading").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "digest" in failed.status.message


@pytest.mark.parametrize("digest_type", ["SHA-256", "sha256"])
def test_a_sha256_digest_in_merritts_spelling_or_ours_is_checked(
    zk, files: FileServer, digest_type: str
) -> None:
    """``SHA-256`` as Merritt's ingest writes a job's ``digestType``, ``sha256`` as this console
    wrote it before: either names the algorithm the download is checked with."""
    good = make_job(
        zk,
        {
            "payload_url": files.put("s.txt", "sea"),
            "type": "file",
            "filename": "s.txt",
            "digestType": digest_type,
            "digestValue": hashlib.sha256(b"sea").hexdigest(),
        },
        state="Downloading",
    )
    bad = make_job(
        zk,
        {
            "payload_url": files.put("t.txt", "sea"),
            "type": "file",
            "filename": "t.txt",
            "digestType": digest_type,
            "digestValue": hashlib.sha256(b"not sea").hexdigest(),
        },
        state="Downloading",
    )
    drive(
        zk,
        lambda: all(job_load(zk, j.jid).state != "Downloading" for j in (good, bad)),
        names=["downloading"],
    )
    failed = job_load(zk, bad.jid)
    assert failed.state == "Failed", failed.status.message
    assert "digest" in failed.status.message and "sha256" in failed.status.message
    downloaded = job_load(zk, good.jid)
    assert downloaded.state == "Processing", downloaded.status.message
    assert (object_dir(downloaded) / "producer" / "s.txt").read_text() == "sea"
