"""POST /poster/submit|update: Merritt ingest's depositor door, through the Django test client
and once over real HTTP, against the test's own ZooKeeper. What the answers look like is in
docs/merritt-poster.md (Merritt's batch-state and exception documents)."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.utils import override_script_prefix

from queues.daemons.registry import DAEMONS
from queues.operator.audit import ApiToken, AuditEntry
from queues.zk.batches import batch_id_for_uuid, batch_job_ids, batch_load
from queues.zk.jobs import jobs_load

PROFILE = "merritt_demo_content"
BAT = "{http://uc3.cdlib.org/ontology/mrt/ingest/batch}"
EXC = "{http://uc3.cdlib.org/ontology/mrt/core/exc}"


@pytest.fixture(autouse=True)
def work_dir(settings: Any, tmp_path: Path) -> Path:
    """A working folder of the test's own, so what a test leaves there is its own."""
    settings.MRT_WORK_DIR = tmp_path / "work"
    return settings.MRT_WORK_DIR


@pytest.fixture
def token_for(make_user: Callable[..., Any]) -> Callable[[str], str]:
    def issue(role: str) -> str:
        user = make_user(role, f"{role}-poster")
        user.first_name, user.last_name = "Ada", "Lovelace"
        user.save()
        return ApiToken.issue(user=user, name="poster")[1]

    return issue


@pytest.fixture
def operator_key(token_for: Callable[[str], str]) -> str:
    return token_for("operator")


def post(
    key: str | None, data: dict[str, Any], path: str = "/poster/submit", **headers: str
) -> Any:
    if key is not None:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {key}")
    return Client().post(path, data, **headers)


