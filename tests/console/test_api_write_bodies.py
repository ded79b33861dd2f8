"""An action under /api/ reads its whole request before it does anything, and a request it
cannot read the one way is refused, nothing moved: a key given twice (the last was taken), NaN,
a body over Django's size limit or with too many fields (the pages' HTML 400), a query string on
a POST (left unread: ``?until=`` held a queue with no end), a body given to an action that takes
no fields (left unread: a note was deleted whatever the body said), true/false where no yes/no
field goes (the text "true"). Each test reads ZooKeeper and the database after the refusal."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from queues.models import Note
from queues.operator import bulkrun
from queues.operator.audit import AuditEntry
from queues.zk import jobs
from tests.core.helpers import snapshot

from .conftest import nothing_held, post_json

pytestmark = pytest.mark.django_db

LATER = "2099-01-01T00:00:00+00:00"


def _unchanged(zk, before, notes: int = 0) -> None:
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()
    assert Note.objects.count() == notes


# A key given twice -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, named",
    [
        ("/api/jobs/{jid}/priority", '{"priority": 9, "priority": 1}', "priority"),
        ("/api/holds/collection/letters/cap", '{"limit": 3, "limit": 4}', "limit"),
        (
            "/api/holds/queue/ingest/hold",
            f'{{"reason": "redeploy", "until": "{LATER}", "until": "2099-02-01T00:00:00Z"}}',
            "until",
        ),
        (
            "/api/jobs/bulk",
            '{"action": "hold", "jobs": ["{jid}"], "action": "delete", "reason": "x"}',
            "action",
        ),
        (
            "/api/jobs/bulk",
            '{"action": "hold", "jobs": [{"id": "{jid}", "version": 0, "version": 9}]}',
            "version",
        ),
        ("/api/notes", '{"kind": "job", "item": "{jid}", "text": "a", "text": "b"}', "text"),
        ("/api/collections/letters/priority", '{"priority": 1, "priority": 2}', "priority"),
    ],
)
def test_a_key_given_twice_is_refused_not_the_last_taken(
    client, token_for, zk, make_job, path, body, named
):
    job = make_job("Pending", profile="letters")
    before = snapshot(zk)
    answer = client.post(
        path.format(jid=job.jid),
        body.replace("{jid}", job.jid),
        content_type="application/json",
        **token_for("admin"),
    )
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["error"] == (
        f"the body has key {named!r} twice in one object: give each key once"
    )
    _unchanged(zk, before)


def test_a_form_field_given_twice_is_refused_too(client, token_for, zk, make_job):
    job = make_job("Pending", profile="letters")
    before = snapshot(zk)
    answer = client.post(
        f"/api/jobs/{job.jid}/priority",
        "priority=9&priority=1",
        content_type="application/x-www-form-urlencoded",
        **token_for("admin"),
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "the body has field 'priority' twice: give each field once"
    _unchanged(zk, before)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_no_json_value(client, token_for, zk, make_job, constant):
    """Python's parser takes NaN and Infinity: a hold's reason was the text "nan"."""
    job = make_job("Pending")
    before = snapshot(zk)
    answer = client.post(
        f"/api/jobs/{job.jid}/hold",
        f'{{"reason": {constant}}}',
        content_type="application/json",
        **token_for("operator"),
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == (f"the body is not valid JSON: {constant} is no JSON value")
    _unchanged(zk, before)


def test_json_from_outside_gives_each_key_once():
    from queues.core.words import DuplicateKey, json_within

    assert json_within('{"a": {"b": 1}, "b": [{"a": 2}]}') == {"a": {"b": 1}, "b": [{"a": 2}]}
    for twice in ('{"a": 1, "a": 1}', '{"x": [{"a": 1, "b": 2, "a": 3}]}'):
        with pytest.raises(DuplicateKey, match="key 'a' twice in one object"):
            json_within(twice)
    with pytest.raises(ValueError, match="NaN is no JSON value"):
        json_within("[NaN]")


# A body over the size limit, or with too many fields ------------------------------------------


def test_a_body_over_the_limit_is_a_413_in_json(client, token_for, zk, make_job, settings):
    """Django's RequestDataTooBig was answered with the pages' HTML 400 under /api/."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    job = make_job("Pending")
    headers = token_for("operator")
    before = snapshot(zk)
    said = "the body is over 10,000 bytes: no request here needs that"
    upload = SimpleUploadedFile("reason.txt", b"x" * 20_000, content_type="text/plain")
    for body, kind in [
        (json.dumps({"reason": "x" * 20_000}), "application/json"),
        (f"reason={'x' * 20_000}", "application/x-www-form-urlencoded"),
    ]:
        answer = client.post(f"/api/jobs/{job.jid}/hold", body, content_type=kind, **headers)
        assert answer.status_code == 413, (kind, answer.content[:300])
        assert answer["Content-Type"] == "application/json"
        assert answer.json() == {"error": said, "status": 413}
    # A file, which the API never reads, is refused at the same size before it is parsed.
    answer = client.post(f"/api/jobs/{job.jid}/hold", {"file": upload}, **headers)
    assert answer.status_code == 413 and answer.json()["error"] == said
    _unchanged(zk, before)
    # Within the limit the same request is read.
    fits = post_json(client, f"/api/jobs/{job.jid}/hold", {"reason": "x" * 100}, **headers)
    assert fits.status_code == 200, fits.content
    assert jobs.job_load(zk, job.jid).state == "Held"


