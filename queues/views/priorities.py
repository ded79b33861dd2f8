"""Priorities and caps (issue 24): a waiting job's priority, the same change over a batch's or
a whole collection's waiting jobs (previewed, then run as a bulk action of "priority" on each
job, so every job's change is audited), and a collection's cap on its jobs in flight.

The console's pages and the JSON API are both here; the API views answer under ``/api/`` with
the same checks as the rest of it (``queues.web.api.api_view``).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import re_path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from queues.console import job_reads, selectors
from queues.console.waits import CapFigure
from queues.core import clock
from queues.core.states import JOB_WORKING, JobState
from queues.core.words import VERSION_MOST
from queues.operator import actions, bulkrun
from queues.operator.auth import VIEWER, require_action
from queues.services import hold_moves, moves
from queues.web.api import bulk_run_json
from queues.web.api_door import api_view, form_input, request_body
from queues.web.forms import WholeNumberField, YesNoField, errors_text
from queues.web.routes import BID, HELD_PROFILE, JID, PROFILE
from queues.zk import caps as zcaps
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.errors import StillLoading
from queues.zk.jobs import DEFAULT_PRIORITY

from .common import (
    HtmxHttpRequest,
    act,
    console_view,
    error_response,
    only_fields,
    redirect_after_post,
    run_bulk,
)

# The priority and cap forms answer with a redirect to their item's page, whatever "render" or
# "next" say: no template posts them.
UNREAD = ("render", "next")

CAP_ACTION = r"(?P<action>cap|uncap|recount)"
PREVIEW_IDS = 50


class PriorityChangeForm(forms.Form):
    """A batch's or a collection's priority change, as the API takes it (with "preview"): no
    version, each job is checked as it is reached."""

    priority = WholeNumberField(min_value=0, max_value=99)
    reason = forms.CharField(required=False, max_length=2000)


class ScopedPriorityForm(PriorityChangeForm):
    """The console's: previewed, then confirmed by the preview's form."""

    # Posted by the preview's confirmation; any text but yes/no words is refused, never read as
    # yes (Django's BooleanField took "no" for yes and skipped the preview).
    confirmed = YesNoField(required=False)


class PriorityForm(PriorityChangeForm):
    """A job's priority change, checked against the version of the job the page showed."""

    version = WholeNumberField(required=False, min_value=0, max_value=VERSION_MOST)


class CapForm(forms.Form):
    limit = WholeNumberField(required=False, min_value=1, max_value=zcaps.LIMIT_MAX)
    reason = forms.CharField(required=False, max_length=2000)


def _form(form_class: type[forms.Form], data: Any) -> dict[str, Any]:
    form = form_class(data)
    if not form.is_valid():
        raise ValueError(errors_text(form))
    return form.cleaned_data


# Reads ------------------------------------------------------------------------------------------


def collection_rows() -> tuple[list[dict[str, Any]], bool]:
    """Every collection with jobs waiting or in flight, or with a cap: its waiting and in-flight
    jobs (from the read index, per folder change) and its cap; and whether the index is still
    filling."""
    zk = connected_client()
    index = zindex.for_client(zk)
    waiting: dict[str, int] = {}
    flying: dict[str, int] = {}
    for state in (JobState.PENDING, JobState.HELD):
        for profile, n in index.profile_counts_so_far(state).items():
            waiting[profile] = waiting.get(profile, 0) + n
    for state in JOB_WORKING:
        for profile, n in index.profile_counts_so_far(state).items():
            flying[profile] = flying.get(profile, 0) + n
    capped = zcaps.caps(zk)
    names = sorted((set(waiting) | set(flying) | set(capped)) - {""})
    rows = [
        {
            "profile": name,
            "waiting": waiting.get(name, 0),
            "in_flight": flying.get(name, 0),
            "cap": capped.get(name),
            "figure": _figure(capped.get(name), flying.get(name, 0)),
        }
        for name in names
    ]
    return rows, index.filling


def _figure(cap: zcaps.Cap | None, in_flight: int) -> CapFigure | None:
    """A cap in one figure: the collection's jobs in flight now (the read index's count, the
    one the pages show) against its limit (queues/console/waits.py)."""
    if cap is None:
        return None
    return CapFigure(
        profile=cap.profile,
        limit=cap.limit,
        in_flight=in_flight,
        by=cap.by,
        reason=cap.reason,
        since=cap.at,
    )


