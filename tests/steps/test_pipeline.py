"""The steps chained the way the job daemons use them, from submission to access archive."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from queues.daemons.inventory_db import LocalInventory
from queues.steps.access import build_archive
from queues.steps.erc import Erc, write_dublin_core, write_erc, write_storage_manifest
from queues.steps.fetch import download_all, extract_container, head_all
from queues.steps.minting import LocalMinter
from queues.steps.storage import LocalStorage
from queues.steps.submission import ObjectSpec, expand_submission, payload_files
from tests.steps.conftest import Loopback


def container() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("scans/page1.tif", b"tiff" * 100)
        zf.writestr("scans/page1.txt", b"ocr text")
    return buffer.getvalue()


@pytest.mark.django_db
def test_container_submission_goes_from_url_to_inventory_and_archive(
    http_server: Loopback, tmp_path: Path
) -> None:
    from queues.models import InventoryObject

    url = http_server.file("/deposits/thesis.zip", container())

    # Batch processing: one job, its spec stored as JSON configuration.
    [spec] = expand_submission(
        submission_type="container",
        payload_url=url,
        fetch_text=lambda u: b"",
        title="A thesis",
        creator="Doe, J.",
        local_id="thesis-1",
    )
    config = spec.to_configuration()

    # Estimating and Downloading read the spec back from the configuration.
    spec = ObjectSpec.from_configuration(config)
    files = payload_files(spec, fetch_text=lambda u: b"")
    assert head_all(f.url for f in files) == {url: len(container())}
    work = tmp_path / "jid1"
    [result] = download_all(files, work / "download")
    names = extract_container(result.path, work / "object" / "producer")
    assert names == ["scans/page1.tif", "scans/page1.txt"]

    # Processing: mint, system files, storage manifest; Storing; Recording.
    ark = LocalMinter(lambda shoulder: 1).mint("ark:/99999/fk4")
    erc = Erc(spec.creator, spec.title, spec.date)
    write_erc(work / "object", erc=erc, ark=ark, local_id=spec.local_id)
    write_dublin_core(work / "object")
    manifest = write_storage_manifest(work / "object", work / "storage-manifest.txt")
    storage = LocalStorage(tmp_path / "store")
    stored = storage.store(ark=ark, manifest_url=manifest.as_uri())
    assert storage.store(ark=ark, manifest_url=manifest.as_uri()) == stored
    LocalInventory().record(
        ark=ark,
        version=stored.version,
        manifest_url=stored.manifest_url,
        local_id="thesis-1",
        erc=erc,
    )
    assert [f.path for f in InventoryObject.objects.get(ark=ark).versions.get().files.all()] == [
        "producer/scans/page1.tif",
        "producer/scans/page1.txt",
        "system/mrt-dc.xml",
        "system/mrt-erc.txt",
    ]

    # Access: the object as one zip.
    archive = build_archive(storage=storage, ark=ark, downloads_dir=tmp_path / "downloads")
    with zipfile.ZipFile(archive.path) as zf:
        erc_text = zf.read(f"{archive.path.stem}/system/mrt-erc.txt").decode()
    assert f"where: {ark}\nwhere: thesis-1\n" in erc_text
