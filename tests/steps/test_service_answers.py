"""What a Merritt service answers oddly is the client's own error, never an exception of the
parser's or of requests' and never a success (found by fuzzing the storage, inventory and EZID
clients' answers): a POST's redirect is its answer, a redirect whose target cannot be read is a
transport failure, only a 2xx is a success, a document nested past the parser or in an unknown
encoding is no document, a number of versions that cannot be read is no answer, and an ARK or a
file name an answer gives is checked before it is used."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from queues.chaos.standins import CallbackReceiver, running
from queues.core.retries import outage_of
from queues.steps.inventory import HttpInventory, InventoryError
from queues.steps.merritt_wire import ANSWER_MAX, service_session
from queues.steps.minting import EzidMinter, MintError
from queues.steps.objectmap import MapFile, MapVersion, object_map_xml
from queues.steps.storage import HttpStorage, StorageError
from tests.steps.conftest import Loopback, Reply

ARK = "ark:/99999/fk4test"
SHOULDER = "ark:/99999/fk4"


def _session():  # type: ignore[no-untyped-def]
    return service_session(retries=0, deadline=10)


def _storage(server: Loopback) -> HttpStorage:
    return HttpStorage(server.url, 9501, timeout=5, session=_session())


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _state_path(storage: HttpStorage, *below: str) -> str:
    return _path(storage._object_url("state", ARK) + "".join(f"/{b}" for b in below)) + "?t=xml"


def test_a_post_s_redirect_is_its_answer_not_a_get_elsewhere(http_server: Loopback) -> None:
    """requests turned a 302 after the add into a GET on the other host, and read a version from
    it with no add made; a 307 sent the add's form on to the other host."""
    storage = _storage(http_server)
    add = _path(storage._object_url("add", ARK))
    with running(CallbackReceiver()) as elsewhere:
        for status in (302, 307):
            http_server.add("POST", add, Reply(status, headers={"Location": elsewhere.url + "/x"}))
            with pytest.raises(StorageError, match=f"HTTP {status}"):
                storage.store(ark=ARK, manifest_url="http://h/m")
        assert elsewhere.seen() == []


def test_a_redirect_to_a_target_that_cannot_be_read_is_a_transport_failure(
    http_server: Loopback,
) -> None:
    storage = _storage(http_server)
    http_server.add("GET", _state_path(storage), Reply(302, headers={"Location": "http://[::1/x"}))
    with pytest.raises(StorageError) as raised:  # a ValueError escaped requests before
        storage.latest_version(ARK)
    assert outage_of(raised.value) is not None


def test_a_get_follows_a_redirect_only_on_the_server_it_asked(http_server: Loopback) -> None:
    """A manifest's GET (its URL from the job's ``store`` node) followed requests' own redirects,
    thirty of them, to any host: a hop to another server is refused before anything is sent
    there; one on the same server is followed."""
    storage = _storage(http_server)
    http_server.file("/m/here.txt", b"#%checkm_0.7\n#%eof\n")
    http_server.add("GET", "/m/moved", Reply(302, headers={"Location": "/m/here.txt"}))
    with pytest.raises(StorageError, match="lists no files"):  # followed, then read
        storage.read_manifest(http_server.url + "/m/moved")
    assert http_server.seen("GET", "/m/here.txt") != []
    with running(CallbackReceiver()) as elsewhere:
        http_server.add("GET", "/m/away", Reply(302, headers={"Location": elsewhere.url + "/m"}))
        with pytest.raises(StorageError, match="to another server, not followed") as raised:
            storage.read_manifest(http_server.url + "/m/away")
        assert elsewhere.seen() == []
    assert outage_of(raised.value) is not None  # the storage service's misconfiguration waits


@pytest.mark.parametrize("status", [299, 600, 999])
def test_only_a_2xx_is_a_success(http_server: Loopback, status: int) -> None:
    """``response.ok`` is every status below 400 and from 600: a 600 minted an ARK."""
    minter = EzidMinter(http_server.url, "u", "p", timeout=5, session=_session())
    answer = Reply(status, body=f"success: {SHOULDER}abc".encode(), headers={})
    http_server.add("POST", f"/shoulder/{SHOULDER}", answer)
    if status == 299:
        assert minter.mint(SHOULDER) == f"{SHOULDER}abc"
    else:
        with pytest.raises(MintError, match=f"HTTP {status}"):
            minter.mint(SHOULDER)


