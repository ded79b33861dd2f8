"""A batch and jobs written as Merritt's ingest writes them (its configuration keys, no
payload_url) show correctly in the console, which says why this console's daemons leave the
jobs alone."""

from __future__ import annotations

import html as htmllib

import pytest
from django.urls import reverse

from queues.zk.jobs import job_transition
from tests.daemons.merritt_ingest import merritt_batch, merritt_job
from tests.jobnodes import set_job_nodes

pytestmark = pytest.mark.django_db


def test_a_merritt_job_page_shows_its_keys_and_why_our_daemons_leave_it(viewer, zk) -> None:
    batch = merritt_batch(zk)
    job = merritt_job(zk, batch, state="Estimating")
    page = viewer.get(reverse("job", args=[job.jid]))
    assert page.status_code == 200
    text = htmllib.unescape(page.content.decode())
    assert "Not processable by this console's daemons: written by Merritt's ingest" in text
    assert f"queue/{batch.uuid}/{job.configuration['jobID']}/producer" in text
    assert "never moved, never failed" in text
    for shown in (
        "merritt_demo_content",  # profile
        '"digestType": "MD5"',
        '"update": false',
        '"jobID": "jid-',
        "letters-001",
        "Letters of Ada",
    ):
        assert shown in text, shown


def test_a_merritt_batch_and_its_jobs_are_listed(viewer, zk) -> None:
    batch = merritt_batch(zk, type="batchManifest", title="Ada's batch")
    job = merritt_job(zk, batch, state="Processing")
    text = htmllib.unescape(viewer.get(reverse("batch", args=[batch.bid])).content.decode())
    assert "batchManifest" in text
    assert "Ada's batch" in text
    assert batch.uuid in text
    assert job.jid in text
    listed = viewer.get(reverse("jobs"), {"state": "Processing"}).content.decode()
    assert job.jid in listed
    # Found by Merritt's objectID key too.
    set_job_nodes(zk, job, identifiers={"primary_id": "", "local_id": []})
    from queues.zk.jobs import job_configuration_update

    job_configuration_update(zk, job.jid, {"objectID": "ark:/13030/m5found"})
    found = viewer.get(reverse("jobs"), {"q": "ark:/13030/m5found"}).content.decode()
    assert job.jid in found


def test_our_own_jobs_carry_no_such_note(viewer, make_job) -> None:
    job = make_job("Estimating")
    text = htmllib.unescape(viewer.get(reverse("job", args=[job.jid])).content.decode())
    assert "Not processable" not in text


def test_the_submit_form_and_submitbatch_take_merritts_type_names(admin, zk) -> None:
    from django.core.management import call_command

    from queues.zk.batches import batch_ids, batch_load

    response = admin.post(
        "/submit/",
        {
            "profile": "merritt_demo_content",
            "submitter": "me",
            "payload_url": "https://example.org/o.checkm",
            "submission_type": "manifest",
        },
    )
    assert response.status_code == 303, response.content.decode()[:500]
    call_command(
        "submitbatch",
        "--profile",
        "merritt_demo_content",
        "--submitter",
        "me",
        "--payload-url",
        "https://example.org/b.checkm",
        "--type",
        "batchManifestContainer",
    )
    made = [batch_load(zk, bid).submission for bid in batch_ids(zk)]
    assert {(s["type"], s["submission_type"]) for s in made} == {
        ("manifest", "object-manifest"),
        ("batchManifestContainer", "container-batch-manifest"),
    }
    assert all(s["update"] is False for s in made)


def test_a_failed_merritt_job_in_a_list_says_only_merritt_takes_it_on(
    operator, zk, make_job
) -> None:
    batch = merritt_batch(zk)
    theirs = merritt_job(zk, batch, state="Estimating")
    theirs = job_transition(zk, theirs, "Failed", message="estimating: timed out")
    ours = make_job("Failed")
    html = operator.get("/jobs/?state=Failed").content.decode()
    their_row = html[html.index(f'id="job-row-{theirs.jid}"') :]
    their_row = their_row[: their_row.index("</tr>")]
    our_row = html[html.index(f'id="job-row-{ours.jid}"') :]
    our_row = our_row[: our_row.index("</tr>")]
    assert "only Merritt's consumers take it on" in their_row
    assert "only Merritt's consumers take it on" not in our_row
