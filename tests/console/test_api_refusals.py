"""A request under /api/ is checked whole and answered in JSON (issue 52, items 3 and 4): a
filter or a body is a closed set of keys, a filter that narrows nothing is "every job" only when
the request says ``"all": true``, a field that is no text is a 400 (never a 500), and a
malformed ID in a path is a JSON 400 (never the pages' HTML 404). Each test reads ZooKeeper
itself after the refusal."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from queues.zk import jobs
from queues.zk import paths as zpaths
from queues.zk.locks import queue_hold_set
from queues.zk.maintenance import node_hold_set, node_holds, service_hold_set, service_holds
from tests.core.helpers import snapshot

from .conftest import nothing_held, post_json

pytestmark = pytest.mark.django_db

PAST = "2020-01-02T03:04:05+00:00"


# 3: a bulk filter is a closed set of keys, and empty means nothing ----------------------------


@pytest.mark.parametrize(
    "body, named",
    [
        ({"filter": {"nosuch": "x"}}, "nosuch"),
        ({"filter": {"collection": "letters"}}, "collection"),
        ({"filter": {"state": "Failed", "profil": "letters"}}, "profil"),
        ({"filter": {}}, "all"),
        ({"filter": {"min_age_hours": 0, "q": " "}}, "all"),  # leaves no job out
        ({"filter": {"page": "2"}}, "page"),
        ({"filter": {"profile": "letters"}, "all": True}, "all"),
        ({"filter": {}, "all": "yes"}, "all"),
        ({"filter": {}, "everything": True}, "everything"),
        ({"filter": {"state": ["Failed"]}}, "state"),
        ({"jobs": [], "filter": {}}, "not both"),
    ],
)
def test_a_bulk_filter_it_does_not_know_moves_nothing(client, token_for, zk, make_job, body, named):
    failed = [make_job("Failed", profile=p) for p in ("letters", "maps")]
    answer = post_json(
        client, reverse("api-jobs-bulk"), {"action": "resume", **body}, **token_for("operator")
    )
    assert answer.status_code == 400, answer.content
    assert named in answer.json()["error"]
    assert [jobs.job_load(zk, j.jid).state for j in failed] == ["Failed", "Failed"]


def test_every_job_is_asked_for_in_words(client, token_for, zk, make_job):
    failed = [make_job("Failed", profile=p) for p in ("letters", "maps")]
    # Priority 0 is a filter (the jobs at priority 0: none here), not the absence of one.
    none = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "resume", "filter": {"priority": 0}},
        **token_for("admin"),
    )
    assert none.status_code == 409, none.content
    assert none.json()["error"].startswith("nothing matches this filter")
    answer = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "resume", "filter": {}, "all": True},
        **token_for("operator"),
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["summary"].startswith("2 done")
    assert all(jobs.job_load(zk, j.jid).state != "Failed" for j in failed)


def test_a_list_filter_with_an_unknown_key_is_refused(client, token_for, zk, make_job):
    make_job("Failed")
    headers = token_for("viewer")
    for url in ("/api/jobs", "/api/failed", "/api/failed/causes", "/api/batches", "/api/access"):
        answer = client.get(url, {"nosuch": "x"}, **headers)
        assert answer.status_code == 400, url
        assert "nosuch" in answer.json()["error"]


def test_a_priority_body_with_an_unknown_key_changes_nothing(client, token_for, zk, make_job):
    job = make_job("Pending", profile="letters")
    headers = token_for("operator")
    answer = post_json(
        client,
        "/api/collections/letters/priority",
        {"priority": 1, "preveiw": True},
        **headers,
    )
    assert answer.status_code == 400 and "preveiw" in answer.json()["error"]
    # A preview asked for in a word it does not know is no go-ahead either.
    answer = post_json(
        client,
        "/api/collections/letters/priority",
        {"priority": 1, "preview": "yes"},
        **headers,
    )
    assert answer.status_code == 400 and "preview" in answer.json()["error"]
    assert jobs.job_load(zk, job.jid).priority == job.priority


# 4: JSON in, JSON out, 400 for what is malformed -----------------------------------------------


@pytest.mark.parametrize("until", [1767225600, 1.5, [PAST], {"at": PAST}, True])
def test_an_end_that_is_no_text_is_a_400(client, token_for, zk, until):
    answer = post_json(
        client,
        "/api/holds/queue/ingest/hold",
        {"reason": "redeploy", "until": until},
        **token_for("admin"),
    )
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    assert nothing_held(zk)


def test_an_action_body_with_an_unknown_key_is_a_400(client, token_for, zk):
    answer = post_json(
        client,
        "/api/holds/queue/ingest/hold",
        {"reason": "redeploy", "untill": "2099-01-01T00:00:00Z"},
        **token_for("admin"),
    )
    assert answer.status_code == 400 and "untill" in answer.json()["error"]
    assert nothing_held(zk)


@pytest.mark.parametrize("key", ["render", "next"])
def test_an_action_body_with_a_pages_own_field_is_a_400(client, token_for, zk, key):
    """What only a page reads (the row htmx asks back, where to go next) is no key of the
    API's: taken and left unread, it was a field that did nothing."""
    answer = post_json(
        client,
        "/api/holds/queue/ingest/hold",
        {"reason": "redeploy", key: "row"},
        **token_for("admin"),
    )
    assert answer.status_code == 400 and f"unknown key '{key}'" in answer.json()["error"]
    assert nothing_held(zk)


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("post", "/api/holds/collection/bad$name/hold", 400),
        ("post", "/api/holds/collection/bad name/release", 400),
        ("post", "/api/collections/bad$name/priority", 400),
        ("post", "/api/holds/collection/bad$name/cap", 400),
        ("post", "/api/holds/node/95x1/hold", 400),
        ("post", "/api/holds/queue/egress/hold", 400),
        ("get", "/api/jobs/jid12", 400),
        ("get", "/api/batches/nosuch", 400),
        ("post", "/api/access/medium/qid0000000001/resume", 400),
        ("get", "/api/nosuch", 404),
        ("post", "/api/holds/collection/letters/nosuch", 404),
    ],
)
def test_every_answer_under_api_is_json(client, token_for, zk, method, path, status):
    headers = token_for("admin")
    answer = getattr(client, method)(path, **headers)
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["status"] == status
    assert nothing_held(zk)
    unauthenticated = getattr(client, method)(path)
    assert unauthenticated.status_code == 401
    assert unauthenticated["Content-Type"] == "application/json"


