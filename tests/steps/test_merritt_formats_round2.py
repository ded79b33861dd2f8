"""Issue 26, items 5 and 6: what we write in Merritt's forms (job ``submissionDate``, ``size``,
the default batch ID), storage's XML object manifest read and published, and EZID told about
ARKs this console did not mint; each against a stand-in answering as the real service does
(queues/chaos/standins.py, docs/merritt-services.md)."""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlsplit

import pytest
import requests

from queues.chaos.standins import EzidStandIn, StorageStandIn, running
from queues.daemons import clients
from queues.steps import merritt
from queues.steps.erc import Erc
from queues.steps.minting import EzidMinter, MintError
from queues.steps.objectmap import parse_object_map
from queues.steps.storage import (
    HttpStorage,
    LocalStorage,
    ManifestExport,
    ObjectNotFound,
    version_entries,
)
from queues.steps.submission import ObjectSpec, merritt_job_keys, merritt_submission_keys
from queues.zk.batches import batch_create
from tests.steps.test_storage import prepare

ISO_WITH_OFFSET = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")
NODE = 9501
ARK = "ark:/13030/m5round2"


# Job submissionDate, size, batch ID ---------------------------------------------------------


def test_a_jobs_submission_date_is_iso_8601_with_the_zones_offset() -> None:
    keys = merritt_job_keys({"submitted": "2026-11-21T10:02:03-08:00"})
    assert list(keys) == ["submissionDate"]
    assert ISO_WITH_OFFSET.fullmatch(keys["submissionDate"])
    moment = merritt.parse_submission_date(keys["submissionDate"])
    assert moment == datetime(2026, 11, 21, 18, 2, 3, tzinfo=UTC)
    # DateState.toString(): seconds, offset with a colon, never "Z".
    assert ISO_WITH_OFFSET.fullmatch(merritt.iso_date_text())
    assert merritt.iso_date_text(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)).count(":") == 3


def test_a_batch_date_in_javas_form_is_still_read() -> None:
    old = "Sat Nov 21 10:02:03 GMT 2026"
    assert merritt.parse_submission_date(old) == datetime(2026, 11, 21, 10, 2, 3, tzinfo=UTC)
    assert merritt.parse_submission_date("Sat Nov 21 10:02:03 -0800 2026") == datetime(
        2026, 11, 21, 10, 2, 3, tzinfo=timezone(-timedelta(hours=8))
    )
    # The batch's own text (Merritt's batch handler writes java.util.Date) becomes the job's ISO.
    job = merritt_job_keys({"submissionDate": old})["submissionDate"]
    assert ISO_WITH_OFFSET.fullmatch(job)
    assert merritt.parse_submission_date(job) == datetime(2026, 11, 21, 10, 2, 3, tzinfo=UTC)
    assert merritt.parse_submission_date("next Tuesday") is None


def test_sizes_are_numbers_where_merritt_writes_numbers() -> None:
    batch = merritt_submission_keys({"type": "file", "size": "2048"})
    assert batch["size"] == 2048
    assert merritt_submission_keys({"type": "file"})["size"] == 0
    spec = ObjectSpec(payload_url="http://h/a", payload_type="file", filename="a", size=12)
    assert spec.to_configuration()["size"] == 12
    # Configurations written before are read as well.
    old = {"payload_url": "http://h/a", "type": "file", "size": "12"}
    assert ObjectSpec.from_configuration(old).size == 12


def test_a_batch_without_a_batch_id_gets_merritts_form(zk) -> None:
    batch = batch_create(zk, submission={"profile": "merritt_demo_content"})
    assert re.fullmatch(r"bid-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", batch.uuid)
    assert batch.submission["batchID"] == batch.uuid


# Storage's object manifest ------------------------------------------------------------------


@pytest.fixture
def storage() -> Iterator[StorageStandIn]:
    with running(StorageStandIn(nodes=(NODE,))) as stand_in:
        yield stand_in


def test_an_object_is_listed_from_storages_xml_manifest_and_read(storage) -> None:
    storage.put_object(
        NODE,
        ARK,
        [
            {"producer/a.txt": b"first", "system/mrt-erc.txt": b"erc: \n"},
            {"producer/a.txt": b"second", "producer/b c.txt": b"new", "system/x": b"s"},
        ],
    )
    client = HttpStorage(storage.url, NODE, timeout=5)

    current = client.fetch_object(ARK)

    assert [f.name for f in current] == ["producer/a.txt", "producer/b c.txt", "system/x"]
    assert requests.get(str(current[0].location), timeout=5).content == b"second"
    assert requests.get(str(current[1].location), timeout=5).content == b"new"
    first = client.fetch_object(ARK, 1)
    assert {f.name: requests.get(str(f.location), timeout=5).content for f in first} == {
        "producer/a.txt": b"first",
        "system/mrt-erc.txt": b"erc: \n",
    }
    assert client.versions(ARK) == [1, 2]
    with pytest.raises(ObjectNotFound, match="has no version 3"):
        client.fetch_object(ARK, 3)
    with pytest.raises(ObjectNotFound):
        client.fetch_object("ark:/13030/m5absent")


def test_the_xml_manifest_is_read_whatever_wraps_its_elements() -> None:
    data = (
        b'<?xml version="1.0"?><objectInfo xmlns="urn:x"><object id="ark:/1/a">'
        b"<current>1</current></object><versions><version id='1'>"
        b"<manifest count='1'><file id='producer/f'><size>3</size>"
        b"<digestType>sha-256</digestType><digest>ab</digest></file></manifest>"
        b"</version></versions></objectInfo>"
    )
    found = parse_object_map(data)
    assert (found.ark, found.current) == ("ark:/1/a", 1)
    (item,) = found.version().files
    assert (item.name, item.size, item.digest_type, item.digest) == (
        "producer/f",
        3,
        "sha-256",
        "ab",
    )
    (entry,) = version_entries(data, 1)
    assert (entry.filename, entry.size, entry.digest_value) == ("producer/f", 3, "ab")


