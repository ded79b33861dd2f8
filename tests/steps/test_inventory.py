from __future__ import annotations

from pathlib import Path

import pytest

from queues.daemons.inventory_db import LocalInventory
from queues.steps.checkm import OBJECT_MANIFEST, write_checkm
from queues.steps.erc import Erc
from queues.steps.inventory import HttpInventory, InventoryError
from tests.steps.conftest import Loopback, Reply

ARK = "ark:/99999/fk4inv"
SHA = "cd" * 32


def manifest(tmp_path: Path, *names: str) -> str:
    path = tmp_path / f"manifest-{len(names)}.txt"
    rows = [
        {
            "url": f"file:///store/{n}",
            "filename": n,
            "hash_alg": "sha256",
            "hash_value": SHA,
            "size": 3,
        }
        for n in names
    ]
    path.write_text(write_checkm(rows, kind=OBJECT_MANIFEST))
    return path.as_uri()


# HttpInventory on the wire (the multipart add, local ids, refusals, an unreachable service):
# tests/steps/test_merritt_inventory.py, against a stand-in of Merritt's inventory service.


def test_http_inventory_failure_that_is_no_exception_document_keeps_the_body(
    http_server: Loopback,
) -> None:
    http_server.add("POST", "/add", Reply(502, b"<html>Bad Gateway</html>"))

    with pytest.raises(
        InventoryError,
        match=f"inventory service refused to record {ARK} v2: HTTP 502 <html>Bad Gateway",
    ):
        HttpInventory(http_server.url, retries=0).record(
            ark=ARK, version=2, manifest_url="http://s/m"
        )


@pytest.mark.django_db
def test_local_inventory_records_object_version_and_files(tmp_path: Path) -> None:
    from queues.models import InventoryFile, InventoryObject

    url = manifest(tmp_path, "producer/a", "system/mrt-erc.txt")

    LocalInventory().record(
        ark=ARK, version=1, manifest_url=url, local_id="L1", erc=Erc("W", "T", "D")
    )

    obj = InventoryObject.objects.get(ark=ARK)
    assert (obj.local_id, obj.erc_who, obj.erc_what, obj.erc_when) == ("L1", "W", "T", "D")
    [version] = obj.versions.all()
    assert (version.number, version.manifest_url) == (1, url)
    assert list(InventoryFile.objects.values_list("path", "size", "digest_alg", "digest")) == [
        ("producer/a", 3, "sha256", SHA),
        ("system/mrt-erc.txt", 3, "sha256", SHA),
    ]


@pytest.mark.django_db
def test_recording_twice_creates_no_duplicates(tmp_path: Path) -> None:
    from queues.models import InventoryFile, InventoryObject, InventoryVersion

    url = manifest(tmp_path, "producer/a")
    inventory = LocalInventory()

    inventory.record(ark=ARK, version=1, manifest_url=url)
    inventory.record(ark=ARK, version=1, manifest_url=url)

    assert (
        InventoryObject.objects.count(),
        InventoryVersion.objects.count(),
        InventoryFile.objects.count(),
    ) == (1, 1, 1)


@pytest.mark.django_db
def test_a_second_version_keeps_the_first(tmp_path: Path) -> None:
    from queues.models import InventoryObject

    inventory = LocalInventory()
    inventory.record(ark=ARK, version=1, manifest_url=manifest(tmp_path, "producer/a"))
    inventory.record(
        ark=ARK, version=2, manifest_url=manifest(tmp_path, "producer/a", "producer/b")
    )

    obj = InventoryObject.objects.get(ark=ARK)
    assert [(v.number, v.files.count()) for v in obj.versions.all()] == [(1, 1), (2, 2)]


@pytest.mark.django_db
def test_unreadable_manifest_is_an_inventory_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="unusable storage manifest"):
        LocalInventory().record(ark=ARK, version=1, manifest_url=(tmp_path / "no").as_uri())


@pytest.mark.django_db
def test_local_inventory_reads_storages_manifest_with_its_credentials_through_an_outage(
    http_server: Loopback, tmp_path: Path, settings
) -> None:
    """The manifest URL handed on in the job's ``inventory`` node names storage without its
    password; the local inventory's fetch from ``MRT_STORAGE_URL``'s server sends it again, at
    each try: storage answering 503 first, then the manifest."""
    import base64

    from queues.models import InventoryVersion

    body = Path(manifest(tmp_path, "producer/a").removeprefix("file://")).read_bytes()
    path = "/manifest/9501/ark%3A%2F99999%2Ffk4inv"
    http_server.add("GET", path, Reply(503, b"busy"), Reply(200, body))
    settings.MRT_STORAGE_URL = http_server.url.replace("http://", "http://merritt:s3cret@")
    handed = http_server.url + path

    LocalInventory().record(ark=ARK, version=1, manifest_url=handed)

    basic = "Basic " + base64.b64encode(b"merritt:s3cret").decode()
    seen = http_server.seen("GET", path)
    assert [s.headers.get("Authorization") for s in seen] == [basic, basic]
    assert InventoryVersion.objects.get(object__ark=ARK, number=1).manifest_url == handed
