"""One owner per step beside Merritt (docs/merritt-ownership.md).

Merritt's consumers are written in Python from the library's acquire rules and mrt-ingest's
consumer code (``merritt_consumers.py``), on a ZooKeeper session of their own, and run together
with this console's daemons over jobs submitted through the console's form and API and written
by Merritt's ingest door:

* beside Merritt with Merritt's ingest owning intake (the default), a submission made through
  the console goes to ingest's ``/poster/submit`` (a stand-in answering as mrt-ingest's
  ``JerseyBase``), Merritt's consumers do every step of every job, and the console's daemons
  (``runconsumer all``) take none;
* with ``MRT_BATCH_INTAKE=console`` the console's daemons do every step but Storing and
  Recording, which Merritt's storage and inventory services do; Merritt's ingest consumers do
  not run (no node form keeps them off the console's items), and a batch Merritt's ingest door
  wrote is left alone;
* every combination of MRT_DEPLOYMENT, MRT_BATCH_INTAKE and MRT_OWN_STEPS serves the steps it
  says, and a value that cannot work is refused with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from queues.chaos.poster_standin import IngestPosterStandIn, PosterUpload
from queues.chaos.standins import exception_document, running, unused_url
from queues.core.states import JOB_STEPS
from queues.daemons.registry import (
    DAEMONS,
    DeploymentError,
    batch_intake,
    daemon_classes,
    owned_steps,
)
from queues.operator.auth import ensure_groups
from queues.steps.checkm import OBJECT_MANIFEST, SINGLE_FILE_BATCH_MANIFEST, parse_checkm
from queues.zk.batches import batch_ids, batch_load, batches_load
from queues.zk.jobs import job_load
from queues.zk.records import Batch

from .conftest import FileServer, batch_manifest, daemon, md5
from .merritt_consumers import IngestDisk, MerrittConsumers, write_merritt_batch

pytestmark = pytest.mark.django_db

PROFILE = "merritt_demo_content"
INTAKE = [
    "batch-pending",
    "pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "notify",
    "batch-reporting",
    "batch-update-reporting",
]
MERRITT_SERVICES = ["storing", "recording", "access-small", "access-large"]
JOB_WORK = JOB_STEPS[: JOB_STEPS.index("Completed")]
# What runconsumer all runs beside Merritt when its ingest owns intake: the console's own work.
CONSOLE_ONLY = [n for n in DAEMONS if n not in (*INTAKE, *MERRITT_SERVICES)]


def _beside(settings: Any, intake: str, **more: Any) -> None:
    settings.MRT_DEPLOYMENT = "beside-merritt"
    settings.MRT_BATCH_INTAKE = intake
    settings.MRT_OWN_STEPS = ""
    settings.MRT_WORK_URL = "http://ingest.example.org/work"
    settings.MRT_STORAGE_URL = "http://store.example.org:35121"
    for key, value in more.items():
        setattr(settings, key, value)


@pytest.fixture
def operator() -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="op", password="x")
    user.groups.add(ensure_groups()["operator"])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def api_headers(operator: Client) -> dict[str, str]:
    from django.contrib.auth import get_user_model

    from queues.operator.audit import ApiToken

    _token, key = ApiToken.issue(user=get_user_model().objects.get(username="op"), name="t")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def disk() -> IngestDisk:
    return IngestDisk()


@pytest.fixture
def ingest(zk: Any, disk: IngestDisk, settings: Any) -> Iterator[IngestPosterStandIn]:
    """Merritt's ingest door: writes the batch as its ingest does, with its folder on disk."""

    def accept(upload: PosterUpload) -> None:
        fields = upload.fields
        manifest = parse_checkm(upload.content)
        jobs = 1 if manifest.kind == OBJECT_MANIFEST else len(manifest.rows)
        write_merritt_batch(
            zk,
            disk,
            jobs,
            batchID=upload.batch_id,
            profile=fields["profile"],
            submitter=fields["submitter"],
            type=fields["type"],
            title=fields.get("title", ""),
            filename=upload.filename,
        )

    with running(IngestPosterStandIn(accept)) as stand_in:
        settings.MRT_INGEST_URL = f"{stand_in.url}/ingest"
        yield stand_in


