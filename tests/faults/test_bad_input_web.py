"""Bad input at every door of the console, the API and the commands: a clear 4xx (or a clean
command error), never a 5xx, and nothing written to ZooKeeper."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from kazoo.client import KazooClient

from queues.operator.audit import ApiToken
from queues.zk.records import Job

from .conftest import HOSTILE, logged_in, snapshot

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    [
        "/jobs/jid12/",
        "/jobs/jid0000000001x/",
        "/jobs/jid0000000001%2Flock/",
        "/jobs/..%2F..%2Fzookeeper/",
        "/jobs/JID0000000001/",
        "/batches/bid%000000000001/",
        "/batches/bid0000000001/explode/",
        "/access/small/qid1/resume/",
        "/access/medium/qid0000000001/resume/",
        "/holds/collection/a%2Fb/hold/",
    ],
)
def test_malformed_ids_in_urls_are_not_found(admin: Client, zk: KazooClient, url: str) -> None:
    before = snapshot(zk)
    assert admin.get(url).status_code == 404
    assert admin.post(url).status_code in (403, 404)
    assert snapshot(zk) == before


@pytest.mark.parametrize(
    ("url", "status"), [("/api/jobs/jid1", 400), ("/api/batches/bid0000000001/../../x", 404)]
)
def test_malformed_ids_in_api_urls_are_json_refusals(
    admin: Client, make_user, zk: KazooClient, url: str, status: int
) -> None:
    """Under /api/ the answer is JSON: 401 to a session without a token, then 400 for a
    malformed ID and 404 for a path that names no endpoint."""
    _token, key = ApiToken.issue(user=make_user("admin", "api-admin"), name="t")
    before = snapshot(zk)
    for answer in (admin.get(url), admin.post(url)):
        assert answer.status_code == 401 and answer["Content-Type"] == "application/json"
    for method in (admin.get, admin.post):
        answer = method(url, HTTP_AUTHORIZATION=f"Bearer {key}")
        assert answer.status_code == status and answer.json()["status"] == status
    assert snapshot(zk) == before


@pytest.mark.parametrize(
    "url", ["/jobs/jid9999999999/", "/batches/bid9999999999/", "/jobs/jid9999999999/delete/"]
)
def test_unknown_ids_are_not_found(admin: Client, zk: KazooClient, url: str) -> None:
    response = admin.get(url)
    assert response.status_code == 404
    assert b"does not exist" in response.content or b"not found" in response.content.lower()


@pytest.mark.parametrize(
    "url",
    [
        "/jobs/?state=Bogus",
        "/jobs/?priority=abc",
        "/jobs/?priority=100",
        "/jobs/?page=-1",
        "/jobs/?min_age_hours=nan",
        "/jobs/?bid=../../x",
        "/jobs/?profile=a/b",
        "/jobs/?sort=drop-table",
        "/batches/?page=xyz",
        "/failed/?bid=bid1",
        "/reports/?page=%00",
        "/access/?queue=medium",
    ],
)
def test_garbage_query_parameters_are_a_bad_request(
    viewer: Client, zk: KazooClient, url: str
) -> None:
    assert viewer.get(url).status_code == 400


@pytest.mark.parametrize(
    "fields",
    [
        {"profile": "../etc", "submitter": "me", "payload_url": "https://x.org/a"},
        {"profile": "ok", "submitter": "me", "payload_url": "javascript:alert(1)"},
        {
            "profile": "ok",
            "submitter": "me",
            "payload_url": "https://x.org/a",
            "submission_type": "x",
        },
        {"profile": "ok", "submitter": "", "payload_url": "https://x.org/a"},
        {"profile": "ok", "submitter": "me", "payload_url": "https://x.org/a", "digest_alg": "md5"},
        {"profile": "ok" * 60, "submitter": "me", "payload_url": "https://x.org/a"},
    ],
)
def test_garbage_submissions_are_refused_and_write_nothing(
    admin: Client, zk: KazooClient, fields: dict[str, str]
) -> None:
    before = snapshot(zk)
    response = admin.post("/submit/", {"submission_type": "file", **fields})
    assert response.status_code == 400
    assert snapshot(zk) == before


@pytest.mark.parametrize(
    "fields",
    [{"version": "abc"}, {"version": "-1"}, {"to": "Completed"}, {"reason": "x" * 5000}],
)
def test_garbage_action_fields_are_refused_and_write_nothing(
    admin: Client, zk: KazooClient, hostile_job: Job, fields: dict[str, str]
) -> None:
    before = snapshot(zk)
    response = admin.post(f"/jobs/{hostile_job.jid}/resume/", fields)
    assert response.status_code == 400
    assert snapshot(zk) == before


def test_a_post_without_the_csrf_token_is_forbidden(
    make_user, zk: KazooClient, hostile_job: Job
) -> None:
    careful = logged_in(make_user("admin", "csrf-admin"), enforce_csrf_checks=True)
    before = snapshot(zk)
    for url in (
        f"/jobs/{hostile_job.jid}/resume/",
        f"/jobs/{hostile_job.jid}/delete/",
        f"/batches/{hostile_job.bid}/delete/",
        "/holds/queue/ingest/hold/",
        "/submit/",
    ):
        assert careful.post(url, {"reason": "x"}).status_code == 403, url
    assert snapshot(zk) == before


def test_every_action_needs_the_right_role(
    client: Client, viewer: Client, operator: Client, zk: KazooClient, hostile_job: Job
) -> None:
    before = snapshot(zk)
    jid, bid = hostile_job.jid, hostile_job.bid
    for who, url in (
        (viewer, f"/jobs/{jid}/resume/"),
        (viewer, f"/batches/{bid}/update-reporting/"),
        (viewer, "/holds/collection/hostile_collection/hold/"),
        (operator, f"/jobs/{jid}/delete/"),
        (operator, f"/jobs/{jid}/fail/"),
        (operator, f"/batches/{bid}/delete/"),
        (operator, "/holds/queue/ingest/hold/"),
        (operator, "/consistency/repair/"),
    ):
        assert who.post(url, {"reason": "because"}).status_code == 403, url
    valid_submission = {
        "profile": "hostile_collection",
        "submitter": "me",
        "payload_url": "https://example.org/a",
        "submission_type": "file",
    }
    assert viewer.post("/submit/", valid_submission).status_code == 403
    anonymous = client.post(f"/jobs/{jid}/resume/")
    assert anonymous.status_code in (302, 403)
    assert snapshot(zk) == before


def test_the_api_refuses_bad_bodies_tokens_and_roles(
    client: Client, make_user, zk: KazooClient, hostile_job: Job
) -> None:
    _token, key = ApiToken.issue(user=make_user("admin", "api-admin"), name="t")
    _token, viewer_key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="t")
    url = f"/api/jobs/{hostile_job.jid}/resume"
    before = snapshot(zk)

    def post(body: str, token: str) -> int:
        return client.post(
            url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        ).status_code

    assert post("not json", key) == 400
    assert post("[1, 2]", key) == 400
    assert post(json.dumps({"version": "x"}), key) == 400
    assert post("{}", viewer_key) == 403
    assert post("{}", "forged") == 401
    assert (
        client.get("/api/jobs?state=Bogus", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 400
    )
    assert snapshot(zk) == before


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "resume", "../jid0000000001"),
        ("queue", "resume", "jid9999999999"),
        ("queue", "delete", "bid1"),
        ("queue", "hold-collection", "a/b"),
        ("submitbatch", "--profile", "../x", "--submitter", "me", "--payload-url", "https://x"),
        ("submitbatch", "--profile", "ok", "--submitter", "me", "--payload-url", "ftp://x"),
        ("submitbatch", "--profile", "ok", "--submitter", "me", "--payload-url", "file:///etc"),
        ("zkdump", "/../.."),
    ],
)
def test_commands_refuse_bad_arguments_with_one_line(
    zk: KazooClient, args: tuple[str, ...]
) -> None:
    before = snapshot(zk)
    with pytest.raises((CommandError, SystemExit)) as caught:
        call_command(*args)
    if isinstance(caught.value, CommandError):
        assert "\n" not in str(caught.value).strip()
    assert snapshot(zk) == before


@pytest.mark.parametrize(
    "url",
    ["/", "/jobs/?state=Failed", "/failed/", "/batches/", "JOB", "BATCH", "/reports/"],
)
def test_markup_from_depositors_is_escaped_in_every_page(
    admin: Client, hostile_job: Job, url: str
) -> None:
    url = {"JOB": f"/jobs/{hostile_job.jid}/", "BATCH": f"/batches/{hostile_job.bid}/"}.get(
        url, url
    )
    response = admin.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    for text in HOSTILE.values():
        if "<" in text:
            assert text not in body
    for fragment in ("<script>alert(", "<img src=x", "<svg onload"):
        assert fragment not in body
    if url.startswith("/jobs/jid"):
        assert "&lt;script&gt;alert(" in body  # shown as text, not dropped