def test_every_other_read_and_body_is_a_closed_set_too(client, token_for, zk, make_job):
    job = make_job("Failed")
    headers = token_for("admin")
    for url, query, named in [
        ("/api/audit", {"item": job.jid}, "item"),  # item_id misspelt: every entry was listed
        ("/api/reports", {"pages": "2"}, "pages"),
        ("/api/consistency", {"kinds": "x"}, "kinds"),
        (f"/api/batches/{job.bid}", {"states": "Failed"}, "states"),
        ("/api/notes", {"kind": "job", "item": job.jid, "items": "x"}, "items"),
    ]:
        answer = client.get(url, query, **headers)
        assert answer.status_code == 400, (url, answer.content)
        assert repr(named) in answer.json()["error"]
    for body in [
        {"kind": "job", "item": job.jid, "text": "a note", "pinned": True},
        {"kind": "job", "item": job.jid, "text": ["a note"]},
    ]:
        assert post_json(client, "/api/notes", body, **headers).status_code == 400
    submission = {
        "profile": "letters",
        "submitter": "me",
        "payload_url": "https://example.org/a.pdf",
        "submission_type": "file",
        "localid": "letters-002",  # local_id, misspelt: it would be submitted without one
    }
    answer = post_json(client, "/api/batches", submission, **headers)
    assert answer.status_code == 400 and "localid" in answer.json()["error"]
    assert client.get("/api/batches", **headers).json()["total"] == 1  # only the job's own


