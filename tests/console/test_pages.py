"""Read pages: overview diagrams, the job list at scale, search, the job page, escaping."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.operator import actions
from queues.zk import batches
from tests.jobnodes import set_job_nodes
from tests.scale.test_flat_failed_stuck import _work

pytestmark = pytest.mark.django_db


def test_overview_draws_each_machine_with_live_counts_and_dashed_admin_moves(viewer, make_job):
    make_job("Failed")
    make_job("Held")
    html = viewer.get(reverse("overview")).content.decode()
    assert '<svg class="diagram"' in html
    assert 'id="count-job-Failed">1 job<' in html
    assert 'id="count-job-Held">1 job<' in html
    assert 'href="/jobs/?state=Failed"' in html
    assert 'class="edge edge-admin"' in html and 'stroke-dasharray="6 5"' in html
    assert "oldest" in html
    assert 'id="count-batch-Pending">2 batches<' in html


def test_overview_htmx_refresh_returns_only_the_live_part(viewer, make_job):
    make_job("Failed")
    response = viewer.get(
        reverse("overview"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="overview-live"
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="overview-live"') and "<html" not in html


def test_job_list_filters_by_state_profile_and_priority(viewer, make_job):
    failed = make_job("Failed", profile="letters")
    other = make_job("Failed", profile="maps", priority=7)
    pending = make_job("Pending", profile="letters")
    html = viewer.get(reverse("jobs"), {"state": "Failed", "profile": "letters"}).content.decode()
    assert failed.jid in html and other.jid not in html and pending.jid not in html
    html = viewer.get(reverse("jobs"), {"priority": 7}).content.decode()
    assert other.jid in html and failed.jid not in html


def test_rows_offer_only_the_actions_the_state_and_role_allow(viewer, operator, make_job):
    failed = make_job("Failed")
    row = operator.get(reverse("jobs"), {"state": "Failed"}).content.decode()
    assert f"/jobs/{failed.jid}/resume/" in row
    assert f"/jobs/{failed.jid}/hold/" not in row  # not from Failed
    assert f"/jobs/{failed.jid}/delete/" not in row  # not for an operator
    assert f"/jobs/{failed.jid}/resume/" not in viewer.get(reverse("jobs")).content.decode()


def test_search_by_job_id_opens_the_job_and_by_ark_or_local_id_finds_it(viewer, make_job):
    job = make_job("Pending")
    response = viewer.get(reverse("jobs"), {"q": job.jid})
    assert response.status_code == 302 and response["Location"] == reverse("job", args=[job.jid])
    assert job.jid in viewer.get(reverse("jobs"), {"q": "ark:/99999/fk4test"}).content.decode()
    assert job.jid in viewer.get(reverse("jobs"), {"q": "letters-001"}).content.decode()
    assert job.jid in viewer.get(reverse("jobs"), {"q": job.bid}).content.decode()
    assert job.jid not in viewer.get(reverse("jobs"), {"q": "nothing-like-it"}).content.decode()


def test_job_list_pages_through_100000_jobs_in_one_state_without_reading_them(viewer, zk, make_job):
    """Only the page's jobs are loaded: the rest are index entries that are never read. Counted
    in ZooKeeper requests, not seconds (a loaded machine is slow, a page that reads every job
    sends 100,000 requests whatever the load)."""
    first = make_job("Pending", priority=0)
    folder = "/jobs/states/pending"
    for start in range(0, 100_000, 2000):  # one multi-op per 2000 entries: few disk syncs
        txn = zk.transaction()
        for i in range(start, start + 2000):
            txn.create(f"{folder}/05-jid{9000000000 + i}", b"")
        assert not any(isinstance(r, Exception) for r in txn.commit())
    response, cold, _lines = _work(zk, lambda: viewer.get(reverse("jobs"), {"state": "Pending"}))
    html = response.content.decode()
    assert response.status_code == 200
    assert "100001 jobs" in html and first.jid in html
    # The folders listed once each, the page's 50 jobs read: not one request per entry.
    assert cold["paths"] < 100, cold
    answer, warm, _lines = _work(
        zk, lambda: viewer.get(reverse("jobs"), {"state": "Pending", "page": 1500})
    )
    assert answer.status_code == 200 and warm["paths"] < 100, warm
    # The overview reads each job once (in multi-reads of 200; these entries have no nodes, so
    # each is met as gone), and nothing per entry after that.
    assert viewer.get(reverse("overview")).status_code == 200
    answer, again, _lines = _work(zk, lambda: viewer.get(reverse("overview")))
    assert answer.status_code == 200 and again["paths"] < 100, again


@pytest.mark.quick
def test_job_page_decodes_every_node_and_shows_status_and_lock(viewer, zk, other_zk, make_job):
    job = make_job("Failed", message="checksum mismatch on a.pdf")
    set_job_nodes(zk, job, metadata={"erc_who": "Lovelace, Ada", "erc_what": "Notes"})
    set_job_nodes(zk, job, store={"manifest_url": "https://x/m", "mode": "add"})
    set_job_nodes(zk, job, inventory={"manifest_url": "https://x/i", "mode": "add"})
    other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    html = viewer.get(reverse("job", args=[job.jid])).content.decode()
    for text in (
        "checksum mismatch on a.pdf",
        "Lovelace, Ada",
        "https://x/m",
        "https://x/i",
        "letters-001",
        "Last successful status",
        "Retry count",
        "held by session",
    ):
        assert text in html, text
    assert 'class="step-number"' in html  # the path is drawn
    assert "▼ current" in html


def test_text_from_zookeeper_is_escaped_everywhere(viewer, make_job):
    job = make_job("Failed", message="<script>alert(1)</script>", submitter="<b>x</b>")
    for url in (reverse("job", args=[job.jid]), reverse("jobs"), reverse("failed")):
        html = viewer.get(url).content.decode()
        assert "<script>alert(1)</script>" not in html
        assert "<b>x</b>" not in html


def test_a_job_with_a_malformed_node_is_shown_as_broken_not_an_error(viewer, zk, make_job):
    job = make_job("Pending")
    zk.set(f"/jobs/{job.jid}/configuration", b"{not json")
    response = viewer.get(reverse("job", args=[job.jid]))
    assert response.status_code == 200
    assert "cannot be read" in response.content.decode()
    listing = viewer.get(reverse("jobs"))
    assert listing.status_code == 200 and "unreadable" in listing.content.decode()


@pytest.mark.parametrize(
    "stamp",
    [
        "0001-01-01",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "9999-12-31 23:59:59 -1400",
    ],
)
def test_a_status_time_at_the_calendar_s_edge_is_shown_not_an_error(
    viewer, client, token_for, zk, make_job, stamp
):
    """Merritt's library, or anyone with a ZooKeeper client, may write any time: year 1 read
    as local time, or a far offset, made Python's datetime raise (ValueError, OverflowError)
    in the pages that show it."""
    import json

    job = make_job("Failed")
    path = f"/jobs/{job.jid}/status"
    status = json.loads(zk.get(path)[0])
    waiting = {"state": "Failed", "service": "storage", "attempt": 1, "next": 1e300, "reasons": []}
    status = {**status, "last_modified": stamp, "console_retry": waiting}
    zk.set(path, json.dumps(status).encode())
    for url in (reverse("job", args=[job.jid]), reverse("jobs"), reverse("failed")):
        response = viewer.get(url)
        assert response.status_code == 200, (url, response.status_code)
    headers = token_for("viewer")
    for url in ("/api/jobs", f"/api/jobs/{job.jid}", "/api/failed"):
        assert client.get(url, **headers).status_code == 200, url


def test_failed_page_groups_by_batch_collection_and_step(viewer, make_job):
    make_job("Failed", profile="letters", failed_at="Downloading", message="404")
    make_job("Failed", profile="maps", failed_at="Storing", message="storage down")
    by_step = viewer.get(reverse("failed"), {"group": "step"}).content.decode()
    assert "Failed in Downloading" in by_step and "Failed in Storing" in by_step
    by_coll = viewer.get(reverse("failed"), {"group": "collection"}).content.decode()
    assert "Collection letters" in by_coll and "storage down" in by_coll
    only = viewer.get(reverse("failed"), {"step": "Storing"}).content.decode()
    assert "storage down" in only and ">404<" not in only


def test_reports_page_lists_batch_reports_with_changes(viewer, zk, make_job):
    from queues.zk import batches

    job = make_job("Failed")
    batch = batches.batch_load(zk, job.bid)
    batches.batch_write_report(zk, batch, failed=[job.jid], successful=[])
    batches.batch_write_report(zk, batch, failed=[job.jid], successful=[])
    html = viewer.get(reverse("reports")).content.decode()
    assert f'id="report-{job.bid}"' in html and "1 still failed" in html


def test_bad_filter_input_is_a_400_not_an_error(viewer, zk):
    assert viewer.get(reverse("jobs"), {"bid": "bid1"}).status_code == 400
    assert viewer.get(reverse("jobs"), {"state": "Nope"}).status_code == 400
    assert viewer.get(reverse("failed"), {"bid": "x"}).status_code == 400
    assert viewer.get(reverse("reports"), {"page": "x"}).status_code == 400


def test_a_deleted_job_or_batch_says_who_deleted_it_and_why(
    admin, make_user, zk, make_job, make_batch
):
    job = make_job("Failed")
    ada = make_user("admin", "ada")
    actions.perform(user=ada, kind="job", action="delete", item_id=job.jid, reason="duplicate")
    page = admin.get(reverse("job", args=[job.jid]))
    assert page.status_code == 404
    text = page.content.decode()
    assert f"job {job.jid} was deleted by ada on " in text and ": duplicate" in text
    batch = make_batch()
    batch = batches.batch_transition(zk, batch, "Held", message="parked").bid
    actions.perform(user=ada, kind="batch", action="delete", item_id=batch, reason="a test")
    text = admin.get(reverse("batch", args=[batch])).content.decode()
    assert f"batch {batch} was deleted by ada on " in text and ": a test" in text
    # An ID nobody knows stays a plain "not found".
    assert "was deleted" not in admin.get(reverse("job", args=["jid0009999999"])).content.decode()


def test_a_viewer_is_refused_the_submission_form_not_only_its_post(viewer, operator, zk):
    page = viewer.get(reverse("submit"))
    assert page.status_code == 403
    assert 'name="payload_url"' not in page.content.decode()
    assert operator.get(reverse("submit")).status_code == 200
