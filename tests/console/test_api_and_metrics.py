"""The JSON API (token auth, same roles and checks as the pages); /metrics is in test_metrics.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.operator.audit import ApiToken, AuditEntry
from queues.zk import batches, jobs

from .conftest import post_json

pytestmark = pytest.mark.django_db


def test_the_api_needs_a_token_and_ignores_session_cookies(client, viewer, zk):
    assert client.get("/api/jobs").status_code == 401
    assert viewer.get("/api/jobs").status_code == 401
    assert client.get("/api/jobs", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


@pytest.mark.quick
def test_a_viewer_token_reads_jobs_and_the_overview(client, token_for, make_job, zk):
    job = make_job("Failed")
    headers = token_for("viewer")
    listing = client.get("/api/jobs", {"state": "Failed"}, **headers).json()
    assert listing["total"] == 1 and listing["items"][0]["id"] == job.jid
    detail = client.get(f"/api/jobs/{job.jid}", **headers).json()
    assert detail["state"] == "Failed" and detail["configuration"]["profile"]
    assert detail["path"][-1] == "Failed"
    overview = client.get("/api/overview", **headers).json()
    assert overview["jobs"]["Failed"]["count"] == 1
    assert client.get("/api/failed", **headers).json()["items"][0]["failed_step"] == "Downloading"
    assert client.get("/api/batches", **headers).json()["total"] == 1
    batch = client.get(f"/api/batches/{job.bid}", **headers).json()
    assert batch["jobs"]["Failed"] == [job.jid]
    # The batch's own state (issue 53: the echo of the state filter overwrote it with "").
    own = batches.batch_load(zk, job.bid).state
    assert own and batch["state"] == own and batch["job_state"] == ""
    filtered = client.get(f"/api/batches/{job.bid}", {"state": "Failed"}, **headers).json()
    assert filtered["state"] == own and filtered["job_state"] == "Failed"
    assert client.get("/api/holds", **headers).status_code == 200
    assert client.get("/api/access", **headers).status_code == 200
    assert client.get("/api/reports", **headers).status_code == 200
    assert client.get("/api/audit", **headers).status_code == 200


def test_api_actions_follow_the_same_roles_states_and_versions(client, token_for, zk, make_job):
    job = make_job("Failed")
    url = f"/api/jobs/{job.jid}/resume"
    assert post_json(client, url, {}, **token_for("viewer")).status_code == 403
    operator = token_for("operator")
    stale = post_json(client, url, {"version": job.status.version + 5}, **operator)
    assert stale.status_code == 409 and "changed" in stale.json()["error"]
    done = post_json(client, url, {"version": job.status.version}, **operator)
    assert done.status_code == 200
    assert done.json()["outcomes"][0]["after"] == "Downloading"
    assert jobs.job_load(zk, job.jid).state == "Downloading"
    assert AuditEntry.objects.filter(item_id=job.jid, ok=True, via="api").exists()
    again = post_json(client, url, {}, **operator)
    assert again.status_code == 409
    assert post_json(client, f"/api/jobs/{job.jid}/delete", {}, **operator).status_code == 403


def test_api_rejects_bad_input(client, token_for, make_job):
    job = make_job("Failed")
    headers = token_for("admin")
    bad_json = client.post(
        f"/api/jobs/{job.jid}/resume", b"{nope", content_type="application/json", **headers
    )
    assert bad_json.status_code == 400
    # "٣" is an Arabic-Indic three, which int() read as version 3.
    for version in ("x", "²", "٣", "9" * 5000, True, -1):
        url = f"/api/jobs/{job.jid}/resume"
        assert post_json(client, url, {"version": version}, **headers).status_code == 400, version
    assert post_json(client, f"/api/jobs/{job.jid}/delete", {}, **headers).status_code == 400
    malformed = client.get("/api/jobs/jid1", **headers)  # JSON, as every answer under /api/
    assert malformed.status_code == 400 and "job ID" in malformed.json()["error"]
    assert client.get("/api/jobs", {"bid": "nope"}, **headers).status_code == 400
    assert client.get(f"/api/jobs/{job.jid}/resume", **headers).status_code == 405


def test_api_bulk_reports_done_and_skipped(client, token_for, make_job):
    a, b = make_job("Failed"), make_job("Pending")
    result = post_json(
        client,
        "/api/jobs/bulk",
        {"action": "resume", "jobs": [a.jid, {"id": b.jid}]},
        **token_for("operator"),
    ).json()
    assert result["summary"].startswith("1 done, 1 skipped")
    assert result["skipped"][0]["id"] == b.jid


def test_api_submit_creates_a_batch(client, token_for, zk):
    response = post_json(
        client,
        "/api/batches",
        {
            "profile": "merritt_demo_content",
            "submitter": "api",
            "payload_url": "https://example.org/x.zip",
            "submission_type": "container",
        },
        **token_for("operator"),
    )
    assert response.status_code == 200
    bid = response.json()["outcomes"][0]["id"]
    assert zk.exists(f"/batches/{bid}/submission")


def test_tokens_are_created_once_and_revoked(viewer, zk):
    response = viewer.post(reverse("token-create"), {"name": "prometheus"})
    assert response.status_code == 200
    token = ApiToken.objects.get(name="prometheus")
    key = response.context["key"]
    assert token.key_hash != key and key.startswith(token.prefix)
    assert viewer.post(reverse("token-revoke", args=[token.pk])).status_code == 303
    assert not ApiToken.objects.exists()
    made, revoked = AuditEntry.objects.filter(kind="token").order_by("id")
    assert (made.action, made.item_id, made.username) == ("create", str(token.pk), "viewer-user")
    assert (revoked.action, revoked.before) == ("revoke", token.prefix)
    assert key not in made.detail + revoked.detail


def test_holding_a_whole_queue_through_the_api_needs_a_reason_too(client, token_for, zk):
    from queues.zk.locks import queue_held

    admin = token_for("admin")
    refused = post_json(client, "/api/holds/queue/ingest/hold", {}, **admin)
    assert refused.status_code == 400
    assert "hold on a queue needs a reason" in refused.json()["error"]
    assert not queue_held(zk, "ingest")
    held = post_json(client, "/api/holds/queue/ingest/hold", {"reason": "storage move"}, **admin)
    assert held.status_code == 200
    assert queue_held(zk, "ingest")
    assert AuditEntry.objects.filter(action="hold", reason="storage move").exists()
