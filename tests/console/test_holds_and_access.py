"""Queue and collection holds, and the access queue's actions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.core.states import INGEST_HELD_MESSAGE
from queues.operator.audit import AuditEntry
from queues.zk import access, batches, jobs, locks

pytestmark = pytest.mark.django_db


def test_an_operator_holds_and_releases_a_collection_with_its_held_jobs(operator, zk, make_job):
    held_job = make_job("Held", profile="letters")
    assert operator.post(reverse("collection-hold-new"), {"profile": "letters"}).status_code == 303
    assert locks.collection_held(zk, "letters")
    page = operator.get(reverse("holds")).content.decode()
    assert 'id="collection-letters"' in page
    response = operator.post(
        reverse("collection-hold", args=["letters", "release"]), {"release_jobs": "1"}
    )
    assert response.status_code == 303
    assert not locks.collection_held(zk, "letters")
    assert jobs.job_load(zk, held_job.jid).state == "Pending"
    assert AuditEntry.objects.filter(kind="job", item_id=held_job.jid, after="Pending").exists()


def test_holds_page_counts_held_jobs_per_collection(viewer, zk, make_job):
    for _ in range(2):
        make_job("Held", profile="maps")
    locks.collection_hold_set(zk, "maps")
    html = viewer.get(reverse("holds")).content.decode()
    assert 'id="collection-maps"' in html
    assert '<td class="num">2</td>' in html


def test_queue_holds_are_for_admins_only(operator, admin, zk):
    url = reverse("queue-hold", args=["ingest", "hold"])
    assert operator.post(url).status_code == 403
    assert not locks.queue_held(zk, "ingest")
    assert admin.post(url).status_code == 400  # a queue hold needs a reason (issue 15)
    assert not locks.queue_held(zk, "ingest")
    assert admin.post(url, {"reason": "storage maintenance"}).status_code == 303
    assert locks.queue_held(zk, "ingest")
    overview = admin.get(reverse("overview")).content.decode()
    assert "HELD" in overview
    htmx = admin.post(reverse("queue-hold", args=["ingest", "release"]), HTTP_HX_REQUEST="true")
    assert htmx.status_code == 200 and 'id="holds-panel"' in htmx.content.decode()
    assert not locks.queue_held(zk, "ingest")


def test_a_malformed_collection_name_is_bad_input(operator, zk):
    response = operator.post(reverse("collection-hold-new"), {"profile": "../../locks"})
    assert response.status_code == 400
    assert operator.post("/holds/collection/a%2Fb/hold/").status_code == 404
    assert operator.post("/holds/queue/everything/hold/").status_code == 404


def test_resume_of_a_failed_access_request(operator, zk, make_access):
    item = make_access("Failed", queue="large")
    response = operator.post(
        reverse("access-action", args=["large", item.qid, "resume"]),
        {"version": item.status.version, "to": "Processing"},
    )
    assert response.status_code == 303
    assert access.access_load(zk, "large", item.qid).state == "Processing"


def test_access_delete_needs_admin_and_a_reason(operator, admin, zk, make_access):
    item = make_access("Completed")
    url = reverse("access-action", args=["small", item.qid, "delete"])
    assert operator.post(url, {"reason": "done"}).status_code == 403
    assert admin.get(url).status_code == 200
    assert admin.post(url, {}).status_code == 400
    assert admin.post(url, {"reason": "served"}).status_code == 303
    assert zk.exists(f"/access/small/{item.qid}") is None


def test_access_page_lists_requests_by_state(viewer, zk, make_access):
    failed = make_access("Failed")
    pending = make_access("Pending")
    html = viewer.get(reverse("access"), {"state": "Failed"}).content.decode()
    assert failed.qid in html and pending.qid not in html


def test_resuming_a_pending_access_request_is_a_conflict(operator, zk, make_access):
    item = make_access("Pending")
    url = reverse("access-action", args=["small", item.qid, "resume"])
    assert operator.post(url, {}).status_code == 409


def test_the_ingest_hold_confirmation_counts_only_jobs_really_under_way(admin, zk, make_job):
    for _ in range(3):
        make_job("Completed")
    make_job("Estimating")
    make_job("Notify")
    for _ in range(2):
        make_job("Pending")
    page = admin.get(reverse("queue-hold", args=["ingest", "hold"])).content.decode()
    assert "<strong>2</strong> jobs waiting in Pending" in page
    # Completed jobs are not under way: only Estimating and Notify are (issue 25).
    assert "the <strong>2</strong> jobs already under way" in page


def test_releasing_the_ingest_queue_releases_the_batches_its_hold_parked(admin, zk, make_batch):
    parked = make_batch()
    by_hand = make_batch()
    batches.batch_transition(zk, parked, "Held", message=INGEST_HELD_MESSAGE)
    batches.batch_transition(zk, by_hand, "Held", message="held by an operator")
    locks.queue_hold_set(zk, "ingest")
    holds_page = admin.get(reverse("holds")).content.decode()
    assert "also release the batches it held" in holds_page
    response = admin.post(reverse("queue-hold", args=["ingest", "release"]), {"release_jobs": "1"})
    assert response.status_code == 303
    assert not locks.queue_held(zk, "ingest")
    assert batches.batch_load(zk, parked.bid).state == "Pending"
    assert batches.batch_load(zk, by_hand.bid).state == "Held"
    assert AuditEntry.objects.filter(kind="batch", item_id=parked.bid, after="Pending").exists()


def test_releasing_the_ingest_queue_without_the_box_leaves_its_batches_held(admin, zk, make_batch):
    parked = make_batch()
    batches.batch_transition(zk, parked, "Held", message=INGEST_HELD_MESSAGE)
    locks.queue_hold_set(zk, "ingest")
    assert admin.post(reverse("queue-hold", args=["ingest", "release"])).status_code == 303
    assert not locks.queue_held(zk, "ingest")
    assert batches.batch_load(zk, parked.bid).state == "Held"


@pytest.mark.parametrize(
    "kind, name, form",
    [
        ("queue", "ingest", {"reason": "storage maintenance"}),
        ("collection", "letters", {}),
        ("node", "9501", {"reason": "disk swap"}),
        ("service", "inventory", {"reason": "inventory down"}),
    ],
)
def test_a_hold_or_a_release_posted_twice_says_the_second_moved_nothing(
    admin, zk, kind, name, form
):
    """A double click, or the browser posting again after a slow answer: the second hold finds
    the item held and the second release finds it released; each is answered and audited as
    "already held" / "was not held", never as a second move ("held -> held" with nothing said)."""
    for action, words in (("hold", "already held"), ("release", "was not held")):
        url = reverse(f"{kind}-hold", args=[name, action])
        first = admin.post(url, form if action == "hold" else {})
        assert first.status_code == 303, first.content[:300]
        second = admin.post(url, form if action == "hold" else {}, follow=True)
        assert second.status_code == 200
        page = second.content.decode()
        state = "held" if action == "hold" else "released"
        assert f"{kind} {name} {words}" in page and f"{state} -&gt; {state}" not in page
        made = AuditEntry.objects.filter(kind=kind, action=action, ok=True).order_by("id")
        assert [(e.before != e.after, e.detail) for e in made] == [(True, ""), (False, words)]


def test_a_hold_posted_twice_through_the_api_answers_already_held(client, token_for, zk):
    from .conftest import post_json

    url = "/api/holds/queue/ingest/hold"
    headers = token_for("admin")
    post_json(client, url, {"reason": "maintenance"}, **headers)
    again = post_json(client, url, {"reason": "maintenance"}, **headers)
    assert again.status_code == 200
    (outcome,) = again.json()["outcomes"]
    assert (outcome["before"], outcome["after"], outcome["detail"]) == (
        "held",
        "held",
        "already held",
    )