def _all_jobs(zk: Any) -> list[Any]:
    return [job_load(zk, jid) for jid in zk.get_children("/jobs") if jid.startswith("jid")]


def _run_together(zk: Any, merritt: MerrittConsumers, done: Any, rounds: int = 400) -> None:
    """Merritt's consumers and everything ``runconsumer all`` runs, in turns, until ``done``."""
    ours = [daemon(zk, cls.name) for cls in daemon_classes("all")]
    for _ in range(rounds):
        if done():
            return
        merritt.run_once()
        for consumer in ours:
            while consumer.run_once():
                pass
    assert done(), "the consumers did not finish the jobs"


def test_beside_merritt_ingest_owns_intake_and_console_submissions_go_to_its_door(
    zk: Any,
    other_zk: Any,
    settings: Any,
    operator: Client,
    api_headers: dict[str, str],
    ingest: IngestPosterStandIn,
    disk: IngestDisk,
    files: FileServer,
) -> None:
    _beside(settings, "")
    assert batch_intake() == "merritt"
    assert [cls.name for cls in daemon_classes("all")] == CONSOLE_ONLY
    # 20 jobs through the console's doors: 10 by the form, 10 by the API. (What is checked is
    # who moves each job, not how many: every job runs through the same code.)
    for n in range(10):
        url = files.put(f"form/{n}.txt", f"form {n}")
        response = operator.post(
            "/submit/",
            {
                "profile": PROFILE,
                "submitter": "op/Operator",
                "payload_url": url,
                "submission_type": "file",
                "title": f"Form {n}",
                "digest_alg": "md5",
                "digest_value": md5(f"form {n}"),
            },
        )
        assert response.status_code in (302, 303), response.content[:500]
        assert response["Location"].startswith("/batches/bid")
        response = operator.post(
            "/api/batches",
            json.dumps(
                {
                    "profile": PROFILE,
                    "submitter": "api/Robot",
                    "payload_url": files.put(f"api/{n}.zip", b"PK"),
                    "submission_type": "container",
                    "local_id": f"api-{n}",
                }
            ),
            content_type="application/json",
            **api_headers,
        )
        assert response.status_code == 200, response.content[:500]
        made = response.json()["outcomes"][0]
        assert made["id"].startswith("bid") and "sent to Merritt's ingest as bid-" in made["detail"]
    # What ingest received: its fields, and a manifest naming the payload for it to fetch.
    form_upload = ingest.uploads[0]
    assert form_upload.fields["type"] == "manifest"
    assert form_upload.fields["profile"] == PROFILE
    assert form_upload.fields["submitter"] == "op/Operator"
    assert form_upload.fields["title"] == "Form 0"
    [row] = parse_checkm(form_upload.content).rows
    assert (row.url, row.hash_alg, row.hash_value) == (
        f"{files.url}/form/0.txt",
        "md5",
        md5("form 0"),
    )
    api_upload = ingest.uploads[1]
    assert api_upload.fields["type"] == "batchManifestContainer"
    [row] = parse_checkm(api_upload.content).rows
    assert (row.url, row.local_id) == (f"{files.url}/api/0.zip", "api-0")
    # 20 jobs written by Merritt's ingest door itself: 4 batches of 5.
    for _ in range(4):
        write_merritt_batch(zk, disk, 5, profile=PROFILE)
    # Not one Pending batch of the console's own in the shared queue.
    assert all(
        "payload_url" not in b.submission
        for b in batches_load(zk, batch_ids(zk))
        if isinstance(b, Batch)
    )

    merritt = MerrittConsumers(other_zk, disk, ("ingest", "storage", "inventory"))

    def done() -> bool:
        jobs = _all_jobs(zk)
        bids = batch_ids(zk)
        return (
            len(jobs) == 40
            and all(j.state in ("Completed", "Failed") for j in jobs)
            and all(batch_load(zk, b).state in ("Completed", "Failed") for b in bids)
        )

    _run_together(zk, merritt, done)
    jobs = _all_jobs(zk)
    assert merritt.failed == {} and merritt.stranded == []
    assert {j.state for j in jobs} == {"Completed"}
    # Every step of every job by Merritt's consumer for it, exactly once; none by ours.
    assert merritt.moved == {(j.jid, step): 1 for j in jobs for step in JOB_WORK} | {
        (b, s): 1 for b in batch_ids(zk) for s in ("Pending", "Reporting")
    }
    assert all(j.status.retry_count == 0 for j in jobs)


