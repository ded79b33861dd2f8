"""The operator's cockpit (issue 15): header search, a job's story (earlier failures, its path
with failed visits, its timeline), a batch's summary mails and a batch report's export.

Nothing here writes: the history comes from what already exists (the status node, the audit
log, the mail files), never from a store of its own.
"""

from __future__ import annotations

import csv
import email
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from email.header import decode_header, make_header
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues import selectors
from queues.audit import AuditEntry, EarlierFailure, failure_of
from queues.auth import VIEWER
from queues.history import fmt_seconds
from queues.states import JOB_STEPS
from queues.zk import paths as zpaths
from queues.zk.jobs import jobs_load
from queues.zk.records import Job

from .common import console_view, error_response

# Search ---------------------------------------------------------------------------------------

UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@require_GET
@console_view(VIEWER)
def search(request: HttpRequest) -> HttpResponse:
    """The header's search box: an exact job or batch ID goes straight to its page, a batch
    UUID to the batch list's lookup, anything else to the job list's search (ARK, local ID)."""
    q = request.GET.get("q", "").strip()[:300]
    if not q:
        return redirect("jobs")
    if zpaths.JID_RE.fullmatch(q):
        return redirect("job", jid=q)
    if zpaths.BID_RE.fullmatch(q):
        return redirect("batch", bid=q)
    if q.startswith("bid-") or UUID_RE.fullmatch(q):  # a batch's external ID (Merritt's)
        return redirect(f"{reverse('batches')}?{urlencode({'q': q})}")
    return redirect(f"{reverse('jobs')}?{urlencode({'q': q})}")


# A job's story --------------------------------------------------------------------------------


def path_with_failures(job: Job, current_path: list[str], failures: list[EarlierFailure]) -> list:
    """The states the job went through: each earlier failure as a visit to Failed after the
    step it failed in, then on from where the resume restarted it, up to where it is now."""
    if not failures or job.state not in (*JOB_STEPS, "Failed"):
        return current_path
    path: list[str] = []
    start = 0
    for failure in failures:
        if failure.step in JOB_STEPS:
            end = JOB_STEPS.index(failure.step)
            path += list(JOB_STEPS[start : end + 1]) if end >= start else [failure.step]
        path.append("Failed")
        target = failure.resumed_to or failure.step
        start = JOB_STEPS.index(target) if target in JOB_STEPS else 0
    restart = JOB_STEPS[start]
    tail = current_path[current_path.index(restart) :] if restart in current_path else current_path
    return path + tail


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime
    what: str
    who: str = ""
    reason: str = ""
    detail: str = ""
    ok: bool = True
    kind: str = "state"  # "state", "action", "refused"
    sort_at: datetime | None = None  # where it goes in the order, when not ``at``


def timeline(job: Job, entries: list[AuditEntry], steps: Sequence[Any] = ()) -> list[TimelineEvent]:
    """Every time we know of in the job's life, oldest first: its creation, each step a
    consumer ran (the step history: start, duration, host, outcome), each operator action from
    the audit log (with actor and reason) and the last change of its status."""
    events = [TimelineEvent(job.created, "Created (Pending)", kind="state")]
    for step in steps:
        took = fmt_seconds(step.duration)
        events.append(
            TimelineEvent(
                step.started,
                f"{step.step} in {step.state}: {step.outcome}, {took}",
                who=step.host,
                detail=step.detail,
                ok=step.outcome != "failed",
                kind="step" if step.outcome != "failed" else "refused",
            )
        )
    for entry in entries:
        failure = failure_of(entry)
        if entry.before or entry.after:
            what = f"{entry.action}: {entry.before or '?'} → {entry.after or '?'}"
        else:
            what = entry.action
        events.append(
            TimelineEvent(
                entry.at,
                what if entry.ok else f"{entry.action} refused",
                who=entry.username or "(unknown)",
                reason=entry.reason,
                detail=(
                    f"was Failed in {failure.step}: {failure.message}" if failure else entry.detail
                ),
                ok=entry.ok,
                kind="action" if entry.ok else "refused",
            )
        )
    # The status node's own modification time: to the millisecond, where last_modified in it
    # is to the second (and would sort before the audit entry of the move that wrote it).
    last = job.status.mtime or job.status.last_modified
    if last is not None:
        # The operator's move into the current state is written to ZooKeeper a moment before
        # its audit entry: the state it entered is listed after it.
        entered = [
            e.at
            for e in entries
            if e.ok and e.after == job.state and abs((e.at - last).total_seconds()) < 5
        ]
        text = f"Entered {job.state} (status last modified)"
        events.append(
            TimelineEvent(
                last,
                text,
                detail=job.status.message,
                kind="state",
                sort_at=max([last, *entered]),
            )
        )
    return sorted(events, key=lambda e: e.sort_at or e.at)


