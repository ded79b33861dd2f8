"""Bulk actions and bulk runs: one action over many jobs or batches (the ticked rows, or every
item a filter matches), previewed and confirmed when destructive or filter-wide, run at once
or, over ``MRT_BULK_INLINE_MAX`` items, as a background bulk run with its own pages and
stop/continue buttons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.forms import Form
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from queues.console import batch_reads, failed_reads, failure_causes, job_reads
from queues.operator import actions, bulkrun
from queues.operator.auth import VIEWER, may, require_action
from queues.services import moves
from queues.web.forms import BulkForm, FailedFilterForm, JobFilterForm, errors_text
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.errors import DomainError
from queues.zk.records import Job

from .common import (
    HtmxHttpRequest,
    console_view,
    error_response,
    only_fields,
    redirect_after_post,
    resume_params,
    run_bulk,
    safe_next,
    shown_bulk_runs,
    unknown_fields,
)

Items = list[tuple[str, int | None]]  # (item ID, the status version seen, if any)

PREVIEW_ROWS = 10


def _preview_rows(kind: str, items: Items) -> list[Any]:
    """The first items as they are now, for the confirmation's table."""
    rows: list[Any] = []
    for item_id, _version in items:
        try:
            rows.append(
                job_reads.job_one(jid=item_id)
                if kind == "job"
                else batch_reads.batch_one(bid=item_id)
            )
        except DomainError as exc:
            rows.append({"id": item_id, "problem": str(exc)})
    return rows


def _preview_states(kind: str, items: Items) -> dict[str, int]:
    """How many of the items are in each state now (jobs, from the read index)."""
    if kind != "job":
        return {}
    where = zindex.for_client(connected_client()).job_states_of(i for i, _v in items)
    counts: dict[str, int] = {}
    for item_id, _v in items:
        state = where.get(item_id, "not listed")
        counts[state] = counts.get(state, 0) + 1
    return counts


def _resume_plan(rows: list[Any], to: str) -> list[tuple[str, str, bool]]:
    """For the preview of a resume from ``to``: each previewed job, where it would restart, and
    whether it can (a job that failed before ``to`` would skip steps, and is skipped)."""
    if not to:
        return []
    plan: list[tuple[str, str, bool]] = []
    for row in rows:
        if not isinstance(row, Job):
            continue
        try:
            steps = moves.job_resume_steps(row)
        except DomainError as exc:
            plan.append((row.jid, str(exc), False))
            continue
        if to in steps:
            plan.append((row.jid, f"restarts at {to}", True))
        else:
            plan.append((row.jid, f"skipped: it may resume at {', '.join(steps)}", False))
    return plan


# What a bulk form posts beside its BulkForm and filter fields; "all" says in words that a filter
# narrowing nothing means every item (the preview of such a filter posts it back, nothing else).
BULK_POST_KEYS = ("csrfmiddlewaretoken", "next", "all")


def _unknown_fields(
    request: HtmxHttpRequest, *forms: type[Form], also: tuple[str, ...] = ()
) -> str:
    """The posted field names no form of the door (nor ``also``) takes, as a refusal's words
    ("" when none): a misspelt filter field would otherwise widen the filter unseen."""
    return unknown_fields(request.POST, *forms, also=(*BULK_POST_KEYS, *also))