def test_a_word_it_does_not_know_starts_nothing(client, token_for, zk, make_job):
    from queues.models import ConsistencyRun

    headers = token_for("admin")
    for body in [{"start": "no"}, {"start": "yes"}, {"start": True, "full": True}]:
        answer = post_json(client, "/api/consistency", body, **headers)
        assert answer.status_code == 400, (body, answer.content)
    assert not ConsistencyRun.objects.exists()
    # A job list's entry is an ID and a version, nothing else: a misspelt version is no check.
    job = make_job("Failed")
    answer = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "resume", "jobs": [{"id": job.jid, "versoin": job.status.version + 9}]},
        **headers,
    )
    assert answer.status_code == 400
    assert jobs.job_load(zk, job.jid).state == "Failed"


def test_a_field_of_another_action_is_refused_not_dropped(client, token_for, zk, make_job):
    """A release "until" a time would release now, a hold "to" a step would hold anyway."""
    headers = token_for("admin")
    queue_hold_set(zk, "ingest")
    later = "2099-01-01T00:00:00+00:00"
    answer = post_json(client, "/api/holds/queue/ingest/release", {"until": later}, **headers)
    assert answer.status_code == 400 and "until goes with hold" in answer.json()["error"]
    assert zk.exists(zpaths.queue_lock("ingest")) is not None
    job = make_job("Pending")
    answer = post_json(client, f"/api/jobs/{job.jid}/hold", {"to": "Processing"}, **headers)
    assert answer.status_code == 400 and "to goes with resume" in answer.json()["error"]
    assert jobs.job_load(zk, job.jid).state == "Pending"


def test_a_release_asked_to_release_jobs_it_never_parked_is_refused(client, token_for, zk):
    """ "Also release what it held" is the ingest queue's and a collection's: asked of a storage
    node's, a service's or an access queue's release, it was left out and the hold released."""
    headers = token_for("admin")
    node_hold_set(zk, 7, by="ops", reason="disk swap")
    service_hold_set(zk, "ezid", by="ops", reason="EZID maintenance")
    queue_hold_set(zk, "access-small")
    before = snapshot(zk)
    for path, named in (
        ("/api/holds/node/7/release", "node 7"),
        ("/api/holds/service/ezid/release", "service ezid"),
        ("/api/holds/queue/access-small/release", "queue access-small"),
    ):
        answer = post_json(client, path, {"release_jobs": True}, **headers)
        assert answer.status_code == 400, (path, answer.content)
        assert f"the hold of {named} parks no jobs to release" in answer.json()["error"]
    assert snapshot(zk) == before  # nothing moved
    # Without it each is released as before.
    for path in ("/api/holds/node/7/release", "/api/holds/service/ezid/release"):
        assert post_json(client, path, {}, **headers).status_code == 200, path
    assert node_holds(zk) == {} and service_holds(zk) == {}


@pytest.mark.parametrize("value", [-1, 1.5, "x", "<script>", "2020-01-01T00:00:00Z", "99"])
def test_a_true_or_false_field_takes_true_or_false(client, token_for, zk, value):
    """Django's BooleanField takes any text but "false" and "0" for true: a release told
    ``release_jobs: "x"`` or ``-1`` released the parked batches too."""
    queue_hold_set(zk, "ingest")
    before = snapshot(zk)
    answer = post_json(
        client, "/api/holds/queue/ingest/release", {"release_jobs": value}, **token_for("admin")
    )
    assert answer.status_code == 400, answer.content
    said = answer.json()["error"]
    assert "release_jobs" in said and "must be true or false" in said
    assert snapshot(zk) == before  # the hold and everything else as they were


def test_no_is_no_in_a_query_string(client, token_for, zk, make_job, monkeypatch):
    """``?stuck=no`` was "stuck only" (the form's field took any text but "false" and "0" for
    true); the usual words now read as they say, anything else is a 400."""
    asked = []

    def jobs_page(*, flt, page):
        asked.append(flt.stuck)
        raise ValueError("stop here: the filter is what this test looks at")

    monkeypatch.setattr("queues.web.api.job_reads.jobs_page", jobs_page)
    headers = token_for("viewer")
    for word, meant in (("no", False), ("off", False), ("0", False), ("yes", True), ("on", True)):
        client.get("/api/jobs", {"stuck": word}, **headers)
        assert asked.pop() is meant, word
    answer = client.get("/api/jobs", {"stuck": "maybe"}, **headers)
    said = answer.json()["error"]
    assert answer.status_code == 400 and "stuck" in said and "must be true or false" in said


