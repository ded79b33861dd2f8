"""Failed jobs grouped by cause (``queues.failure_causes``): a page of groups with their
signature, count, batches, collections, first and last failure and a sample message, and the
group's actions. Resume and delete post to ``bulk.failed_cause_bulk`` (previewed and confirmed
by the bulk code, with the group's jobs as the filter's match); holding a collection is the
holds page's own action."""

from __future__ import annotations

from dataclasses import replace

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues import failure_causes
from queues.auth import VIEWER
from queues.forms import FailedFilterForm

from .common import HtmxHttpRequest, bad_form, console_view, error_response

COLLECTIONS_SHOWN = 10  # collections with a hold button per group; the rest are counted
BATCHES_SHOWN = 5


@require_GET
@console_view(VIEWER)
def failed_causes(request: HtmxHttpRequest) -> HttpResponse:
    form = FailedFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/failed_causes.html", {"form": form})
    data = form.cleaned_data if form.is_bound else {"bid": "", "profile": "", "step": ""}
    number = request.GET.get("gpage") or "1"
    if not number.isdigit():
        return error_response(request, "gpage must be a number", 400)
    # ``cause``: one group alone (the link an alert carries), by its key.
    cause = request.GET.get("cause") or ""
    if cause and not failure_causes.KEY_RE.fullmatch(cause):
        return error_response(request, "cause must be a cause's key (16 hex digits)", 400)
    causes = failure_causes.failure_causes(**data)
    filters = {k: v for k, v in data.items() if v}
    page = failure_causes.page_of(causes, int(number))
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
            "next": request.get_full_path(),
        },
    )