def test_console_intake_beside_merritt_leaves_storing_and_recording_to_merritts_services(
    zk: Any,
    other_zk: Any,
    settings: Any,
    operator: Client,
    api_headers: dict[str, str],
    disk: IngestDisk,
    files: FileServer,
) -> None:
    _beside(settings, "console")
    assert [cls.name for cls in daemon_classes("all")] == [
        n for n in DAEMONS if n not in MERRITT_SERVICES
    ]
    # 40 jobs through the console's doors: two batch manifests by the form, two by the API.
    for door in range(4):
        rows = []
        for n in range(10):
            content = f"object {door}-{n}"
            rows.append(
                {
                    "url": files.put(f"d{door}/{n}.txt", content),
                    "hash_alg": "md5",
                    "hash_value": md5(content),
                    "filename": f"{n}.txt",
                    "local_id": f"local-{door}-{n}",
                    "title": f"Object {door}-{n}",
                }
            )
        fields = {
            "profile": PROFILE,
            "submitter": "op/Operator",
            "payload_url": files.put(
                f"d{door}.checkm", batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
            ),
            "submission_type": "single-file-batch-manifest",
        }
        if door % 2:
            response = operator.post(
                "/api/batches", json.dumps(fields), content_type="application/json", **api_headers
            )
            assert response.status_code == 200, response.content[:500]
        else:
            assert operator.post("/submit/", fields).status_code in (302, 303)
    # A batch Merritt's ingest door wrote: no consumer of this deployment works on it.
    merritt_written = write_merritt_batch(zk, disk, 3, profile=PROFILE)
    merritt = MerrittConsumers(other_zk, disk, ("storage", "inventory"))

    def done() -> bool:
        jobs = _all_jobs(zk)
        return len(jobs) == 40 and all(j.state in ("Completed", "Failed") for j in jobs)

    _run_together(zk, merritt, done, rounds=2000)
    jobs = _all_jobs(zk)
    assert merritt.failed == {}
    assert {j.state for j in jobs} == {"Completed"}, {j.jid: j.status.message for j in jobs}
    assert merritt.moved == {(j.jid, s): 1 for j in jobs for s in ("Storing", "Recording")}
    assert all(j.status.retry_count == 0 for j in jobs)
    left = batch_load(zk, merritt_written.bid)
    assert left.state == "Pending" and zk.exists(f"/batches/{left.bid}/lock") is None


