"""The console's one-item forms (fuzz findings): a yes/no field takes yes/no words only, a hold
takes an end only where it has one, and a post is a closed set of fields; each refusal is a 400
naming the field, and nothing in ZooKeeper or the database changed."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from queues.models import Note
from queues.operator.audit import ApiToken, AuditEntry
from queues.zk import access, caps
from queues.zk import paths as zpaths
from queues.zk.jobs import job_load
from queues.zk.maintenance import service_holds

from .conftest import nothing_held, post_json

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


def _unchanged(zk, job_states):
    """Nothing held, capped, noted, issued or moved: what every refused post below leaves."""
    assert nothing_held(zk) and service_holds(zk) == {} and caps.caps(zk) == {}
    assert zk.exists(zpaths.queue_lock("access-small")) is None
    assert not Note.objects.exists() and not ApiToken.objects.exists()
    for jid, (state, priority) in job_states.items():
        job = job_load(zk, jid)
        assert (job.state, job.priority) == (state, priority)


@pytest.mark.parametrize(
    "where, post",
    [
        ("job-hold", {}),
        ("job-resume", {}),
        ("job-priority", {"priority": "2"}),
        ("node-hold-new", {"node": "9501", "reason": "disk swap"}),
        ("node-hold", {"reason": "disk swap"}),
        ("collection-hold-new", {"profile": "letters"}),
        ("collection-hold", {}),
        ("collection-cap", {"limit": "3"}),
        ("service-hold-new", {"service": "ezid", "reason": "EZID down"}),
        ("service-hold", {"reason": "EZID down"}),
        ("queue-hold", {"reason": "redeploy"}),
        ("token-create", {"name": "mine"}),
        ("note-add", {"text": "a word"}),
        ("access-resume", {}),
    ],
)
@pytest.mark.parametrize("extra", [{"foo": "bar"}, {"render": "row"}])
def test_a_field_a_form_does_not_read_is_refused_and_nothing_is_done(
    admin, zk, make_job, make_access, where, post, extra
):
    """Every one-item console form: an unknown field was left out and the action done."""
    pending, failed = make_job("Pending", profile="letters"), make_job("Failed")
    request = make_access("Failed", queue="large")
    url = {
        "job-hold": lambda: reverse("job-action", args=[pending.jid, "hold"]),
        "job-resume": lambda: reverse("job-action", args=[failed.jid, "resume"]),
        "job-priority": lambda: reverse("job-priority", args=[pending.jid]),
        "node-hold": lambda: reverse("node-hold", args=["9501", "hold"]),
        "collection-hold": lambda: reverse("collection-hold", args=["letters", "hold"]),
        "collection-cap": lambda: reverse("collection-cap", args=["letters", "cap"]),
        "service-hold": lambda: reverse("service-hold", args=["ezid", "hold"]),
        "queue-hold": lambda: reverse("queue-hold", args=["access-small", "hold"]),
        "note-add": lambda: reverse("note-add", args=["job", pending.jid]),
        "access-resume": lambda: reverse("access-action", args=["large", request.qid, "resume"]),
    }.get(where, lambda: reverse(where))()
    if extra == {"render": "row"} and where in ("job-hold", "job-resume", "access-resume"):
        pytest.skip("these forms answer htmx with the row they are asked for")
    answer = admin.post(url, {**post, **extra})
    named = next(iter(extra))
    assert answer.status_code == 400, (url, answer.status_code)
    assert f"unknown field '{named}'" in html.unescape(answer.content.decode())
    _unchanged(zk, {pending.jid: ("Pending", 5), failed.jid: ("Failed", 5)})
    assert access.access_load(zk, "large", request.qid).state == "Failed"
    # The same post without it is done (the forms are right, only the field is refused).
    assert admin.post(url, post).status_code in (200, 303)


@pytest.mark.parametrize("where", ["node-hold-new", "collection-hold-new"])
@pytest.mark.parametrize(
    "extra",
    [
        {"version": "-1"},
        {"version": "abc"},
        {"to": "Bogus"},
        {"release_jobs": "maybe"},
        {"render": "bogus"},
        {"next": "x" * 100_000},
    ],
)
def test_a_typed_hold_takes_its_own_fields_only(admin, zk, where, extra):
    post = {"node": "9501"} if where == "node-hold-new" else {"profile": "letters"}
    answer = admin.post(reverse(where), {**post, "reason": "r", **extra})
    assert answer.status_code == 400 and next(iter(extra)) in answer.content.decode()
    assert nothing_held(zk)


def test_a_hold_checks_no_version_it_does_not_have(admin, zk, token_for, client):
    """A hold's version was left out and the hold placed: a queue, a collection, a node or a
    service has none. The API refuses it too."""
    answer = admin.post(reverse("collection-hold", args=["letters", "hold"]), {"version": "3"})
    assert answer.status_code == 400 and "version" in answer.content.decode()
    answer = post_json(
        client, "/api/holds/node/9501/hold", {"reason": "r", "version": 3}, **token_for("admin")
    )
    assert answer.status_code == 400 and "version" in answer.json()["error"]
    assert nothing_held(zk)


def test_the_pages_own_forms_post_what_the_views_take(admin, zk, make_job):
    """What the templates post (a hold's page, the job page's buttons) is still taken whole."""
    job = make_job("Pending", profile="letters")
    page = admin.get(reverse("job", args=[job.jid])).content.decode()
    form = page[page.index(f'action="{reverse("job-action", args=[job.jid, "hold"])}"') :]
    form = form[: form.index("</form>")]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    assert set(fields) == {"csrfmiddlewaretoken", "version", "render", "next"}
    answer = admin.post(reverse("job-action", args=[job.jid, "hold"]), fields)
    assert answer.status_code == 303 and job_load(zk, job.jid).state == "Held"
