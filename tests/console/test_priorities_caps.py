"""Priorities and caps from the console and the API (issue 24): a waiting job's priority, a
batch's and a whole collection's (previewed, then each job changed and audited, in the
background when there are many), the contract's index names kept; a collection's cap set,
counted, recounted and removed, with the same role checks at both doors."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from django.urls import reverse

from queues.operator.audit import AuditEntry
from queues.operator.bulkrun import BulkRun
from queues.services import hold_moves
from queues.zk import caps
from queues.zk.jobs import job_load, job_transition
from tests.browser import logged_in, shot
from tests.core.helpers import snapshot

from .conftest import PASSWORD, post_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("bulk_runs_daemon")]


@contextlib.contextmanager
def index_filling(zk):
    """The read index filling as after a start, held at its first step until the block ends."""
    from queues.zk import index as zindex

    idx = zindex.for_client(zk)
    release = threading.Event()
    filler = idx.start_fill(first=lambda: release.wait(30))
    try:
        deadline = time.monotonic() + 10
        while not idx.filling:
            assert time.monotonic() < deadline, "the fill did not start"
            time.sleep(0.05)
        yield
    finally:
        release.set()
        filler.join(60)
    assert not idx.filling


def pending_entries(zk) -> set[str]:
    return set(zk.get_children("/jobs/states/pending"))


def ended(pk: int, timeout: float = 60) -> BulkRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = BulkRun.objects.get(pk=pk)
        if run.state != BulkRun.RUNNING:
            return run
        time.sleep(0.1)
    raise AssertionError(f"bulk run {pk} still running after {timeout}s")


def test_an_operator_changes_a_waiting_jobs_priority_and_its_index_entry_is_renamed(
    operator, zk, make_job
):
    job = make_job("Pending", profile="letters")
    response = operator.post(
        reverse("job-priority", args=[job.jid]),
        {"priority": "2", "version": str(job.status.version), "reason": "urgent deposit"},
    )
    assert response.status_code in (302, 303)
    assert job_load(zk, job.jid).priority == 2
    entries = pending_entries(zk)
    assert f"02-{job.jid}" in entries and f"05-{job.jid}" not in entries
    entry = AuditEntry.objects.get(action="priority", item_id=job.jid)
    assert (entry.kind, entry.before, entry.after, entry.reason, entry.ok) == (
        "job",
        "priority 5",
        "priority 2",
        "urgent deposit",
        True,
    )


def test_a_job_in_flight_or_a_viewer_cannot_change_a_priority(operator, viewer, zk, make_job):
    flying = make_job("Downloading", profile="letters")
    response = operator.post(reverse("job-priority", args=[flying.jid]), {"priority": "1"})
    assert response.status_code == 409
    assert job_load(zk, flying.jid).priority == 5
    waiting = make_job("Pending", profile="letters")
    assert (
        viewer.post(reverse("job-priority", args=[waiting.jid]), {"priority": "1"}).status_code
        == 403
    )
    assert job_load(zk, waiting.jid).priority == 5
    refused = AuditEntry.objects.filter(action="priority", ok=False)
    assert {e.item_id for e in refused} == {flying.jid, waiting.jid}


def test_a_collections_priority_is_previewed_then_changed_for_its_waiting_jobs_only(
    operator, zk, make_job, settings
):
    settings.MRT_BULK_INLINE_MAX = 200
    waiting = [make_job("Pending", profile="campaign") for _ in range(3)]
    held = make_job("Held", profile="campaign")
    flying = make_job("Estimating", profile="campaign")
    other = make_job("Pending", profile="letters")
    url = reverse("collection-priority", args=["campaign"])
    preview = operator.post(url, {"priority": "9", "reason": "big campaign"})
    assert preview.status_code == 200
    page = preview.content.decode()
    assert "Priority 9 for 4 waiting jobs of collection campaign?" in page
    assert "<strong>4</strong> at priority 5" in page
    assert job_load(zk, waiting[0].jid).priority == 5  # nothing done by the preview
    done = operator.post(url, {"priority": "9", "reason": "big campaign", "confirmed": "1"})
    assert done.status_code in (302, 303)
    for job in [*waiting, held]:
        assert job_load(zk, job.jid).priority == 9
    entries = pending_entries(zk)
    assert {f"09-{j.jid}" for j in waiting} <= entries
    assert f"09-{held.jid}" in set(zk.get_children("/jobs/states/held"))
    assert job_load(zk, flying.jid).priority == 5
    assert f"05-{other.jid}" in entries
    audited = AuditEntry.objects.filter(action="priority", ok=True)
    assert {e.item_id for e in audited} == {j.jid for j in [*waiting, held]}
    assert {e.reason for e in audited} == {"big campaign"}


def test_a_large_batch_priority_runs_in_the_background(
    operator, zk, make_job, make_batch, settings
):
    settings.MRT_BULK_INLINE_MAX = 2
    batch = make_batch(profile="letters")
    jobs = [make_job("Pending", batch=batch, profile="letters") for _ in range(4)]
    response = operator.post(
        reverse("batch-priority", args=[batch.bid]), {"priority": "1", "confirmed": "1"}
    )
    run = BulkRun.objects.get()
    assert response["Location"] == reverse("bulk-run", args=[run.pk])
    assert (run.kind, run.action, run.params, run.total) == ("job", "priority", {"priority": 1}, 4)
    assert ended(run.pk).done == 4
    assert {f"01-{j.jid}" for j in jobs} <= pending_entries(zk)


def test_the_api_previews_and_changes_a_batch_and_a_collection_and_a_job(
    client, token_for, zk, make_job, make_batch, settings
):
    settings.MRT_BULK_INLINE_MAX = 200
    operator = token_for("operator")
    batch = make_batch(profile="letters")
    in_batch = [make_job("Pending", batch=batch, profile="letters") for _ in range(2)]
    url = reverse("api-batch-priority", args=[batch.bid])
    preview = post_json(client, url, {"priority": 3, "preview": True}, **operator).json()
    assert (preview["jobs"], preview["by_priority"], preview["preview"]) == (2, {"05": 2}, True)
    assert job_load(zk, in_batch[0].jid).priority == 5
    answer = post_json(client, url, {"priority": 3, "reason": "r"}, **operator).json()
    assert answer["summary"].startswith("2 done")
    assert {f"03-{j.jid}" for j in in_batch} <= pending_entries(zk)

    campaign = [make_job("Pending", profile="campaign") for _ in range(2)]
    url = reverse("api-collection-priority", args=["campaign"])
    answer = post_json(client, url, {"priority": 7}, **operator).json()
    assert sorted(o["id"] for o in answer["outcomes"]) == sorted(j.jid for j in campaign)

    single = make_job("Pending", profile="letters")
    url = reverse("api-job-priority", args=[single.jid])
    assert post_json(client, url, {"priority": 100}, **operator).status_code == 400
    answer = post_json(client, url, {"priority": 0, "version": 99}, **operator)
    assert answer.status_code == 409  # a stale version
    answer = post_json(client, url, {"priority": 0}, **operator).json()
    assert answer["outcomes"][0]["after"] == "priority 0"
    assert f"00-{single.jid}" in pending_entries(zk)
    viewer = token_for("viewer")
    assert post_json(client, url, {"priority": 4}, **viewer).status_code == 403


def test_a_collection_nobody_knows_is_a_404_at_its_page_and_priority_doors(
    operator, client, token_for, zk, make_job
):
    """The page of a collection no profile, hold, cap or job names answered 200, empty, while a
    note on it was a 404: both doors now answer 404 for it, its priority's too, nothing done."""
    make_job("Pending", profile="letters")
    headers = token_for("operator")
    before = snapshot(zk)
    page = operator.get(reverse("collection", args=["no_such_coll"]))
    assert page.status_code == 404
    assert "collection no_such_coll is not known" in page.content.decode()
    url = reverse("collection-priority", args=["no_such_coll"])
    for data in ({"priority": "9"}, {"priority": "9", "confirmed": "1"}):
        answer = operator.post(url, data)
        assert answer.status_code == 404, data
        assert "collection no_such_coll is not known" in answer.content.decode()
    url = reverse("api-collection-priority", args=["no_such_coll"])
    for body in ({"priority": 9, "preview": True}, {"priority": 9}):
        answer = post_json(client, url, body, **headers)
        assert answer.status_code == 404, body
        assert "collection no_such_coll is not known" in answer.json()["error"]
    assert snapshot(zk) == before
    assert not AuditEntry.objects.filter(action="priority").exists()
    assert not BulkRun.objects.exists()
    # Known with no job now, from its profile or from a hold only: its page, as before.
    from queues.console.selectors import known_profiles

    hold_moves.collection_hold(profile="quiet", reason="r")
    for name in (known_profiles()[0], "quiet"):
        assert operator.get(reverse("collection", args=[name])).status_code == 200, name
        answer = post_json(
            client,
            reverse("api-collection-priority", args=[name]),
            {"priority": 9, "preview": True},
            **headers,
        )
        assert answer.status_code == 200 and answer.json()["jobs"] == 0, name