def _bulk(
    request: HtmxHttpRequest,
    *,
    kind: str,
    matching: Callable[[], tuple[Items, bool]],
    id_validator: Callable[[str], str],
    back: str,
    everything: bool = False,
) -> HttpResponse:
    """Shared by the job, failed-job and batch bulk forms: preview, then run and report.
    ``everything``: the filter narrows nothing, so "every match" is every item; it is previewed
    saying so, and run only when the post says ``all`` (which that preview posts)."""
    form = BulkForm(request.POST, id_validator=id_validator)
    if not form.is_valid():
        return error_response(request, f"bad bulk request: {errors_text(form)}", 400)
    action = form.cleaned_data["action"]
    require_action(request.user, kind, action)
    scope = form.cleaned_data["scope"]
    everything = everything and scope == "filter"
    if everything and form.cleaned_data["confirmed"] and request.POST.get("all") != "1":
        return error_response(
            request,
            f"the filter narrows nothing: {action} of every {kind} is asked for with all=1",
            400,
        )
    limited = False
    if scope == "filter":
        items, limited = matching()
    else:
        items = form.cleaned_data["item"]
    if not items and scope == "filter":
        raise actions.NothingMatches(kind)
    if not items:
        return error_response(request, "nothing selected", 400)
    destructive = actions.is_destructive(kind, action)
    params = resume_params(kind, action, form.cleaned_data["to"])
    # A destructive action, any action over a whole filter (whose extent the operator has not
    # seen item by item) and a resume that repeats steps are previewed and confirmed first.
    if (destructive or form.cleaned_data["scope"] == "filter" or params) and not form.cleaned_data[
        "confirmed"
    ]:
        rows = _preview_rows(kind, items[:PREVIEW_ROWS])
        return render(
            request,
            "queues/bulk_confirm.html",
            {
                "kind": kind,
                "action": action,
                "items": items,
                "preview": items[:200],
                "rows": rows,
                "resume_to": params.get("to", ""),
                "resume_plan": _resume_plan(rows, params.get("to", "")),
                "states": _preview_states(kind, items),
                "destructive": destructive,
                "scope": form.cleaned_data["scope"],
                "everything": everything,
                "limited": limited,
                "post": request.POST,
                "back": back,
            },
        )
    result = run_bulk(
        user=request.user,
        kind=kind,
        action=action,
        items=items,
        reason=form.cleaned_data["reason"],
        limited=limited,
        back=back,
        params=params or None,
    )
    if isinstance(result, bulkrun.BulkRun):
        messages.info(request, f"{action} of {len(items)} {kind}s started in the background")
        return redirect_after_post(reverse("bulk-run", args=[result.pk]))
    # The page says the result once (no flash repeating it), each item linked, and offers the
    # skips that may pass now again.
    return render(
        request,
        "queues/bulk_result.html",
        {
            "kind": kind,
            "action": action,
            "result": result,
            "limited": limited,
            "back": back,
            "total": len(items),
            "retry": retry_of(kind, action, result.skipped, form.cleaned_data["reason"], params),
        },
    )


# Skips worth a second try: the item was locked by a consumer ("... try again", as queues.zk's
# refusals say) or had changed since the page was drawn (the state machine checks it again);
# a wrong state or a missing item is not.
RETRY_WORDS = ("try again", "changed since")
BULK_DOORS = {"job": "jobs-bulk", "batch": "batches-bulk"}


