"""Storing and Recording: one version per content, per-object locks, idempotent records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from queues.daemons.storing import Storing
from queues.models import InventoryObject, InventoryVersion
from queues.steps.storage import LocalStorage
from queues.zk import paths as zpaths
from queues.zk.jobs import job_load, job_transition
from queues.zk.locks import lock_create, lock_release

from .conftest import FileServer, daemon, drive, make_job

pytestmark = pytest.mark.django_db


def _processed(zk, files: FileServer, name: str = "a.txt", text: str = "content", **kw):
    job = make_job(
        zk,
        {"payload_url": files.put(name, text), "type": "file", "filename": name},
        state="Downloading",
        **kw,
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=["downloading", "processing"])
    return job_load(zk, job.jid)


def _storage(settings: Any) -> LocalStorage:
    return LocalStorage(Path(settings.MRT_STORAGE_ROOT))


def test_storing_adds_a_version_and_hands_it_to_recording(zk, files: FileServer, settings) -> None:
    job = _processed(zk, files)
    daemon(zk, "storing").run_once()
    stored = job_load(zk, job.jid)
    assert stored.state == "Recording", stored.status.message
    assert _storage(settings).versions(stored.primary_id) == [1]
    assert stored.inventory["version"] == 1
    assert stored.inventory["manifest_url"].startswith("file://")
    names = [f.name for f in _storage(settings).fetch_object(stored.primary_id)]
    assert "producer/a.txt" in names
    assert "system/mrt-erc.txt" in names


def test_storing_and_recording_read_their_own_files_whatever_mrt_file_roots_says(
    zk, files: FileServer, settings, tmp_path: Path
) -> None:
    # MRT_FILE_ROOTS limits depositors; the storage manifest in the working folder and the
    # version manifest in local storage are this system's own and must stay readable. (Once,
    # with it set to a deposits folder, recording could not read storage's version manifest.)
    job = _processed(zk, files)
    settings.MRT_FILE_ROOTS = [tmp_path / "deposits"]
    drive(zk, lambda: job_load(zk, job.jid).state == "Notify", names=["storing", "recording"])
    assert InventoryObject.objects.filter(ark=job_load(zk, job.jid).primary_id).exists()


def test_storing_twice_keeps_one_version(zk, files: FileServer, settings) -> None:
    job = _processed(zk, files)
    daemon(zk, "storing").run_once()
    once = job_load(zk, job.jid)
    # As if the consumer died after storage answered but before the move.
    failed = job_transition(zk, once, "Failed", message="x")
    job_transition(zk, failed, "Storing", admin=True, retry=True)
    daemon(zk, "storing").run_once()
    assert job_load(zk, job.jid).state == "Recording"
    assert _storage(settings).versions(once.primary_id) == [1]


def test_a_locked_object_waits_without_blocking_the_queue(
    zk, other_zk, files: FileServer, settings
) -> None:
    first = _processed(zk, files, "a.txt", "one", priority=1)
    second = _processed(zk, files, "b.txt", "two", priority=2)
    lock = zpaths.storage_lock(first.primary_id)
    assert lock_create(other_zk, lock)
    worker = Storing(zk=zk)
    assert worker.run_once()
    assert job_load(zk, second.jid).state == "Recording"
    assert job_load(zk, first.jid).state == "Storing"
    assert not worker.run_once()
    lock_release(other_zk, lock)
    assert worker.run_once()
    assert job_load(zk, first.jid).state == "Recording"


def test_recording_writes_the_local_inventory_once(zk, files: FileServer) -> None:
    job = _processed(zk, files, identifiers={"primary_id": "", "local_id": ["loc-5"]})
    drive(zk, lambda: job_load(zk, job.jid).state == "Notify", names=["storing", "recording"])
    done = job_load(zk, job.jid)
    obj = InventoryObject.objects.get(ark=done.primary_id)
    assert obj.local_id == "loc-5"
    version = InventoryVersion.objects.get(object=obj)
    assert version.number == 1
    assert {f.path for f in version.files.all()} >= {"producer/a.txt", "system/mrt-erc.txt"}
    failed = job_transition(zk, done, "Failed", message="x")
    job_transition(zk, failed, "Recording", admin=True, retry=True)
    daemon(zk, "recording").run_once()
    assert InventoryVersion.objects.filter(object=obj).count() == 1
    assert job_load(zk, job.jid).state == "Notify"


def test_recording_without_a_stored_version_fails(zk) -> None:
    job = make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Recording")
    daemon(zk, "recording").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "Storing" in failed.status.message