def test_a_cap_is_set_counting_the_jobs_in_flight_recounted_and_removed(
    operator, client, token_for, zk, make_job
):
    flying = [make_job("Downloading", profile="campaign") for _ in range(3)]
    make_job("Pending", profile="campaign")
    url = reverse("collection-cap", args=["campaign", "cap"])
    assert operator.post(url, {"limit": "2", "reason": "fair share"}).status_code in (302, 303)
    cap = caps.cap_of(zk, "campaign")
    assert (cap.limit, cap.counted, cap.by, cap.reason) == (2, 3, "operator-user", "fair share")
    page = operator.get(reverse("collection", args=["campaign"])).content.decode()
    # One figure: the jobs in flight now against the limit (issue 53).
    assert 'Cap <strong>2</strong>: <strong id="in-flight-now">3</strong> of its jobs' in page
    assert "over its cap" in page and "counted in flight" not in page
    entry = AuditEntry.objects.get(action="cap")
    assert (entry.kind, entry.item_id, entry.before, entry.after) == (
        "collection",
        "campaign",
        "no cap",
        "cap 2",
    )
    # A job leaves flight: a recount (the page's button) takes it off the count.
    job_transition(zk, job_load(zk, flying[0].jid), "Failed", message="x")
    assert operator.post(reverse("collection-cap", args=["campaign", "recount"])).status_code in (
        302,
        303,
    )
    assert caps.cap_of(zk, "campaign").counted == 2
    api = token_for("operator")
    listed = client.get(reverse("api-caps"), **api).json()["collections"]["campaign"]
    assert listed["cap"]["limit"] == 2 and listed["in_flight"] == 2 and listed["waiting"] == 1
    answer = post_json(
        client, reverse("api-collection-cap", args=["campaign", "cap"]), {"limit": 5}, **api
    )
    assert answer.json()["cap"]["limit"] == 5
    viewer = token_for("viewer")
    uncap = reverse("api-collection-cap", args=["campaign", "uncap"])
    assert post_json(client, uncap, {}, **viewer).status_code == 403
    assert post_json(client, uncap, {}, **api).json()["cap"] is None
    assert zk.exists(caps.cap_path("campaign")) is None
    assert operator.post(url, {"limit": "0"}).status_code == 400