def test_a_form_with_too_many_fields_is_a_400_in_json(client, token_for, zk, make_job, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    job = make_job("Pending")
    before = snapshot(zk)
    answer = client.post(
        f"/api/jobs/{job.jid}/hold",
        "&".join(f"f{i}=1" for i in range(10)),
        content_type="application/x-www-form-urlencoded",
        **token_for("operator"),
    )
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json() == {
        "error": "the body has more than 5 fields: no request here needs that",
        "status": 400,
    }
    _unchanged(zk, before)


# A query string on a POST ------------------------------------------------------------------


def test_a_posts_query_string_is_refused_not_left_unread(client, token_for, zk, make_job):
    """``POST /api/holds/queue/ingest/hold?until=...`` held the queue with no end."""
    job = make_job("Pending")
    headers = token_for("admin")
    before = snapshot(zk)
    for path, body, named in [
        (f"/api/holds/queue/ingest/hold?until={LATER}", {"reason": "redeploy"}, "'until'"),
        (f"/api/jobs/{job.jid}/hold?reason=x&version=0", {}, "'reason', 'version'"),
        ("/api/notes?kind=job", {"kind": "job", "item": job.jid, "text": "a"}, "'kind'"),
        ("/api/consistency?start=true", {"start": True}, "'start'"),
    ]:
        answer = post_json(client, path, body, **headers)
        assert answer.status_code == 400, (path, answer.content)
        assert answer.json()["error"] == (
            f"a POST takes its fields in the body, not in the query string: {named}"
        )
    assert nothing_held(zk)
    _unchanged(zk, before)
    from queues.models import ConsistencyRun

    assert not ConsistencyRun.objects.exists()


# A body given to an action that takes no fields ----------------------------------------------


def test_a_note_delete_takes_no_fields(client, token_for, zk, make_job):
    """``POST /api/notes/N/delete`` deleted the note whatever its body said or was."""
    job = make_job("Pending")
    headers = token_for("operator")
    made = post_json(client, "/api/notes", {"kind": "job", "item": job.jid, "text": "a"}, **headers)
    pk = made.json()["id"]
    entries = AuditEntry.objects.count()
    answer = post_json(client, f"/api/notes/{pk}/delete", {"text": "a"}, **headers)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "delete of a note: unknown key 'text'; the keys are none"
    answer = client.post(f"/api/notes/{pk}/delete", "yes", content_type="text/plain", **headers)
    assert answer.status_code == 415, answer.content
    assert Note.objects.filter(pk=pk).exists()
    assert AuditEntry.objects.count() == entries
    assert post_json(client, f"/api/notes/{pk}/delete", {}, **headers).status_code == 200
    assert not Note.objects.filter(pk=pk).exists()


def test_a_bulk_runs_stop_takes_no_fields(client, token_for, zk, make_job, make_user):
    job = make_job("Failed")
    headers = token_for("operator")
    run = bulkrun.start(
        user=make_user("operator", "starter"),
        kind="job",
        action="resume",
        items=[(job.jid, None)],
    )
    before = snapshot(zk)
    for verb in ("stop", "continue"):
        answer = post_json(client, f"/api/bulk/{run.pk}/{verb}", {"reason": "x"}, **headers)
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"] == (
            f"{verb} of a bulk run: unknown key 'reason'; the keys are none"
        )
    run.refresh_from_db()
    assert run.state == bulkrun.BulkRun.RUNNING and not run.stop_requested
    assert snapshot(zk) == before
    stopped = post_json(client, f"/api/bulk/{run.pk}/stop", {}, **headers)
    assert stopped.status_code == 200, stopped.content


# true/false where no yes/no field goes --------------------------------------------------------


def test_true_or_false_where_text_goes_is_refused(client, token_for, zk, make_job):
    """``{"reason": true}`` held the job with the reason "true"; a submission's title of false
    was the title "false"."""
    job = make_job("Pending")
    headers = token_for("admin")
    before = snapshot(zk)
    answer = post_json(client, f"/api/jobs/{job.jid}/hold", {"reason": True}, **headers)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == (
        "hold of a job: reason is no yes/no field: true/false is no value of it"
    )
    submission = {
        "profile": "letters",
        "submitter": "me",
        "payload_url": "https://example.org/a.pdf",
        "submission_type": "file",
        "title": False,
    }
    answer = post_json(client, "/api/batches", submission, **headers)
    assert answer.status_code == 400, answer.content
    assert "title is no yes/no field" in answer.json()["error"]
    _unchanged(zk, before)
    # A yes/no field still takes true/false.
    release = "/api/holds/queue/ingest/release"
    answer = post_json(client, release, {"release_jobs": False}, **headers)
    assert answer.status_code == 200, answer.content
