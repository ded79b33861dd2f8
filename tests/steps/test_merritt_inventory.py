"""HttpInventory against a stand-in of Merritt's inventory service: the multipart add, the
local-id look-up and record, refusals and an unreachable service (docs/merritt-services.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from queues.chaos.standins import (
    Answer,
    InventoryStandIn,
    StorageStandIn,
    exception_document,
    running,
    unused_url,
)
from queues.core.retries import outage_of
from queues.daemons import clients
from queues.steps.inventory import HttpInventory, InventoryError, is_process_state
from queues.steps.merritt import inventory_manifest_url
from queues.steps.merritt_wire import parse_xml

ARK = "ark:/99999/fk4inv"
OWNER = "ark:/13030/j2owner"


@pytest.fixture
def storage() -> Iterator[StorageStandIn]:
    """The storage inventory reads an object's manifest from, holding ARK (one version) on
    node 9501."""
    with running(StorageStandIn(nodes=(9501, 9502))) as stand_in:
        stand_in.put_object(9501, ARK, [{"producer/a.txt": b"a"}])
        yield stand_in


@pytest.fixture
def inventory(storage: StorageStandIn) -> Iterator[InventoryStandIn]:
    with running(InventoryStandIn()) as stand_in:
        yield stand_in


def _manifest(storage: StorageStandIn, node: int = 9501, ark: str = ARK) -> str:
    return inventory_manifest_url(storage.url, ark, node)


def test_add_is_multipart_with_the_manifest_url(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    manifest = _manifest(storage)
    HttpInventory(inventory.url + "/", timeout=5).record(ark=ARK, version=1, manifest_url=manifest)

    [request] = inventory.seen("POST")
    assert request.path == "/add"
    assert request.content_type == "multipart/form-data"
    assert request.multipart() == {"url": manifest, "responseForm": "xml"}
    assert inventory.added == [manifest]
    # Inventory read the object's manifest from storage, where the URL says.
    [read] = storage.seen("GET")
    assert read.path == "/manifest/9501/ark%3A%2F99999%2Ffk4inv"
    # The service takes nothing else there: a url-encoded add is turned away.
    wrong = requests.post(inventory.url + "/add", data={"url": manifest}, timeout=5)
    assert wrong.status_code == 415


def test_local_ids_are_looked_up_and_recorded_under_the_owner(inventory: InventoryStandIn) -> None:
    client = HttpInventory(inventory.url, timeout=5)

    assert client.primary_for_local_id(OWNER, "scan 0042") is None
    client.add_local_id(ARK, OWNER, "scan 0042")
    assert client.primary_for_local_id(OWNER, "scan 0042") == ARK
    assert client.primary_for_local_id("ark:/13030/j2other", "scan 0042") is None

    lookup = inventory.seen("GET")[0]
    assert lookup.path == "/primary/ark%3A%2F13030%2Fj2owner/scan%200042"
    assert lookup.query == {"t": "json"}
    record = inventory.seen("POST")[0]
    assert record.path == "/primary/ark%3A%2F99999%2Ffk4inv/ark%3A%2F13030%2Fj2owner/scan%200042"


def test_a_local_id_with_a_space_is_the_one_merritts_ingest_records(
    inventory: InventoryStandIn,
) -> None:
    """Ingest's LocalIDUtil encodes the segments with mrt-core2's URLEncoder, which writes a
    space as %20; JAX-RS decodes a path segment's %20 to a space and keeps a + as a plus. So a
    local id with a space must go as %20 to be the id ingest recorded, and be recorded as ingest
    would look it up (a + made it the different id "scan+0042")."""
    client = HttpInventory(inventory.url, timeout=5)
    # As Merritt's ingest recorded it: the stand-in decodes the segment as JAX-RS does.
    inventory.local_ids[(OWNER, "scan 0042")] = ARK
    assert client.primary_for_local_id(OWNER, "scan 0042") == ARK

    client.add_local_id("ark:/99999/fk4two", OWNER, "page 7")
    assert inventory.local_ids[(OWNER, "page 7")] == "ark:/99999/fk4two"
    assert (OWNER, "page+7") not in inventory.local_ids


@pytest.mark.django_db
def test_a_resubmission_by_local_id_finds_the_ark_in_merritts_inventory(
    inventory: InventoryStandIn, settings, tmp_path: Path
) -> None:
    profile = {
        "collection": "ark:/13030/m5demo",
        "ark_shoulder": "ark:/99999/fk4",
        "contacts": [],
        "storage_node": "9501",
        "owner": OWNER,
    }
    (tmp_path / "demo.json").write_text(json.dumps(profile))
    settings.MRT_PROFILES_DIR = tmp_path
    settings.MRT_INVENTORY_URL = inventory.url

    assert clients.ark_for_local_id("scan-7", "demo") is None
    clients.record_local_id(ARK, "scan-7", "demo")
    assert clients.ark_for_local_id("scan-7", "demo") == ARK

    del profile["owner"]
    (tmp_path / "demo.json").write_text(json.dumps(profile))
    with pytest.raises(InventoryError, match="profile demo names no Owner"):
        clients.ark_for_local_id("scan-7", "demo")


def test_the_add_answers_inventory_s_process_state_for_the_url_sent(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    """mrt-inventory answers an add with its InvProcessState through mrt-core2's formatter:
    root invp:invProcessState in the inv/process namespace, processUrl the URL sent, text/xml."""
    manifest = _manifest(storage)
    answer = requests.post(
        inventory.url + "/add",
        files={"url": (None, manifest), "responseForm": (None, "xml")},
        timeout=5,
    )
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "text/xml"
    root = parse_xml(answer.content)
    assert root is not None
    process = "{http://uc3.cdlib.org/ontology/mrt/inv/process}"
    assert root.tag == f"{process}invProcessState"
    assert root.findtext(f"{process}processUrl") == manifest
    assert root.findtext(f"{process}operation") == "add"
    assert is_process_state(answer.content)


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>Welcome to nginx!</body></html>",
        b"",
        b'{"ok": true}',
        # Another of inventory's documents is no answer to an add either.
        b'<invsv:invServiceState xmlns:invsv="http://uc3.cdlib.org/ontology/mrt/inv/service">'
        b"<invsv:name>inventory</invsv:name></invsv:invServiceState>",
    ],
)
def test_an_add_answered_2xx_without_the_process_state_is_about_the_console(
    inventory: InventoryStandIn, storage: StorageStandIn, body: bytes
) -> None:
    """A wrong MRT_INVENTORY_URL answering 200 with a page was taken for a record: the job
    completed with nothing recorded. Now it is an answer about the console: the breaker opens
    at once and the job waits, unfailed."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    inventory.refuse_next(Answer(200, body, "text/html"), "POST")
    with pytest.raises(InventoryError, match="without its process state") as odd:
        client.record(ark=ARK, version=1, manifest_url=_manifest(storage))
    outage = outage_of(odd.value)
    assert outage is not None and outage.ours
    assert inventory.added == []