def test_an_operator_changes_a_collections_priority_and_cap_in_a_browser(
    browser, live_server, make_user, zk, make_job
):
    make_user("operator", "olga")
    waiting = [make_job("Pending", profile="campaign") for _ in range(3)]
    make_job("Processing", profile="campaign")
    with logged_in(browser, live_server.url, "olga", PASSWORD) as page:
        page.click("nav >> text=Collections")
        assert "3" in page.inner_text("#collection-row-campaign")
        page.click("#collection-row-campaign a")
        page.fill("#priority", "8")
        page.fill("#priority-reason", "campaign after the others")
        page.click("#preview-priority")
        assert "3 at priority 5" in page.inner_text("#priority-preview-counts").replace("\n", " ")
        page.click("#confirm-priority")
        page.wait_for_selector("#waiting-count >> text=3 at priority 8")
        assert {f"08-{j.jid}" for j in waiting} <= pending_entries(zk)
        page.fill("#cap-limit", "2")
        page.fill("#cap-reason", "fair share")
        page.click("#set-cap")
        page.wait_for_selector("#cap-state >> text=1 of its jobs in flight now")
        assert "Cap 2" in page.inner_text("#cap-state")
        shot(page, "collection-priority-cap")
        cap = caps.cap_of(zk, "campaign")
        assert (cap.limit, cap.counted, cap.by) == (2, 1, "olga")
        page.click("#remove-cap")
        page.wait_for_selector("#cap-state >> text=No cap")
        assert caps.cap_of(zk, "campaign") is None


def test_the_job_page_links_to_its_priority_form_while_it_waits(operator, viewer, make_job):
    waiting = make_job("Pending")
    page = operator.get(f"/jobs/{waiting.jid}/").content.decode()
    assert f'href="/jobs/{waiting.jid}/priority/" id="job-priority-link"' in page
    assert 'id="job-priority-link"' not in viewer.get(f"/jobs/{waiting.jid}/").content.decode()
    done = make_job("Completed")
    assert 'id="job-priority-link"' not in operator.get(f"/jobs/{done.jid}/").content.decode()


