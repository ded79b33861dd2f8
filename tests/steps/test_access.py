from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from queues.steps.access import build_archive
from queues.steps.checkm import OBJECT_MANIFEST, write_checkm
from queues.steps.erc import Erc, write_erc, write_storage_manifest
from queues.steps.storage import HttpStorage, LocalStorage
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