def retry_of(
    kind: str,
    action: str,
    skipped: Any,
    reason: str,
    params: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The form that tries the skipped items that may pass now once more (through the kind's
    bulk door: previewed again when the action is destructive); None when there are none."""
    door = BULK_DOORS.get(kind)
    ids = [str(i) for i, why in skipped or [] if any(w in str(why) for w in RETRY_WORDS)]
    if door is None or not ids:
        return None
    return {
        "url": reverse(door),
        "action": action,
        "ids": ids,
        "reason": reason,
        "to": (params or {}).get("to", ""),
        "confirm": actions.is_destructive(kind, action) or bool((params or {}).get("to")),
    }


def _job_bulk(
    request: HtmxHttpRequest,
    filter_form: JobFilterForm | FailedFilterForm,
    match: Callable[[Any], tuple[list[str], bool]],
    back: str,
    *,
    also: tuple[str, ...] = (),
    narrowed: bool = False,
) -> HttpResponse:
    """A job bulk form: its fields (a closed set: the bulk form's, the filter's and ``also``)
    and its filter (for "every match") checked first, then ``_bulk``; ``narrowed``: the door
    narrows the match itself (a cause's jobs), whatever the filter says."""
    unknown = _unknown_fields(request, BulkForm, type(filter_form), also=also)
    if unknown:
        return error_response(request, f"bad bulk request: unknown field {unknown}", 400)
    if not filter_form.is_valid():
        return error_response(request, f"bad filter: {errors_text(filter_form)}", 400)
    narrows = narrowed or filter_form.narrows()

    def matching() -> tuple[Items, bool]:
        jids, limited = match(filter_form)
        return [(j, None) for j in jids], limited

    return _bulk(
        request,
        kind="job",
        matching=matching,
        id_validator=zpaths.jid,
        back=safe_next(request, request.POST.get("next"), reverse(back)),
        everything=not narrows,
    )


@require_POST
@console_view(VIEWER)
def jobs_bulk(request: HtmxHttpRequest) -> HttpResponse:
    return _job_bulk(
        request,
        JobFilterForm(request.POST),
        lambda form: job_reads.jobs_matching(flt=form.to_filter()),
        "jobs",
    )


@require_POST
@console_view(VIEWER)
def failed_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Resume (or delete) failed jobs: the ticked ones or every one the failed filter matches
    (from the read index, no job loaded; each action checks the job's state)."""
    return _job_bulk(
        request,
        FailedFilterForm(request.POST),
        lambda form: (failed_reads.failed_matching(**form.cleaned_data), False),
        "failed",
    )


@require_POST
@console_view(VIEWER)
def failed_cause_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Resume (or delete) one cause's Failed jobs (``failure_causes``): posted with scope
    "filter" and the group's key, so they are previewed as they are now, then acted on."""
    key = request.POST.get("cause", "")
    if not failure_causes.KEY_RE.fullmatch(key):
        return error_response(request, "cause must be a group's key", 400)
    return _job_bulk(
        request,
        FailedFilterForm(request.POST),
        # None left (all resumed meanwhile): "nothing matches this filter" (409).
        lambda form: (failure_causes.failure_causes(**form.cleaned_data).jids(key), False),
        "failed-causes",
        also=("cause",),
        narrowed=True,
    )


@require_POST
@console_view(VIEWER)
def batches_bulk(request: HtmxHttpRequest) -> HttpResponse:
    unknown = _unknown_fields(request, BulkForm)
    if unknown:
        return error_response(request, f"bad bulk request: unknown field {unknown}", 400)

    def matching() -> tuple[Items, bool]:
        raise ValueError("batch bulk actions work on a selection")

    return _bulk(
        request,
        kind="batch",
        matching=matching,
        id_validator=zpaths.bid,
        back=safe_next(request, request.POST.get("next"), reverse("batches")),
    )


# Bulk runs (in the background) ------------------------------------------------------------------


@require_GET
@console_view(VIEWER)
def bulk_runs(request: HtmxHttpRequest) -> HttpResponse:
    return render(
        request,
        "queues/bulk_runs.html",
        {"runs": shown_bulk_runs()[:50], "inline_max": settings.MRT_BULK_INLINE_MAX},
    )


@require_GET
@console_view(VIEWER)
def bulk_run(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(shown_bulk_runs(), pk=pk)
    ended = run.state != "running" or run.interrupted
    return render(
        request,
        "queues/bulk_run.html",
        {
            "run": run,
            "can_resume": may(request.user, run.kind, run.action),
            "retry": retry_of(run.kind, run.action, run.skipped, run.reason, run.params)
            if ended
            else None,
        },
    )


@require_POST
@console_view(VIEWER)
def bulk_run_control(request: HtmxHttpRequest, pk: int, verb: str) -> HttpResponse:
    only_fields(request)
    run = get_object_or_404(bulkrun.BulkRun.objects.defer("items"), pk=pk)
    if bulkrun.control(run, verb, user=request.user):
        done = "stopping after the item in hand" if verb == "stop" else "continues"
        messages.info(request, f"{run.action} of {run.total} {run.kind}s: {done}")
    else:
        messages.info(request, f"nothing to {verb}: the run is {run.shown_state}")
    return redirect_after_post(reverse("bulk-run", args=[run.pk]))