def test_a_collections_priority_and_cap_wait_while_the_read_index_fills(
    operator, client, token_for, zk, make_job
):
    """Right after a start the read index knows only the jobs read so far: a change meant for a
    whole collection would reach only those (or count only those in flight), so it is refused
    with a 503 that says to try again, nothing written; the preview says what is loading."""
    waiting = [make_job("Pending", profile="campaign") for _ in range(2)]
    make_job("Downloading", profile="campaign")
    token = token_for("operator")
    priority_url = reverse("collection-priority", args=["campaign"])
    cap_url = reverse("collection-cap", args=["campaign", "cap"])
    with index_filling(zk):
        for answer in (
            operator.post(priority_url, {"priority": "9", "confirmed": "1"}),
            operator.post(priority_url, {"priority": "9"}),  # nothing read yet to preview
            post_json(
                client,
                reverse("api-collection-priority", args=["campaign"]),
                {"priority": 9},
                **token,
            ),
            operator.post(cap_url, {"limit": "2"}),
        ):
            assert answer.status_code == 503, answer.content
            assert answer["Retry-After"]
            assert "still reading the queue after a start" in answer.content.decode()
            assert "nothing was changed" in answer.content.decode()
        assert caps.cap_of(zk, "campaign") is None
        assert not BulkRun.objects.exists()
    assert all(job_load(zk, j.jid).priority == 5 for j in waiting)
    done = operator.post(priority_url, {"priority": "9", "confirmed": "1"})
    assert done.status_code in (302, 303)
    assert all(job_load(zk, j.jid).priority == 9 for j in waiting)
    assert operator.post(cap_url, {"limit": "2"}).status_code in (302, 303)
    cap = caps.cap_of(zk, "campaign")
    assert cap is not None and cap.counted == 1  # the one job in flight


def test_a_bulk_action_over_a_filter_waits_while_the_read_index_fills(
    operator, client, token_for, zk, make_job
):
    """A bulk action over everything a collection, submitter or search filter matches (and any
    over the failed filter) would, right after a start, reach only the jobs read so far: it is
    refused with a 503 that says to try again, preview and run alike, nothing written. A
    selection and a filter by state alone (a folder listing) are not held up."""
    held = [make_job("Held", profile="letters") for _ in range(2)]
    failed = make_job("Failed", profile="letters")
    token = token_for("operator")
    by_collection = {"action": "release", "scope": "filter", "state": "Held", "profile": "letters"}
    with index_filling(zk):
        for answer in (
            operator.post(reverse("jobs-bulk"), by_collection),
            operator.post(reverse("jobs-bulk"), {**by_collection, "confirmed": "1"}),
            operator.post(
                reverse("jobs-bulk"),
                {"action": "release", "scope": "filter", "q": "ark:/99999/fk4x", "confirmed": "1"},
            ),
            operator.post(
                reverse("jobs-bulk"),
                {"action": "release", "scope": "filter", "submitter": "olga", "confirmed": "1"},
            ),
            operator.post(
                reverse("failed-bulk"),
                {"action": "resume", "scope": "filter", "confirmed": "1", "all": "1"},
            ),
            post_json(
                client,
                reverse("api-jobs-bulk"),
                {"action": "release", "filter": {"state": "Held", "profile": "letters"}},
                **token,
            ),
        ):
            assert answer.status_code == 503, answer.content
            assert answer["Retry-After"]
            assert "still reading the queue after a start" in answer.content.decode()
            assert "nothing was changed" in answer.content.decode()
        assert not BulkRun.objects.exists()
        assert all(job_load(zk, j.jid).state == "Held" for j in held)
        assert job_load(zk, failed.jid).state == "Failed"
        # A selection names its jobs, and a state's jobs come from the state's folder itself.
        chosen = operator.post(
            reverse("jobs-bulk"),
            {
                "action": "release",
                "scope": "selection",
                "item": [f"{held[0].jid}:{held[0].status.version}"],
            },
        )
        assert chosen.status_code == 200, chosen.content
        assert job_load(zk, held[0].jid).state == "Pending"
        by_state = operator.post(
            reverse("jobs-bulk"), {"action": "release", "scope": "filter", "state": "Held"}
        )
        assert by_state.status_code == 200 and 'id="bulk-confirm"' in by_state.content.decode()
    done = operator.post(reverse("jobs-bulk"), {**by_collection, "confirmed": "1"})
    assert done.status_code == 200, done.content
    assert job_load(zk, held[1].jid).state == "Pending"