def test_the_job_list_page_reads_yes_and_no_as_the_api_does(viewer, zk):
    """The page's filter form is the API's: ``?stuck=no`` is no, ``?stuck=on`` (the checkbox)
    yes and ticked again on the answer, anything else a 400 saying so."""
    for word, meant in (("no", False), ("false", False), ("on", True), ("1", True)):
        answer = viewer.get("/jobs/", {"stuck": word})
        assert answer.status_code == 200, word
        assert answer.context["form"].cleaned_data["stuck"] is meant, word
        ticked = re.search(r'<input type="checkbox" name="stuck"[^>]*>', answer.content.decode())
        assert ticked is not None and ("checked" in ticked.group(0)) is meant, word
    answer = viewer.get("/jobs/", {"stuck": "maybe"})
    assert answer.status_code == 400
    assert "must be true or false" in answer.content.decode()


# A body nested deeper than any request needs ------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/notes",
        "/api/jobs/{jid}/hold",
        "/api/jobs/bulk",
        "/api/collections/letters/priority",
        "/api/consistency",
    ],
)
def test_a_body_nested_deeper_than_any_request_needs_is_a_400(
    client, token_for, zk, make_job, path
):
    """2 KB of "[" then "]" raised RecursionError out of the JSON parser, a 500, for any
    viewer's token: the body is read before the role is checked."""
    job = make_job("Pending", profile="letters")
    before = snapshot(zk)
    answer = client.post(
        path.format(jid=job.jid),
        "[" * 1000 + "]" * 1000,
        content_type="application/json",
        **token_for("viewer"),
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == (
        "the body is JSON nested deeper than 32 levels of lists and objects: no request needs that"
    )
    assert snapshot(zk) == before


def test_json_from_outside_is_read_to_a_depth_and_no_deeper():
    from queues.core.words import JSON_DEPTH_MOST, TooDeep, json_within

    deepest = "[" * JSON_DEPTH_MOST + "]" * JSON_DEPTH_MOST
    assert json_within(deepest.encode()) == json.loads(deepest)
    # Brackets inside a string are text, however many; an escaped quote does not end it.
    text = {"reason": '\\"' + "[{" * 500, "jobs": [{"id": "jid0000000001"}] * 100}
    assert json_within(json.dumps(text)) == text
    for deeper in (
        "[" * (JSON_DEPTH_MOST + 1) + "]" * (JSON_DEPTH_MOST + 1),
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        "[]" * 100_000 + "[" * 40 + "]" * 40,
    ):
        with pytest.raises(TooDeep, match=f"deeper than {JSON_DEPTH_MOST} levels"):
            json_within(deeper)
    # Malformed but shallow: the parser's own error, whatever the brackets' number.
    with pytest.raises(ValueError) as malformed:
        json_within("[}" * 100)
    assert not isinstance(malformed.value, TooDeep)


# The API's bulk request is read by the console's bulk form ----------------------------------


@pytest.mark.parametrize(
    "extra, said_api, said_console",
    [
        ({"to": "Pending"}, "goes with resume, not with hold", "goes with resume, not with hold"),
        ({"reason": "x" * 100_000}, "at most 2000 characters", "at most 2000 characters"),
        ({"to": "Completed"}, "Completed is not one of", "Completed is not one of"),
    ],
)
def test_a_bulk_request_the_console_refuses_the_api_refuses(
    client, operator, token_for, zk, make_job, extra, said_api, said_console
):
    """``{"action": "hold", "to": "Pending", "reason": "x" * 100000}`` held the job through the
    API (and the audit kept the whole reason) where the console's bulk form answers 400."""
    from queues.operator.audit import AuditEntry

    job = make_job("Pending")
    before = snapshot(zk)
    answer = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "hold", "jobs": [job.jid], **extra},
        **token_for("operator"),
    )
    assert answer.status_code == 400, answer.content[:300]
    assert said_api in answer.json()["error"]
    console = operator.post(
        reverse("jobs-bulk"),
        {"action": "hold", "scope": "selection", "item": f"{job.jid}:", "confirmed": "1", **extra},
    )
    assert console.status_code == 400, console.content[:300]
    assert said_console in console.content.decode()
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()


