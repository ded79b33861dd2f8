"""Holds: the holds page (queue and collection holds, why each queue was held, the held
batches and jobs) and holding or releasing a queue or a collection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from queues.console import batch_reads, job_reads, selectors, waits
from queues.core.states import JOB_WORKING, BatchState, JobState
from queues.daemons.registry import BESIDE_MERRITT, deployment_mode
from queues.operator import actions
from queues.operator.audit import AuditEntry
from queues.operator.auth import VIEWER, require_action
from queues.web.forms import (
    ActionForm,
    CollectionHoldForm,
    NodeFailuresForm,
    NodeHoldForm,
    ServiceHoldForm,
    errors_text,
)
from queues.zk import paths as zpaths

from .common import (
    HtmxHttpRequest,
    act,
    console_view,
    error_response,
    fragment,
    only_fields,
    redirect_after_post,
    report,
    safe_next,
)

# The holds page answers htmx with its panel whatever "render" says.
HOLD_UNREAD = ("render",)

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
    held_jobs = job_reads.jobs_page(
        flt=job_reads.JobFilter(state=JobState.HELD), per_page=HELD_SHOWN
    )
    held_batches = batch_reads.batches_page(
        flt=batch_reads.BatchFilter(state=BatchState.HELD), per_page=HELD_SHOWN
    )
    windows = {
        kind: {w.name: w for w in view.windows.values() if w.kind == kind}
        for kind in ("queue", "collection")
    }
    node_kept: dict[int, int] = {}
    if view.nodes:
        for wait in waits.waits(holds=view.details):
            if wait.hold is not None and wait.hold.kind == "node":
                number = int(wait.hold.name)
                node_kept[number] = node_kept.get(number, 0) + wait.jobs
    return {
        "view": view,
        "queue_windows": windows["queue"],
        "collection_windows": windows["collection"],
        "node_windows": {int(w.name): w for w in view.windows.values() if w.kind == "node"},
        "profiles": selectors.known_profiles(),
        "nodes": selectors.known_nodes(
            [*view.nodes, *(int(w.name) for w in view.windows.values() if w.kind == "node")]
        ),
        "queue_reasons": reasons,
        "node_kept": node_kept,
        "held_jobs": held_jobs,
        "held_batches": held_batches,
        "held_jobs_more": max(0, (held_jobs.total or 0) - len(held_jobs.items)),
        "held_batches_more": max(0, (held_batches.total or 0) - len(held_batches.items)),
        "just_held": just_held,
        "beside_merritt": deployment_mode() == BESIDE_MERRITT,
    }


def queue_hold_preview() -> dict[str, Any]:
    """What holding the ingest queue stops: the jobs waiting to start and those under way."""
    counts = selectors.job_state_counts(wait=False)
    waiting = counts.get(JobState.PENDING, 0)
    working = sum(n for s, n in counts.items() if s in JOB_WORKING)
    return {"waiting": waiting, "working": working, "counts": counts}


@require_GET
@console_view(VIEWER)
def holds(request: HtmxHttpRequest) -> HttpResponse:
    held = request.GET.get("held", "")
    just_held = held if zpaths.PROFILE_RE.fullmatch(held) else ""
    return render(request, "queues/holds.html", holds_context(just_held=just_held))


def _holds_response(
    request: HtmxHttpRequest, form: ActionForm | None = None, *, just_held: str = ""
) -> HttpResponse:
    if request.htmx:
        return fragment(
            request, "queues/holds.html#holds-panel", holds_context(just_held=just_held)
        )
    target = form.cleaned_data["next"] if form is not None else ""
    default = reverse("holds")
    if just_held:
        default += f"?held={just_held}"
    return redirect_after_post(safe_next(request, target, default))


@console_view(VIEWER)
def queue_hold_action(request: HtmxHttpRequest, name: str, action: str) -> HttpResponse:
    """Holding a whole queue is confirmed on a page that says what it stops, with a reason
    (kept in the audit log and shown on the holds page); releasing is one click."""
    if request.method == "GET":
        if action != "hold":
            return HttpResponseNotAllowed(["POST"])
        require_action(request.user, "queue", action)
        return render(
            request,
            "queues/queue_hold_confirm.html",
            {"name": name, **(queue_hold_preview() if name == "ingest" else {})},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    # The reason a hold needs is checked by actions.perform, for the API as well.
    form = act(
        request,
        kind="queue",
        action=action,
        item_id=name,
        params=lambda f: _params(request, f),
        unread=HOLD_UNREAD,
    )
    return _holds_response(request, form)


def _params(request: HtmxHttpRequest, form: ActionForm) -> dict[str, Any]:
    """A hold's or release's fields: release what it held, the window's end, who asks."""
    return {
        "release_jobs": form.cleaned_data["release_jobs"],
        "until": form.cleaned_data["until"],
        "by": request.user.get_username(),
    }