# A batch's summary mails ----------------------------------------------------------------------

MAIL_FILES_READ = 500  # newest mail files looked at
MAIL_SHOWN = 10


@dataclass(frozen=True)
class SentMail:
    subject: str
    to: str
    date: str
    body: str
    file: str


def _header(value: str | None) -> str:
    if not value:
        return ""
    try:
        return str(make_header(decode_header(value)))
    except (ValueError, LookupError):
        return value


def _body(message: email.message.Message) -> str:
    part = message
    if message.is_multipart():
        part = next((p for p in message.walk() if p.get_content_type() == "text/plain"), message)
    payload = part.get_payload(decode=True)
    if isinstance(payload, bytes):
        return payload.decode(part.get_content_charset() or "utf-8", "replace")
    return str(part.get_payload())


def batch_mails(bid: str) -> list[SentMail]:
    """The mails about ``bid`` the file mail backend wrote (newest first); none with SMTP.

    Django's file backend appends each message to a ``*.log`` file, separated by a line of 79
    dashes; the notify step's subjects read ``Merritt batch <bid> ...``."""
    folder = getattr(settings, "EMAIL_FILE_PATH", None)
    if not folder or "filebased" not in getattr(settings, "EMAIL_BACKEND", ""):
        return []
    root = Path(folder)
    try:
        files = sorted(root.glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    marker = f"batch {bid} "
    found: list[SentMail] = []
    for path in files[:MAIL_FILES_READ]:
        try:
            text = path.read_text("utf-8", "replace")
        except OSError:
            continue
        if bid not in text:
            continue
        for chunk in text.split("\n" + "-" * 79 + "\n"):
            if not chunk.strip():
                continue
            message = email.message_from_string(chunk.lstrip("\n"))
            subject = _header(message.get("Subject"))
            if marker not in f"{subject} ":
                continue
            found.append(
                SentMail(
                    subject=subject,
                    to=_header(message.get("To")),
                    date=_header(message.get("Date")),
                    body=_body(message),
                    file=path.name,
                )
            )
        if len(found) >= MAIL_SHOWN:
            break
    return found[:MAIL_SHOWN]


# Reports --------------------------------------------------------------------------------------


REASON_JOBS_READ = 500  # failed jobs of one report whose message is read


def failure_reasons(jids: list[str]) -> list[tuple[str, list[str]]]:
    """A report's failed jobs grouped by the message their status holds now, the commonest
    first: (message, job IDs). A job resumed since is grouped by where it is now."""
    groups: dict[str, list[str]] = {}
    zk = selectors.zk_client()
    for start in range(0, min(len(jids), REASON_JOBS_READ), 100):
        for item in jobs_load(zk, jids[start : min(start + 100, REASON_JOBS_READ)]):
            if not isinstance(item, Job):
                groups.setdefault("(unreadable job)", []).append(item.id)
            elif item.state == "Failed":
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
    messages = {j.jid: j.status.message for j in detail.by_state.get("Failed", [])}
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
def report_export(request: HttpRequest, bid: str, fmt: str) -> HttpResponse:
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


# Holds ----------------------------------------------------------------------------------------

HELD_SHOWN = 10


def holds_context(*, just_held: str = "") -> dict[str, Any]:
    """What the holds page shows: the holds, why each queue was held (its audit entry), and the
    held batches and jobs themselves (counted, the first few linked, the rest one link away)."""
    view = selectors.holds_view()
    reasons: dict[str, AuditEntry] = {}
    for name, since in view.holds.queues.items():
        if since:
            entry = (
                AuditEntry.objects.filter(kind="queue", action="hold", item_id=name, ok=True)
                .order_by("-at", "-id")
                .first()
            )
            if entry is not None:
                reasons[name] = entry
    held_jobs = selectors.jobs_page(flt=selectors.JobFilter(state="Held"), per_page=HELD_SHOWN)
    held_batches = selectors.batches_page(
        flt=selectors.BatchFilter(state="Held"), per_page=HELD_SHOWN
    )
    return {
        "view": view,
        "profiles": selectors.known_profiles(),
        "queue_reasons": reasons,
        "held_jobs": held_jobs,
        "held_batches": held_batches,
        "held_jobs_more": max(0, (held_jobs.total or 0) - len(held_jobs.items)),
        "held_batches_more": max(0, (held_batches.total or 0) - len(held_batches.items)),
        "just_held": just_held,
    }


def queue_hold_preview() -> dict[str, Any]:
    """What holding the ingest queue stops: the jobs waiting to start and those under way."""
    counts = selectors.job_state_counts()
    waiting = counts.get("Pending", 0)
    working = sum(n for s, n in counts.items() if s in JOB_STEPS and s != "Pending")
    return {"waiting": waiting, "working": working, "counts": counts}
