"""Job actions through the views: roles, state machine, stale pages, CSRF, malformed IDs."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from queues.operator.audit import AuditEntry
from queues.zk import jobs

pytestmark = pytest.mark.django_db


def act(client: Client, job, action: str, **data):
    data.setdefault("version", job.status.version)
    return client.post(reverse("job-action", args=[job.jid, action]), data)


@pytest.mark.quick
def test_resume_moves_a_failed_job_back_to_the_step_it_failed_in(operator, zk, make_job):
    job = make_job("Failed", failed_at="Processing")
    response = act(operator, job, "resume")
    assert response.status_code == 303
    after = jobs.job_load(zk, job.jid)
    assert after.state == "Processing"
    assert after.status.retry_count == 1
    entry = AuditEntry.objects.get(item_id=job.jid)
    assert (entry.action, entry.before, entry.after, entry.ok) == (
        "resume",
        "Failed",
        "Processing",
        True,
    )
    assert entry.username == "operator-user"


def test_htmx_resume_returns_the_updated_row_and_the_message(htmx_admin, zk, make_job):
    job = make_job("Failed")
    response = act(htmx_admin, job, "resume", render="row", next="/jobs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="job-row-{job.jid}"' in html
    assert 'data-state="Downloading"' in html
    assert 'hx-swap-oob="innerHTML"' in html and "Failed -&gt; Downloading" in html


def test_htmx_action_on_the_job_page_rerenders_the_page_body(htmx_admin, make_job):
    job = make_job("Pending")
    response = act(htmx_admin, job, "hold", render="panel")
    assert response.status_code == 200
    assert 'id="job-body"' in response.content.decode()
    assert 'data-state="Held"' in response.content.decode()


def test_a_viewer_cannot_resume_and_the_refusal_is_audited(viewer, zk, make_job):
    job = make_job("Failed")
    assert act(viewer, job, "resume").status_code == 403
    assert jobs.job_load(zk, job.jid).state == "Failed"
    entry = AuditEntry.objects.get(item_id=job.jid)
    assert not entry.ok and "operator" in entry.detail


def test_an_operator_cannot_delete_or_fail(operator, zk, make_job):
    job = make_job("Failed")
    assert act(operator, job, "delete", reason="cleanup").status_code == 403
    running = make_job("Estimating")
    assert act(operator, running, "fail", reason="stuck").status_code == 403
    assert jobs.job_load(zk, job.jid).state == "Failed"
    assert jobs.job_load(zk, running.jid).state == "Estimating"


def test_delete_needs_a_reason(admin, zk, make_job):
    job = make_job("Failed")
    assert act(admin, job, "delete").status_code == 400
    assert zk.exists(f"/jobs/{job.jid}") is not None
    response = act(admin, job, "delete", reason="duplicate submission")
    assert response.status_code == 303
    assert zk.exists(f"/jobs/{job.jid}") is None
    entry = AuditEntry.objects.get(item_id=job.jid, ok=True)
    assert entry.reason == "duplicate submission" and entry.after == "Deleted"


def test_delete_confirmation_previews_the_job_and_asks_for_a_reason(admin, viewer, make_job):
    job = make_job("Failed")
    url = reverse("job-action", args=[job.jid, "delete"])
    response = admin.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "every node of the job" in html and 'name="reason"' in html
    assert viewer.get(url).status_code == 403


def test_fail_uses_the_reason_as_the_message(admin, zk, make_job):
    job = make_job("Downloading")
    assert act(admin, job, "fail", reason="payload host is gone").status_code == 303
    after = jobs.job_load(zk, job.jid)
    assert after.state == "Failed" and after.status.message == "payload host is gone"


def test_an_action_the_state_machine_forbids_is_a_conflict(operator, zk, make_job):
    job = make_job("Failed")
    response = act(operator, job, "hold")
    assert response.status_code == 409
    assert jobs.job_load(zk, job.jid).state == "Failed"


def test_a_stale_page_cannot_undo_a_newer_change(operator, zk, make_job):
    job = make_job("Failed")
    jobs.job_transition(zk, job, "Downloading", admin=True, retry=True)  # someone else resumed
    moved = jobs.job_load(zk, job.jid)
    jobs.job_transition(zk, moved, "Failed", message="failed again")
    response = act(operator, job, "resume")  # the page still has the old version
    assert response.status_code == 409
    assert b"changed since the page was loaded" in response.content
    assert jobs.job_load(zk, job.jid).status.retry_count == 1


def test_a_post_without_csrf_token_is_refused(make_user, zk, make_job):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("admin"))
    job = make_job("Failed")
    assert act(client, job, "resume").status_code == 403
    assert jobs.job_load(zk, job.jid).state == "Failed"


@pytest.mark.parametrize("bad", ["jid123", "jid0000000001x", "..%2Fbatches", "JID0000000001"])
def test_a_malformed_job_id_in_the_url_matches_nothing(admin, zk, bad):
    assert admin.post(f"/jobs/{bad}/resume/", {}).status_code == 404
    assert admin.get(f"/jobs/{bad}/").status_code == 404


def test_an_unknown_job_is_not_found(admin, zk):
    assert admin.post("/jobs/jid0000009999/resume/", {}).status_code == 404
    assert admin.get("/jobs/jid0000009999/").status_code == 404


def test_a_malformed_version_is_bad_input(admin, make_job):
    job = make_job("Failed")
    assert act(admin, job, "resume", version="abc").status_code == 400


def test_get_on_a_non_destructive_action_is_not_allowed(admin, make_job):
    job = make_job("Failed")
    assert admin.get(reverse("job-action", args=[job.jid, "resume"])).status_code == 405


def test_anonymous_users_are_sent_to_log_in_and_nothing_changes(client, zk, make_job):
    job = make_job("Failed")
    response = act(client, job, "resume")
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert jobs.job_load(zk, job.jid).state == "Failed"
    htmx = client.post(reverse("job-action", args=[job.jid, "resume"]), {}, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 401 and htmx["HX-Redirect"]


def test_a_user_without_a_role_sees_nothing(make_user, zk):
    client = Client()
    client.force_login(make_user(None))
    assert client.get(reverse("overview")).status_code == 403


def test_a_locked_job_cannot_be_deleted(admin, zk, other_zk, make_job):
    job = make_job("Failed")
    other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    response = act(admin, job, "delete", reason="cleanup")
    assert response.status_code == 409
    assert zk.exists(f"/jobs/{job.jid}") is not None
