"""Merritt's intake (``MRT_BATCH_INTAKE=merritt``): every door of ours behaves as ingest's own.

Against the loopback stand-in of ingest's depositor door (``IngestPosterStandIn``, whose
expectations come from mrt-ingest's ``JerseyBase`` and handlers: docs/merritt-poster.md):

* no path of ours writes a batch into the shared queue: ``manage.py submitbatch`` goes to
  ingest's door like the form, the API and ``/poster/``, and ``moves.batch_submit`` refuses;
* ``/poster/`` answers the depositor with ingest's batch state, whose ``batchID`` is the one in
  the queue;
* every field the depositor gave reaches ingest (``erc``, ``retainTargetURL``, ``size``
  included), and a manifest written for a URL always names the file, as our intake would;
* the exchange with ingest has one deadline and follows no redirect to another host.

Issue 52, items 5 to 8.
"""

from __future__ import annotations

import ast
import hashlib
import json
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from queues.chaos.poster_standin import INGEST_TYPES, IngestPosterStandIn, PosterUpload
from queues.chaos.standins import Answer, running, unused_url
from queues.operator.auth import ensure_groups
from queues.services import moves
from queues.steps.checkm import (
    OBJECT_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    parse_checkm,
    profile_url,
    write_checkm,
)
from queues.steps.merritt_ingest_client import DeploymentError, IngestUnavailable
from queues.zk.batches import batch_ids, batch_load, batches_load
from queues.zk.records import Batch

from .conftest import FileServer, md5
from .merritt_ingest import merritt_batch

pytestmark = pytest.mark.django_db

PROFILE = "merritt_demo_content"
BAT = "{http://uc3.cdlib.org/ontology/mrt/ingest/batch}"
ERC = "who: Lovelace, Ada\nwhat: Letters on the Analytical Engine\nwhen: 1843"


@pytest.fixture(autouse=True)
def beside_merritt(settings: Any, daemon_dirs: Path) -> None:
    settings.MRT_DEPLOYMENT = "beside-merritt"
    settings.MRT_BATCH_INTAKE = "merritt"
    settings.MRT_OWN_STEPS = ""
    settings.MRT_FILE_ROOTS = [Path(settings.MRT_WORK_DIR) / "poster"]
    settings.MRT_FETCH_ALLOW = "127.0.0.0/8"


@pytest.fixture
def ingest(zk: Any, settings: Any) -> Iterator[IngestPosterStandIn]:
    """Ingest's door: writes the batch into the queue before it answers, as ingest does."""

    def accept(upload: PosterUpload) -> None:
        fields = upload.fields
        merritt_batch(
            zk,
            batchID=upload.batch_id,
            profile=fields["profile"],
            submitter=fields["submitter"],
            type=INGEST_TYPES.get(fields["type"], fields["type"]),
            filename=upload.filename,
            title=fields.get("title", ""),
        )

    with running(IngestPosterStandIn(accept)) as stand_in:
        settings.MRT_INGEST_URL = f"{stand_in.url}/ingest"
        yield stand_in


@pytest.fixture
def key() -> str:
    from django.contrib.auth import get_user_model

    from queues.operator.audit import ApiToken

    user = get_user_model().objects.create_user(
        username="depositor", password="x", first_name="Ada", last_name="Lovelace"
    )
    user.groups.add(ensure_groups()["operator"])
    return ApiToken.issue(user=user, name="poster")[1]


def _consoles_own(zk: Any) -> list[Batch]:
    """Batches written by this console (Merritt's carry no ``payload_url``)."""
    return [
        b
        for b in batches_load(zk, batch_ids(zk))
        if isinstance(b, Batch) and "payload_url" in b.submission
    ]


def _post(key: str, data: dict[str, Any], path: str = "/poster/submit") -> Any:
    return Client().post(path, data, HTTP_AUTHORIZATION=f"Bearer {key}")


def _state(response: Any) -> dict[str, str]:
    root = ET.fromstring(response.content)  # noqa: S314 - the console's own answer
    assert root.tag == f"{BAT}batchState", response.content[:500]
    return {child.tag.removeprefix(BAT): child.text or "" for child in root}


