"""Storing against a stand-in of Merritt's storage, which makes a version for every add: a
consumer that loses its session between the add and the move does not cost the object a second
version when the next claimer stores the job (issue 23, item 3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.chaos.standins import StorageStandIn, exception_document, running
from queues.daemons import clients
from queues.daemons.base import SessionGate
from queues.daemons.storing import Storing
from queues.daemons.workfolder import STORAGE_MANIFEST, object_dir, work_relative, workdir
from queues.steps.erc import SYSTEM_DIR, http_url_for, write_storage_manifest
from queues.zk import paths as zpaths
from queues.zk.jobs import job_load, job_transition
from queues.zk.locks import lock_create
from queues.zk.records import Job
from queues.zk.store_intents import store_intent_read

from .conftest import FileServer, drive, expire_session, make_job, serving, wait_for

pytestmark = pytest.mark.django_db


class _WorkFolder(ThreadingHTTPServer):
    # Called with each GET's path before it is answered: where a test acts while a consumer
    # reads the storage manifest.
    on_get: Callable[[str], None] | None = None


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        hook = getattr(self.server, "on_get", None)
        if hook is not None:
            hook(self.path)
        super().do_GET()


@contextmanager
def _served(folder: Path) -> Iterator[_WorkFolder]:
    """``folder`` over HTTP on loopback, as MRT_WORK_URL serves the working folders."""
    folder.mkdir(parents=True, exist_ok=True)
    handler = partial(_QuietFiles, directory=str(folder))
    with serving(_WorkFolder(("127.0.0.1", 0), handler)) as server:
        yield server


@pytest.fixture
def work_folder(settings: Any) -> Iterator[_WorkFolder]:
    with _served(Path(settings.MRT_WORK_DIR)) as server:
        settings.MRT_WORK_URL = f"http://127.0.0.1:{server.server_address[1]}"
        yield server


@pytest.fixture
def merritt_storage(settings: Any, work_folder: _WorkFolder) -> Iterator[StorageStandIn]:
    with running(StorageStandIn(nodes=(9501,))) as storage:
        settings.MRT_STORAGE_URL = storage.url
        yield storage


def _in_storing(zk: KazooClient, files: FileServer, name: str, text: str) -> Job:
    job = make_job(
        zk,
        {"payload_url": files.put(name, text), "type": "file", "filename": name},
        state="Downloading",
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=["downloading", "processing"])
    return job_load(zk, job.jid)


def test_a_claim_lost_between_add_and_move_costs_no_second_version(
    zk: KazooClient,
    other_zk: KazooClient,
    zk_hosts: str,
    own_zk: tuple[KazooClient, SessionGate],
    files: FileServer,
    merritt_storage: StorageStandIn,
) -> None:
    client, gate = own_zk
    job = _in_storing(zk, files, "a.txt", "content")
    old = client.client_id[0]
    next_claims: list[bool] = []

    def lose_the_session_then_let_the_next_consumer_claim(_ark: str, _version: int) -> None:
        # Storage has made the version; its answer has not reached the consumer yet.
        merritt_storage.on_add = None
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)
        next_claims.append(Storing(zk=other_zk).run_once())

    merritt_storage.on_add = lose_the_session_then_let_the_next_consumer_claim
    first = Storing(zk=client, gate=gate)
    first.run_once()

    assert next_claims == [True]
    assert first.last is not None and first.last.outcome in ("waiting", "dropped")
    assert len(merritt_storage.seen("POST")) == 1
    [stored] = merritt_storage.objects.values()
    assert stored.versions == [1]
    done = job_load(zk, job.jid)
    assert done.state == "Recording", done.status.message
    assert done.inventory["version"] == 1
    assert store_intent_read(zk, job.jid) is None


def test_an_add_that_made_no_version_is_sent_again_on_resume(
    zk: KazooClient, files: FileServer, merritt_storage: StorageStandIn
) -> None:
    earlier = _in_storing(zk, files, "a.txt", "first content")
    drive(zk, lambda: job_load(zk, earlier.jid).state == "Recording", names=["storing"])
    # A second job of the same object, whose add storage refuses: no version is made.
    job = make_job(
        zk,
        {"payload_url": files.put("b.txt", "second"), "type": "file", "filename": "b.txt"},
        state="Downloading",
        identifiers={"primary_id": earlier.primary_id, "local_id": []},
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Storing", names=["downloading", "processing"])
    merritt_storage.refuse_next(exception_document("REQUEST_INVALID", "cloud says no"), "POST")
    Storing(zk=zk).run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed", failed.status.message
    intent = store_intent_read(zk, job.jid)
    assert intent is not None and intent.manifest_url == failed.store["manifest_url"]
    assert intent.versions_before == "1"

    job_transition(zk, failed, "Storing", admin=True, retry=True)
    Storing(zk=zk).run_once()

    stored = job_load(zk, job.jid)
    assert stored.state == "Recording", stored.status.message
    assert stored.inventory["version"] == 2
    [versions] = [o.versions for o in merritt_storage.objects.values()]
    assert versions == [1, 2]
    assert store_intent_read(zk, job.jid) is None


def test_a_consumer_whose_claim_went_with_its_session_neither_records_nor_adds(
    zk: KazooClient,
    other_zk: KazooClient,
    zk_hosts: str,
    own_zk: tuple[KazooClient, SessionGate],
    files: FileServer,
    work_folder: _WorkFolder,
    merritt_storage: StorageStandIn,
) -> None:
    client, gate = own_zk
    job = _in_storing(zk, files, "a.txt", "content")
    old = client.client_id[0]

    def lose_the_session_and_the_claim(path: str) -> None:
        if not path.endswith(".txt") or work_folder.on_get is None:
            return
        work_folder.on_get = None
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)
        # The next consumer claims the job: its lock exists again, but it is not ours.
        assert lock_create(other_zk, zpaths.job_node(job.jid, "lock"))

    work_folder.on_get = lose_the_session_and_the_claim
    first = Storing(zk=client, gate=gate)
    first.run_once()

    # Its write of the add record is fenced by the claim's session: dropped, nothing written.
    assert first.last is not None and first.last.outcome == "dropped", first.last
    assert first.last.detail == "lock lost with the session"
    assert merritt_storage.seen("POST") == []
    assert store_intent_read(zk, job.jid) is None
    still = job_load(zk, job.jid)
    assert still.state == "Storing"
    assert still.lock is not None and still.lock.session_id == other_zk.client_id[0]


def test_a_landed_add_is_found_when_a_lost_claim_wrote_the_working_folder_again(
    zk: KazooClient,
    other_zk: KazooClient,
    zk_hosts: str,
    own_zk: tuple[KazooClient, SessionGate],
    files: FileServer,
    merritt_storage: StorageStandIn,
) -> None:
    """The 1,000-job chaos run's extra version: storage made the version, the claim was lost
    before its answer, and a step of an older lost claim (Processing, paused past its session)
    wrote the working folder again, so the manifest the next claimer reads no longer matches
    the stored version. That claimer must take the version the add made, not add another."""
    client, gate = own_zk
    job = _in_storing(zk, files, "a.txt", "content")
    old = client.client_id[0]
    next_claims: list[bool] = []

    def lose_the_session_and_rewrite_the_folder(_ark: str, _version: int) -> None:
        merritt_storage.on_add = None
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)
        target = object_dir(job)
        (target / SYSTEM_DIR / "mrt-ingest.txt").write_text("written again by a lost claim\n")
        served = clients.work_url(work_relative(target))
        write_storage_manifest(
            target, workdir(job) / STORAGE_MANIFEST, url_for=http_url_for(served or "")
        )
        next_claims.append(Storing(zk=other_zk).run_once())

    merritt_storage.on_add = lose_the_session_and_rewrite_the_folder
    Storing(zk=client, gate=gate).run_once()

    assert next_claims == [True]
    assert len(merritt_storage.seen("POST")) == 1
    [stored] = merritt_storage.objects.values()
    assert stored.versions == [1]
    done = job_load(zk, job.jid)
    assert done.state == "Recording", done.status.message
    assert done.inventory["version"] == 1
