"""Issue 15, server side: a resumed failure kept in the audit log, the job's path and timeline,
previews before bulk and queue holds, the consistency re-check, styled error pages, report
exports, held items, the header search and a batch's summary mails."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.urls import reverse

from queues.operator.audit import AuditEntry, earlier_failures
from queues.operator.check import run_check
from queues.steps import notify
from queues.zk import batches, jobs, locks
from queues.zk import paths as zpaths

pytestmark = pytest.mark.django_db


def item(job):
    return f"{job.jid}:{job.status.version}"


def test_a_resume_keeps_the_failure_it_resumed_from_in_the_audit_log(operator, zk, make_job):
    job = make_job("Failed", failed_at="Downloading", message="HTTP 404 on https://x/a.pdf")
    response = operator.post(
        reverse("job-action", args=[job.jid, "resume"]), {"version": job.status.version}
    )
    assert response.status_code == 303
    now = jobs.job_load(zk, job.jid)
    # The status node keeps exactly the contract's keys; its message was replaced.
    assert now.state == "Downloading" and "HTTP 404" not in now.status.message
    entry = AuditEntry.objects.get(action="resume", item_id=job.jid)
    assert "failed in Downloading: HTTP 404 on https://x/a.pdf" in entry.detail
    [failure] = earlier_failures(job.jid)
    assert failure.step == "Downloading" and failure.message == "HTTP 404 on https://x/a.pdf"

    html = operator.get(reverse("job", args=[job.jid])).content.decode()
    assert 'id="earlier-failures"' in html and "HTTP 404 on https://x/a.pdf" in html
    # The path keeps the failed visit: ... Downloading, Failed, Downloading again.
    assert "4. Downloading" in html and "5. Failed" in html and "6. Downloading" in html
    # The timeline has the creation, the resume with its actor, and the current status.
    timeline = html[html.index('id="job-timeline"') :]
    assert "Created (Pending)" in timeline
    assert "resume: Failed → Downloading" in timeline and "operator-user" in timeline
    assert timeline.index("Created (Pending)") < timeline.index("resume: Failed")
    assert "Entered Downloading" in timeline


def test_the_job_diagram_draws_operator_moves_only_from_the_current_state(viewer, make_job):
    job = make_job("Failed")
    html = viewer.get(reverse("job", args=[job.jid])).content.decode()
    svg = html[html.index("<svg") : html.index("</svg>")]
    admin_edges = svg.count("edge edge-admin")
    assert admin_edges >= 1
    assert "Held → Pending" not in svg  # an operator move out of another state
    overview = viewer.get(reverse("overview")).content.decode()
    assert overview.count("edge edge-admin") > admin_edges
    assert 'id="toggle-admin-moves"' in overview


def test_a_bulk_resume_over_a_filter_is_previewed_and_confirmed_first(operator, zk, make_job):
    ours = [make_job("Failed", profile="letters", message=f"digest mismatch {n}") for n in range(3)]
    preview = operator.post(
        reverse("failed-bulk"), {"action": "resume", "scope": "filter", "profile": "letters"}
    )
    html = preview.content.decode()
    assert preview.status_code == 200 and 'id="bulk-confirm"' in html
    assert "Resume 3 jobs?" in html and "3 Failed" in html and "digest mismatch 0" in html
    assert all(jobs.job_load(zk, j.jid).state == "Failed" for j in ours)  # nothing done yet
    done = operator.post(
        reverse("failed-bulk"),
        {"action": "resume", "scope": "filter", "profile": "letters", "confirmed": "1"},
    )
    assert "3 done, 0 skipped" in done.content.decode()
    assert all(jobs.job_load(zk, j.jid).state == "Downloading" for j in ours)


def test_the_batch_page_resumes_its_failed_jobs_and_its_checkboxes_have_a_form(
    operator, zk, make_batch, make_job
):
    batch = make_batch()
    failed = [make_job("Failed", batch=batch) for _ in range(2)]
    make_job("Pending", batch=batch)
    html = operator.get(reverse("batch", args=[batch.bid])).content.decode()
    assert 'form="bulk-form"' in html and 'id="bulk-form"' in html
    assert "Resume the 2 failed jobs of this batch" in html
    # The ticked rows go through the job bulk form of this page.
    response = operator.post(
        reverse("jobs-bulk"),
        {"action": "resume", "scope": "selection", "bid": batch.bid, "item": [item(failed[0])]},
    )
    assert "1 done, 0 skipped" in response.content.decode()
    assert jobs.job_load(zk, failed[0].jid).state == "Downloading"
    assert jobs.job_load(zk, failed[1].jid).state == "Failed"


def test_holding_the_ingest_queue_is_confirmed_with_a_reason_shown_on_the_holds_page(
    admin, zk, make_job
):
    make_job("Pending")
    url = reverse("queue-hold", args=["ingest", "hold"])
    confirm = admin.get(url).content.decode()
    assert 'id="queue-hold-preview"' in confirm and "<strong>1</strong> job waiting" in confirm
    assert not locks.queue_held(zk, "ingest")
    assert admin.post(url, {"reason": " "}).status_code == 400
    assert not locks.queue_held(zk, "ingest")
    assert admin.post(url, {"reason": "storage <b>maintenance</b>"}).status_code == 303
    assert locks.queue_held(zk, "ingest")
    holds = admin.get(reverse("holds")).content.decode()
    assert "storage &lt;b&gt;maintenance&lt;/b&gt;" in holds
    # The refusal without a reason is in the audit log too, as every refused action is.
    refused = AuditEntry.objects.get(kind="queue", action="hold", ok=False)
    assert "needs a reason" in refused.detail
    entry = AuditEntry.objects.get(kind="queue", action="hold", ok=True)
    assert entry.reason == "storage <b>maintenance</b>"


def test_the_holds_page_counts_and_links_held_batches_and_jobs(admin, zk, make_batch, make_job):
    held = [make_job("Held", profile="letters") for _ in range(12)]
    batch = make_batch(profile="letters")
    batch = batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Held")
    html = admin.get(reverse("holds")).content.decode()
    assert "12 held jobs" in html and "1 held batch" in html
    assert f'href="/batches/{batch.bid}/"' in html and f'href="/jobs/{held[0].jid}/"' in html
    assert 'id="held-jobs-more"' in html and ">2 more<" in html
    response = admin.post(reverse("collection-hold-new"), {"profile": "maps", "reason": "move"})
    assert response.status_code == 303 and response["Location"].endswith("?held=maps")
    after = admin.get(response["Location"]).content.decode()
    assert 'id="just-held"' in after and "/jobs/?state=Held&amp;profile=maps" in after


def test_the_consistency_check_drops_findings_that_were_moves_in_flight(zk, make_job, monkeypatch):
    from queues.operator import check

    moving = make_job("Pending")
    stuck = make_job("Pending")
    for job in (moving, stuck):  # the index entry in the wrong folder, as mid-move
        zk.delete(job.index_path)
        zk.create(zpaths.job_index_entry("Estimating", job.priority, job.jid), b"", makepath=True)
    slept = []

    def finish_the_move(seconds):
        slept.append(seconds)
        zk.delete(zpaths.job_index_entry("Estimating", moving.priority, moving.jid))
        zk.create(moving.index_path, b"")

    monkeypatch.setattr(check.time, "sleep", finish_the_move)
    report = run_check(zk)
    assert slept == [check.RECHECK_SECONDS]
    kinds = [(f.kind, f.path) for f in report.findings]
    assert kinds == [
        ("job-misindexed", zpaths.job_index_entry("Estimating", stuck.priority, stuck.jid))
    ]


def test_the_consistency_check_does_not_pause_without_transient_findings(zk, make_job, monkeypatch):
    from queues.operator import check

    make_job("Pending")
    monkeypatch.setattr(check.time, "sleep", lambda s: pytest.fail("paused for nothing"))
    assert run_check(zk).ok


@pytest.mark.parametrize("url", ["/batches/bogus/", "/jobs/jid12/", "/no/such/page/"])
def test_unknown_urls_and_malformed_ids_get_the_styled_404(viewer, url):
    response = viewer.get(url)
    html = response.content.decode()
    assert response.status_code == 404
    assert 'id="error-page"' in html and "/static/css/console.css" in html
    assert 'id="header-q"' in html  # the base layout, with its search box


def test_bulk_runs_and_tokens_are_in_the_navigation(viewer):
    html = viewer.get(reverse("overview")).content.decode()
    nav = html[html.index('<nav aria-label="Main">') : html.index("</nav>")]
    assert 'href="/bulk/"' in nav and 'href="/tokens/"' in nav


def test_reports_group_failures_by_message_and_export_as_csv_and_json(
    viewer, zk, make_batch, make_job
):
    batch = make_batch()
    a = make_job("Failed", batch=batch, message="digest mismatch for a.pdf")
    b = make_job("Failed", batch=batch, message="digest mismatch for a.pdf")
    c = make_job("Failed", batch=batch, message="=HYPERLINK(evil) HTTP 404")
    tab = make_job("Failed", batch=batch, message="\t=cmd|' /C calc'!A0")
    cr = make_job("Failed", batch=batch, message="\r=HYPERLINK(evil)")
    done = make_job("Completed", batch=batch)
    batches.batch_write_report(
        zk,
        batches.batch_load(zk, batch.bid),
        failed=[a.jid, b.jid, c.jid, tab.jid, cr.jid],
        successful=[done.jid],
    )
    html = viewer.get(reverse("reports")).content.decode()
    reasons = html[html.index(f'id="reasons-{batch.bid}"') :]
    assert reasons.index("digest mismatch for a.pdf") < reasons.index("HYPERLINK")
    assert '<td class="num">2</td>' in reasons
    assert f'href="/reports/{batch.bid}.csv"' in html

    response = viewer.get(reverse("report-export", args=[batch.bid, "csv"]))
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    by_job = {r["job"]: r for r in rows}
    assert by_job[a.jid]["message"] == "digest mismatch for a.pdf"
    assert by_job[c.jid]["message"].startswith("'=")  # never a formula in a spreadsheet
    assert by_job[tab.jid]["message"] == "'\t=cmd|' /C calc'!A0"  # nor after a tab
    assert by_job[cr.jid]["message"] == "'\r=HYPERLINK(evil)"  # or a carriage return
    assert by_job[done.jid]["outcome"] == "successful"
    data = json.loads(viewer.get(reverse("report-export", args=[batch.bid, "json"])).content)
    assert data["batch"] == batch.bid and len(data["jobs"]) == 6
    assert viewer.get(f"/reports/{make_batch().bid}.json").status_code == 404


def test_the_header_search_opens_the_item_or_lists_what_it_found(viewer, make_job):
    job = make_job("Pending")
    assert viewer.get("/search/", {"q": f" {job.jid} "})["Location"] == f"/jobs/{job.jid}/"
    assert viewer.get("/search/", {"q": job.bid})["Location"] == f"/batches/{job.bid}/"
    uuid = "0f8e2c1a-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
    nothing = viewer.get("/search/", {"q": uuid})
    assert nothing.status_code == 200 and 'id="search-summary"' in nothing.content.decode()
    # The one job with this ARK: opened (tests/console/test_search.py covers the rest).
    found = viewer.get("/search/", {"q": "ark:/99999/fk4test"})
    assert found["Location"] == f"/jobs/{job.jid}/"


def test_the_batch_page_shows_its_summary_mails_escaped(viewer, make_batch, settings, tmp_path):
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path / "mail"
    batch = make_batch()
    other = make_batch()
    notify.send(
        ["dpr@example.org"],
        f"Merritt batch {batch.bid} completed: <b>x</b> (1/1 ok)",
        "Body <script>1</script>\n",
    )
    notify.send(["dpr@example.org"], f"Merritt batch {other.bid} completed: other", "other body")
    html = viewer.get(reverse("batch", args=[batch.bid])).content.decode()
    mails = html[html.index('id="batch-mails"') :]
    assert "completed: &lt;b&gt;x&lt;/b&gt;" in mails and "Body &lt;script&gt;" in mails
    assert "other body" not in mails and "dpr@example.org" in mails
