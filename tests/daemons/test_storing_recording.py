"""Storing and Recording: one version per content, per-object locks, idempotent records."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from queues.chaos.standins import (
    EzidStandIn,
    InventoryStandIn,
    StorageStandIn,
    exception_document,
    running,
)
from queues.daemons.storing import Storing
from queues.daemons.workfolder import object_dir
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


# Against Merritt's services -----------------------------------------------------------------


@contextmanager
def _served(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on loopback, as MRT_WORK_URL serves the working folders."""
    folder.mkdir(parents=True, exist_ok=True)
    handler = partial(_QuietFiles, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_storing_and_recording_with_merritts_services_and_a_resubmission_by_local_id(
    zk, files: FileServer, settings, profiles: Path
) -> None:
    demo = profiles / "merritt_demo_content.json"
    demo.write_text(json.dumps({**json.loads(demo.read_text()), "owner": "ark:/13030/j2own"}))
    with (
        running(EzidStandIn("apitest", "pw")) as ezid,
        running(StorageStandIn(nodes=(9501,))) as storage,
        running(InventoryStandIn()) as inventory,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_EZID_URL, settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = (
            ezid.url,
            "apitest",
            "pw",
        )
        settings.MRT_STORAGE_URL = storage.url
        settings.MRT_INVENTORY_URL = inventory.url
        settings.MRT_WORK_URL = work_url

        first = _processed(zk, files, identifiers={"primary_id": "", "local_id": ["loc-9"]})
        ark = first.primary_id
        assert ark == "ark:/99999/fk40001"
        assert inventory.local_ids == {("ark:/13030/j2own", "loc-9"): ark}
        assert ezid.identifiers[ark]["_target"].endswith("/m/ark%253A%252F99999%252Ffk40001")
        drive(zk, lambda: job_load(zk, first.jid).state == "Notify", names=["storing", "recording"])

        stored = job_load(zk, first.jid)
        manifest_url = f"{storage.url}/manifest/9501/ark%3A%2F99999%2Ffk40001"
        assert stored.inventory["manifest_url"] == manifest_url
        assert stored.inventory["version"] == 1
        [add] = storage.seen("POST")
        assert add.form()["url"] == stored.store["manifest_url"]
        assert add.form()["url"].startswith(work_url)
        assert inventory.added == [manifest_url]

        # The same local id again: the ARK comes from inventory, no second mint.
        second = _processed(
            zk, files, "b.txt", "two", identifiers={"primary_id": "", "local_id": ["loc-9"]}
        )
        assert second.primary_id == ark
        assert len(ezid.identifiers) == 1
        drive(
            zk, lambda: job_load(zk, second.jid).state == "Notify", names=["storing", "recording"]
        )
        assert job_load(zk, second.jid).inventory["version"] == 2

        # Storage failing (500): the job waits to try again, with storage's reason.
        third = _processed(zk, files, "c.txt", "three")
        storage.refuse_next(exception_document("GENERAL_EXCEPTION", "cloud write failed"))
        daemon(zk, "storing").run_once()
        failed = job_load(zk, third.jid)
        assert failed.state == "Storing"
        assert "waiting to try again" in failed.status.message
        assert "HTTP 500 GENERAL_EXCEPTION: cloud write failed" in failed.status.message


def _inventorys_try(zk) -> Any:
    """mrt-inventory's one try of the object lock in the add (``SaveObject.getLock`` at
    1fa68ac): create ``/locks/inventory/{ark'}`` in its own session, which it then closes, so the
    node is gone again; False when the node exists."""

    def take(ark: str) -> bool:
        lock = zpaths.inventory_lock(ark)
        if not lock_create(zk, lock):
            return False
        lock_release(zk, lock)
        return True

    return take


@contextmanager
def _merritts_storage_and_inventory(settings, **inventory: Any) -> Iterator[Any]:
    with (
        running(StorageStandIn(nodes=(9501,))) as storage,
        running(InventoryStandIn(**inventory)) as stand_in,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_STORAGE_URL = storage.url
        settings.MRT_INVENTORY_URL = stand_in.url
        settings.MRT_WORK_URL = work_url
        yield stand_in


def test_recording_is_recorded_by_an_inventory_whose_add_tries_the_object_lock(
    zk, other_zk, files: FileServer, settings
) -> None:
    # Once, Recording held /locks/inventory/{ark'} across its add: an inventory whose add tries
    # that lock once answered 200 and recorded nothing, and the job went on to Notify.
    with _merritts_storage_and_inventory(settings, object_lock=_inventorys_try(other_zk)) as inv:
        job = _processed(zk, files)
        drive(zk, lambda: job_load(zk, job.jid).state == "Notify", names=["storing", "recording"])
        done = job_load(zk, job.jid)
        assert inv.skipped == []
        assert inv.added == [done.inventory["manifest_url"]]
        assert inv.objects[done.primary_id] == (9501, 1)
        assert zk.exists(zpaths.inventory_lock(done.primary_id)) is None
        assert zk.exists(zpaths.recording_lock(done.primary_id)) is None


def test_recording_waits_while_merritts_inventory_or_another_recording_holds_the_object(
    zk, other_zk, files: FileServer, settings
) -> None:
    with _merritts_storage_and_inventory(settings) as inventory:
        job = _processed(zk, files)
        daemon(zk, "storing").run_once()
        ark = job_load(zk, job.jid).primary_id
        worker = daemon(zk, "recording")
        for lock in (zpaths.inventory_lock(ark), zpaths.recording_lock(ark)):
            assert lock_create(other_zk, lock)
            assert not worker.run_once()  # passed over, unclaimed
            assert job_load(zk, job.jid).state == "Recording"
            assert zk.exists(zpaths.job_node(job.jid, "lock")) is None
            lock_release(other_zk, lock)
        assert inventory.added == []
        assert worker.run_once()
        assert job_load(zk, job.jid).state == "Notify"
        assert len(inventory.added) == 1


def test_storages_password_stays_out_of_the_job_and_the_object(
    zk, files: FileServer, settings
) -> None:
    """``MRT_STORAGE_URL`` with a password (sent as Basic authentication) and the local
    inventory: the storage URL written into the job's ``inventory`` node (read by every client
    of ZooKeeper, Merritt's services among them), into the object's ``mrt-ingest.txt`` (kept
    with the object for good) and into the local inventory's record goes without it; the local
    inventory's own fetch of the manifest goes with it. Before, the password was in all three."""
    with (
        running(StorageStandIn(nodes=(9501,))) as storage,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_STORAGE_URL = storage.url.replace("http://", "http://merritt:s3cret@")
        settings.MRT_INVENTORY_URL = ""
        settings.MRT_WORK_URL = work_url
        job = _processed(zk, files)
        ingest = (object_dir(job) / "system" / "mrt-ingest.txt").read_text()
        assert f"storageService:\t{storage.url}\n" in ingest
        drive(zk, lambda: job_load(zk, job.jid).state == "Notify", names=["storing", "recording"])

        done = job_load(zk, job.jid)
        manifest_url = f"{storage.url}/manifest/9501/{quote(done.primary_id, safe='')}"
        assert done.inventory["manifest_url"] == manifest_url
        for node in ("inventory", "store", "status", "configuration"):
            data, _ = zk.get(zpaths.job_node(job.jid, node))
            assert b"s3cret" not in data, node
        recorded = InventoryVersion.objects.get(object__ark=done.primary_id, number=1)
        assert recorded.manifest_url == manifest_url
        basic = "Basic " + base64.b64encode(b"merritt:s3cret").decode()
        fetched = [r for r in storage.seen("GET") if r.path.startswith("/manifest/9501/")]
        assert fetched, "the local inventory did not read the object's manifest from storage"
        assert all(r.headers.get("Authorization") == basic for r in fetched)


# The storage manifest exactly as Processing wrote it before 2026-12-06 (fae22ba,
# queues/steps/erc.py ``storage_manifest``: ``write_checkm(rows, kind=OBJECT_MANIFEST)``), a
# row's seven cells ending with an empty mimeType.
_OLD_MANIFEST_HEAD = (
    "#%checkm_0.7\n"
    "#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n"
    "#%prefix | mrt: | http://merritt.cdlib.org/terms#\n"
    "#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n"
    "#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize "
    "| nfo:fileLastModified | nfo:fileName | mrt:mimeType\n"
)


def _as_an_older_console_wrote_it(manifest: Path, work_url: str, job: Any) -> bytes:
    """The job's storage manifest in the older console's bytes: every file of the object
    folder, in the order and with the URLs the older console wrote them."""
    folder = manifest.parent / "object"
    rows = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        url = f"{work_url}/{job.bid}/{job.jid}/object/{name}"
        rows.append(f"{url} | sha256 | {digest} | {path.stat().st_size} |  | {name} |\n")
    return (_OLD_MANIFEST_HEAD + "".join(rows) + "#%eof\n").encode("utf-8")


def test_a_storage_manifest_an_older_console_wrote_is_stored_as_an_add_manifest(
    zk, files: FileServer, settings
) -> None:
    # A job processed by a console before 2026-12-06 (a host not upgraded yet, or before the
    # upgrade) has a storage manifest with the object-manifest profile, which Merritt's storage
    # refuses (500) at every try: Storing writes it again as an add manifest.
    with (
        running(StorageStandIn(nodes=(9501,))) as storage,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_STORAGE_URL = storage.url
        settings.MRT_WORK_URL = work_url
        job = _processed(zk, files)
        manifest = Path(settings.MRT_WORK_DIR) / job.bid / job.jid / "mrt-storage-manifest.txt"
        assert job.store["manifest_url"] == f"{work_url}/{job.bid}/{job.jid}/{manifest.name}"
        old = _as_an_older_console_wrote_it(manifest, work_url, job)
        assert sorted(old.decode().splitlines()[5:-1]) == sorted(
            f"{line} |" for line in manifest.read_text().splitlines()[5:-1]
        )  # the same files, URLs and digests as the add manifest Processing writes now
        manifest.write_bytes(old)

        daemon(zk, "storing").run_once()
        stored = job_load(zk, job.jid)
        assert stored.state == "Recording", stored.status.message
        assert stored.inventory["version"] == 1
        [add] = storage.seen("POST")
        assert add.form()["url"] == job.store["manifest_url"]
        assert b"/store/manifest/mrt-add-manifest\n" in manifest.read_bytes()