def test_inventory_refusal_names_the_service_and_its_reason(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    inventory.refuse_next(exception_document("GENERAL_EXCEPTION", "database down"))

    with pytest.raises(InventoryError) as refused:
        client.record(ark=ARK, version=2, manifest_url=_manifest(storage))
    assert str(refused.value) == (
        f"inventory service refused to record {ARK} v2: HTTP 500 GENERAL_EXCEPTION: database down"
    )


def test_a_local_id_is_recorded_for_any_ark_text_but_not_for_a_second_ark(
    inventory: InventoryStandIn,
) -> None:
    """mrt-inventory takes any non-empty text as the ARK of a local id (mrt-core2 Identifier);
    a local id another ARK holds is a 400 (LocalMap.addLocal), which fails the job."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    client.add_local_id("not-an-ark", OWNER, "x")
    client.add_local_id("not-an-ark", OWNER, "x")  # the same again: no change
    with pytest.raises(InventoryError) as refused:
        client.add_local_id(ARK, OWNER, "x")
    assert "HTTP 400 REQUEST_INVALID: LocalMap:  objectID already exists" in str(refused.value)
    assert outage_of(refused.value) is None
    assert inventory.local_ids == {(OWNER, "x"): "not-an-ark"}


@pytest.mark.parametrize(
    "url",
    [
        "file:///tmp/m.txt",
        "http://127.0.0.1:1/manifest",
        "http://127.0.0.1:1/store/state/9501/ark%3A%2F99999%2Ffk4inv",
        "gopher://store/manifest/9501/ark%3A%2F99999%2Ffk4inv",
        "http://127.0.0.1:1/manifest/0/ark%3A%2F99999%2Ffk4inv",
    ],
)
def test_a_manifest_url_inventory_cannot_take_apart_fails_the_job_at_once(
    inventory: InventoryStandIn, url: str
) -> None:
    """mrt-inventory refuses such a URL with a 500 INVALID_OR_MISSING_PARM
    (SaveObject.extractParts, InvActionAbs.getVersionMap) before it reads anything: the request
    is wrong, and retrying it for the inventory policy's working day cannot mend it."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    with pytest.raises(InventoryError, match="HTTP 500 INVALID_OR_MISSING_PARM") as refused:
        client.record(ark=ARK, version=1, manifest_url=url)
    assert outage_of(refused.value) is None
    assert inventory.added == []


def test_storage_failing_inventory_s_read_of_the_manifest_is_an_outage(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    """Inventory reads the object's manifest from storage while the add waits: storage
    answering 5xx is inventory's 503 EXTERNAL_SERVICE_UNAVAILABLE, storage not answering its
    500 GENERAL_EXCEPTION ("HTTPUTIL: getObject- Exception"). Neither is the job's fault: it
    waits and is tried again."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    storage.refuse_next(storage.unavailable())
    with pytest.raises(InventoryError, match="HTTP 503 EXTERNAL_SERVICE_UNAVAILABLE") as busy:
        client.record(ark=ARK, version=1, manifest_url=_manifest(storage))
    assert outage_of(busy.value) is not None

    away = inventory_manifest_url(unused_url(), ARK, 9501)
    with pytest.raises(InventoryError, match="HTTP 500 GENERAL_EXCEPTION: HTTPUTIL") as down:
        client.record(ark=ARK, version=1, manifest_url=away)
    assert outage_of(down.value) is not None
    assert inventory.added == []

    client.record(ark=ARK, version=1, manifest_url=_manifest(storage))
    assert inventory.added == [_manifest(storage)]


def test_a_manifest_storage_does_not_hold_fails_the_job(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    """Storage's 404 for the manifest is inventory's 404 REQUESTED_ITEM_NOT_FOUND (mrt-core2
    HTTPUtil): the URL names an object or node storage does not have."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    for url in (_manifest(storage, ark="ark:/99999/fk4none"), _manifest(storage, node=7777)):
        with pytest.raises(InventoryError, match="HTTP 404 REQUESTED_ITEM_NOT_FOUND") as refused:
            client.record(ark=ARK, version=1, manifest_url=url)
        assert outage_of(refused.value) is None


def test_an_object_recorded_from_another_node_or_with_more_versions_is_refused(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    """SaveObject.validateNode and checkVersion answer 400 REQUEST_INVALID: what inventory
    holds contradicts the manifest, which no wait mends."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    storage.put_object(9501, ARK, [{"producer/a.txt": b"a"}, {"producer/a.txt": b"b"}])
    client.record(ark=ARK, version=2, manifest_url=_manifest(storage))
    client.record(ark=ARK, version=2, manifest_url=_manifest(storage))  # the same: no change

    storage.put_object(9502, ARK, [{"producer/a.txt": b"a"}] * 3)
    with pytest.raises(InventoryError, match="HTTP 400 REQUEST_INVALID: SaveObject: Node") as node:
        client.record(ark=ARK, version=3, manifest_url=_manifest(storage, node=9502))
    assert outage_of(node.value) is None

    storage.put_object(9501, ARK, [{"producer/a.txt": b"a"}])
    with pytest.raises(InventoryError, match="checkVersion - db version count") as fewer:
        client.record(ark=ARK, version=1, manifest_url=_manifest(storage))
    assert outage_of(fewer.value) is None


def test_inventory_without_its_database_is_an_outage_for_every_call(
    inventory: InventoryStandIn, storage: StorageStandIn
) -> None:
    """Without its database mrt-inventory answers a 500 GENERAL_EXCEPTION (a null connection's
    NullPointerException): inventory's own trouble, so the job waits."""
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    inventory.database_down = True
    for call in (
        lambda: client.record(ark=ARK, version=1, manifest_url=_manifest(storage)),
        lambda: client.primary_for_local_id(OWNER, "x"),
        lambda: client.add_local_id(ARK, OWNER, "x"),
    ):
        with pytest.raises(InventoryError, match="HTTP 500 GENERAL_EXCEPTION") as refused:
            call()
        assert outage_of(refused.value) is not None


def test_an_unreachable_inventory_service_is_an_inventory_error() -> None:
    url = unused_url()
    client = HttpInventory(url, timeout=2, retries=0)
    with pytest.raises(InventoryError, match=f"inventory service unreachable at {url}/add"):
        client.record(ark=ARK, version=1, manifest_url=inventory_manifest_url(url, ARK, 9501))
    with pytest.raises(InventoryError, match="inventory service unreachable"):
        client.primary_for_local_id(OWNER, "x")