def _collection(profile: str) -> dict[str, Any]:
    zk = connected_client()
    index = zindex.for_client(zk)
    scope = hold_moves.priority_scope(kind="collection", name=profile)
    flying = sum(index.profile_counts_so_far(s).get(profile, 0) for s in JOB_WORKING)
    cap = zcaps.cap_of(zk, profile)
    return {
        "profile": profile,
        "scope": scope,
        "in_flight": flying,
        "cap": cap,
        "figure": _figure(cap, flying),
        "first": scope.jids[:PREVIEW_IDS],
    }


def _scope_json(scope: hold_moves.PriorityScope, priority: int | None) -> dict[str, Any]:
    return {
        "kind": scope.kind,
        "id": scope.name,
        "priority": priority,
        "jobs": len(scope.jids),
        "by_priority": {f"{p:02d}": n for p, n in sorted(scope.by_priority.items())},
        "first": scope.jids[:PREVIEW_IDS],
        "loading": scope.loading,
    }


def _cap_json(cap: zcaps.Cap | None, in_flight: int | None = None) -> dict[str, Any] | None:
    """A cap; with ``in_flight`` (the collection's jobs in flight from the read index) its one
    figure too: ``full`` and ``words`` from that count. ``counted`` is the cap's own count,
    which may stay above it for a moment after a job completes."""
    if cap is None:
        return None
    figure = _figure(cap, in_flight) if in_flight is not None else None
    return {
        "limit": cap.limit,
        "counted": cap.counted,
        "in_flight": in_flight,
        "words": figure.plain if figure else None,
        "full": figure.full if figure else cap.full,
        "by": cap.by,
        "reason": cap.reason,
        "since": clock.exact(cap.at) or None,
    }


# Console ----------------------------------------------------------------------------------------


@require_GET
@console_view(VIEWER)
def collections(request: HtmxHttpRequest) -> HttpResponse:
    rows, loading = collection_rows()
    return render(request, "queues/collections.html", {"rows": rows, "loading": loading})


@require_GET
@console_view(VIEWER)
def collection(request: HtmxHttpRequest, profile: str) -> HttpResponse:
    """A collection's page; 404 for one nobody knows (the rule of a note on one), as an empty
    page for any name was no answer."""
    data = _collection(zpaths.profile(profile))
    scope = data["scope"]
    # What the page shows names it already; while the read index still fills (a cold start)
    # the page says what it loads rather than wait to learn whether any job names it.
    filling = scope.loading or zindex.for_client(connected_client()).filling
    if not (scope.jids or data["in_flight"] or data["cap"] or filling):
        selectors.known_collection(data["profile"])
    return render(request, "queues/collection.html", {**data, "default_priority": DEFAULT_PRIORITY})


def _scoped_priority(request: HtmxHttpRequest, *, kind: str, name: str, back: str) -> HttpResponse:
    """A batch's or a collection's priority change: previewed (what would change, how many, from
    which priorities), then, once confirmed, "priority" on each waiting job (a bulk run over
    ``MRT_BULK_INLINE_MAX`` jobs), every job's change in the audit log."""
    require_action(request.user, "job", "priority")
    only_fields(request, ScopedPriorityForm)
    try:
        data = _form(ScopedPriorityForm, request.POST)
    except ValueError as exc:
        return error_response(request, f"bad priority: {exc}", 400)
    scope = hold_moves.priority_scope(kind=kind, name=name)
    if scope.loading and (data["confirmed"] or not scope.jids):
        raise StillLoading.about(f"the waiting jobs of {kind} {name}")
    if not scope.jids:
        if kind == "collection":
            selectors.known_collection(name)
        messages.info(request, f"{kind} {name} has no waiting job: nothing to change")
        return redirect_after_post(back)
    if not data["confirmed"]:
        return render(
            request,
            "queues/priority_confirm.html",
            {
                "scope": scope,
                "priority": data["priority"],
                "reason": data["reason"],
                "first": scope.jids[:PREVIEW_IDS],
                "by_priority": sorted(scope.by_priority.items()),
                "inline_max": settings.MRT_BULK_INLINE_MAX,
                "back": back,
            },
        )
    result = run_bulk(
        user=request.user,
        kind="job",
        action="priority",
        items=[(jid, None) for jid in scope.jids],
        reason=data["reason"],
        limited=False,  # the index has filled: every waiting job is listed
        back=back,
        params={"priority": data["priority"]},
    )
    if isinstance(result, bulkrun.BulkRun):
        messages.info(
            request,
            f"priority {data['priority']} for {len(scope.jids)} jobs of {kind} {name} started "
            "in the background",
        )
        return redirect_after_post(reverse("bulk-run", args=[result.pk]))
    messages.success(request, f"priority {data['priority']} for {kind} {name}: {result.summary()}")
    return redirect_after_post(back)


