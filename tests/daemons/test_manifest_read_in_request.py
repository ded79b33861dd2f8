"""A batch manifest given by URL, with Merritt's ingest owning intake, is read while the
depositor's request waits (Merritt's door takes an upload, never a URL, so the console reads
it and uploads it): one short deadline for that whole read, and a refusal that sends nothing.

Issue 52, item 9: a manifest served at 2 KB/s kept the request open past 120 s, as the
downloads' deadline (hours) and rate floor allowed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from queues.chaos.poster_standin import IngestPosterStandIn, PosterUpload
from queues.chaos.standins import running
from queues.operator.auth import ensure_groups
from queues.zk.batches import batch_ids

from .conftest import FileServer, batch_manifest

pytestmark = pytest.mark.django_db

PROFILE = "merritt_demo_content"


@pytest.fixture
def operator() -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="op", password="x")
    user.groups.add(ensure_groups()["operator"])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def ingest(settings: Any) -> Iterator[IngestPosterStandIn]:
    """Merritt's ingest door, keeping what it was sent (it writes no batch here: nothing may
    reach it)."""

    def accept(_upload: PosterUpload) -> None:
        pass

    with running(IngestPosterStandIn(accept)) as stand_in:
        settings.MRT_DEPLOYMENT = "beside-merritt"
        settings.MRT_BATCH_INTAKE = "merritt"
        settings.MRT_INGEST_URL = stand_in.url + stand_in.context
        yield stand_in


def test_a_manifest_too_slow_to_read_in_the_request_is_refused_and_nothing_is_sent(
    zk: Any, settings: Any, operator: Client, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    settings.MRT_IN_REQUEST_FETCH_SECONDS = 1.0
    rows = [{"url": files.put(f"f{n}.txt", f"file {n}"), "filename": f"f{n}.txt"} for n in range(3)]
    url = files.put("batch.checkm", batch_manifest(rows))
    # Spread over far longer than the deadline, and well inside the downloads' rate floor.
    files.slow["/batch.checkm"] = 20.0
    fields = {"profile": PROFILE, "submitter": "op", "payload_url": url}

    response = operator.post("/submit/", {**fields, "submission_type": "batch-manifest"})

    assert response.status_code == 400, response.content[:500]
    assert b"could not be read while the request waited" in response.content
    assert b"took longer than the limit of 1s" in response.content
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []
    # Served at once, the same manifest goes through.
    files.slow.clear()
    response = operator.post("/submit/", {**fields, "submission_type": "batch-manifest"})
    assert response.status_code == 303, response.content[:500]
    assert len(ingest.uploads) == 1


def test_a_manifest_merritt_would_read_by_other_columns_is_refused_and_nothing_is_sent(
    zk: Any, settings: Any, operator: Client, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    """Merritt's ingest reads a batch manifest's cells by position and never its #%fields
    (mrt-core2 ManifestRowBatch): the local id named before the ARK would be recorded as the
    ARK there. Read here before anything is sent, it is refused as the console's own intake
    refuses it."""
    rows = [{"url": files.put("f.txt", "file"), "filename": "f.txt", "local_id": "loc-1"}]
    text = batch_manifest(rows).replace(
        "mrt:primaryIdentifier | mrt:localIdentifier", "mrt:localIdentifier | mrt:primaryIdentifier"
    )
    url = files.put("batch.checkm", text)
    fields = {"profile": PROFILE, "submitter": "op", "payload_url": url}

    response = operator.post("/submit/", {**fields, "submission_type": "batch-manifest"})

    assert response.status_code == 400, response.content[:500]
    assert b"names mrt:localIdentifier as column 7, where Merritt reads mrt:primaryIdentifier" in (
        response.content
    )
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []


@pytest.mark.parametrize(
    ("strip", "problem"),
    [
        ("#%profile ", b"line 1: #% lines before the first row"),
        ("#%", b"a batch manifest without a #%profile"),
    ],
)
def test_a_batch_manifest_without_a_profile_is_refused_and_nothing_is_sent(
    zk: Any,
    operator: Client,
    ingest: IngestPosterStandIn,
    files: FileServer,
    strip: str,
    problem: bytes,
) -> None:
    """Merritt's ingest refuses a batch manifest whose #% lines before its first row name no
    #%profile (mrt-core2 Checkm.handleHeaders), and fails one with no #% line there at its
    first job, whose type it takes from the profile (mrt-ingest
    HandlerDisaggregate.getObjectType). Given by URL to the submit form, either is refused
    before anything is sent."""
    rows = [{"url": files.put("f.txt", "file"), "filename": "f.txt"}]
    right = batch_manifest(rows)
    text = "".join(line + "\n" for line in right.splitlines() if not line.startswith(strip))
    if strip == "#%":
        text += "#%eof\n"
    url = files.put("batch.checkm", text)
    fields = {"profile": PROFILE, "submitter": "op", "payload_url": url}

    response = operator.post("/submit/", {**fields, "submission_type": "batch-manifest"})

    assert response.status_code == 400, response.content[:500]
    assert problem in response.content
    assert ingest.uploads == [] and ingest.seen("POST") == []
    assert batch_ids(zk) == []
    files.put("batch.checkm", right)
    response = operator.post("/submit/", {**fields, "submission_type": "batch-manifest"})
    assert response.status_code == 303, response.content[:500]
    assert len(ingest.uploads) == 1