@pytest.mark.parametrize(
    "said",
    [f"{SHOULDER}abc def", f"{SHOULDER}a\tb", f"{SHOULDER}a\x1bb", f"{SHOULDER}/../x", SHOULDER],
)
def test_an_ark_ezid_answers_is_checked_before_it_is_used(http_server: Loopback, said: str) -> None:
    minter = EzidMinter(http_server.url, "u", "p", timeout=5, session=_session())
    http_server.add("POST", f"/shoulder/{SHOULDER}", Reply(201, body=f"success: {said}".encode()))
    with pytest.raises(MintError):
        minter.mint(SHOULDER)


def test_inventory_s_odd_answers_are_its_own_errors(http_server: Loopback) -> None:
    inventory = HttpInventory(http_server.url, timeout=5, session=_session())
    path = "/primary/owner/local?t=json"
    deep = b"[" * 100_000 + b"]" * 100_000  # RecursionError from the JSON parser
    http_server.add("GET", path, Reply(200, body=deep))
    with pytest.raises(InventoryError, match="with no JSON"):
        inventory.primary_for_local_id("owner", "local")
    said = b'{"localContainerState": {"exists": true, "primaryIdentifier": "ark:/1/a\\nb"}}'
    http_server.add("GET", path, Reply(200, body=said))
    with pytest.raises(InventoryError, match="which is no ARK"):
        inventory.primary_for_local_id("owner", "local")
    http_server.add("GET", path, Reply(500, body=deep))
    with pytest.raises(InventoryError, match="HTTP 500"):  # the refusal's reason, not a crash
        inventory.primary_for_local_id("owner", "local")


@pytest.mark.parametrize(
    "body",
    [
        b'<?xml version="1.0" encoding="bogus"?><objectState/>',  # LookupError from the parser
        b"<objectState><numVersions>-1</numVersions></objectState>",
        b"<objectState><numVersions>\xc2\xb2</numVersions></objectState>",
        b"<objectState><numVersions></numVersions></objectState>",
        b"<html><numVersions>1</numVersions><numFiles>1</numFiles><size>5</size></html>",
        b'{"foo": {"numVersions": 3}}',
    ],
)
def test_a_state_without_a_readable_number_of_versions_is_no_answer(
    http_server: Loopback, body: bytes
) -> None:
    """Read as 0 ("not stored"), it would have had an add already made made again."""
    storage = _storage(http_server)
    http_server.add("GET", _state_path(storage), Reply(200, body=body))
    with pytest.raises(StorageError) as raised:
        storage.latest_version(ARK)
    assert outage_of(raised.value) is not None or "without a state document" in str(raised.value)


def test_a_stored_file_s_name_is_checked_before_it_goes_into_an_archive(
    http_server: Loopback,
) -> None:
    storage = _storage(http_server)
    files = (MapFile(name="producer/../../../etc/passwd", size=5),)
    objects = object_map_xml(ARK, [MapVersion(1, files, "2026-01-01T00:00:00Z")])
    http_server.add("GET", _path(storage.manifest_url(ARK)), Reply(200, body=objects.encode()))
    with pytest.raises(StorageError, match=r"contains '\.\.'"):
        storage.fetch_object(ARK)


@pytest.mark.parametrize("status", [200, 302])
def test_an_answer_longer_than_a_client_reads_is_a_transport_failure_not_memory(
    http_server: Loopback, status: int
) -> None:
    """A service's answer (or a redirect's body, which requests read whole to free its
    connection) was read whole into memory, however long."""
    storage = _storage(http_server)
    body = b"<x>" + b" " * ANSWER_MAX + b"</x>"
    headers = {"Location": "/elsewhere"} if status == 302 else {}
    http_server.add("GET", _state_path(storage), Reply(status, body=body, headers=headers))
    with pytest.raises(StorageError, match=f"longer than {ANSWER_MAX:,} bytes") as raised:
        storage.latest_version(ARK)
    assert outage_of(raised.value) is not None  # tried again later, as any transport failure
