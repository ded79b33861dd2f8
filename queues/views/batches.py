"""Batches: the batch list, a batch's page (its jobs by state, its own state, the summary mails
sent about it), the actions on one batch and the submission form, which makes a batch.

Bulk batch actions are in ``bulk.py``; a batch's status report export in ``reports.py``.
"""

from __future__ import annotations

import email
from dataclasses import dataclass
from datetime import datetime
from email.header import decode_header, make_header
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from queues.console import batch_reads, diagrams, selectors
from queues.core.states import BATCH, JOB
from queues.operator import actions, archive
from queues.operator.audit import AuditEntry
from queues.operator.auth import VIEWER, require_action
from queues.web.forms import BatchFilterForm, SubmitForm
from queues.zk import paths as zpaths

from .common import (
    GONE,
    HtmxHttpRequest,
    act,
    bad_form,
    batch_or_archived,
    bulk_actions,
    confirm,
    console_view,
    fragment,
    link,
    querystring_without,
    redirect_after_post,
    report,
    safe_next,
)


@require_GET
@console_view(VIEWER)
def batches(request: HtmxHttpRequest) -> HttpResponse:
    form = BatchFilterForm(request.GET or None)
    context: dict[str, Any] = {"form": form}
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/batches.html", context)
    if form.is_bound and zpaths.BID_RE.fullmatch(form.cleaned_data["q"].strip()):
        return redirect("batch", bid=form.cleaned_data["q"].strip())
    flt = form.to_filter() if form.is_bound else batch_reads.BatchFilter()
    number = (form.cleaned_data.get("page") or 1) if form.is_bound else 1
    context.update(
        {
            "page": batch_reads.batches_page(flt=flt, page=number),
            "query": querystring_without(request, "page"),
            "next": request.get_full_path(),
        }
    )
    if request.htmx and request.htmx.target == "batch-table":
        return render(request, "queues/batches.html#batch-table", context)
    return render(request, "queues/batches.html", context)


# Job rows a batch's page shows per state: the page costs what one page shows, whatever the
# batch's size (only those rows' jobs are loaded; the counts come from the read index); each
# state links to the job list for the rest.
BATCH_ROWS_PER_STATE = batch_reads.BATCH_ROWS_PER_STATE


@require_GET
@console_view(VIEWER)
def batch(request: HtmxHttpRequest, bid: str) -> HttpResponse:
    detail, archived = batch_or_archived(bid)
    if detail is None:
        jobs = archive.archived_batch_jobs(bid)
        return render(request, "queues/archived_batch.html", {"row": archived, "jobs": jobs})
    context = {
        "detail": detail,
        "b": detail.batch,
        "svg": diagrams.render(
            JOB,
            counts={s: n for s, n in detail.counts.items() if JOB.is_state(s)},
            href=lambda s: link("jobs", state=s, bid=bid),
            title=f"Jobs of {bid} by state",
            noun="job",
            id_prefix=f"batch-{bid}",
        ),
        "batch_svg": diagrams.render(
            BATCH, current=detail.batch.state, title=f"{bid} itself", id_prefix="batchstate"
        ),
        "audit": AuditEntry.objects.filter(item_id=bid)[:50],
        "next": request.get_full_path(),
        # The job rows' checkboxes belong to this page's own bulk form (issue 15).
        "bulk_actions": bulk_actions(request.user, ""),
        "failed_count": detail.folders.get("batch-failed", 0),
        "sections": [
            (state, jobs[:BATCH_ROWS_PER_STATE], max(detail.counts.get(state, 0), len(jobs)))
            for state, jobs in detail.by_state.items()
        ],
        "mails": batch_mails(bid),
    }
    return render(request, "queues/batch.html", context)


@console_view(VIEWER)
def batch_action(request: HtmxHttpRequest, bid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("batch", action):
            return HttpResponseNotAllowed(["POST"])
        batch, folders = batch_reads.batch_preview(bid=bid)
        jids = sorted({j for v in folders.values() for j in v})
        return confirm(
            request,
            kind="batch",
            action=action,
            item_id=bid,
            preview={"batch": batch, "folders": folders, "jids": jids[:200], "njobs": len(jids)},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = act(request, kind="batch", action=action, item_id=bid)
    if request.htmx and form.cleaned_data["render"] == "row":
        if action in GONE:
            return fragment(request, "queues/batches.html#batch-gone", {"bid": bid})
        return fragment(
            request,
            "queues/batches.html#batch-row",
            {"row": batch_reads.batch_one(bid=bid), "next": form.cleaned_data["next"]},
        )
    default = reverse("batches") if action in GONE else reverse("batch", args=[bid])
    return redirect_after_post(safe_next(request, form.cleaned_data["next"], default))


@require_http_methods(["GET", "POST"])
@console_view(VIEWER)
def submit(request: HtmxHttpRequest) -> HttpResponse:
    """The submission form (GET) and the submission (POST), which makes a batch. Who may not
    submit is refused the form as well (a viewer got the form, then a 403 for filling it in)."""
    require_action(request.user, "batch", "submit")
    if request.method == "GET":
        return render(
            request,
            "queues/submit.html",
            {"form": SubmitForm(), "profiles": selectors.known_profiles()},
        )
    form = SubmitForm(request.POST)
    if not form.is_valid():
        return render(
            request,
            "queues/submit.html",
            {"form": form, "profiles": selectors.known_profiles()},
            status=400,
        )
    outcomes = actions.perform(
        user=request.user,
        kind="batch",
        action="submit",
        item_id="",
        params=form.cleaned_data,
    )
    report(request, outcomes)
    made = outcomes[0].id
    if zpaths.BID_RE.fullmatch(made):
        return redirect_after_post(reverse("batch", args=[made]))
    # Sent to Merritt's ingest, which has not written its batch yet: its list finds it later.
    return redirect_after_post(f"{reverse('batches')}?{urlencode({'q': made})}")


# A batch's summary mails ----------------------------------------------------------------------

MAIL_FILES_READ = 500  # newest mail files looked at
MAIL_SHOWN = 10


@dataclass(frozen=True)
class SentMail:
    subject: str
    to: str
    date: datetime | str  # the Date header read as a time (shown as every time is), else as sent
    body: str
    file: str


def _header(value: str | None) -> str:
    if not value:
        return ""
    try:
        return str(make_header(decode_header(value)))
    except (ValueError, LookupError):
        return value


def _mail_date(header: str) -> datetime | str:
    """A mail's Date header as a time (``Wed, 25 Nov 2026 10:04:40 -0800``), for the page's
    one clock; the header as it is when it is no date."""
    try:
        return parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return header


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
                    date=_mail_date(_header(message.get("Date"))),
                    body=_body(message),
                    file=path.name,
                )
            )
        if len(found) >= MAIL_SHOWN:
            break
    return found[:MAIL_SHOWN]
