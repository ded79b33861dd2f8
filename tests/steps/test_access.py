from __future__ import annotations

import hashlib
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from queues.steps.access import (
    MERRITT_PRODUCER_FILTER,
    AssemblyRequest,
    RequestError,
    build_archive,
    resolve,
)
from queues.steps.checkm import OBJECT_MANIFEST, write_checkm
from queues.steps.erc import Erc, write_erc, write_storage_manifest
from queues.steps.storage import HttpStorage, LocalStorage, StorageError
from tests.steps.conftest import Loopback, Reply

ARK = "ark:/99999/fk4acc"


def stored(tmp_path: Path, files: dict[str, bytes], run: str = "run") -> LocalStorage:
    obj = tmp_path / run / "object"
    for rel, data in files.items():
        (obj / rel).parent.mkdir(parents=True, exist_ok=True)
        (obj / rel).write_bytes(data)
    write_erc(obj, erc=Erc(), ark=ARK, local_id=None)
    manifest = write_storage_manifest(obj, tmp_path / run / "manifest.txt")
    storage = LocalStorage(tmp_path / "store")
    storage.store(ark=ARK, manifest_url=manifest.as_uri())
    return storage


def test_archive_holds_the_latest_version_under_one_folder(tmp_path: Path) -> None:
    stored(tmp_path, {"producer/a.txt": b"v1"}, "run1")
    storage = stored(tmp_path, {"producer/a.txt": b"v2", "producer/d/b": b"b"}, "run2")

    archive = build_archive(storage=storage, ark=ARK, downloads_dir=tmp_path / "dl")

    assert archive.path == tmp_path / "dl" / "ark+=99999=fk4acc.zip"
    data = archive.path.read_bytes()
    assert (archive.size, archive.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    with zipfile.ZipFile(archive.path) as zf:
        assert sorted(zf.namelist()) == [
            "ark+=99999=fk4acc/producer/a.txt",
            "ark+=99999=fk4acc/producer/d/b",
            "ark+=99999=fk4acc/system/mrt-erc.txt",
        ]
        assert zf.read("ark+=99999=fk4acc/producer/a.txt") == b"v2"
    assert [p.name for p in (tmp_path / "dl").iterdir()] == ["ark+=99999=fk4acc.zip"]


def test_archive_of_an_older_version_producer_files_only(tmp_path: Path) -> None:
    stored(tmp_path, {"producer/a.txt": b"v1"}, "run1")
    storage = stored(tmp_path, {"producer/a.txt": b"v2"}, "run2")

    archive = build_archive(
        storage=storage, ark=ARK, downloads_dir=tmp_path / "dl", version=1, producer_only=True
    )

    assert archive.path.name == "ark+=99999=fk4acc_v1_producer.zip"
    with zipfile.ZipFile(archive.path) as zf:
        assert zf.namelist() == ["ark+=99999=fk4acc/producer/a.txt"]
        assert zf.read("ark+=99999=fk4acc/producer/a.txt") == b"v1"


def test_archive_of_remote_storage_downloads_each_file(
    http_server: Loopback, tmp_path: Path
) -> None:
    content = http_server.file("/content/a", b"remote bytes")
    manifest = write_checkm([{"url": content, "filename": "producer/a"}], kind=OBJECT_MANIFEST)
    http_server.add("GET", "/manifest/9501/ark%3A%2F99999%2Ffk4acc", Reply(body=manifest.encode()))

    archive = build_archive(
        storage=HttpStorage(http_server.url, "9501"), ark=ARK, downloads_dir=tmp_path, name="x.zip"
    )

    with zipfile.ZipFile(archive.path) as zf:
        assert zf.read("ark+=99999=fk4acc/producer/a") == b"remote bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["x.zip"]


# Other archive formats and contents --------------------------------------------------------


def test_tar_targz_and_uncompressed_zip_hold_the_same_members(tmp_path: Path) -> None:
    storage = stored(tmp_path, {"producer/a.txt": b"A" * 1000})
    expected = [
        "ark+=99999=fk4acc/producer/a.txt",
        "ark+=99999=fk4acc/system/mrt-erc.txt",
    ]
    tar = build_archive(storage=storage, ark=ARK, downloads_dir=tmp_path / "dl", archive_type="tar")
    targz = build_archive(
        storage=storage, ark=ARK, downloads_dir=tmp_path / "dl", archive_type="targz"
    )
    unc = build_archive(
        storage=storage, ark=ARK, downloads_dir=tmp_path / "dl", archive_type="zipunc", name="u.zip"
    )

    assert tar.path.name == "ark+=99999=fk4acc.tar"
    assert targz.path.name == "ark+=99999=fk4acc.tar.gz"
    with tarfile.open(tar.path) as tf:
        assert sorted(tf.getnames()) == expected
        member = tf.extractfile("ark+=99999=fk4acc/producer/a.txt")
        assert member is not None and member.read() == b"A" * 1000
    with tarfile.open(targz.path, "r:gz") as tf:
        assert sorted(tf.getnames()) == expected
    with zipfile.ZipFile(unc.path) as zf:
        assert sorted(zf.namelist()) == expected
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_every_version_each_in_its_own_folder(tmp_path: Path) -> None:
    stored(tmp_path, {"producer/a.txt": b"v1"}, "run1")
    storage = stored(tmp_path, {"producer/a.txt": b"v2"}, "run2")

    archive = build_archive(storage=storage, ark=ARK, downloads_dir=tmp_path, all_versions=True)

    assert archive.path.name == "ark+=99999=fk4acc_all.zip"
    with zipfile.ZipFile(archive.path) as zf:
        assert zf.read("ark+=99999=fk4acc/1/producer/a.txt") == b"v1"
        assert zf.read("ark+=99999=fk4acc/2/producer/a.txt") == b"v2"
        assert "ark+=99999=fk4acc/2/system/mrt-erc.txt" in zf.namelist()


def test_every_version_from_a_store_that_cannot_list_them_is_refused(
    http_server: Loopback, tmp_path: Path
) -> None:
    # A mirror of this project's storage answers the object's manifest as checkm, which
    # names the current version's files only.
    manifest = write_checkm([{"url": "http://h/a", "filename": "producer/a"}], kind=OBJECT_MANIFEST)
    http_server.add("GET", "/manifest/9501/ark%3A%2F99999%2Ffk4acc", Reply(body=manifest.encode()))
    with pytest.raises(StorageError, match="does not list the object's versions"):
        build_archive(
            storage=HttpStorage(http_server.url, "9501"),
            ark=ARK,
            downloads_dir=tmp_path,
            all_versions=True,
        )
    assert list(tmp_path.iterdir()) == []


def test_producer_files_named_in_the_filter_are_left_out(tmp_path: Path) -> None:
    storage = stored(tmp_path, {"producer/a.txt": b"a", "producer/d/mrt-erc.txt": b"erc"})

    archive = build_archive(
        storage=storage,
        ark=ARK,
        downloads_dir=tmp_path / "dl",
        producer_only=True,
        exclude={"mrt-erc.txt"},
    )

    with zipfile.ZipFile(archive.path) as zf:
        assert zf.namelist() == ["ark+=99999=fk4acc/producer/a.txt"]


# What a token asks for ---------------------------------------------------------------------

UUID = "bf6ef133-9b05-4fd8-a4d1-845c40125315"
QUEUE_ENTRY = {"status": 201, "token": UUID, "cloud-content-byte": 206290233, "delivery-node": 7001}


def merritt_doc(**changes: object) -> dict[str, object]:
    """An assembly request as Merritt storage's TokenStatus.getJson writes it."""
    doc: dict[str, object] = {
        "nodeIOName": "nodes-prod",
        "extractNode": 9502,
        "deliveryNode": 7001,
        "objectIDS": ARK,
        "versionID": 2,
        "token": UUID,
        "approximateCompletionSeconds": 1700000000000,
        "cloudContentBytes": 206290233,
        "archiveContent": "version",
        "archiveType": "targz",
        "tokenStatusEnum": "Queued",
        "fullObject": False,
        "returnOnError": True,
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def test_console_form() -> None:
    assert resolve({"ark": ARK, "version": "3", "content": "producer"}) == AssemblyRequest(
        ark=ARK, version=3, content="producer"
    )
    assert resolve({"objectID": ARK, "format": "tar"}).archive_type == "tar"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, AssemblyRequest(ARK, 2, "version", "targz")),
        ({"versionID": 0}, AssemblyRequest(ARK, None, "version", "targz")),
        (
            {"archiveContent": "object", "versionID": None},
            AssemblyRequest(ARK, None, "object", "targz"),
        ),
        (
            {"archiveContent": None, "versionID": None},
            AssemblyRequest(ARK, None, "object", "targz"),
        ),
        ({"archiveContent": None}, AssemblyRequest(ARK, 2, "version", "targz")),
        (
            {"archiveContent": "producer", "versionID": 0, "filterList": ["a.txt"]},
            AssemblyRequest(ARK, None, "producer", "targz", frozenset({"a.txt"})),
        ),
        (
            {"archiveContent": "producer", "archiveType": "zipunc"},
            AssemblyRequest(ARK, 2, "producer", "zipunc", MERRITT_PRODUCER_FILTER),
        ),
    ],
)
def test_merritt_assembly_request_in_the_token(changes, expected) -> None:
    request = resolve(merritt_doc(**changes))
    assert request == AssemblyRequest(
        expected.ark,
        expected.version,
        expected.content,
        expected.archive_type,
        expected.exclude,
        form="merritt-assembly-request",
    )


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ({}, "no Merritt token (UUID)"),
        ({"status": 201, "delivery-node": 7001}, "no Merritt token (UUID)"),
        (QUEUE_ENTRY, f"{UUID}/status on delivery node 7001"),
        (QUEUE_ENTRY, "MRT_ACCESS_REQUESTS_URL"),
        (merritt_doc(objectIDS=""), "names no object (objectIDS)"),
        (merritt_doc(archiveType=None), "names no archive format (archiveType)"),
        (merritt_doc(archiveType="rar"), "archiveType 'rar' is not one of"),
        (merritt_doc(versionID=None), "names no versionID"),
        (merritt_doc(versionID=-1), "versionID -1 is not a version number"),
        (merritt_doc(archiveContent="everything"), "archiveContent 'everything'"),
        (merritt_doc(archiveContent="producer", filterList="x"), "filterList is not a list"),
        ({"ark": ARK, "version": "latest"}, "version 'latest' is not a version number"),
        ({"ark": ARK, "format": "7z"}, "format '7z' is not one of"),
    ],
)
def test_tokens_that_do_not_say_what_to_assemble(token, message) -> None:
    with pytest.raises(RequestError, match=re.escape(message)) as caught:
        resolve(token)
    assert caught.value.permanent


