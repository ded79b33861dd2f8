"""Batch list, batch page and batch actions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.zk import batches, jobs

pytestmark = pytest.mark.django_db


def failed_batch(zk, make_job):
    job = make_job("Failed")
    batch = batches.batch_load(zk, job.bid)
    batch = batches.batch_transition(zk, batch, "Processing")
    batch = batches.batch_transition(zk, batch, "Failed", message="1 job failed")
    return batch, job


def test_batch_list_shows_each_batch_with_its_job_counts(viewer, zk, make_job):
    job = make_job("Failed")
    make_job("Pending", batch=batches.batch_load(zk, job.bid))
    response = viewer.get(reverse("batches"))
    html = response.content.decode()
    assert f'id="batch-row-{job.bid}"' in html
    row = html[html.index(f'id="batch-row-{job.bid}"') :]
    row = row[: row.index("</tr>")]
    assert 'title="1 job Failed"' in row and 'title="1 job Pending"' in row
    assert "Letters of Ada" in html


def test_batch_list_filters_by_state_and_profile(viewer, zk, make_batch):
    held = batches.batch_transition(zk, make_batch(profile="maps"), "Held")
    other = make_batch(profile="letters")
    html = viewer.get(reverse("batches"), {"state": "Held"}).content.decode()
    assert held.bid in html and other.bid not in html
    html = viewer.get(reverse("batches"), {"profile": "letters"}).content.decode()
    assert other.bid in html and held.bid not in html
    assert viewer.get(reverse("batches"), {"profile": "../x"}).status_code == 400


def test_batch_page_shows_where_its_jobs_are_and_its_reports(viewer, zk, make_job):
    batch, job = failed_batch(zk, make_job)
    batches.batch_write_report(zk, batch, failed=[job.jid], successful=[])
    batches.batch_write_report(zk, batch, failed=[], successful=[job.jid])
    html = viewer.get(reverse("batch", args=[batch.bid])).content.decode()
    assert f'id="count-batch-{batch.bid}-Failed"' in html
    assert "Latest report" in html and "1 newly successful" in html
    assert f'id="job-row-{job.jid}"' in html


def test_release_moves_a_held_batch_to_pending(operator, zk, make_batch):
    held = batches.batch_transition(zk, make_batch(), "Held")
    response = operator.post(
        reverse("batch-action", args=[held.bid, "release"]), {"version": held.status.version}
    )
    assert response.status_code == 303
    assert batches.batch_load(zk, held.bid).state == "Pending"


def test_update_reporting_on_a_failed_batch(operator, zk, make_job):
    batch, _ = failed_batch(zk, make_job)
    response = operator.post(
        reverse("batch-action", args=[batch.bid, "update-reporting"]),
        {"version": batch.status.version, "render": "row"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    assert 'data-state="UpdateReporting"' in response.content.decode()


def test_release_of_a_batch_that_is_not_held_is_a_conflict(operator, zk, make_batch):
    batch = make_batch()
    response = operator.post(reverse("batch-action", args=[batch.bid, "release"]), {})
    assert response.status_code == 409


def test_deleting_a_batch_takes_its_jobs_and_needs_admin_and_reason(operator, admin, zk, make_job):
    batch, job = failed_batch(zk, make_job)
    url = reverse("batch-action", args=[batch.bid, "delete"])
    assert operator.post(url, {"reason": "x"}).status_code == 403
    preview = admin.get(url)
    assert preview.status_code == 200 and job.jid in preview.content.decode()
    assert admin.post(url, {"version": batch.status.version}).status_code == 400
    response = admin.post(url, {"version": batch.status.version, "reason": "test batch"})
    assert response.status_code == 303 and response["Location"] == reverse("batches")
    assert zk.exists(f"/batches/{batch.bid}") is None
    with pytest.raises(jobs.NotFound):
        jobs.job_load(zk, job.jid)


def test_a_stale_batch_page_cannot_delete(admin, zk, make_job):
    batch, _ = failed_batch(zk, make_job)
    batches.batch_transition(zk, batch, "UpdateReporting", admin=True)
    response = admin.post(
        reverse("batch-action", args=[batch.bid, "delete"]),
        {"version": batch.status.version, "reason": "old"},
    )
    assert response.status_code == 409
    assert zk.exists(f"/batches/{batch.bid}") is not None


def test_malformed_and_unknown_batch_ids(viewer, zk):
    assert viewer.get("/batches/bid12/").status_code == 404
    assert viewer.get("/batches/bid0000099999/").status_code == 404


def test_the_batch_page_shows_its_jobs_before_its_diagrams_in_plain_words(viewer, make_job):
    job = make_job("Completed")
    make_job("Failed", batch=None)
    html = viewer.get(f"/batches/{job.bid}/").content.decode()
    counts = html[html.index('id="batch-job-counts"') :]
    counts = counts[: counts.index("</dd>")]
    assert "1 completed" in counts and "batch-completed" not in counts
    # The job table comes first; the diagrams follow, folded.
    assert html.index('id="batch-jobs-Completed"') < html.index('id="batch-diagrams"')


def test_the_batch_list_says_how_far_each_batch_is_and_how_long_it_has_taken(
    viewer, zk, make_batch, make_job
):
    batch = make_batch()
    for state in ("Completed", "Completed", "Failed", "Estimating"):
        make_job(state, batch=batch)
    html = viewer.get("/batches/").content.decode()
    row = html[html.index(f'id="batch-row-{batch.bid}"') :]
    row = row[: row.index("</tr>")]
    assert "75% done" in row and 'title="3 of 4 jobs ended"' in row
    assert 'class="elapsed"' in row


def failed_batch_of(zk, make_job, count):
    """A Failed batch with ``count`` Failed jobs, oldest first (the order a delete takes them)."""
    first = make_job("Failed")
    batch = batches.batch_load(zk, first.bid)
    made = [first] + [make_job("Failed", batch=batch) for _ in range(count - 1)]
    batch = batches.batch_transition(zk, batch, "Processing")
    batch = batches.batch_transition(zk, batch, "Failed", message="jobs failed")
    return batch, sorted(made, key=lambda j: j.jid)


def test_deleting_a_batch_one_of_whose_jobs_a_session_holds_deletes_nothing_and_says_so(
    admin, zk, other_zk, make_job
):
    from queues.operator.audit import AuditEntry

    batch, made = failed_batch_of(zk, make_job, 3)
    other_zk.create(f"/jobs/{made[-1].jid}/lock", b"", ephemeral=True)
    response = admin.post(
        reverse("batch-action", args=[batch.bid, "delete"]),
        {"version": batch.status.version, "reason": "submitted twice"},
    )
    assert response.status_code == 409
    assert f"job {made[-1].jid} is locked" in response.content.decode()
    assert "nothing was deleted" in response.content.decode()
    assert all(zk.exists(f"/jobs/{j.jid}") for j in made)
    assert batches.batch_load(zk, batch.bid).state == "Failed"
    entry = AuditEntry.objects.get(action="delete", item_id=batch.bid)
    assert not entry.ok and entry.detail.startswith("refused: ")


def test_a_batch_delete_stopped_part_way_answers_and_audits_what_it_did(
    admin, zk, other_zk, make_job, monkeypatch
):
    from queues.operator.audit import AuditEntry

    batch, made = failed_batch_of(zk, make_job, 2)
    real_children = jobs.children

    def children_after_a_claim(client, path):
        if path == f"/jobs/{made[1].jid}" and not other_zk.exists(f"{path}/lock"):
            other_zk.create(f"{path}/lock", b"", ephemeral=True)
        return real_children(client, path)

    monkeypatch.setattr(jobs, "children", children_after_a_claim)
    response = admin.post(
        reverse("batch-action", args=[batch.bid, "delete"]),
        {"version": batch.status.version, "reason": "submitted twice"},
    )
    assert response.status_code == 409
    said = response.content.decode()
    assert f"1 of its 2 jobs removed ({made[0].jid})" in said
    assert "delete or remove it again to finish" in said
    entry = AuditEntry.objects.get(action="delete", item_id=batch.bid)
    assert entry.detail.startswith("stopped: delete of batch") and made[0].jid in entry.detail
    assert batches.batch_load(zk, batch.bid).state == "Deleted"