def fields(**changes: Any) -> dict[str, Any]:
    data = {
        "profile": PROFILE,
        "url": "https://example.org/letters/letter-1.pdf",
        "type": "file",
        "title": "Letter one",
        "creator": "Ada Lovelace",
        "date": "1843",
        "localIdentifier": "letters-001",
        "responseForm": "xml",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def batch_state(response: Any) -> dict[str, str]:
    root = ET.fromstring(response.content)  # noqa: S314 - our own answer
    assert root.tag == f"{BAT}batchState"
    return {child.tag.removeprefix(BAT): child.text or "" for child in root}


def exception(response: Any) -> dict[str, str]:
    root = ET.fromstring(response.content)  # noqa: S314 - our own answer
    assert root.tag.startswith(f"{EXC}tException.")
    return {child.tag.removeprefix(EXC): child.text or "" for child in root}


def submitted(zk: Any, response: Any) -> Any:
    return batch_load(zk, response["X-Batch-ID"])


# Accepted ----------------------------------------------------------------------------------


def test_url_submission_makes_a_batch_the_first_step_turns_into_a_job(zk, operator_key) -> None:
    response = post(operator_key, fields(**{"DC.rights": "CC-BY", "note": "from a script"}))

    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/xml")
    state = batch_state(response)
    assert state["batchStatus"] == "QUEUED"
    assert state["batchID"].startswith("bid-")
    assert state["userAgent"] == "operator-poster/Ada Lovelace"
    assert state["updateFlag"] == "false"
    assert "T" in state["submissionDate"] and state["jobStates"] == ""

    batch = submitted(zk, response)
    assert batch_id_for_uuid(zk, state["batchID"]) == batch.bid
    sub = batch.submission
    assert sub["batchID"] == state["batchID"]
    assert sub["profile"] == PROFILE
    assert sub["payload_url"] == "https://example.org/letters/letter-1.pdf"
    assert sub["type"] == "file"
    assert (sub["title"], sub["creator"], sub["date"]) == ("Letter one", "Ada Lovelace", "1843")
    assert sub["localID"] == "letters-001"
    assert sub["update"] is False
    assert (sub["DCrights"], sub["note"], sub["responseForm"]) == ("CC-BY", "from a script", "xml")
    assert response["Location"] == f"/api/batches/{batch.bid}"

    assert DAEMONS["batch-pending"](zk=zk, poll=0.05).run_once()
    batch = batch_load(zk, batch.bid)
    assert batch.state == "Processing", batch.status.message
    (job,) = jobs_load(zk, batch_job_ids(zk, batch.bid)["batch-processing"])
    assert job.state == "Pending"
    assert job.configuration["payload_url"] == "https://example.org/letters/letter-1.pdf"


@pytest.mark.parametrize(
    ("given", "alg", "written"),
    [
        ("sha-256", "sha256", "SHA-256"),
        ("SHA256", "sha256", "SHA-256"),
        ("md5", "md5", "MD5"),
        ("SHA-1", "sha1", "SHA-1"),
    ],
)
def test_the_digest_is_written_for_merritts_readers_in_its_own_spelling(
    zk, operator_key, given, alg, written
) -> None:
    """Merritt's ingest writes a batch's and a job's ``digestType`` as its DigestEnum value
    (``SHA-256``, ``MD5``), and its consumers match the type, upper-cased, against exactly those
    values: the console's ``sha256`` would read as no algorithm, and Merritt's digest check
    fails a job whose value has none (docs/merritt-services.md, "Digest names")."""
    value = "ab" * {"sha256": 32, "md5": 16, "sha1": 20}[alg]
    response = post(operator_key, fields(digestType=given, digestValue=value.upper()))

    assert response.status_code == 200, response.content
    sub = submitted(zk, response).submission
    assert (sub["digestType"], sub["digestValue"]) == (written, value)
    assert sub["digest"] == {"alg": alg, "value": value}

    assert DAEMONS["batch-pending"](zk=zk, poll=0.05).run_once()
    bid = response["X-Batch-ID"]
    (job,) = jobs_load(zk, batch_job_ids(zk, bid)["batch-processing"])
    assert (job.configuration["digestType"], job.configuration["digestValue"]) == (written, value)
    assert job.configuration["digest"] == {"alg": alg, "value": value}


def test_the_batch_location_is_under_the_consoles_url_prefix(zk, operator_key) -> None:
    """Served under ``/queue`` (daphne's ``--root-path``), the answer's ``Location`` names the
    API's batch there, not at the host's root (daphne's handler sets the prefix Django's test
    client leaves alone)."""
    with override_script_prefix("/queue/"):
        response = post(operator_key, fields(), SCRIPT_NAME="/queue")

    assert response.status_code == 200, response.content
    assert response["Location"] == f"/queue/api/batches/{submitted(zk, response).bid}"


@pytest.mark.parametrize(
    ("merritt", "ours"),
    [
        ("manifest", "object-manifest"),
        ("batchManifest", "batch-manifest"),
        ("batchManifestFile", "single-file-batch-manifest"),
        ("batchManifestContainer", "container-batch-manifest"),
        ("container", "container"),
        ("container-batch-manifest", "container-batch-manifest"),
    ],
)
def test_merritt_type_names_map_to_ours(zk, operator_key, merritt, ours) -> None:
    response = post(operator_key, fields(type=merritt, url="https://example.org/m.checkm"))
    assert response.status_code == 200, response.content
    submission = submitted(zk, response).submission
    # The batch keeps Merritt's name under "type" (Merritt's readers need it), ours beside it.
    assert submission["submission_type"] == ours
    assert submission["type"] == {
        "object-manifest": "manifest",
        "batch-manifest": "batchManifest",
        "single-file-batch-manifest": "batchManifestFile",
        "container-batch-manifest": "batchManifestContainer",
    }.get(ours, ours)


# A Merritt (ANVL) profile whose NotificationFormat the test chooses (tests/steps/test_profiles.py
# has a whole one).
ANVL_PROFILE = """\
ProfileID: {name}
Identifier-scheme: ARK
Identifier-namespace: 99999
Collection.1: ark:/13030/m5demo01
Notification.1: curator@example.org
StorageService: http://store.example.org:35121
StorageNode: 9501
ObjectMinterURL: https://ezid.cdlib.org/shoulder/ark:/99999/fk4
NotificationFormat: {fmt}
"""


@pytest.mark.parametrize(
    ("asked", "profile_format", "written"),
    [
        (None, "anvl", "anvl"),  # none asked: the profile's
        ("json", "anvl", "json"),  # the request's first
        ("XML", "anvl", "anvl"),  # not one of Merritt's names (case counts): as if not asked
        ("turtle", "anvl", "anvl"),  # FormatType no longer names it
        (None, "turtle", "xml"),  # neither valid: Merritt's default
        ("JSON", "Anvl", "xml"),
    ],
)
def test_the_batch_notification_format_is_the_requests_else_the_profiles_else_xml(
    zk, operator_key, settings, tmp_path, asked, profile_format, written
) -> None:
    """What Merritt's batch handler writes into every batch (HandlerSubmit): the notification
    format its Notify later posts the callback in."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "anvl_letters.txt").write_text(
        ANVL_PROFILE.format(name="anvl_letters", fmt=profile_format)
    )
    settings.MRT_PROFILES_DIR = folder

    response = post(operator_key, fields(profile="anvl_letters", notificationFormat=asked))

    assert response.status_code == 200, response.content
    assert submitted(zk, response).submission["notificationFormat"] == written


def test_upload_is_kept_in_the_batch_folder_and_read_by_the_first_step(
    zk, operator_key, settings
) -> None:
    upload = SimpleUploadedFile("scan.tif", b"II*\x00 a scan", content_type="image/tiff")
    data = fields(url=None, file=upload, digestType="MD5", digestValue="0" * 32)
    data.pop("digestType"), data.pop("digestValue")

    response = post(operator_key, data)

    assert response.status_code == 200, response.content
    batch_id = batch_state(response)["batchID"]
    sub = submitted(zk, response).submission
    stored = Path(settings.MRT_WORK_DIR).resolve() / "poster" / batch_id / "scan.tif"
    assert sub["payload_url"] == stored.as_uri()
    assert sub["filename"] == "scan.tif"
    assert stored.read_bytes() == b"II*\x00 a scan"
    assert [p.name for p in stored.parent.iterdir()] == ["scan.tif"]

    assert DAEMONS["batch-pending"](zk=zk, poll=0.05).run_once()
    assert batch_load(zk, response["X-Batch-ID"]).state == "Processing"


def test_an_upload_for_a_profile_not_here_is_refused_and_not_kept(
    zk, operator_key, settings
) -> None:
    upload = SimpleUploadedFile("scan.tif", b"II*\x00 a scan", content_type="image/tiff")

    response = post(operator_key, fields(url=None, file=upload, profile="no_such_collection"))

    assert response.status_code == 400, response.content
    assert "no profile named 'no_such_collection' here" in exception(response)["detail"]
    assert not any((Path(settings.MRT_WORK_DIR) / "poster").rglob("*"))
    assert zk.get_children("/batches") == []


def test_filename_field_names_the_upload(zk, operator_key, settings) -> None:
    upload = SimpleUploadedFile("tmp123", b"text", content_type="text/plain")
    response = post(operator_key, fields(url=None, file=upload, filename="notes.txt"))
    assert response.status_code == 200, response.content
    assert submitted(zk, response).submission["payload_url"].endswith("/notes.txt")


def test_json_and_anvl_answers(zk, operator_key) -> None:
    as_json = post(operator_key, fields(responseForm="json"))
    assert as_json.status_code == 200
    assert as_json["Content-Type"].startswith("application/json")
    state = json.loads(as_json.content)["bat:batchState"]
    assert state["xmlns:bat"] == "http://uc3.cdlib.org/ontology/mrt/ingest/batch"
    assert state["bat:batchStatus"] == "QUEUED"
    assert state["bat:updateFlag"] is False

    as_anvl = post(operator_key, fields(responseForm=None), HTTP_ACCEPT="text/x-anvl")
    assert as_anvl.status_code == 200
    lines = dict(line.split(": ", 1) for line in as_anvl.content.decode().splitlines())
    assert lines["batchStatus"] == "QUEUED"
    assert lines["batchID"].startswith("bid-")


def test_update_with_the_object_in_the_path(zk, operator_key) -> None:
    response = post(operator_key, fields(), path="/poster/update/ark:/99999/fk4upd")

    assert response.status_code == 200, response.content
    assert batch_state(response)["updateFlag"] == "true"
    sub = submitted(zk, response).submission
    assert sub["primaryID"] == "ark:/99999/fk4upd"
    assert (sub["update"], sub["submission_mode"]) == (True, "update")


def test_http_basic_with_the_token_as_password(zk, operator_key) -> None:
    basic = base64.b64encode(f"operator-poster:{operator_key}".encode()).decode()
    response = post(None, fields(), HTTP_AUTHORIZATION=f"Basic {basic}")
    assert response.status_code == 200, response.content

    wrong_user = base64.b64encode(f"someone-else:{operator_key}".encode()).decode()
    response = post(None, fields(), HTTP_AUTHORIZATION=f"Basic {wrong_user}")
    assert response.status_code == 401


def test_over_real_http(live_server, zk, operator_key, tmp_path) -> None:
    response = requests.post(
        f"{live_server.url}/poster/submit",
        headers={"Authorization": f"Bearer {operator_key}"},
        data={"profile": PROFILE, "type": "file", "responseForm": "json", "title": "Over HTTP"},
        files={"file": ("page.txt", b"a page of text", "text/plain")},
        timeout=30,
    )

    assert response.status_code == 200, response.text
    state = response.json()["bat:batchState"]
    assert state["bat:batchStatus"] == "QUEUED"
    batch = batch_load(zk, response.headers["X-Batch-ID"])
    assert batch.submission["batchID"] == state["bat:batchID"]
    assert batch.submission["title"] == "Over HTTP"
    assert Path(batch.submission["payload_url"].removeprefix("file://")).read_bytes() == (
        b"a page of text"
    )


# Refused -----------------------------------------------------------------------------------


def test_refused_without_a_token(zk, db) -> None:
    response = post(None, fields())

    assert response.status_code == 401
    assert "Basic" in response["WWW-Authenticate"]
    exc = exception(response)
    assert exc["statusName"] == "USER_NOT_AUTHENTICATED"
    assert "API token is required" in exc["detail"]


def test_refused_with_an_unknown_token_in_json(zk, db) -> None:
    response = post("not-a-key", fields(), HTTP_ACCEPT="application/json")
    assert response.status_code == 401
    body = json.loads(response.content)["exc:tException.USER_NOT_AUTHENTICATED"]
    assert body["exc:statusDescription"] == "User not authenticated"


def test_refused_with_a_viewer_token_and_audited(zk, token_for) -> None:
    response = post(token_for("viewer"), fields())

    assert response.status_code == 403
    assert exception(response)["statusName"] == "USER_NOT_AUTHORIZED"
    entry = AuditEntry.objects.get(via="poster")
    assert (entry.action, entry.ok, entry.username) == ("submit", False, "viewer-poster")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": None}, "type is required"),
        ({"type": "bagit"}, "type 'bagit' is not one of"),
        ({"profile": None}, "profile: This field is required."),
        ({"profile": "../etc"}, "profile"),
        ({"profile": "no_such_collection"}, "no profile named 'no_such_collection' here"),
        ({"url": None}, "a payload is required"),
        ({"url": "ftp://example.org/x"}, "payload URL must start with"),
        ({"digestValue": "abc"}, "give both a digest algorithm and a digest value"),
        ({"digestType": "sha3-256", "digestValue": "abc"}, "digest_alg"),
        ({"digestType": "SHA-512", "digestValue": "abc"}, "sha512 value must be 128 hex digits"),
        ({"primaryIdentifier": "not-an-ark <b>"}, "primary ID must be an ARK"),
        ({"title": "gpj\u202eexe"}, "title contains the bidirectional-text control"),
        ({"filename": "a/b"}, "names a folder too"),
        ({"note": "fine\nstatus: forged"}, "note contains the control character"),
        ({"DC.rights": "ok\x1b[2J"}, "DC.rights contains the control character"),
        ({"erc": "who: a\nwhat: b\x00"}, "erc contains the control character"),
    ],
)
def test_refused_for_bad_fields(zk, operator_key, changes, message) -> None:
    response = post(operator_key, fields(**changes))

    assert response.status_code == 400, response.content
    exc = exception(response)
    assert exc["statusName"] == "REQUEST_INVALID"
    assert exc["statusDescription"] == "User/request supplied required parm is missing or invalid"
    assert message in exc["detail"]
    assert message in exc["error"]


@pytest.mark.parametrize(
    "name", ["../evil.txt", "..", "a/../../b", ".hidden", "line\u2028split.txt", "nel\x85.txt"]
)
def test_upload_named_outside_its_folder_is_refused(zk, operator_key, settings, name) -> None:
    upload = SimpleUploadedFile("ok.txt", b"data", content_type="text/plain")

    response = post(operator_key, fields(url=None, file=upload, filename=name))

    assert response.status_code == 400, response.content
    assert "filename" in exception(response)["detail"]
    assert not any((Path(settings.MRT_WORK_DIR) / "poster").rglob("*"))
    assert not (Path(settings.MRT_WORK_DIR) / "evil.txt").exists()


def test_file_and_url_together_are_refused(zk, operator_key) -> None:
    upload = SimpleUploadedFile("a.txt", b"a")
    response = post(operator_key, fields(file=upload))
    assert response.status_code == 400
    assert "either a file or a url" in exception(response)["detail"]


def test_upload_over_the_cap_is_413(zk, operator_key, settings) -> None:
    settings.MRT_POSTER_MAX_BYTES = 10
    upload = SimpleUploadedFile("big.bin", b"x" * 100)

    response = post(operator_key, fields(url=None, file=upload))

    assert response.status_code == 413
    assert "over 10 bytes" in exception(response)["detail"]
    assert not any((Path(settings.MRT_WORK_DIR) / "poster").rglob("*"))


def test_uploads_off_when_the_daemons_may_not_read_them(zk, operator_key, settings) -> None:
    settings.MRT_FILE_ROOTS = []
    upload = SimpleUploadedFile("a.txt", b"a")

    response = post(operator_key, fields(url=None, file=upload))

    assert response.status_code == 501
    exc = exception(response)
    assert exc["statusName"] == "REQUEST_ELEMENT_UNSUPPORTED"
    assert "MRT_FILE_ROOTS" in exc["detail"]
    assert post(operator_key, fields()).status_code == 200


def test_only_post(zk, operator_key) -> None:
    response = Client().get("/poster/submit", HTTP_AUTHORIZATION=f"Bearer {operator_key}")
    assert response.status_code == 405
    assert response["Allow"] == "POST"


def test_zookeeper_unreachable_is_a_service_error_to_retry(zk_hosts, operator_key) -> None:
    from django.conf import settings

    from queues.zk import client as zkmod

    old = settings.ZK_HOSTS, settings.ZK_TIMEOUT
    settings.ZK_HOSTS, settings.ZK_TIMEOUT = "127.0.0.1:9", 1.0
    zkmod.close()
    try:
        response = post(operator_key, fields())
    finally:
        settings.ZK_HOSTS, settings.ZK_TIMEOUT = old
        zkmod.close()
    assert response.status_code == 503
    assert response["Retry-After"] == "10"
    assert exception(response)["statusName"] == "EXTERNAL_SERVICE_UNAVAILABLE"


def test_a_line_break_in_an_anvl_value_continues_it_and_starts_no_field() -> None:
    """What Merritt's ingest answered, relayed in ANVL: a newline in a value would otherwise
    start a field line of the sender's choosing."""
    from queues.views.poster import _document

    text = _document(
        "batchState",
        "bat",
        "ns",
        [("batchLabel", "Thesis\nbatchStatus: FAILED\r\nend"), ("batchStatus", "QUEUED")],
        "anvl",
    )
    assert text == "batchLabel: Thesis\n  batchStatus: FAILED\n  end\nbatchStatus: QUEUED\n"
    fields = [line for line in text.splitlines() if not line.startswith(" ")]
    assert fields == ["batchLabel: Thesis", "batchStatus: QUEUED"]
