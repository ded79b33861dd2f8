from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from queues.steps.checkm import ADD_MANIFEST, OBJECT_MANIFEST, parse_checkm, write_checkm
from queues.steps.erc import Erc, write_erc, write_storage_manifest
from queues.steps.storage import (
    HttpStorage,
    LocalStorage,
    ObjectFile,
    ObjectNotFound,
    StorageError,
    StoredVersion,
    ark_folder_name,
    version_from_response,
)
from tests.steps.conftest import Loopback, Reply

ARK = "ark:/99999/fk4abc"
QUOTED = "ark%3A%2F99999%2Ffk4abc"


def prepare(tmp_path: Path, files: dict[str, bytes], name: str = "job") -> str:
    """An object folder and its storage manifest, as the Processing step leaves them."""
    obj = tmp_path / name / "object"
    for rel, data in files.items():
        (obj / rel).parent.mkdir(parents=True, exist_ok=True)
        (obj / rel).write_bytes(data)
    write_erc(obj, erc=Erc("W", "T", "D"), ark=ARK, local_id=None)
    manifest = write_storage_manifest(obj, tmp_path / name / "storage-manifest.txt")
    return manifest.as_uri()


def test_ark_folder_names_are_reversible_and_refuse_escapes() -> None:
    assert ark_folder_name("ark:/99999/fk4/a_b") == "ark+=99999=fk4=a_b"
    assert ark_folder_name("ark:/99999/fk4_a/b") != ark_folder_name("ark:/99999/fk4/a_b")
    for bad in ("ark:/99999/../x", "../x", "ark:/1/a+b", ""):
        with pytest.raises(StorageError):
            ark_folder_name(bad)


def test_a_storage_manifest_of_another_kind_is_refused(tmp_path: Path) -> None:
    """Storage's manifest is an object manifest; one naming another kind is not read as one."""
    data = write_checkm(
        [{"url": "http://h/1", "filename": "producer/a"}], kind="mrt-batch-manifest"
    ).encode()
    path = tmp_path / "manifest.txt"
    path.write_bytes(data)

    wanted = f"a {ADD_MANIFEST} or {OBJECT_MANIFEST} is needed here, got mrt-batch"
    with pytest.raises(StorageError, match=wanted):
        LocalStorage(tmp_path / "store").store(ark=ARK, manifest_url=path.as_uri())


