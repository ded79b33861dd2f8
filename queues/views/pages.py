"""Read-only pages. Each parses its input, makes one selector call and renders."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues import archive, diagrams, history, selectors
from queues.audit import ApiToken, AuditEntry, earlier_failures
from queues.auth import ADMIN, VIEWER, has_role, may
from queues.forms import (
    AccessFilterForm,
    BatchFilterForm,
    FailedFilterForm,
    JobFilterForm,
    TokenForm,
)
from queues.models import BulkRun
from queues.states import ACCESS, BATCH, JOB
from queues.templatetags.console import actions_for
from queues.zk import paths as zpaths
from queues.zk.errors import NotFound, is_connection_error

from . import cockpit
from .common import HtmxHttpRequest, console_view, error_response, querystring_without

log = logging.getLogger("queues.views")


def _link(name: str, **query: str) -> str:
    return f"{reverse(name)}?{urlencode(query)}"


def _job_state_link(state: str) -> str | None:
    """The job list of a state, for a diagram's node (the filter offers every job state)."""
    return _link("jobs", state=state) if JOB.is_state(state) else None


def _bad_form(request: HtmxHttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    return render(request, template, context, status=400)


@require_GET
@console_view(VIEWER)
def overview(request: HtmxHttpRequest) -> HttpResponse:
    ov = selectors.overview()

    def summary(counts: dict[str, selectors.StateCount]) -> tuple[dict, dict]:
        return {s: c.count for s, c in counts.items()}, {
            s: c.oldest_seconds for s, c in counts.items()
        }

    job_counts, job_oldest = summary(ov.jobs)
    batch_counts, batch_oldest = summary(ov.batches)
    access_counts, access_oldest = summary(ov.access)
    context = {
        "ov": ov,
        "job_svg": diagrams.render(
            JOB,
            counts=job_counts,
            oldest=job_oldest,
            href=_job_state_link,
            title="Jobs by state",
            noun="job",
        ),
        "batch_svg": diagrams.render(
            BATCH,
            counts=batch_counts,
            oldest=batch_oldest,
            href=lambda s: _link("batches", state=s),
            title="Batches by state",
            noun="batch",
        ),
        "access_svg": diagrams.render(
            ACCESS,
            counts=access_counts,
            oldest=access_oldest,
            href=lambda s: _link("access", state=s),
            title="Access requests by state",
            noun="request",
        ),
        "unknown_batch_states": [s for s in ov.batches if not BATCH.is_state(s)],
        # Bulk runs not ended: going, or interrupted and waiting for someone to continue them.
        "bulk_open": list(_bulk_runs().filter(state=BulkRun.RUNNING)),
    }
    if request.htmx and request.htmx.target == "overview-live":
        return render(request, "queues/overview.html#overview-live", context)
    return render(request, "queues/overview.html", context)


@require_GET
@console_view(VIEWER)
def jobs(request: HtmxHttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET or None)
    context: dict[str, Any] = {"form": form, "states": JOB.states}
    if request.GET and not form.is_valid():
        return _bad_form(request, "queues/jobs.html", context)
    if form.is_bound and zpaths.JID_RE.fullmatch(form.cleaned_data["q"]):
        return redirect("job", jid=form.cleaned_data["q"])
    flt = form.to_filter() if form.is_bound else selectors.JobFilter()
    page = selectors.jobs_page(
        flt=flt, page=(form.cleaned_data.get("page") or 1) if form.is_bound else 1
    )
    context.update(
        {
            "flt": flt,
            "page": page,
            "query": querystring_without(request, "page"),
            "next": request.get_full_path(),
            "bulk_actions": _bulk_actions(request.user, flt.state),
            # Jobs archived out of ZooKeeper by retention: exact IDs, ARK, local ID.
            "archived": archive.archived_jobs_matching(flt.q or flt.bid),
        }
    )
    if request.htmx and request.htmx.target == "job-table":
        table = render(request, "queues/jobs.html#job-table", context)
        table.write(render_to_string("queues/_archived_jobs.html", {**context, "oob": True}))
        return table
    return render(request, "queues/jobs_archived.html", context)


def _bulk_actions(user: Any, state: str) -> list[str]:
    states = [state] if state else [s for s in JOB.states if s != "Deleted"]
    names: list[str] = []
    for s in states:
        for action in actions_for("job", s, user):
            if action["name"] not in names:
                names.append(action["name"])
    return names


def _step_records(jid: str) -> list[Any]:
    """The job's step records for its timeline; none when the database cannot say."""
    try:
        return history.item_steps(jid)
    except Exception as exc:  # no table yet, database away: the rest of the page still shows
        log.warning("step records of %s not read: %s", jid, exc)
        return []


def job_context(request: HtmxHttpRequest, jid: str) -> dict[str, Any]:
    """What the job page shows; also re-rendered in place after an htmx action on it."""
    detail = selectors.job_detail(jid=jid)
    svg = None
    audit = list(AuditEntry.objects.filter(item_id=jid)[:50])
    failures = earlier_failures(jid)
    path = detail.path
    if detail.job is not None:
        # Earlier failures (kept in the audit log) are visits to Failed on the path too.
        path = cockpit.path_with_failures(detail.job, detail.path, failures)
        svg = diagrams.render(
            JOB,
            current=detail.job.state,
            path=path,
            href=_job_state_link,
            title=f"Where {jid} is",
            id_prefix="jobpath",
            admin_from=detail.job.state,
        )
    return {
        "detail": detail,
        "j": detail.job,
        "svg": svg,
        "path": path,
        "audit": audit,
        "failures": failures,
        "timeline": (
            cockpit.timeline(detail.job, audit[::-1], _step_records(jid)) if detail.job else []
        ),
        "next": reverse("job", args=[jid]),
    }


@require_GET
@console_view(VIEWER)
def job(request: HtmxHttpRequest, jid: str) -> HttpResponse:
    try:
        context = job_context(request, jid)
    except NotFound:
        row = archive.archived_job(zpaths.jid(jid))
        if row is None:
            raise
        return render(request, "queues/archived_job.html", {"row": row})
    return render(request, "queues/job.html", context)


@require_GET
@console_view(VIEWER)
def batches(request: HtmxHttpRequest) -> HttpResponse:
    form = BatchFilterForm(request.GET or None)
    context: dict[str, Any] = {"form": form}
    if request.GET and not form.is_valid():
        return _bad_form(request, "queues/batches.html", context)
    if form.is_bound and zpaths.BID_RE.fullmatch(form.cleaned_data["q"].strip()):
        return redirect("batch", bid=form.cleaned_data["q"].strip())
    flt = form.to_filter() if form.is_bound else selectors.BatchFilter()
    number = (form.cleaned_data.get("page") or 1) if form.is_bound else 1
    context.update(
        {
            "page": selectors.batches_page(flt=flt, page=number),
            "query": querystring_without(request, "page"),
            "next": request.get_full_path(),
        }
    )
    if request.htmx and request.htmx.target == "batch-table":
        return render(request, "queues/batches.html#batch-table", context)
    return render(request, "queues/batches.html", context)


@require_GET
@console_view(VIEWER)
def batch(request: HtmxHttpRequest, bid: str) -> HttpResponse:
    try:
        detail = selectors.batch_detail(bid=bid)
    except NotFound:
        row = archive.archived_batch(zpaths.bid(bid))
        if row is None:
            raise
        jobs = archive.archived_batch_jobs(bid)
        return render(request, "queues/archived_batch.html", {"row": row, "jobs": jobs})
    context = {
        "detail": detail,
        "b": detail.batch,
        "svg": diagrams.render(
            JOB,
            counts=detail.counts,
            href=lambda s: _link("jobs", state=s, bid=bid),
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
        "bulk_actions": _bulk_actions(request.user, ""),
        "failed_count": len(detail.folders.get("batch-failed", [])),
        "mails": cockpit.batch_mails(bid),
    }
    return render(request, "queues/batch.html", context)


@require_GET
@console_view(VIEWER)
def failed(request: HtmxHttpRequest) -> HttpResponse:
    form = FailedFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return _bad_form(request, "queues/failed.html", {"form": form})
    data = form.cleaned_data if form.is_bound else {"bid": "", "profile": "", "step": ""}
    try:  # paging of the groups, and of the open group's rows (selectors.failed_jobs)
        group_page = max(1, int(request.GET.get("gpage") or 1))
        row_page = max(1, int(request.GET.get("rpage") or 1))
    except ValueError:
        return error_response(request, "gpage and rpage must be numbers", 400)
    group = request.GET.get("group", "batch")
    group = group if group in selectors.FAILED_GROUPINGS else "batch"
    view = selectors.failed_jobs(
        bid=data["bid"],
        profile=data["profile"],
        step=data["step"],
        group=group,
        group_page=group_page,
        open_group=request.GET.get("open", "")[:200],
        row_page=row_page,
    )
    filters = {k: v for k, v in data.items() if v}
    return render(
        request,
        "queues/failed.html",
        {
            "form": form,
            "view": view,
            "group": group,
            "filter_query": urlencode(filters),
            "group_query": urlencode({**filters, "group": group}),
            "filter_data": data,
            "next": request.get_full_path(),
        },
    )


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
        row.batch.bid: cockpit.failure_reasons(row.reports[0].failed_jobs)
        for row in page.items
        if row.reports and row.reports[0].failed_jobs
    }
    return render(request, "queues/reports.html", {"page": page, "reasons": reasons})


@require_GET
@console_view(VIEWER)
def holds(request: HtmxHttpRequest) -> HttpResponse:
    held = request.GET.get("held", "")
    just_held = held if zpaths.PROFILE_RE.fullmatch(held) else ""
    return render(request, "queues/holds.html", cockpit.holds_context(just_held=just_held))


@require_GET
@console_view(VIEWER)
def access(request: HtmxHttpRequest) -> HttpResponse:
    form = AccessFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return _bad_form(request, "queues/access.html", {"form": form, "items": []})
    data = form.cleaned_data if form.is_bound else {"queue": "", "state": ""}
    items = selectors.access_requests(queue=data["queue"], state=data["state"])
    return render(
        request,
        "queues/access.html",
        {"form": form, "items": items, "next": request.get_full_path()},
    )


@require_GET
@console_view(VIEWER)
def consistency(request: HtmxHttpRequest) -> HttpResponse:
    report = selectors.consistency_report()
    return render(
        request,
        "queues/consistency.html",
        {
            "report": report,
            "repairable": sum(1 for f in report.findings if f.repairable),
        },
    )


@require_GET
@console_view(VIEWER)
def audit(request: HtmxHttpRequest) -> HttpResponse:
    entries = AuditEntry.objects.all()
    filters = {}
    for field in ("username", "kind", "action", "item_id"):
        value = request.GET.get(field, "").strip()[:120]
        if value:
            entries = entries.filter(**{field: value})
            filters[field] = value
    if request.GET.get("ok") in ("0", "1"):
        entries = entries.filter(ok=request.GET["ok"] == "1")
        filters["ok"] = request.GET["ok"]
    page = Paginator(entries, 100).get_page(request.GET.get("page"))
    return render(
        request,
        "queues/audit.html",
        {"page": page, "filters": filters, "query": querystring_without(request, "page")},
    )


def _bulk_runs() -> Any:
    # Never the items (up to a filter's whole match): pages show counts only.
    return BulkRun.objects.select_related("user", "continued_by").defer("items")


@require_GET
@console_view(VIEWER)
def bulk_runs(request: HtmxHttpRequest) -> HttpResponse:
    runs = _bulk_runs()[:50]
    return render(
        request,
        "queues/bulk_runs.html",
        {"runs": runs, "inline_max": settings.MRT_BULK_INLINE_MAX},
    )


@require_GET
@console_view(VIEWER)
def bulk_run(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(_bulk_runs(), pk=pk)
    return render(
        request,
        "queues/bulk_run.html",
        {"run": run, "can_resume": may(request.user, run.kind, run.action)},
    )


@require_GET
@console_view(VIEWER)
def tokens(request: HtmxHttpRequest) -> HttpResponse:
    visible = (
        ApiToken.objects.all()
        if has_role(request.user, ADMIN)
        else ApiToken.objects.filter(user__username=request.user.get_username())
    )
    return render(
        request,
        "queues/tokens.html",
        {"tokens": visible.select_related("user"), "form": TokenForm()},
    )


@require_GET
def zk_health(request: HtmxHttpRequest) -> HttpResponse:
    """The banner fragment base.html polls: empty while ZooKeeper answers."""
    try:
        selectors.job_state_counts()
    except Exception as exc:
        if is_connection_error(exc):
            return render(request, "base.html#zk-banner", {"zk_down": True, "error": str(exc)})
        raise
    return render(request, "base.html#zk-banner", {"zk_down": False})
