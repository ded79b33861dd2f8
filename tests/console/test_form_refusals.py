"""The console's one-item forms (fuzz findings): a yes/no field takes yes/no words only, a hold
takes an end only where it has one, and a post is a closed set of fields; each refusal is a 400
naming the field, and nothing in ZooKeeper or the database changed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.operator.audit import AuditEntry
from queues.zk.jobs import job_load
from queues.zk.maintenance import service_holds

from .conftest import post_json

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("scope", ["batch", "collection"])
@pytest.mark.parametrize("confirmed", ["nope", "maybe"])
def test_a_scoped_priority_is_not_confirmed_by_any_text(operator, zk, make_job, scope, confirmed):
    """``confirmed=no`` skipped the preview: Django's BooleanField read it as yes."""
    job = make_job("Pending", profile="letters")
    url = (
        reverse("batch-priority", args=[job.bid])
        if scope == "batch"
        else reverse("collection-priority", args=["letters"])
    )
    answer = operator.post(url, {"priority": "9", "confirmed": confirmed})
    assert answer.status_code == 400 and "confirmed" in answer.content.decode()
    assert job_load(zk, job.jid).priority == 5
    # "no" says no: the preview, nothing changed.
    preview = operator.post(url, {"priority": "9", "confirmed": "no"})
    assert preview.status_code == 200 and 'id="priority-confirm"' in preview.content.decode()
    assert job_load(zk, job.jid).priority == 5
    assert not AuditEntry.objects.filter(action="priority").exists()


@pytest.mark.parametrize("until", ["2000-01-01T00:00:00", "2099-12-31T23:59:59", "garbage"])
def test_a_jobs_hold_takes_no_end_time(operator, token_for, client, zk, make_job, until):
    """A job's hold has no end: ``until`` was left out and the job held with none."""
    job = make_job("Pending")
    answer = operator.post(reverse("job-action", args=[job.jid, "hold"]), {"until": until})
    assert answer.status_code == 400 and "until" in answer.content.decode()
    assert job_load(zk, job.jid).state == "Pending"
    answer = post_json(
        client, f"/api/jobs/{job.jid}/hold", {"until": until}, **token_for("operator")
    )
    assert answer.status_code == 400 and "until" in answer.json()["error"]
    assert job_load(zk, job.jid).state == "Pending"


def test_a_jobs_release_takes_no_release_jobs(operator, zk, make_job):
    job = make_job("Held")
    answer = operator.post(reverse("job-action", args=[job.jid, "release"]), {"release_jobs": "1"})
    assert answer.status_code == 400 and "release_jobs" in answer.content.decode()
    assert job_load(zk, job.jid).state == "Held"


@pytest.mark.parametrize(
    "until, said", [("not-a-date", "until"), ("2099-01-01T00:00:00", "has no end")]
)
def test_a_services_hold_typed_takes_no_end_as_its_url_form(operator, zk, until, said):
    """The typed service-hold form left ``until`` out and held with no end; its URL form and the
    API refuse it."""
    for url in (reverse("service-hold-new"), reverse("service-hold", args=["ezid", "hold"])):
        post = {"reason": "EZID maintenance", "until": until}
        if url == reverse("service-hold-new"):
            post["service"] = "ezid"
        answer = operator.post(url, post)
        assert answer.status_code == 400 and said in answer.content.decode(), url
        assert service_holds(zk) == {}