# 5. No path of ours writes into the shared queue --------------------------------------------


def test_submitbatch_goes_to_ingests_door_and_prints_the_queued_batch(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    out, err = StringIO(), StringIO()
    call_command(
        "submitbatch",
        "--profile",
        PROFILE,
        "--submitter",
        "op/Operator",
        "--payload-url",
        files.put("shell/report.pdf", "from the shell"),
        "--title",
        "From the shell",
        "--digest-alg",
        "md5",
        "--digest-value",
        md5("from the shell"),
        stdout=out,
        stderr=err,
    )

    [upload] = ingest.uploads
    assert upload.fields["type"] == "manifest"
    assert (upload.fields["profile"], upload.fields["title"]) == (PROFILE, "From the shell")
    [row] = parse_checkm(upload.content).rows
    assert (row.url, row.hash_value) == (f"{files.url}/shell/report.pdf", md5("from the shell"))
    # What it prints is the batch ingest wrote into the queue, and nothing of ours is there.
    batch = batch_load(zk, out.getvalue().strip())
    assert batch.submission["batchID"] == upload.batch_id
    assert f"sent to Merritt's ingest as {upload.batch_id}" in err.getvalue()
    assert _consoles_own(zk) == []


def test_submitbatch_with_ingest_away_writes_nothing(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, settings: Any
) -> None:
    settings.MRT_INGEST_URL = unused_url()
    with pytest.raises(CommandError, match="did not answer"):
        call_command(
            "submitbatch",
            "--profile",
            PROFILE,
            "--submitter",
            "op",
            "--payload-url",
            files.put("a.txt", "a"),
            stdout=StringIO(),
        )
    assert batch_ids(zk) == []


def test_ingest_away_is_said_without_the_password_in_its_url(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, settings: Any
) -> None:
    """MRT_INGEST_URL may carry a password (sent as Basic authentication): the error printed
    (and given to the poster's depositor) shows it as ***."""
    settings.MRT_INGEST_URL = unused_url().replace("http://", "http://merritt:s3cret@")
    with pytest.raises(CommandError, match="did not answer") as raised:
        call_command(
            "submitbatch",
            *("--profile", PROFILE, "--submitter", "op", "--payload-url", files.put("a.txt", "a")),
            stdout=StringIO(),
        )
    assert "http://merritt:***@127.0.0.1:" in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_the_queue_writer_refuses_under_merritt_intake(zk: Any, files: FileServer) -> None:
    with pytest.raises(DeploymentError, match="no batch is written into the shared queue"):
        moves.batch_submit(profile=PROFILE, submitter="op", payload_url=files.put("a.txt", "a"))
    assert batch_ids(zk) == []


def test_batch_submit_is_the_only_writer_of_batches() -> None:
    """Every door reaches the queue through ``moves.batch_submit`` (which refuses under
    merritt intake) or sends to ingest; the chaos run writes into a ZooKeeper chroot of its
    own (``queues/chaos/engine.py``, ``_chroot``), never the shared queue."""
    root = Path(django_settings.BASE_DIR) / "queues"
    writers = set()
    for path in root.rglob("*.py"):
        if path.is_relative_to(root / "zk"):
            continue  # the writer itself
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func
                name = (
                    called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
                )
                if name in ("batch_create", "batch_submit"):
                    writers.add(str(path.relative_to(root.parent)))
    assert writers == {
        "queues/services/moves.py",  # batch_submit itself, behind batch_submit_outcome
        "queues/chaos/depositors.py",  # its own chroot
    }


# 6. /poster/ answers ingest's batch ID ------------------------------------------------------


def test_poster_answers_ingests_batch_state_with_the_queued_batch_id(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, key: str
) -> None:
    url = files.put("letters/letter-1.pdf", "letter one")
    response = _post(key, {"profile": PROFILE, "url": url, "type": "file", "title": "Letter"})

    assert response.status_code == 200, response.content
    [upload] = ingest.uploads
    state = _state(response)
    assert state["batchID"] == upload.batch_id
    assert state["batchStatus"] == "QUEUED"
    assert state["userAgent"] == "depositor/Ada Lovelace"
    queued = batch_load(zk, response["X-Batch-ID"])
    assert queued.submission["batchID"] == state["batchID"]
    assert response["Location"] == f"/api/batches/{queued.bid}"
    assert _consoles_own(zk) == []

    # In JSON, as ingest's own door answers it (the Ruby client reads bat:batchID).
    response = _post(key, {"profile": PROFILE, "url": url, "type": "file", "responseForm": "json"})
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)["bat:batchState"]
    assert body["xmlns:bat"] == "http://uc3.cdlib.org/ontology/mrt/ingest/batch"
    assert body["bat:batchID"] == ingest.uploads[1].batch_id
    assert batch_load(zk, response["X-Batch-ID"]).submission["batchID"] == body["bat:batchID"]