@require_POST
@console_view(VIEWER)
def collection_priority(request: HtmxHttpRequest, profile: str) -> HttpResponse:
    profile = zpaths.profile(profile)
    return _scoped_priority(
        request, kind="collection", name=profile, back=reverse("collection", args=[profile])
    )


@require_http_methods(["GET", "POST"])
@console_view(VIEWER)
def batch_priority(request: HtmxHttpRequest, bid: str) -> HttpResponse:
    bid = zpaths.bid(bid)
    if request.method == "GET":
        scope = hold_moves.priority_scope(kind="batch", name=bid)
        return render(
            request,
            "queues/priority_form.html",
            {"kind": "batch", "name": bid, "scope": scope, "default_priority": DEFAULT_PRIORITY},
        )
    return _scoped_priority(request, kind="batch", name=bid, back=reverse("batch", args=[bid]))


@require_http_methods(["GET", "POST"])
@console_view(VIEWER)
def job_priority(request: HtmxHttpRequest, jid: str) -> HttpResponse:
    jid = zpaths.jid(jid)
    if request.method == "GET":
        job = job_reads.job_one(jid=jid)
        return render(
            request,
            "queues/priority_form.html",
            {"kind": "job", "name": jid, "job": job, "default_priority": job.priority},
        )
    data = _form(PriorityForm, request.POST)
    act(
        request,
        kind="job",
        action="priority",
        item_id=jid,
        params=lambda _f: {"priority": data["priority"]},
        also=("priority",),
        unread=UNREAD,
    )
    return redirect_after_post(reverse("job", args=[jid]))


@require_POST
@console_view(VIEWER)
def collection_cap_action(request: HtmxHttpRequest, profile: str, action: str) -> HttpResponse:
    profile = zpaths.profile(profile)
    data = _form(CapForm, request.POST)
    if action == "cap" and data["limit"] is None:
        return error_response(request, "give the cap: how many jobs may be in flight at once", 400)
    act(
        request,
        kind="collection",
        action=action,
        item_id=profile,
        params=lambda _f: {"limit": data["limit"], "by": request.user.get_username()},
        also=("limit",),
        unread=UNREAD,
    )
    return redirect_after_post(reverse("collection", args=[profile]))


# API ----------------------------------------------------------------------------------------------


# What the API's priority endpoints do not read of PriorityForm: the page's confirmation (a
# script's request is its own), refused as any unknown key is rather than left out.
API_UNREAD = ("confirmed",)


def _outcomes(outcomes: list[moves.Outcome]) -> list[dict[str, str]]:
    return [
        {"kind": o.kind, "id": o.id, "before": o.before, "after": o.after, "detail": o.detail}
        for o in outcomes
    ]


@api_view("POST")
def api_job_priority(request: HttpRequest, jid: str) -> dict[str, Any]:
    """{"priority": 0..99, "version": ..., "reason": ...}: a waiting job's priority."""
    data = _form(
        PriorityForm,
        form_input(request_body(request), PriorityForm, unread=API_UNREAD, what="priority"),
    )
    outcomes = actions.perform(
        user=request.user,
        kind="job",
        action="priority",
        item_id=zpaths.jid(jid),
        expect_version=data["version"],
        reason=data["reason"],
        params={"priority": data["priority"]},
        via="api",
    )
    return {"outcomes": _outcomes(outcomes)}


