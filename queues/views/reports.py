"""Status reports: the batches with a report (each latest report's failed jobs grouped by their
message) and one batch's latest report exported as CSV or JSON."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues import selectors
from queues.auth import VIEWER
from queues.states import JobState
from queues.zk.client import connected_client
from queues.zk.jobs import jobs_load
from queues.zk.records import Job

from .common import HtmxHttpRequest, console_view, error_response


@require_GET
@console_view(VIEWER)
def reports(request: HtmxHttpRequest) -> HttpResponse:
    try:
        number = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        return error_response(request, "page must be a number", 400)
    page = selectors.status_reports(page=number)
    # Per batch on this page: its latest report's failed jobs grouped by their message.
    reasons = {
        row.batch.bid: failure_reasons(row.reports[0].failed_jobs)
        for row in page.items
        if row.reports and row.reports[0].failed_jobs
    }
    return render(request, "queues/reports.html", {"page": page, "reasons": reasons})


REASON_JOBS_READ = 500  # failed jobs of one report whose message is read


def failure_reasons(jids: list[str]) -> list[tuple[str, list[str]]]:
    """A report's failed jobs grouped by the message their status holds now, the commonest
    first: (message, job IDs). A job resumed since is grouped by where it is now."""
    groups: dict[str, list[str]] = {}
    zk = connected_client()
    for start in range(0, min(len(jids), REASON_JOBS_READ), 100):
        for item in jobs_load(zk, jids[start : min(start + 100, REASON_JOBS_READ)]):
            if not isinstance(item, Job):
                groups.setdefault("(unreadable job)", []).append(item.id)
            elif item.state == JobState.FAILED:
                groups.setdefault(item.status.message or "(no message)", []).append(item.jid)
            else:
                groups.setdefault(f"(no longer failed: now {item.state})", []).append(item.jid)
    if len(jids) > REASON_JOBS_READ:
        groups[f"(not read: {len(jids) - REASON_JOBS_READ} more)"] = jids[REASON_JOBS_READ:]
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _report_rows(bid: str) -> tuple[Any, list[dict[str, str]]]:
    detail = selectors.batch_detail(bid=bid)
    reports = detail.reports
    if not reports:
        return detail, []
    latest = reports[0]
    messages = {j.jid: j.status.message for j in detail.by_state.get(JobState.FAILED, [])}
    states = {j.jid: j.state for jobs in detail.by_state.values() for j in jobs}
    rows = [
        {
            "batch": bid,
            "report": latest.last_modified,
            "job": jid,
            "outcome": "failed",
            "state_now": states.get(jid, ""),
            "message": messages.get(jid, ""),
        }
        for jid in latest.failed_jobs
    ]
    rows += [
        {
            "batch": bid,
            "report": latest.last_modified,
            "job": jid,
            "outcome": "successful",
            "state_now": states.get(jid, ""),
            "message": "",
        }
        for jid in latest.successful_jobs
    ]
    return detail, rows


REPORT_FIELDS = ["batch", "report", "job", "outcome", "state_now", "message"]


@require_GET
@console_view(VIEWER)
def report_export(request: HtmxHttpRequest, bid: str, fmt: str) -> HttpResponse:
    """One batch's latest status report as CSV or JSON: every job with its outcome, and for a
    failed one the message it failed with (as its status says now)."""
    detail, rows = _report_rows(bid)
    if not detail.reports:
        return error_response(request, f"batch {bid} has no status report yet", 404)
    filename = f"report-{bid}.{fmt}"
    if fmt == "json":
        response: HttpResponse = JsonResponse(
            {
                "batch": bid,
                "state": detail.batch.state,
                "report": detail.reports[0].last_modified,
                "jobs": rows,
            },
            json_dumps_params={"indent": 2, "ensure_ascii": False},
        )
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=REPORT_FIELDS)
        writer.writeheader()
        for row in rows:
            # A cell a spreadsheet would take for a formula is written as text.
            writer.writerow(
                {k: ("'" + v if v[:1] in ("=", "+", "-", "@") else v) for k, v in row.items()}
            )
        response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