def test_poster_upload_reaches_ingest_whole_and_is_not_kept_here(
    zk: Any, ingest: IngestPosterStandIn, key: str, settings: Any
) -> None:
    content = b"II*\x00 a scan of a letter"
    upload = SimpleUploadedFile("scan.tif", content, content_type="image/tiff")
    response = _post(
        key,
        {
            "profile": PROFILE,
            "file": upload,
            "type": "file",
            "size": str(len(content)),
            "digestType": "MD5",
            "digestValue": md5(content),
        },
    )

    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    assert (sent.filename, sent.content) == ("scan.tif", content)
    assert sent.fields["type"] == "file"
    assert sent.fields["filename"] == "scan.tif"
    assert sent.fields["size"] == str(len(content))
    assert (sent.fields["digestType"], sent.fields["digestValue"]) == ("md5", md5(content))
    assert sent.ignored == []
    assert _state(response)["batchID"] == sent.batch_id
    poster = Path(settings.MRT_WORK_DIR) / "poster"
    assert not poster.exists() or list(poster.iterdir()) == []


def test_an_uploaded_manifest_merritt_would_read_by_other_columns_is_refused_unsent(
    zk: Any, ingest: IngestPosterStandIn, key: str, settings: Any
) -> None:
    """Merritt's ingest reads a batch manifest's cells by position, never its #%fields
    (mrt-core2 ManifestRowBatch): one naming the title before the creator would be stored
    the other way round there. The console's own intake refuses it; so does its door, before
    anything reaches ingest. In Merritt's order it goes through."""
    right = write_checkm(
        [{"url": "http://h.example/a.txt", "creator": "Doe, J.", "title": "A title"}],
        kind=SINGLE_FILE_BATCH_MANIFEST,
    )
    swapped = right.replace("mrt:creator | mrt:title", "mrt:title | mrt:creator")
    assert swapped != right

    def send(text: str) -> Any:
        upload = SimpleUploadedFile("batch.checkm", text.encode(), content_type="text/plain")
        return _post(key, {"profile": PROFILE, "file": upload, "type": "batchManifestFile"})

    response = send(swapped)

    assert response.status_code == 400, response.content
    assert b"#%fields names mrt:title as column 9, where Merritt reads mrt:creator" in (
        response.content
    )
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []
    poster = Path(settings.MRT_WORK_DIR) / "poster"
    assert not poster.exists() or list(poster.iterdir()) == []  # nor the upload kept
    response = send(right)
    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    assert sent.content == right.encode()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda text: text.removesuffix("#%eof\n"), b"the last line is not #%eof"),
        (
            lambda text: text.replace("#%eof\n", "#%eof\nhttp://h.example/b.txt\n#%eof\n"),
            b"#% lines between rows",
        ),
        (
            lambda text: text.replace(
                f"#%profile | {profile_url(SINGLE_FILE_BATCH_MANIFEST)}\n", ""
            ),
            b"line 1: #% lines before the first row",
        ),
        (
            lambda text: text.replace("#%profile | ", "#%PROFILE | "),
            b"line 1: #% lines before the first row",
        ),
        (
            lambda text: (
                "".join(line + "\n" for line in text.splitlines() if not line.startswith("#%"))
                + "#%eof\n"
            ),
            b"a batch manifest without a #%profile",
        ),
        # Merritt's batch reader takes only its own profile URLs, matched whole (mrt-core2
        # ManifestRowBatch 64d6bd2, Checkm.handleHeaders): not https, nor a "/" after it.
        (
            lambda text: text.replace("#%profile | http:", "#%profile | https:"),
            b"line 2: #%profile",
        ),
        (
            lambda text: text.replace(
                profile_url(SINGLE_FILE_BATCH_MANIFEST),
                profile_url(SINGLE_FILE_BATCH_MANIFEST) + "/",
            ),
            b"is none of the profiles",
        ),
    ],
)
def test_an_uploaded_manifest_merritt_refuses_whole_is_refused_unsent(
    zk: Any, ingest: IngestPosterStandIn, key: str, settings: Any, change: Any, problem: bytes
) -> None:
    """Merritt's reader refuses a manifest whose last line is not #%eof, or with #% lines
    but no #%profile before its first row or between its rows (mrt-core2 Manifest,
    ManifestRowCheckmAbs.handleEOF, Checkm.handleHeaders), once ingest has taken it; its
    ingest fails a batch manifest with no #%profile at all at its first job (mrt-ingest
    HandlerDisaggregate.getObjectType). The door refuses it before anything reaches ingest."""
    right = write_checkm(
        [{"url": "http://h.example/a.txt", "title": "A title"}], kind=SINGLE_FILE_BATCH_MANIFEST
    )
    upload = SimpleUploadedFile("batch.checkm", change(right).encode(), content_type="text/plain")

    response = _post(key, {"profile": PROFILE, "file": upload, "type": "batchManifestFile"})

    assert response.status_code == 400, response.content
    assert problem in response.content
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []
    poster = Path(settings.MRT_WORK_DIR) / "poster"
    assert not poster.exists() or list(poster.iterdir()) == []


