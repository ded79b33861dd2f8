"""HttpInventory against a stand-in of Merritt's inventory service: the multipart add, the
local-id look-up and record, refusals and an unreachable service (docs/merritt-services.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from queues.chaos.standins import (
    InventoryStandIn,
    exception_document,
    running,
    unused_url,
)
from queues.daemons import clients
from queues.steps.inventory import HttpInventory, InventoryError

ARK = "ark:/99999/fk4inv"
OWNER = "ark:/13030/j2owner"
MANIFEST = "http://store.example.org/manifest/9501/ark%3A%2F99999%2Ffk4inv"


@pytest.fixture
def inventory() -> Iterator[InventoryStandIn]:
    with running(InventoryStandIn()) as stand_in:
        yield stand_in


def test_add_is_multipart_with_the_manifest_url(inventory: InventoryStandIn) -> None:
    HttpInventory(inventory.url + "/", timeout=5).record(ark=ARK, version=1, manifest_url=MANIFEST)

    [request] = inventory.seen("POST")
    assert request.path == "/add"
    assert request.content_type == "multipart/form-data"
    assert request.multipart() == {"url": MANIFEST, "responseForm": "xml"}
    assert inventory.added == [MANIFEST]
    # The service takes nothing else there: a url-encoded add is turned away.
    wrong = requests.post(inventory.url + "/add", data={"url": MANIFEST}, timeout=5)
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


def test_inventory_refusal_names_the_service_and_its_reason(inventory: InventoryStandIn) -> None:
    client = HttpInventory(inventory.url, timeout=5, retries=0)
    inventory.refuse_next(exception_document("GENERAL_EXCEPTION", "database down"))

    with pytest.raises(InventoryError) as refused:
        client.record(ark=ARK, version=2, manifest_url=MANIFEST)
    assert str(refused.value) == (
        f"inventory service refused to record {ARK} v2: HTTP 500 GENERAL_EXCEPTION: database down"
    )

    with pytest.raises(InventoryError, match="HTTP 400 REQUEST_INVALID: manifest URL required"):
        client.record(ark=ARK, version=2, manifest_url="file:///tmp/m.txt")
    with pytest.raises(InventoryError, match="HTTP 400 REQUEST_INVALID: objectID not valid"):
        client.add_local_id("not-an-ark", OWNER, "x")


def test_an_unreachable_inventory_service_is_an_inventory_error() -> None:
    url = unused_url()
    client = HttpInventory(url, timeout=2, retries=0)
    with pytest.raises(InventoryError, match=f"inventory service unreachable at {url}/add"):
        client.record(ark=ARK, version=1, manifest_url=MANIFEST)
    with pytest.raises(InventoryError, match="inventory service unreachable"):
        client.primary_for_local_id(OWNER, "x")
