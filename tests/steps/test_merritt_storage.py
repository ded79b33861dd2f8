"""HttpStorage against a stand-in of Merritt's storage service (queues/chaos/standins.py).

Success, the service's refusal (its exception document, named in the error) and a storage
service that is not there, each as the real one behaves (docs/merritt-services.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from queues.chaos.standins import (
    StorageStandIn,
    exception_document,
    running,
    unused_url,
)
from queues.core.retries import outage_of
from queues.steps.checkm import ADD_MANIFEST, ADD_PROFILE, OBJECT_MANIFEST, write_checkm
from queues.steps.erc import http_url_for, storage_manifest
from queues.steps.storage import (
    HttpStorage,
    ObjectFile,
    ObjectNotFound,
    StorageError,
    StoredVersion,
)
from tests.steps.conftest import Loopback

ARK = "ark:/99999/fk4abc"
ENCODED = "ark%3A%2F99999%2Ffk4abc"


@pytest.fixture
def storage() -> Iterator[StorageStandIn]:
    with running(StorageStandIn(nodes=(9501,))) as stand_in:
        yield stand_in


def _manifest(http_server: Loopback) -> str:
    content = http_server.file("/job/producer/a.txt", b"hello")
    text = write_checkm(
        [{"url": content, "filename": "producer/a.txt", "hash_alg": "sha256", "size": 5}],
        kind=ADD_MANIFEST,
    )
    return http_server.file("/job/mrt-manifest.txt", text.encode())


def test_a_name_with_a_bar_and_a_percent_is_stored_by_the_name_given(
    storage: StorageStandIn, http_server: Loopback, tmp_path: Path
) -> None:
    """Merritt's storage reads the add manifest with mrt-core2's ManifestRowAdd, which decodes
    %7c and %20 in the file name (Checkm.dec): the storage manifest writes "|" and end spaces
    encoded (as Checkm.enc does), and storage keeps each file by the name it had here. A "|"
    stopped the storage manifest from being written before."""
    name = "producer/a|b 100%.txt"
    obj = tmp_path / "object"
    (obj / "producer").mkdir(parents=True)
    (obj / name).write_bytes(b"hello")
    text = storage_manifest(obj, url_for=http_url_for(http_server.url + "/job/"))
    assert "| producer/a%7cb 100%.txt" in text
    manifest_url = http_server.file("/job/mrt-storage-manifest.txt", text.encode())
    http_server.file("/job/" + quote(name), b"hello")  # where storage fetches it from

    HttpStorage(storage.url, 9501, timeout=5).store(ark=ARK, manifest_url=manifest_url)

    [stored] = storage.objects.values()
    assert [f.name for f in stored.files[0]] == [name]


def test_add_posts_the_manifest_url_and_reads_the_version_state(
    storage: StorageStandIn, http_server: Loopback
) -> None:
    manifest_url = _manifest(http_server)
    client = HttpStorage(storage.url + "/", "9501", timeout=5)

    first = client.store(ark=ARK, manifest_url=manifest_url)
    second = client.store(ark=ARK, manifest_url=manifest_url)

    inventory_url = f"{storage.url}/manifest/9501/{ENCODED}"
    assert first == StoredVersion(ARK, 1, inventory_url)
    assert second.version == 2
    [request, _] = storage.seen("POST")
    assert request.path == f"/add/9501/{ENCODED}"
    assert request.content_type == "application/x-www-form-urlencoded"
    assert request.form() == {"url": manifest_url, "t": "xml"}
    # The stand-in fetched the manifest from that URL, as storage does.
    assert [r.path for r in http_server.seen("GET", "/job/mrt-manifest.txt")] != []


def test_storage_refusal_names_the_service_and_its_reason(
    storage: StorageStandIn, http_server: Loopback
) -> None:
    manifest_url = _manifest(http_server)

    with pytest.raises(StorageError) as unknown_node:
        HttpStorage(storage.url, 7777, timeout=5).store(ark=ARK, manifest_url=manifest_url)
    assert str(unknown_node.value) == (
        f"storage service refused to add {ARK} on node 7777: "
        "HTTP 404 REQUESTED_ITEM_NOT_FOUND: Node not found: 7777"
    )
    assert outage_of(unknown_node.value) is None

    # Storage reads the manifest URL with mrt-core2's HTTPUtil: a 404 there is its own 404.
    missing = http_server.url + "/job/nothing-here.txt"
    with pytest.raises(StorageError, match="HTTP 404 REQUESTED_ITEM_NOT_FOUND: HTTPUTIL") as gone:
        HttpStorage(storage.url, 9501, timeout=5).store(ark=ARK, manifest_url=missing)
    assert outage_of(gone.value) is None

    storage.refuse_next(exception_document("GENERAL_EXCEPTION", "cloud write failed", form="json"))
    with pytest.raises(StorageError, match="HTTP 500 GENERAL_EXCEPTION: cloud write failed"):
        HttpStorage(storage.url, 9501, timeout=5).store(ark=ARK, manifest_url=manifest_url)


def test_the_storage_manifest_processing_writes_is_one_merritts_storage_takes(
    storage: StorageStandIn, http_server: Loopback, tmp_path: Path
) -> None:
    """Merritt's storage reads an add's manifest with mrt-core2's ManifestRowAdd, whose
    Checkm.handleHeaders refuses a #%profile other than .../store/manifest/mrt-add-manifest:
    the object-manifest profile the storage manifest named before was refused."""
    obj = tmp_path / "object"
    (obj / "producer").mkdir(parents=True)
    (obj / "producer" / "a.txt").write_bytes(b"hello")
    http_server.file("/job/producer/a.txt", b"hello")
    text = storage_manifest(obj, url_for=lambda name: f"{http_server.url}/job/{name}")
    assert f"#%profile | {ADD_PROFILE}" in text.splitlines()
    manifest_url = http_server.file("/job/mrt-storage-manifest.txt", text.encode())

    stored = HttpStorage(storage.url, 9501, timeout=5).store(ark=ARK, manifest_url=manifest_url)

    assert stored.version == 1
    assert storage.versions()[ARK] != []

    # An object manifest (ingest's profile) is not one storage adds from.
    rows = [{"url": f"{http_server.url}/job/producer/a.txt", "filename": "producer/a.txt"}]
    wrong = http_server.file(
        "/job/object-manifest.txt", write_checkm(rows, kind=OBJECT_MANIFEST).encode()
    )
    # The reader's refusal reaches the answer as GENERAL_EXCEPTION (ComponentContent), a 500.
    with pytest.raises(
        StorageError,
        match=r"HTTP 500 GENERAL_EXCEPTION: Unable to build VersionContent.*handleHeaders",
    ):
        HttpStorage(storage.url, 9501, timeout=5).store(ark=ARK, manifest_url=wrong)
    assert storage.versions()[ARK] == [storage.versions()[ARK][0]]  # no version made


def test_storage_takes_the_add_profiles_merritts_storage_takes_as_it_matches_them(
    storage: StorageStandIn, http_server: Loopback, tmp_path: Path
) -> None:
    """ManifestRowAdd (mrt-core2 64d6bd2) takes .../store/manifest/mrt-add-manifest and
    .../registry/mrt/mrt-add-manifest, each as Checkm.handleHeaders (450aab1) matches it:
    String.matches with the URL as the pattern, whose "." is any one character. The stand-in
    takes what that takes (before, only the two URLs as written) and refuses the rest."""
    obj = tmp_path / "object"
    (obj / "producer").mkdir(parents=True)
    (obj / "producer" / "a.txt").write_bytes(b"hello")
    http_server.file("/job/producer/a.txt", b"hello")
    text = storage_manifest(obj, url_for=lambda name: f"{http_server.url}/job/{name}")
    client = HttpStorage(storage.url, 9501, timeout=5)
    for number, profile in enumerate(
        (
            "http://uc3.cdlib.org/registry/mrt/mrt-add-manifest",
            "http://uc3-cdlib-org/registry/store/manifest/mrt-add-manifest",
        ),
        start=1,
    ):
        changed = text.replace(ADD_PROFILE, profile).encode()
        url = http_server.file(f"/job/taken{number}.txt", changed)
        assert client.store(ark=ARK, manifest_url=url).version == number
    for number, profile in enumerate(
        (
            ADD_PROFILE.replace("http:", "https:"),
            ADD_PROFILE + "/",
            "http://example.org/store/manifest/mrt-add-manifest",
        )
    ):
        changed = text.replace(ADD_PROFILE, profile).encode()
        url = http_server.file(f"/job/refused{number}.txt", changed)
        with pytest.raises(StorageError, match=r"HTTP 500 GENERAL_EXCEPTION: Unable to build"):
            client.store(ark=ARK, manifest_url=url)
    assert len(storage.versions()[ARK]) == 2


def test_an_unknown_object_is_not_found_and_a_stored_one_is_listed_from_its_xml_manifest(
    storage: StorageStandIn, http_server: Loopback
) -> None:
    client = HttpStorage(storage.url, 9501, timeout=5)
    with pytest.raises(ObjectNotFound, match="REQUESTED_ITEM_NOT_FOUND: object not found"):
        client.fetch_object(ARK)

    client.store(ark=ARK, manifest_url=_manifest(http_server))
    client.store(ark=ARK, manifest_url=_manifest(http_server))
    content = f"{storage.url}/content/9501/{ENCODED}"
    assert client.fetch_object(ARK) == [
        ObjectFile("producer/a.txt", f"{content}/2/producer%2Fa.txt")
    ]
    assert client.fetch_object(ARK, 1) == [
        ObjectFile("producer/a.txt", f"{content}/1/producer%2Fa.txt")
    ]
    assert client.versions(ARK) == [1, 2]


def test_an_unreachable_storage_service_is_a_storage_error() -> None:
    url = unused_url()
    with pytest.raises(StorageError, match=f"storage service unreachable at {url}/add/9501/"):
        HttpStorage(url, 9501, timeout=2, retries=0).store(ark=ARK, manifest_url="http://h/m")


def test_a_node_that_is_not_a_number_is_refused_before_any_request() -> None:
    with pytest.raises(StorageError, match="is not a node number"):
        HttpStorage("http://127.0.0.1:9", "node-a")


def test_the_state_of_an_object_on_a_node_storage_does_not_know_fails_the_job_at_once(
    storage: StorageStandIn,
) -> None:
    """mrt-store's ``GET state/{nodes}/{ark}`` turns an unknown node into
    INVALID_OR_MISSING_PARM, a 500 (JerseyBase.getObjectState): a wrong node in a profile, not
    an outage to wait out for a working day."""
    client = HttpStorage(storage.url, 7777, timeout=5)

    with pytest.raises(StorageError) as wrong_node:
        client.latest_version(ARK)

    assert str(wrong_node.value) == (
        f"storage service refused the state of {ARK} on node 7777 "
        f"({storage.url}/state/7777/{ENCODED}): "
        "HTTP 500 INVALID_OR_MISSING_PARM: Required node not found:7777"
    )
    assert outage_of(wrong_node.value) is None


@pytest.mark.parametrize(
    ("kind", "outage"),
    [
        ("FIXITY_CHECK_FAILS", False),
        ("INVALID_DATA_FORMAT", False),
        ("GENERAL_EXCEPTION", True),
        ("EXTERNAL_SERVICE_UNAVAILABLE", True),
    ],
)
def test_a_refusal_under_a_5xx_is_an_outage_unless_its_kind_says_never(
    storage: StorageStandIn, http_server: Loopback, kind: str, outage: bool
) -> None:
    manifest_url = _manifest(http_server)
    client = HttpStorage(storage.url, 9501, timeout=5, retries=0)
    for call in (
        lambda: client.store(ark=ARK, manifest_url=manifest_url),
        lambda: client.latest_version(ARK),
        lambda: client.fetch_object(ARK),
    ):
        storage.refuse_next(exception_document(kind, "refused"))
        with pytest.raises(StorageError, match=f"HTTP 5.. {kind}: refused") as refused:
            call()
        assert (outage_of(refused.value) is not None) is outage


@pytest.mark.parametrize(
    ("reason", "outage"),
    [("Required node not found:9501", False), ("Unable to instantiate CloudStore", True)],
)
def test_a_missing_parameter_fails_the_job_only_when_it_is_an_unknown_node(
    storage: StorageStandIn, http_server: Loopback, reason: str, outage: bool
) -> None:
    """mrt-store throws INVALID_OR_MISSING_PARM for a node it does not know and for its own
    configuration: the first is the profile's mistake, the second storage's, which an operator
    mends while the job waits."""
    client = HttpStorage(storage.url, 9501, timeout=5, retries=0)
    for call in (
        lambda: client.store(ark=ARK, manifest_url=_manifest(http_server)),
        lambda: client.latest_version(ARK),
    ):
        storage.refuse_next(exception_document("INVALID_OR_MISSING_PARM", reason))
        with pytest.raises(StorageError, match=reason) as refused:
            call()
        assert (outage_of(refused.value) is not None) is outage


def test_a_file_that_is_not_as_its_manifest_says_fails_the_add_as_storage_fails_it(
    storage: StorageStandIn, http_server: Loopback
) -> None:
    """Storage fetches each file and checks its size and digest; a file that fails fails the
    add with GENERAL_EXCEPTION "Object Fails" (AddVersionContentAbs.finalStatus), the answer a
    failed write to its cloud gives too: the client cannot tell them apart, and waits."""
    content = http_server.file("/job/producer/a.txt", b"hello")
    rows = [
        {"url": content, "filename": "producer/a.txt", "hash_alg": "sha256", "size": 5},
    ]
    wrong_digest = [{**rows[0], "hash_value": "0" * 64}]
    wrong_size = [{**rows[0], "size": 6}]
    client = HttpStorage(storage.url, 9501, timeout=5)
    for name, listed in (("digest", wrong_digest), ("size", wrong_size)):
        text = write_checkm(listed, kind=ADD_MANIFEST)
        manifest_url = http_server.file(f"/job/{name}.txt", text.encode())

        with pytest.raises(StorageError) as failed:
            client.store(ark=ARK, manifest_url=manifest_url)

        assert str(failed.value) == (
            f"storage service refused to add {ARK} on node 9501: "
            f"HTTP 500 GENERAL_EXCEPTION: Object Fails: - objectID={ARK} - version=1"
        )
        assert outage_of(failed.value) is not None
    assert ARK not in storage.versions()