def test_queue_entry_reads_its_assembly_request_from_a_folder(tmp_path: Path) -> None:
    (tmp_path / UUID).mkdir()
    (tmp_path / UUID / "status").write_text(json.dumps(merritt_doc(archiveType="zip")))

    request = resolve(QUEUE_ENTRY, requests_base=str(tmp_path))
    assert (request.ark, request.version, request.archive_type) == (ARK, 2, "zip")
    assert resolve(QUEUE_ENTRY, requests_base=tmp_path.as_uri()) == request


def test_queue_entry_reads_its_assembly_request_over_http(http_server: Loopback) -> None:
    http_server.add("GET", f"/tokens/{UUID}/status", Reply(body=json.dumps(merritt_doc()).encode()))

    request = resolve(QUEUE_ENTRY, requests_base=f"{http_server.url}/tokens/")

    assert (request.ark, request.version, request.archive_type) == (ARK, 2, "targz")


@pytest.mark.parametrize(
    ("reply", "message", "permanent"),
    [
        (Reply(status=404), "there is no assembly request at", True),
        (Reply(status=503), "HTTP 503", False),
        (Reply(body=b"<html/>"), "is not JSON", True),
        (Reply(body=b"[1]"), "is not a JSON object", True),
        (Reply(body=json.dumps(merritt_doc(token="other")).encode()), "is for token 'other'", True),
    ],
)
def test_assembly_request_that_cannot_be_used(http_server: Loopback, reply, message, permanent):
    http_server.add("GET", f"/{UUID}/status", reply)
    with pytest.raises(RequestError, match=re.escape(message)) as caught:
        resolve(QUEUE_ENTRY, requests_base=http_server.url, timeout=5)
    assert caught.value.permanent is permanent


def test_unsafe_token_names_are_never_looked_up(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="is not a name an assembly request can have"):
        resolve({"token": "../../etc", "delivery-node": 7001}, requests_base=str(tmp_path))
