"""A Failed batch whose failed jobs were all resumed and completed stays Failed until an
operator starts Update-reporting: the batch page says so and offers it, the overview counts
such batches, and one page update-reports every one of them (issue 25, item 1)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from queues.core.states import JOB_STEPS
from queues.daemons.batch_reporting import BatchUpdateReporting
from queues.operator.audit import AuditEntry
from queues.zk import batches, jobs

pytestmark = pytest.mark.django_db

PROFILE = "merritt_demo_content"  # a profile with a notification address, for the report mail


def failed_batch(zk, make_batch, make_job, n: int = 3):
    """A batch whose ``n`` jobs failed in Downloading, reported Failed."""
    batch = make_batch(profile=PROFILE)
    made = [make_job("Failed", batch=batch, profile=PROFILE) for _ in range(n)]
    batch = batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Processing")
    batches.batch_transition(zk, batch, "Reporting")
    batch = batches.batch_transition(
        zk, batches.batch_load(zk, batch.bid), "Failed", message=f"{n} jobs failed"
    )
    return batch, made


def resume_and_complete(operator, zk, job) -> None:
    response = operator.post(
        reverse("job-action", args=[job.jid, "resume"]), {"version": job.status.version}
    )
    assert response.status_code == 303
    job = jobs.job_load(zk, job.jid)
    while job.state != "Completed":
        job = jobs.job_transition(zk, job, JOB_STEPS[JOB_STEPS.index(job.state) + 1])


def test_a_fixed_batch_says_update_reporting_is_next_and_offers_it(
    operator, zk, make_batch, make_job, mailoutbox
):
    batch, made = failed_batch(zk, make_batch, make_job)
    page = operator.get(reverse("batch", args=[batch.bid])).content.decode()
    assert 'id="batch-next-step"' not in page  # its jobs are still Failed
    for job in made:
        resume_and_complete(operator, zk, job)
    page = operator.get(reverse("batch", args=[batch.bid])).content.decode()
    notice = page.split('id="batch-next-step"')[1].split("</section>")[0]
    assert "Next step: Update-reporting" in notice
    assert "3 completed, none failed or under way" in notice
    assert 'id="batch-update-reporting"' in notice
    response = operator.post(
        reverse("batch-action", args=[batch.bid, "update-reporting"]),
        {"version": batches.batch_load(zk, batch.bid).status.version},
    )
    assert response.status_code == 303
    assert batches.batch_load(zk, batch.bid).state == "UpdateReporting"
    assert BatchUpdateReporting(zk=zk, poll=0.05).run_once()
    done = batches.batch_load(zk, batch.bid)
    assert done.state == "Completed"
    assert sorted(done.report["successful_jobs"]) == sorted(j.jid for j in made)
    page = operator.get(reverse("batch", args=[batch.bid])).content.decode()
    assert 'id="batch-next-step"' not in page


def test_a_viewer_is_told_the_next_step_without_the_button(
    operator, viewer, zk, make_batch, make_job
):
    batch, made = failed_batch(zk, make_batch, make_job, n=1)
    resume_and_complete(operator, zk, made[0])
    page = viewer.get(reverse("batch", args=[batch.bid])).content.decode()
    assert "Next step: Update-reporting" in page
    assert 'id="batch-update-reporting"' not in page and "ask an operator" in page


def test_every_fixed_batch_is_listed_counted_and_update_reported_at_once(
    operator, zk, make_batch, make_job
):
    fixed = []
    for _ in range(2):
        batch, made = failed_batch(zk, make_batch, make_job, n=2)
        for job in made:
            resume_and_complete(operator, zk, job)
        fixed.append(batch.bid)
    still, _made = failed_batch(zk, make_batch, make_job, n=1)  # its job is still Failed
    overview = operator.get(reverse("overview")).content.decode()
    card = overview.split('id="fixed-batches-card"')[1].split("</div>\n</div>")[0]
    assert 'id="count-fixed-batches">2<' in card
    page = operator.get(reverse("fixed-batches")).content.decode()
    assert all(f'id="fixed-row-{bid}"' in page for bid in fixed)
    assert f'id="fixed-row-{still.bid}"' not in page
    form = page.split('id="fixed-bulk-form"')[1].split("</form>")[0]
    items = [f"{bid}:{batches.batch_load(zk, bid).status.version}" for bid in fixed]
    assert all(f'value="{item}"' in form for item in items)
    response = operator.post(
        reverse("batches-bulk"),
        {
            "action": "update-reporting",
            "scope": "selection",
            "item": items,
            "reason": "all jobs fixed",
            "next": reverse("fixed-batches"),
        },
    )
    assert response.status_code == 200
    assert [batches.batch_load(zk, bid).state for bid in fixed] == ["UpdateReporting"] * 2
    assert batches.batch_load(zk, still.bid).state == "Failed"
    entries = AuditEntry.objects.filter(action="update-reporting", ok=True)
    assert sorted(e.item_id for e in entries) == sorted(fixed)
    assert {e.reason for e in entries} == {"all jobs fixed"}
    assert 'id="fixed-none"' in operator.get(reverse("fixed-batches")).content.decode()
    assert 'id="fixed-batches-card"' not in operator.get(reverse("overview")).content.decode()