# Local storage published for Merritt's inventory ----------------------------------------------


def _serve(folder: Path) -> Iterator[str]:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def work_site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The working folder over HTTP on loopback, as MRT_WORK_URL serves it."""
    folder = tmp_path / "work"
    folder.mkdir()
    yield from ((folder, url) for url in _serve(folder))


def _inventory_reads(manifest_url: str) -> tuple[str, int, str]:
    """What Merritt's inventory takes from a manifest URL (mrt-inventory ``SaveObject``,
    ``extractParts``): the storage base up to the ``manifest`` segment, the node after it as an
    integer, and the URL-decoded ARK after that."""
    parts = urlsplit(manifest_url)
    segments = parts.path.split("/")
    at = segments.index("manifest")
    base = f"{parts.scheme}://{parts.netloc}" + "/".join(segments[:at])
    return base, int(segments[at + 1]), unquote(segments[at + 2].replace("+", " "))


def test_local_storage_publishes_what_merritts_inventory_reads(tmp_path, work_site) -> None:
    folder, url = work_site
    manifest_url = prepare(tmp_path, {"producer/a.txt": b"alpha"})
    digest = hashlib.sha256(b"alpha").hexdigest()
    export = ManifestExport(folder / "storage", f"{url}/storage", NODE)
    store = LocalStorage(tmp_path / "store", export=export)

    stored = store.store(ark=ARK, manifest_url=manifest_url)

    assert stored.manifest_url.startswith("http://")
    assert _inventory_reads(stored.manifest_url) == (f"{url}/storage", NODE, ARK)
    # Merritt's inventory fetches {base}/manifest/{node}/{URLEncoder(ark)}: the same URL.
    base, node, ark = _inventory_reads(stored.manifest_url)
    assert stored.manifest_url == merritt.inventory_manifest_url(base, ark, node)
    answer = requests.get(stored.manifest_url, timeout=5)
    assert answer.status_code == 200
    found = parse_object_map(answer.content)
    assert (found.ark, found.current) == (ARK, 1)
    item = found.version(1).files[0]
    assert (item.name, item.size, item.digest_type, item.digest) == (
        "producer/a.txt",
        5,
        "sha256",
        digest,
    )
    # The files are where Merritt's storage serves them, and read by the HTTP client too.
    listed = HttpStorage(base, node, timeout=5).fetch_object(ARK)
    assert [f.name for f in listed] == ["producer/a.txt", "system/mrt-erc.txt"]
    assert requests.get(str(listed[0].location), timeout=5).content == b"alpha"
    # Storing the same content again is the same version, published the same way.
    assert store.stored_as(ark=ARK, manifest=store.read_manifest(manifest_url)) == stored


# EZID for ARKs this console did not mint -----------------------------------------------------


@pytest.fixture
def ezid(settings) -> Iterator[EzidStandIn]:
    with running(EzidStandIn("apitest", "s3cret")) as stand_in:
        settings.MRT_EZID_URL = stand_in.url
        settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
        settings.MRT_EZID_TARGET_URL = "https://merritt.example.org"
        yield stand_in


def _profile() -> SimpleNamespace:
    return SimpleNamespace(
        name="demo", ark_shoulder="ark:/99999/fk4", ezid_coowner="merritt", context="Demo"
    )


def test_an_ark_ezid_does_not_hold_is_created_with_its_description(ezid) -> None:
    given = "ark:/99999/fk4given"

    clients.describe_ark(
        None, _profile(), given, erc=Erc(who="Doe, Jane", what="Notes"), local_id="n-1"
    )

    update, create = ezid.seen()
    assert (update.method, update.path) == ("POST", f"/id/{given}")
    assert (create.method, create.path, create.query) == (
        "PUT",
        f"/id/{given}",
        {"update_if_exists": "yes"},
    )
    assert ezid.identifiers[given] == {
        "erc": f"who: Doe, Jane\nwhat: Notes\nwhere: {given}\nwhere: n-1\n",
        "mrt.creator": "Demo",
        "_owner": "merritt",
        "_target": "https://merritt.example.org/m/ark%253A%252F99999%252Ffk4given",
    }


def test_an_ark_ezid_holds_is_updated_keeping_its_target_when_asked(ezid) -> None:
    given = "ark:/99999/fk4held"
    ezid.identifiers[given] = {"_target": "https://depositor.example.org/item/7"}
    depositor_erc = "erc.who: Doe, Jane\nerc.what: Notes%3A 1907\n  continued\n_target: x"

    clients.describe_ark(None, _profile(), given, depositor_erc=depositor_erc, retain_target=True)

    (update,) = ezid.seen()
    assert (update.method, update.path) == ("POST", f"/id/{given}")
    assert ezid.identifiers[given] == {
        "_target": "https://depositor.example.org/item/7",  # retained, and not the depositor's
        "erc.who": "Doe, Jane",
        "erc.what": "Notes: 1907 continued",
        "mrt.creator": "Demo",
        "_owner": "merritt",
    }


def test_wrong_credentials_are_not_answered_with_a_create(ezid) -> None:
    minter = EzidMinter(ezid.url, "apitest", "wrong", timeout=5)
    with pytest.raises(MintError, match="unauthorized"):
        minter.describe("ark:/99999/fk4x", {"erc": "who: x"})
    assert [r.method for r in ezid.seen()] == ["POST"]