def test_every_setting_combination_serves_what_it_says(zk: Any, settings: Any) -> None:
    settings.MRT_DEPLOYMENT = "standalone"
    settings.MRT_BATCH_INTAKE = ""
    settings.MRT_OWN_STEPS = ""
    assert batch_intake() == "console" and owned_steps() == list(DAEMONS)
    settings.MRT_BATCH_INTAKE = "console"
    assert owned_steps() == list(DAEMONS)
    settings.MRT_BATCH_INTAKE = "merritt"
    with pytest.raises(DeploymentError, match="needs MRT_DEPLOYMENT=beside-merritt"):
        owned_steps()
    with pytest.raises(CommandError, match="needs MRT_DEPLOYMENT=beside-merritt"):
        call_command("runconsumer", "all", "--once")

    for intake in ("", "merritt", "Merritt "):
        _beside(settings, intake)
        assert batch_intake() == "merritt"
        assert owned_steps() == CONSOLE_ONLY
    for name in INTAKE:
        with pytest.raises(CommandError, match="MRT_BATCH_INTAKE=merritt leaves it to Merritt's"):
            call_command("runconsumer", name, "--once")
    for name in MERRITT_SERVICES:
        with pytest.raises(CommandError, match="leaves it to Merritt's services"):
            call_command("runconsumer", name, "--once")
    call_command("runconsumer", "retention", "--once")

    _beside(settings, "console")
    assert owned_steps() == [n for n in DAEMONS if n not in MERRITT_SERVICES]
    call_command("runconsumer", "pending", "--once")

    # MRT_OWN_STEPS overrides either default, in every mode.
    _beside(settings, "merritt", MRT_OWN_STEPS="storing,recording")
    assert owned_steps() == ["storing", "recording"]
    with pytest.raises(CommandError, match="MRT_OWN_STEPS does not name it"):
        call_command("runconsumer", "pending", "--once")
    _beside(settings, "merritt", MRT_OWN_STEPS="all")
    assert owned_steps() == list(DAEMONS)
    _beside(settings, "console", MRT_OWN_STEPS="pending,notify")
    assert owned_steps() == ["pending", "notify"]


def test_a_bad_intake_value_is_refused_with_the_reason_everywhere(
    zk: Any, settings: Any, operator: Client
) -> None:
    for deployment in ("standalone", "beside-merritt"):
        settings.MRT_DEPLOYMENT = deployment
        settings.MRT_BATCH_INTAKE = "both"
        settings.MRT_OWN_STEPS = ""
        with pytest.raises(
            DeploymentError, match="MRT_BATCH_INTAKE must be one of merritt, console"
        ):
            batch_intake()
        with pytest.raises(CommandError, match="got 'both'"):
            call_command("runconsumer", "all", "--once")
        response = operator.post(
            "/submit/",
            {
                "profile": PROFILE,
                "submitter": "op",
                "payload_url": "http://127.0.0.1:9/x.txt",
                "submission_type": "file",
            },
        )
        assert response.status_code == 400
        assert b"MRT_BATCH_INTAKE must be one of merritt, console" in response.content
    assert batch_ids(zk) == []


def test_merritt_ingest_refusing_or_away_is_said_and_nothing_is_written(
    zk: Any, settings: Any, operator: Client, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    _beside(settings, "merritt")
    fields = {
        "profile": PROFILE,
        "submitter": "op",
        "payload_url": files.put("a.txt", "a"),
        "submission_type": "file",
    }
    ingest.refuse_next(exception_document("REQUEST_INVALID", "profile not found: nope"))
    response = operator.post("/submit/", fields)
    assert response.status_code == 400
    assert b"REQUEST_INVALID: profile not found: nope" in response.content
    settings.MRT_INGEST_URL = unused_url()
    response = operator.post("/submit/", fields)
    assert response.status_code == 409
    assert b"did not answer" in response.content
    settings.MRT_INGEST_URL = ""
    response = operator.post("/submit/", fields)
    assert b"set MRT_INGEST_URL" in response.content
    assert batch_ids(zk) == []
    assert len(ingest.uploads) == 0


def test_a_new_version_goes_to_ingests_update_door_with_its_object(
    zk: Any, settings: Any, ingest: IngestPosterStandIn, files: FileServer
) -> None:
    from queues.services import moves

    _beside(settings, "merritt")
    outcome = moves.batch_submit_outcome(
        profile=PROFILE,
        submitter="op",
        payload_url=files.put("v2.txt", "two"),
        primary_id="ark:/99999/fk4v2",
        extra={"update": True, "submission_mode": "update", "note": "second version"},
    )
    [request] = ingest.seen("POST")
    assert request.path == "/ingest/poster/update"
    fields = ingest.uploads[0].fields
    assert fields["primaryIdentifier"] == "ark:/99999/fk4v2"
    assert fields["note"] == "second version"
    assert "update" not in fields and "submission_mode" not in fields
    assert batch_load(zk, outcome.id).submission["batchID"] == ingest.uploads[0].batch_id
