"""Resume a failed job from a step the operator chooses (an earlier one than where it failed),
from the job's page, the API and a bulk action: limited to what the state machine allows and
to steps the job finished, audited, and left so that a later plain resume restarts there."""

from __future__ import annotations

import json
import time

import pytest
from django.urls import reverse

from queues.operator.audit import ApiToken, AuditEntry, earlier_failures
from queues.operator.bulkrun import BulkRun
from queues.zk import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def resume(client, job, **fields):
    return client.post(
        reverse("job-action", args=[job.jid, "resume"]),
        {"version": job.status.version, **fields},
    )


def test_resume_from_an_earlier_step_restarts_there_and_is_audited(operator, zk, make_job):
    job = make_job("Failed", failed_at="Storing", message="storage refused the manifest")
    assert resume(operator, job, to="Processing").status_code == 303
    after = jobs.job_load(zk, job.jid)
    assert after.state == "Processing"
    assert after.status.retry_count == 1
    # The step before the chosen one: a plain resume after a new failure restarts there again,
    # not at Storing past the Processing it has to redo.
    assert after.status.last_successful_status == "Downloading"
    entry = AuditEntry.objects.get(item_id=job.jid, action="resume")
    assert (entry.before, entry.after, entry.ok) == ("Failed", "Processing", True)
    [failure] = earlier_failures(job.jid)
    assert (failure.step, failure.resumed_to) == ("Storing", "Processing")
    assert failure.message == "storage refused the manifest"


def test_a_plain_resume_after_a_chosen_step_fails_again_restarts_at_the_chosen_step(
    operator, zk, make_job
):
    job = make_job("Failed", failed_at="Storing")
    resume(operator, job, to="Estimating")
    again = jobs.job_transition(zk, jobs.job_load(zk, job.jid), "Failed", message="refetch broke")
    assert resume(operator, again).status_code == 303
    assert jobs.job_load(zk, job.jid).state == "Estimating"


def test_a_step_the_job_never_reached_is_refused_with_the_steps_it_may_use(operator, zk, make_job):
    job = make_job("Failed", failed_at="Downloading")
    response = resume(operator, job, to="Storing")
    assert response.status_code == 409
    text = response.content.decode()
    assert "cannot resume at Storing" in text
    assert "would skip Downloading, Processing" in text
    assert "Pending, Estimating, Provisioning, Downloading" in text
    assert jobs.job_load(zk, job.jid).state == "Failed"
    refused = AuditEntry.objects.get(item_id=job.jid, action="resume")
    assert not refused.ok and "cannot resume at Storing" in refused.detail


def test_only_the_states_the_machine_resumes_to_are_accepted(operator, zk, make_job):
    job = make_job("Failed", failed_at="Recording")
    for state in ("Completed", "Held", "Deleted"):
        response = resume(operator, job, to=state)
        assert response.status_code == 400
        assert f"{state} is not one of the available choices" in response.content.decode()
    assert jobs.job_load(zk, job.jid).state == "Failed"
    assert not AuditEntry.objects.filter(item_id=job.jid, ok=True).exists()
    # Pending is the earliest the machine allows: the job goes through every step again.
    assert resume(operator, job, to="Pending").status_code == 303
    after = jobs.job_load(zk, job.jid)
    assert after.state == "Pending" and after.status.last_successful_status is None


def test_the_job_page_offers_the_steps_the_job_may_resume_from(viewer, operator, make_job):
    job = make_job("Failed", failed_at="Processing")
    html = operator.get(reverse("job", args=[job.jid])).content.decode()
    assert 'id="job-resume-from"' in html
    offered = html.split('id="resume-to"')[1].split("</select>")[0]
    for step in ("Pending", "Estimating", "Provisioning", "Downloading", "Processing"):
        assert f'value="{step}"' in offered
    assert 'value="Storing"' not in offered
    assert '<option value="Processing" selected>' in offered
    # A viewer may not resume: no choice is offered.
    assert 'id="job-resume-from"' not in viewer.get(reverse("job", args=[job.jid])).content.decode()


def test_the_api_resumes_from_a_chosen_step_and_refuses_one_it_may_not(
    client, make_user, zk, make_job
):
    _token, key = ApiToken.issue(user=make_user("operator", "api-op"), name="t")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    early = make_job("Failed", failed_at="Provisioning")
    refused = client.post(
        f"/api/jobs/{early.jid}/resume",
        json.dumps({"to": "Notify"}),
        content_type="application/json",
        **headers,
    )
    assert refused.status_code == 409
    assert "cannot resume at Notify" in refused.json()["error"]
    job = make_job("Failed", failed_at="Notify")
    done = client.post(
        f"/api/jobs/{job.jid}/resume",
        json.dumps({"to": "Recording", "version": job.status.version}),
        content_type="application/json",
        **headers,
    )
    assert done.status_code == 200, done.content
    assert done.json()["outcomes"][0]["after"] == "Recording"
    assert jobs.job_load(zk, job.jid).state == "Recording"
    assert AuditEntry.objects.get(item_id=job.jid, action="resume").via == "api"