@require_POST
@console_view(VIEWER)
def collection_hold_action(request: HtmxHttpRequest, profile: str, action: str) -> HttpResponse:
    form = act(
        request,
        kind="collection",
        action=action,
        item_id=profile,
        params=lambda f: _params(request, f),
        unread=HOLD_UNREAD,
    )
    return _holds_response(request, form)


def _hold_typed(request: HtmxHttpRequest, form: Any, kind: str, field: str) -> str | None:
    """Hold what a form names (a collection's profile, a storage node's number, a service) with its
    reason and window's end; the item held, or None when the form is bad (answered by the
    caller). The post is the form's fields, no other (``only_fields``)."""
    only_fields(request, type(form))
    if not form.is_valid():
        return None
    item = form.cleaned_data[field]
    report(
        request,
        actions.perform(
            user=request.user,
            kind=kind,
            action="hold",
            item_id=item,
            reason=form.cleaned_data["reason"],
            params={"until": form.cleaned_data["until"], "by": request.user.get_username()},
        ),
    )
    return str(item)


@require_POST
@console_view(VIEWER)
def collection_hold_new(request: HtmxHttpRequest) -> HttpResponse:
    """The "hold a collection" form, where the profile is typed rather than in the URL."""
    form = CollectionHoldForm(request.POST)
    held = _hold_typed(request, form, "collection", "profile")
    if held is None:
        return error_response(request, f"cannot hold: {errors_text(form)}", 400)
    return _holds_response(request, just_held=held)


@require_POST
@console_view(VIEWER)
def node_hold_new(request: HtmxHttpRequest) -> HttpResponse:
    """Hold a storage node (typed in the form), with a reason and perhaps an end."""
    form = NodeHoldForm(request.POST)
    if _hold_typed(request, form, "node", "node") is None:
        return error_response(request, f"cannot hold: {errors_text(form)}", 400)
    return _holds_response(request)


@require_POST
@console_view(VIEWER)
def node_hold_action(request: HtmxHttpRequest, node: str, action: str) -> HttpResponse:
    form = act(
        request,
        kind="node",
        action=action,
        item_id=node,
        params=lambda f: _params(request, f),
        unread=HOLD_UNREAD,
    )
    return _holds_response(request, form)


@require_POST
@console_view(VIEWER)
def service_hold_new(request: HtmxHttpRequest) -> HttpResponse:
    """Hold a service outside by hand (open its breaker), with a reason; an end is refused (a
    service's hold is released by hand), as by its URL form and the API."""
    form = ServiceHoldForm(request.POST)
    if _hold_typed(request, form, "service", "service") is None:
        return error_response(request, f"cannot hold: {errors_text(form)}", 400)
    return _holds_response(request)


@require_POST
@console_view(VIEWER)
def service_hold_action(request: HtmxHttpRequest, service: str, action: str) -> HttpResponse:
    form = act(
        request,
        kind="service",
        action=action,
        item_id=service,
        # The same fields as every other hold's, as the API gives them: a service's hold refuses
        # an end rather than leave it out (it is released by hand).
        params=lambda f: _params(request, f),
        unread=HOLD_UNREAD,
    )
    return _holds_response(request, form)


@require_GET
@console_view(VIEWER)
def node_failed(request: HtmxHttpRequest) -> HttpResponse:
    """After a storage-node outage: the jobs bound for a node that failed in Storing or
    Recording within a time window, as the preview of resuming them all (one bulk run,
    audited, each job checked again as it is resumed)."""
    now = timezone.now()
    initial = {"since": now - timedelta(hours=24), "before": now}
    form = NodeFailuresForm(request.GET or None, initial=initial)
    context: dict[str, Any] = {"form": form, "jobs": None}
    if request.GET:
        if not form.is_valid():
            return error_response(request, f"cannot look: {errors_text(form)}", 400)
        jobs, more = selectors.node_failures(**form.cleaned_data)
        context.update(jobs=jobs, more=more, limit=selectors.NODE_FAILURES_MAX, **form.cleaned_data)
    return render(request, "queues/node_failed.html", context)
