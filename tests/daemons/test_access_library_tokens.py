"""Access requests written the way Merritt writes them (mrt-zk's Access.createAssembly with the
token of mrt-store's QueueUtil / TokenPostState), handled by our access consumers against real
ZooKeeper: each documented form is either assembled or failed with a message naming what is
missing. The sources of every form are in docs/merritt-access.md."""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from queues.steps.erc import write_storage_manifest
from queues.steps.storage import LocalStorage
from queues.zk.access import access_create, access_load

from .conftest import FileServer, daemon

ARK = "ark:/99999/fk4lib"
TOP = "ark+=99999=fk4lib"
UUID = "8423294b-8cb7-49e5-b42b-2a4a6f3596e2"

# The queue entry as mrt-store's storage service queues it (QueueUtil.queueAccessRequest's
# sample), with the library's other documented keys (Access.url, anticipatedAvailabilityTime).
QUEUE_ENTRY: dict[str, Any] = {
    "status": 201,
    "token": UUID,
    "cloud-content-byte": 206290233,
    "delivery-node": 7001,
    "message": "Request queued, use token to check status",
    "url": "",
    "anticipated-availability-time": "2026-11-21T10:15:30-08:00",
}


def assembly_request(**changes: Any) -> dict[str, Any]:
    """Merritt storage's assembly request document (TokenStatus.getJson's keys)."""
    doc: dict[str, Any] = {
        "nodeIOName": "nodes-prod",
        "extractNode": 9502,
        "deliveryNode": 7001,
        "objectIDS": ARK,
        "versionID": 0,
        "token": UUID,
        "cloudContentBytes": 206290233,
        "archiveContent": "producer",
        "archiveType": "zip",
        "tokenStatusEnum": "Queued",
        "filterList": ["mrt-erc.txt"],
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.fixture
def stored(settings: Any, tmp_path: Path) -> LocalStorage:
    """Two versions of ARK in the local store the consumers read."""
    storage = LocalStorage(Path(settings.MRT_STORAGE_ROOT))
    for number, text in ((1, "first"), (2, "second")):
        src = tmp_path / f"obj{number}"
        (src / "producer").mkdir(parents=True)
        (src / "producer" / "a.txt").write_text(text)
        (src / "producer" / "mrt-erc.txt").write_text("erc: depositor's own")
        (src / "system").mkdir()
        (src / "system" / "mrt-erc.txt").write_text("erc:")
        manifest = tmp_path / f"manifest{number}.txt"
        write_storage_manifest(src, manifest)
        storage.store(ark=ARK, manifest_url=manifest.as_uri())
    return storage


def run(zk: Any, token: dict[str, Any], queue: str = "small") -> Any:
    item = access_create(zk, queue=queue, token=token)
    daemon(zk, f"access-{queue}").run_once()
    return access_load(zk, queue, item.qid)


def kept_library_keys(done: Any) -> None:
    """Every key the library wrote is still there, typed as it wrote it."""
    for key in ("token", "delivery-node", "cloud-content-byte", "status"):
        assert done.token[key] == QUEUE_ENTRY[key]


# Form 3: the queue entry, with its assembly request readable ---------------------------------


@pytest.mark.parametrize("queue", ["small", "large"])
def test_queue_entry_is_assembled_from_its_request_in_a_folder(
    zk, settings, tmp_path, stored, queue
) -> None:
    requests_dir = tmp_path / "tokens"
    (requests_dir / UUID).mkdir(parents=True)
    (requests_dir / UUID / "status").write_text(json.dumps(assembly_request()))
    settings.MRT_ACCESS_REQUESTS_URL = str(requests_dir)

    done = run(zk, dict(QUEUE_ENTRY), queue)

    assert done.state == "Completed", done.status.message
    kept_library_keys(done)
    path = Path(done.token["path"])
    assert path.name == f"{queue}-{done.qid}-{TOP}_producer.zip"
    assert done.token["url"].endswith("/" + path.name)
    assert done.token["size"] == path.stat().st_size
    with zipfile.ZipFile(path) as zf:
        # the current version's producer files, less the ones the request's filterList names
        assert zf.namelist() == [f"{TOP}/producer/a.txt"]
        assert zf.read(f"{TOP}/producer/a.txt") == b"second"


def test_queue_entry_is_assembled_from_its_request_over_http(
    zk, settings, files: FileServer, stored
) -> None:
    files.put(
        f"tokens/{UUID}/status",
        json.dumps(assembly_request(archiveContent="version", versionID=1, archiveType="targz")),
    )
    settings.MRT_ACCESS_REQUESTS_URL = f"{files.url}/tokens"

    done = run(zk, dict(QUEUE_ENTRY))

    assert done.state == "Completed", done.status.message
    assert done.status.message.endswith("(merritt-assembly-request)")
    kept_library_keys(done)
    path = Path(done.token["path"])
    assert path.name.endswith(f"{TOP}_v1.tar.gz")
    with tarfile.open(path, "r:gz") as tf:
        assert sorted(tf.getnames()) == [
            f"{TOP}/producer/a.txt",
            f"{TOP}/producer/mrt-erc.txt",
            f"{TOP}/system/mrt-erc.txt",
        ]
        member = tf.extractfile(f"{TOP}/producer/a.txt")
        assert member is not None and member.read() == b"first"


# Form 3 failed, each naming exactly what is missing ----------------------------------------


def test_queue_entry_without_a_readable_request_fails_naming_where_it_is(zk, settings) -> None:
    settings.MRT_ACCESS_REQUESTS_URL = ""

    done = run(zk, dict(QUEUE_ENTRY))

    assert done.state == "Failed"
    message = done.status.message
    assert message.startswith("access-small: the token names no object")
    assert f"{UUID}/status on delivery node 7001" in message
    assert "MRT_ACCESS_REQUESTS_URL" in message
    kept_library_keys(done)
    assert "path" not in done.token


def test_queue_entry_whose_request_is_not_there_fails(zk, settings, files: FileServer) -> None:
    settings.MRT_ACCESS_REQUESTS_URL = files.url

    done = run(zk, dict(QUEUE_ENTRY))

    assert done.state == "Failed"
    assert f"there is no assembly request at {files.url}/{UUID}/status (HTTP 404)" in (
        done.status.message
    )


def test_token_with_neither_object_nor_uuid_fails(zk) -> None:
    done = run(zk, {"status": 201, "delivery-node": 7001, "cloud-content-byte": 10})

    assert done.state == "Failed"
    assert "no Merritt token (UUID) to find its assembly request by" in done.status.message


# Form 2: the assembly request carried in the token node itself -----------------------------


def test_assembly_request_in_the_token_every_version(zk, stored) -> None:
    token = {**QUEUE_ENTRY, **assembly_request(archiveContent="object", versionID=None)}

    done = run(zk, token)

    assert done.state == "Completed", done.status.message
    kept_library_keys(done)
    with zipfile.ZipFile(done.token["path"]) as zf:
        assert zf.read(f"{TOP}/1/producer/a.txt") == b"first"
        assert zf.read(f"{TOP}/2/producer/a.txt") == b"second"


def test_assembly_request_in_the_token_without_a_format_fails(zk, stored) -> None:
    done = run(zk, {**QUEUE_ENTRY, **assembly_request(archiveType=None)})

    assert done.state == "Failed"
    assert done.status.message == ("access-small: the token names no archive format (archiveType)")


def test_assembly_request_for_a_missing_object_fails(zk) -> None:
    done = run(zk, assembly_request(objectIDS="ark:/99999/fk4none"))

    assert done.state == "Failed"
    assert "not in storage" in done.status.message