def test_local_storage_stores_a_version_from_the_manifest(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    manifest_url = prepare(tmp_path, {"producer/a.txt": b"A", "producer/d/b.txt": b"B"})

    stored = storage.store(ark=ARK, manifest_url=manifest_url)

    version_dir = tmp_path / "store" / "ark+=99999=fk4abc" / "1"
    assert stored == StoredVersion(ARK, 1, (version_dir / "mrt-version-manifest.txt").as_uri())
    assert (version_dir / "producer/d/b.txt").read_bytes() == b"B"
    assert storage.fetch_object(ARK) == [
        ObjectFile("producer/a.txt", version_dir / "producer/a.txt"),
        ObjectFile("producer/d/b.txt", version_dir / "producer/d/b.txt"),
        ObjectFile("system/mrt-erc.txt", version_dir / "system/mrt-erc.txt"),
    ]
    rows = {
        r.filename: r
        for r in parse_checkm(Path(version_dir / "mrt-version-manifest.txt").read_bytes()).rows
    }
    assert rows["producer/a.txt"].hash_value == hashlib.sha256(b"A").hexdigest()
    assert rows["producer/a.txt"].url == (version_dir / "producer/a.txt").as_uri()


def test_storing_the_same_content_again_returns_the_same_version(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    first = storage.store(ark=ARK, manifest_url=prepare(tmp_path, {"producer/a": b"A"}, "run1"))

    again = storage.store(ark=ARK, manifest_url=prepare(tmp_path, {"producer/a": b"A"}, "run2"))

    assert again == first
    assert storage.versions(ARK) == [1]
    assert [p.name for p in (tmp_path / "store" / "ark+=99999=fk4abc").iterdir()] == ["1"]


def test_changed_content_makes_a_new_version_and_old_ones_stay(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    storage.store(ark=ARK, manifest_url=prepare(tmp_path, {"producer/a": b"A"}, "run1"))

    second = storage.store(ark=ARK, manifest_url=prepare(tmp_path, {"producer/a": b"A2"}, "run2"))

    assert second.version == 2
    [v1_file] = [f for f in storage.fetch_object(ARK, 1) if f.name == "producer/a"]
    [v2_file] = [f for f in storage.fetch_object(ARK) if f.name == "producer/a"]
    assert (Path(v1_file.location).read_bytes(), Path(v2_file.location).read_bytes()) == (
        b"A",
        b"A2",
    )


def test_a_failed_store_leaves_no_version_behind(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store", retries=0)
    manifest = tmp_path / "m.txt"
    manifest.write_text(
        write_checkm(
            [
                {"url": (tmp_path / "missing").as_uri(), "filename": "producer/missing"},
            ],
            kind=OBJECT_MANIFEST,
        )
    )

    with pytest.raises(StorageError, match="could not fetch the files"):
        storage.store(ark=ARK, manifest_url=manifest.as_uri())

    assert storage.versions(ARK) == []
    assert list((tmp_path / "store" / "ark+=99999=fk4abc").iterdir()) == []


def test_files_outside_producer_and_system_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    manifest = tmp_path / "m.txt"
    manifest.write_text(
        write_checkm([{"url": (tmp_path / "a").as_uri(), "filename": "a"}], kind=OBJECT_MANIFEST)
    )

    with pytest.raises(StorageError, match="line 6: file name 'a' is not under producer/"):
        LocalStorage(tmp_path / "store").store(ark=ARK, manifest_url=manifest.as_uri())


def test_digest_mismatch_in_the_manifest_fails_the_store(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    manifest = tmp_path / "m.txt"
    manifest.write_text(
        write_checkm(
            [
                {
                    "url": (tmp_path / "a").as_uri(),
                    "filename": "producer/a",
                    "hash_alg": "sha256",
                    "hash_value": "0" * 64,
                }
            ],
            kind=OBJECT_MANIFEST,
        )
    )

    with pytest.raises(StorageError, match="does not match"):
        LocalStorage(tmp_path / "store").store(ark=ARK, manifest_url=manifest.as_uri())


def test_fetching_an_unknown_object_or_version_raises_not_found(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "store")
    with pytest.raises(ObjectNotFound):
        storage.fetch_object(ARK)
    storage.store(ark=ARK, manifest_url=prepare(tmp_path, {"producer/a": b"A"}))
    with pytest.raises(ObjectNotFound, match="no version 7"):
        storage.fetch_object(ARK, 7)


def test_local_storage_fetches_http_manifests_and_files(
    http_server: Loopback, tmp_path: Path
) -> None:
    file_url = http_server.file("/job/producer/a.txt", b"over http")
    manifest = write_checkm([{"url": file_url, "filename": "producer/a.txt"}], kind=OBJECT_MANIFEST)
    manifest_url = http_server.file("/job/manifest.txt", manifest.encode())

    stored = LocalStorage(tmp_path / "store").store(ark=ARK, manifest_url=manifest_url)

    assert stored.version == 1
    assert Path(LocalStorage(tmp_path / "store").fetch_object(ARK)[0].location).read_bytes() == (
        b"over http"
    )


# HttpStorage on the wire: tests/steps/test_merritt_storage.py, against a stand-in of
# Merritt's storage service. Here, what it reads from the replies.


def test_http_storage_lists_an_object_from_a_checkm_manifest(http_server: Loopback) -> None:
    manifest = write_checkm(
        [{"url": "http://s/content/a", "filename": "producer/a"}], kind=OBJECT_MANIFEST
    )
    http_server.add("GET", f"/manifest/9501/{QUOTED}", Reply(body=manifest.encode()))

    files = HttpStorage(http_server.url, "9501").fetch_object(ARK)

    assert files == [ObjectFile("producer/a", "http://s/content/a")]
    with pytest.raises(ObjectNotFound):
        HttpStorage(http_server.url, "9501").fetch_object("ark:/99999/fk4other")


VERSION_NS = 'xmlns:ver="http://uc3.cdlib.org/ontology/mrt/store/version"'
STATE = "<ver:versionState " + VERSION_NS + ">{}</ver:versionState>"
ENTITY = '<!DOCTYPE x [<!ENTITY e "6">]><versionState><identifier>&e;</identifier></versionState>'


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (STATE.format("<ver:identifier>6</ver:identifier>"), 6),
        ('{"ver:versionState": {"ver:identifier": 4, "ver:numFiles": 2}}', 4),
        ('{"ver:versionState": {"ver:identifier": "5"}}', 5),
        # Not a version state, or one without its number: no version.
        ("<objectInfo><identifier>6</identifier></objectInfo>", None),
        ('{"version": "5"}', None),
        (STATE.format("<ver:numFiles>3</ver:numFiles>"), None),
        (ENTITY, None),
    ],
)
def test_version_is_read_from_storages_version_state(text: str, version: int | None) -> None:
    assert version_from_response(text) == version