def test_a_bulk_request_that_lists_no_job_is_refused(client, token_for, zk, make_job):
    from queues.operator.audit import AuditEntry

    make_job("Pending")
    before = snapshot(zk)
    answer = post_json(
        client, reverse("api-jobs-bulk"), {"action": "hold", "jobs": []}, **token_for("operator")
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"].startswith("nothing selected")
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()


def test_a_filter_that_matches_nothing_is_a_409_that_says_so(client, token_for, zk, make_job):
    """A script's "fail every stuck job" learns that nothing matched, not "0 done"; the
    console's bulk forms answer the same (``test_bulk_form_refusals``)."""
    from queues.operator.audit import AuditEntry

    make_job("Failed", profile="letters")
    before = snapshot(zk)
    answer = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "resume", "filter": {"state": "Failed", "profile": "maps"}},
        **token_for("operator"),
    )
    assert answer.status_code == 409, answer.content
    assert answer.json() == {
        "error": "nothing matches this filter now: no job was acted on",
        "status": 409,
    }
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()


def test_a_body_the_api_does_not_read_is_refused_not_taken_for_no_fields(
    client, token_for, zk, make_job
):
    """``Content-Type: text/plain`` with ``foo`` was read as an empty form: the job was held."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from queues.operator.audit import AuditEntry

    job = make_job("Pending")
    headers = token_for("operator")
    before = snapshot(zk)
    for body, kind in (("foo", "text/plain"), ("<reason>x</reason>", "application/xml")):
        answer = client.post(f"/api/jobs/{job.jid}/hold", body, content_type=kind, **headers)
        assert answer.status_code == 415, answer.content
        assert answer.json() == {
            "error": f"a body of type {kind!r} is not read here: send JSON "
            "(Content-Type: application/json) or form fields",
            "status": 415,
        }
    # A form's fields are read, but a file in it is no field.
    upload = SimpleUploadedFile("reason.txt", b"x", content_type="text/plain")
    answer = client.post(f"/api/jobs/{job.jid}/hold", {"file": upload}, **headers)
    assert answer.status_code == 400 and "takes no files" in answer.json()["error"]
    assert snapshot(zk) == before
    assert not AuditEntry.objects.exists()
    # No body at all is no fields, whatever the type says: an action that needs none is done.
    answer = client.post(f"/api/jobs/{job.jid}/hold", "", content_type="text/plain", **headers)
    assert answer.status_code == 200, answer.content
    assert jobs.job_load(zk, job.jid).state == "Held"
    answer = client.post(f"/api/jobs/{job.jid}/release", {"reason": "done"}, **headers)
    assert answer.status_code == 200, answer.content


def test_a_field_an_api_endpoint_does_not_read_is_refused(client, token_for, zk, make_job):
    """A batch's or a collection's priority took a ``version`` and did not check it; an uncap
    took a ``limit`` it does not read: each is an unknown key there, as elsewhere in the API."""
    from queues.zk import caps

    job = make_job("Pending", profile="letters")
    caps.cap_set(zk, "letters", 3, by="ops")
    headers = token_for("operator")
    before = snapshot(zk)
    for path, body, named in [
        (f"/api/batches/{job.bid}/priority", {"priority": 9, "version": 0}, "version"),
        ("/api/collections/letters/priority", {"priority": 9, "version": 0}, "version"),
        ("/api/collections/letters/priority", {"priority": 9, "confirmed": True}, "confirmed"),
        (f"/api/jobs/{job.jid}/priority", {"priority": 9, "confirmed": True}, "confirmed"),
        ("/api/holds/collection/letters/uncap", {"limit": 5}, "limit"),
        ("/api/holds/collection/letters/recount", {"limit": 5}, "limit"),
    ]:
        answer = post_json(client, path, body, **headers)
        assert answer.status_code == 400, (path, answer.content)
        assert f"unknown key {named!r}" in answer.json()["error"], path
    assert snapshot(zk) == before
    # What each does read is still taken.
    for path, body in [
        (f"/api/jobs/{job.jid}/priority", {"priority": 9}),
        ("/api/holds/collection/letters/uncap", {}),
    ]:
        assert post_json(client, path, body, **headers).status_code == 200, path
    assert jobs.job_load(zk, job.jid).priority == 9


# A version is one ZooKeeper could have given; a bulk list names each job once -----------------


@pytest.mark.parametrize("version", [2147483648, 9223372036854775808, "2147483648"])
def test_a_version_past_zookeepers_range_is_malformed_not_changed_since(
    client, operator, token_for, zk, make_job, version
):
    """A version is a signed 32-bit int in ZooKeeper: 2147483648 passed as a number and
    answered 409 "changed since" (a bulk item's: 200 "skipped", offered again)."""
    from queues.operator.audit import AuditEntry

    job = make_job("Pending", profile="letters")
    headers = token_for("operator")
    before = snapshot(zk)
    for path, body in [
        (f"/api/jobs/{job.jid}/hold", {"version": version}),
        (f"/api/jobs/{job.jid}/priority", {"priority": 9, "version": version}),
        ("/api/jobs/bulk", {"action": "hold", "jobs": [{"id": job.jid, "version": version}]}),
    ]:
        answer = post_json(client, path, body, **headers)
        assert answer.status_code == 400, (path, answer.content)
        said = answer.json()["error"]
        assert "2147483647" in said or "2,147,483,647" in said, (path, said)
    for path, form in [
        (f"/jobs/{job.jid}/hold/", {"version": str(version)}),
        (f"/jobs/{job.jid}/priority/", {"priority": "9", "version": str(version)}),
        (
            "/jobs/bulk/",
            {"action": "hold", "scope": "selection", "item": f"{job.jid}:{version}"}
            | {"confirmed": "1"},
        ),
    ]:
        answer = operator.post(path, form)
        assert answer.status_code == 400, (path, answer.content[:300])
        assert "2147483647" in answer.content.decode() or "2,147,483,647" in answer.content.decode()
    assert snapshot(zk) == before
    assert not AuditEntry.objects.filter(ok=True).exists()
    # The largest version ZooKeeper gives is a version: the item changed since, if anything.
    largest = post_json(client, f"/api/jobs/{job.jid}/hold", {"version": 2**31 - 1}, **headers)
    assert largest.status_code == 409 and "changed since" in largest.json()["error"]


def test_a_bulk_list_that_names_a_job_twice_is_refused(
    client, operator, token_for, zk, make_job, settings
):
    """``"jobs": [J] * 10001`` started a background run of 10,001 items, 10,000 skipped."""
    from queues.operator import bulkrun

    settings.MRT_BULK_INLINE_MAX = 2
    job, other = make_job("Pending"), make_job("Pending")
    before = snapshot(zk)
    answer = post_json(
        client,
        reverse("api-jobs-bulk"),
        {"action": "hold", "jobs": [job.jid, other.jid, {"id": job.jid, "version": 1}]},
        **token_for("operator"),
    )
    assert answer.status_code == 400, answer.content
    assert f"{job.jid} is listed twice" in answer.json()["error"]
    console = operator.post(
        reverse("jobs-bulk"),
        {
            "action": "hold",
            "scope": "selection",
            "item": [f"{job.jid}:", f"{other.jid}:", f"{job.jid}:"],
            "confirmed": "1",
        },
    )
    assert console.status_code == 400 and f"{job.jid} is listed twice" in console.content.decode()
    assert snapshot(zk) == before
    assert not bulkrun.BulkRun.objects.exists()
