"""Failed jobs grouped by cause (``queues.console.failure_causes``): a page of groups with their
signature, count, batches, collections, first and last failure and a sample message, and the
group's actions. Resume and delete post to ``bulk.failed_cause_bulk`` (previewed and confirmed
by the bulk code, with the group's jobs as the filter's match); holding a collection is the
holds page's own action."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues.console import failure_causes
from queues.operator.auth import VIEWER
from queues.web.forms import FailedFilterForm, whole_number
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.maintenance import node_holds
from queues.zk.nodes import children

from .common import HtmxHttpRequest, bad_form, console_view, error_response

COLLECTIONS_SHOWN = 10  # collections with a hold button per group; the rest are counted
BATCHES_SHOWN = 5


def held_nodes() -> dict[int, Any]:
    """Every storage node held now, by its number."""
    return dict(node_holds(connected_client()))


def held_collections(profiles: set[str]) -> set[str]:
    """Which of ``profiles`` are held now: one listing of the collection holds, however many
    collections the page shows (a call per collection grew with the failed jobs' spread)."""
    if not profiles:
        return set()
    return profiles & set(children(connected_client(), zpaths.COLLECTION_LOCKS))


@require_GET
@console_view(VIEWER)
def failed_causes(request: HtmxHttpRequest) -> HttpResponse:
    form = FailedFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/failed_causes.html", {"form": form})
    data = form.cleaned_data if form.is_bound else {"bid": "", "profile": "", "step": ""}
    number = whole_number(request.GET, "gpage")
    # ``cause``: one group alone (the link an alert carries), by its key.
    cause = request.GET.get("cause") or ""
    if cause and not failure_causes.KEY_RE.fullmatch(cause):
        return error_response(request, "cause must be a cause's key (16 hex digits)", 400)
    causes = failure_causes.failure_causes(**data)
    filters = {k: v for k, v in data.items() if v}
    page = failure_causes.page_of(causes, number)
    if cause:
        group = causes.by_key.get(cause)
        page = replace(
            page, items=[group] if group else [], total=1 if group else 0, has_next=False, number=1
        )
    return render(
        request,
        "queues/failed_causes.html",
        {
            "form": form,
            "causes": causes,
            "page": page,
            "cause": cause,
            "filter_data": data,
            "filter_query": urlencode(filters),
            "collections_shown": COLLECTIONS_SHOWN,
            # What holding a collection stops: its jobs waiting to start (the holds preview).
            "pending": failure_causes.pending_by_collection(),
            "batches_shown": BATCHES_SHOWN,
            # A cause of a storage node (a refusal or an outage in Storing or Recording) is
            # held at the node, not at its collections; a hold in place is said, not offered.
            "nodes_of": {g.key: failure_causes.nodes_named(g) for g in page.items},
            "held_nodes": held_nodes(),
            "held_collections": held_collections(
                {c for g in page.items for c in g.collections[:COLLECTIONS_SHOWN]}
            ),
            "next": request.get_full_path(),
        },
    )