def _api_scoped(request: HttpRequest, kind: str, name: str) -> dict[str, Any] | HttpResponse:
    body = request_body(request)
    # A batch's or a collection's jobs have a version each, which the change checks job by job:
    # the form has no version (nor the page's confirmed), so either is an unknown key.
    data = _form(
        PriorityChangeForm,
        form_input(body, PriorityChangeForm, also=("preview",), what=f"priority of a {kind}"),
    )
    preview = body.get("preview", False)
    if preview not in (True, False, "1", "0", "true", "false"):
        raise ValueError(f"preview must be true or false, not {str(preview)[:40]!r}")
    require_action(request.user, "job", "priority")
    scope = hold_moves.priority_scope(kind=kind, name=name)
    if kind == "collection" and not (scope.jids or scope.loading):
        selectors.known_collection(name)
    if preview in (True, "1", "true"):
        return {**_scope_json(scope, data["priority"]), "preview": True}
    if scope.loading:
        raise StillLoading.about(f"the waiting jobs of {kind} {name}")
    result = run_bulk(
        user=request.user,
        kind="job",
        action="priority",
        items=[(jid, None) for jid in scope.jids],
        reason=data["reason"],
        limited=False,
        via="api",
        params={"priority": data["priority"]},
    )
    if isinstance(result, bulkrun.BulkRun):
        response = JsonResponse(bulk_run_json(result), status=202)
        response["Location"] = reverse("api-bulk-run", args=[result.pk])
        return response
    return {
        **_scope_json(scope, data["priority"]),
        "outcomes": _outcomes(result.done),
        "skipped": [{"id": i, "reason": why} for i, why in result.skipped],
        "summary": result.summary(),
    }


@api_view("POST")
def api_batch_priority(request: HttpRequest, bid: str) -> dict[str, Any] | HttpResponse:
    """{"priority": 0..99, "reason": ..., "preview": true|false}: the batch's waiting jobs."""
    return _api_scoped(request, "batch", zpaths.bid(bid))


@api_view("POST")
def api_collection_priority(request: HttpRequest, profile: str) -> dict[str, Any] | HttpResponse:
    """{"priority": 0..99, "reason": ..., "preview": true|false}: the collection's waiting jobs."""
    return _api_scoped(request, "collection", zpaths.profile(profile))


@api_view("GET", index=True)
def api_caps(request: HttpRequest) -> dict[str, Any]:
    rows, _filling = collection_rows()  # ``loading``, what is still read, is added by api_view
    return {
        "collections": {
            r["profile"]: {
                "waiting": r["waiting"],
                "in_flight": r["in_flight"],
                "cap": _cap_json(r["cap"], r["in_flight"]),
            }
            for r in rows
        },
    }


@api_view("POST")
def api_collection_cap(request: HttpRequest, name: str, action: str) -> dict[str, Any]:
    """{"limit": N, "reason": ...} for ``cap``; nothing for ``uncap`` and ``recount``."""
    profile = zpaths.profile(name)
    unread = () if action == "cap" else ("limit",)  # uncap and recount take none
    data = _form(CapForm, form_input(request_body(request), CapForm, unread=unread, what=action))
    if action == "cap" and data["limit"] is None:
        raise ValueError("give the cap as limit: how many jobs may be in flight at once")
    outcomes = actions.perform(
        user=request.user,
        kind="collection",
        action=action,
        item_id=profile,
        reason=data["reason"],
        params={"limit": data["limit"], "by": request.user.get_username()},
        via="api",
    )
    return {
        "outcomes": _outcomes(outcomes),
        "cap": _cap_json(zcaps.cap_of(connected_client(), profile)),
    }


# Included under api/ by queues/urls.py (beside queues.web.api's own patterns).
api_urlpatterns = [
    re_path(r"^caps$", api_caps, name="api-caps"),
    re_path(rf"^jobs/{JID}/priority$", api_job_priority, name="api-job-priority"),
    re_path(rf"^batches/{BID}/priority$", api_batch_priority, name="api-batch-priority"),
    re_path(
        rf"^collections/{PROFILE}/priority$",
        api_collection_priority,
        name="api-collection-priority",
    ),
    re_path(
        rf"^holds/collection/{HELD_PROFILE}/{CAP_ACTION}$",
        api_collection_cap,
        name="api-collection-cap",
    ),
]