def test_a_bulk_resume_from_a_step_is_previewed_then_resumes_and_skips_with_reasons(
    operator, zk, make_job
):
    late = [make_job("Failed", failed_at="Storing") for _ in range(2)]
    early = make_job("Failed", failed_at="Downloading")
    items = [f"{j.jid}:{j.status.version}" for j in [*late, early]]
    form = {"action": "resume", "scope": "selection", "item": items, "to": "Processing"}
    preview = operator.post(reverse("jobs-bulk"), form)
    html = preview.content.decode()
    assert preview.status_code == 200 and 'id="bulk-confirm"' in html
    assert "Resume from Processing" in html
    assert f"{late[0].jid}: restarts at Processing" in html
    assert f"{early.jid}: skipped: it may resume at" in html
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in [*late, early])
    done = operator.post(reverse("jobs-bulk"), {**form, "confirmed": "1"})
    assert done.status_code == 200
    assert [jobs.job_load(zk, j.jid).state for j in late] == ["Processing", "Processing"]
    assert jobs.job_load(zk, early.jid).state == "Failed"
    assert "cannot resume at Processing" in done.content.decode()
    entries = AuditEntry.objects.filter(action="resume", ok=True)
    assert sorted(e.item_id for e in entries) == sorted(j.jid for j in late)
    assert {e.after for e in entries} == {"Processing"}


def test_a_step_goes_only_with_resume_in_a_bulk_action(admin, zk, make_job):
    job = make_job("Failed")
    response = admin.post(
        reverse("jobs-bulk"),
        {
            "action": "delete",
            "scope": "selection",
            "item": [f"{job.jid}:{job.status.version}"],
            "to": "Estimating",
            "reason": "x",
        },
    )
    assert response.status_code == 400
    assert jobs.job_load(zk, job.jid).state == "Failed"


@pytest.mark.usefixtures("bulk_runs_daemon")
def test_a_background_bulk_run_resumes_every_job_from_the_chosen_step(
    operator, zk, make_job, settings
):
    settings.MRT_BULK_INLINE_MAX = 1
    failed = [make_job("Failed", failed_at="Recording") for _ in range(3)]
    response = operator.post(
        reverse("jobs-bulk"),
        {
            "action": "resume",
            "scope": "selection",
            "item": [f"{j.jid}:{j.status.version}" for j in failed],
            "to": "Storing",
            "confirmed": "1",
        },
    )
    assert response.status_code == 303
    run = BulkRun.objects.get()
    assert run.params == {"to": "Storing"}
    deadline = time.monotonic() + 60
    while BulkRun.objects.get(pk=run.pk).state == BulkRun.RUNNING:
        assert time.monotonic() < deadline, "bulk run did not finish"
        time.sleep(0.1)
    assert [jobs.job_load(zk, j.jid).state for j in failed] == ["Storing"] * 3
    assert AuditEntry.objects.filter(action="resume", after="Storing", ok=True).count() == 3
    page = operator.get(reverse("bulk-run", args=[run.pk])).content.decode()
    assert "Resume of 3 jobs from Storing</h1>" in page


def test_the_failed_and_job_lists_offer_a_step_to_resume_from(operator, make_job):
    make_job("Failed")
    for url in (reverse("failed"), reverse("jobs") + "?state=Failed"):
        form = operator.get(url).content.decode().split('id="bulk-form"')[1].split("</form>")[0]
        choice = form.split('id="bulk-to"')[1].split("</select>")[0]
        assert '<option value="">the step each job failed in</option>' in choice
        assert 'value="Pending"' in choice and 'value="Notify"' in choice
        assert 'value="Completed"' not in choice


def test_the_api_bulk_resume_takes_a_step_and_refuses_a_state_that_is_none(
    client, make_user, zk, make_job
):
    _token, key = ApiToken.issue(user=make_user("operator", "api-bulk"), name="t")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    job = make_job("Failed", failed_at="Storing")

    def bulk(to):
        body = {"action": "resume", "jobs": [job.jid], "to": to}
        return client.post(
            "/api/jobs/bulk", json.dumps(body), content_type="application/json", **headers
        )

    refused = bulk("Completed")
    said = refused.json()["error"]
    assert refused.status_code == 400 and "to" in said and "Completed is not one of" in said
    done = bulk("Processing")
    assert done.status_code == 200, done.content
    assert [o["after"] for o in done.json()["outcomes"]] == ["Processing"]
    assert jobs.job_load(zk, job.jid).state == "Processing"