def test_an_uploaded_object_manifest_is_held_to_a_profile_only_with_headers(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    """Merritt's ingest reads an object manifest with no #% line before its first row
    (Checkm.handleHeaders takes an empty gathering), and refuses one whose #% lines there name
    no #%profile. The door sends the first and refuses the second unsent."""
    rows = "http://h.example/a.txt | | | | | a.txt\n#%eof\n"

    def send(text: str) -> Any:
        upload = SimpleUploadedFile("m.checkm", text.encode(), content_type="text/plain")
        return _post(key, {"profile": PROFILE, "file": upload, "type": "manifest"})

    response = send("#%checkm_0.7\n" + rows)
    assert response.status_code == 400, response.content
    assert b"line 1: #% lines before the first row" in response.content
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []

    response = send(rows)
    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    assert sent.content == rows.encode()


def test_an_uploaded_object_manifest_with_a_profile_merritt_does_not_take_is_refused_unsent(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    """Merritt's ingest reads an object manifest with ManifestRowIngest (mrt-core2 450aab1),
    which takes two profile URLs, each matched whole (Checkm.handleHeaders: "manifestProfile
    does not match expected form"). One naming the kind at the end of another URL passed the
    door before and failed at Merritt; it is refused unsent, naming the URLs Merritt takes.
    Merritt's other URL for the kind is sent."""
    rows = "http://h.example/a.txt | | | | | a.txt\n#%eof\n"

    def send(profile: str) -> Any:
        text = f"#%profile | {profile}\n{rows}"
        upload = SimpleUploadedFile("m.checkm", text.encode(), content_type="text/plain")
        return _post(key, {"profile": PROFILE, "file": upload, "type": "manifest"})

    response = send("http://example.org/manifests/mrt-ingest-manifest")
    assert response.status_code == 400, response.content
    assert b"line 1: #%profile" in response.content
    assert profile_url(OBJECT_MANIFEST).encode() in response.content
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []

    response = send("http://uc3.cdlib.org/registry/mrt/mrt-ingest-manifest")
    assert response.status_code == 200, response.content
    assert len(ingest.uploads) == 1


def test_a_title_with_a_bar_reaches_ingest_encoded_as_merritt_encodes_it(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    """A file given by URL goes to ingest as a one-row manifest, its cells encoded as
    mrt-core2's Checkm.enc encodes them ("|" as %7c): ingest decodes them back (Checkm.dec).
    A "|" in the file name was refused before; it now reaches ingest as it was given."""
    response = _post(
        key,
        {
            "profile": PROFILE,
            "url": "http://h.example/a.txt",
            "filename": "a|b.txt",
            "type": "file",
        },
    )

    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    [row] = parse_checkm(sent.content).rows
    assert row.filename == "a|b.txt"
    assert b"| a%7cb.txt" in sent.content


def test_a_sha256_reaches_ingest_by_the_name_it_knows(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    """Merritt's ingest looks ``digestType`` up, upper-cased, among its Java names (SHA-256):
    ``sha256`` would name none and fail the package's digest check; the value goes in the
    lower-case hex ingest computes and compares it with."""
    content = b"a letter"
    digest = hashlib.sha256(content).hexdigest()
    upload = SimpleUploadedFile("letter.txt", content, content_type="text/plain")
    response = _post(
        key,
        {
            "profile": PROFILE,
            "file": upload,
            "type": "file",
            "digestType": "SHA256",
            "digestValue": digest.upper(),
        },
    )

    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    assert (sent.fields["digestType"], sent.fields["digestValue"]) == ("sha-256", digest)


def test_poster_relays_ingests_refusal_in_its_own_terms(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    upload = SimpleUploadedFile("big.tif", b"II*\x00", content_type="image/tiff")
    response = _post(
        key, {"profile": PROFILE, "file": upload, "type": "file", "size": "3000000000"}
    )

    # Ingest reads size with new Integer(size): past a Java int it fails the request.
    assert response.status_code == 500
    root = ET.fromstring(response.content)  # noqa: S314
    assert root.tag.endswith("tException.INVALID_OR_MISSING_PARM")
    assert ingest.uploads == [] and batch_ids(zk) == []


# 7. Every field reaches ingest --------------------------------------------------------------


def test_every_field_the_depositor_gave_reaches_ingest(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, key: str
) -> None:
    url = files.put("letters/2026/letter-1.pdf", "letter one")
    response = _post(
        key,
        {
            "profile": PROFILE,
            "url": url,
            "type": "file",
            "title": "Letter one",
            "creator": "Lovelace, Ada",
            "date": "1843",
            "localIdentifier": "letters-001",
            "erc": ERC,
            "retainTargetURL": "true",
            "size": "10",
            "note": "from a script",
            "notification": "ada@example.org",
            "notificationFormat": "json",
            "DC.rights": "CC-BY",
            "DataCite.resourceType": "Text",
        },
    )

    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    fields = sent.fields
    assert sent.ignored == [], "ingest reads every field it is sent"
    assert fields["erc"] == ERC
    assert fields["retainTargetURL"] == "true"
    assert (fields["title"], fields["creator"], fields["date"]) == (
        "Letter one",
        "Lovelace, Ada",
        "1843",
    )
    assert fields["localIdentifier"] == "letters-001"
    assert (fields["note"], fields["notification"], fields["notificationFormat"]) == (
        "from a script",
        "ada@example.org",
        "json",
    )
    assert (fields["DC.rights"], fields["DataCite.resourceType"]) == ("CC-BY", "Text")
    # The upload is a manifest naming the payload: the payload's size and name are its row's.
    assert fields["type"] == "manifest" and "size" not in fields
    [row] = parse_checkm(sent.content).rows
    assert (row.url, row.size, row.filename) == (url, 10, "letter-1.pdf")
    assert sent.stored_names() == ["letter-1.pdf"]


def test_a_payload_without_a_name_gets_the_one_our_intake_gives(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    """Left empty, ingest names the file from its URL: the whole path (``producer/deep/...``)
    for an object manifest, the path without its slashes for a batch manifest."""
    moves.batch_submit_outcome(
        profile=PROFILE, submitter="op", payload_url=files.put("deep/folder/a.txt", "a")
    )
    moves.batch_submit_outcome(
        profile=PROFILE,
        submitter="op",
        payload_url=files.put("deep/folder/b.zip", b"PK"),
        submission_type="container",
    )

    file_upload, container_upload = ingest.uploads
    assert [r.filename for r in parse_checkm(file_upload.content).rows] == ["a.txt"]
    assert file_upload.stored_names() == ["a.txt"]
    assert container_upload.fields["type"] == "batchManifestContainer"
    assert container_upload.stored_names() == ["b.zip"]


# 8. One deadline, no redirect elsewhere -----------------------------------------------------


def test_a_redirect_to_another_host_gets_nothing(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, key: str
) -> None:
    with running(IngestPosterStandIn(lambda upload: None)) as elsewhere:
        ingest.refuse_next(
            Answer(307, b"", headers={"Location": f"{elsewhere.url}/ingest/poster/submit"})
        )
        with pytest.raises(IngestUnavailable, match=r"to another host .* nothing was sent there"):
            moves.batch_submit_outcome(
                profile=PROFILE, submitter="op", payload_url=files.put("a.txt", "a")
            )
        assert elsewhere.seen() == []

        # Through /poster/, the depositor hears that ingest is not to be had.
        ingest.refuse_next(
            Answer(307, b"", headers={"Location": f"{elsewhere.url}/ingest/poster/submit"})
        )
        response = _post(key, {"profile": PROFILE, "url": files.put("b.txt", "b"), "type": "file"})
        assert response.status_code == 503
        assert b"EXTERNAL_SERVICE_UNAVAILABLE" in response.content
        assert elsewhere.seen() == []
    assert ingest.uploads == [] and batch_ids(zk) == []


def test_a_redirect_to_ingest_itself_is_followed_with_the_whole_upload(
    zk: Any, ingest: IngestPosterStandIn, key: str
) -> None:
    ingest.refuse_next(Answer(307, b"", headers={"Location": "/ingest/poster/submit"}))
    content = b"a scan " * 1000
    upload = SimpleUploadedFile("scan.tif", content, content_type="image/tiff")
    response = _post(key, {"profile": PROFILE, "file": upload, "type": "file"})

    assert response.status_code == 200, response.content
    [sent] = ingest.uploads
    assert sent.content == content
    assert _state(response)["batchID"] == sent.batch_id


def test_an_ingest_that_trickles_its_answer_is_given_up_at_the_deadline(
    zk: Any, ingest: IngestPosterStandIn, files: FileServer, settings: Any
) -> None:
    """8 submissions at once to an ingest that takes each and then sends its answer's headers
    a byte every 0.1 s (some 10 s a submission): every one is answered by the deadline."""
    settings.MRT_INGEST_DEADLINE = 1.5
    ingest.trickle = 0.1
    urls = [files.put(f"t/{n}.txt", f"t{n}") for n in range(8)]
    outcomes: list[BaseException | Any] = [None] * 8

    def submit(n: int) -> None:
        try:
            outcomes[n] = moves.batch_submit_outcome(
                profile=PROFILE, submitter="op", payload_url=urls[n]
            )
        except BaseException as exc:
            outcomes[n] = exc

    started = time.monotonic()
    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    took = time.monotonic() - started

    assert not any(thread.is_alive() for thread in threads)
    assert took < 5.0, f"the submissions took {took:.1f}s"
    assert all(isinstance(o, IngestUnavailable) for o in outcomes), outcomes
    assert "did not answer in time" in str(outcomes[0])
    assert "took longer than the limit of 1.5s" in str(outcomes[0])
    assert len(ingest.uploads) == 8  # ingest had every one: the message says to look first
    assert "look for it in the queue before sending it again" in str(outcomes[0])
