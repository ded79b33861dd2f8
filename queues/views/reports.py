"""Status reports: the batches with a report (each latest report's failed jobs grouped by their
message) and one batch's latest report exported as CSV or JSON."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues.console import batch_reads
from queues.core import clock
from queues.core.states import JobState
from queues.operator.auth import VIEWER
from queues.web.forms import whole_number
from queues.zk import index as zindex
from queues.zk import paths
from queues.zk.client import connected_client
from queues.zk.codecs import decode_json
from queues.zk.errors import MalformedNode
from queues.zk.nodes import Read, read_many

from .common import HtmxHttpRequest, console_view, error_response

# What one batch of the page shows of its latest report: the first IDs of each list (all of
# them are on the batch page and in the export), and the messages of its first failed jobs.
REPORT_IDS_SHOWN = 50
REASON_JOBS_READ = 20


@require_GET
@console_view(VIEWER)
def reports(request: HtmxHttpRequest) -> HttpResponse:
    number = whole_number(request.GET)
    page = batch_reads.status_reports(page=number, shown=REPORT_IDS_SHOWN)
    reasons = failure_reasons(
        {
            row.batch.bid: (row.reports[0].failed_jobs, row.reports[0].failed_count)
            for row in page.items
            if row.reports and row.reports[0].failed_count
        }
    )
    return render(
        request,
        "queues/reports.html",
        {"page": page, "reasons": reasons, "reasons_read": REASON_JOBS_READ},
    )


def failure_reasons(
    failed: dict[str, tuple[list[str], int]],
) -> dict[str, list[tuple[str, list[str]]]]:
    """Per batch, its report's failed jobs grouped by the message their status holds now, the
    commonest first: (message, job IDs); a job resumed since is grouped by where it is now.
    ``failed``: batch -> (the failed job IDs at hand, how many the report has). The first
    REASON_JOBS_READ of each batch are read, every batch's in one round trip: a page costs
    the same whatever the size of its batches."""
    wanted = {bid: jids[:REASON_JOBS_READ] for bid, (jids, _count) in failed.items()}
    reads = read_many(
        connected_client(),
        [paths.job_node(j, "status") for jids in wanted.values() for j in jids],
    )
    result = {}
    for bid, jids in wanted.items():
        groups: dict[str, list[str]] = {}
        for jid in jids:
            groups.setdefault(_reason(jid, reads[paths.job_node(jid, "status")]), []).append(jid)
        rest = failed[bid][1] - len(jids)
        if rest > 0:
            groups[f"(not read: {rest} more)"] = failed[bid][0][len(jids) :]
        result[bid] = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return result


def _reason(jid: str, read: Read) -> str:
    if read is None:
        return "(unreadable job)"
    try:
        status = decode_json(paths.job_node(jid, "status"), read[0])
    except MalformedNode:
        return "(unreadable job)"
    state = status.get("status") if isinstance(status, dict) else None
    if state == JobState.FAILED:
        message = status.get("message")
        return message if isinstance(message, str) and message else "(no message)"
    return f"(no longer failed: now {state})"


def _report_rows(bid: str) -> tuple[Any, list[dict[str, str]]]:
    """The latest report's jobs, each with the state it is in now (the read index) and, for a
    job Failed now, its message (its status read: one multiRead per 200 such jobs)."""
    detail = batch_reads.batch_detail(bid=bid, per_state=0)
    reports = detail.reports
    if not reports:
        return detail, []
    latest = reports[0]
    zk = connected_client()
    states = zindex.for_client(zk).job_states_of([*latest.failed_jobs, *latest.successful_jobs])
    failed_now = [j for j in latest.failed_jobs if states.get(j) == JobState.FAILED]
    reads = read_many(zk, [paths.job_node(j, "status") for j in failed_now])
    messages = {
        j: _message(paths.job_node(j, "status"), reads.get(paths.job_node(j, "status")))
        for j in failed_now
    }
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


def _message(path: str, read: Read) -> str:
    """A status node's message ("" when it is gone or does not decode)."""
    if read is None:
        return ""
    try:
        status = decode_json(path, read[0])
    except MalformedNode:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""


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
    # The report's time as each reader takes it: the API's ISO form (UTC) for a program, the
    # console's written form for the spreadsheet a person opens (queues/core/clock.py).
    stamp = detail.reports[0].last_modified
    shown = clock.exact(stamp) or stamp if fmt == "json" else clock.clock_text(stamp)
    rows = [{**row, "report": shown} for row in rows]
    if fmt == "json":
        response: HttpResponse = JsonResponse(
            {
                "batch": bid,
                "state": detail.batch.state,
                "report": shown,
                "jobs": rows,
            },
            json_dumps_params={"indent": 2, "ensure_ascii": False},
        )
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=REPORT_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _as_text(v) for k, v in row.items()})
        response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# What makes a spreadsheet read a cell as a formula: its first character one of these (OWASP's
# "CSV Injection": a tab or carriage return before the "=" is skipped by some spreadsheets).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _as_text(value: str) -> str:
    """A CSV cell a spreadsheet shows as the text it is: one that would start a formula gets a
    leading apostrophe."""
    return "'" + value if value[:1] in FORMULA_STARTS else value
